/*
 * examples/mnist_cnn.c — PyTorch's classic MNIST example, in umtrain.
 *
 *   tools/train.sh                                   # fetches MNIST, builds, trains 5 epochs
 *   bazel-bin/examples/mnist_cnn --epochs 14 --save cnn.ckpt
 *   bazel-bin/examples/mnist_cnn --resume cnn.ckpt --epochs 16 --save cnn.ckpt
 *   bazel-bin/examples/mnist_cnn --bench 200 --batch-size 512     # images/s, data on the GPU
 *   bazel-bin/examples/mnist_cnn --precision fp16                  # half precision, loss scaling
 *   bazel-bin/examples/mnist_cnn --device cpu --train-limit 640 --test-limit 1000   # a quick look on a CPU
 *   bazel-bin/examples/mnist_cnn --data-on host --batch-size 512  # pinned prefetch from the host
 *   bazel-bin/examples/mnist_cnn --gpus 2                         # one process per GPU (NCCL)
 *   bazel-bin/examples/mnist_cnn --dry-run --batch-size 32768      # the memory plan alone, nothing trained
 *   mpirun -np 2 bazel-bin/examples/mnist_cnn                     # the same, ranks from mpirun
 *
 * The network (examples/mnist_cnn_model.c) and the recipe are the example's: Adadelta lr 1.0,
 * lr x0.7 after every epoch, batch 64, test batch 1000, inputs normalised with mean 0.1307 and
 * std 0.3081, log-softmax + NLL (--optimizer picks another, with PyTorch's default lr for it
 * unless --lr is given). Each epoch prints progress lines (with the epoch's and the run's elapsed
 * time and ETA, one line rewritten in place on a terminal) and the test accuracy; --metrics PATH
 * records them as JSON Lines (examples/example_metrics.h, drawn by tools/plot_metrics.py). With
 * --save, a checkpoint is written (atomically) after each epoch, and --resume continues from one
 * exactly as if the run had not stopped (and says so when the checkpoint has no epoch left to
 * train), appending to --metrics. A
 * checkpoint of NaN or infinite values is refused unless --allow-nonfinite: to look into a
 * diverged run.
 *
 * A run that can be trusted: a step whose loss or gradients are NaN or infinite applies no update
 * (the check is on the device, no step waits for it), and the run stops naming the step and what
 * was not finite (--on-nonfinite skip: skips such steps and goes on); no checkpoint is written
 * from non-finite values, so the last good one stays. Ctrl-C or SIGTERM stops after the step in
 * progress, saves with --save (the step inside the epoch too: --resume goes on from that step, as
 * if the run had not stopped) and exits with 130 or 143; a second Ctrl-C ends at once.
 *
 * Steps (include/umtrain.h, umt_step_graph): on a GPU a whole training step is captured once
 * into a CUDA graph and replayed, one launch per step (--graph off: every step launched op by
 * op); losses stay on the device and are read only at the progress lines.
 *
 * Precision (core/precision.h): bf16 on GPUs that have it, else fp32; fp16 turns on dynamic loss
 * scaling and reports the steps it skipped. --clip-grad-norm clips by the global norm.
 * --fuse off runs each layer, ReLU, pool, dropout, log-softmax and NLL as separate ops (fused by
 * default: examples/mnist_cnn_model.h says which).
 *
 * Input: by default MNIST is uploaded once into the GPU's dataset pool and batches are gathered
 * there (--data-on gpu; "auto" falls back to the host when it does not fit the budget). With
 * --data-on host, loader threads assemble batches into a pinned staging ring whose copies
 * overlap compute (--prefetch slots, --workers threads); --loader pageable-sync is the naive
 * path, for comparison. Each epoch then reports the compute stream's wait for data.
 *
 * Data parallelism (dist/umt_dist.h): --batch-size is per GPU, so N GPUs step through the epoch
 * in global batches of N x batch-size, each rank on its own slice; rank 0 prints and saves, the
 * test set is split over the ranks and their counts summed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/umt_dist.h"
#include "examples/example_common.h"
#include "examples/example_metrics.h"
#include "examples/example_progress.h"
#include "examples/example_signals.h"
#include "examples/mnist_cnn_model.h"
#include "umtrain.h"

static const char *const program = "mnist_cnn";
/* The most --epochs takes; a checkpoint past it cannot be resumed by any. */
enum { MOST_EPOCHS = 1000 };

/* ----------------------------------------------------------------------------------------- */
/* Options */

typedef struct {
    int epochs;
    int64_t batch_size, test_batch_size, train_limit, test_limit; /* limits: 0 for all the images */
    float lr; /* 0 until parsed: the optimizer's own default unless --lr is given */
    float gamma, clip_grad_norm, target_accuracy;
    umt_optimizer_kind optimizer_kind;
    const char *optimizer, *data_dir, *save, *resume, *precision;
    const char *metrics; /* --metrics PATH: JSON Lines (examples/example_metrics.h) */
    uint64_t seed;
    umt_device device;
    bool device_set;
    umt_memory_mode memory_mode;
    int log_every, bench_steps, gpus;
    int grad_accum; /* micro-batches of batch_size per step (1: the batch whole) */
    bool fuse, graph, overlap, allow_nonfinite, dry_run, tf32;
    example_input_flags input;
    umt_dist_options dist;
    umt_nonfinite_policy on_nonfinite;
} options;

