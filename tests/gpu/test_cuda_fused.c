/*
 * tests/gpu/test_cuda_fused.c — every fused op against the unfused ops it replaces, on the GPU.
 *
 * Each case builds the same function twice in one context, fused and unfused, on fresh random
 * inputs (the seed comes from the clock and is printed), forms L = mean(out * R) for a fixed
 * random R, runs backward, and compares the outputs and every input's gradient: relative 1e-5
 * under fp32, 1e-2 under bf16 (outputs element by element, with a floor of 1e-3 of the largest
 * magnitude; gradients, sums over the batch, relative to their largest magnitude). Under fp32 the fused outputs and ReLU masks are the unfused ones bit for
 * bit; only the bias sums are split differently. The fused ops: umt_conv2d_relu (NCHW fp32,
 * NHWC bf16, channel counts that take the vector and the scalar kernels, and one input channel,
 * which under bf16 the backend runs as one kernel each way), umt_linear_relu,
 * umt_linear_relu_dropout and umt_flatten_linear_relu_dropout (bit for bit),
 * umt_bias_relu_max_pool2d_dropout (a convolution's bias and ReLU moved into the pool),
 * umt_max_pool2d_dropout, umt_softmax_cross_entropy for log-softmax + NLL, and one training step
 * of the whole MNIST CNN with fuse on and off.
 * Needs a GPU (tag "gpu"):  bazel test --config=cuda //tests/gpu:test_cuda_fused
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

#include <cmocka.h>

#include "core/context.h"
#include "core/ops/ops.h"
#include "examples/mnist_cnn_model.h"
#include "umtrain.h"

#define EXPECT_OK(call)                                                                                            \
    do {                                                                                                           \
        if ((call) != UMT_OK) fail_msg("%s failed: %s", #call, umt_last_error());                                  \
    } while (0)

enum { MAX_INPUTS = 5 };

static uint32_t rng_state;

static float uniform(float lo, float hi) { /* xorshift32 */
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 17, rng_state ^= rng_state << 5;
    return lo + (hi - lo) * (float)(rng_state >> 8) / (float)(1u << 24);
}

static int seed_from_clock(void **state) {
    (void)state;
    rng_state = (uint32_t)time(NULL) | 1u;
    printf("test_cuda_fused: random seed %u\n", rng_state);
    return 0;
}

/* The context of the running test, destroyed by the teardown also when the test fails (the
 * CUDA backend starts once per process: a context left behind would fail every later test). */
static umt_context *current;

static int destroy_current(void **state) {
    (void)state;
    umt_context_destroy(current);
    current = NULL;
    return 0;
}

static umt_context *gpu_context(umt_precision precision) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.precision = precision;
    umt_context *ctx = NULL;
    destroy_current(NULL);
    EXPECT_OK(umt_context_create(&co, &ctx));
    return current = ctx;
}

static float *host_copy(const umt_tensor *t) {
    size_t bytes = (size_t)umt_tensor_numel(t) * sizeof(float);
    float *v = malloc(bytes);
    EXPECT_OK(umt_tensor_copy_to_host(t, v, bytes));
    return v;
}

static void fill(umt_tensor *t, float lo, float hi) {
    int64_t n = umt_tensor_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = uniform(lo, hi);
    EXPECT_OK(umt_tensor_copy_from_host(t, v, (size_t)n * sizeof *v));
    free(v);
}

/* got within tolerance of want, element by element: relative, with a floor of tolerance times
 * `floor` of want's largest magnitude. */
static void expect_close_floor(const char *what, const float *got, const float *want, int64_t n, double tolerance,
                               double floor) {
    double largest = 0;
    for (int64_t i = 0; i < n; i++) largest = fmax(largest, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double bound = tolerance * (fabs(want[i]) + floor * largest);
        if (!(fabs(got[i] - want[i]) <= bound))
            fail_msg("%s: element %lld: fused %.9g, unfused %.9g (bound %.3g, largest %.3g)", what, (long long)i,
                     got[i], want[i], bound, largest);
    }
}

