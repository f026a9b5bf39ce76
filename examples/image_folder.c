/*
 * examples/image_folder.c — a small CNN trained on an image folder: root/<class>/<file>.png|jpg|bmp,
 * or root/train/<class>/ and root/test/<class>/.
 *
 *   bazel-bin/examples/mnist_to_png --out /tmp/digits --train 3000 --test 1000   # a tree to try
 *   bazel-bin/examples/image_folder --root /tmp/digits --size 28 --epochs 5
 *   bazel-bin/examples/image_folder --root /tmp/digits --dry-run   # the memory plan alone, nothing trained
 *
 * Files are decoded, resized and augmented by the loader's threads (--workers) into the pinned
 * staging ring (--prefetch deep); the compute stream only ever sees ready batches. Each epoch
 * prints the loss, the time the compute stream waited for data, and the test accuracy.
 *
 * The model: conv 3x3 (16) - relu - max pool 2 - conv 3x3 (32) - relu - max pool 2 - linear,
 * Adam lr 1e-3, softmax cross-entropy. A NaN or infinite loss or gradient stops the run, naming
 * the step, with no update applied from it (--on-nonfinite skip goes on); Ctrl-C or SIGTERM stops
 * after the step in progress (exit status 130 or 143).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/example_common.h"
#include "examples/example_metrics.h"
#include "examples/example_progress.h"
#include "examples/example_signals.h"
#include "umtrain.h"

static const char *const program = "image_folder";

/* ----------------------------------------------------------------------------------------- */
/* Options */

typedef struct {
    umt_image_folder_options folder;
    int epochs, crop_padding, grad_accum;
    bool flip, dry_run;
    int64_t batch_size, test_limit; /* test_limit 0: every test image */
    float lr; /* 0: Adam's default */
    uint64_t seed;
    umt_device device;
    example_input_flags input;
    const char *metrics; /* --metrics PATH: JSON Lines (examples/example_metrics.h) */
    example_nonfinite nonfinite;
} options;

static void usage(FILE *out) {
    fprintf(out, "usage: image_folder --root DIR [--size N] [--channels 0|1|3] [--test-fraction F] [--skip-bad]\n"
                 "                    [--epochs N] [--batch-size N] [--lr F] [--seed N] [--device cpu|cuda]\n"
                 "                    [--crop-padding N] [--flip] [--prefetch N] [--workers N] [--loader pinned|pageable-sync]\n"
                 "                    [--test-limit N] [--grad-accum N] [--dry-run] [--metrics PATH]\n"
                 "                    [--on-nonfinite stop|skip|off]\n"
                 "defaults: size 28, channels from the first file, test fraction 0.2 (without train/ and test/),\n"
                 "          5 epochs, batch 64, adam lr 1e-3, seed 1, no augmentation, prefetch 4, 2 workers,\n"
                 "          every test image (a limit N: the first N); --grad-accum N: each step runs N batches\n"
                 "          of --batch-size as micro-batches and updates once, with the gradients of their whole;\n"
                 "          the memory plan printed before step 1 (--dry-run: printed, and nothing trained);\n"
                 "          --metrics PATH: a line per epoch and per evaluation, as JSON Lines\n"
                 "          (tools/plot_metrics.py draws the curves)\n"
                 EXAMPLE_NONFINITE_DEFAULTS);
}

