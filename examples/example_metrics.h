/*
 * examples/example_metrics.h — a record of a run besides the terminal: --metrics PATH, JSON Lines.
 *
 * One JSON object a line, flushed as it is written (a crash loses no line written before it):
 *   {"event": "start", "program": "mnist_cnn", "resumed": false, "step": 0, "unix_time": 1767225600}
 *   {"event": "train", "epoch": 1, "epoch_step": 100, "epoch_steps": 938, "step": 100,
 *    "loss": 0.2790, "epoch_loss": 0.5123, "lr": 1, "images_per_s": 6210, "data_wait_ms": 1.5,
 *    "elapsed_s": 15.2, "pools": {"weights": {"in_use_bytes": 4800000, "peak_bytes": 4800000}, ...}}
 *   {"event": "eval", "epoch": 1, "step": 938, "test_accuracy": 98.12, "elapsed_s": 120.4, "pools": {...}}
 * A train line per progress line: loss is the mean over the steps since the line before,
 * epoch_loss the mean since the epoch's start (the progress line's), step the optimizer's steps
 * since the run began (a resumed run goes on counting from its checkpoint); data_wait_ms, the
 * compute stream's wait for data over those steps, only where a loader feeds the run. An eval
 * line per evaluation. pools: each pool that has held bytes, its bytes in use and its peak (the
 * host's counters: umt_pool_stats_get). elapsed_s: seconds since this process opened the file.
 * A value that is not finite (a loss that diverged) is written as null, as JSON has no NaN.
 * tools/plot_metrics.py draws the file.
 *
 * A resumed run (--resume) appends, after a start line whose "resumed" is true and whose step is
 * the checkpoint's (lines of the earlier run past it were trained again); any other run starts
 * the file anew. Only a regular file is written: a FIFO, a directory or a device given as
 * the path is refused, naming it, before anything is written.
 */
#ifndef UMT_EXAMPLE_METRICS_H
#define UMT_EXAMPLE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "umtrain.h"

typedef struct example_metrics example_metrics;

/* Opens path (appending when append) and writes the start line: the run starts after `step`
 * optimizer steps (0, or a resumed checkpoint's). NULL path: *out is NULL, and every call below
 * takes a NULL metrics as nothing to do. Returns 0, or -1 with the message printed as
 * "<program>: --metrics <path>: ...". */
int example_metrics_open(const char *program, const char *path, bool append, int64_t step, example_metrics **out);
/* Closes the file (NULL is fine). */
void example_metrics_close(example_metrics *m);

typedef struct {
    int64_t epoch, epoch_step, epoch_steps; /* 1-based, as the progress line */
    int64_t step;                           /* optimizer steps since the run began */
    double loss, epoch_loss, lr, images_per_s;
    double data_wait_ms; /* < 0: no loader, nothing to wait for (left out) */
} example_metrics_train;

/* A train line, with ctx's pools. 0, or -1 with the message printed (a write that failed). */
int example_metrics_train_line(example_metrics *m, const umt_context *ctx, const example_metrics_train *row);
/* An eval line: the test accuracy (percent) after `epoch` (1-based), at optimizer step `step`. */
int example_metrics_eval_line(example_metrics *m, const umt_context *ctx, int64_t epoch, int64_t step,
                              double accuracy);

#endif /* UMT_EXAMPLE_METRICS_H */