/* An output: each element on its own, the floor 1e-3 of the largest. */
static void expect_close(const char *what, const float *got, const float *want, int64_t n, double tolerance) {
    expect_close_floor(what, got, want, n, tolerance, 1e-3);
}

/* A gradient: within tolerance of the tensor's largest magnitude. A weight or bias gradient is
 * a sum over the batch whose terms cancel, and the fused and unfused sums (or the two losses'
 * backwards) round in a different order: seen under fp32, differences of 2e-5 of elements
 * 1/40 to 1/800 of the largest, a few 1e-8 of the largest. */
static void expect_close_gradient(const char *what, const float *got, const float *want, int64_t n, double tolerance) {
    expect_close_floor(what, got, want, n, tolerance, 1.0);
}

/* ----------------------------------------------------------------------------------------- */
/* One case: out = build(inputs, fused) from parameters filled at random */

typedef umt_tensor *(*build_fn)(umt_context *ctx, umt_tensor **in, umt_tensor *labels, bool fused);

typedef struct {
    float *out, *grads[MAX_INPUTS];
} result;

/* Each pass starts from the same RNG state: fused and unfused dropout draw the same masks. */
static void run(umt_context *ctx, build_fn build, umt_tensor **in, int count, umt_tensor *labels, umt_tensor *r,
                umt_rng rng, bool fused, result *res) {
    ctx->rng = rng;
    EXPECT_OK(umt_step_begin(ctx));
    EXPECT_OK(umt_zero_grad(ctx));
    umt_tensor *out = umt_to_f32(ctx, build(ctx, in, labels, fused));
    if (!out) fail_msg("build (fused %d): %s", fused, umt_last_error());
    umt_tensor *loss = umt_tensor_numel(out) == 1 ? out : umt_mean(ctx, umt_mul(ctx, out, r));
    if (!loss) fail_msg("loss: %s", umt_last_error());
    EXPECT_OK(umt_backward(ctx, loss));
    res->out = host_copy(out);
    for (int i = 0; i < count; i++) res->grads[i] = host_copy(umt_tensor_grad(in[i]));
}