static void usage(FILE *out) {
    fprintf(out, "usage: mnist_cnn [--epochs N] [--batch-size N] [--test-batch-size N] [--lr F] [--gamma F]\n"
                 "                 [--optimizer adadelta|sgd|adam|adamw] [--seed N] [--device cpu|cuda]\n"
                 "                 [--mem managed|managed-plain|device] [--data-dir DIR] [--train-limit N]\n"
                 "                 [--test-limit N] [--log-every N] [--save PATH] [--resume PATH [--allow-nonfinite]]\n"
                 "                 [--bench STEPS] [--grad-accum N] [--metrics PATH]\n"
                 "                 [--precision fp32|bf16|fp16] [--clip-grad-norm F] [--target-acc PERCENT]\n"
                 "                 [--fuse on|off] [--graph on|off] [--overlap on|off] [--dry-run] [--tf32]\n"
                 EXAMPLE_NONFINITE_USAGE
                 EXAMPLE_INPUT_USAGE
                 "                 [--gpus N] [--bucket-mb F|auto] [--reduce f32|bf16] [--dist-timeout SECONDS]\n"
                 "                 [--dist auto|on]\n"
                 "defaults: 5 epochs, batch 64, test batch 1000, adadelta lr 1.0 (other optimizers: PyTorch's\n"
                 "          default lr), gamma 0.7, seed 1, data/mnist, all training and test images (limits: the\n"
                 "          first N), cuda when a GPU is present (else cpu), managed memory, bf16 on GPUs with bf16\n"
                 "          tensor cores (else fp32), fused ops on, no clipping, data on the GPU when it fits (else pinned\n"
                 "          prefetch 4 deep, a loader thread per 4 cores, 1 to 4); 1 GPU, buckets sized by the model\n"
                 "          (auto) reduced in f32, timeout 300 s, graph on (one CUDA graph launch per step,\n"
                 "          all-reduces included). With --gpus N (or under mpirun or srun) --batch-size is per\n"
                 "          GPU. --dist on runs\n"
                 "          the NCCL path on one GPU too (its results equal the run without it).\n"
                 "          Every run prints its memory plan before step 1 and, when the batch's activations do not\n"
                 "          fit the device budget (or a tensor would pass cuDNN's INT_MAX elements), runs each step\n"
                 "          as micro-batches with the whole batch's gradients; --dry-run prints the plan and exits.\n"
                 "          --grad-accum N: each step runs N micro-batches of --batch-size and updates once\n"
                 "          (batch norm would keep per-micro-batch statistics; this network has none).\n"
                 "          --overlap off (GPU): every kernel on one stream; on (the default), each layer's weight\n"
                 "          gradient runs on a second stream beside its input gradient (the same results).\n"
                 "          --tf32 (fp32 on a GPU): the convolutions may run on TF32 tensor cores (10-bit mantissas),\n"
                 "          as PyTorch's default allows; without it fp32 means fp32 arithmetic.\n"
                 "          --metrics PATH: a line per progress line and per evaluation, as JSON Lines, appended to\n"
                 "          with --resume (tools/plot_metrics.py draws the curves).\n"
                 EXAMPLE_NONFINITE_DEFAULTS);
}

static int parse_reduce(options *o, const char *value) {
    o->dist.reduce_bf16 = !strcmp(value, "bf16");
    if (o->dist.reduce_bf16 || !strcmp(value, "f32")) return 0;
    fprintf(stderr, "%s: --reduce '%s': expected f32 or bf16\n", program, value);
    return -1;
}

/* --bucket-mb auto (the default): buckets sized by the model (dist/buckets.h); F: at most F MiB. */
static int parse_bucket_mb(options *o, const char *value) {
    double v = 0;
    if (!strcmp(value, "auto")) return o->dist.bucket_bytes = 0, 0;
    int bad = example_number(program, "--bucket-mb", value, 0.001, 1e5, &v);
    o->dist.bucket_bytes = (size_t)(v * (1 << 20));
    return bad;
}

static int parse_on_off(const char *flag, const char *value, bool *out) {
    *out = !strcmp(value, "on");
    if (*out || !strcmp(value, "off")) return 0;
    fprintf(stderr, "%s: %s '%s': expected on or off\n", program, flag, value);
    return -1;
}

/* --dist auto: NCCL only with several ranks; on: with one too (dist/umt_dist.h, options.always). */
static int parse_dist(options *o, const char *value) {
    o->dist.always = !strcmp(value, "on");
    if (o->dist.always || !strcmp(value, "auto")) return 0;
    fprintf(stderr, "%s: --dist '%s': expected auto or on\n", program, value);
    return -1;
}

static int parse_flag(options *o, const char *flag, const char *value) {
    double v = 0;
    int bad = example_input_flag(program, &o->input, flag, value);
    if (bad <= 0) return bad;
    bad = 0;
    if (!strcmp(flag, "--epochs")) bad = example_whole_number(program, flag, value, 1, MOST_EPOCHS, &v), o->epochs = (int)v;
    else if (!strcmp(flag, "--batch-size")) bad = example_whole_number(program, flag, value, 1, 1 << 20, &v), o->batch_size = (int64_t)v;
    else if (!strcmp(flag, "--test-batch-size")) bad = example_whole_number(program, flag, value, 1, 1 << 20, &v), o->test_batch_size = (int64_t)v;
    else if (!strcmp(flag, "--train-limit")) bad = example_whole_number(program, flag, value, 1, 1e9, &v), o->train_limit = (int64_t)v;
    else if (!strcmp(flag, "--test-limit")) bad = example_whole_number(program, flag, value, 1, 1e9, &v), o->test_limit = (int64_t)v;
    else if (!strcmp(flag, "--lr")) bad = example_number(program, flag, value, 1e-9, 100, &v), o->lr = (float)v;
    else if (!strcmp(flag, "--gamma")) bad = example_number(program, flag, value, 1e-6, 1, &v), o->gamma = (float)v;
    else if (!strcmp(flag, "--seed")) bad = example_whole_number(program, flag, value, 0, 1e15, &v), o->seed = (uint64_t)v;
    else if (!strcmp(flag, "--log-every")) bad = example_whole_number(program, flag, value, 1, 1e9, &v), o->log_every = (int)v;
    else if (!strcmp(flag, "--bench")) bad = example_whole_number(program, flag, value, 1, 1e7, &v), o->bench_steps = (int)v;
    else if (!strcmp(flag, "--grad-accum")) bad = example_whole_number(program, flag, value, 1, 1 << 16, &v), o->grad_accum = (int)v;
    else if (!strcmp(flag, "--gpus")) bad = example_whole_number(program, flag, value, 1, 64, &v), o->gpus = (int)v;
    else if (!strcmp(flag, "--bucket-mb")) bad = parse_bucket_mb(o, value);
    else if (!strcmp(flag, "--dist-timeout")) bad = example_number(program, flag, value, 1, 1e6, &v), o->dist.timeout_s = v;
    else if (!strcmp(flag, "--reduce")) bad = parse_reduce(o, value);
    else if (!strcmp(flag, "--dist")) bad = parse_dist(o, value);
    /* --fuse: each layer with its ReLU as one op, log-softmax with NLL as one (mnist_cnn_model.h). */
    else if (!strcmp(flag, "--fuse")) bad = parse_on_off(flag, value, &o->fuse);
    else if (!strcmp(flag, "--graph")) bad = parse_on_off(flag, value, &o->graph);
    else if (!strcmp(flag, "--overlap")) bad = parse_on_off(flag, value, &o->overlap);
    else if (!strcmp(flag, "--device")) bad = example_check(program, umt_device_parse(value, &o->device)), o->device_set = true;
    else if (!strcmp(flag, "--mem")) bad = example_check(program, umt_memory_mode_parse(value, &o->memory_mode));
    else if (!strcmp(flag, "--clip-grad-norm")) bad = example_number(program, flag, value, 1e-9, 1e9, &v), o->clip_grad_norm = (float)v;
    else if (!strcmp(flag, "--target-acc")) bad = example_number(program, flag, value, 0.01, 100, &v), o->target_accuracy = (float)v;
    else if (!strcmp(flag, "--precision")) o->precision = value;
    else if (!strcmp(flag, "--optimizer")) o->optimizer = value;
    else if (!strcmp(flag, "--data-dir")) o->data_dir = value;
    else if (!strcmp(flag, "--save")) o->save = value;
    else if (!strcmp(flag, "--resume")) o->resume = value;
    else if (!strcmp(flag, "--metrics")) o->metrics = value;
    else if (!strcmp(flag, "--on-nonfinite")) bad = example_check(program, umt_nonfinite_policy_parse(value, &o->on_nonfinite));
    else {
        fprintf(stderr, "%s: unknown flag %s\n", program, flag);
        usage(stderr);
        return -1;
    }
    return bad;
}

