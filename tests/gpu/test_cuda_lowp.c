/*
 * tests/gpu/test_cuda_lowp.c — the mixed-precision slots of the CUDA backend (kernels/backend.h,
 * "mixed precision") against the CPU backend's f32 slots, for bf16 and f16.
 *
 * Each case draws f32 values and rounds them to the half dtype with the CPU's convert. The CUDA
 * _lp slot gets the half values, NHWC where the case says so (convolution weights K,R,S,C); the
 * CPU f32 slot gets the same rounded values as f32, NCHW (transposed on the host). The CUDA
 * result is transposed back, widened to f32 and compared with the CPU's:
 *   - within 1e-2 (bf16) or 2e-3 (f16) of the reference's scale, plus 1e-6: the scale is |value|
 *     for elementwise results and the sum of |terms| for products and reductions (the CPU slot
 *     run on absolute values, onto |initial value| where the output accumulates);
 *   - bit for bit where the result is exact: recast (casts, layout changes, accumulation, round
 *     trips), ReLU, max pooling's picks and argmax (distinct values), dropout's masks, its zeros,
 *     and the elements an accumulating backward must leave alone.
 * Outputs start poisoned (0xFF bytes: NaN in every float dtype, -1 as int32); outputs that
 * accumulate start from random values.
 *
 * The seed is printed once; UMT_TEST_SEED=<seed> repeats a run. Needs a GPU (tag "gpu"):
 *     bazel test --config=cuda //tests/gpu:test_cuda_lowp
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_handle.h"
#include "tests/gpu/kernel_twins.h"
#include "umtrain.h"

static const umt_dtype HALVES[2] = {UMT_BF16, UMT_F16};
static const double FLOOR = 1e-6;

/* Failures name the case under test too. */
#undef EXPECT_OK
#define EXPECT_OK(call)                                                                                            \
    do {                                                                                                           \
        if ((call) != UMT_OK) fail_msg("%s: %s failed: %s", context, #call, umt_last_error());                     \
    } while (0)

/* The case under test (slot family, dtype, layout, shape), named by every failure message. */
static char context[200];
#define CONTEXT(...) snprintf(context, sizeof context, __VA_ARGS__)

static const char *layout_name(bool nhwc) { return nhwc ? "NHWC" : "NCHW"; }

/* The bounds: a few units of each dtype's rounding (2^-9 for bf16, 2^-12 for f16). */
static double tolerance(umt_dtype dtype) { return dtype == UMT_BF16 ? 1e-2 : 2e-3; }

/* ------------------------------------------------------------------------------------------ */
/* Buffers beyond tests/gpu/kernel_twins.h, freed after each test too                         */

static void *poison(size_t bytes) {
    void *p = host_alloc(bytes);
    memset(p, 0xff, bytes);
    return p;
}

static float *copy_of(const float *v, int64_t n) {
    float *out = host_alloc((size_t)n * sizeof *out);
    memcpy(out, v, (size_t)n * sizeof *out);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Layouts: n images of c channels of hw pixels (flat tensors are 1 x 1 x numel)               */

typedef struct {
    int64_t n, c, hw;
} dims;

static int64_t numel(dims d) { return d.n * d.c * d.hw; }
static dims flat(int64_t count) { return (dims){1, 1, count}; }

/* dst = src moved between NCHW and NHWC storage (or copied), elements of size bytes. */
static void permute(const void *src, bool src_nhwc, void *dst, bool dst_nhwc, dims d, size_t size) {
    for (int64_t image = 0; image < d.n; image++) {
        for (int64_t channel = 0; channel < d.c; channel++) {
            for (int64_t pixel = 0; pixel < d.hw; pixel++) {
                int64_t nchw = (image * d.c + channel) * d.hw + pixel, nhwc = (image * d.hw + pixel) * d.c + channel;
                memcpy((char *)dst + (size_t)(dst_nhwc ? nhwc : nchw) * size,
                       (const char *)src + (size_t)(src_nhwc ? nhwc : nchw) * size, size);
            }
        }
    }
}

/* Device storage in NCHW order, on the host. */
static void *downloaded_nchw(const void *device, bool nhwc, dims d, size_t size) {
    void *stored = from_device(device, (size_t)numel(d) * size), *ordered = host_alloc((size_t)numel(d) * size);
    permute(stored, nhwc, ordered, false, d, size);
    return ordered;
}

/* ------------------------------------------------------------------------------------------ */
/* Pairs: one tensor as the CPU sees it (ref: f32, NCHW, on the host) and as CUDA sees it      */
/* (dev: dtype, layout, on the device), holding the same values.                               */

typedef struct {
    float *ref;
    void *dev;
    umt_dtype dtype;
    bool nhwc;
    dims d;
} pair;

/* values rounded to dtype: ref gets them widened back, dev gets them stored in the layout. */
static pair pair_of(const float *values, umt_dtype dtype, bool nhwc, dims d) {
    int64_t count = numel(d);
    size_t size = umt_dtype_size(dtype);
    pair p = {host_alloc((size_t)count * sizeof(float)), NULL, dtype, nhwc, d};
    void *stored = host_alloc((size_t)count * size), *ordered = host_alloc((size_t)count * size);
    EXPECT_OK(cpu->f32.convert(values, UMT_F32, stored, dtype, count));
    EXPECT_OK(cpu->f32.convert(stored, dtype, p.ref, UMT_F32, count));
    permute(stored, false, ordered, nhwc, d, size);
    p.dev = to_device(ordered, (size_t)count * size);
    return p;
}

static pair pair_random(umt_dtype dtype, bool nhwc, dims d, float lo, float hi) {
    float *values = host_alloc((size_t)numel(d) * sizeof *values);
    for (int64_t i = 0; i < numel(d); i++) values[i] = uniform(lo, hi);
    return pair_of(values, dtype, nhwc, d);
}

/* 0xFF bytes on both sides: a NaN in f32, bf16 and f16 alike. */
static pair pair_poisoned(umt_dtype dtype, bool nhwc, dims d) {
    int64_t count = numel(d);
    pair p = {poison((size_t)count * sizeof(float)), NULL, dtype, nhwc, d};
    p.dev = to_device(poison((size_t)count * umt_dtype_size(dtype)), (size_t)count * umt_dtype_size(dtype));
    return p;
}

/* The CUDA side's values as f32 in NCHW order. */
static float *result_of(pair p) {
    float *out = host_alloc((size_t)numel(p.d) * sizeof *out);
    EXPECT_OK(cpu->f32.convert(downloaded_nchw(p.dev, p.nhwc, p.d, umt_dtype_size(p.dtype)), p.dtype, out, UMT_F32,
                           numel(p.d)));
    return out;
}

static void fail_at(const char *what, pair p, int64_t i, double got, double want, const char *detail) {
    int64_t image = i / (p.d.c * p.d.hw), channel = i / p.d.hw % p.d.c, pixel = i % p.d.hw;
    fail_msg("%s: %s (%s %s) at image %lld, channel %lld, pixel %lld (NCHW index %lld): cuda %.9g, cpu %.9g (%s, "
             "seed %u)",
             context, what, umt_dtype_name(p.dtype), layout_name(p.nhwc), (long long)image, (long long)channel,
             (long long)pixel, (long long)i, got, want, detail, run_seed);
}

/* |cuda - cpu| <= tolerance(dtype) * scale[i] + FLOOR, scale[i] = |cpu| when scale is NULL. A
 * NaN on either side fails: these inputs are finite. */
static void expect_close(const char *what, pair p, const float *scale, umt_dtype dtype) {
    const float *got = result_of(p);
    for (int64_t i = 0; i < numel(p.d); i++) {
        double bound = tolerance(dtype) * (scale ? scale[i] : fabsf(p.ref[i])) + FLOOR;
        if (isnan(got[i]) || isnan(p.ref[i]) || !(fabs((double)got[i] - p.ref[i]) <= bound)) {
            char detail[64];
            snprintf(detail, sizeof detail, "bound %.3g", bound);
            fail_at(what, p, i, got[i], p.ref[i], detail);
        }
    }
}

/* The CUDA side holds exactly ref rounded to its dtype (the CPU's convert), bit for bit. */
static void expect_exact(const char *what, pair p) {
    int64_t count = numel(p.d);
    size_t size = umt_dtype_size(p.dtype);
    const uint8_t *got = downloaded_nchw(p.dev, p.nhwc, p.d, size);
    uint8_t *want = host_alloc((size_t)count * size);
    EXPECT_OK(cpu->f32.convert(p.ref, UMT_F32, want, p.dtype, count));
    for (int64_t i = 0; i < count; i++) {
        if (memcmp(got + (size_t)i * size, want + (size_t)i * size, size) != 0) {
            float got_value;
            EXPECT_OK(cpu->f32.convert(got + (size_t)i * size, p.dtype, &got_value, UMT_F32, 1));
            fail_at(what, p, i, got_value, p.ref[i], "expected the same bits");
        }
    }
}

/* Elements where keep[i] is false must still hold before[i] exactly (the CPU's before). */
static void expect_untouched(const char *what, pair p, const float *before, const bool *keep) {
    const float *got = result_of(p);
    for (int64_t i = 0; i < numel(p.d); i++) {
        if (!keep[i] && memcmp(&got[i], &before[i], sizeof(float)) != 0)
            fail_at(what, p, i, got[i], before[i], "expected this element left alone");
    }
}

/* ------------------------------------------------------------------------------------------ */
/* zero and recast                                                                             */

/* Both tables' zero clear exactly the bytes asked for: the poison after them stays. */
static void test_zero_clears_exactly_the_bytes_asked_for(void **state) {
    (void)state;
    enum { SIZE = 64, CLEARED = 37 };
    CONTEXT("zero %d of %d bytes", CLEARED, SIZE);
    uint8_t *host = poison(SIZE);
    void *device = to_device(host, SIZE);
    EXPECT_OK(cpu->f32.zero(host, CLEARED));
    EXPECT_OK(gpu->f32.zero(device, CLEARED));
    EXPECT_OK(gpu->f32.zero(device, 0));
    const uint8_t *got = from_device(device, SIZE);
    for (int i = 0; i < SIZE; i++) {
        uint8_t want = i < CLEARED ? 0x00 : 0xff;
        if (got[i] != want || host[i] != want)
            fail_msg("zero: byte %d: cuda %02x, cpu %02x, expected %02x", i, got[i], host[i], want);
    }
}

static const umt_dtype FLOATS[3] = {UMT_F32, UMT_BF16, UMT_F16};

/* One recast: src (random in its dtype) into dst (poisoned, or random when accumulating). The
 * device widens to f32, adds dst there when accumulating, and rounds once; the host does the
 * same sum in f32 and rounds it with the CPU's convert: bit for bit, in every element's place. */
static void check_recast(dims d, umt_dtype src_dtype, bool src_nhwc, umt_dtype dst_dtype, bool dst_nhwc,
                         bool accumulate) {
    CONTEXT("recast %s %s -> %s %s, n %lld c %lld hw %lld%s", umt_dtype_name(src_dtype), layout_name(src_nhwc),
            umt_dtype_name(dst_dtype), layout_name(dst_nhwc), (long long)d.n, (long long)d.c, (long long)d.hw,
            accumulate ? ", accumulating" : "");
    pair src = pair_random(src_dtype, src_nhwc, d, -4, 4);
    pair dst = accumulate ? pair_random(dst_dtype, dst_nhwc, d, -4, 4) : pair_poisoned(dst_dtype, dst_nhwc, d);
    EXPECT_OK(gpu->lowp.recast(src.dev, src_dtype, src_nhwc, dst.dev, dst_dtype, dst_nhwc, d.n, d.c, d.hw, accumulate));
    for (int64_t i = 0; i < numel(d); i++) dst.ref[i] = accumulate ? dst.ref[i] + src.ref[i] : src.ref[i];
    expect_exact("recast", dst);
}

static void test_recast_converts_moves_and_accumulates_every_element_bit_for_bit(void **state) {
    (void)state;
    /* Matrices of at most 32x32 elements are moved a thread an element (conv2's weight gradient
     * is 64 x [9, 32]; 5 x [32, 32] the largest); the last three cross the transposes' tiles:
     * 32x32 for any dtype, 64x64 half to half when both sides are multiples of 8 (MNIST's
     * flatten is 64 channels x 144 pixels). */
    static const dims shapes[] = {{3, 5, 7},   {2, 64, 9},   {4, 1, 10},  {64, 32, 9},
                                  {5, 32, 32}, {3, 64, 144}, {2, 33, 70}, {2, 72, 200}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int from = 0; from < 3; from++)
            for (int to = 0; to < 3; to++)
                for (int layouts = 0; layouts < 4; layouts++)
                    for (int accumulate = 0; accumulate < 2; accumulate++)
                        check_recast(shapes[i], FLOATS[from], layouts & 1, FLOATS[to], layouts & 2, accumulate);
    /* A flatten's gradient: one plane of more than 65535 tiles of 32, accumulated in place
     * (eight halves at a time). */
    check_recast((dims){1, 1, 2200000}, UMT_BF16, false, UMT_BF16, false, true);
}

/* f32 NCHW -> half NHWC -> f32 NCHW on the device gives the CPU convert's rounding exactly. */
static void test_recast_round_trip_equals_the_cpu_rounding(void **state) {
    (void)state;
    dims d = {2, 32, 25};
    for (int t = 0; t < 2; t++) {
        CONTEXT("recast round trip f32 NCHW -> %s NHWC -> f32 NCHW", umt_dtype_name(HALVES[t]));
        pair source = pair_random(UMT_F32, false, d, -100, 100);
        pair middle = pair_poisoned(HALVES[t], true, d), back = pair_poisoned(UMT_F32, false, d);
        EXPECT_OK(gpu->lowp.recast(source.dev, UMT_F32, false, middle.dev, HALVES[t], true, d.n, d.c, d.hw, false));
        EXPECT_OK(gpu->lowp.recast(middle.dev, HALVES[t], true, back.dev, UMT_F32, false, d.n, d.c, d.hw, false));
        uint8_t *rounded = host_alloc((size_t)numel(d) * 2);
        EXPECT_OK(cpu->f32.convert(source.ref, UMT_F32, rounded, HALVES[t], numel(d)));
        EXPECT_OK(cpu->f32.convert(rounded, HALVES[t], back.ref, UMT_F32, numel(d)));
        expect_exact("recast round trip", back);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* gemm_lp                                                                                     */

/* C = 1.5 op(A) op(B) + beta C; A and B stored with padded rows (ld = columns + pad). */
static void check_gemm(umt_dtype dtype, const int64_t *shape, bool trans_a, bool trans_b, umt_dtype c_dtype,
                       float beta) {
    int64_t m = shape[0], n = shape[1], k = shape[2], pad = shape[3];
    const float alpha = 1.5f;
    CONTEXT("gemm_lp %s x %s -> C %s, m %lld n %lld k %lld, trans_a %d trans_b %d, beta %g", umt_dtype_name(dtype),
            umt_dtype_name(dtype), umt_dtype_name(c_dtype), (long long)m, (long long)n, (long long)k, trans_a, trans_b,
            (double)beta);
    int64_t a_rows = trans_a ? k : m, lda = (trans_a ? m : k) + pad;
    int64_t b_rows = trans_b ? n : k, ldb = (trans_b ? k : n) + pad;
    pair a = pair_random(dtype, false, flat(a_rows * lda), -1, 1);
    pair b = pair_random(dtype, false, flat(b_rows * ldb), -1, 1);
    /* beta 0: C poisoned, since neither side may read it. */
    dims cd = flat(m * n);
    pair c = beta != 0.0f ? pair_random(c_dtype, false, cd, -1, 1) : pair_poisoned(c_dtype, false, cd);
    float *scale = absolute(c.ref, m * n); /* |beta C|, NaN-free: beta is 0 or 1 */
    for (int64_t i = 0; i < m * n; i++) scale[i] = beta != 0.0f ? scale[i] : 0.0f;
    EXPECT_OK(cpu->f32.gemm(trans_a, trans_b, m, n, k, alpha, absolute(a.ref, a_rows * lda), lda,
                        absolute(b.ref, b_rows * ldb), ldb, 1.0f, scale, n));
    EXPECT_OK(cpu->f32.gemm(trans_a, trans_b, m, n, k, alpha, a.ref, lda, b.ref, ldb, beta, c.ref, n));
    EXPECT_OK(gpu->lowp.gemm(trans_a, trans_b, m, n, k, alpha, a.dev, lda, b.dev, ldb, beta, c.dev, n, dtype, c_dtype));
    expect_close("gemm_lp C", c, scale, dtype);
}

static void test_gemm_lp_matches_the_cpu_for_every_transpose_output_dtype_and_beta(void **state) {
    (void)state;
    static const int64_t shapes[][4] = {{64, 32, 96, 0}, {7, 13, 5, 3}, {1, 1, 1, 0}, {10, 128, 300, 1}};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int trans = 0; trans < 4; trans++)
                for (int c_half = 0; c_half < 2; c_half++)
                    for (int beta = 0; beta < 2; beta++)
                        check_gemm(HALVES[t], shapes[i], trans & 1, trans & 2, c_half ? HALVES[t] : UMT_F32,
                                   (float)beta);
}

/* ------------------------------------------------------------------------------------------ */
/* Bias over rows and over channels                                                            */

/* out = x + bias (then in place), dbias += column sums. */
static void check_rows(umt_dtype dtype, int64_t rows, int64_t cols) {
    CONTEXT("add_rows_lp / sum_rows_lp %s, rows %lld cols %lld", umt_dtype_name(dtype), (long long)rows,
            (long long)cols);
    dims d = flat(rows * cols);
    pair x = pair_random(dtype, false, d, -2, 2), out = pair_poisoned(dtype, false, d);
    pair bias = pair_random(UMT_F32, false, flat(cols), -1, 1);
    float *scale = absolute(x.ref, rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) scale[i] += fabsf(bias.ref[i % cols]);
    EXPECT_OK(cpu->f32.add_rows(x.ref, bias.ref, out.ref, rows, cols));
    EXPECT_OK(gpu->lowp.add_rows(dtype, x.dev, bias.dev, out.dev, rows, cols));
    expect_close("add_rows_lp", out, scale, dtype);
    EXPECT_OK(cpu->f32.add_rows(x.ref, bias.ref, x.ref, rows, cols));
    EXPECT_OK(gpu->lowp.add_rows(dtype, x.dev, bias.dev, x.dev, rows, cols));
    expect_close("add_rows_lp in place", x, scale, dtype);

    pair dy = pair_random(dtype, false, d, -1, 1), dbias = pair_random(UMT_F32, false, flat(cols), -1, 1);
    float *sum_scale = absolute(dbias.ref, cols);
    EXPECT_OK(cpu->f32.sum_rows(absolute(dy.ref, rows * cols), sum_scale, rows, cols));
    EXPECT_OK(cpu->f32.sum_rows(dy.ref, dbias.ref, rows, cols));
    EXPECT_OK(gpu->lowp.sum_rows(dtype, dy.dev, dbias.dev, rows, cols));
    expect_close("sum_rows_lp", dbias, sum_scale, dtype);
}

static void test_row_bias_kernels_match_the_cpu(void **state) {
    (void)state;
    /* The last two take sum_rows_lp's chunked path (many rows, few columns: NHWC bias sums). */
    static const int64_t shapes[][2] = {{64, 100}, {3, 7}, {1, 1}, {300, 33}, {40000, 64}, {8193, 3}};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_rows(HALVES[t], shapes[i][0], shapes[i][1]);
}

static void check_channel_bias(umt_dtype dtype, bool nhwc, dims d) {
    int64_t n = d.n, k = d.c, hw = d.hw;
    CONTEXT("add_channel_bias_lp / sum_channel_bias_lp %s %s, n %lld k %lld hw %lld", umt_dtype_name(dtype),
            layout_name(nhwc), (long long)n, (long long)k, (long long)hw);
    pair x = pair_random(dtype, nhwc, d, -2, 2), y = pair_poisoned(dtype, nhwc, d);
    pair bias = pair_random(UMT_F32, false, flat(k), -1, 1);
    float *scale = absolute(x.ref, numel(d));
    for (int64_t i = 0; i < numel(d); i++) scale[i] += fabsf(bias.ref[i / hw % k]);
    EXPECT_OK(cpu->f32.add_channel_bias(x.ref, bias.ref, y.ref, n, k, hw));
    EXPECT_OK(gpu->lowp.add_channel_bias(dtype, nhwc, x.dev, bias.dev, y.dev, n, k, hw));
    expect_close("add_channel_bias_lp", y, scale, dtype);
    EXPECT_OK(cpu->f32.add_channel_bias(x.ref, bias.ref, x.ref, n, k, hw));
    EXPECT_OK(gpu->lowp.add_channel_bias(dtype, nhwc, x.dev, bias.dev, x.dev, n, k, hw));
    expect_close("add_channel_bias_lp in place", x, scale, dtype);

    pair dy = pair_random(dtype, nhwc, d, -1, 1), dbias = pair_random(UMT_F32, false, flat(k), -1, 1);
    float *sum_scale = absolute(dbias.ref, k);
    EXPECT_OK(cpu->f32.sum_channel_bias(absolute(dy.ref, numel(d)), sum_scale, n, k, hw));
    EXPECT_OK(cpu->f32.sum_channel_bias(dy.ref, dbias.ref, n, k, hw));
    EXPECT_OK(gpu->lowp.sum_channel_bias(dtype, nhwc, dy.dev, dbias.dev, n, k, hw));
    expect_close("sum_channel_bias_lp", dbias, sum_scale, dtype);
}

static void test_channel_bias_kernels_match_the_cpu_in_both_layouts(void **state) {
    (void)state;
    static const dims shapes[] = {{4, 32, 36}, {2, 5, 7}, {1, 1, 1}, {3, 64, 1}, {2, 3, 700}};
    for (int t = 0; t < 2; t++)
        for (int nhwc = 0; nhwc < 2; nhwc++)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                check_channel_bias(HALVES[t], nhwc, shapes[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* ReLU and dropout                                                                            */

/* x holds -0.0 and 0.0 at its start: ReLU passes both through as the f32 kernel does. */
static void check_relu(umt_dtype dtype, int64_t n) {
    CONTEXT("relu_lp / relu_backward_lp %s, n %lld", umt_dtype_name(dtype), (long long)n);
    float *values = host_alloc((size_t)n * sizeof *values);
    for (int64_t i = 0; i < n; i++) values[i] = i == 0 ? -0.0f : i == 1 ? 0.0f : uniform(-2, 2);
    pair x = pair_of(values, dtype, false, flat(n)), y = pair_poisoned(dtype, false, flat(n));
    EXPECT_OK(cpu->f32.relu(x.ref, y.ref, n));
    EXPECT_OK(gpu->lowp.relu(dtype, x.dev, y.dev, n));
    expect_exact("relu_lp", y);

    pair dy = pair_random(dtype, false, flat(n), -1, 1), dx = pair_random(dtype, false, flat(n), -1, 1);
    float *before = copy_of(dx.ref, n), *scale = absolute(dx.ref, n);
    bool *passed = host_alloc((size_t)n * sizeof *passed);
    for (int64_t i = 0; i < n; i++) {
        passed[i] = y.ref[i] > 0.0f;
        scale[i] += fabsf(dy.ref[i]);
    }
    EXPECT_OK(cpu->f32.relu_backward(y.ref, dy.ref, dx.ref, n));
    EXPECT_OK(gpu->lowp.relu_backward(dtype, y.dev, dy.dev, dx.dev, n));
    expect_close("relu_backward_lp", dx, scale, dtype);
    expect_untouched("relu_backward_lp where y <= 0", dx, before, passed);
}

static void test_relu_matches_the_cpu_exactly_and_its_backward_within_tolerance(void **state) {
    (void)state;
    static const int64_t sizes[] = {2, 1000, 4099};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_relu(HALVES[t], sizes[i]);
}

static void check_dropout(umt_dtype dtype, int64_t n, float p) {
    uint64_t seed = (uint64_t)random_u32() << 32 | random_u32();
    /* Where a micro-batch starts in its whole batch: 0 half the time, else anywhere. */
    int64_t first = random_u32() % 2 ? 0 : (int64_t)(random_u32() % 100000);
    CONTEXT("dropout_forward_lp / dropout_backward_lp %s, n %lld, first %lld, p %g, seed %llu",
            umt_dtype_name(dtype), (long long)n, (long long)first, (double)p, (unsigned long long)seed);
    pair x = pair_random(dtype, false, flat(n), -2, 2), y = pair_poisoned(dtype, false, flat(n));
    uint8_t *mask = poison((size_t)n), *mask_dev = to_device(mask, (size_t)n);
    EXPECT_OK(cpu->f32.dropout_forward(x.ref, y.ref, mask, n, first, p, seed, NULL));
    EXPECT_OK(gpu->lowp.dropout_forward(dtype, x.dev, y.dev, mask_dev, n, first, p, seed, NULL));
    const uint8_t *got_mask = from_device(mask_dev, (size_t)n);
    bool *kept = host_alloc((size_t)n * sizeof *kept);
    for (int64_t i = 0; i < n; i++) {
        if (got_mask[i] != mask[i])
            fail_msg("%s: dropout_forward_lp mask[%lld]: cuda %u, cpu %u (seed %u)", context, (long long)i,
                     got_mask[i], mask[i], run_seed);
        kept[i] = mask[i] != 0;
    }
    expect_close("dropout_forward_lp y", y, NULL, dtype);
    /* Dropped elements must be +0 exactly: bit-compared with zeros wherever the mask is 0. */
    float *zeros = host_alloc((size_t)n * sizeof *zeros);
    memset(zeros, 0, (size_t)n * sizeof *zeros);
    expect_untouched("dropout_forward_lp dropped element", y, zeros, kept);

    pair dy = pair_random(dtype, false, flat(n), -1, 1), dx = pair_random(dtype, false, flat(n), -1, 1);
    float *before = copy_of(dx.ref, n), *scale = absolute(dx.ref, n);
    for (int64_t i = 0; i < n; i++) scale[i] += fabsf(dy.ref[i]) / (1.0f - p);
    EXPECT_OK(cpu->f32.dropout_backward(mask, dy.ref, dx.ref, n, p));
    EXPECT_OK(gpu->lowp.dropout_backward(dtype, mask_dev, dy.dev, dx.dev, n, p));
    expect_close("dropout_backward_lp", dx, scale, dtype);
    expect_untouched("dropout_backward_lp where dropped", dx, before, kept);
}

static void test_dropout_keeps_the_cpus_elements_and_scales_them_within_tolerance(void **state) {
    (void)state;
    /* 1000 and 65536: eight elements a thread (the mask bytes stored eight at a time). */
    static const int64_t sizes[] = {7, 1000, 65536, 65537};
    static const float ps[] = {0.0f, 0.25f, 0.5f};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) check_dropout(HALVES[t], sizes[i], ps[j]);
}

/* ------------------------------------------------------------------------------------------ */
/* Convolution: x, y NHWC, w K,R,S,C in the half dtype; dw an f32 gradient in K,C,R,S order    */

/* d: n, c, h, w, k, r, s, stride, pad. */
static umt_conv_shape conv_shape(const int64_t *d) {
    umt_conv_shape s = {d[0], d[1], d[2], d[3], d[4], d[5], d[6], 0, 0, d[7], d[8], UMT_F32, false};
    s.p = (s.h + 2 * s.pad - s.r) / s.stride + 1;
    s.q = (s.w + 2 * s.pad - s.s) / s.stride + 1;
    return s;
}

/* Forward, then both backwards onto random gradients. Scales: the CPU's own kernels on |inputs|
 * (sum |a*b| = sum |a|*|b|), onto |initial value| for the accumulating backwards. */
static void check_conv(umt_dtype dtype, const int64_t *shape) {
    umt_conv_shape f = conv_shape(shape), h = f;
    h.dtype = dtype;
    h.nhwc = true;
    CONTEXT("conv2d_*_lp %s, x %lldx%lldx%lldx%lld, w %lldx%lldx%lld, stride %lld, pad %lld", umt_dtype_name(dtype),
            (long long)f.n, (long long)f.c, (long long)f.h, (long long)f.w, (long long)f.k, (long long)f.r,
            (long long)f.s, (long long)f.stride, (long long)f.pad);
    dims xd = {f.n, f.c, f.h * f.w}, wd = {f.k, f.c, f.r * f.s}, yd = {f.n, f.k, f.p * f.q};
    size_t cpu_bytes = 0, gpu_bytes = 0;
    EXPECT_OK(cpu->f32.conv2d_workspace_bytes(&f, &cpu_bytes));
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(&h, &gpu_bytes));
    void *cpu_ws = host_alloc(cpu_bytes), *gpu_ws = to_device(poison(gpu_bytes), gpu_bytes);

    pair x = pair_random(dtype, true, xd, -1, 1), w = pair_random(dtype, true, wd, -1, 1);
    pair y = pair_poisoned(dtype, true, yd), dy = pair_random(dtype, true, yd, -1, 1);
    pair dx = pair_random(dtype, true, xd, -1, 1), dw = pair_random(UMT_F32, false, wd, -1, 1);
    const float *abs_x = absolute(x.ref, numel(xd)), *abs_w = absolute(w.ref, numel(wd));
    const float *abs_dy = absolute(dy.ref, numel(yd));
    float *y_scale = host_alloc((size_t)numel(yd) * sizeof(float));
    float *dx_scale = absolute(dx.ref, numel(xd)), *dw_scale = absolute(dw.ref, numel(wd));
    EXPECT_OK(cpu->f32.conv2d_forward(&f, abs_x, abs_w, y_scale, cpu_ws, cpu_bytes));
    EXPECT_OK(cpu->f32.conv2d_backward_data(&f, abs_w, abs_dy, dx_scale, cpu_ws, cpu_bytes));
    EXPECT_OK(cpu->f32.conv2d_backward_filter(&f, abs_x, abs_dy, dw_scale, cpu_ws, cpu_bytes));

    EXPECT_OK(cpu->f32.conv2d_forward(&f, x.ref, w.ref, y.ref, cpu_ws, cpu_bytes));
    EXPECT_OK(gpu->lowp.conv2d_forward(&h, x.dev, w.dev, y.dev, gpu_ws, gpu_bytes));
    expect_close("conv2d_forward_lp y", y, y_scale, dtype);
    EXPECT_OK(cpu->f32.conv2d_backward_data(&f, w.ref, dy.ref, dx.ref, cpu_ws, cpu_bytes));
    EXPECT_OK(gpu->lowp.conv2d_backward_data(&h, w.dev, dy.dev, dx.dev, false, gpu_ws, gpu_bytes));
    expect_close("conv2d_backward_data_lp dx", dx, dx_scale, dtype);
    /* Overwriting (a fresh gradient): a poisoned dx ends as the gradient alone. */
    pair fresh = pair_poisoned(dtype, true, xd);
    memset(fresh.ref, 0, (size_t)numel(xd) * sizeof(float));
    EXPECT_OK(cpu->f32.conv2d_backward_data(&f, w.ref, dy.ref, fresh.ref, cpu_ws, cpu_bytes));
    EXPECT_OK(gpu->lowp.conv2d_backward_data(&h, w.dev, dy.dev, fresh.dev, true, gpu_ws, gpu_bytes));
    expect_close("conv2d_backward_data_lp dx (overwrite)", fresh, dx_scale, dtype);
    EXPECT_OK(cpu->f32.conv2d_backward_filter(&f, x.ref, dy.ref, dw.ref, cpu_ws, cpu_bytes));
    EXPECT_OK(gpu->lowp.conv2d_backward_filter(&h, x.dev, dy.dev, (float *)dw.dev, gpu_ws, gpu_bytes));
    expect_close("conv2d_backward_filter_lp dw (f32, K,C,R,S)", dw, dw_scale, dtype);
}

/* n, c, h, w, k, r, s, stride, pad: MNIST's first layer (c = 1) and a c = 32, k = 64 layer, each
 * at stride 1 and 2 with padding 0 and 1. The c*r*s <= 9 shapes take conv.cu's direct kernels
 * (conv_thin.cu): the first layer at batch 64 spreads its weight gradient over hundreds of
 * blocks of one tile each, and at batch 600 over all of them with several tiles each, the last
 * one partial; c = 2 with 2x2 filters, k = 8, 16 and 128 vary their terms and channel groups
 * (k = 128: a lane per channel quad, no shuffles); k = 12 (not a multiple of 8) stays on cuDNN.
 * Then cuDNN's engines on MNIST's second layer at batch 64 and on the shapes a weight gradient
 * of our own took in a trial (docs/PERF.md): batch 130 with padding, k = 16 with 9 columns,
 * k = 48, a 1x1 filter over 64 channels. */
static const int64_t conv_shapes[][9] = {
    {4, 1, 12, 12, 32, 3, 3, 1, 0},  {4, 1, 12, 12, 32, 3, 3, 1, 1},  {4, 1, 12, 12, 32, 3, 3, 2, 0},
    {4, 1, 12, 12, 32, 3, 3, 2, 1},  {2, 32, 10, 10, 64, 3, 3, 1, 0}, {2, 32, 10, 10, 64, 3, 3, 1, 1},
    {2, 32, 9, 9, 64, 3, 3, 2, 0},   {2, 32, 9, 9, 64, 3, 3, 2, 1},   {64, 1, 28, 28, 32, 3, 3, 1, 0},
    {3, 2, 9, 9, 16, 2, 2, 1, 1},    {5, 1, 7, 7, 8, 3, 3, 2, 1},     {4, 1, 12, 12, 12, 3, 3, 1, 0},
    {600, 1, 28, 28, 32, 3, 3, 1, 0}, {6, 1, 10, 10, 128, 3, 3, 1, 1}, {300, 1, 16, 16, 8, 3, 3, 1, 1},
    {64, 32, 26, 26, 64, 3, 3, 1, 0}, {130, 32, 14, 14, 64, 3, 3, 1, 1}, {3, 32, 7, 9, 16, 3, 3, 1, 1},
    {5, 32, 20, 20, 48, 3, 3, 1, 1},  {2, 64, 6, 6, 32, 1, 1, 1, 0},
};

static void check_conv_shapes(void) {
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof conv_shapes / sizeof conv_shapes[0]; i++) check_conv(HALVES[t], conv_shapes[i]);
}

static void test_conv2d_lp_and_its_backwards_match_the_cpu_within_tolerance_of_the_sum_of_terms(void **state) {
    (void)state;
    check_conv_shapes();
}

/* These shapes are too small for conv_engines.cu to time its candidates by default (the first
 * runs in microseconds). UMT_CONV_TIMING=all makes every first run build, run and time each
 * candidate before keeping the fastest; =0 keeps the heuristic's first without timing. Either
 * way, the engine kept must match the CPU. Fresh plans for each setting. */
static void test_conv2d_lp_matches_the_cpu_with_every_engine_timed_and_with_none(void **state) {
    (void)state;
    const char *settings[2] = {"all", "0"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(setenv("UMT_CONV_TIMING", settings[i], 1), 0);
        assert_int_equal(restart_backends(), 0);
        check_conv_shapes();
    }
    assert_int_equal(unsetenv("UMT_CONV_TIMING"), 0);
    assert_int_equal(restart_backends(), 0);
}

/* The three timed sets' outputs of one convolution on fresh plans: forward y, the data
 * gradient overwriting dx, the weight gradient into a zeroed f32 dw; their bytes, one after
 * another. */
static uint8_t *timed_outputs(const umt_conv_shape *h, pair x, pair w, pair dy, size_t *bytes) {
    assert_int_equal(restart_backends(), 0);
    size_t ws_bytes = 0;
    EXPECT_OK(gpu->f32.conv2d_workspace_bytes(h, &ws_bytes));
    void *ws = device_alloc(ws_bytes);
    dims xd = {h->n, h->c, h->h * h->w}, wd = {h->k, h->c, h->r * h->s}, yd = {h->n, h->k, h->p * h->q};
    size_t y_bytes = (size_t)numel(yd) * 2, dx_bytes = (size_t)numel(xd) * 2, dw_bytes = (size_t)numel(wd) * 4;
    void *y = device_alloc(y_bytes), *dx = device_alloc(dx_bytes);
    void *zeros = host_alloc(dw_bytes);
    memset(zeros, 0, dw_bytes);
    void *dw = to_device(zeros, dw_bytes);
    EXPECT_OK(gpu->lowp.conv2d_forward(h, x.dev, w.dev, y, ws, ws_bytes));
    EXPECT_OK(gpu->lowp.conv2d_backward_data(h, w.dev, dy.dev, dx, true, ws, ws_bytes));
    EXPECT_OK(gpu->lowp.conv2d_backward_filter(h, x.dev, dy.dev, (float *)dw, ws, ws_bytes));
    *bytes = y_bytes + dx_bytes + dw_bytes;
    uint8_t *out = host_alloc(*bytes);
    memcpy(out, from_device(y, y_bytes), y_bytes);
    memcpy(out + y_bytes, from_device(dx, dx_bytes), dx_bytes);
    memcpy(out + y_bytes + dx_bytes, from_device(dw, dw_bytes), dw_bytes);
    return out;
}

static long file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* The file at path, NUL-terminated, and its size. */
static char *read_text(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *text = host_alloc(1 << 20);
    *size = fread(text, 1, (1 << 20) - 1, f);
    text[*size] = '\0';
    fclose(f);
    return text;
}

/* Appends to the cache file at path, for each key in it, a line naming an engine no cuDNN has. */
static void spoil_cache(const char *path) {
    size_t size = 0;
    char *text = read_text(path, &size);
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    for (char *line = text; line < text + size;) {
        char *end = memchr(line, '\n', (size_t)(text + size - line)), *space = memchr(line, ' ', (size_t)(end - line));
        assert_non_null(space);
        fprintf(f, "%.*s 987654;1=2\n", (int)(space - line), line);
        line = end + 1;
    }
    assert_int_equal(fclose(f), 0);
}

/* Timed engine choices are remembered (kernels/engine_cache.h): fresh plans for MNIST's second
 * convolution at batch 512, with the default timing and an empty cache file, write a line for
 * each timed set, naming the engine by its identity (v2 keys); fresh plans again rebuild those
 * engines, time nothing (the file does not grow) and give the same bytes as the plans that
 * timed. Lines naming an engine that does not exist are passed over: the sets time again and
 * write new lines, which the next plans take. With the cache off, nothing is written. */
static void test_timed_engine_choices_are_remembered_and_taken_again(void **state) {
    (void)state;
    static const int64_t conv2[9] = {512, 32, 26, 26, 64, 3, 3, 1, 0};
    char path[] = "/tmp/umt_engine_cache_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(setenv("UMT_CONV_CACHE", path, 1), 0);
    for (int t = 0; t < 2; t++) {
        umt_conv_shape h = conv_shape(conv2);
        h.dtype = HALVES[t];
        h.nhwc = true;
        CONTEXT("engine cache, %s", umt_dtype_name(h.dtype));
        dims xd = {h.n, h.c, h.h * h.w}, wd = {h.k, h.c, h.r * h.s}, yd = {h.n, h.k, h.p * h.q};
        pair x = pair_random(h.dtype, true, xd, -1, 1), w = pair_random(h.dtype, true, wd, -1, 1);
        pair dy = pair_random(h.dtype, true, yd, -1, 1);
        long before = file_bytes(path);
        size_t bytes = 0, again_bytes = 0;
        uint8_t *timed = timed_outputs(&h, x, w, dy, &bytes);
        long written = file_bytes(path);
        if (written <= before) fail_msg("%s: the timed sets wrote nothing to %s (%ld bytes)", context, path, written);
        uint8_t *again = timed_outputs(&h, x, w, dy, &again_bytes);
        assert_int_equal(file_bytes(path), written);
        assert_int_equal(again_bytes, bytes);
        if (memcmp(timed, again, bytes) != 0) fail_msg("%s: the remembered engines gave other bytes", context);
        size_t size = 0;
        char *text = read_text(path, &size);
        if (strncmp(text, "v2/", 3) != 0) fail_msg("%s: the cache's first line is not a v2 key: %.80s", context, text);
        spoil_cache(path);
        long spoiled = file_bytes(path);
        timed_outputs(&h, x, w, dy, &again_bytes);
        long retimed = file_bytes(path);
        if (retimed <= spoiled) fail_msg("%s: unknown engines in the cache were not timed again", context);
        uint8_t *third = timed_outputs(&h, x, w, dy, &again_bytes);
        uint8_t *fourth = timed_outputs(&h, x, w, dy, &again_bytes);
        assert_int_equal(file_bytes(path), retimed);
        if (memcmp(third, fourth, bytes) != 0) fail_msg("%s: the re-remembered engines gave other bytes", context);
    }
    long full = file_bytes(path);
    assert_int_equal(setenv("UMT_CONV_CACHE", "0", 1), 0);
    assert_int_equal(unlink(path), 0);
    umt_conv_shape h = conv_shape(conv2);
    h.dtype = UMT_BF16;
    h.nhwc = true;
    dims xd = {h.n, h.c, h.h * h.w}, wd = {h.k, h.c, h.r * h.s}, yd = {h.n, h.k, h.p * h.q};
    size_t bytes = 0;
    timed_outputs(&h, pair_random(h.dtype, true, xd, -1, 1), pair_random(h.dtype, true, wd, -1, 1),
                  pair_random(h.dtype, true, yd, -1, 1), &bytes);
    assert_int_equal(file_bytes(path), -1);
    print_message("engine cache: %ld bytes of lines for the two dtypes\n", full);
    assert_int_equal(restart_backends(), 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Pooling                                                                                     */

/* Each channel plane (at most 512 pixels) holds distinct multiples of 1/64 in [-4, 4), exact in
 * bf16 and f16: no window has a tie, so the argmax is the one maximum on both sides. */
static pair distinct_input(umt_dtype dtype, bool nhwc, dims d) {
    float *values = host_alloc((size_t)numel(d) * sizeof *values);
    int32_t pool[512];
    assert_true(d.hw <= 512);
    for (int64_t plane = 0; plane < d.n * d.c; plane++) {
        for (int32_t i = 0; i < 512; i++) pool[i] = i - 256;
        for (int64_t i = 0; i < d.hw; i++) { /* a partial Fisher-Yates shuffle */
            int64_t j = i + (int64_t)(random_u32() % (uint32_t)(512 - i));
            int32_t t = pool[i];
            pool[i] = pool[j];
            pool[j] = t;
            values[plane * d.hw + i] = (float)pool[i] / 64.0f;
        }
    }
    return pair_of(values, dtype, nhwc, d);
}

static void check_max_pool(const umt_pool_shape *f, const umt_pool_shape *h, dims xd, dims yd) {
    umt_dtype dtype = h->dtype;
    pair x = distinct_input(dtype, h->nhwc, xd), y = pair_poisoned(dtype, h->nhwc, yd);
    int32_t *argmax = poison((size_t)numel(yd) * 4), *argmax_dev = to_device(argmax, (size_t)numel(yd) * 4);
    EXPECT_OK(cpu->f32.max_pool_forward(f, x.ref, y.ref, argmax));
    EXPECT_OK(gpu->lowp.max_pool_forward(h, x.dev, y.dev, argmax_dev));
    expect_exact("max_pool_forward_lp y", y);
    const int32_t *got = downloaded_nchw(argmax_dev, h->nhwc, yd, sizeof(int32_t));
    for (int64_t i = 0; i < numel(yd); i++)
        if (got[i] != argmax[i]) fail_at("max_pool_forward_lp argmax", y, i, got[i], argmax[i], "expected the same");

    pair dy = pair_random(dtype, h->nhwc, yd, -1, 1), dx = pair_random(dtype, h->nhwc, xd, -1, 1);
    float *scale = absolute(dx.ref, numel(xd));
    EXPECT_OK(cpu->f32.max_pool_backward(f, argmax, absolute(dy.ref, numel(yd)), scale));
    EXPECT_OK(cpu->f32.max_pool_backward(f, argmax, dy.ref, dx.ref));
    EXPECT_OK(gpu->lowp.max_pool_backward(h, argmax_dev, dy.dev, dx.dev));
    expect_close("max_pool_backward_lp dx", dx, scale, dtype);
}

static void check_avg_pool(const umt_pool_shape *f, const umt_pool_shape *h, dims xd, dims yd) {
    umt_dtype dtype = h->dtype;
    pair x = pair_random(dtype, h->nhwc, xd, -1, 1), y = pair_poisoned(dtype, h->nhwc, yd);
    float *y_scale = host_alloc((size_t)numel(yd) * sizeof(float));
    EXPECT_OK(cpu->f32.avg_pool_forward(f, absolute(x.ref, numel(xd)), y_scale));
    EXPECT_OK(cpu->f32.avg_pool_forward(f, x.ref, y.ref));
    EXPECT_OK(gpu->lowp.avg_pool_forward(h, x.dev, y.dev));
    expect_close("avg_pool_forward_lp y", y, y_scale, dtype);

    pair dy = pair_random(dtype, h->nhwc, yd, -1, 1), dx = pair_random(dtype, h->nhwc, xd, -1, 1);
    float *dx_scale = absolute(dx.ref, numel(xd));
    EXPECT_OK(cpu->f32.avg_pool_backward(f, absolute(dy.ref, numel(yd)), dx_scale));
    EXPECT_OK(cpu->f32.avg_pool_backward(f, dy.ref, dx.ref));
    EXPECT_OK(gpu->lowp.avg_pool_backward(h, dy.dev, dx.dev));
    expect_close("avg_pool_backward_lp dx", dx, dx_scale, dtype);
}

/* n, c, h, w, window, stride: MNIST's pool, overlapping windows with an uncovered tail, stride 1
 * (each input in up to nine windows), a single element, a window as large as the input. */
static const int64_t pool_shapes[][6] = {
    {2, 16, 12, 12, 2, 2}, {2, 5, 9, 11, 3, 2}, {2, 3, 6, 5, 3, 1}, {1, 1, 1, 1, 1, 1}, {2, 3, 5, 5, 5, 1},
    /* channels in eights (NHWC's eight-lane forward): overlapping windows with a tail, and MNIST's
     * 64 channels under a 2x2 pool (on 16x16 planes: distinct_input holds at most 512 pixels) */
    {2, 8, 7, 7, 3, 2}, {3, 64, 16, 16, 2, 2},
};

static void test_pools_match_the_cpu_in_both_layouts_through_overlapping_windows(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++) {
        for (int nhwc = 0; nhwc < 2; nhwc++) {
            for (size_t i = 0; i < sizeof pool_shapes / sizeof pool_shapes[0]; i++) {
                const int64_t *d = pool_shapes[i];
                umt_pool_shape f = {d[0], d[1], d[2], d[3], (d[2] - d[4]) / d[5] + 1, (d[3] - d[4]) / d[5] + 1,
                                    d[4], d[5], UMT_F32, false};
                umt_pool_shape h = f;
                h.dtype = HALVES[t];
                h.nhwc = nhwc;
                CONTEXT("*_pool_*_lp %s %s, x %lldx%lldx%lldx%lld, window %lld, stride %lld", umt_dtype_name(h.dtype),
                        layout_name(h.nhwc), (long long)f.n, (long long)f.c, (long long)f.h, (long long)f.w,
                        (long long)f.window, (long long)f.stride);
                dims xd = {f.n, f.c, f.h * f.w}, yd = {f.n, f.c, f.p * f.q};
                check_max_pool(&f, &h, xd, yd);
                check_avg_pool(&f, &h, xd, yd);
            }
        }
    }
}

/* Ties (five levels, -0.0 and 0.0 among them), and one value in 40 an infinity of either sign
 * or a NaN with a payload the half dtype keeps: the eight-lane pool scans windows of numbers
 * apart from windows that hold one of those (their own path). */
static pair nonfinite_input(umt_dtype dtype, bool nhwc, dims d) {
    static const float levels[] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f};
    float *values = host_alloc((size_t)numel(d) * sizeof *values);
    for (int64_t i = 0; i < numel(d); i++) {
        uint32_t roll = random_u32() % 40, bits = 0x7fc00000u | (dtype == UMT_BF16 ? (random_u32() & 0x3fu) << 16
                                                                                  : (random_u32() & 0x1ffu) << 13);
        values[i] = levels[random_u32() % 5];
        if (roll == 0) values[i] = INFINITY;
        if (roll == 1) values[i] = -INFINITY;
        if (roll == 2) memcpy(&values[i], &bits, sizeof bits);
    }
    return pair_of(values, dtype, nhwc, d);
}

/* The eight-lane max pool (NHWC, channels in eights, 2x2 windows) through infinities and NaNs:
 * plain, against the CPU bit for bit (values and argmax); with a bias, the fused forward against
 * bias_relu then the plain pool on the GPU (values, and each pick at its argmax). */
static void check_pool_through_nonfinite_values(umt_dtype dtype, const int64_t *d, bool infinite_bias) {
    umt_pool_shape f = {d[0], d[1], d[2], d[3], d[2] / 2, d[3] / 2, 2, 2, UMT_F32, false}, h = f;
    h.dtype = dtype, h.nhwc = true;
    CONTEXT("max pool %s NHWC through infinities and NaNs, x %lldx%lldx%lldx%lld%s", umt_dtype_name(dtype),
            (long long)f.n, (long long)f.c, (long long)f.h, (long long)f.w, infinite_bias ? ", an infinite bias" : "");
    dims xd = {f.n, f.c, f.h * f.w}, yd = {f.n, f.c, f.p * f.q};
    int64_t outputs = numel(yd);
    pair x = nonfinite_input(dtype, true, xd), y = pair_poisoned(dtype, true, yd);
    int32_t *argmax = poison((size_t)outputs * 4), *argmax_dev = to_device(argmax, (size_t)outputs * 4);
    EXPECT_OK(cpu->f32.max_pool_forward(&f, x.ref, y.ref, argmax));
    EXPECT_OK(gpu->lowp.max_pool_forward(&h, x.dev, y.dev, argmax_dev));
    expect_exact("max_pool_forward_lp y", y);
    const int32_t *got = downloaded_nchw(argmax_dev, true, yd, sizeof(int32_t));
    for (int64_t i = 0; i < outputs; i++)
        if (got[i] != argmax[i]) fail_at("max_pool_forward_lp argmax", y, i, got[i], argmax[i], "expected the same");

    float *bias = host_alloc((size_t)f.c * sizeof *bias);
    for (int64_t c = 0; c < f.c; c++) bias[c] = uniform(-1, 1);
    if (infinite_bias) bias[f.c / 2] = -INFINITY;
    float *bias_dev = to_device(bias, (size_t)f.c * sizeof *bias);
    size_t half = umt_dtype_size(dtype);
    void *relu = device_alloc((size_t)numel(xd) * half), *unfused = device_alloc((size_t)outputs * half);
    void *fused = device_alloc((size_t)outputs * half);
    uint8_t *pick_dev = device_alloc((size_t)outputs);
    EXPECT_OK(gpu->f32.bias_relu(dtype, true, x.dev, bias_dev, relu, f.n, f.c, f.h * f.w));
    EXPECT_OK(gpu->lowp.max_pool_forward(&h, relu, unfused, argmax_dev));
    EXPECT_OK(gpu->f32.bias_relu_max_pool_dropout_forward(&h, x.dev, bias_dev, fused, pick_dev, NULL));
    if (memcmp(from_device(unfused, (size_t)outputs * half), from_device(fused, (size_t)outputs * half),
               (size_t)outputs * half) != 0)
        fail_msg("%s: the fused forward's values differ from bias_relu then the pool's (seed %u)", context, run_seed);
    const int32_t *planes = from_device(argmax_dev, (size_t)outputs * 4);
    const uint8_t *picks = from_device(pick_dev, (size_t)outputs);
    for (int64_t o = 0; o < outputs; o++) { /* NHWC order: o = ((image * p + oy) * q + ox) * c + channel */
        int64_t pixel = o / f.c, ox = pixel % f.q, oy = pixel / f.q % f.p;
        int64_t at = (oy * 2 + picks[o] / 2) * f.w + ox * 2 + picks[o] % 2;
        if (at != planes[o])
            fail_msg("%s: output %lld picks window position %u (plane index %lld), the plain pool's argmax %d (seed "
                     "%u)", context, (long long)o, picks[o], (long long)at, planes[o], run_seed);
    }
}

static void test_the_eight_lane_pool_matches_through_infinities_and_nans(void **state) {
    (void)state;
    static const int64_t shapes[][4] = {{3, 64, 16, 16}, {2, 16, 12, 12}};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int infinite_bias = 0; infinite_bias < 2; infinite_bias++)
                check_pool_through_nonfinite_values(HALVES[t], shapes[i], infinite_bias);
}

/* ------------------------------------------------------------------------------------------ */
/* Softmax cross-entropy on half logits: the f32 slot's results on the widened logits, exactly   */

/* Whether two device buffers hold the same bytes. */
static bool same_bytes(const void *a_device, const void *b_device, size_t bytes) {
    return memcmp(from_device(a_device, bytes), from_device(b_device, bytes), bytes) == 0;
}

static void check_softmax_xent(umt_dtype dtype, int64_t rows, int64_t cols, bool fresh) {
    CONTEXT("softmax_xent_lp %s, %lld x %lld, %s", umt_dtype_name(dtype), (long long)rows, (long long)cols,
            fresh ? "fresh" : "accumulating");
    dims d = flat(rows * cols);
    pair logits = pair_random(dtype, false, d, -8, 8);
    int32_t *labels = host_alloc((size_t)rows * sizeof *labels);
    for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)(random_u32() % (uint32_t)cols);
    int32_t *labels_dev = to_device(labels, (size_t)rows * sizeof *labels);
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    /* The reference: the f32 slots on the widened logits, the gradient into zeros, recast back. */
    float *wide = to_device(logits.ref, bytes), *probs = device_alloc(bytes), *loss = device_alloc(sizeof(float));
    float *half_probs = device_alloc(bytes), *half_loss = device_alloc(sizeof(float)), one = 1.5f;
    float *dloss = to_device(&one, sizeof one), *wide_grad = to_device(poison(bytes), bytes);
    EXPECT_OK(gpu->f32.zero(wide_grad, bytes));
    EXPECT_OK(gpu->f32.softmax_xent(wide, labels_dev, probs, loss, rows, cols));
    EXPECT_OK(gpu->lowp.softmax_xent(dtype, logits.dev, labels_dev, half_probs, half_loss, rows, cols));
    if (!same_bytes(probs, half_probs, bytes) || !same_bytes(loss, half_loss, sizeof(float)))
        fail_msg("%s: probabilities or loss differ from the f32 slot's (seed %u)", context, run_seed);
    /* The half gradient before: random values added to, or poison that a fresh one overwrites. */
    size_t half_bytes = (size_t)numel(d) * umt_dtype_size(dtype);
    void *want = pair_random(dtype, false, d, -1, 1).dev;
    void *got = to_device(fresh ? poison(half_bytes) : from_device(want, half_bytes), half_bytes);
    EXPECT_OK(gpu->f32.softmax_xent_backward(probs, labels_dev, dloss, wide_grad, rows, cols));
    EXPECT_OK(gpu->lowp.recast(wide_grad, UMT_F32, false, want, dtype, false, 1, 1, numel(d), !fresh));
    EXPECT_OK(gpu->lowp.softmax_xent_backward(dtype, probs, labels_dev, dloss, got, rows, cols, fresh));
    if (!same_bytes(want, got, half_bytes))
        fail_msg("%s: the gradient differs from the f32 backward recast back (seed %u)", context, run_seed);
}

static void test_softmax_xent_on_half_logits_equals_the_f32_slots_on_their_widened_values_bit_for_bit(void **state) {
    (void)state;
    /* 10 columns (a warp a row) and 33 (a block a row); 64 and 4099 rows */
    static const int64_t shapes[][2] = {{64, 10}, {4099, 10}, {70, 33}};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int fresh = 0; fresh < 2; fresh++) check_softmax_xent(HALVES[t], shapes[i][0], shapes[i][1], fresh);
}