/* Bit for bit where exact, else within the precision's tolerance. */
static void expect_same(const char *what, const float *got, const float *want, int64_t n, double tolerance, bool exact,
                        bool gradient) {
    if (!exact) {
        if (gradient) expect_close_gradient(what, got, want, n, tolerance);
        else expect_close(what, got, want, n, tolerance);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
            fail_msg("%s: element %lld: fused %.9g, unfused %.9g (expected the same bits)", what, (long long)i, got[i],
                     want[i]);
}

static void compare_with(umt_precision precision, build_fn build, int count, const int64_t shapes[][4],
                         const int *ndims, int64_t classes, const char *name, bool exact) {
    umt_context *ctx = gpu_context(precision);
    umt_tensor *in[MAX_INPUTS] = {0};
    for (int i = 0; i < count; i++) {
        in[i] = umt_parameter_new(ctx, "in", ndims[i], shapes[i]);
        if (!in[i]) fail_msg("%s: input %d: %s", name, i, umt_last_error());
        fill(in[i], -1.0f, 1.0f);
    }
    umt_tensor *labels = NULL;
    if (classes) {
        int64_t rows = shapes[0][0];
        labels = umt_tensor_new(ctx, UMT_POOL_DATASET, UMT_I32, 1, (int64_t[]){rows});
        int32_t *l = malloc((size_t)rows * sizeof *l);
        for (int64_t i = 0; i < rows; i++) l[i] = (int32_t)(uniform(0.0f, (float)classes)) % (int32_t)classes;
        EXPECT_OK(umt_tensor_copy_from_host(labels, l, (size_t)rows * sizeof *l));
        free(l);
    }
    /* R has the output's shape: found from one unfused forward without grad. */
    bool was = umt_set_grad_enabled(ctx, false);
    EXPECT_OK(umt_step_begin(ctx));
    umt_tensor *probe = umt_to_f32(ctx, build(ctx, in, labels, false));
    if (!probe) fail_msg("%s: %s", name, umt_last_error());
    int64_t shape[4] = {1, 1, 1, 1};
    for (int d = 0; d < umt_tensor_ndim(probe); d++) shape[d] = umt_tensor_dim(probe, d);
    umt_tensor *r = umt_tensor_new(ctx, UMT_POOL_DATASET, UMT_F32, umt_tensor_ndim(probe), shape);
    if (!r) fail_msg("%s: R: %s", name, umt_last_error());
    fill(r, -1.0f, 1.0f);
    umt_set_grad_enabled(ctx, was);

    result fused, plain;
    umt_rng rng = ctx->rng;
    run(ctx, build, in, count, labels, r, rng, true, &fused);
    run(ctx, build, in, count, labels, r, rng, false, &plain);
    double tolerance = precision == UMT_PRECISION_FP32 ? 1e-5 : 1e-2;
    char what[160];
    snprintf(what, sizeof what, "%s %s output", name, umt_precision_name(precision));
    expect_same(what, fused.out, plain.out, umt_tensor_numel(r), tolerance, exact, false);
    for (int i = 0; i < count; i++) {
        snprintf(what, sizeof what, "%s %s gradient of input %d", name, umt_precision_name(precision), i);
        expect_same(what, fused.grads[i], plain.grads[i], umt_tensor_numel(in[i]), tolerance, exact, true);
        free(fused.grads[i]);
        free(plain.grads[i]);
    }
    free(fused.out);
    free(plain.out);
    destroy_current(NULL);
}

static void compare(umt_precision precision, build_fn build, int count, const int64_t shapes[][4],
                    const int *ndims, int64_t classes, const char *name) {
    compare_with(precision, build, count, shapes, ndims, classes, name, false);
}

/* ----------------------------------------------------------------------------------------- */
/* The fused ops and their unfused twins */

static umt_tensor *conv_relu_pad0(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    return fused ? umt_conv2d_relu(c, in[0], in[1], in[2], 1, 0) : umt_relu(c, umt_conv2d(c, in[0], in[1], in[2], 1, 0));
}

static umt_tensor *conv_relu_strided(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    return fused ? umt_conv2d_relu(c, in[0], in[1], in[2], 2, 1) : umt_relu(c, umt_conv2d(c, in[0], in[1], in[2], 2, 1));
}

static umt_tensor *linear_relu(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    return fused ? umt_linear_relu(c, in[0], in[1], in[2]) : umt_relu(c, umt_linear(c, in[0], in[1], in[2]));
}

static umt_tensor *linear_relu_dropout(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    return fused ? umt_linear_relu_dropout(c, in[0], in[1], in[2], 0.5f)
                 : umt_dropout(c, umt_linear_relu(c, in[0], in[1], in[2]), 0.5f);
}

/* From a convolution's output (NHWC under bf16), so that a batch of 8 rows per output reads it as
 * it lies (core/ops/flatten_linear.c) in both passes. */
static umt_tensor *flatten_linear_relu_dropout(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    umt_tensor *x = umt_conv2d(c, in[0], in[1], NULL, 1, 0);
    return fused ? umt_flatten_linear_relu_dropout(c, x, in[2], NULL, 0.25f)
                 : umt_dropout(c, umt_flatten_linear_relu(c, x, in[2], NULL), 0.25f);
}

static umt_tensor *log_softmax_nll(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    return fused ? umt_softmax_cross_entropy(c, in[0], l) : umt_nll_loss(c, umt_log_softmax(c, in[0]), l);
}

/* The pool's input from a convolution, so that under bf16 it is NHWC (the CNN's case). */
static umt_tensor *pool_dropout(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    umt_tensor *x = umt_conv2d(c, in[0], in[1], in[2], 1, 0);
    return fused ? umt_max_pool2d_dropout(c, x, 2, 2, 0.25f) : umt_dropout(c, umt_max_pool2d(c, x, 2, 2), 0.25f);
}

/* A convolution's bias and ReLU moved into the pool: fused, the product without its bias. */
static umt_tensor *bias_relu_pool_dropout(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    (void)l;
    if (fused) return umt_bias_relu_max_pool2d_dropout(c, umt_conv2d(c, in[0], in[1], NULL, 1, 0), in[2], 2, 2, 0.25f);
    return umt_dropout(c, umt_max_pool2d(c, umt_conv2d_relu(c, in[0], in[1], in[2], 1, 0), 2, 2), 0.25f);
}

/* A linear layer's half output (the head's input under bf16/fp16), then the head: fused, one op
 * (umt_linear_softmax_cross_entropy); else fc2's linear op and the loss. */
static umt_tensor *linear_head(umt_context *c, umt_tensor **in, umt_tensor *l, bool fused) {
    umt_tensor *h = umt_linear(c, in[0], in[1], in[2]);
    return fused ? umt_linear_softmax_cross_entropy(c, h, in[3], in[4], l)
                 : umt_softmax_cross_entropy(c, umt_linear(c, h, in[3], in[4]), l);
}

static const umt_precision PRECISIONS[2] = {UMT_PRECISION_FP32, UMT_PRECISION_BF16};

static void test_conv2d_relu_matches_relu_of_conv2d(void **state) {
    (void)state;
    /* 64 channels: the vector kernels under bf16 (the MNIST CNN's conv2); 12 channels, stride 2,
     * padding 1: the scalar ones; one input channel: under bf16 the backend's own fused kernels
     * (kernels/cuda/conv_thin.cu, the MNIST CNN's conv1), here with the input's gradient too;
     * and at batch 500, where each block of the weight gradient streams several tiles. */
    const int ndims[3] = {4, 4, 1};
    const int64_t wide[3][4] = {{8, 32, 14, 14}, {64, 32, 3, 3}, {64}};
    const int64_t odd[3][4] = {{3, 5, 9, 7}, {12, 5, 3, 3}, {12}};
    const int64_t thin[3][4] = {{8, 1, 12, 12}, {32, 1, 3, 3}, {32}};
    const int64_t thin_batch[3][4] = {{500, 1, 28, 28}, {32, 1, 3, 3}, {32}};
    for (int p = 0; p < 2; p++) {
        compare(PRECISIONS[p], conv_relu_pad0, 3, wide, ndims, 0, "conv2d_relu 64 channels");
        compare(PRECISIONS[p], conv_relu_strided, 3, odd, ndims, 0, "conv2d_relu 12 channels strided");
        compare(PRECISIONS[p], conv_relu_pad0, 3, thin, ndims, 0, "conv2d_relu 1 channel");
        compare(PRECISIONS[p], conv_relu_strided, 3, thin, ndims, 0, "conv2d_relu 1 channel strided");
        compare(PRECISIONS[p], conv_relu_pad0, 3, thin_batch, ndims, 0, "conv2d_relu 1 channel, batch 500");
    }
}

static void test_linear_relu_matches_relu_of_linear(void **state) {
    (void)state;
    /* 128 outputs: the vector kernels under bf16 (fc1); 24 outputs: 3 lanes, the scalar ones. */
    const int ndims[3] = {2, 2, 1};
    const int64_t wide[3][4] = {{300, 200}, {128, 200}, {128}};
    const int64_t odd[3][4] = {{33, 20}, {24, 20}, {24}};
    for (int p = 0; p < 2; p++) {
        compare(PRECISIONS[p], linear_relu, 3, wide, ndims, 0, "linear_relu 128 outputs");
        compare(PRECISIONS[p], linear_relu, 3, odd, ndims, 0, "linear_relu 24 outputs");
    }
}

/* The dropout drawn in the bias and ReLU's pass: the same elements kept and the same values as
 * umt_dropout after the op, and in backward the same gradients, bit for bit in both precisions
 * (the same products of the same masked gradient, whose bias sums add the same values in the
 * same order). 128 outputs: the eight-lane kernels (fc1); 24: eight lanes forward, the scalar
 * masks backward; 20: the two kernels in turn forward; and the flatten read as it lies. */
static void test_linear_relu_dropout_is_dropout_of_linear_relu_bit_for_bit(void **state) {
    (void)state;
    const int ndims[3] = {2, 2, 1};
    const int64_t wide[3][4] = {{300, 200}, {128, 200}, {128}};
    const int64_t odd[3][4] = {{33, 20}, {24, 20}, {24}};
    const int64_t unaligned[3][4] = {{17, 12}, {20, 12}, {20}};
    const int flat_ndims[3] = {4, 4, 2};
    const int64_t flat[3][4] = {{64, 3, 9, 9}, {16, 3, 3, 3}, {8, 16 * 7 * 7}};
    for (int p = 0; p < 2; p++) {
        compare_with(PRECISIONS[p], linear_relu_dropout, 3, wide, ndims, 0, "linear_relu_dropout 128 outputs", true);
        compare_with(PRECISIONS[p], linear_relu_dropout, 3, odd, ndims, 0, "linear_relu_dropout 24 outputs", true);
        compare_with(PRECISIONS[p], linear_relu_dropout, 3, unaligned, ndims, 0, "linear_relu_dropout 20 outputs",
                     true);
        compare_with(PRECISIONS[p], flatten_linear_relu_dropout, 3, flat, flat_ndims, 0,
                     "flatten_linear_relu_dropout", true);
    }
}

/* ----------------------------------------------------------------------------------------- */
/* flatten then linear as one op (core/ops/flatten_linear.c): under bf16 the convolution's NHWC
 * output is read as it lies, through a compute copy of the weight in H,W,C column order. Two
 * weights with the same values, one through umt_flatten_linear_relu, one through umt_flatten and
 * umt_linear_relu: the outputs and every gradient agree; after an SGD step on both (the fused
 * update rewrites each copy in its own layout) the next pass agrees again; the H,W,C weight is
 * refused by umt_linear, by name; and a weight first used at a batch of fewer rows than 8 per
 * output keeps a plain copy (the rule in core/ops/flatten_linear.c). */

/* 64 rows for 8 outputs: the batch from which a weight's copy is made H,W,C. */
enum { FLAT_BATCH = 64, FLAT_OUT = 8, FLAT_IN = 16 * 7 * 7 };

typedef struct {
    umt_tensor *image, *conv, *weight, *bias;
} flatten_case;

/* One pass of k through the one op or the three, its backward adding to k's own gradients. */
static float *flatten_pass(umt_context *ctx, const flatten_case *k, umt_tensor *r, bool one_op) {
    umt_tensor *x = umt_conv2d(ctx, k->image, k->conv, NULL, 1, 0); /* [8,16,7,7], NHWC under bf16 */
    umt_tensor *y = one_op ? umt_flatten_linear_relu(ctx, x, k->weight, k->bias)
                           : umt_linear_relu(ctx, umt_flatten(ctx, x), k->weight, k->bias);
    umt_tensor *out = umt_to_f32(ctx, y);
    umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, out, r));
    if (!loss) fail_msg("flatten_linear (one op %d): %s", one_op, umt_last_error());
    EXPECT_OK(umt_backward(ctx, loss));
    return host_copy(out);
}

