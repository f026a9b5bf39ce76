/*
 * tests/gpu/test_cuda_cnn_kernels.c — the CNN slots of the CUDA backend (convolution, channel
 * bias, pooling, dropout, batch norm) against the CPU reference (kernels/cpu/), on fresh random
 * inputs run through both tables, as tests/gpu/test_cuda_kernels.c does for the other slots.
 *
 * Outputs start poisoned (0xFF bytes: NaN for floats, -1 for integers) on both sides, so an
 * element a kernel forgets to write fails; outputs of accumulating kernels start from random
 * values. Pooling, dropout and the bias addition must match bit for bit (argmax and mask too);
 * convolution within 1e-4 of the sum of |terms| (+ 1e-6), the bias sum within 1e-5 of it, and
 * batch norm (running statistics and backward included) within 1e-4 of each value's scale.
 *
 * The seed is printed once; UMT_TEST_SEED=<seed> repeats a run. Needs a GPU (tag "gpu"):
 *     bazel test --config=cuda //tests/gpu:test_cuda_cnn_kernels
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

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/gpu/kernel_twins.h"
#include "umtrain.h"

/* The case under test (shape, parameters), named by every failure message. */
static char context[160];
#define CONTEXT(...) snprintf(context, sizeof context, __VA_ARGS__)

/* CUDA result against CPU result: |gpu - cpu| <= relative * scale[i] + floor, scale[i] = |cpu|
 * when scale is NULL. A NaN on either side fails: these inputs are finite. */
static void expect_within(const char *what, twin t, const float *scale, double relative, double floor) {
    const float *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes / sizeof(float); i++) {
        double bound = relative * (scale ? scale[i] : fabsf(want[i])) + floor;
        if (isnan(got[i]) || isnan(want[i]) || !(fabs((double)got[i] - want[i]) <= bound)) {
            fail_msg("%s: %s[%zu]: cuda %.9g, cpu %.9g (bound %.3g, seed %u)", context, what, i, got[i], want[i],
                     bound, run_seed);
        }
    }
}

static void expect_same_bytes(const char *what, twin t) {
    const uint8_t *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes; i++) {
        if (got[i] != want[i]) {
            fail_msg("%s: %s byte %zu: cuda %02x, cpu %02x (seed %u)", context, what, i, got[i], want[i], run_seed);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Convolution                                                                                 */

/* The two backends' workspaces differ in size: WORKSPACE(w) passes the side's buffer and bytes. */
typedef struct {
    void *host, *device;
    size_t host_bytes, device_bytes;
} workspaces;
#define WORKSPACE(w) (on_device ? (w).device : (w).host), (on_device ? (w).device_bytes : (w).host_bytes)

static workspaces workspaces_for(const umt_conv_shape *s) {
    workspaces w;
    EXPECT_OK(cpu->f32.conv2d_workspace_bytes(s, &w.host_bytes));
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(s, &w.device_bytes));
    w.host = host_alloc(w.host_bytes);
    w.device = device_alloc(w.device_bytes);
    return w;
}

/* d: n, c, h, w, k, r, s, stride, pad. */
static umt_conv_shape conv_shape(const int64_t *d) {
    umt_conv_shape s = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], 0, 0, d[7], d[8], UMT_F32, false};
    s.p = (s.h + 2 * s.pad - s.r) / s.stride + 1;
    s.q = (s.w + 2 * s.pad - s.s) / s.stride + 1;
    return s;
}

/* Forward and both backwards of one shape on the given x and w, within relative (1e-4 for the
 * filter gradient) of the scale: the CPU's own kernel run on |inputs| (sum |a*b| = sum |a|*|b|),
 * added onto |initial value| for the accumulating backwards. */
