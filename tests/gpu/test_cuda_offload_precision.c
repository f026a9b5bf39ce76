/*
 * tests/gpu/test_cuda_offload_precision.c — the offload tier beyond fp32 on a real GPU: bf16 and
 * fp16 models whose weights, gradients and Adam state are offloaded train as the same models in
 * GPU memory do (losses within half-precision tolerance) with updates on the GPU, on CPU threads,
 * and during backward (the ring, and CPU threads beside it); only compute copies cross to the GPU
 * and they live in pinned memory, never in the weights pool; fp16's loss scaling and clipping by
 * the global norm are honoured (updates in backward fall back to after backward); a wide CNN's
 * conv weights stream at a quarter of its need; micro-batches accumulate offloaded gradients as
 * the whole batch does; and the data-parallel path on one rank (the gradient hook, a one-rank
 * all-reduce in place before the gradient goes home) leaves the losses as they were.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"
#include "dist/umt_dist.h"
#include "tests/gpu/offload_count.h"
#include "umtrain.h"

#define WIDTH 2048
#define DEPTH 6
#define BATCH 64
#define STEPS 10

/* What a run asks for; zero is the in-memory fp32 run with Adam's defaults. */
typedef struct {
    umt_precision precision;
    const char *budget;           /* NULL: no UMT_DEVICE_BUDGET and no offload */
    umt_offload_optimizer where;  /* with a budget */
    int host_updates;
    int micro_batches;            /* 0 or 1: the batch whole */
    float clip;
    bool dist;                    /* the data-parallel path on one rank */
    size_t reserve;               /* the plan's device bytes for activations (0: 24 MiB) */
    bool bf16_gradients_home;     /* umt_offload_options.bf16_gradients_home */
} run_options;

typedef struct {
    umt_context *ctx;
    umt_layer *layers[DEPTH];
    umt_optimizer *opt;
    umt_dist *dist;
    umt_tensor *x[2], *labels[2];
} model;

static run_options offloaded(umt_precision precision, const char *budget, umt_offload_optimizer where) {
    return (run_options){.precision = precision, .budget = budget, .where = where};
}

static umt_context *alive;
static umt_dist *alive_dist;

static int destroy_leftover(void **state) {
    (void)state;
    umt_dist_destroy(alive_dist);
    umt_context_destroy(alive);
    alive = NULL;
    alive_dist = NULL;
    return 0;
}

static void destroy(model *m) {
    destroy_leftover(NULL);
    m->ctx = NULL;
}

static umt_context *context(const run_options *r, uint64_t seed) {
    if (r->budget) setenv("UMT_DEVICE_BUDGET", r->budget, 1);
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    o.seed = seed;
    o.precision = r->precision;
    umt_context *ctx = NULL;
    umt_status st = umt_context_create(&o, &ctx);
    unsetenv("UMT_DEVICE_BUDGET");
    if (st != UMT_OK) fail_msg("context: %s", umt_last_error());
    alive = ctx;
    umt_offload_options tier = umt_offload_defaults();
    tier.reserve_bytes = r->reserve ? r->reserve : (size_t)24 << 20;
    tier.optimizer = r->where;
    tier.host_updates = r->host_updates;
    tier.bf16_gradients_home = r->bf16_gradients_home;
    if (r->budget && umt_offload_enable(ctx, &tier) != UMT_OK) fail_msg("offload: %s", umt_last_error());
    return ctx;
}

/* The optimizer (Adam; fp16 scales the loss), then the data-parallel path if asked. */
static void optimizer_and_dist(model *m, const run_options *r) {
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    oo.loss_scaling = r->precision == UMT_PRECISION_FP16;
    oo.max_grad_norm = r->clip;
    assert_int_equal(umt_optimizer_create(m->ctx, &oo, &m->opt), UMT_OK);
    if (!r->dist) return;
    umt_dist_process one = {.bootstrap = UMT_DIST_SINGLE, .rank = 0, .size = 1, .local_rank = 0};
    umt_dist_options d = umt_dist_defaults();
    d.always = true;
    if (umt_dist_create(m->ctx, &one, &d, &m->dist) != UMT_OK) fail_msg("dist: %s", umt_last_error());
    alive_dist = m->dist;
}

/* The same BATCH samples whatever the split: inputs from a fixed sequence, in one or two tensors;
 * images: [rows, 1, 28, 28] (sample_elements 784), else [rows, sample_elements]. */
