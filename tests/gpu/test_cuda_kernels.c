/*
 * tests/gpu/test_cuda_kernels.c — every slot of the CUDA backend against the CPU reference
 * (kernels/cpu/), on fresh random inputs: each kernel runs once through the CPU table on host
 * buffers and once through the CUDA table on device copies of the same values.
 *
 * Outputs start poisoned (0xFF bytes: NaN for floats, -1 for integers) on both sides, so an
 * element a kernel forgets to write fails; outputs of accumulating kernels start from random
 * values instead. Conversions, batch gathering, labels and counts must match exactly; floats
 * within 1e-5 relative, and GEMM and reductions within 1e-5 of the sum of |terms| (+ 1e-6).
 *
 * The seed is printed once; UMT_TEST_SEED=<seed> repeats a run. Needs a GPU (tag "gpu"):
 *     bazel test --config=cuda //tests/gpu:test_cuda_kernels
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

/* ------------------------------------------------------------------------------------------ */
/* Buffers beyond tests/gpu/kernel_twins.h                                                     */

static twin twin_labels(int64_t rows, int64_t cols) {
    int32_t *labels = host_alloc((size_t)rows * sizeof *labels);
    for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)(random_u32() % (uint32_t)cols);
    return twin_of(labels, (size_t)rows * sizeof *labels);
}

/* D names the device side as float (a kernel's output read back by hand). */
#define D(t) ((float *)(t).device)

/* CUDA result (device side) against CPU result (host side): |gpu - cpu| <= 1e-5 * scale + floor
 * with scale[i], or |cpu| when scale is NULL. A NaN on either side fails: inputs are finite. */
static void expect_close(const char *what, twin t, const double *scale, double floor) {
    const float *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes / sizeof(float); i++) {
        double bound = 1e-5 * (scale ? scale[i] : fabs(want[i])) + floor;
        if (isnan(got[i]) || isnan(want[i]) || !(fabs((double)got[i] - want[i]) <= bound)) {
            fail_msg("%s[%zu]: cuda %.9g, cpu %.9g (bound %.3g, seed %u)", what, i, got[i], want[i], bound, run_seed);
        }
    }
}

/* CUDA result against exact values (sums taken in double): |gpu - exact| <= 1e-5 * scale[i] +
 * floor, for a reduction long enough that the CPU reference's own float rounding matters (the
 * CPU's result is printed beside it). */
static void expect_near_exact(const char *what, twin t, const double *exact, const double *scale, double floor) {
    const float *cpu = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes / sizeof(float); i++) {
        double bound = 1e-5 * scale[i] + floor;
        if (!(fabs((double)got[i] - exact[i]) <= bound)) {
            fail_msg("%s[%zu]: cuda %.9g, cpu %.9g, exact %.9g (bound %.3g, seed %u)", what, i, got[i], cpu[i],
                     exact[i], bound, run_seed);
        }
    }
}

static void expect_same_bytes(const char *what, twin t) {
    const uint8_t *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes; i++) {
        if (got[i] != want[i]) {
            fail_msg("%s: byte %zu: cuda %02x, cpu %02x (seed %u)", what, i, got[i], want[i], run_seed);
        }
    }
}

static const int64_t sizes[] = {1, 7, 1000, 65537};
#define SIZE_COUNT (sizeof sizes / sizeof sizes[0])

/* ------------------------------------------------------------------------------------------ */
/* The backend                                                                                 */

static void test_every_slot_of_the_cuda_table_is_filled(void **state) {
    (void)state;
    assert_string_equal(gpu->name, "cuda");
    /* Every member after the name is a function pointer, in all four groups (the CUDA table
     * fills the reference, low precision, the fused paths and the streams): walk them all, slots added later
     * too. */
    for (size_t at = offsetof(umt_backend, f32); at < sizeof *gpu; at += sizeof gpu->f32.fill) {
        void (*slot)(void);
        memcpy(&slot, (const char *)gpu + at, sizeof slot);
        if (!slot) fail_msg("the cuda table's slot at byte offset %zu is NULL", at);
    }
}