/* ------------------------------------------------------------------------------------------ */

/* A batch gathered straight into bf16/f16 NHWC images is the f32 gather cast by recast (what a
 * first layer does to it), bit for bit, and its labels are the f32 gather's: one channel (MNIST)
 * and three, odd sizes, repeated samples. */
static void test_half_gather_equals_the_f32_gather_cast_bit_for_bit(void **state) {
    (void)state;
    enum { SAMPLES = 40 };
    /* count, c, hw */
    static const int64_t shapes[][3] = {{1, 1, 1}, {64, 1, 784}, {301, 1, 784}, {5, 3, 1025}, {3, 2, 65537}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t count = shapes[s][0], c = shapes[s][1], hw = shapes[s][2], numel = c * hw;
        uint8_t *pixels = host_alloc((size_t)(SAMPLES * numel)), *classes = host_alloc(SAMPLES);
        int64_t *indices = host_alloc((size_t)count * sizeof *indices);
        for (int64_t i = 0; i < SAMPLES * numel; i++) pixels[i] = (uint8_t)random_u32();
        for (int64_t i = 0; i < SAMPLES; i++) classes[i] = (uint8_t)(random_u32() % 10);
        for (int64_t i = 0; i < count; i++) indices[i] = (int64_t)(random_u32() % SAMPLES);
        void *samples = to_device(pixels, (size_t)(SAMPLES * numel)), *labels = to_device(classes, SAMPLES);
        void *index = to_device(indices, (size_t)count * sizeof *indices);
        size_t half_bytes = (size_t)(count * numel) * 2, label_bytes = (size_t)count * sizeof(int32_t);
        float *wide = device_alloc((size_t)(count * numel) * sizeof(float));
        void *wide_labels = device_alloc(label_bytes);
        EXPECT_OK(gpu->f32.gather_batch(samples, labels, index, count, numel, 0.1307f, 0.3081f, wide, wide_labels));
        for (int t = 0; t < 2; t++) {
            CONTEXT("gather_batch %s, %lld images of %lld x %lld", umt_dtype_name(HALVES[t]), (long long)count,
                    (long long)c, (long long)hw);
            void *cast = device_alloc(half_bytes), *gathered = device_alloc(half_bytes);
            void *half_labels = device_alloc(label_bytes);
            EXPECT_OK(gpu->lowp.recast(wide, UMT_F32, false, cast, HALVES[t], true, count, c, hw, false));
            EXPECT_OK(gpu->lowp.gather_batch(HALVES[t], samples, labels, index, count, c, hw, 0.1307f, 0.3081f,
                                             gathered, half_labels));
            if (memcmp(from_device(cast, half_bytes), from_device(gathered, half_bytes), half_bytes) != 0)
                fail_msg("%s: the images differ from the cast f32 gather", context);
            if (memcmp(from_device(wide_labels, label_bytes), from_device(half_labels, label_bytes), label_bytes) != 0)
                fail_msg("%s: the labels differ from the f32 gather's", context);
        }
    }
    assert_int_equal(gpu->lowp.gather_batch(UMT_F32, NULL, NULL, NULL, 1, 1, 1, 0.0f, 1.0f, NULL, NULL),
                     UMT_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST(test_zero_clears_exactly_the_bytes_asked_for),
        TEST(test_recast_converts_moves_and_accumulates_every_element_bit_for_bit),
        TEST(test_recast_round_trip_equals_the_cpu_rounding),
        TEST(test_gemm_lp_matches_the_cpu_for_every_transpose_output_dtype_and_beta),
        TEST(test_row_bias_kernels_match_the_cpu),
        TEST(test_channel_bias_kernels_match_the_cpu_in_both_layouts),
        TEST(test_relu_matches_the_cpu_exactly_and_its_backward_within_tolerance),
        TEST(test_dropout_keeps_the_cpus_elements_and_scales_them_within_tolerance),
        TEST(test_conv2d_lp_and_its_backwards_match_the_cpu_within_tolerance_of_the_sum_of_terms),
        TEST(test_conv2d_lp_matches_the_cpu_with_every_engine_timed_and_with_none),
        TEST(test_timed_engine_choices_are_remembered_and_taken_again),
        TEST(test_pools_match_the_cpu_in_both_layouts_through_overlapping_windows),
        TEST(test_the_eight_lane_pool_matches_through_infinities_and_nans),
        TEST(test_softmax_xent_on_half_logits_equals_the_f32_slots_on_their_widened_values_bit_for_bit),
        TEST(test_half_gather_equals_the_f32_gather_cast_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, start_backends, stop_backends);
}