static void inputs(model *m, int batch, int parts, bool images, int32_t classes, int64_t sample_elements) {
    int64_t rows = batch / parts, n = rows * sample_elements;
    float *values = malloc((size_t)n * sizeof *values);
    int32_t labels[BATCH] = {0};
    for (int k = 0; k < parts; ++k) {
        for (int64_t i = 0; i < n; ++i) values[i] = (float)(((k * n + i) * 2654435761u % 2001) / 1000.0 - 1.0);
        for (int64_t i = 0; i < rows; ++i) labels[i] = (int32_t)(((k * rows + i) * 37) % classes);
        m->x[k] = images ? umt_tensor_new_4d(m->ctx, UMT_POOL_DATASET, UMT_F32, rows, 1, 28, 28)
                         : umt_tensor_new_2d(m->ctx, UMT_POOL_DATASET, UMT_F32, rows, sample_elements);
        m->labels[k] = umt_tensor_new_1d(m->ctx, UMT_POOL_DATASET, UMT_I32, rows);
        assert_int_equal(umt_tensor_copy_from_host(m->x[k], values, (size_t)n * sizeof *values), UMT_OK);
        assert_int_equal(umt_tensor_copy_from_host(m->labels[k], labels, (size_t)rows * sizeof *labels), UMT_OK);
    }
    free(values);
}

static void build_mlp(model *m, const run_options *r) {
    m->ctx = context(r, 7);
    for (int l = 0; l < DEPTH; ++l) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        m->layers[l] = umt_linear_layer_new(m->ctx, name, WIDTH, WIDTH, true);
        assert_non_null(m->layers[l]);
    }
    optimizer_and_dist(m, r);
    inputs(m, BATCH, r->micro_batches > 1 ? r->micro_batches : 1, false, WIDTH, WIDTH);
}

static umt_tensor *mlp_loss(model *m, int k) {
    umt_tensor *h = m->x[k];
    for (int l = 0; l < DEPTH; ++l) {
        h = umt_layer_forward(m->ctx, m->layers[l], h);
        if (l + 1 < DEPTH) h = umt_relu(m->ctx, h);
    }
    return umt_softmax_cross_entropy(m->ctx, h, m->labels[k]);
}

/* One step (as micro-batches when asked), its loss read back. */
static umt_status train_step(model *m, const run_options *r, umt_tensor *(*loss_of)(model *, int), float *out) {
    UMT_TRY(umt_step_begin(m->ctx));
    UMT_TRY(umt_zero_grad(m->ctx));
    int parts = r->micro_batches > 1 ? r->micro_batches : 1;
    umt_tensor *loss = NULL;
    for (int k = 0; k < parts; ++k) {
        if (parts > 1) UMT_TRY(umt_micro_batch_begin(m->ctx, k * (BATCH / parts), BATCH / parts, BATCH));
        if (!(loss = loss_of(m, k))) return umt_last_status();
        UMT_TRY(umt_backward_scaled(m->ctx, loss, m->opt));
        if (parts > 1) loss = umt_micro_batch_loss(m->ctx);
    }
    if (m->dist) UMT_TRY(umt_dist_finish_gradients(m->dist));
    UMT_TRY(umt_optimizer_step(m->opt));
    return umt_tensor_get_f32(loss, 0, out);
}

static void train(model *m, const run_options *r, umt_tensor *(*loss_of)(model *, int), int steps, float *losses) {
    for (int s = 0; s < steps; ++s)
        if (train_step(m, r, loss_of, &losses[s]) != UMT_OK) fail_msg("step %d: %s", s + 1, umt_last_error());
}

static void expect_close(const float *got, const float *want, int steps, double tolerance, const char *what,
                         bool trains) {
    for (int s = 0; s < steps; ++s) {
        double rel = fabs((double)got[s] - want[s]) / fabs((double)want[s]);
        print_message("%s step %2d: reference %.9g, run %.9g, relative %.2e%s\n", what, s + 1, want[s], got[s], rel,
                      got[s] == want[s] ? " (bit-identical)" : "");
        assert_true(rel <= tolerance);
    }
    if (trains) assert_true(want[steps - 1] < want[0]); /* and it trains */
}

/* Offloaded weights stream their compute copy: made home by the tier, in pinned memory, the
 * master beside it; the device within the budget. */