static void check_conv(const int64_t *shape, twin x, twin w, double relative) {
    umt_conv_shape shape_value = conv_shape(shape);
    const umt_conv_shape *s = &shape_value;
    CONTEXT("conv x %lldx%lldx%lldx%lld, w %lldx%lldx%lld, stride %lld, pad %lld", (long long)s->n, (long long)s->c,
            (long long)s->h, (long long)s->w, (long long)s->k, (long long)s->r, (long long)s->s, (long long)s->stride,
            (long long)s->pad);
    int64_t x_numel = s->n * s->c * s->h * s->w, w_numel = s->k * s->c * s->r * s->s;
    int64_t y_numel = s->n * s->k * s->p * s->q;
    workspaces ws = workspaces_for(s);
    twin y = twin_poisoned((size_t)y_numel * sizeof(float)), dy = twin_random(y_numel, -1, 1);
    twin dx = twin_random(x_numel, -1, 1), dw = twin_random(w_numel, -1, 1);
    const float *abs_x = absolute(F(x), x_numel), *abs_w = absolute(F(w), w_numel), *abs_dy = absolute(F(dy), y_numel);
    float *y_scale = host_alloc(y.bytes), *dx_scale = absolute(F(dx), x_numel), *dw_scale = absolute(F(dw), w_numel);
    EXPECT_OK(cpu->f32.conv2d_forward(s, abs_x, abs_w, y_scale, ws.host, ws.host_bytes));
    EXPECT_OK(cpu->f32.conv2d_backward_data(s, abs_w, abs_dy, dx_scale, ws.host, ws.host_bytes));
    EXPECT_OK(cpu->f32.conv2d_backward_filter(s, abs_x, abs_dy, dw_scale, ws.host, ws.host_bytes));

    BOTH(conv2d_forward(s, P(x), P(w), P(y), WORKSPACE(ws)));
    expect_within("conv2d_forward", y, y_scale, relative, 1e-6);
    BOTH(conv2d_backward_data(s, P(w), P(dy), P(dx), WORKSPACE(ws)));
    expect_within("conv2d_backward_data", dx, dx_scale, relative, 1e-6);
    BOTH(conv2d_backward_filter(s, P(x), P(dy), P(dw), WORKSPACE(ws)));
    expect_within("conv2d_backward_filter", dw, dw_scale, 1e-4, 1e-6);
}

/* n, c, h, w, k, r, s, stride, pad: the MNIST CNN's two convolutions, then odd shapes. Those
 * with c*r*s <= 9 take conv_thin.cu's f32 weight gradient: the first layer at batch 64 and 600
 * (many positions a block), k = 3, 1 and 6 (channel runs of 4 cut short), padded and strided
 * windows, 2x2 filters over two channels. */
static const int64_t conv_shapes[][9] = {
    {64, 1, 28, 28, 32, 3, 3, 1, 0}, {64, 32, 26, 26, 64, 3, 3, 1, 0}, {5, 3, 11, 9, 7, 3, 3, 2, 1},
    {3, 4, 8, 7, 5, 5, 3, 2, 1},     {2, 6, 13, 10, 3, 1, 1, 2, 0},    {4, 2, 3, 3, 2, 3, 3, 1, 1},
    {1, 1, 1, 1, 1, 1, 1, 1, 0},     {600, 1, 28, 28, 32, 3, 3, 1, 0}, {7, 1, 12, 12, 8, 3, 3, 2, 1},
    {5, 2, 9, 9, 6, 2, 2, 1, 1},
};

static void test_conv2d_and_its_backwards_match_the_cpu_within_1e_4_of_the_sum_of_terms(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof conv_shapes / sizeof conv_shapes[0]; i++) {
        umt_conv_shape s = conv_shape(conv_shapes[i]);
        check_conv(conv_shapes[i], twin_random(s.n * s.c * s.h * s.w, -1, 1), twin_random(s.k * s.c * s.r * s.s, -1, 1),
                   1e-4);
    }
}

/* Each filter has one tap of 1 and the rest 0, and x has full 24-bit mantissas, so each output
 * is one input value: TF32 (10-bit mantissas) would be up to 5e-4 off, fp32 within rounding
 * (3e-5 leaves room for the transforms of Winograd or FFT algorithms). */
static const int64_t mnist_conv2[9] = {64, 32, 26, 26, 64, 3, 3, 1, 0};

static void test_conv2d_computes_in_fp32_not_tf32(void **state) {
    (void)state;
    umt_conv_shape s = conv_shape(mnist_conv2);
    int64_t w_numel = s.k * s.c * s.r * s.s;
    float *filters = host_alloc((size_t)w_numel * sizeof *filters);
    memset(filters, 0, (size_t)w_numel * sizeof *filters);
    for (int64_t k = 0; k < s.k; k++) filters[k * s.c * 9 + random_u32() % (uint32_t)(s.c * 9)] = 1.0f;
    check_conv(mnist_conv2, twin_random(s.n * s.c * s.h * s.w, 1, 2), twin_of(filters, (size_t)w_numel * 4), 3e-5);
}