static int parse_flag(options *o, const char *flag, const char *value) {
    double v = 0;
    /* Its batches always come through the host loader: mnist_cnn's --data-on is no flag here. */
    int bad = strcmp(flag, "--data-on") ? example_input_flag(program, &o->input, flag, value) : 1;
    if (bad <= 0) return bad;
    bad = 0;
    if (!strcmp(flag, "--root")) o->folder.root = value;
    else if (!strcmp(flag, "--size")) bad = example_whole_number(program, flag, value, 1, 4096, &v), o->folder.height = o->folder.width = (int)v;
    else if (!strcmp(flag, "--channels")) bad = example_whole_number(program, flag, value, 0, 3, &v), o->folder.channels = (int)v;
    else if (!strcmp(flag, "--test-fraction")) bad = example_number(program, flag, value, 0, 0.99, &v), o->folder.test_fraction = v;
    else if (!strcmp(flag, "--epochs")) bad = example_whole_number(program, flag, value, 1, 1000, &v), o->epochs = (int)v;
    else if (!strcmp(flag, "--batch-size")) bad = example_whole_number(program, flag, value, 1, 1 << 16, &v), o->batch_size = (int64_t)v;
    else if (!strcmp(flag, "--grad-accum")) bad = example_whole_number(program, flag, value, 1, 1 << 16, &v), o->grad_accum = (int)v;
    else if (!strcmp(flag, "--lr")) bad = example_number(program, flag, value, 1e-9, 100, &v), o->lr = (float)v;
    else if (!strcmp(flag, "--seed")) bad = example_whole_number(program, flag, value, 0, 1e15, &v), o->seed = (uint64_t)v;
    else if (!strcmp(flag, "--test-limit")) bad = example_whole_number(program, flag, value, 1, 1e9, &v), o->test_limit = (int64_t)v;
    else if (!strcmp(flag, "--crop-padding")) bad = example_whole_number(program, flag, value, 0, 64, &v), o->crop_padding = (int)v;
    else if (!strcmp(flag, "--device")) bad = example_check(program, umt_device_parse(value, &o->device));
    else if (!strcmp(flag, "--metrics")) o->metrics = value;
    else if (!strcmp(flag, "--on-nonfinite")) bad = example_check(program, umt_nonfinite_policy_parse(value, &o->nonfinite.policy));
    else {
        fprintf(stderr, "%s: unknown flag %s\n", program, flag);
        usage(stderr);
        return -1;
    }
    return bad;
}

static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.folder = {.height = 28, .width = 28, .test_fraction = 0.2}, .epochs = 5, .batch_size = 64, .grad_accum = 1,
                   .seed = 1, .device = umt_default_device(), .input = example_input_defaults(),
                   .nonfinite = {.policy = UMT_NONFINITE_STOP}};
    o->input.workers = 2;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), exit(0), 0;
        /* The switches without a value. */
        if (!strcmp(argv[i], "--skip-bad")) o->folder.skip_bad = true;
        else if (!strcmp(argv[i], "--flip")) o->flip = true;
        else if (!strcmp(argv[i], "--dry-run")) o->dry_run = true;
        else if (i + 1 >= argc) return example_missing_value(program, argv[i], usage);
        else if (parse_flag(o, argv[i], argv[i + 1])) return -1;
        else i++;
    }
    if (!o->folder.root) return fprintf(stderr, "%s: --root is required\n", program), usage(stderr), -1;
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* The model */

typedef struct {
    umt_layer *conv1, *conv2, *fc;
} small_cnn;

static int build_model(umt_context *ctx, small_cnn *m, const int64_t chw[3], int classes) {
    int64_t features = 32 * (chw[1] / 4) * (chw[2] / 4);
    m->conv1 = umt_conv2d_layer_new(ctx, "conv1", chw[0], 16, 3, 1, 1, true);
    m->conv2 = umt_conv2d_layer_new(ctx, "conv2", 16, 32, 3, 1, 1, true);
    m->fc = umt_linear_layer_new(ctx, "fc", features, classes, true);
    return m->conv1 && m->conv2 && m->fc ? 0 : -1;
}

static umt_tensor *forward(umt_context *ctx, const void *model, umt_tensor *x) {
    const small_cnn *m = model;
    x = umt_max_pool2d(ctx, umt_relu(ctx, umt_layer_forward(ctx, m->conv1, x)), 2, 2);
    x = umt_max_pool2d(ctx, umt_relu(ctx, umt_layer_forward(ctx, m->conv2, x)), 2, 2);
    return umt_layer_forward(ctx, m->fc, umt_flatten(ctx, x));
}

/* The training loss, as train_epoch computes it: what the memory plan's dry steps run. */
static umt_tensor *plan_loss(umt_context *ctx, const void *model, umt_tensor *images, umt_tensor *labels) {
    return umt_softmax_cross_entropy(ctx, forward(ctx, model, images), labels);
}