static int parse_options(int argc, char **argv, options *o) {
    /* The device default is settled after the launch: asking whether a GPU exists starts CUDA,
     * which a forked rank could then no longer use. */
    *o = (options){.epochs = 5, .batch_size = 64, .test_batch_size = 1000, .gamma = 0.7f,
                   .optimizer = "adadelta", .data_dir = "data/mnist", .seed = 1, .memory_mode = UMT_MEM_MANAGED,
                   .log_every = 100, .gpus = 1, .grad_accum = 1, .fuse = true, .graph = true, .overlap = true, .input = example_input_defaults(),
                   .dist = umt_dist_defaults(), .on_nonfinite = UMT_NONFINITE_STOP};
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(argv[i], "--allow-nonfinite")) {
            o->allow_nonfinite = true;
            continue;
        }
        if (!strcmp(argv[i], "--dry-run")) {
            o->dry_run = true;
            continue;
        }
        if (!strcmp(argv[i], "--tf32")) {
            o->tf32 = true;
            continue;
        }
        if (i + 1 >= argc) return example_missing_value(program, argv[i], usage);
        if (parse_flag(o, argv[i], argv[i + 1])) return -1;
        i++;
    }
    /* Adadelta's default lr is the recipe's 1.0. */
    return example_optimizer(program, o->optimizer, o->lr, &o->optimizer_kind, &o->lr);
}

/* ----------------------------------------------------------------------------------------- */
/* Training */

typedef struct {
    umt_context *ctx;
    mnist_cnn model;
    umt_optimizer *opt;
    umt_dataset *train, *test;    /* --data-on gpu */
    umt_samples *train_host, *test_host;
    umt_loader *loader, *test_loader; /* --data-on host */
    int64_t *order;
    bool loss_scaling;
    umt_dist *dist;
    umt_step_graph *graph;
    int rank, ranks; /* only rank 0 prints and saves */
    int micro_batches;    /* each step's batch as this many micro-batches (core/micro_batch.h) */
    int64_t step_batch;   /* samples per step on this rank: the micro-batches together */
    int64_t loader_batch; /* --data-on host: the loader's batches, one micro-batch each */
    int64_t test_batch;   /* the evaluation's batch: --test-batch-size, or a micro-batch's */
    example_progress progress; /* the progress lines' times */
    example_metrics *metrics;  /* --metrics (rank 0; NULL: none) */
    double wait_ms;            /* the epoch's wait for data so far, taken at each progress line */
    bool offload;              /* the offload tier is on: the memory plan needs it (examples/example_common.h) */
    example_nonfinite nonfinite;
    umt_rng_state epoch_rng; /* the RNG as the epoch in progress began: its shuffle's, for a save inside it */
    bool next_started;       /* the next epoch was started early (before the evaluation) */
    int64_t next_steps;      /* its steps then */
    int stopped_by;          /* the SIGINT or SIGTERM that stopped the run, or 0 */
    int64_t stopped_after;   /* the steps of its epoch taken then */
} run_state;

/* With data on the host and a step of one loader batch, the batch is held before the step
 * (umt_loader_hold_next, run_step) and taken inside it (umt_loader_take_held): a step the step
 * graph can capture and replay. A step of several loader batches takes them one by one inside it
 * (umt_loader_next), and runs op by op. */
static bool holds_batches(const run_state *r) { return r->loader && r->loader_batch == r->step_batch; }

/* Forward and backward of samples indices[0..count) of the resident dataset, or of the loader's
 * next batch: NLL loss, its gradient added to the parameters'. Resident images are gathered in
 * the dtype conv1 computes in (bf16 under bf16): the values its cast would make, without it. */
static umt_tensor *forward_backward(run_state *r, const int64_t *indices, int64_t count) {
    umt_tensor *images = NULL, *labels = NULL;
    umt_dtype dtype = umt_context_compute_dtype(r->ctx);
    umt_status got = holds_batches(r) ? umt_loader_take_held(r->loader, &images, &labels)
                     : r->loader      ? umt_loader_next(r->loader, &images, &labels)
                                      : umt_dataset_batch_as(r->ctx, r->train, indices, count, MNIST_MEAN, MNIST_STD,
                                                             dtype, &images, &labels);
    /* An epoch takes as many steps as the loader has batches, so images is there when got is OK. */
    if (got != UMT_OK || !images) return NULL;
    umt_tensor *loss = mnist_cnn_loss(r->ctx, &r->model, images, labels);
    /* Scaled by the optimizer's loss scale under fp16 (1, a plain backward, otherwise). */
    return loss && !umt_backward_scaled(r->ctx, loss, r->opt) ? loss : NULL;
}

/* Micro-batch i of a step of count samples split in k: near-equal parts of the resident dataset's
 * indices, the larger first (the activation arena is planned from the first: core/micro_batch.h),
 * or the loader's batches of r->loader_batch (the last of an epoch may be short). */
static void micro_batch_at(const run_state *r, int64_t count, int k, int i, int64_t *first, int64_t *samples) {
    int64_t part = count / k, larger = count % k;
    *first = r->loader ? i * r->loader_batch : i * part + (i < larger ? i : larger);
    int64_t end = r->loader ? *first + r->loader_batch : *first + part + (i < larger);
    *samples = (end < count ? end : count) - *first;
}

/* One step on samples indices[0..count): forward and backward, whole or as micro-batches whose
 * gradients add up to the whole's; then the gradients averaged over the ranks, and the update. */
