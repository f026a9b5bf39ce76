/*
 * tests/gpu/test_step_graph.c — a whole training step replayed as a CUDA graph gives the same
 * losses as the same steps launched op by op.
 *
 * The MNIST CNN (two convolutions, max-pool, two dropouts, two linear layers, log-softmax, NLL;
 * with the trainer's fused ops, and once more op by op) trains on a small synthetic IDX dataset for two epochs of batch 64 with a last, shorter batch
 * and an evaluation between the epochs, from the same seed, once with umt_step_graph capture on
 * and once with it off. The learning rate changes every step (a cosine schedule), so a replay
 * that baked in the rate, a dropout seed or the batch indices would drift at once.
 *
 * What "the same" means: a third run repeats the eager run. When the two eager runs agree bit
 * for bit (fp32 here: cuDNN's fp32 heuristic algorithms and our reductions are deterministic),
 * the graph run must too, every loss and every parameter; a graph may change how the kernels
 * are launched, never what they compute. Should the eager runs differ (a nondeterministic
 * library algorithm), the graph run must stay within 1e-6 relative of the eager one, and the
 * test prints which case it checked. fp16 with dynamic loss scaling (its scale read from the
 * device) is checked the same way.
 *
 * Then the non-finite check inside replays (issue 26), in fp32 and bf16: a step made NaN on
 * purpose after the graph was captured (its loss alone, or its loss and fc2.bias's gradient,
 * through tensors the captured step reads) is found on the device; the host learns of it from the
 * optimizer's doorbell without calling a wait; under stop the parameters are those from before
 * that step whatever the steps after it, under skip that step alone is left out, as in the same
 * run launched op by op.
 * Data parallelism's path on one GPU (a one-rank communicator: umt_dist_options.always) is
 * captured too: the buckets' all-reduces inside the graph, overlapping backward on their own
 * branch, and the replays give the eager run's losses and parameters bit for bit, which in f32
 * are the run's without data parallelism (the average of one rank is its gradient).
 *
 * Needs a GPU (tag "gpu"): bazel test --config=cuda //tests/gpu:test_step_graph
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/branch.h"
#include "core/context.h"
#include "core/tensor.h"
#include "dist/umt_dist.h"
#include "examples/mnist_cnn_model.h"
#include "tests/gpu/cuda_test_context.h"
#include "tests/gpu/prototype_idx.h"
#include "umtrain.h"

enum { SIDE = 28, PIXELS = SIDE * SIDE, CLASSES = 10, SAMPLES = 1000, BATCH = 64, EPOCHS = 2 };
/* 15 full batches and one of 40 per epoch. */
enum { STEPS_PER_EPOCH = (SAMPLES + BATCH - 1) / BATCH, STEPS = EPOCHS * STEPS_PER_EPOCH };

#define EXPECT_OK(call)                                                                                            \
    do {                                                                                                           \
        if ((call) != UMT_OK) fail_msg("%s failed: %s", #call, umt_last_error());                                  \
    } while (0)

static char dir[64];

typedef struct {
    float losses[STEPS];
    float *parameters; /* every parameter, concatenated */
    int64_t parameter_count;
    umt_step_graph_stats stats;
    umt_dist_stats dist;
    bool off_reason; /* the graph turned itself off */
    double accuracy;
} run_result;

/* ------------------------------------------------------------------------------------------ */
/* A synthetic IDX dataset: noisy copies of ten random prototypes                              */

static int write_dataset(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_graph_XXXXXX");
    return prototype_idx_write(dir, SAMPLES, 11, 80);
}

/* ------------------------------------------------------------------------------------------ */
/* One run                                                                                     */

typedef struct {
    mnist_cnn model;
    umt_optimizer *opt;
    umt_dataset *data;
    umt_dist *dist;  /* NULL: no data parallelism */
    bool reads_loss; /* the step reads its loss back (a wait no capture allows) */
} trainer;

/* How a run trains: the trainer's settings, and data parallelism on one rank (its NCCL path). */
typedef enum { NO_DIST = 0, DIST_F32, DIST_BF16 } dist_mode;

static umt_tensor *step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    trainer *t = user;
    umt_tensor *images = NULL, *labels = NULL;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx) ||
        umt_dataset_batch(ctx, t->data, input, (int64_t)(input_bytes / sizeof(int64_t)), 0.5f, 0.25f, &images,
                          &labels))
        return NULL;
    umt_tensor *loss = mnist_cnn_loss(ctx, &t->model, images, labels);
    if (!loss || umt_backward_scaled(ctx, loss, t->opt)) return NULL;
    if ((t->dist && umt_dist_finish_gradients(t->dist)) || umt_optimizer_step(t->opt)) return NULL;
    float value;
    if (t->reads_loss && umt_tensor_get_f32(loss, 0, &value)) return NULL;
    return loss;
}