/* ----------------------------------------------------------------------------------------- */
/* Training */

typedef struct {
    umt_context *ctx;
    small_cnn model;
    umt_optimizer *opt;
    umt_loader *train, *test;
    int64_t batch, samples; /* the loader's batch, and the training samples */
    int grad_accum;         /* loader batches per step, one micro-batch each (core/micro_batch.h) */
    example_progress progress; /* the epoch lines' times */
    example_metrics *metrics;  /* --metrics (NULL: none) */
    example_nonfinite *nonfinite;
    int stopped_by; /* the SIGINT or SIGTERM that stopped the run, or 0 */
} run_state;

/* The loader's next batch: its loss, backward. */
static umt_tensor *forward_backward(run_state *r) {
    umt_tensor *images, *labels;
    if (example_check(program, umt_loader_next(r->train, &images, &labels))) return NULL;
    umt_tensor *loss = images ? umt_softmax_cross_entropy(r->ctx, forward(r->ctx, &r->model, images), labels) : NULL;
    if (!images) fprintf(stderr, "%s: the loader ran out of batches mid-epoch\n", program);
    return loss && !umt_backward(r->ctx, loss) ? loss : NULL;
}

/* Step `step` of the epoch: its grad_accum batches (fewer at the epoch's end) as micro-batches of
 * one step, or its one batch whole; the update; the step's loss. */
static int train_step(run_state *r, int64_t step, float *value) {
    int64_t first_sample = step * r->grad_accum * r->batch, left = r->samples - first_sample;
    int64_t count = left < r->grad_accum * r->batch ? left : r->grad_accum * r->batch;
    if (example_check(program, umt_step_begin(r->ctx)) || example_check(program, umt_zero_grad(r->ctx))) return -1;
    bool split = r->grad_accum > 1;
    umt_tensor *loss = NULL;
    for (int64_t first = 0; first < count; first += r->batch) {
        int64_t samples = count - first < r->batch ? count - first : r->batch;
        if (split && example_check(program, umt_micro_batch_begin(r->ctx, first, samples, count))) return -1;
        if (!(loss = forward_backward(r))) return example_check(program, umt_last_status());
    }
    if (split) loss = umt_micro_batch_loss(r->ctx);
    if (!loss || umt_optimizer_step(r->opt) || umt_tensor_get_f32(loss, 0, value))
        return example_check(program, umt_last_status());
    return 0;
}

static int train_epoch(run_state *r, int64_t epoch) {
    int64_t batches = 0, base = umt_optimizer_steps(r->opt);
    double loss_sum = 0, start = example_seconds();
    if (example_check(program, umt_loader_start_epoch(r->train, 0, &batches))) return -1;
    int64_t steps = (batches + r->grad_accum - 1) / r->grad_accum;
    example_progress_epoch(&r->progress, epoch, steps);
    for (int64_t step = 0; step < steps; ++step) {
        float value = 0;
        if (train_step(r, step, &value)) return -1;
        loss_sum += value;
        /* A NaN or infinite step (stop: the run ends here), or Ctrl-C: after the step, said. */
        if (example_nonfinite_check(program, r->opt, r->nonfinite, false, epoch, base, steps)) return -1;
        if ((r->stopped_by = example_signals_stop_requested()) != 0) {
            printf("%s: stopped by %s after epoch %lld step %lld/%lld (image_folder saves no checkpoint)\n", program,
                   example_signal_name(r->stopped_by), (long long)(epoch + 1), (long long)(step + 1), (long long)steps);
            return 0;
        }
    }
    double seconds = example_seconds() - start;
    umt_loader_stats stats;
    if (example_check(program, umt_loader_take_stats(r->train, &stats))) return -1;
    /* The epoch's line is its progress line, with the run's time and ETA, and its --metrics line. */
    char line[256];
    double loss = loss_sum / (double)(steps ? steps : 1);
    snprintf(line, sizeof line, "epoch %lld loss %.4f in %.2f s (%lld steps), data wait %.1f ms (%.2f%%)",
             (long long)(epoch + 1), loss, seconds, (long long)steps, stats.wait_ms,
             100.0 * stats.wait_ms / (1e3 * seconds));
    example_progress_line(&r->progress, steps, line);
    example_metrics_train row = {.epoch = epoch + 1, .epoch_step = steps, .epoch_steps = steps,
                                 .step = umt_optimizer_steps(r->opt), .loss = loss, .epoch_loss = loss,
                                 .lr = umt_optimizer_lr(r->opt), .images_per_s = (double)r->samples / seconds,
                                 .data_wait_ms = stats.wait_ms};
    return example_metrics_train_line(r->metrics, r->ctx, &row);
}