/* Several contexts in one process: a second state has its own stream and scratch, computes
 * while it is bound, and the first works on after the second is gone. */
static void test_a_second_state_has_its_own_stream_and_the_first_keeps_working(void **state) {
    (void)state;
    cudaStream_t first = umt_cuda_stream();
    size_t bytes = (size_t)32 << 20;
    umt_cuda_state *second = NULL;
    EXPECT_OK(umt_cuda_state_create(0, device_alloc(bytes), bytes, false, device_alloc(umt_cuda_scratch_bytes()),
                                    umt_cuda_scratch_bytes(), &second));
    assert_non_null(umt_cuda_stream());
    assert_ptr_not_equal(umt_cuda_stream(), first);
    twin x = twin_random(4096, -1, 1), mean = twin_poisoned(sizeof(float));
    EXPECT_OK(gpu->f32.mean(x.device, mean.device, 4096));
    EXPECT_OK(umt_cuda_synchronize());
    umt_cuda_state_destroy(second);
    umt_cuda_bind(twin_backend_state());
    assert_ptr_equal(umt_cuda_stream(), first);
    twin again = twin_poisoned(sizeof(float));
    EXPECT_OK(gpu->f32.mean(x.device, again.device, 4096));
    EXPECT_OK(umt_cuda_synchronize());
    assert_memory_equal(downloaded(mean), downloaded(again), sizeof(float));
}

/* ------------------------------------------------------------------------------------------ */
/* Memory                                                                                      */

static void test_fill_copy_upload_and_download_match_the_cpu(void **state) {
    (void)state;
    for (size_t s = 0; s < SIZE_COUNT; s++) {
        int64_t n = sizes[s];
        size_t bytes = (size_t)n * sizeof(float);
        twin filled = twin_poisoned(bytes), source = twin_random(n, -1, 1), copied = twin_poisoned(bytes);
        float value = uniform(-1, 1);
        BOTH(fill(P(filled), n, value));
        expect_same_bytes("fill", filled);
        BOTH(copy(P(copied), P(source), bytes));
        expect_same_bytes("copy", copied);
        /* upload then download through the backend: the host buffers are usable on return. */
        twin round_trip = twin_poisoned(bytes);
        EXPECT_OK(gpu->f32.upload(round_trip.device, source.host, bytes));
        float *back = host_alloc(bytes);
        EXPECT_OK(gpu->f32.download(back, round_trip.device, bytes));
        assert_memory_equal(back, source.host, bytes);
    }
}

/* 40 blocks of one random buffer, of the sizes above in turn with gaps of at least 3 floats
 * between them: more than one launch's list (32), and every float outside the blocks must keep
 * its value. Every third block starts on 16 bytes (the kernel's four-word stores, then the rest
 * word by word; each size comes up there), the others wherever the gaps leave them. */
static void test_zero_many_zeroes_forty_blocks_as_the_cpu_and_nothing_beside_them(void **state) {
    (void)state;
    enum { BLOCKS = 40, GAP = 3 };
    size_t offsets[BLOCKS], bytes[BLOCKS], total = 0;
    for (int b = 0; b < BLOCKS; b++) {
        offsets[b] = total + GAP;
        if (b % 3 == 0) offsets[b] = (offsets[b] + 3) / 4 * 4; /* the buffer itself starts on 16 bytes */
        bytes[b] = (size_t)sizes[b % SIZE_COUNT] * sizeof(float);
        total = offsets[b] + bytes[b] / sizeof(float);
    }
    twin buffer = twin_random((int64_t)total + GAP, -1, 1);
    void *host_blocks[BLOCKS], *device_blocks[BLOCKS];
    for (int b = 0; b < BLOCKS; b++) {
        host_blocks[b] = (float *)buffer.host + offsets[b];
        device_blocks[b] = (float *)buffer.device + offsets[b];
    }
    assert_true((uintptr_t)device_blocks[3] % 16 == 0 && (uintptr_t)device_blocks[2] % 16 != 0);
    float before = ((float *)buffer.host)[offsets[1] - 1];
    EXPECT_OK(cpu->f32.zero_many(BLOCKS, host_blocks, bytes));
    EXPECT_OK(gpu->f32.zero_many(BLOCKS, device_blocks, bytes));
    expect_same_bytes("zero_many", buffer);
    assert_true(((float *)buffer.host)[offsets[1]] == 0.0f && ((float *)buffer.host)[offsets[1] - 1] == before);
    size_t odd = 6;
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, zero_many(1, on_device ? device_blocks : host_blocks, &odd));
}