static void copy_parameters(umt_context *ctx, run_result *out) {
    int64_t total = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) total += umt_tensor_numel(umt_parameter_at(ctx, i));
    out->parameters = malloc((size_t)total * sizeof(float));
    assert_non_null(out->parameters);
    out->parameter_count = total;
    int64_t at = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) {
        const umt_tensor *p = umt_parameter_at(ctx, i);
        EXPECT_OK(umt_tensor_copy_to_host(p, out->parameters + at, (size_t)umt_tensor_numel(p) * sizeof(float)));
        at += umt_tensor_numel(p);
    }
}

/* The accuracy on the training set in evaluation mode (its batches of 500 move the arena). */
static double evaluate(umt_context *ctx, trainer *t) {
    bool was_training = umt_set_training(ctx, false), was_grad = umt_set_grad_enabled(ctx, false);
    int64_t indices[500], correct = 0;
    for (int64_t start = 0; start < SAMPLES; start += 500) {
        for (int i = 0; i < 500; ++i) indices[i] = start + i;
        umt_tensor *images = NULL, *labels = NULL;
        int64_t right = 0;
        EXPECT_OK(umt_step_begin(ctx));
        EXPECT_OK(umt_dataset_batch(ctx, t->data, indices, 500, 0.5f, 0.25f, &images, &labels));
        umt_tensor *scores = mnist_cnn_forward(ctx, &t->model, images);
        assert_non_null(scores);
        EXPECT_OK(umt_count_correct(ctx, scores, labels, &right));
        correct += right;
    }
    umt_set_training(ctx, was_training);
    umt_set_grad_enabled(ctx, was_grad);
    return 100.0 * (double)correct / SAMPLES;
}

/* One rank's NCCL path (umt_dist_options.always), its buckets sized by the model (two here). */
static void start_dist(umt_context *ctx, dist_mode mode, trainer *t) {
    if (mode == NO_DIST) return;
    umt_dist_process single = {.bootstrap = UMT_DIST_SINGLE, .size = 1, .id_pipe = {-1, -1}};
    umt_dist_options o = umt_dist_defaults();
    o.always = true;
    o.reduce_bf16 = mode == DIST_BF16;
    EXPECT_OK(umt_dist_create(ctx, &single, &o, &t->dist));
}

/* The runs' umt_context_options.one_stream (false, the default: weight gradients on the side
 * stream, core/branch.h); test_weight_gradients_beside_give_the_one_stream_bits sets it. */
static bool one_stream;
/* Whether the last run's context sent a convolution's weight gradient to the side stream. */
static bool last_run_branched;
/* The runs' umt_optimizer_options.zero_grads_in_step, and the step after which the host writes
 * ones over the first parameter's gradient (-1: never): what a replay that left out its zero
 * fill must not add to. */
static bool consume;
static int touch_after = -1;

static void train_dist(umt_precision precision, bool fuse, bool graph, bool reads_loss, dist_mode mode,
                       run_result *out) {
    umt_context_options co = umt_context_defaults();
    co.seed = 5;
    co.precision = precision;
    co.one_stream = one_stream;
    umt_context *ctx = cuda_test_context_with(co);
    trainer t = {.reads_loss = reads_loss};
    char images_path[128], labels_path[128];
    snprintf(images_path, sizeof images_path, "%s/images", dir);
    snprintf(labels_path, sizeof labels_path, "%s/labels", dir);
    EXPECT_OK(umt_dataset_load_idx(ctx, images_path, labels_path, CLASSES, &t.data));
    if (mnist_cnn_build(ctx, &t.model)) fail_msg("mnist_cnn_build: %s", umt_last_error());
    t.model.fuse = fuse;
    start_dist(ctx, mode, &t);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.momentum = 0.9f;
    oo.loss_scaling = precision == UMT_PRECISION_FP16;
    oo.zero_grads_in_step = consume;
    EXPECT_OK(umt_optimizer_create(ctx, &oo, &t.opt));
    umt_step_graph *g = NULL;
    EXPECT_OK(umt_step_graph_create(ctx, graph, &g));
    int64_t order[SAMPLES];
    for (int epoch = 0, s = 0; epoch < EPOCHS; ++epoch) {
        EXPECT_OK(umt_permutation(ctx, SAMPLES, order));
        for (int64_t first = 0; first < SAMPLES; first += BATCH, ++s) {
            int64_t count = SAMPLES - first < BATCH ? SAMPLES - first : BATCH;
            /* A new rate every step: a replay must read it from the device. */
            umt_optimizer_set_lr(t.opt, umt_lr_cosine(0.05f, 0.001f, s, STEPS));
            EXPECT_OK(umt_step_graph_run(g, step, &t, order + first, (size_t)count * sizeof *order));
            EXPECT_OK(umt_tensor_get_f32(umt_step_graph_loss(g), 0, &out->losses[s]));
            if (s == touch_after) EXPECT_OK(umt_tensor_fill(umt_tensor_grad(umt_parameter_at(ctx, 0)), 1.0f));
        }
        if (epoch == 0) out->accuracy = evaluate(ctx, &t);
    }
    assert_int_equal(umt_optimizer_steps(t.opt), STEPS);
    out->stats = umt_step_graph_stats_get(g);
    out->off_reason = umt_step_graph_off_reason(g) != NULL;
    copy_parameters(ctx, out);
    last_run_branched = ctx->branch.workspace != NULL;
    if (t.dist) out->dist = umt_dist_stats_get(t.dist);
    /* With the graph alive: umt_dist_destroy makes it let go of the collectives it captured (NCCL's
     * destroy would wait for it forever). */
    umt_dist_destroy(t.dist);
    umt_context_destroy(ctx);
}