/* Loaders of r->batch images (each a micro-batch when a step takes several). */
static int make_loaders(run_state *r, const options *o, const umt_samples *train, const umt_samples *test) {
    umt_loader_options lo = umt_loader_defaults();
    lo.batch_size = r->batch;
    lo.depth = o->input.prefetch;
    lo.workers = o->input.workers;
    lo.kind = o->input.loader;
    lo.mean = 0.5f;
    lo.std = 0.5f;
    lo.crop_padding = o->crop_padding;
    lo.flip = o->flip;
    if (example_check(program, umt_loader_create(r->ctx, train, &lo, &r->train))) return -1;
    if (!umt_samples_size(test)) return 0; /* no test loader: main said why */
    lo.shuffle = false;
    lo.crop_padding = 0;
    lo.flip = false;
    return example_check(program, umt_loader_create(r->ctx, test, &lo, &r->test));
}

/* The device ring of the loaders make_loaders makes after the plan (train, and test when there
 * are test images), at the loader batch asked for: the plan's may only be smaller. */
static size_t loader_rings(const run_state *r, const options *o, const int64_t chw[3], int64_t tested) {
    if (o->device != UMT_DEVICE_CUDA) return 0;
    size_t images = (size_t)(r->batch * chw[0] * chw[1] * chw[2]) * sizeof(float);
    size_t slot = (images + 255) / 256 * 256 + (size_t)r->batch * sizeof(int32_t);
    int depth = o->input.loader == UMT_LOADER_PAGEABLE_SYNC ? 1 : o->input.prefetch;
    return (tested ? 2 : 1) * (size_t)depth * slot;
}

/* The memory plan before step 1 for steps of --batch-size x --grad-accum images. Where the plan
 * splits a step the loader's batches become its micro-batches: equal ones, the fewest no larger
 * than the plan's (evaluation in batches of one too). */
static int plan_steps(run_state *r, const options *o, const int64_t chw[3], int64_t tested) {
    int64_t step = r->batch * r->grad_accum;
    example_plan_steps steps = {.batch = step, .micro_batches = r->grad_accum > 1 ? r->grad_accum : 0,
                                .samples = r->samples, .eval_batch = tested < r->batch ? tested : r->batch,
                                .later_device_bytes = loader_rings(r, o, chw, tested)};
    umt_memory_plan plan;
    int planned = example_plan(program, r->ctx, plan_loss, &r->model, chw, &steps, stdout, &plan);
    if (planned || plan.micro_batches == 1 || r->grad_accum > 1) return planned;
    int k = example_equal_parts(step, plan.micro_batches);
    r->grad_accum = k;
    r->batch = step / k;
    printf("%s: each step of %lld images as %d micro-batches of %lld, the loader's batches (the memory plan)\n",
           program, (long long)step, k, (long long)r->batch);
    return 0;
}

/* The context (the offload tier on first when offload), the model, its optimizer, then the memory
 * plan; EXAMPLE_NEEDS_OFFLOAD when the model trains only with the tier and it is not on. */