static void expect_copies_home(const model *m) {
    int copies = 0;
    for (int i = 0; i < umt_parameter_count(m->ctx); ++i) {
        const umt_tensor *p = umt_parameter_at(m->ctx, i);
        if (!p->offload.home) continue;
        assert_non_null(p->lowp);
        assert_int_equal(p->lowp->pool, UMT_POOL_OFFLOAD);
        struct cudaPointerAttributes a;
        assert_int_equal(cudaPointerGetAttributes(&a, p->lowp->offload.home), cudaSuccess);
        assert_int_equal(a.type, cudaMemoryTypeHost);
        copies++;
    }
    size_t budget, used;
    umt_device_budget(m->ctx, &budget, &used);
    print_message("%d offloaded weights stream their compute copy; device %zu of %zu bytes\n", copies, used, budget);
    assert_true(copies >= 1);
    assert_true(used <= budget);
}

/* ----------------------------------------------------------------------------------------- */
/* bf16 and fp16 MLPs, offloaded against in memory */

/* The offloaded run's statistics come back for the caller's own checks. */
static umt_offload_stats mlp_against_memory(run_options r, double tolerance) {
    run_options memory = {.precision = r.precision, .clip = r.clip};
    model m = {0};
    float reference[STEPS], losses[STEPS];
    build_mlp(&m, &memory);
    train(&m, &memory, mlp_loss, STEPS, reference);
    destroy(&m);
    build_mlp(&m, &r);
    train(&m, &r, mlp_loss, STEPS, losses);
    expect_copies_home(&m);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(m.ctx, &st), UMT_OK);
    print_message("updates on the %s, %llu in backward; %.1f MB to the device, %.1f MB to the host\n",
                  umt_offload_optimizer_name(st.optimizer), (unsigned long long)st.updates_in_backward,
                  st.bytes_to_device / 1e6, st.bytes_to_host / 1e6);
    /* Updates in backward: every step updated every parameter the tier holds anything of then
     * (loss scaling and clipping: none, they run after backward). */
    bool in_backward = r.where == UMT_OFFLOAD_OPTIM_BACKWARD && r.precision != UMT_PRECISION_FP16 && r.clip == 0;
    assert_int_equal(st.updates_in_backward, in_backward ? (uint64_t)STEPS * offload_count_parameters(m.ctx) : 0);
    /* Clipped at 0.5, this model does not fall in STEPS steps at Adam's lr, in memory as offloaded:
     * the clipping test asserts instead that clipping changed the run. */
    expect_close(losses, reference, STEPS, tolerance, umt_precision_name(r.precision), r.clip == 0);
    destroy(&m);
    return st;
}

/* Half precision: the offloaded run takes the same kernels on the same values, but a CPU update's
 * rounding may differ from the GPU's in the last bit, which a bf16 copy can turn into one ulp. */
#define BF16_TOLERANCE 5e-3

static void test_bf16_offloaded_matches_in_memory_with_gpu_updates(void **state) {
    (void)state;
    mlp_against_memory(offloaded(UMT_PRECISION_BF16, "200M", UMT_OFFLOAD_OPTIM_GPU), BF16_TOLERANCE);
}

static void test_bf16_offloaded_matches_in_memory_with_cpu_updates(void **state) {
    (void)state;
    mlp_against_memory(offloaded(UMT_PRECISION_BF16, "200M", UMT_OFFLOAD_OPTIM_CPU), BF16_TOLERANCE);
}

static void test_bf16_offloaded_matches_in_memory_with_updates_in_backward(void **state) {
    (void)state;
    mlp_against_memory(offloaded(UMT_PRECISION_BF16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD), BF16_TOLERANCE);
}

static void test_bf16_updates_in_backward_on_cpu_threads_beside_the_ring(void **state) {
    (void)state;
    run_options r = offloaded(UMT_PRECISION_BF16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD);
    r.host_updates = 2;
    mlp_against_memory(r, BF16_TOLERANCE);
}

/* Under bf16 with bf16_gradients_home, the gradients the CPU threads update with come home in
 * bf16: each such element sends 2 bytes fewer than in f32 (the default), and both runs stay within
 * bf16's tolerance of the in-memory one. */