/* f32 sources: special values first (ties, overflow, subnormals, NaN payloads), then random
 * bit patterns, which cover every class. 16-bit sources: every pattern. */
static twin conversion_source(umt_dtype dtype, int64_t n) {
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu,
        0x00000001u, 0x807fffffu, 0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x7f7fffffu, 0x477fefffu,
        0x477ff000u, 0x477fe000u, 0x33800000u, 0x33000000u, 0x33400000u, 0x38800000u, 0x387fc000u, 0x38801000u};
    if (dtype == UMT_F32) {
        uint32_t *bits = host_alloc((size_t)n * sizeof *bits);
        size_t special_count = sizeof specials / sizeof *specials;
        for (int64_t i = 0; i < n; i++) bits[i] = (size_t)i < special_count ? specials[i] : random_u32();
        return twin_of(bits, (size_t)n * sizeof *bits);
    }
    uint16_t *bits = host_alloc((size_t)n * sizeof *bits);
    for (int64_t i = 0; i < n; i++) bits[i] = (uint16_t)(i * 40503u); /* 40503 is odd: every pattern in 65536 */
    return twin_of(bits, (size_t)n * sizeof *bits);
}

static void test_convert_matches_the_cpu_bit_for_bit_between_every_pair_of_dtypes(void **state) {
    (void)state;
    static const umt_dtype dtypes[] = {UMT_F32, UMT_BF16, UMT_F16};
    static const char *const names[] = {"f32", "bf16", "f16"};
    for (size_t s = 0; s < SIZE_COUNT; s++) {
        for (int from = 0; from < 3; from++) {
            for (int to = 0; to < 3; to++) {
                int64_t n = sizes[s];
                twin src = conversion_source(dtypes[from], n);
                twin dst = twin_poisoned((size_t)n * (dtypes[to] == UMT_F32 ? 4 : 2));
                BOTH(convert(P(src), dtypes[from], P(dst), dtypes[to], n));
                char what[64];
                snprintf(what, sizeof what, "convert %s -> %s, n=%lld", names[from], names[to], (long long)n);
                expect_same_bytes(what, dst);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM                                                                                        */

/* One case with padded strides (the padding must stay untouched); C starts as NaN when beta is
 * 0, random otherwise. Element (i, j) is checked against 1e-5 * (|alpha| sum_p |a_ip b_pj| +
 * |beta c_ij|) + 1e-6. */
static void check_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, float beta) {
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = n + 7;
    twin a = twin_random(a_rows * lda, -1, 1), b = twin_random(b_rows * ldb, -1, 1);
    float *c0 = host_alloc((size_t)(m * ldc) * sizeof *c0);
    for (int64_t i = 0; i < m * ldc; i++) c0[i] = beta == 0.0f && i % ldc < n ? NAN : uniform(-1, 1);
    twin c = twin_of(c0, (size_t)(m * ldc) * sizeof *c0);
    BOTH(gemm(ta, tb, m, n, k, alpha, P(a), lda, P(b), ldb, beta, P(c), ldc));
    const float *got = downloaded(c);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < ldc; j++) {
            int64_t at = i * ldc + j;
            if (j >= n) { /* not C's: untouched */
                assert_memory_equal(&got[at], &c0[at], sizeof *got);
                continue;
            }
            double scale = beta == 0.0f ? 0.0 : fabs(beta * (double)c0[at]);
            for (int64_t p = 0; p < k; p++) {
                double av = ta ? F(a)[p * lda + i] : F(a)[i * lda + p];
                scale += fabs(alpha * av * (tb ? F(b)[j * ldb + p] : F(b)[p * ldb + j]));
            }
            double want = F(c)[at], bound = 1e-5 * scale + 1e-6;
            if (isnan(got[at]) || !(fabs(got[at] - want) <= bound)) {
                fail_msg("gemm ta=%d tb=%d %lldx%lldx%lld alpha=%g beta=%g: C[%lld,%lld] cuda %.9g, cpu %.9g (seed %u)",
                         ta, tb, (long long)m, (long long)n, (long long)k, alpha, beta, (long long)i, (long long)j,
                         got[at], want, run_seed);
            }
        }
    }
}

static void test_gemm_matches_the_cpu_for_all_transposes_sizes_and_padded_strides(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{1, 1, 1}, {65, 33, 129}, {512, 384, 256}};
    static const float alpha_beta[][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, -2.0f}};
    for (size_t s = 0; s < 3; s++) {
        for (int trans = 0; trans < 4; trans++) {
            for (size_t ab = 0; ab < 3; ab++) {
                check_gemm(trans & 1, trans >> 1, shapes[s][0], shapes[s][1], shapes[s][2], alpha_beta[ab][0],
                           alpha_beta[ab][1]);
            }
        }
    }
}