static void train_with(umt_precision precision, bool fuse, bool graph, bool reads_loss, run_result *out) {
    train_dist(precision, fuse, graph, reads_loss, NO_DIST, out);
}

static void train(umt_precision precision, bool fuse, bool graph, run_result *out) {
    train_with(precision, fuse, graph, false, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Comparison                                                                                  */

static bool bitwise_same(const run_result *a, const run_result *b) {
    return !memcmp(a->losses, b->losses, sizeof a->losses) && a->parameter_count == b->parameter_count &&
           !memcmp(a->parameters, b->parameters, (size_t)a->parameter_count * sizeof(float));
}

static double relative(float a, float b) { return fabs((double)a - b) / fmax(fabs((double)b), 1e-30); }

static void expect_same_run(const char *what, const run_result *graph, const run_result *eager, bool bitwise) {
    for (int s = 0; s < STEPS; ++s) {
        assert_true(isfinite(eager->losses[s]));
        if (bitwise ? memcmp(&graph->losses[s], &eager->losses[s], sizeof(float)) != 0
                    : relative(graph->losses[s], eager->losses[s]) > 1e-6)
            fail_msg("%s: step %d loss: graph %.9g, eager %.9g (%s)", what, s, (double)graph->losses[s],
                     (double)eager->losses[s], bitwise ? "expected the same bits" : "expected <= 1e-6 relative");
    }
    for (int64_t i = 0; i < eager->parameter_count; ++i) {
        float a = graph->parameters[i], b = eager->parameters[i];
        if (bitwise ? memcmp(&a, &b, sizeof a) != 0 : relative(a, b) > 1e-6 && fabs((double)a - b) > 1e-9)
            fail_msg("%s: parameter element %lld: graph %.9g, eager %.9g", what, (long long)i, (double)a, (double)b);
    }
}

/* fuse: the fused ops the trainer uses by default (mnist_cnn_model.h), or one op at a time. */
static void check_precision(umt_precision precision, bool fuse) {
    char name[32];
    snprintf(name, sizeof name, "%s, fuse %s", umt_precision_name(precision), fuse ? "on" : "off");
    run_result eager = {0}, again = {0}, graph = {0};
    train(precision, fuse, false, &eager);
    train(precision, fuse, false, &again);
    train(precision, fuse, true, &graph);
    bool deterministic = bitwise_same(&eager, &again);
    printf("%s: eager runs %s; graph run checked %s; graph: %lld captures, %lld replayed, %lld eager; "
           "loss %.4f -> %.4f, accuracy after epoch 1 %.1f%%\n",
           name, deterministic ? "bit-identical" : "differ", deterministic ? "bit for bit" : "to 1e-6 relative",
           (long long)graph.stats.captures, (long long)graph.stats.replayed_steps, (long long)graph.stats.eager_steps,
           (double)eager.losses[0], (double)eager.losses[STEPS - 1], graph.accuracy);
    expect_same_run(name, &graph, &eager, deterministic);
    assert_true(graph.accuracy == eager.accuracy);
    /* The graph really ran: replays in both epochs (captured again if the evaluation moved the
     * arena), the short batches and the warm-up steps eager, and the eager run never captured. */
    assert_true(graph.stats.captures >= 1);
    assert_true(graph.stats.replayed_steps >= STEPS - 2 * (1 + 2 + 1));
    assert_int_equal(graph.stats.replayed_steps + graph.stats.eager_steps, STEPS);
    assert_int_equal(eager.stats.captures, 0);
    assert_int_equal(eager.stats.eager_steps, STEPS);
    /* It learned something (the classes are easy): the loss fell. */
    assert_true(eager.losses[STEPS - 1] < 0.8f * eager.losses[0]);
    free(eager.parameters);
    free(again.parameters);
    free(graph.parameters);
}

/* zero_grads_in_step (each update consumes its gradients, so the captured step has no zero fill):
 * graph runs give the eager bits of runs without it; ones the host writes over a gradient between
 * steps make the next step run eagerly (its fill is needed, and wipes them out), with the eager
 * run's bits again. */
static void test_graph_replays_of_steps_that_consume_their_gradients_give_the_eager_bits(void **state) {
    (void)state;
    run_result plain = {0}, eager = {0}, graph = {0}, touched_eager = {0}, touched_graph = {0};
    train(UMT_PRECISION_BF16, true, false, &plain);
    consume = true;
    train(UMT_PRECISION_BF16, true, false, &eager);
    train(UMT_PRECISION_BF16, true, true, &graph);
    touch_after = 7;
    train(UMT_PRECISION_BF16, true, false, &touched_eager);
    train(UMT_PRECISION_BF16, true, true, &touched_graph);
    consume = false;
    touch_after = -1;
    expect_same_run("zero_grads_in_step, eager", &eager, &plain, true);
    expect_same_run("zero_grads_in_step, graph", &graph, &plain, true);
    expect_same_run("a gradient written between steps, graph", &touched_graph, &touched_eager, true);
    /* The next step's zero fill wipes the ones out: a replay that added to them would differ. */
    expect_same_run("a gradient written between steps, eager", &touched_eager, &eager, true);
    assert_true(graph.stats.replayed_steps >= STEPS - 2 * (1 + 2 + 1));
    assert_int_equal(touched_graph.stats.eager_steps, graph.stats.eager_steps + 1);
    printf("zero_grads_in_step: graph %lld replayed, %lld eager; with a gradient written after step 7, %lld eager\n",
           (long long)graph.stats.replayed_steps, (long long)graph.stats.eager_steps,
           (long long)touched_graph.stats.eager_steps);
    free(plain.parameters);
    free(eager.parameters);
    free(graph.parameters);
    free(touched_eager.parameters);
    free(touched_graph.parameters);
}

static void test_graph_replays_give_the_eager_losses_in_fp32(void **state) {
    (void)state;
    check_precision(UMT_PRECISION_FP32, true);
}

static void test_graph_replays_give_the_eager_losses_op_by_op(void **state) {
    (void)state;
    check_precision(UMT_PRECISION_FP32, false);
}

static void test_graph_replays_follow_the_loss_scale_in_fp16(void **state) {
    (void)state;
    check_precision(UMT_PRECISION_FP16, true);
}

/* A step that waits for the GPU (it reads its loss back) cannot be captured: the first capture
 * fails, the graph turns itself off, and every step runs eagerly, with the capture's host
 * effects (dropout draws, the optimizer's step count) taken back, so the losses and parameters
 * are still those of the eager run. */
static void test_a_step_that_cannot_be_captured_runs_eagerly_with_the_same_losses(void **state) {
    (void)state;
    run_result eager = {0}, fallback = {0};
    train(UMT_PRECISION_FP32, true, false, &eager);
    train_with(UMT_PRECISION_FP32, true, true, true, &fallback);
    assert_true(fallback.off_reason);
    assert_int_equal(fallback.stats.captures, 0);
    assert_int_equal(fallback.stats.replayed_steps, 0);
    assert_int_equal(fallback.stats.eager_steps, STEPS);
    expect_same_run("fallback", &fallback, &eager, true);
    free(eager.parameters);
    free(fallback.parameters);
}

/* Weight gradients on the side stream (core/branch.h) are the same kernels on the same inputs:
 * the run with them, eager and replayed, gives the bits of the run with every kernel on one
 * stream, in fp32 and bf16. The engines are cuDNN's first (UMT_CONV_TIMING=0), so that the runs
 * differ only in their streams. */
static void check_beside(umt_precision precision) {
    const char *name = umt_precision_name(precision);
    assert_int_equal(setenv("UMT_CONV_TIMING", "0", 1), 0);
    run_result serial = {0}, beside = {0}, beside_graph = {0};
    one_stream = true;
    train(precision, true, false, &serial);
    assert_false(last_run_branched);
    one_stream = false;
    train(precision, true, false, &beside);
    assert_true(last_run_branched);
    train(precision, true, true, &beside_graph);
    assert_true(last_run_branched);
    assert_int_equal(unsetenv("UMT_CONV_TIMING"), 0);
    printf("%s: one stream and the side stream, eager and replayed (%lld replays): loss %.4f -> %.4f\n", name,
           (long long)beside_graph.stats.replayed_steps, (double)serial.losses[0], (double)serial.losses[STEPS - 1]);
    expect_same_run(name, &beside, &serial, true);
    expect_same_run(name, &beside_graph, &serial, true);
    assert_true(beside_graph.stats.replayed_steps > 0);
    free(serial.parameters);
    free(beside.parameters);
    free(beside_graph.parameters);
}

static void test_weight_gradients_beside_give_the_one_stream_bits(void **state) {
    (void)state;
    check_beside(UMT_PRECISION_FP32);
    check_beside(UMT_PRECISION_BF16);
}

/* A parameter the tape used twice takes no side stream: its second contribution would add to the
 * same gradient from the compute stream. Nor does one whose op makes no input gradient (nothing
 * to run beside), nor one whose work passes UMT_BRANCH_MOST_FLOPS, nor any when a subsystem acts
 * in backward (here a one-rank data-parallel path). */
static void test_the_side_stream_takes_parameters_used_once(void **state) {
    (void)state;
    umt_context *ctx = cuda_test_context(5, UMT_PRECISION_FP32);
    umt_layer *fc = umt_linear_layer_new(ctx, "fc", 8, 8, false);
    assert_non_null(fc);
    umt_tensor *w = umt_parameter_at(ctx, 0);
    EXPECT_OK(umt_step_begin(ctx));
    umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, 8);
    assert_non_null(x);
    umt_tensor *once = umt_layer_forward(ctx, fc, x);
    assert_non_null(once);
    int dx = 1; /* any input gradient's address */
    assert_true(umt_branch_takes(ctx, w, &dx, 1e6));
    assert_false(umt_branch_takes(ctx, w, NULL, 1e6));
    assert_false(umt_branch_takes(ctx, w, &dx, 2 * UMT_BRANCH_MOST_FLOPS)); /* fills the GPU by itself */
    assert_non_null(umt_layer_forward(ctx, fc, once));
    assert_int_equal(w->tape_uses, 2);
    assert_false(umt_branch_takes(ctx, w, &dx, 1e6));
    EXPECT_OK(umt_step_begin(ctx));
    assert_int_equal(w->tape_uses, 0);
    umt_dist *dist = NULL;
    umt_dist_process single = {.bootstrap = UMT_DIST_SINGLE, .size = 1, .id_pipe = {-1, -1}};
    umt_dist_options o = umt_dist_defaults();
    o.always = true;
    EXPECT_OK(umt_dist_create(ctx, &single, &o, &dist));
    EXPECT_OK(umt_step_begin(ctx));
    assert_non_null(umt_layer_forward(ctx, fc, umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, 8)));
    assert_int_equal(w->tape_uses, 1);
    assert_false(umt_branch_takes(ctx, w, &dx, 1e6));
    umt_dist_destroy(dist);
    umt_context_destroy(ctx);
}