/* More shapes than the plan cache holds: plans given up and remade still compute right, and a
 * shape's workspace size stays the same; a smaller (or missing) workspace is refused. */
static void test_conv2d_plans_survive_more_shapes_than_the_cache_holds(void **state) {
    (void)state;
    umt_conv_shape first = conv_shape(mnist_conv2);
    size_t before = 0, after = 0;
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(&first, &before));
    if (before > 0) { /* cuDNN may choose algorithms that need none: then nothing is too small */
        float *b = device_alloc(before);
        assert_int_equal(gpu->f32.conv2d_forward(&first, b, b, b, b, before - 1), UMT_ERR_INVALID_ARGUMENT);
        assert_int_equal(gpu->f32.conv2d_backward_filter(&first, b, b, b, NULL, before), UMT_ERR_INVALID_ARGUMENT);
    }
    for (int64_t n = 1; n <= 40; n++) {
        check_conv((const int64_t[9]){n, 2, 6, 5, 3, 3, 3, 1, 1}, twin_random(n * 60, -1, 1), twin_random(54, -1, 1),
                   1e-4);
    }
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(&first, &after));
    assert_int_equal(after, before);
    check_conv(mnist_conv2, twin_random(64 * 32 * 26 * 26, -1, 1), twin_random(64 * 32 * 9, -1, 1), 1e-4);
}

/* The workspace limit is the context's (an eighth of its budget, memory/budget.h; the default
 * 256 MiB on a bare state). MNIST's second convolution at batch 512 under 1 GiB reaches algorithms
 * of cuDNN's ranking that 256 MiB leaves out (FFT ones, on an H100 with cuDNN 9): each plan keeps
 * within the limit it was made with, and still computes in fp32 (the one-tap filters above). */
static void test_conv2d_keeps_within_its_workspace_limit_and_computes_in_fp32_under_a_larger_one(void **state) {
    (void)state;
    static const int64_t conv2_512[9] = {512, 32, 26, 26, 64, 3, 3, 1, 0};
    umt_conv_shape s = conv_shape(conv2_512);
    size_t small = 0, large = 0, limit = (size_t)1 << 30;
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(&s, &small));
    assert_true(small <= UMT_CONV_WORKSPACE_DEFAULT);
    assert_int_equal(restart_backends(), 0); /* fresh plans, made under the new limit */
    umt_cuda_state_set_conv_workspace_limit(twin_backend_state(), limit);
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(&s, &large));
    print_message("conv2 at batch 512: workspace %zu bytes under 256 MiB, %zu under 1 GiB\n", small, large);
    assert_true(large <= limit);
    int64_t w_numel = s.k * s.c * s.r * s.s;
    float *filters = host_alloc((size_t)w_numel * sizeof *filters);
    memset(filters, 0, (size_t)w_numel * sizeof *filters);
    for (int64_t k = 0; k < s.k; k++) filters[k * s.c * 9 + random_u32() % (uint32_t)(s.c * 9)] = 1.0f;
    check_conv(conv2_512, twin_random(s.n * s.c * s.h * s.w, 1, 2), twin_of(filters, (size_t)w_numel * 4), 3e-5);
    check_conv(conv2_512, twin_random(s.n * s.c * s.h * s.w, -1, 1), twin_random(w_numel, -1, 1), 1e-4);
    assert_int_equal(restart_backends(), 0); /* the default again, for the tests after this one */
}

/* ------------------------------------------------------------------------------------------ */
/* Channel bias                                                                                */