/* Two sets of the same random values: each pass has parameters (and gradients) of its own. */
static void make_twins(umt_context *ctx, flatten_case k[2]) {
    const int64_t shapes[4][4] = {{FLAT_BATCH, 3, 9, 9}, {16, 3, 3, 3}, {FLAT_OUT, FLAT_IN}, {FLAT_OUT}};
    const int ndims[4] = {4, 4, 2, 1};
    const float bounds[4] = {1.0f, 0.5f, 0.05f, 0.1f};
    for (int t = 0; t < 4; t++) {
        umt_tensor *pair[2];
        for (int i = 0; i < 2; i++) {
            char name[32];
            snprintf(name, sizeof name, "%s%d", t == 2 ? (i ? "fc_plain" : "fc_hwc") : "t", t);
            if (!(pair[i] = umt_parameter_new(ctx, name, ndims[t], shapes[t]))) fail_msg("%s: %s", name, umt_last_error());
        }
        fill(pair[0], -bounds[t], bounds[t]);
        float *values = host_copy(pair[0]);
        EXPECT_OK(umt_tensor_copy_from_host(pair[1], values, (size_t)umt_tensor_numel(pair[0]) * sizeof(float)));
        free(values);
        for (int i = 0; i < 2; i++) {
            umt_tensor **slot = t == 0 ? &k[i].image : t == 1 ? &k[i].conv : t == 2 ? &k[i].weight : &k[i].bias;
            *slot = pair[i];
        }
    }
}