static umt_tensor *train_step(run_state *r, const int64_t *indices, int64_t count) {
    if (umt_step_begin(r->ctx) || umt_zero_grad(r->ctx)) return NULL;
    int k = r->loader ? (int)((count + r->loader_batch - 1) / r->loader_batch)
                      : (count < r->micro_batches ? (int)count : r->micro_batches);
    umt_tensor *loss = NULL;
    for (int i = 0; i < k; ++i) {
        int64_t first, samples;
        micro_batch_at(r, count, k, i, &first, &samples);
        /* One micro-batch is the step itself: nothing to split. */
        if (k > 1 && umt_micro_batch_begin(r->ctx, first, samples, count)) return NULL;
        if (!(loss = forward_backward(r, indices + first, samples))) return NULL;
    }
    if (k > 1) loss = umt_micro_batch_loss(r->ctx);
    if (!loss || umt_dist_finish_gradients(r->dist) || umt_optimizer_step(r->opt)) return NULL;
    return loss;
}

/* train_step as the step graph calls it: the input is the global batch's sample indices, the same
 * on every rank (so that all ranks' graphs replay, or run a short batch eagerly, at the same
 * steps), of which this rank takes its part. */
static umt_tensor *graph_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    (void)ctx;
    run_state *r = user;
    int64_t offset, part;
    umt_dist_shard((int64_t)(input_bytes / sizeof(int64_t)), r->rank, r->ranks, &offset, &part);
    return train_step(r, (const int64_t *)input + offset, part);
}

static umt_status run_step(run_state *r, const int64_t *indices, int64_t count) {
    int64_t held = 0;
    umt_status status = holds_batches(r) ? umt_loader_hold_next(r->loader, &held) : UMT_OK;
    if (status != UMT_OK) return status;
    /* The loader's steps read no indices (their order is the loader's), but count the samples. */
    return umt_step_graph_run(r->graph, graph_step, r, indices, (size_t)count * sizeof *indices);
}

static int64_t train_size(const run_state *r) { return r->loader ? umt_samples_size(r->train_host) : umt_dataset_size(r->train); }
static int64_t test_size(const run_state *r) { return r->loader ? umt_samples_size(r->test_host) : umt_dataset_size(r->test); }

/* Starts an epoch at step first (0, or a resumed run's step inside it): the permutation (drawn by
 * the loader itself with data on the host: the same draw from the same RNG, so both paths see the
 * same order); returns the steps of `global` samples (the batch times the ranks). A resumed epoch
 * draws its order again from the RNG as the epoch began (r->epoch_rng, from the checkpoint), then
 * goes on from the RNG the checkpoint saved. */
static int64_t start_epoch(run_state *r, int64_t n, int64_t global, int64_t first) {
    int64_t steps = (n + global - 1) / global, batches = 0;
    umt_rng_state now;
    if (example_check(program, umt_rng_state_get(r->ctx, first ? &now : &r->epoch_rng)) ||
        (first && example_check(program, umt_rng_state_set(r->ctx, &r->epoch_rng))))
        return -1;
    /* With the loader, a step takes step_batch / loader_batch of its batches (its micro-batches). */
    umt_status status = r->loader ? umt_loader_start_epoch_at(r->loader, n, first * (r->step_batch / r->loader_batch),
                                                              &batches)
                                  : umt_permutation(r->ctx, n, r->order);
    if (example_check(program, status) || (first && example_check(program, umt_rng_state_set(r->ctx, &now))))
        return -1;
    /* A last global batch too short to give every rank a sample is left out, on every rank. */
    if (!umt_dist_batch_usable(n - (steps - 1) * global, r->ranks)) steps--;
    return steps;
}

/* The compute stream's wait for data since the last progress line into *wait_ms (data on the
 * host; -1 otherwise), added to the epoch's for report_wait. */
static int take_wait(run_state *r, double *wait_ms) {
    umt_loader_stats stats;
    *wait_ms = -1;
    if (!r->loader) return 0;
    if (example_check(program, umt_loader_take_stats(r->loader, &stats))) return -1;
    r->wait_ms += stats.wait_ms;
    *wait_ms = stats.wait_ms;
    return 0;
}

/* The mean loss so far over every rank (a collective: every rank logs at the same steps); the
 * steps' losses were summed on the device since the last line, from step first of the epoch on. The
 * line, with the times, and its --metrics line. */
static int log_progress(run_state *r, int64_t epoch, int64_t first, int64_t step, int64_t steps, double *loss_sum,
                        double *window_start, int64_t *window_images) {
    double window_mean = 0;
    int64_t window_steps = 0;
    if (example_check(program, umt_step_graph_take_mean_loss(r->graph, &window_mean, &window_steps))) return -1;
    *loss_sum += window_mean * (double)window_steps;
    double means[2] = {*loss_sum / (double)(step + 1 - first), window_mean}, wait_ms;
    if (take_wait(r, &wait_ms) || example_check(program, umt_dist_sum(r->dist, means, 2))) return -1;
    double now = example_seconds(), images_per_s = (double)*window_images / (now - *window_start);
    if (r->rank == 0) {
        char line[256];
        snprintf(line, sizeof line, "epoch %lld step %lld/%lld loss %.4f lr %.4g images/s %.0f", (long long)(epoch + 1),
                 (long long)(step + 1), (long long)steps, means[0] / r->ranks, umt_optimizer_lr(r->opt), images_per_s);
        example_progress_line(&r->progress, step + 1 - first, line);
    }
    example_metrics_train row = {.epoch = epoch + 1, .epoch_step = step + 1, .epoch_steps = steps,
                                 .step = umt_optimizer_steps(r->opt), .loss = means[1] / r->ranks,
                                 .epoch_loss = means[0] / r->ranks, .lr = umt_optimizer_lr(r->opt),
                                 .images_per_s = images_per_s, .data_wait_ms = wait_ms};
    *window_start = now;
    *window_images = 0;
    return example_metrics_train_line(r->metrics, r->ctx, &row);
}

/* The compute stream's wait for data over the epoch just trained (data on the host). */
static int report_wait(run_state *r, int64_t epoch, double epoch_s, int64_t steps) {
    if (!r->loader) return 0;
    /* The progress lines took it as they went; the epoch's last line took the rest. */
    double wait_ms = r->wait_ms;
    r->wait_ms = 0;
    printf("epoch %lld data wait %.1f ms of %.1f ms (%.2f%% of step time), step %.3f ms\n", (long long)(epoch + 1),
           wait_ms, 1e3 * epoch_s, 100.0 * wait_ms / (1e3 * epoch_s), 1e3 * epoch_s / (double)steps);
    return 0;
}

static void report_graph(const run_state *r) {
    umt_step_graph_stats s = umt_step_graph_stats_get(r->graph);
    printf("step graph: %lld captures, %lld steps replayed, %lld eager\n", (long long)s.captures,
           (long long)s.replayed_steps, (long long)s.eager_steps);
}

/* After a step: -1 when the run must stop for a NaN or infinite value (said), 1 when a signal
 * asks it to stop (r->stopped_by, r->stopped_after), else 0. One rank polls the optimizer's
 * doorbell every step; several look where they have all waited (a progress line), so that all
 * stop at the same step. */