static void test_gemm_with_beta_0_writes_no_nan_into_a_nan_filled_c(void **state) {
    (void)state;
    enum { M = 96, N = 80, K = 70 };
    twin a = twin_random(M * K, -1, 1), b = twin_random(K * N, -1, 1), c = twin_poisoned(M * N * sizeof(float));
    EXPECT_OK(gpu->f32.gemm(false, false, M, N, K, 1.0f, D(a), K, D(b), N, 0.0f, D(c), N));
    const float *got = downloaded(c);
    for (int i = 0; i < M * N; i++) {
        if (isnan(got[i])) fail_msg("C[%d] is NaN: beta = 0 must not read C", i);
    }
}

static void test_gemm_with_k_0_or_alpha_0_sets_c_to_beta_c_without_reading_a_or_b(void **state) {
    (void)state;
    enum { M = 5, N = 9 };
    twin c = twin_random(M * N, -1, 1), nans = twin_poisoned(M * N * sizeof(float));
    BOTH(gemm(false, false, M, N, 0, 1.0f, NULL, 0, NULL, N, 0.5f, P(c), N));
    expect_same_bytes("gemm k=0 beta=0.5", c);
    BOTH(gemm(true, true, M, N, M, 0.0f, P(nans), M, P(nans), M, -3.0f, P(c), N));
    expect_same_bytes("gemm alpha=0 beta=-3", c);
    BOTH(gemm(false, false, M, N, 0, 1.0f, NULL, 0, NULL, N, 0.0f, P(nans), N));
    expect_same_bytes("gemm k=0 beta=0 over NaN", nans);
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise                                                                                 */

static void test_elementwise_kernels_match_the_cpu_and_accumulate_into_their_output(void **state) {
    (void)state;
    for (size_t s = 0; s < SIZE_COUNT; s++) {
        int64_t n = sizes[s];
        size_t bytes = (size_t)n * sizeof(float);
        twin a = twin_random(n, -1, 1), b = twin_random(n, -1, 1), out = twin_poisoned(bytes);
        BOTH(add(P(a), P(b), P(out), n));
        expect_close("add", out, NULL, 0.0);
        BOTH(mul(P(a), P(b), P(out), n));
        expect_close("mul", out, NULL, 0.0);
        twin relu = twin_poisoned(bytes);
        BOTH(relu(P(a), P(relu), n));
        expect_close("relu", relu, NULL, 0.0);
        twin acc = twin_random(n, -1, 1);
        BOTH(accumulate(P(acc), P(a), -0.75f, n));
        expect_close("accumulate", acc, NULL, 0.0);
        BOTH(accumulate_product(P(acc), P(a), P(b), n));
        expect_close("accumulate_product", acc, NULL, 0.0);
        twin last = twin_poisoned(bytes);
        BOTH(keep_and_add(P(last), P(acc), P(b), n));
        expect_close("keep_and_add last", last, NULL, 0.0);
        expect_close("keep_and_add sum", acc, NULL, 0.0);
        /* relu's output (exact zeros included) decides where dy passes. */
        twin dx = twin_random(n, -1, 1);
        BOTH(relu_backward(P(relu), P(b), P(dx), n));
        expect_close("relu_backward", dx, NULL, 0.0);
    }
}

static void test_bias_row_kernels_match_the_cpu_in_place_and_accumulating(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {7, 13}, {1000, 10}, {65537, 1}, {2, 65537}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1];
        twin x = twin_random(rows * cols, -1, 1), bias = twin_random(cols, -1, 1);
        twin out = twin_poisoned((size_t)(rows * cols) * sizeof(float));
        BOTH(add_rows(P(x), P(bias), P(out), rows, cols));
        expect_close("add_rows", out, NULL, 0.0);
        BOTH(add_rows(P(x), P(bias), P(x), rows, cols));
        expect_close("add_rows in place", x, NULL, 0.0);
        /* dbias starts random: sum_rows adds to it. A column of 65,537 rows is held to its exact
         * sum (in double), not to the CPU's: the reference adds one float at a time, and its own
         * rounding can reach the bound (seed 1795567851: 0.57 from the exact sum, against a bound
         * of 0.574, while the GPU's tree of partial sums was 0.03 from it). */
        double *scale = host_alloc((size_t)cols * sizeof *scale), *exact = host_alloc((size_t)cols * sizeof *exact);
        for (int64_t c = 0; c < cols; c++) {
            scale[c] = fabs(F(bias)[c]);
            exact[c] = F(bias)[c];
            for (int64_t r = 0; r < rows; r++) {
                scale[c] += fabs(F(x)[r * cols + c]);
                exact[c] += F(x)[r * cols + c];
            }
        }
        BOTH(sum_rows(P(x), P(bias), rows, cols));
        expect_near_exact("sum_rows", bias, exact, scale, 1e-6);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions and losses                                                                       */

static void test_mean_and_its_backward_match_the_cpu(void **state) {
    (void)state;
    for (size_t s = 0; s < SIZE_COUNT; s++) {
        int64_t n = sizes[s];
        twin x = twin_random(n, -1, 1), out = twin_poisoned(sizeof(float)), dout = twin_random(1, -2, 2);
        double scale = 0.0;
        for (int64_t i = 0; i < n; i++) scale += fabs(F(x)[i]) / (double)n;
        BOTH(mean(P(x), P(out), n));
        expect_close("mean", out, &scale, 1e-6);
        BOTH(mean_backward(P(dout), P(x), n));
        expect_close("mean_backward", x, NULL, 0.0);
    }
}

/* softmax_xent takes a row of at most 32 columns by a warp, eight groups of rows a block (32 and
 * 33 on either side; 3 rows: one block with three groups; 9000 rows: 1024 groups of 8 or 9 rows,
 * each group's sum a partial of the loss), longer ones by the block. */
static const int64_t softmax_shapes[][2] = {{1, 1}, {3, 10}, {512, 10}, {9000, 10}, {100, 32}, {100, 33},
                                            {64, 1000}, {2, 65537}};
#define SOFTMAX_SHAPE_COUNT (sizeof softmax_shapes / sizeof softmax_shapes[0])

/* The classifier's pipeline: log_softmax, then nll_loss on its (CPU) output, then both backwards. */
static void test_log_softmax_and_nll_loss_and_their_backwards_match_the_cpu(void **state) {
    (void)state;
    for (size_t s = 0; s < SOFTMAX_SHAPE_COUNT; s++) {
        int64_t rows = softmax_shapes[s][0], cols = softmax_shapes[s][1], n = rows * cols;
        size_t bytes = (size_t)n * sizeof(float);
        twin x = twin_random(n, -8, 8), y = twin_poisoned(bytes), labels = twin_labels(rows, cols);
        BOTH(log_softmax(P(x), P(y), rows, cols));
        expect_close("log_softmax", y, NULL, 1e-6);
        /* Both sides continue from the CPU's y, so each kernel is compared on its own. */
        twin logp = twin_of(F(y), bytes), loss = twin_poisoned(sizeof(float));
        double scale = 0.0;
        for (int64_t r = 0; r < rows; r++) scale += fabs(F(logp)[r * cols + L(labels)[r]]) / (double)rows;
        BOTH(nll_loss(P(logp), P(labels), P(loss), rows, cols));
        expect_close("nll_loss", loss, &scale, 1e-6);
        twin dloss = twin_random(1, -2, 2), dlogp = twin_random(n, -1, 1), dx = twin_random(n, -1, 1);
        BOTH(nll_loss_backward(P(dloss), P(labels), P(dlogp), rows, cols));
        expect_close("nll_loss_backward", dlogp, NULL, 0.0);
        BOTH(log_softmax_backward(P(logp), P(dlogp), P(dx), rows, cols));
        expect_close("log_softmax_backward", dx, NULL, 1e-6);
    }
}

static void test_softmax_xent_and_its_backward_match_the_cpu(void **state) {
    (void)state;
    for (size_t s = 0; s < SOFTMAX_SHAPE_COUNT; s++) {
        int64_t rows = softmax_shapes[s][0], cols = softmax_shapes[s][1], n = rows * cols;
        twin logits = twin_random(n, -8, 8), labels = twin_labels(rows, cols);
        twin probs = twin_poisoned((size_t)n * sizeof(float)), loss = twin_poisoned(sizeof(float));
        BOTH(softmax_xent(P(logits), P(labels), P(probs), P(loss), rows, cols));
        expect_close("softmax_xent probs", probs, NULL, 1e-6);
        /* Every row's term log_sum - (x_label - max) is >= 0: the loss is the mean of |terms|. */
        double scale = fabs(F(loss)[0]);
        expect_close("softmax_xent loss", loss, &scale, 1e-6);
        twin saved_probs = twin_of(F(probs), (size_t)n * sizeof(float));
        twin dloss = twin_random(1, -2, 2), dlogits = twin_random(n, -1, 1);
        BOTH(softmax_xent_backward(P(saved_probs), P(labels), P(dloss), P(dlogits), rows, cols));
        expect_close("softmax_xent_backward", dlogits, NULL, 0.0);
    }
}

static void test_count_correct_matches_the_cpu_and_breaks_ties_towards_the_lowest_index(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{1, 1}, {3, 10}, {512, 10}, {64, 1000}, {1000, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1];
        twin scores = twin_random(rows * cols, -1, 1), labels = twin_labels(rows, cols);
        /* Every third row is a tie of 1.0 at columns 0 and cols-1, labelled 0 on even rows (a hit)
         * and cols-1 on odd ones (a miss unless cols is 1); the rest are random. */
        for (int64_t r = 0; r < rows; r += 3) {
            F(scores)[r * cols] = F(scores)[r * cols + cols - 1] = 1.0f;
            L(labels)[r] = r % 2 == 0 ? 0 : (int32_t)(cols - 1);
        }
        scores = twin_of(scores.host, scores.bytes);
        labels = twin_of(labels.host, labels.bytes);
        int64_t counts[2] = {-1, -1}; /* [0] the CPU's, [1] CUDA's */
        BOTH(count_correct(P(scores), P(labels), rows, cols, &counts[on_device]));
        assert_true(counts[0] >= (rows + 5) / 6); /* the tie hits alone */
        assert_int_equal(counts[1], counts[0]);
    }
}