static void test_flatten_linear_matches_linear_of_flatten(void **state) {
    (void)state;
    for (int p = 0; p < 2; p++) {
        umt_context *ctx = gpu_context(PRECISIONS[p]);
        const char *precision = umt_precision_name(PRECISIONS[p]);
        double tolerance = PRECISIONS[p] == UMT_PRECISION_FP32 ? 1e-5 : 1e-2;
        umt_tensor *r = umt_tensor_new(ctx, UMT_POOL_DATASET, UMT_F32, 2, (int64_t[]){FLAT_BATCH, FLAT_OUT});
        if (!r) fail_msg("R: %s", umt_last_error());
        fill(r, -1.0f, 1.0f);
        flatten_case k[2];
        make_twins(ctx, k);
        umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
        oo.lr = 0.5f;
        umt_optimizer *opt = NULL;
        EXPECT_OK(umt_optimizer_create(ctx, &oo, &opt));
        const char *names[4] = {"image", "conv weight", "fc weight", "fc bias"};
        for (int round = 0; round < 2; round++) {
            float *out[2], *grads[2][4];
            EXPECT_OK(umt_step_begin(ctx));
            EXPECT_OK(umt_zero_grad(ctx));
            for (int i = 0; i < 2; i++) {
                out[i] = flatten_pass(ctx, &k[i], r, i == 0);
                const umt_tensor *of[4] = {k[i].image, k[i].conv, k[i].weight, k[i].bias};
                for (int g = 0; g < 4; g++) grads[i][g] = host_copy(umt_tensor_grad(of[g]));
            }
            char what[160];
            snprintf(what, sizeof what, "flatten_linear %s round %d output", precision, round);
            expect_close(what, out[0], out[1], FLAT_BATCH * FLAT_OUT, tolerance);
            const umt_tensor *of[4] = {k[0].image, k[0].conv, k[0].weight, k[0].bias};
            for (int g = 0; g < 4; g++) {
                snprintf(what, sizeof what, "flatten_linear %s round %d gradient of the %s", precision, round, names[g]);
                expect_close_gradient(what, grads[0][g], grads[1][g], umt_tensor_numel(of[g]), tolerance);
            }
            for (int i = 0; i < 2; i++) {
                free(out[i]);
                for (int g = 0; g < 4; g++) free(grads[i][g]);
            }
            /* Both sets take the same step from (nearly) the same gradients. */
            EXPECT_OK(umt_optimizer_step(opt));
        }
        if (PRECISIONS[p] != UMT_PRECISION_BF16) continue;
        assert_true(k[0].weight->lowp && k[0].weight->lowp->ndim == 4 && k[0].weight->lowp->nhwc);
        assert_true(k[1].weight->lowp && k[1].weight->lowp->ndim == 2);
        EXPECT_OK(umt_step_begin(ctx));
        umt_tensor *x = umt_conv2d(ctx, k[0].image, k[0].conv, NULL, 1, 0);
        assert_null(umt_linear(ctx, umt_flatten(ctx, x), k[0].weight, k[0].bias));
        if (!strstr(umt_last_error(), "fc_hwc") || !strstr(umt_last_error(), "umt_flatten_linear"))
            fail_msg("the refusal names neither the weight nor the op: %s", umt_last_error());
        umt_tensor *narrow = umt_parameter_new(ctx, "fc_narrow", 2, (int64_t[]){FLAT_BATCH / 8 + 1, FLAT_IN});
        if (!narrow) fail_msg("fc_narrow: %s", umt_last_error());
        assert_non_null(umt_flatten_linear_relu(ctx, umt_conv2d(ctx, k[0].image, k[0].conv, NULL, 1, 0), narrow, NULL));
        assert_true(narrow->lowp && narrow->lowp->ndim == 2);
    }
}

