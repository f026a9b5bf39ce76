/*
 * examples/example_progress.h — the trainers' progress lines with the time: how long the epoch
 * and the run have taken, and how long each has left (ETA).
 *
 * A trainer writes its line as before ("epoch 1 step 100/938 loss 0.2790 lr 1 images/s 6210")
 * and this adds " | epoch 0:15 eta 1:57 | run 0:16 eta 10:09". On a terminal the epoch's lines
 * rewrite one line in place (a carriage return, the line, clear to the end of the line), and
 * the epoch's last line ends it; into a pipe or a file every line is a line of its own, so logs
 * stay greppable. Only the host's clock is read: nothing waits for the device.
 *
 * The ETA is the epoch's pace so far: the steps left at the seconds per step so far, then the
 * epochs left at this epoch's projected length plus what came after the last epoch's training
 * (evaluation, saving), as measured then.
 */
#ifndef UMT_EXAMPLE_PROGRESS_H
#define UMT_EXAMPLE_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *out;
    bool in_place;       /* out is a terminal: lines rewritten in place */
    bool line_open;      /* in place: a line is on the screen without its newline */
    int columns;         /* in place: the terminal's width (a longer line would wrap and not rewrite) */
    int64_t epochs;      /* the run ends before this epoch (0-based); 0: a run of steps without epochs */
    int64_t epoch;       /* the current one */
    int64_t steps;       /* of the current epoch (or of the run of steps) */
    double run_start_s, epoch_start_s;
    double train_end_s;  /* when the last epoch's training ended (0: not yet) */
    double after_s;      /* what followed the last epoch's training: evaluation, saving (0: unknown) */
} example_progress;

/* A run that trains epochs [first_epoch, epochs) (0-based) and prints on out; in place when out
 * is a terminal. epochs 0: a run of steps without epochs (big_mlp), whose lines carry the run's
 * time alone. */
void example_progress_start(example_progress *p, FILE *out, int64_t first_epoch, int64_t epochs);
/* The same, in place or not as asked (the tests' way to see both), at the clock's now_s. */
void example_progress_start_at(example_progress *p, FILE *out, bool in_place, int64_t first_epoch, int64_t epochs,
                               double now_s);

/* Epoch `epoch` (0-based) starts, of `steps` steps. */
void example_progress_epoch(example_progress *p, int64_t epoch, int64_t steps);
void example_progress_epoch_at(example_progress *p, int64_t epoch, int64_t steps, double now_s);

/* Prints line (no newline of its own) after `done` of the epoch's steps, with the times; the line
 * of the epoch's last step ends with a newline in place too. Flushes out. */
void example_progress_line(example_progress *p, int64_t done, const char *line);
void example_progress_line_at(example_progress *p, int64_t done, const char *line, double now_s);

/* In place, ends a line left open (before other output, e.g. an error); otherwise nothing. */
void example_progress_break(example_progress *p);

/* " | epoch 0:15 eta 1:57 | run 0:16 eta 10:09" after `done` steps at now_s, into buffer. */
void example_progress_times(const example_progress *p, int64_t done, double now_s, char *buffer, size_t size);

/* Seconds as "m:ss", or "h:mm:ss" from an hour on (negative and NaN as 0:00). */
const char *example_duration_text(double seconds, char *buffer, size_t size);

#endif /* UMT_EXAMPLE_PROGRESS_H */