/* Rows 2 and 4 of 6 are out of range (10 and -1 of 10 classes): every slot that takes labels
 * must fail as the CPU does (the losses at the next wait), naming row 2 and its label, and
 * leave its outputs (and the count) as they were: equal to the CPU's, which it never touched. */
static void test_out_of_range_labels_fail_like_the_cpu_and_leave_outputs_untouched(void **state) {
    (void)state;
    const int32_t bad[6] = {1, 9, 10, 0, -1, 3};
    twin labels = twin_of(bad, sizeof bad), x = twin_random(60, -1, 1), out = twin_random(60, -1, 1);
    twin scalar = twin_random(1, -1, 1);
    int64_t counts[2] = {-7, -7};
    SAME_DEFERRED_FAILURE(UMT_ERR_INVALID_ARGUMENT, nll_loss(P(x), P(labels), P(scalar), 6, 10));
    SAME_DEFERRED_FAILURE(UMT_ERR_INVALID_ARGUMENT, nll_loss_backward(P(scalar), P(labels), P(out), 6, 10));
    SAME_DEFERRED_FAILURE(UMT_ERR_INVALID_ARGUMENT, softmax_xent(P(x), P(labels), P(out), P(scalar), 6, 10));
    SAME_DEFERRED_FAILURE(UMT_ERR_INVALID_ARGUMENT, softmax_xent_backward(P(x), P(labels), P(scalar), P(out), 6, 10));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, count_correct(P(x), P(labels), 6, 10, &counts[on_device]));
    assert_non_null(strstr(umt_last_error(), "count_correct: row 2 has label 10, expected 0 <= label < 10"));
    expect_same_bytes("outputs after refused calls", out);
    expect_same_bytes("loss after refused calls", scalar);
    assert_int_equal(counts[1], -7);
}