static void print_dist_run(const char *name, const run_result *r) {
    printf("%s: graph: %lld captures, %lld replayed, %lld eager; %d buckets (%zu bytes a step), %lld all-reduces op by "
           "op, %lld captured\n", name, (long long)r->stats.captures, (long long)r->stats.replayed_steps,
           (long long)r->stats.eager_steps, r->dist.buckets, r->dist.reduce_bytes, (long long)r->dist.eager_collectives,
           (long long)r->dist.captured_collectives);
}

/* The graph's capture, its replays, the evaluation that makes it capture again (agreed with the
 * other ranks: here none) and the short batches run eagerly, with the all-reduces in the graph. */
static void expect_captured_all_reduces(const run_result *graph, const run_result *eager) {
    assert_false(graph->off_reason);
    assert_true(graph->stats.captures >= 1);
    assert_true(graph->stats.replayed_steps >= STEPS - 2 * (1 + 2 + 1));
    assert_int_equal(graph->dist.buckets, 2); /* the last layers', then the convolutions' */
    assert_int_equal(graph->dist.captured_collectives, graph->stats.captures * graph->dist.buckets);
    assert_int_equal(graph->dist.eager_collectives, graph->stats.eager_steps * graph->dist.buckets);
    assert_int_equal(eager->dist.captured_collectives, 0);
    assert_int_equal(eager->dist.eager_collectives, STEPS * eager->dist.buckets);
}