static void test_channel_bias_kernels_match_the_cpu_in_place_and_accumulating(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1}, {64, 32, 676}, {3, 7, 1}, {2, 5, 4099}, {0, 3, 5}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t n = shapes[i][0], k = shapes[i][1], hw = shapes[i][2], numel = n * k * hw;
        CONTEXT("channel bias n %lld, k %lld, hw %lld", (long long)n, (long long)k, (long long)hw);
        twin x = twin_random(numel, -1, 1), bias = twin_random(k, -1, 1), y = twin_poisoned((size_t)numel * 4);
        BOTH(add_channel_bias(P(x), P(bias), P(y), n, k, hw));
        expect_same_bytes("add_channel_bias", y);
        BOTH(add_channel_bias(P(x), P(bias), P(x), n, k, hw));
        expect_same_bytes("add_channel_bias in place", x);
        float *scale = absolute(F(bias), k);
        for (int64_t e = 0; e < numel; e++) scale[e / hw % k] += fabsf(F(x)[e]);
        BOTH(sum_channel_bias(P(x), P(bias), n, k, hw));
        expect_within("sum_channel_bias", bias, scale, 1e-5, 1e-6);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Pooling                                                                                     */

/* n, c, h, w, window, stride: MNIST's pool, overlapping windows, an uncovered tail, stride 1,
 * a single element, a window as large as the input. */
static const int64_t pool_shapes[][6] = {{64, 64, 24, 24, 2, 2}, {3, 5, 9, 11, 3, 2}, {2, 3, 7, 7, 2, 2},
                                         {2, 2, 6, 5, 3, 1},     {1, 1, 1, 1, 1, 1},  {2, 3, 5, 5, 5, 1}};
#define POOL_SHAPE_COUNT (sizeof pool_shapes / sizeof pool_shapes[0])

static umt_pool_shape pool_shape(const int64_t *d) {
    umt_pool_shape s = {d[0], d[1], d[2], d[3], (d[2] - d[4]) / d[5] + 1, (d[3] - d[4]) / d[5] + 1, d[4], d[5],
                        UMT_F32, false};
    CONTEXT("pool x %lldx%lldx%lldx%lld, window %lld, stride %lld", (long long)s.n, (long long)s.c, (long long)s.h,
            (long long)s.w, (long long)s.window, (long long)s.stride);
    return s;
}

/* Inputs drawn from five values (-0.0 and 0.0 among them), so windows hold ties, and 1 in 50 a
 * NaN with a varying payload: the CPU's first-maximum and first-NaN rules decide. */
static twin tied_input(int64_t n) {
    static const float levels[] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f};
    uint32_t *bits = host_alloc((size_t)n * sizeof *bits);
    for (int64_t i = 0; i < n; i++) {
        float v = levels[random_u32() % 5];
        memcpy(&bits[i], &v, sizeof v);
        if (random_u32() % 50 == 0) bits[i] = 0x7fc00000u | (random_u32() & 0xffffu);
    }
    return twin_of(bits, (size_t)n * sizeof *bits);
}