static int stop_after(run_state *r, int64_t epoch, int64_t base, int64_t step, int64_t steps, bool logged) {
    bool poll = r->ranks == 1;
    /* On a terminal the progress line is ended before a stop is told. */
    if (!r->nonfinite.told && umt_optimizer_nonfinite_found(r->opt)) example_progress_break(&r->progress);
    if ((poll || logged) && example_nonfinite_check(program, r->opt, &r->nonfinite, !poll, epoch, base, steps))
        return -1;
    if (!(r->stopped_by = example_signals_stop_requested())) return 0;
    example_progress_break(&r->progress);
    r->stopped_after = step + 1;
    /* The step is queued, maybe not run: no save before the check has seen it. */
    return example_nonfinite_check(program, r->opt, &r->nonfinite, true, epoch, base, steps) ? -1 : 1;
}

/* Starts the epoch after this one now, whose first batches the loader's threads then assemble
 * while the evaluation runs (otherwise the first step of every epoch waited for its data). Called
 * after the epoch's checkpoint is saved: the save keeps the RNG from before this shuffle's draw,
 * as a run resumed there draws it again. The evaluation draws nothing from the RNG, so every
 * later draw is the one it was. */
static int start_next_epoch(run_state *r, const options *o) {
    int64_t n = example_limit(train_size(r), o->train_limit);
    r->next_steps = start_epoch(r, n, r->step_batch * r->ranks, 0);
    r->next_started = r->next_steps >= 0;
    return r->next_started ? 0 : -1;
}

/* An epoch from its step first_step on (0, or where a resumed run goes on). */
static int train_epoch(run_state *r, const options *o, int64_t epoch, int64_t first_step) {
    int64_t n = example_limit(train_size(r), o->train_limit);
    int64_t global = r->step_batch * r->ranks, window_images = 0;
    int64_t steps = r->next_started ? r->next_steps : start_epoch(r, n, global, first_step);
    r->next_started = false;
    if (steps < 0) return -1;
    /* The progress line counts the steps this run takes of the epoch (a resumed one starts inside). */
    example_progress_epoch(&r->progress, epoch, steps - first_step);
    int64_t base = umt_optimizer_steps(r->opt) - first_step; /* the optimizer's count before the epoch */
    double start = example_seconds(), window_start = start, loss_sum = 0;
    for (int64_t step = first_step; step < steps; ++step) {
        int64_t first = step * global, count = n - first < global ? n - first : global;
        if (example_check(program, run_step(r, r->order + first, count))) return -1;
        window_images += count;
        bool logged = (step + 1) % o->log_every == 0 || step + 1 == steps;
        if (logged && log_progress(r, epoch, first_step, step, steps, &loss_sum, &window_start, &window_images))
            return -1;
        int stop = stop_after(r, epoch, base, step, steps, logged);
        if (stop) return stop < 0 ? -1 : 0;
    }
    /* The last steps may still be queued: the check waits for them before evaluation and saving. */
    if (example_nonfinite_check(program, r->opt, &r->nonfinite, true, epoch, base, steps)) return -1;
    double seconds = example_seconds() - start;
    if (r->rank == 0) printf("epoch %lld trained in %.2f s\n", (long long)(epoch + 1), seconds);
    if (r->rank == 0 && epoch == 0) report_graph(r);
    if (r->rank == 0 && r->loss_scaling)
        printf("epoch %lld loss scale %g, %lld steps skipped so far (inf/NaN gradients)\n", (long long)(epoch + 1),
               umt_optimizer_loss_scale(r->opt), (long long)umt_optimizer_skipped_steps(r->opt));
    return report_wait(r, epoch, seconds, steps);
}

/* Each rank counts its part of the test set (its first --test-limit images); the counts are summed. */
static int evaluate(run_state *r, const options *o, double *accuracy) {
    if (r->test_loader)
        return example_evaluate_loader(program, r->ctx, mnist_cnn_forward, &r->model, r->test_loader, o->test_limit,
                                       accuracy);
    int64_t n = example_limit(umt_dataset_size(r->test), o->test_limit), offset, part, correct = 0;
    umt_dist_shard(n, r->rank, r->ranks, &offset, &part);
    if (example_count_correct(program, r->ctx, mnist_cnn_forward, &r->model, r->test, r->test_batch, offset,
                              part, &correct))
        return -1;
    double total = (double)correct;
    if (example_check(program, umt_dist_sum(r->dist, &total, 1))) return -1;
    *accuracy = 100.0 * total / (double)n;
    return 0;
}

/* Steady-state training speed: the dataset is already in the (GPU) dataset pool; warm-up steps
 * first, then `steps` steps queued back to back, timed by the device (CUDA events). With several
 * ranks each takes its own window of samples, and the slowest rank's time counts. */
static int bench(run_state *r, const options *o) {
    if (r->loader) {
        fprintf(stderr, "%s: --bench times the resident dataset; with --data-on host, train an epoch instead\n", program);
        return -1;
    }
    int64_t n = umt_dataset_size(r->train), batch = r->step_batch < n ? r->step_batch : n;
    int64_t global = batch * r->ranks < n ? batch * r->ranks : n;
    if (example_check(program, umt_permutation(r->ctx, n, r->order))) return -1;
    for (int i = 0; i < 20 + o->bench_steps; ++i) {
        if (i == 20 && example_check(program, umt_timer_start(r->ctx))) return -1;
        int64_t window = (int64_t)i * global % (n - global + 1);
        if (example_check(program, run_step(r, r->order + window, global))) return -1;
    }
    double ms = 0;
    if (example_check(program, umt_timer_stop(r->ctx, &ms)) || example_check(program, umt_dist_max(r->dist, &ms, 1)))
        return -1;
    double seconds = ms / 1e3;
    if (r->rank == 0) {
        printf("bench: %d GPU(s), batch %lld per GPU, %d steps in %.3f s: %.0f images/s (%.3f ms/step)\n", r->ranks,
               (long long)batch, o->bench_steps, seconds, (double)batch * r->ranks * o->bench_steps / seconds,
               1e3 * seconds / o->bench_steps);
        report_graph(r);
        umt_memory_report(r->ctx);
    }
    return 0;
}