static void test_graph_captures_the_all_reduce_of_one_rank_bit_for_bit(void **state) {
    (void)state;
    run_result plain = {0}, again = {0}, eager = {0}, graph = {0};
    train(UMT_PRECISION_FP32, true, false, &plain);
    train(UMT_PRECISION_FP32, true, false, &again);
    train_dist(UMT_PRECISION_FP32, true, false, false, DIST_F32, &eager);
    train_dist(UMT_PRECISION_FP32, true, true, false, DIST_F32, &graph);
    bool deterministic = bitwise_same(&plain, &again);
    printf("fp32, one rank's all-reduce: eager runs %s\n", deterministic ? "bit-identical" : "differ");
    print_dist_run("fp32, --dist on, eager", &eager);
    print_dist_run("fp32, --dist on, graph", &graph);
    expect_same_run("--dist on, eager", &eager, &plain, deterministic);
    expect_same_run("--dist on, graph", &graph, &plain, deterministic);
    expect_captured_all_reduces(&graph, &eager);
    free(plain.parameters);
    free(again.parameters);
    free(eager.parameters);
    free(graph.parameters);
}

/* Reduced in bf16 the gradients are rounded (not the run without data parallelism), but the graph
 * must still compute what the eager steps do. */
static void test_graph_captures_the_bf16_all_reduce_of_one_rank_bit_for_bit(void **state) {
    (void)state;
    run_result eager = {0}, again = {0}, graph = {0};
    train_dist(UMT_PRECISION_FP32, true, false, false, DIST_BF16, &eager);
    train_dist(UMT_PRECISION_FP32, true, false, false, DIST_BF16, &again);
    train_dist(UMT_PRECISION_FP32, true, true, false, DIST_BF16, &graph);
    bool deterministic = bitwise_same(&eager, &again);
    print_dist_run("fp32, --dist on --reduce bf16, graph", &graph);
    expect_same_run("--dist on --reduce bf16, graph", &graph, &eager, deterministic);
    expect_captured_all_reduces(&graph, &eager);
    assert_true(eager.losses[STEPS - 1] < 0.8f * eager.losses[0]);
    free(eager.parameters);
    free(again.parameters);
    free(graph.parameters);
}