static void test_bf16_gradients_home_for_cpu_updates_cross_at_half_the_bytes(void **state) {
    (void)state;
    run_options half = offloaded(UMT_PRECISION_BF16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD), full = half;
    half.host_updates = full.host_updates = 2;
    half.bf16_gradients_home = true;
    umt_offload_stats a = mlp_against_memory(half, BF16_TOLERANCE), b = mlp_against_memory(full, BF16_TOLERANCE);
    print_message("CPU-updated elements %llu; to the host: bf16 gradients %.3f MB, f32 %.3f MB\n",
                  (unsigned long long)a.host_updated_elements, a.bytes_to_host / 1e6, b.bytes_to_host / 1e6);
    assert_true(a.host_updated_elements > 0);
    assert_int_equal(a.host_updated_elements, b.host_updated_elements);
    assert_int_equal(b.bytes_to_host - a.bytes_to_host, 2 * a.host_updated_elements);
    assert_int_equal(a.bytes_to_device, b.bytes_to_device);
}

static void test_fp16_offloaded_with_loss_scaling_matches_in_memory(void **state) {
    (void)state;
    mlp_against_memory(offloaded(UMT_PRECISION_FP16, "200M", UMT_OFFLOAD_OPTIM_GPU), BF16_TOLERANCE);
}

/* Loss scaling needs every gradient before any update: the tier updates after backward instead. */
static void test_fp16_updates_in_backward_fall_back_to_after_backward(void **state) {
    (void)state;
    mlp_against_memory(offloaded(UMT_PRECISION_FP16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD), BF16_TOLERANCE);
    model m = {0};
    run_options r = offloaded(UMT_PRECISION_FP16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD);
    build_mlp(&m, &r);
    float loss[2];
    train(&m, &r, mlp_loss, 2, loss);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(m.ctx, &st), UMT_OK);
    assert_int_equal(st.optimizer, UMT_OFFLOAD_OPTIM_GPU);
    assert_int_equal(st.updates_in_backward, 0);
    destroy(&m);
}

/* A norm of 0.5 clips every step of this model (its gradient norm starts above 1). */
static void test_bf16_clipping_by_global_norm_offloaded_matches_in_memory(void **state) {
    (void)state;
    run_options cpu = offloaded(UMT_PRECISION_BF16, "200M", UMT_OFFLOAD_OPTIM_CPU);
    run_options backward = offloaded(UMT_PRECISION_BF16, "240M", UMT_OFFLOAD_OPTIM_BACKWARD);
    cpu.clip = backward.clip = 0.5f;
    mlp_against_memory(cpu, BF16_TOLERANCE);
    mlp_against_memory(backward, BF16_TOLERANCE);
    /* The norm did clip: in memory, the clipped run's losses are not the unclipped run's. */
    run_options clipped = {.precision = UMT_PRECISION_BF16, .clip = 0.5f}, plain = {.precision = UMT_PRECISION_BF16};
    float a[STEPS], b[STEPS];
    model m = {0};
    build_mlp(&m, &clipped);
    train(&m, &clipped, mlp_loss, STEPS, a);
    destroy(&m);
    build_mlp(&m, &plain);
    train(&m, &plain, mlp_loss, STEPS, b);
    destroy(&m);
    assert_true(a[STEPS - 1] != b[STEPS - 1]);
}

/* ----------------------------------------------------------------------------------------- */
/* Micro-batches and one-rank data parallelism, offloaded (fp32: the results are exact) */

static void offloaded_against(run_options r, run_options reference_run, double tolerance) {
    model m = {0};
    float reference[STEPS], losses[STEPS];
    build_mlp(&m, &reference_run);
    train(&m, &reference_run, mlp_loss, STEPS, reference);
    destroy(&m);
    build_mlp(&m, &r);
    train(&m, &r, mlp_loss, STEPS, losses);
    size_t budget, used;
    umt_device_budget(m.ctx, &budget, &used);
    assert_true(used <= budget);
    expect_close(losses, reference, STEPS, tolerance, r.dist ? "dist" : "micro-batches", true);
    destroy(&m);
}

static void test_micro_batches_accumulate_offloaded_gradients_as_the_whole_batch(void **state) {
    (void)state;
    /* Offloaded micro-batches against the same micro-batches in GPU memory: the tier must carry a
     * gradient from one micro-batch to the next exactly (one lost or counted twice moves the loss
     * by far more). Micro-batches against the whole batch are tests/gpu/test_micro_batch_gpu.c's:
     * over 10 Adam steps of this MLP their rounding alone reaches 1.2e-4. */
    run_options in_memory = {.precision = UMT_PRECISION_FP32, .micro_batches = 2};
    run_options split = offloaded(UMT_PRECISION_FP32, "200M", UMT_OFFLOAD_OPTIM_GPU);
    split.micro_batches = 2;
    offloaded_against(split, in_memory, 1e-6);
    split.where = UMT_OFFLOAD_OPTIM_BACKWARD;
    split.budget = "240M";
    offloaded_against(split, in_memory, 1e-6);
}

