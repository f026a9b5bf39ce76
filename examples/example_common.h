/*
 * examples/example_common.h — what the example programs share: flag parsing, the clock, MNIST
 * file names, and test-set evaluation. Only the public API (umtrain.h) is used.
 */
#ifndef UMT_EXAMPLE_COMMON_H
#define UMT_EXAMPLE_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "umtrain.h"

#define MNIST_MEAN 0.1307f
#define MNIST_STD 0.3081f

/* Parses text as a number in [low, high] that fills the whole argument; on error prints
 * "<program>: <flag> '<text>': expected ..." and returns -1. */
int example_number(const char *program, const char *flag, const char *text, double low, double high, double *out);
/* example_number for counts: a fraction ("2.5") is refused, not cut to 2. */
int example_whole_number(const char *program, const char *flag, const char *text, double low, double high,
                         double *out);
/* A flag given last, with nothing after it: prints "<program>: <flag> needs a value" when the
 * usage text lists the flag, otherwise "unknown flag <flag>" and the usage; returns -1. */
int example_missing_value(const char *program, const char *flag, void (*usage)(FILE *out));
/* 0 for UMT_OK; otherwise prints "<program>: <umt_last_error()>" and returns -1. */
int example_check(const char *program, umt_status status);
/* --optimizer NAME with --lr (0 when not given): NAME's kind, and the rate to train with: lr when
 * given, else that optimizer's PyTorch default (umt_optimizer_defaults), so that choosing another
 * optimizer never keeps the first one's rate. -1 (message printed) for an unknown name. */
int example_optimizer(const char *program, const char *name, float lr, umt_optimizer_kind *kind, float *chosen_lr);
/* The samples a --train-limit or --test-limit of `limit` leaves of n: the first limit, or all n
 * when limit is 0 or past n. */
int64_t example_limit(int64_t n, int64_t limit);
/* "<used> of <total>" when a limit cut the set, else "<total>", into buffer (returned): the
 * banners' counts. */
const char *example_count_text(char *buffer, size_t size, int64_t used, int64_t total);
/* Seconds on a monotonic clock. */
double example_seconds(void);
/* Loads <dir>/<split>-images-idx3-ubyte[.gz] and the labels beside it (10 classes). */
int example_load_mnist(const char *program, umt_context *ctx, const char *dir, const char *split, umt_dataset **out);

/* The same files as host-side samples, for the prefetching loader (--data-on host). */
int example_load_mnist_samples(const char *program, const char *dir, const char *split, umt_samples **out);

/* Test accuracy on the first `limit` samples (0: all; --test-limit) in batches of batch_size, in
 * evaluation mode with grad disabled; forward maps a normalised image batch to class scores. */
typedef umt_tensor *(*example_forward_fn)(umt_context *ctx, const void *model, umt_tensor *images);
int example_evaluate(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                     const umt_dataset *test, int64_t batch_size, int64_t limit, double *accuracy);

/* Test accuracy over one epoch of a loader (which should not shuffle) on its first `limit`
 * samples (0: all), as example_evaluate. */
int example_evaluate_loader(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                            umt_loader *test, int64_t limit, double *accuracy);

/* --on-nonfinite stop|skip|off: the trainers' answer to a NaN or infinite loss or gradient (the
 * optimizer's check, include/umtrain.h: umt_nonfinite_policy). stop by default. */
typedef struct {
    umt_nonfinite_policy policy;
    bool told; /* the first such step has been told */
} example_nonfinite;

#define EXAMPLE_NONFINITE_USAGE "                 [--on-nonfinite stop|skip|off]\n"
#define EXAMPLE_NONFINITE_DEFAULTS                                                                                \
    "          --on-nonfinite stop: a step whose loss or gradients are NaN or infinite applies no update, the\n"  \
    "          run stops there and exits 1 naming the step and what was not finite; skip skips such steps,\n"     \
    "          counts them and goes on; off checks nothing (for comparison).\n"

/* After a step (wait false: a read of one word of host memory, no wait for the GPU) or at an
 * epoch's end (wait true: waits for the queued steps): when the optimizer has found its first
 * non-finite step, says where it was (epoch + 1; the step of that epoch, the optimizer's count of
 * it less epoch_base, of steps) and what was not finite, once. -1 under stop (the caller ends the
 * run, exit status 1), else 0. */