/* The same API on the CPU: no capture, every step eager, same loss bookkeeping. */
static void test_cpu_steps_run_eagerly(void **state) {
    (void)state;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *ctx = NULL;
    EXPECT_OK(umt_context_create(&co, &ctx));
    umt_step_graph *g = NULL;
    EXPECT_OK(umt_step_graph_create(ctx, true, &g));
    double mean = -1;
    int64_t steps = -1;
    EXPECT_OK(umt_step_graph_take_mean_loss(g, &mean, &steps));
    assert_int_equal(steps, 0);
    assert_true(mean == 0.0);
    umt_context_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* The non-finite check in a replayed step                                                     */

enum { POISON_STEPS = 12, POISONED = 6 }; /* 2 eager steps, a capture, replays: step 6 is one */

typedef enum { POISON_LOSS, POISON_GRADIENT } poison_kind;

typedef struct {
    trainer t;
    umt_tensor *loss_term;     /* [1]: added to the loss (0, or NaN: the loss alone not finite) */
    umt_tensor *gradient_term; /* [10]: mean(fc2.bias * it) added too: NaN makes fc2.bias's gradient NaN */
} poisoned_trainer;

static umt_tensor *poisoned_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    poisoned_trainer *p = user;
    umt_tensor *images = NULL, *labels = NULL;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx) ||
        umt_dataset_batch(ctx, p->t.data, input, (int64_t)(input_bytes / sizeof(int64_t)), 0.5f, 0.25f, &images,
                          &labels))
        return NULL;
    umt_tensor *bias = umt_parameter_at(ctx, umt_parameter_count(ctx) - 1);
    umt_tensor *loss = mnist_cnn_loss(ctx, &p->t.model, images, labels);
    loss = umt_add(ctx, umt_add(ctx, loss, p->loss_term), umt_mean(ctx, umt_mul(ctx, bias, p->gradient_term)));
    if (!loss || umt_backward(ctx, loss) || umt_optimizer_step(p->t.opt)) return NULL;
    return loss;
}