/* One rank's all-reduce (ncclAvg) is its own gradient: the losses of the offloaded run stay. */
static void test_one_rank_data_parallelism_through_the_offload_tier_leaves_the_losses(void **state) {
    (void)state;
    umt_offload_optimizer ways[] = {UMT_OFFLOAD_OPTIM_GPU, UMT_OFFLOAD_OPTIM_CPU, UMT_OFFLOAD_OPTIM_BACKWARD};
    for (int w = 0; w < 3; ++w) {
        run_options plain = offloaded(UMT_PRECISION_FP32, w == 2 ? "240M" : "200M", ways[w]);
        run_options dist = plain;
        dist.dist = true;
        offloaded_against(dist, plain, 1e-6);
    }
}

/* A step graph cannot follow the tier's host work: it says why, once, and every step runs eagerly
 * with the losses of the run without it. */
static umt_tensor *graph_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    (void)ctx, (void)input, (void)input_bytes;
    model *m = user;
    if (umt_step_begin(m->ctx) || umt_zero_grad(m->ctx)) return NULL;
    umt_tensor *loss = mlp_loss(m, 0);
    if (!loss || umt_backward_scaled(m->ctx, loss, m->opt) || umt_optimizer_step(m->opt)) return NULL;
    return loss;
}

static void test_a_step_graph_runs_an_offloaded_bf16_model_eagerly_and_says_why(void **state) {
    (void)state;
    run_options r = offloaded(UMT_PRECISION_BF16, "200M", UMT_OFFLOAD_OPTIM_GPU);
    model m = {0};
    float reference[STEPS], losses[STEPS];
    build_mlp(&m, &r);
    train(&m, &r, mlp_loss, STEPS, reference);
    destroy(&m);
    build_mlp(&m, &r);
    umt_step_graph *graph = NULL;
    assert_int_equal(umt_step_graph_create(m.ctx, true, &graph), UMT_OK);
    for (int s = 0; s < STEPS; ++s) {
        if (umt_step_graph_run(graph, graph_step, &m, NULL, 0) != UMT_OK)
            fail_msg("step %d: %s", s + 1, umt_last_error());
        assert_int_equal(umt_tensor_get_f32(umt_step_graph_loss(graph), 0, &losses[s]), UMT_OK);
    }
    umt_step_graph_stats st = umt_step_graph_stats_get(graph);
    const char *why = umt_step_graph_off_reason(graph);
    print_message("replayed %lld, off: %s\n", (long long)st.replayed_steps, why ? why : "(none)");
    assert_int_equal(st.replayed_steps, 0);
    assert_non_null(why);
    assert_non_null(strstr(why, "offload"));
    umt_step_graph_destroy(graph);
    expect_close(losses, reference, STEPS, 1e-6, "graph off", true);
    destroy(&m);
}

/* ----------------------------------------------------------------------------------------- */
/* A wide CNN whose conv weights stream, in bf16, at a quarter of what it needs */

#define CONV_LAYERS 12
#define CONV_CHANNELS 768
#define CONV_STEPS 5
#define CONV_BATCH 8

static umt_layer *convs[CONV_LAYERS + 2];

static umt_tensor *cnn_loss(model *m, int k) {
    umt_tensor *h = umt_layer_forward_relu(m->ctx, convs[0], m->x[k]); /* 1 -> C at 28 x 28 */
    h = umt_max_pool2d(m->ctx, h, 2, 2);                               /* 14 x 14 */
    for (int l = 1; l <= CONV_LAYERS; ++l) h = umt_layer_forward_relu(m->ctx, convs[l], h);
    h = umt_max_pool2d(m->ctx, h, 2, 2); /* 7 x 7 */
    h = umt_layer_forward(m->ctx, convs[CONV_LAYERS + 1], umt_flatten(m->ctx, h));
    return umt_softmax_cross_entropy(m->ctx, h, m->labels[k]);
}