/* ------------------------------------------------------------------------------------------ */
/* Data                                                                                        */

static void test_gather_batch_matches_the_cpu_bit_for_bit(void **state) {
    (void)state;
    enum { SAMPLES = 50 };
    /* count, sample_numel: whole 16-pixel vectors (784 = 49: five images a block; 16: 256 a block;
     * 4096 = 256: one) go a vector a thread, the rest a pixel a thread. */
    static const int64_t shapes[][2] = {{1, 1}, {7, 7}, {64, 784}, {1000, 16}, {5, 4096}, {3, 65537}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t count = shapes[s][0], numel = shapes[s][1];
        uint8_t *pixels = host_alloc((size_t)(SAMPLES * numel)), *classes = host_alloc(SAMPLES);
        int64_t *indices = host_alloc((size_t)count * sizeof *indices);
        for (int64_t i = 0; i < SAMPLES * numel; i++) pixels[i] = (uint8_t)random_u32();
        for (int64_t i = 0; i < SAMPLES; i++) classes[i] = (uint8_t)(random_u32() % 10);
        for (int64_t i = 0; i < count; i++) indices[i] = (int64_t)(random_u32() % SAMPLES);
        twin samples = twin_of(pixels, (size_t)(SAMPLES * numel)), labels = twin_of(classes, SAMPLES);
        twin index = twin_of(indices, (size_t)count * sizeof *indices);
        twin images = twin_poisoned((size_t)(count * numel) * sizeof(float));
        twin labels_out = twin_poisoned((size_t)count * sizeof(int32_t));
        BOTH(gather_batch(P(samples), P(labels), P(index), count, numel, 0.1307f, 0.3081f, P(images), P(labels_out)));
        expect_same_bytes("gather_batch images", images);
        expect_same_bytes("gather_batch labels", labels_out);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Optimizers: three steps each, every buffer (parameters and state) compared after them.      */

static void test_optimizer_updates_match_the_cpu_over_three_steps(void **state) {
    (void)state;
    for (size_t s = 0; s < SIZE_COUNT; s++) {
        int64_t n = sizes[s];
        twin grad = twin_random(n, -1, 1), p_sgd = twin_random(n, -1, 1), velocity = twin_random(n, -1, 1);
        twin p_plain = twin_random(n, -1, 1), p_adam = twin_random(n, -1, 1), m = twin_random(n, -1, 1);
        twin v = twin_random(n, 0, 1), p_adamw = twin_random(n, -1, 1), m_w = twin_random(n, -1, 1);
        twin v_w = twin_random(n, 0, 1), p_delta = twin_random(n, -1, 1), square_avg = twin_random(n, 0, 1);
        twin delta_avg = twin_random(n, 0, 1);
        for (int64_t step = 1; step <= 3; step++) {
            BOTH(sgd_update(P(p_sgd), P(grad), P(velocity), n, 0.1f, 0.9f, 1e-2f));
            BOTH(sgd_update(P(p_plain), P(grad), NULL, n, 0.1f, 0.0f, 1e-2f));
            BOTH(adam_update(P(p_adam), P(grad), P(m), P(v), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, false, step));
            BOTH(adam_update(P(p_adamw), P(grad), P(m_w), P(v_w), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, true, step));
            BOTH(adadelta_update(P(p_delta), P(grad), P(square_avg), P(delta_avg), n, 1.0f, 0.9f, 1e-6f, 1e-2f));
        }
        const twin results[] = {p_sgd,   velocity, p_plain, p_adam,     m,         v,
                                p_adamw, m_w,      v_w,     p_delta, square_avg, delta_avg};
        static const char *const names[] = {"sgd param", "sgd velocity", "sgd (no momentum) param", "adam param",
                                            "adam m", "adam v", "adamw param", "adamw m", "adamw v", "adadelta param",
                                            "adadelta square_avg", "adadelta delta_avg"};
        for (size_t i = 0; i < sizeof results / sizeof results[0]; i++) expect_close(names[i], results[i], NULL, 0.0);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Argument errors                                                                             */

/* The arguments are refused before any pointer is used, so host scalars stand in for buffers. */
static void test_bad_arguments_fail_with_the_cpu_status_and_message(void **state) {
    (void)state;
    float x[16] = {0};
    SAME_FAILURE(UMT_ERR_UNSUPPORTED, convert(x, UMT_I32, x, UMT_F32, 1));
    SAME_FAILURE(UMT_ERR_UNSUPPORTED, convert(x, UMT_F16, x, UMT_U8, 1));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, convert(x, UMT_F32, x, UMT_F16, -1));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, gemm(false, false, -1, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, gemm(false, false, 2, 2, 3, 1.0f, x, 2, x, 2, 0.0f, x, 2));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, gemm(false, true, 2, 2, 3, 1.0f, x, 3, x, 2, 0.0f, x, 2));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, gemm(true, false, 3, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 1));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, sgd_update(x, x, NULL, 1, 0.1f, 0.9f, 0.0f));
    SAME_FAILURE(UMT_ERR_INVALID_ARGUMENT, adam_update(x, x, x, x, 1, 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f, false, 0));
}