static umt_tensor *filled(umt_context *ctx, int64_t n, float value) {
    umt_tensor *t = umt_tensor_new_1d(ctx, UMT_POOL_WEIGHTS, UMT_F32, n);
    assert_non_null(t);
    EXPECT_OK(umt_tensor_fill(t, value));
    return t;
}

typedef struct {
    run_result before; /* the parameters as the poisoned step began */
    run_result after;  /* and after the last step */
    umt_nonfinite_report report;
    char parameter[64]; /* report.parameter's name, kept: the report's pointer dies with the context */
    bool found_without_a_wait;
} poisoned_result;

/* The poisoned tensors set to value, between two steps (the queued ones done first). */
static void set_poison(umt_context *ctx, poisoned_trainer *p, poison_kind kind, float value) {
    EXPECT_OK(umt_synchronize(ctx));
    EXPECT_OK(umt_tensor_fill(kind == POISON_LOSS ? p->loss_term : p->gradient_term, value));
}

static void train_poisoned(umt_precision precision, bool graph, umt_nonfinite_policy policy, poison_kind kind,
                           poisoned_result *out) {
    umt_context *ctx = cuda_test_context(5, precision);
    poisoned_trainer p = {.t = {.reads_loss = false}};
    char images_path[128], labels_path[128];
    snprintf(images_path, sizeof images_path, "%s/images", dir);
    snprintf(labels_path, sizeof labels_path, "%s/labels", dir);
    EXPECT_OK(umt_dataset_load_idx(ctx, images_path, labels_path, CLASSES, &p.t.data));
    if (mnist_cnn_build(ctx, &p.t.model)) fail_msg("mnist_cnn_build: %s", umt_last_error());
    p.loss_term = filled(ctx, 1, 0.0f);
    p.gradient_term = filled(ctx, 10, 0.0f);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.momentum = 0.9f;
    oo.on_nonfinite = policy;
    EXPECT_OK(umt_optimizer_create(ctx, &oo, &p.t.opt));
    umt_step_graph *g = NULL;
    EXPECT_OK(umt_step_graph_create(ctx, graph, &g));
    int64_t order[SAMPLES];
    EXPECT_OK(umt_permutation(ctx, SAMPLES, order));
    for (int s = 0; s < POISON_STEPS; ++s) {
        if (s == POISONED) {
            set_poison(ctx, &p, kind, NAN);
            copy_parameters(ctx, &out->before);
        }
        if (s == POISONED + 1) set_poison(ctx, &p, kind, 0.0f); /* the steps after it are finite again */
        EXPECT_OK(umt_step_graph_run(g, poisoned_step, &p, order + s * BATCH, BATCH * sizeof *order));
        /* The host learns of it from the doorbell, a read of host memory: no wait asked for. */
        for (int tries = 0; s == POISONED && tries < 2000 && !out->found_without_a_wait; ++tries) {
            out->found_without_a_wait = umt_optimizer_nonfinite_found(p.t.opt);
            if (!out->found_without_a_wait) nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        }
    }
    EXPECT_OK(umt_optimizer_nonfinite_get(p.t.opt, &out->report));
    snprintf(out->parameter, sizeof out->parameter, "%s", out->report.parameter ? out->report.parameter : "");
    out->after.stats = umt_step_graph_stats_get(g);
    out->after.off_reason = umt_step_graph_off_reason(g) != NULL;
    copy_parameters(ctx, &out->after);
    umt_context_destroy(ctx);
}

static void expect_same_parameters(const char *what, const run_result *got, const run_result *want, bool bitwise) {
    assert_int_equal(got->parameter_count, want->parameter_count);
    for (int64_t i = 0; i < want->parameter_count; ++i) {
        float a = got->parameters[i], b = want->parameters[i];
        bool differ = bitwise ? memcmp(&a, &b, sizeof a) != 0 : relative(a, b) > 1e-6 && fabs((double)a - b) > 1e-9;
        if (!isfinite(a) || differ)
            fail_msg("%s: parameter element %lld: %.9g, expected %.9g", what, (long long)i, (double)a, (double)b);
    }
}

static void free_poisoned(poisoned_result *r) {
    free(r->before.parameters);
    free(r->after.parameters);
}