int example_nonfinite_check(const char *program, const umt_optimizer *opt, example_nonfinite *check, bool wait,
                            int64_t epoch, int64_t epoch_base, int64_t steps);
/* At a run's end under skip: how many steps were skipped for non-finite values, when any. */
void example_nonfinite_summary(const char *program, const umt_optimizer *opt, const example_nonfinite *check);

/* The input-pipeline flags the trainers share: --data-on, --loader, --prefetch, --workers. */
typedef enum { EXAMPLE_DATA_AUTO = 0, EXAMPLE_DATA_GPU, EXAMPLE_DATA_HOST } example_data_on;
typedef struct {
    example_data_on data_on;
    umt_loader_kind loader;
    int prefetch, workers;
} example_input_flags;

example_input_flags example_input_defaults(void);
/* 1 when flag is not one of the four, 0 when parsed, -1 (message printed) when its value is bad. */
int example_input_flag(const char *program, example_input_flags *flags, const char *flag, const char *value);
/* One line for usage(). */
#define EXAMPLE_INPUT_USAGE                                                                                       \
    "                 [--data-on auto|gpu|host] [--loader pinned|pageable-sync] [--prefetch N] [--workers N]\n"

/* The same on samples [first, first + count) only, giving the number right (one rank's part of
 * the test set under data parallelism). */
int example_count_correct(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                          const umt_dataset *test, int64_t batch_size, int64_t first, int64_t count, int64_t *correct);

/* A classifier's training loss on images f32 [N,C,H,W] and labels i32 [N]. */
typedef umt_tensor *(*example_loss_fn)(umt_context *ctx, const void *model, umt_tensor *images, umt_tensor *labels);
/* What a trainer's epoch asks of memory: steps of `batch` images (as micro_batches micro-batches,
 * or 0: as the plan chooses), an epoch of `samples` training images (its last step shorter; 0:
 * none), evaluation in batches of eval_batch (0: none); step_value_bytes: the host values a step
 * hands its kernels (umt_dataset_batch's indices: 8 bytes a sample; a loader's batches: none);
 * later_device_bytes: the device ring of loaders made after the plan (0: none). */
typedef struct {
    int64_t batch, micro_batches, samples, eval_batch;
    size_t step_value_bytes, later_device_bytes;
} example_plan_steps;

/* What example_plan and example_build_failed return when the model trains only with the offload
 * tier and ctx has none: the caller makes its context again with example_offload_on (right after
 * umt_context_create, before the model), the rest after it as before with the same seed (the same
 * initial parameters), and plans again. */
#define EXAMPLE_NEEDS_OFFLOAD 1

/* The memory plan before step 1 (include/umtrain.h, umt_memory_plan_make) for steps through loss
 * on images of chw, printed as one table on print (NULL: not printed). The dry steps' images and
 * labels are new tensors of the activations pool, in that order, as the loaders make them.
 * Returns 0 (a forced split that does not fit is said, and kept; on a context with the offload
 * tier, the tier is given the plan: umt_offload_adopt_plan), EXAMPLE_NEEDS_OFFLOAD (said on
 * print) when the plan needs the tier and ctx has none, or -1 with the message printed: a failed
 * dry step, or a plan that does not fit even with the tier, or whose host memory cannot hold what
 * the tier keeps there (the message names the pools and sizes). */
int example_plan(const char *program, umt_context *ctx, example_loss_fn loss, const void *model, const int64_t chw[3],
                 const example_plan_steps *steps, FILE *print, umt_memory_plan *plan);
/* Turns the offload tier on for a context just made (umt_offload_enable, default options: the
 * plan gives it its reserve). 0, or -1 with the message printed. */
int example_offload_on(const char *program, umt_context *ctx);
/* After making the model or its optimizer failed with status: EXAMPLE_NEEDS_OFFLOAD (said on
 * print) when the device budget refused it, on a GPU, and the tier is not on yet (offload false);
 * otherwise the message printed and -1. */
int example_build_failed(const char *program, umt_status status, const umt_context *ctx, bool offload, FILE *print);
/* The fewest equal parts of total, at least at_least of them (total's smallest divisor from
 * at_least on): a step split into a loader's batches, each a micro-batch no larger than the
 * plan's. */
int example_equal_parts(int64_t total, int64_t at_least);

#endif /* UMT_EXAMPLE_COMMON_H */