static void test_max_pool2d_dropout_matches_dropout_of_max_pool2d(void **state) {
    (void)state;
    /* 64 channels (the CNN's pool, the eight-lane pool under bf16); 5 channels of odd size. */
    const int ndims[3] = {4, 4, 1};
    const int64_t wide[3][4] = {{6, 8, 14, 14}, {64, 8, 3, 3}, {64}};
    const int64_t odd[3][4] = {{3, 4, 10, 9}, {5, 4, 2, 2}, {5}};
    for (int p = 0; p < 2; p++) {
        compare(PRECISIONS[p], pool_dropout, 3, wide, ndims, 0, "max_pool2d_dropout 64 channels");
        compare(PRECISIONS[p], pool_dropout, 3, odd, ndims, 0, "max_pool2d_dropout 5 channels");
        compare(PRECISIONS[p], bias_relu_pool_dropout, 3, wide, ndims, 0, "bias_relu_max_pool2d_dropout 64 channels");
        compare(PRECISIONS[p], bias_relu_pool_dropout, 3, odd, ndims, 0, "bias_relu_max_pool2d_dropout 5 channels");
    }
}

static void test_softmax_cross_entropy_matches_nll_of_log_softmax(void **state) {
    (void)state;
    const int ndims[1] = {2};
    const int64_t shape[1][4] = {{257, 10}};
    for (int p = 0; p < 2; p++) compare(PRECISIONS[p], log_softmax_nll, 1, shape, ndims, 10, "softmax_cross_entropy");
}