/* stop: the step's update and every later one skipped, the step named; the graph replayed it. */
static void check_stop(umt_precision precision, poison_kind kind) {
    poisoned_result r = {0};
    train_poisoned(precision, true, UMT_NONFINITE_STOP, kind, &r);
    printf("%s, %s poisoned at step %d: stop; graph: %lld captures, %lld replayed, %lld eager\n",
           umt_precision_name(precision), kind == POISON_LOSS ? "the loss" : "fc2.bias's gradient", POISONED + 1,
           (long long)r.after.stats.captures, (long long)r.after.stats.replayed_steps,
           (long long)r.after.stats.eager_steps);
    assert_false(r.after.off_reason);
    assert_true(r.after.stats.replayed_steps >= POISON_STEPS - POISONED); /* the poisoned step was a replay */
    assert_true(r.found_without_a_wait);
    assert_int_equal(r.report.first_step, POISONED + 1);
    assert_int_equal(r.report.steps, 1); /* the steps after it were finite, and skipped all the same */
    assert_true(r.report.loss && isnan(r.report.loss_value) && r.report.stopped);
    if (kind == POISON_LOSS) assert_null(r.report.parameter);
    else assert_string_equal(r.parameter, "fc2.bias");
    expect_same_parameters("stopped", &r.after, &r.before, true);
    free_poisoned(&r);
}

/* skip: that step alone left out, counted; the graph run ends as the same run op by op. */
static void check_skip(umt_precision precision) {
    poisoned_result graph = {0}, eager = {0};
    train_poisoned(precision, true, UMT_NONFINITE_SKIP, POISON_GRADIENT, &graph);
    train_poisoned(precision, false, UMT_NONFINITE_SKIP, POISON_GRADIENT, &eager);
    assert_true(graph.after.stats.replayed_steps >= POISON_STEPS - POISONED);
    assert_true(graph.found_without_a_wait && eager.found_without_a_wait);
    assert_int_equal(graph.report.steps, 1);
    assert_int_equal(graph.report.first_step, POISONED + 1);
    assert_false(graph.report.stopped);
    assert_string_equal(graph.parameter, "fc2.bias");
    /* The later steps were applied: the parameters moved on from where the poisoned step found them. */
    assert_true(memcmp(graph.after.parameters, graph.before.parameters,
                       (size_t)graph.before.parameter_count * sizeof(float)) != 0);
    expect_same_parameters("skip, graph against eager", &graph.after, &eager.after,
                           precision == UMT_PRECISION_FP32);
    free_poisoned(&graph);
    free_poisoned(&eager);
}

static void test_a_nonfinite_loss_in_a_replay_stops_the_run_in_fp32(void **state) {
    (void)state;
    check_stop(UMT_PRECISION_FP32, POISON_LOSS);
}

static void test_a_nonfinite_gradient_in_a_replay_stops_the_run_naming_it_in_fp32(void **state) {
    (void)state;
    check_stop(UMT_PRECISION_FP32, POISON_GRADIENT);
}

static void test_a_nonfinite_step_in_a_replay_stops_the_run_in_bf16(void **state) {
    (void)state;
    check_stop(UMT_PRECISION_BF16, POISON_LOSS);
    check_stop(UMT_PRECISION_BF16, POISON_GRADIENT);
}

static void test_skip_leaves_out_the_nonfinite_replay_alone_in_fp32_and_bf16(void **state) {
    (void)state;
    check_skip(UMT_PRECISION_FP32);
    check_skip(UMT_PRECISION_BF16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_replays_of_steps_that_consume_their_gradients_give_the_eager_bits),
        cmocka_unit_test(test_graph_replays_give_the_eager_losses_in_fp32),
        cmocka_unit_test(test_graph_replays_give_the_eager_losses_op_by_op),
        cmocka_unit_test(test_graph_replays_follow_the_loss_scale_in_fp16),
        cmocka_unit_test(test_a_step_that_cannot_be_captured_runs_eagerly_with_the_same_losses),
        cmocka_unit_test(test_weight_gradients_beside_give_the_one_stream_bits),
        cmocka_unit_test(test_the_side_stream_takes_parameters_used_once),
        cmocka_unit_test(test_graph_captures_the_all_reduce_of_one_rank_bit_for_bit),
        cmocka_unit_test(test_graph_captures_the_bf16_all_reduce_of_one_rank_bit_for_bit),
        cmocka_unit_test(test_cpu_steps_run_eagerly),
        cmocka_unit_test(test_a_nonfinite_loss_in_a_replay_stops_the_run_in_fp32),
        cmocka_unit_test(test_a_nonfinite_gradient_in_a_replay_stops_the_run_naming_it_in_fp32),
        cmocka_unit_test(test_a_nonfinite_step_in_a_replay_stops_the_run_in_bf16),
        cmocka_unit_test(test_skip_leaves_out_the_nonfinite_replay_alone_in_fp32_and_bf16),
    };
    return cmocka_run_group_tests(tests, write_dataset, NULL);
}