/* ------------------------------------------------------------------------------------------ */

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST(test_every_slot_of_the_cuda_table_is_filled),
        TEST(test_a_second_state_has_its_own_stream_and_the_first_keeps_working),
        TEST(test_fill_copy_upload_and_download_match_the_cpu),
        TEST(test_zero_many_zeroes_forty_blocks_as_the_cpu_and_nothing_beside_them),
        TEST(test_convert_matches_the_cpu_bit_for_bit_between_every_pair_of_dtypes),
        TEST(test_gemm_matches_the_cpu_for_all_transposes_sizes_and_padded_strides),
        TEST(test_gemm_with_beta_0_writes_no_nan_into_a_nan_filled_c),
        TEST(test_gemm_with_k_0_or_alpha_0_sets_c_to_beta_c_without_reading_a_or_b),
        TEST(test_elementwise_kernels_match_the_cpu_and_accumulate_into_their_output),
        TEST(test_bias_row_kernels_match_the_cpu_in_place_and_accumulating),
        TEST(test_mean_and_its_backward_match_the_cpu),
        TEST(test_log_softmax_and_nll_loss_and_their_backwards_match_the_cpu),
        TEST(test_softmax_xent_and_its_backward_match_the_cpu),
        TEST(test_count_correct_matches_the_cpu_and_breaks_ties_towards_the_lowest_index),
        TEST(test_out_of_range_labels_fail_like_the_cpu_and_leave_outputs_untouched),
        TEST(test_gather_batch_matches_the_cpu_bit_for_bit),
        TEST(test_optimizer_updates_match_the_cpu_over_three_steps),
        TEST(test_bad_arguments_fail_with_the_cpu_status_and_message),
    };
    return cmocka_run_group_tests(tests, start_backends, stop_backends);
}