/* The head against fc2 and the loss, at 6, 64, 257 and 1000 rows (a partial last block of every
 * kernel somewhere), 40, 128 and 96 features, 3, 10 and 7 classes; fp32 takes the two ops
 * themselves. The loss and every input's gradient within the precision's tolerance (the products
 * are summed in another order). */
static void test_linear_softmax_cross_entropy_matches_linear_then_loss(void **state) {
    (void)state;
    static const umt_precision precisions[3] = {UMT_PRECISION_FP32, UMT_PRECISION_BF16, UMT_PRECISION_FP16};
    const int ndims[5] = {2, 2, 1, 2, 1};
    const int64_t cases[4][3] = {{6, 40, 3}, {64, 128, 10}, {257, 96, 10}, {1000, 128, 7}};
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 4; k++) {
            int64_t rows = cases[k][0], hidden = cases[k][1], classes = cases[k][2];
            const int64_t shapes[5][4] = {{rows, 40}, {hidden, 40}, {hidden}, {classes, hidden}, {classes}};
            compare(precisions[p], linear_head, 5, shapes, ndims, classes, "linear_softmax_cross_entropy");
        }
}

/* ----------------------------------------------------------------------------------------- */
/* The whole MNIST CNN, one training step (dropout on, both passes from the same RNG state, so
 * with the same masks), fused and not: the loss, and every parameter's gradient. */