/* Average pooling takes plain random inputs: arithmetic on a NaN need not keep its payload. */
static void test_max_and_avg_pool_match_the_cpu_bit_for_bit_through_ties_nans_and_overlaps(void **state) {
    (void)state;
    for (size_t i = 0; i < POOL_SHAPE_COUNT; i++) {
        umt_pool_shape s = pool_shape(pool_shapes[i]);
        int64_t in = s.n * s.c * s.h * s.w, out = s.n * s.c * s.p * s.q;
        twin x = tied_input(in), y = twin_poisoned((size_t)out * 4), argmax = twin_poisoned((size_t)out * 4);
        BOTH(max_pool_forward(&s, P(x), P(y), P(argmax)));
        expect_same_bytes("max_pool_forward y", y);
        expect_same_bytes("max_pool_forward argmax", argmax);
        twin dy = twin_random(out, -1, 1), dx = twin_random(in, -1, 1), dx_avg = twin_random(in, -1, 1);
        BOTH(max_pool_backward(&s, P(argmax), P(dy), P(dx)));
        expect_same_bytes("max_pool_backward", dx);
        twin plain = twin_random(in, -1, 1), y_avg = twin_poisoned((size_t)out * 4);
        BOTH(avg_pool_forward(&s, P(plain), P(y_avg)));
        expect_same_bytes("avg_pool_forward", y_avg);
        BOTH(avg_pool_backward(&s, P(dy), P(dx_avg)));
        expect_same_bytes("avg_pool_backward", dx_avg);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout                                                                                     */

/* x holds infinities at every 97th element: a dropped one must become 0, a kept one stay inf. */
static void test_dropout_keeps_the_cpus_elements_and_matches_it_bit_for_bit(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 7, 1000, 65537};
    static const float ps[] = {0.0f, 0.25f, 0.5f, 0.9f};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
            int64_t n = sizes[i];
            uint64_t seed = (uint64_t)random_u32() << 32 | random_u32();
            /* first: where a micro-batch would start in its whole batch (0: the batch itself) */
            int64_t first = j % 2 ? (int64_t)(random_u32() % 1000000) : 0;
            CONTEXT("dropout n %lld, first %lld, p %g, seed %llu", (long long)n, (long long)first, (double)ps[j],
                    (unsigned long long)seed);
            float *values = host_alloc((size_t)n * sizeof *values);
            for (int64_t e = 0; e < n; e++) values[e] = e % 97 == 50 ? (e % 2 ? INFINITY : -INFINITY) : uniform(-1, 1);
            twin x = twin_of(values, (size_t)n * 4), y = twin_poisoned((size_t)n * 4), mask = twin_poisoned((size_t)n);
            BOTH(dropout_forward(P(x), P(y), P(mask), n, first, ps[j], seed, NULL));
            expect_same_bytes("dropout_forward mask", mask);
            expect_same_bytes("dropout_forward y", y);
            int64_t kept = 0;
            for (int64_t e = 0; e < n; e++) kept += ((uint8_t *)mask.host)[e];
            if (n == 65537) assert_true(fabs((double)kept / n - (1.0 - ps[j])) < 0.02);
            twin dy = twin_random(n, -1, 1), dx = twin_random(n, -1, 1);
            BOTH(dropout_backward(P(mask), P(dy), P(dx), n, ps[j]));
            expect_same_bytes("dropout_backward", dx);
        }
    }
}

/* A linear layer's bias, ReLU and dropout in one pass, and its backward: the CPU's kept
 * elements and values bit for bit, the masked and scaled gradient too; the bias sums, added in
 * another order, within 1e-5 of the sum of their terms' magnitudes. 128 and 24 channels (eight
 * lanes on the GPU under bf16; in f32 here, the two kernels in turn) and 20. */
static void test_bias_relu_dropout_and_its_backward_match_the_cpu(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{64, 128}, {33, 24}, {17, 20}}; /* rows, k */
    static const float ps[] = {0.0f, 0.25f, 0.5f};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
            int64_t rows = shapes[i][0], k = shapes[i][1], n = rows * k;
            umt_dropout_draw draw = {ps[j], (uint64_t)random_u32() << 32 | random_u32(), NULL,
                                     j % 2 ? (int64_t)(random_u32() % 1000000) : 0};
            CONTEXT("bias_relu_dropout rows %lld, k %lld, p %g, first %lld", (long long)rows, (long long)k,
                    (double)ps[j], (long long)draw.first);
            twin x = twin_random(n, -1, 1), bias = twin_random(k, -0.5f, 0.5f), y = twin_poisoned((size_t)n * 4);
            BOTH(bias_relu_dropout(UMT_F32, P(x), P(bias), P(y), rows, k, &draw));
            expect_same_bytes("bias_relu_dropout y", y);
            twin dy = twin_random(n, -1, 1), dbias = twin_random(k, -1, 1);
            float *scale = absolute(F(dbias), k);
            BOTH(bias_relu_dropout_backward(UMT_F32, P(y), P(dy), P(dbias), rows, k, ps[j]));
            expect_same_bytes("bias_relu_dropout_backward dy", dy);
            for (int64_t e = 0; e < n; e++) scale[e % k] += fabsf(F(dy)[e]);
            expect_within("bias_relu_dropout_backward dbias", dbias, scale, 1e-5, 1e-6);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Batch norm                                                                                  */

/* n, c, hw: the MNIST CNN's two feature maps, odd sizes, one value per channel, [n, c] inputs. */
static const int64_t bn_shapes[][3] = {{64, 32, 676}, {64, 64, 576}, {3, 5, 7}, {1, 4, 1}, {2, 3, 1}, {128, 10, 1}};
#define BN_SHAPE_COUNT (sizeof bn_shapes / sizeof bn_shapes[0])

/* Each channel centred on its own offset in [-3, 3] with its own spread, so means and variances
 * differ between channels and the variance is taken around a mean away from 0. */