static int build_and_plan(run_state *r, const options *o, const umt_samples *train, const int64_t chw[3],
                          int64_t tested, bool offload) {
    umt_context_options co = umt_context_defaults();
    co.seed = o->seed;
    co.device = o->device;
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    if (o->lr > 0) oo.lr = o->lr;
    oo.on_nonfinite = o->nonfinite.policy;
    if (example_check(program, umt_context_create(&co, &r->ctx)) || (offload && example_offload_on(program, r->ctx)))
        return -1;
    umt_status built = build_model(r->ctx, &r->model, chw, umt_samples_num_classes(train)) ? umt_last_status() : UMT_OK;
    if (built == UMT_OK) built = umt_optimizer_create(r->ctx, &oo, &r->opt);
    if (built != UMT_OK) return example_build_failed(program, built, r->ctx, offload, stdout);
    r->batch = o->batch_size;
    r->samples = umt_samples_size(train);
    r->grad_accum = o->grad_accum;
    return plan_steps(r, o, chw, tested);
}

static int run(run_state *r, const options *o, const umt_samples *train, const umt_samples *test) {
    int64_t chw[3];
    umt_samples_shape(train, chw);
    int64_t tested = example_limit(umt_samples_size(test), o->test_limit);
    /* The memory plan before step 1; --dry-run stops after it. Where the model trains only with
     * the offload tier, the context and the model are made again with it (the same seed: the same
     * initial parameters), and planned again. */
    int rc = build_and_plan(r, o, train, chw, tested, false);
    if (rc == EXAMPLE_NEEDS_OFFLOAD) {
        umt_context_destroy(r->ctx);
        *r = (run_state){.nonfinite = r->nonfinite};
        rc = build_and_plan(r, o, train, chw, tested, true);
    }
    if (rc || make_loaders(r, o, train, test)) return -1;
    if (o->dry_run) return 0;
    if (example_signals_catch(program) || example_metrics_open(program, o->metrics, false, 0, &r->metrics)) return -1;
    example_progress_start(&r->progress, stdout, 0, o->epochs);
    for (int64_t epoch = 0; epoch < o->epochs; ++epoch) {
        double accuracy = 0;
        if (train_epoch(r, epoch)) return -1;
        if (r->stopped_by) return 0;
        if (tested && example_evaluate_loader(program, r->ctx, forward, &r->model, r->test, o->test_limit, &accuracy))
            return -1;
        if (tested && example_metrics_eval_line(r->metrics, r->ctx, epoch + 1, umt_optimizer_steps(r->opt), accuracy))
            return -1;
        if (tested)
            printf("epoch %lld test accuracy %.2f%% (%lld images)\n", (long long)(epoch + 1), accuracy,
                   (long long)tested);
        fflush(stdout);
    }
    example_nonfinite_summary(program, r->opt, r->nonfinite);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_options(argc, argv, &o)) return 2;
    umt_samples *train = NULL, *test = NULL;
    if (example_check(program, umt_image_folder_open(&o.folder, &train, &test))) return 1;
    int64_t chw[3];
    umt_samples_shape(train, chw);
    printf("%s: %s: %d classes, %lld training and %lld test images of %lldx%lldx%lld, %lld skipped\n", program,
           o.folder.root, umt_samples_num_classes(train), (long long)umt_samples_size(train),
           (long long)umt_samples_size(test), (long long)chw[0], (long long)chw[1], (long long)chw[2],
           (long long)umt_samples_skipped(train) + umt_samples_skipped(test));
    /* Each split counts its own skips (a file once): the first is the training split's, if any. */
    const char *first_skip = umt_samples_first_skip(train);
    if (!first_skip) first_skip = umt_samples_first_skip(test);
    if (first_skip) printf("%s: first skipped: %s\n", program, first_skip);
    if (!umt_samples_size(test))
        printf("%s: the test split of %s has no images (expected image files in %s/test/<class>/, or without "
               "train/ and test/ a --test-fraction that picks a file of each class, now %g): training without a "
               "test accuracy\n",
               program, o.folder.root, o.folder.root, o.folder.test_fraction);
    run_state r = {.nonfinite = &o.nonfinite};
    int rc = run(&r, &o, train, test);
    example_metrics_close(r.metrics);
    umt_context_destroy(r.ctx);
    umt_samples_destroy(train);
    umt_samples_destroy(test);
    return rc ? 1 : r.stopped_by ? example_signal_exit_status(r.stopped_by) : 0;
}