static void test_mnist_cnn_fused_step_matches_the_unfused_step(void **state) {
    (void)state;
    for (int p = 0; p < 2; p++) {
        umt_context *ctx = gpu_context(PRECISIONS[p]);
        mnist_cnn model;
        if (mnist_cnn_build(ctx, &model)) fail_msg("mnist_cnn_build: %s", umt_last_error());
        umt_tensor *images = umt_tensor_new_4d(ctx, UMT_POOL_DATASET, UMT_F32, 64, 1, 28, 28);
        umt_tensor *labels = umt_tensor_new(ctx, UMT_POOL_DATASET, UMT_I32, 1, (int64_t[]){64});
        if (!images || !labels) fail_msg("batch: %s", umt_last_error());
        fill(images, -0.5f, 2.5f);
        int32_t l[64];
        for (int i = 0; i < 64; i++) l[i] = (int32_t)uniform(0.0f, 10.0f) % 10;
        EXPECT_OK(umt_tensor_copy_from_host(labels, l, sizeof l));
        int count = umt_parameter_count(ctx);
        float loss[2], *grads[2][8];
        assert_true(count <= 8);
        umt_rng rng = ctx->rng;
        for (int fused = 0; fused < 2; fused++) {
            model.fuse = fused;
            ctx->rng = rng;
            EXPECT_OK(umt_step_begin(ctx));
            EXPECT_OK(umt_zero_grad(ctx));
            umt_tensor *t = mnist_cnn_loss(ctx, &model, images, labels);
            if (!t) fail_msg("mnist_cnn_loss (fuse %d): %s", fused, umt_last_error());
            EXPECT_OK(umt_backward(ctx, t));
            EXPECT_OK(umt_tensor_get_f32(t, 0, &loss[fused]));
            for (int i = 0; i < count; i++) grads[fused][i] = host_copy(umt_tensor_grad(umt_parameter_at(ctx, i)));
        }
        double tolerance = PRECISIONS[p] == UMT_PRECISION_FP32 ? 1e-5 : 1e-2;
        printf("mnist_cnn %s: loss fused %.7f, unfused %.7f\n", umt_precision_name(PRECISIONS[p]), loss[1], loss[0]);
        expect_close("mnist_cnn loss", &loss[1], &loss[0], 1, tolerance);
        for (int i = 0; i < count; i++) {
            char what[160];
            snprintf(what, sizeof what, "mnist_cnn %s gradient of %s", umt_precision_name(PRECISIONS[p]),
                     umt_tensor_name(umt_parameter_at(ctx, i)));
            expect_close_gradient(what, grads[1][i], grads[0][i], umt_tensor_numel(umt_parameter_at(ctx, i)), tolerance);
            free(grads[0][i]);
            free(grads[1][i]);
        }
        destroy_current(NULL);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_conv2d_relu_matches_relu_of_conv2d, destroy_current),
        cmocka_unit_test_teardown(test_linear_relu_matches_relu_of_linear, destroy_current),
        cmocka_unit_test_teardown(test_linear_relu_dropout_is_dropout_of_linear_relu_bit_for_bit, destroy_current),
        cmocka_unit_test_teardown(test_flatten_linear_matches_linear_of_flatten, destroy_current),
        cmocka_unit_test_teardown(test_max_pool2d_dropout_matches_dropout_of_max_pool2d, destroy_current),
        cmocka_unit_test_teardown(test_softmax_cross_entropy_matches_nll_of_log_softmax, destroy_current),
        cmocka_unit_test_teardown(test_linear_softmax_cross_entropy_matches_linear_then_loss, destroy_current),
        cmocka_unit_test_teardown(test_mnist_cnn_fused_step_matches_the_unfused_step, destroy_current),
    };
    return cmocka_run_group_tests(tests, seed_from_clock, NULL);
}