static void build_cnn(model *m, const run_options *r) {
    m->ctx = context(r, 11);
    convs[0] = umt_conv2d_layer_new(m->ctx, "stem", 1, CONV_CHANNELS, 3, 1, 1, true);
    for (int l = 1; l <= CONV_LAYERS; ++l) {
        char name[16];
        snprintf(name, sizeof name, "conv%d", l);
        convs[l] = umt_conv2d_layer_new(m->ctx, name, CONV_CHANNELS, CONV_CHANNELS, 3, 1, 1, true);
    }
    convs[CONV_LAYERS + 1] = umt_linear_layer_new(m->ctx, "fc", CONV_CHANNELS * 49, 10, true);
    for (int l = 0; l < CONV_LAYERS + 2; ++l) assert_non_null(convs[l]);
    optimizer_and_dist(m, r);
    inputs(m, CONV_BATCH, 1, true, 10, 28 * 28);
}

/* What the CNN needs on the GPU in bf16 with Adam: per parameter element its weight, compute copy,
 * gradient and two moments (18 bytes), and a reserve for the activations of its batch of 8 and
 * cuDNN's workspace. */
#define CNN_RESERVE ((size_t)128 << 20)

static size_t cnn_need_bytes(void) {
    size_t conv = (size_t)CONV_CHANNELS * CONV_CHANNELS * 9 * CONV_LAYERS, fc = (size_t)CONV_CHANNELS * 49 * 10;
    return (conv + fc) * 18 + CNN_RESERVE;
}

static void test_wide_cnn_streams_its_conv_weights_in_bf16_at_a_quarter_of_its_need(void **state) {
    (void)state;
    size_t free_bytes = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    size_t need = cnn_need_bytes();
    if (free_bytes < 2 * need) skip();
    char budget[32];
    snprintf(budget, sizeof budget, "%zuM", need / 4 >> 20);
    print_message("the CNN needs about %zu MiB; offloaded at a budget of %s\n", need >> 20, budget);
    run_options memory = {.precision = UMT_PRECISION_BF16};
    run_options streamed = offloaded(UMT_PRECISION_BF16, budget, UMT_OFFLOAD_OPTIM_GPU);
    streamed.reserve = CNN_RESERVE;
    model m = {0};
    float reference[CONV_STEPS], losses[CONV_STEPS];
    build_cnn(&m, &memory);
    train(&m, &memory, cnn_loss, CONV_STEPS, reference);
    destroy(&m);
    build_cnn(&m, &streamed);
    train(&m, &streamed, cnn_loss, CONV_STEPS, losses);
    int conv_streamed = 0;
    for (int i = 0; i < umt_parameter_count(m.ctx); ++i) {
        const umt_tensor *p = umt_parameter_at(m.ctx, i);
        conv_streamed += p->ndim == 4 && p->offload.home != NULL;
    }
    print_message("%d of %d conv weights streamed\n", conv_streamed, CONV_LAYERS);
    assert_true(conv_streamed >= CONV_LAYERS / 2);
    expect_copies_home(&m);
    /* cuDNN may pick other algorithms under a smaller workspace: bf16's tolerance, a little wider. */
    expect_close(losses, reference, CONV_STEPS, 2e-2, "cnn bf16", true);
    destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_bf16_offloaded_matches_in_memory_with_gpu_updates, destroy_leftover),
        cmocka_unit_test_teardown(test_bf16_offloaded_matches_in_memory_with_cpu_updates, destroy_leftover),
        cmocka_unit_test_teardown(test_bf16_offloaded_matches_in_memory_with_updates_in_backward, destroy_leftover),
        cmocka_unit_test_teardown(test_bf16_updates_in_backward_on_cpu_threads_beside_the_ring, destroy_leftover),
        cmocka_unit_test_teardown(test_bf16_gradients_home_for_cpu_updates_cross_at_half_the_bytes, destroy_leftover),
        cmocka_unit_test_teardown(test_fp16_offloaded_with_loss_scaling_matches_in_memory, destroy_leftover),
        cmocka_unit_test_teardown(test_fp16_updates_in_backward_fall_back_to_after_backward, destroy_leftover),
        cmocka_unit_test_teardown(test_bf16_clipping_by_global_norm_offloaded_matches_in_memory, destroy_leftover),
        cmocka_unit_test_teardown(test_micro_batches_accumulate_offloaded_gradients_as_the_whole_batch,
                                  destroy_leftover),
        cmocka_unit_test_teardown(test_one_rank_data_parallelism_through_the_offload_tier_leaves_the_losses,
                                  destroy_leftover),
        cmocka_unit_test_teardown(test_a_step_graph_runs_an_offloaded_bf16_model_eagerly_and_says_why,
                                  destroy_leftover),
        cmocka_unit_test_teardown(test_wide_cnn_streams_its_conv_weights_in_bf16_at_a_quarter_of_its_need,
                                  destroy_leftover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