static twin bn_input(int64_t n, int64_t c, int64_t hw) {
    float *values = host_alloc((size_t)(n * c * hw) * sizeof *values);
    float *offset = host_alloc((size_t)c * sizeof *offset), *spread = host_alloc((size_t)c * sizeof *spread);
    for (int64_t ch = 0; ch < c; ch++) {
        offset[ch] = uniform(-3, 3);
        spread[ch] = uniform(0.5f, 2);
    }
    for (int64_t e = 0; e < n * c * hw; e++) values[e] = offset[e / hw % c] + spread[e / hw % c] * uniform(-1, 1);
    return twin_of(values, (size_t)(n * c * hw) * sizeof *values);
}

/* The scale of a normalised output: (|x| + |mean|) * inv_std * |gamma| + |beta|. */
static float *bn_output_scale(const float *x, const float *mean, const float *inv_std, const float *gamma,
                              const float *beta, int64_t n, int64_t c, int64_t hw) {
    float *scale = host_alloc((size_t)(n * c * hw) * sizeof *scale);
    for (int64_t e = 0; e < n * c * hw; e++) {
        int64_t ch = e / hw % c;
        scale[e] = (fabsf(x[e]) + fabsf(mean[ch])) * inv_std[ch] * fabsf(gamma[ch]) + fabsf(beta[ch]);
    }
    return scale;
}

/* Two training steps (momentum and eps differ), each compared with the running statistics both
 * sides start it from being the CPU's, then evaluation with the CPU's running statistics. */
static void check_batchnorm_forward(const int64_t *shape) {
    int64_t n = shape[0], c = shape[1], hw = shape[2], numel = n * c * hw;
    twin gamma = twin_random(c, 0.5f, 1.5f), beta = twin_random(c, -1, 1);
    float *running_mean = F(twin_random(c, -1, 1)), *running_var = F(twin_random(c, 0.5f, 1.5f));
    static const float momentum[2] = {0.1f, 0.3f}, eps[2] = {1e-5f, 1e-3f};
    for (int step = 0; step < 2; step++) {
        CONTEXT("batchnorm_forward_train n %lld, c %lld, hw %lld, step %d", (long long)n, (long long)c, (long long)hw,
                step);
        twin x = bn_input(n, c, hw), y = twin_poisoned((size_t)numel * 4);
        twin mean = twin_poisoned((size_t)c * 4), inv_std = twin_poisoned((size_t)c * 4);
        twin rmean = twin_of(running_mean, (size_t)c * 4), rvar = twin_of(running_var, (size_t)c * 4);
        float *mean_scale = absolute(running_mean, c), *var_scale = absolute(running_var, c);
        for (int64_t e = 0; e < numel; e++) mean_scale[e / hw % c] += fabsf(F(x)[e]) / (float)(n * hw);
        BOTH(batchnorm_forward_train(P(x), P(gamma), P(beta), P(y), P(rmean), P(rvar), P(mean), P(inv_std), n, c, hw,
                                     momentum[step], eps[step]));
        expect_within("save_mean", mean, mean_scale, 1e-4, 1e-6);
        expect_within("save_inv_std", inv_std, NULL, 1e-4, 0.0);
        expect_within("running_mean", rmean, mean_scale, 1e-4, 1e-6);
        for (int64_t ch = 0; ch < c; ch++) var_scale[ch] += fabsf(F(rvar)[ch]);
        expect_within("running_var", rvar, var_scale, 1e-4, 1e-6);
        expect_within("y", y, bn_output_scale(F(x), F(mean), F(inv_std), F(gamma), F(beta), n, c, hw), 1e-4, 1e-6);
        running_mean = F(rmean);
        running_var = F(rvar);
    }
    twin x = bn_input(n, c, hw), y = twin_poisoned((size_t)numel * 4);
    twin rmean = twin_of(running_mean, (size_t)c * 4), rvar = twin_of(running_var, (size_t)c * 4);
    BOTH(batchnorm_forward_eval(P(x), P(gamma), P(beta), P(rmean), P(rvar), P(y), n, c, hw, 1e-5f));
    float *inv_std = host_alloc((size_t)c * sizeof *inv_std);
    for (int64_t ch = 0; ch < c; ch++) inv_std[ch] = 1.0f / sqrtf(running_var[ch] + 1e-5f);
    CONTEXT("batchnorm_forward_eval n %lld, c %lld, hw %lld", (long long)n, (long long)c, (long long)hw);
    expect_within("y", y, bn_output_scale(F(x), running_mean, inv_std, F(gamma), F(beta), n, c, hw), 1e-4, 1e-6);
}