/* The model's optimizer; a device budget too small for its state: EXAMPLE_NEEDS_OFFLOAD. */
static int make_optimizer(run_state *r, const options *o) {
    umt_optimizer_options oo = umt_optimizer_defaults(o->optimizer_kind);
    oo.lr = o->lr;
    oo.max_grad_norm = o->clip_grad_norm;
    /* fp16's 5 exponent bits underflow small gradients unless the loss is scaled up first. */
    oo.loss_scaling = r->loss_scaling = umt_context_precision(r->ctx) == UMT_PRECISION_FP16;
    oo.on_nonfinite = r->nonfinite.policy = o->on_nonfinite;
    /* Nothing reads the gradients after a step here: the update zeroes them as it goes, and the
     * next step's umt_zero_grad has nothing to fill. */
    oo.zero_grads_in_step = true;
    umt_status status = umt_optimizer_create(r->ctx, &oo, &r->opt);
    return status ? example_build_failed(program, status, r->ctx, r->offload, r->rank == 0 ? stdout : NULL) : 0;
}

/* --target-acc: the training time up to the first evaluation that reaches the target, on the
 * host's clock (wall, from the first step: start-up, data loading and the model build left
 * out) and on the GPU's (CUDA events around the training epochs only, evaluations left out). */
typedef struct {
    double wall_start_s, gpu_ms;
} time_to_accuracy;

static int timed_epoch(run_state *r, const options *o, int64_t epoch, int64_t first_step, time_to_accuracy *t) {
    if (!o->target_accuracy) return train_epoch(r, o, epoch, first_step);
    double ms = 0;
    if (example_check(program, umt_timer_start(r->ctx))) return -1;
    if (train_epoch(r, o, epoch, first_step) || example_check(program, umt_timer_stop(r->ctx, &ms))) return -1;
    t->gpu_ms += ms;
    return 0;
}

static void report_reached(const options *o, const time_to_accuracy *t, int64_t epoch, double accuracy) {
    printf("target accuracy %.2f%% reached after epoch %lld (%.2f%%): training took %.2f s wall, %.2f s of GPU time\n",
           (double)o->target_accuracy, (long long)(epoch + 1), accuracy, example_seconds() - t->wall_start_s,
           t->gpu_ms / 1e3);
}

/* Whether a resumed run has epochs left: -1 (refused, said why) for an epoch that no --epochs
 * reaches, which only a damaged or foreign file holds; 1 (said so) when --epochs is already
 * done, rather than a silent exit; 0 to train on. */
static int resume_from(const run_state *r, const options *o, const umt_checkpoint_info *info) {
    long long epoch = (long long)info->epoch;
    if (epoch < 0 || epoch > MOST_EPOCHS) {
        if (r->rank == 0)
            fprintf(stderr, "%s: checkpoint %s is after epoch %lld: expected 0 to %d, the epochs --epochs can reach\n",
                    program, o->resume, epoch, MOST_EPOCHS);
        return -1;
    }
    if (epoch >= o->epochs) {
        if (r->rank == 0) {
            printf("%s: checkpoint %s is after epoch %lld of %d: nothing left to train", program, o->resume, epoch,
                   o->epochs);
            printf(epoch < MOST_EPOCHS ? " (give --epochs more than %lld)\n" : "\n", epoch);
        }
        return 1;
    }
    if (r->rank == 0 && info->epoch_step)
        printf("%s: resumed from %s inside epoch %lld, after its step %lld (step %lld)\n", program, o->resume,
               epoch + 1, (long long)info->epoch_step, (long long)info->step);
    else if (r->rank == 0)
        printf("%s: resumed from %s after epoch %lld (step %lld)\n", program, o->resume, epoch, (long long)info->step);
    return 0;
}

/* A run a signal stopped: with --save, a checkpoint that names the step inside the epoch (when it
 * stopped inside one), for --resume to go on from the next; said either way. */
static int save_stopped(run_state *r, const options *o, int64_t epoch, int64_t epoch_step) {
    const char *name = example_signal_name(r->stopped_by);
    if (r->rank != 0) return 0;
    umt_checkpoint_info info = {.epoch = epoch, .step = umt_optimizer_steps(r->opt), .epoch_step = epoch_step,
                                .epoch_rng = r->epoch_rng};
    if (epoch_step && o->save && example_check(program, umt_checkpoint_save(r->ctx, r->opt, &info, o->save)))
        return -1;
    if (epoch_step)
        printf("%s: stopped by %s after step %lld of epoch %lld", program, name, (long long)epoch_step,
               (long long)(epoch + 1));
    else
        printf("%s: stopped by %s after epoch %lld", program, name, (long long)epoch);
    if (o->save) printf("; saved %s (--resume %s goes on from there)\n", o->save, o->save);
    else printf(" (nothing saved: no --save)\n");
    return 0;
}

static int train(run_state *r, const options *o) {
    time_to_accuracy timing = {.wall_start_s = example_seconds()};
    umt_checkpoint_info info = {0};
    if (o->resume) {
        umt_checkpoint_load_options lo = {.allow_nonfinite = o->allow_nonfinite};
        if (example_check(program, umt_checkpoint_load_with(r->ctx, r->opt, &info, o->resume, &lo))) return -1;
        int left = resume_from(r, o, &info);
        if (left) return left < 0 ? -1 : 0;
        r->epoch_rng = info.epoch_rng; /* a save inside an epoch: its shuffle's */
    }
    /* Rank 0 alone keeps the record, appended to when a run goes on. */
    if (r->rank == 0 && example_metrics_open(program, o->metrics, o->resume != NULL, info.step, &r->metrics)) return -1;
    example_progress_start(&r->progress, stdout, info.epoch, o->epochs);
    /* Ctrl-C stops after a step; several ranks would each stop at another, so they keep the default. */
    if (r->ranks == 1 && example_signals_catch(program)) return -1;
    /* 64 bits, as the checkpoint's count; resume_from keeps it to --epochs' range, so the
     * schedule's int takes it whole. */
    for (int64_t epoch = info.epoch; epoch < o->epochs; ++epoch) {
        umt_optimizer_set_lr(r->opt, umt_lr_step(o->lr, o->gamma, 1, (int)epoch));
        double accuracy = 0;
        if (timed_epoch(r, o, epoch, epoch == info.epoch ? info.epoch_step : 0, &timing)) return -1;
        if (r->stopped_by) return save_stopped(r, o, epoch, r->stopped_after);
        /* The epoch's checkpoint, then the next epoch's start (start_next_epoch says why this
         * order), then the evaluation. */
        info = (umt_checkpoint_info){.epoch = epoch + 1, .step = umt_optimizer_steps(r->opt)};
        if (r->rank == 0 && o->save && example_check(program, umt_checkpoint_save(r->ctx, r->opt, &info, o->save)))
            return -1;
        if (epoch + 1 < o->epochs && start_next_epoch(r, o)) return -1;
        if (evaluate(r, o, &accuracy) ||
            example_metrics_eval_line(r->metrics, r->ctx, epoch + 1, umt_optimizer_steps(r->opt), accuracy))
            return -1;
        if (r->rank == 0) printf("epoch %lld test accuracy %.2f%%\n", (long long)(epoch + 1), accuracy);
        /* Every rank has the summed accuracy, so all stop together. */
        bool done = o->target_accuracy && accuracy >= o->target_accuracy;
        if (done && r->rank == 0) report_reached(o, &timing, epoch, accuracy);
        fflush(stdout);
        if (done) return 0;
        /* A signal during the evaluation or the save: the epoch's checkpoint is written. */
        if ((r->stopped_by = example_signals_stop_requested()) != 0) return save_stopped(r, o, epoch + 1, 0);
    }
    example_nonfinite_summary(program, r->opt, &r->nonfinite);
    if (o->target_accuracy && r->rank == 0)
        printf("target accuracy %.2f%% not reached in %d epochs\n", (double)o->target_accuracy, o->epochs);
    return 0;
}