static void test_batchnorm_forwards_and_running_statistics_match_the_cpu_within_1e_4(void **state) {
    (void)state;
    for (size_t i = 0; i < BN_SHAPE_COUNT; i++) check_batchnorm_forward(bn_shapes[i]);
}

/* Backward from the CPU's saved statistics, all three gradients accumulating, then again with
 * dx alone and with dgamma and dbeta alone (NULL for the others): the same values either way. */
static void check_batchnorm_backward(const int64_t *shape) {
    int64_t n = shape[0], c = shape[1], hw = shape[2], numel = n * c * hw, m = n * hw;
    CONTEXT("batchnorm_backward n %lld, c %lld, hw %lld", (long long)n, (long long)c, (long long)hw);
    twin x = bn_input(n, c, hw), gamma = twin_random(c, -1.5f, 1.5f), beta = twin_random(c, -1, 1);
    twin rmean = twin_random(c, -1, 1), rvar = twin_random(c, 0.5f, 1.5f);
    float *y = host_alloc((size_t)numel * 4), *saved_mean = host_alloc((size_t)c * 4);
    float *saved_inv_std = host_alloc((size_t)c * 4);
    EXPECT_OK(cpu->f32.batchnorm_forward_train(F(x), F(gamma), F(beta), y, F(rmean), F(rvar), saved_mean, saved_inv_std,
                                           n, c, hw, 0.1f, 1e-5f));
    twin mean = twin_of(saved_mean, (size_t)c * 4), inv_std = twin_of(saved_inv_std, (size_t)c * 4);
    twin dy = twin_random(numel, -1, 1), dx = twin_random(numel, -1, 1);
    twin dgamma = twin_random(c, -1, 1), dbeta = twin_random(c, -1, 1);
    float *dx_scale = absolute(F(dx), numel), *dgamma_scale = absolute(F(dgamma), c);
    float *dbeta_scale = absolute(F(dbeta), c), *abs_xhat = host_alloc((size_t)numel * 4);
    for (int64_t e = 0; e < numel; e++) { /* dbeta's scale is sum |dy|, dgamma's sum |dy * xhat| */
        int64_t ch = e / hw % c;
        abs_xhat[e] = fabsf((F(x)[e] - saved_mean[ch]) * saved_inv_std[ch]);
        dbeta_scale[ch] += fabsf(F(dy)[e]);
        dgamma_scale[ch] += fabsf(F(dy)[e]) * abs_xhat[e];
    }
    for (int64_t e = 0; e < numel; e++) { /* |initial dx| added to the terms of dx */
        int64_t ch = e / hw % c;
        dx_scale[e] += fabsf(F(gamma)[ch]) * saved_inv_std[ch] / (float)m *
                       ((float)m * fabsf(F(dy)[e]) + dbeta_scale[ch] + abs_xhat[e] * dgamma_scale[ch]);
    }
    twin dx_alone = twin_of(F(dx), dx.bytes), dgamma_alone = twin_of(F(dgamma), dgamma.bytes);
    twin dbeta_alone = twin_of(F(dbeta), dbeta.bytes);
    BOTH(batchnorm_backward(P(x), P(dy), P(gamma), P(mean), P(inv_std), P(dx), P(dgamma), P(dbeta), n, c, hw));
    expect_within("dx", dx, dx_scale, 1e-4, 1e-6);
    expect_within("dgamma", dgamma, dgamma_scale, 1e-4, 1e-6);
    expect_within("dbeta", dbeta, dbeta_scale, 1e-4, 1e-6);
    BOTH(batchnorm_backward(P(x), P(dy), P(gamma), P(mean), P(inv_std), P(dx_alone), NULL, NULL, n, c, hw));
    expect_within("dx alone", dx_alone, dx_scale, 1e-4, 1e-6);
    BOTH(batchnorm_backward(P(x), P(dy), P(gamma), P(mean), P(inv_std), NULL, P(dgamma_alone), P(dbeta_alone), n, c,
                            hw));
    expect_within("dgamma alone", dgamma_alone, dgamma_scale, 1e-4, 1e-6);
    expect_within("dbeta alone", dbeta_alone, dbeta_scale, 1e-4, 1e-6);
}