/* The two loaders (the test one in order) of batches of r->loader_batch and r->test_batch. */
static int make_loaders(run_state *r, const options *o) {
    umt_loader_options lo = umt_loader_defaults();
    /* One micro-batch per batch of the loader (--grad-accum: of --batch-size). */
    lo.batch_size = r->loader_batch;
    lo.depth = o->input.prefetch;
    lo.workers = o->input.workers;
    lo.kind = o->input.loader;
    lo.mean = MNIST_MEAN;
    lo.std = MNIST_STD;
    if (example_check(program, umt_loader_create(r->ctx, r->train_host, &lo, &r->loader))) return -1;
    lo.batch_size = r->test_batch;
    lo.shuffle = false;
    return example_check(program, umt_loader_create(r->ctx, r->test_host, &lo, &r->test_loader));
}

/* Data with --data-on host: host samples and their loaders. */
static int load_host(run_state *r, const options *o) {
    if (example_load_mnist_samples(program, o->data_dir, "train", &r->train_host) ||
        example_load_mnist_samples(program, o->data_dir, "t10k", &r->test_host))
        return -1;
    r->loader_batch = o->batch_size;
    return make_loaders(r, o);
}

/* The data where --data-on says; "auto" tries the GPU and falls back to the host only when
 * the dataset does not fit the device budget. */
static int load_data(run_state *r, const options *o) {
    /* Each rank would need its own slice of the loader's order; not built yet. */
    if (r->ranks > 1 && o->input.data_on == EXAMPLE_DATA_HOST) {
        fprintf(stderr, "%s: --data-on host with %d ranks: the host loader feeds one GPU; use --data-on gpu\n",
                program, r->ranks);
        return -1;
    }
    if (o->input.data_on == EXAMPLE_DATA_HOST) return load_host(r, o);
    if (!example_load_mnist(program, r->ctx, o->data_dir, "train", &r->train) &&
        !example_load_mnist(program, r->ctx, o->data_dir, "t10k", &r->test))
        return 0;
    if (o->input.data_on == EXAMPLE_DATA_GPU || umt_last_status() != UMT_ERR_BUDGET || r->ranks > 1) return -1;
    umt_dataset_destroy(r->train);
    umt_dataset_destroy(r->test);
    r->train = r->test = NULL;
    printf("%s: MNIST does not fit the device budget: data on the host instead\n", program);
    return load_host(r, o);
}

/* The context, the data, the model (with the offload tier first when offload), the data-parallel
 * path, the optimizer and the step graph. EXAMPLE_NEEDS_OFFLOAD when the device budget refused the
 * model's state and the tier is not on. */
static int setup(run_state *r, const options *o, const umt_dist_process *process, bool offload) {
    r->test_batch = o->test_batch_size;
    r->offload = offload;
    umt_context_options co = umt_context_defaults();
    co.seed = o->seed;
    co.device = o->device;
    co.memory_mode = o->memory_mode;
    co.cuda_device = process->cuda_device;
    r->rank = process->rank;
    r->ranks = process->size;
    /* After the rank's device is known: the default asks that GPU whether it has bf16. */
    co.precision = umt_precision_default(o->device, co.cuda_device);
    if (o->precision && example_check(program, umt_precision_parse(o->precision, &co.precision))) return -1;
    co.tf32 = o->tf32;
    co.one_stream = !o->overlap;
    if (example_check(program, umt_context_create(&co, &r->ctx))) return -1;
    /* The tier before anything is made: the model's state is then made in host memory. */
    if (offload && example_offload_on(program, r->ctx)) return -1;
    if (load_data(r, o)) return -1;
    if (mnist_cnn_build(r->ctx, &r->model))
        return example_build_failed(program, umt_last_status(), r->ctx, offload, r->rank == 0 ? stdout : NULL);
    r->model.fuse = o->fuse;
    r->micro_batches = o->grad_accum;
    r->step_batch = o->batch_size * o->grad_accum;
    /* After the model: rank 0's initial parameters go to every rank. */
    if (example_check(program, umt_dist_create(r->ctx, process, &o->dist, &r->dist))) return -1;
    int built = make_optimizer(r, o);
    if (built) return built;
    /* A replay takes the loader's held batch (holds_batches); steps of several loader batches run
     * op by op (the step graph says why). The ranks' all-reduces are captured with the step. */
    bool capture = o->graph;
    if (example_check(program, umt_step_graph_create(r->ctx, capture, &r->graph))) return -1;
    r->order = malloc((size_t)train_size(r) * sizeof *r->order);
    if (!r->order) fprintf(stderr, "%s: no memory for the shuffle order\n", program);
    return r->order ? 0 : -1;
}

/* The memory plan before step 1 (include/umtrain.h): dry steps of the training loss on batches of
 * --batch-size, the epoch's last shorter batch, evaluation in batches of --test-batch-size. Every
 * run prints it; --dry-run stops after it. */
static umt_tensor *plan_loss(umt_context *ctx, const void *model, umt_tensor *images, umt_tensor *labels) {
    return mnist_cnn_loss(ctx, model, images, labels);
}

/* The plan's micro-batches; evaluation then in batches no larger than one (as the plan measured
 * it). The loader's batches are the micro-batches: the step splits into equal ones, the fewest
 * no larger than the plan's. */
static int adopt_plan(run_state *r, const options *o, const umt_memory_plan *plan) {
    if (plan->micro_batches == 1 || o->grad_accum > 1) return 0;
    int k = r->loader ? example_equal_parts(r->step_batch, plan->micro_batches) : (int)plan->micro_batches;
    r->micro_batches = k;
    if (r->test_batch > plan->micro_batch) r->test_batch = plan->micro_batch;
    if (r->rank == 0)
        printf("%s: each step of %lld images as %d micro-batches of %lld%s (the memory plan)\n", program,
               (long long)r->step_batch, k, (long long)((r->step_batch + k - 1) / k),
               r->loader ? ", the loader's batches" : "");
    if (!r->loader) return 0;
    umt_loader_destroy(r->loader);
    umt_loader_destroy(r->test_loader);
    r->loader = r->test_loader = NULL;
    r->loader_batch = r->step_batch / k;
    return make_loaders(r, o);
}