static void test_batchnorm_backward_matches_the_cpu_within_1e_4_with_any_gradient_left_out(void **state) {
    (void)state;
    for (size_t i = 0; i < BN_SHAPE_COUNT; i++) check_batchnorm_backward(bn_shapes[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Argument errors: refused before any pointer is used, so a host array stands in for buffers. */

static void test_bad_arguments_fail_with_the_cpu_status_and_message(void **state) {
    (void)state;
    float b[64] = {0};
    size_t bytes = 0;
    umt_conv_shape wrong_p = conv_shape((const int64_t[9]){2, 3, 8, 8, 4, 3, 3, 1, 0}), no_filters = wrong_p;
    umt_conv_shape too_large = conv_shape((const int64_t[9]){1, 1, 2, 2, 1, 5, 5, 1, 1});
    wrong_p.p = 7;
    no_filters.k = 0;
    too_large.p = too_large.q = 1;
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, conv2d_forward(&wrong_p, b, b, b, b, sizeof b));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, conv2d_workspace_bytes(&no_filters, &bytes));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, conv2d_backward_data(&too_large, b, b, b, b, sizeof b));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, add_channel_bias(b, b, b, -1, 2, 2));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, sum_channel_bias(b, b, 2, -3, 2));
    umt_pool_shape window = {1, 1, 2, 2, 1, 1, 3, 1, UMT_F32, false}, stride = {1, 1, 4, 4, 2, 2, 2, 0, UMT_F32, false};
    umt_pool_shape output = {1, 1, 4, 4, 3, 3, 2, 2, UMT_F32, false};
    int32_t argmax[4] = {0};
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, max_pool_forward(&window, b, b, argmax));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, max_pool_backward(&output, argmax, b, b));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, avg_pool_forward(&output, b, b));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, avg_pool_backward(&stride, b, b));
    uint8_t mask[4] = {0};
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, dropout_forward(b, b, mask, 4, 0, 1.0f, 7, NULL));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, dropout_forward(b, b, mask, 4, 0, NAN, 7, NULL));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, dropout_backward(mask, b, b, -1, 0.5f));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, batchnorm_forward_train(b, b, b, b, b, b, b, b, 0, 2, 2, 0.1f, 1e-5f));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, batchnorm_forward_train(b, b, b, b, b, b, b, b, 2, 2, 2, 0.1f, -1.0f));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, batchnorm_forward_train(b, b, b, b, b, b, b, b, 2, 2, 2, 1.5f, 1e-5f));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, batchnorm_forward_eval(b, b, b, b, b, b, 2, 2, 2, INFINITY));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, batchnorm_backward(b, b, b, b, b, b, b, b, 2, 0, 2));
}

/* ------------------------------------------------------------------------------------------ */

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST(test_conv2d_and_its_backwards_match_the_cpu_within_1e_4_of_the_sum_of_terms),
        TEST(test_conv2d_computes_in_fp32_not_tf32),
        TEST(test_conv2d_plans_survive_more_shapes_than_the_cache_holds),
        TEST(test_conv2d_keeps_within_its_workspace_limit_and_computes_in_fp32_under_a_larger_one),
        TEST(test_channel_bias_kernels_match_the_cpu_in_place_and_accumulating),
        TEST(test_max_and_avg_pool_match_the_cpu_bit_for_bit_through_ties_nans_and_overlaps),
        TEST(test_dropout_keeps_the_cpus_elements_and_matches_it_bit_for_bit),
        TEST(test_bias_relu_dropout_and_its_backward_match_the_cpu),
        TEST(test_batchnorm_forwards_and_running_statistics_match_the_cpu_within_1e_4),
        TEST(test_batchnorm_backward_matches_the_cpu_within_1e_4_with_any_gradient_left_out),
        TEST(test_bad_arguments_fail_with_the_cpu_status_and_message),
    };
    return cmocka_run_group_tests(tests, start_backends, stop_backends);
}