/* Every rank plans for its own GPU's budget (a rank's split is its own: gradients are reduced
 * once per step whatever it is); rank 0 prints. */
static int plan_memory(run_state *r, const options *o) {
    const int64_t chw[3] = {1, 28, 28};
    int64_t tested = example_limit(test_size(r), o->test_limit) / r->ranks;
    example_plan_steps steps = {
        .batch = r->step_batch,
        .micro_batches = o->grad_accum > 1 ? o->grad_accum : 0,
        .samples = o->bench_steps ? 0 : example_limit(train_size(r), o->train_limit) / r->ranks,
        .eval_batch = o->bench_steps ? 0 : tested < o->test_batch_size ? tested : o->test_batch_size,
        /* The loader's steps hand over no indices; captured, they record the rate and the dropout
         * seeds, a few bytes, which take the ring's first block (core/step_values.h). */
        .step_value_bytes = r->loader ? (o->graph ? 1 : 0) : (size_t)r->step_batch * sizeof(int64_t),
    };
    umt_memory_plan plan;
    int planned = example_plan(program, r->ctx, plan_loss, &r->model, chw, &steps, r->rank == 0 ? stdout : NULL, &plan);
    return planned ? planned : adopt_plan(r, o, &plan);
}

/* What runs: the images used (after the limits; --bench takes the whole training set), the
 * recipe, the device, the ranks when there are several, and where the data lives. */
static void print_banner(const run_state *r, const options *o) {
    char train[64], test[64], batch[96];
    int64_t train_n = train_size(r), test_n = test_size(r);
    example_count_text(train, sizeof train, o->bench_steps ? train_n : example_limit(train_n, o->train_limit), train_n);
    example_count_text(test, sizeof test, example_limit(test_n, o->test_limit), test_n);
    int at = r->ranks > 1 ? snprintf(batch, sizeof batch, "%lld per GPU x %d GPUs", (long long)r->step_batch, r->ranks)
                          : snprintf(batch, sizeof batch, "%lld", (long long)r->step_batch);
    if (r->micro_batches > 1)
        snprintf(batch + at, sizeof batch - (size_t)at, " (%d micro-batches)", r->micro_batches);
    bool cuda = o->device == UMT_DEVICE_CUDA;
    const char *data = r->loader ? "batches from the host loader"
                       : cuda    ? "data resident on the GPU"
                                 : "data resident in host memory";
    printf("%s: %s training and %s test images, %s lr %g, batch %s, seed %llu, %s, %s, fuse %s, %s\n", program, train,
           test, o->optimizer, o->lr, batch, (unsigned long long)o->seed, cuda ? "cuda" : "cpu",
           umt_precision_name(umt_context_precision(r->ctx)), o->fuse ? "on" : "off", data);
    umt_dist_stats ds = umt_dist_stats_get(r->dist);
    if (ds.buckets)
        printf("%s: gradients all-reduced over %d rank(s) in %d bucket(s) of %s, %.2f MB a step (largest %.2f MB)\n",
               program, r->ranks, ds.buckets, o->dist.reduce_bf16 ? "bf16" : "f32", ds.reduce_bytes / 1e6,
               ds.largest_bucket_bytes / 1e6);
}

/* Everything setup made, freed (the context frees its loaders, datasets and step graph). */
static void teardown(run_state *r) {
    example_progress_break(&r->progress);
    example_metrics_close(r->metrics);
    free(r->order);
    umt_dist_destroy(r->dist);
    umt_context_destroy(r->ctx);
    /* After the context, which destroys the loaders reading them. */
    umt_samples_destroy(r->train_host);
    umt_samples_destroy(r->test_host);
    *r = (run_state){0};
}

/* setup, what runs (said once), the memory plan. */
static int setup_and_plan(run_state *r, const options *o, const umt_dist_process *process, bool offload, bool *said) {
    int rc = setup(r, o, process, offload);
    if (rc) return rc;
    if (!*said && r->rank == 0) print_banner(r, o);
    if (!*said && r->loader)
        printf("%s: loader %s, %d staging slots, %d loader thread(s)\n", program,
               o->input.loader == UMT_LOADER_PINNED ? "pinned" : "pageable-sync", o->input.prefetch, o->input.workers);
    *said = true;
    return plan_memory(r, o);
}

/* Setup and the memory plan. Where the model trains only with the offload tier (the plan says so,
 * or the budget refused its state), everything is made again with the tier on: the same seed, the
 * same initial parameters, the data where the first setup put it; then the plan again, which the
 * tier is given. One GPU only: ranks would all have to make their NCCL communicator again together. */
static int prepare(run_state *r, const options *o, const umt_dist_process *process) {
    bool said = false;
    int rc = setup_and_plan(r, o, process, false, &said);
    if (rc != EXAMPLE_NEEDS_OFFLOAD) return rc;
    if (r->ranks > 1) {
        fprintf(stderr, "%s: rank %d: the model trains only with the offload tier, which the trainer turns on by "
                "itself on one GPU only (%d ranks)\n", program, r->rank, r->ranks);
        return -1;
    }
    options again = *o;
    if (r->loader && again.input.data_on == EXAMPLE_DATA_AUTO) again.input.data_on = EXAMPLE_DATA_HOST;
    teardown(r);
    return setup_and_plan(r, &again, process, true, &said) ? -1 : 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_options(argc, argv, &o)) return 2;
    /* Before any training, so that a --save into a missing folder does not cost an epoch. */
    if (o.save && example_check(program, umt_checkpoint_check_writable(o.save))) return 1;
    umt_dist_process process;
    /* First of all: --gpus forks here, before anything starts CUDA. */
    if (example_check(program, umt_dist_launch(o.gpus, &process))) return 1;
    if (process.launcher) return process.exit_code;
    if (!o.device_set) o.device = process.size > 1 ? UMT_DEVICE_CUDA : umt_default_device();
    run_state r = {0};
    int rc = prepare(&r, &o, &process);
    if (!rc && !o.dry_run) rc = o.bench_steps ? bench(&r, &o) : train(&r, &o);
    if (rc && r.ranks > 1) fprintf(stderr, "%s: rank %d of %d failed\n", program, r.rank, r.ranks);
    int stopped_by = r.stopped_by; /* teardown clears r */
    teardown(&r);
    umt_dist_finish(&process);
    return rc ? 1 : stopped_by ? example_signal_exit_status(stopped_by) : 0;
}
