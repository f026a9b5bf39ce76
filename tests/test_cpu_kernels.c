/*
 * tests/test_cpu_kernels.c — the CPU reference kernels against double-precision references and
 * hand-derived formulas: GEMM (every transpose, odd sizes, strides, alpha/beta), elementwise
 * kernels and their accumulate semantics, losses, fill/copy and the backend table. Also prints
 * the single-core GEMM throughput (not asserted: machines differ). The dtype conversions are
 * tested in tests/test_cpu_convert.c.
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

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "umtrain.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers: a fixed-seed LCG, and a relative comparison that says which element failed.        */

static uint32_t lcg_state;

static void lcg_seed(uint32_t seed) { lcg_state = seed; }

/* Uniform in [-1, 1) from the top 24 bits of a 32-bit LCG (Numerical Recipes constants). */
static float lcg_uniform(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)(lcg_state >> 8) / (float)(1u << 23) - 1.0f;
}

static float *random_floats(size_t n) {
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = lcg_uniform();
    return x;
}

/* |got - want| <= tolerance * max(1, |want|), reporting the element index on failure. */
static void assert_near(double got, double want, double tolerance, const char *what, long index) {
    double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
    if (!(fabs(got - want) <= tolerance * scale)) {
        fail_msg("%s[%ld] = %.9g, expected %.9g (tolerance %g)", what, index, got, want, tolerance);
    }
}

static uint32_t float_to_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

/* ------------------------------------------------------------------------------------------ */
/* GEMM                                                                                        */

typedef struct {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
} gemm_case;

/* Runs one case with row strides 3 past the minimum, C starting as NaN (beta 0) or random, and
 * compares against a double triple loop. The error of element (i, j) is measured relative to
 * sum_p |a_ip b_pj|, the scale of the rounding in any summation order. */
static void check_gemm_case(gemm_case t) {
    int64_t a_rows = t.trans_a ? t.k : t.m, a_cols = t.trans_a ? t.m : t.k;
    int64_t b_rows = t.trans_b ? t.n : t.k, b_cols = t.trans_b ? t.k : t.n;
    int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = t.n + 3;
    float *a = random_floats((size_t)(a_rows * lda));
    float *b = random_floats((size_t)(b_rows * ldb));
    float *c = random_floats((size_t)(t.m * ldc));
    float *c_before = malloc((size_t)(t.m * ldc) * sizeof *c);
    assert_non_null(c_before);
    for (int64_t i = 0; i < t.m; i++) {
        for (int64_t j = 0; j < t.n; j++) {
            if (t.beta == 0.0f) c[i * ldc + j] = NAN;
        }
    }
    memcpy(c_before, c, (size_t)(t.m * ldc) * sizeof *c);

    assert_int_equal(umt_cpu_gemm(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a, lda, b, ldb, t.beta, c, ldc),
                     UMT_OK);
    for (int64_t i = 0; i < t.m; i++) {
        for (int64_t j = 0; j < ldc; j++) {
            long index = (long)(i * ldc + j);
            if (j >= t.n) { /* the padding between rows is not C's: untouched */
                assert_int_equal(float_to_bits(c[index]), float_to_bits(c_before[index]));
                continue;
            }
            double sum = 0.0, scale = 0.0;
            for (int64_t p = 0; p < t.k; p++) {
                double av = t.trans_a ? a[p * lda + i] : a[i * lda + p];
                double bv = t.trans_b ? b[j * ldb + p] : b[p * ldb + j];
                sum += av * bv;
                scale += fabs(av * bv);
            }
            double old_c = t.beta == 0.0f ? 0.0 : t.beta * (double)c_before[index]; /* NaN * 0 is NaN */
            double want = t.alpha * sum + old_c;
            double bound = 1e-5 * (fabs(t.alpha) * scale + fabs(old_c) + 1e-30);
            if (!(fabs(c[index] - want) <= bound)) {
                fail_msg("gemm ta=%d tb=%d %lldx%lldx%lld: C[%lld,%lld] = %.9g, expected %.9g", t.trans_a,
                         t.trans_b, (long long)t.m, (long long)t.n, (long long)t.k, (long long)i, (long long)j,
                         c[index], want);
            }
        }
    }
    free(a);
    free(b);
    free(c);
    free(c_before);
}

static const int64_t gemm_sizes[][3] = {{1, 1, 1}, {7, 5, 3}, {65, 33, 129}, {300, 257, 130}};

static void check_all_transposes_and_sizes(float alpha, float beta) {
    lcg_seed(12345);
    for (size_t s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; s++) {
        for (int trans = 0; trans < 4; trans++) {
            gemm_case t = {trans & 1, trans >> 1, gemm_sizes[s][0], gemm_sizes[s][1], gemm_sizes[s][2], alpha, beta};
            check_gemm_case(t);
        }
    }
}

static void test_gemm_matches_double_reference_for_all_transposes_with_nan_c_and_beta_0(void **state) {
    (void)state;
    check_all_transposes_and_sizes(1.0f, 0.0f);
}

static void test_gemm_with_beta_1_accumulates_into_c(void **state) {
    (void)state;
    check_all_transposes_and_sizes(1.0f, 1.0f);
}

static void test_gemm_scales_product_by_alpha_and_c_by_beta(void **state) {
    (void)state;
    check_all_transposes_and_sizes(0.5f, 0.0f);
    check_all_transposes_and_sizes(0.5f, -2.0f);
}

static void test_gemm_with_alpha_0_does_not_read_a_or_b(void **state) {
    (void)state;
    float a[4] = {NAN, NAN, NAN, NAN}, b[4] = {NAN, NAN, NAN, NAN}, c[4] = {1, 2, 3, 4};
    assert_int_equal(umt_cpu_gemm(false, false, 2, 2, 2, 0.0f, a, 2, b, 2, 3.0f, c, 2), UMT_OK);
    for (int i = 0; i < 4; i++) assert_near(c[i], 3.0 * (i + 1), 0.0, "c", i);
}

static void test_gemm_with_k_0_sets_c_to_beta_c(void **state) {
    (void)state;
    float c[2] = {NAN, NAN};
    assert_int_equal(umt_cpu_gemm(false, false, 1, 2, 0, 1.0f, NULL, 0, NULL, 2, 0.0f, c, 2), UMT_OK);
    assert_near(c[0], 0.0, 0.0, "c", 0);
    assert_near(c[1], 0.0, 0.0, "c", 1);
}

static void test_gemm_refuses_negative_sizes_and_short_strides(void **state) {
    (void)state;
    float x[16] = {0};
    assert_int_equal(umt_cpu_gemm(false, false, -1, 2, 2, 1.0f, x, 2, x, 2, 0.0f, x, 2), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "m=-1"));
    assert_int_equal(umt_cpu_gemm(false, false, 2, 2, 3, 1.0f, x, 2, x, 2, 0.0f, x, 2), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "lda=2"));
    assert_int_equal(umt_cpu_gemm(false, true, 2, 2, 3, 1.0f, x, 3, x, 2, 0.0f, x, 2), UMT_ERR_INVALID_ARGUMENT);
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Prints GFLOP/s on 512^3 (the figure docs/PERF.md quotes) on one thread and on the default
 * count (kernels/cpu/threads.h), and checks a few entries. */
static void test_gemm_512_cubed_is_correct_and_reports_its_throughput(void **state) {
    (void)state;
    enum { N = 512, REPEATS = 4 };
    lcg_seed(7);
    float *a = random_floats(N * N), *b = random_floats(N * N), *c = random_floats(N * N);
    for (int threads = 1; threads >= 0; threads--) { /* 1, then 0: the default */
        assert_int_equal(umt_cpu_threads_set(threads), UMT_OK);
        assert_int_equal(umt_cpu_gemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N), UMT_OK);
        double start = seconds_now();
        for (int r = 0; r < REPEATS; r++) umt_cpu_gemm(false, false, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
        double seconds = (seconds_now() - start) / REPEATS;
        printf("gemm 512x512x512 on %d thread(s): %.2f GFLOP/s (%.2f ms)\n", umt_cpu_threads(),
               2.0 * N * N * N / seconds * 1e-9, seconds * 1e3);
    }
    for (int i = 0; i < N; i += 97) {
        double want = 0.0;
        for (int p = 0; p < N; p++) want += (double)a[i * N + p] * b[p * N + (N - 1 - i)];
        assert_near(c[i * N + (N - 1 - i)], want, 1e-4, "c", i);
    }
    free(a);
    free(b);
    free(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise                                                                                 */

static void test_add_mul_and_relu_write_their_outputs(void **state) {
    (void)state;
    float a[4] = {1, -2, 3, -0.5f}, b[4] = {0.5f, 4, -1, 2}, out[4];
    assert_int_equal(umt_cpu_add(a, b, out, 4), UMT_OK);
    for (int i = 0; i < 4; i++) assert_near(out[i], (double)a[i] + b[i], 0.0, "add", i);
    assert_int_equal(umt_cpu_mul(a, b, out, 4), UMT_OK);
    for (int i = 0; i < 4; i++) assert_near(out[i], (double)a[i] * b[i], 0.0, "mul", i);
    float x[4] = {-1, 0, 2.5f, NAN};
    assert_int_equal(umt_cpu_relu(x, x, 4), UMT_OK); /* in place */
    assert_near(x[0], 0.0, 0.0, "relu", 0);
    assert_near(x[1], 0.0, 0.0, "relu", 1);
    assert_near(x[2], 2.5, 0.0, "relu", 2);
    assert_true(isnan(x[3])); /* a diverged value must show, not turn into 0 */
}

static void test_add_rows_adds_the_bias_to_every_row_also_in_place(void **state) {
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {10, 20, 30};
    assert_int_equal(umt_cpu_add_rows(x, bias, x, 2, 3), UMT_OK);
    const float want[6] = {11, 22, 33, 14, 25, 36};
    for (int i = 0; i < 6; i++) assert_near(x[i], want[i], 0.0, "add_rows", i);
}

static void test_accumulating_kernels_add_to_what_is_there(void **state) {
    (void)state;
    float src[3] = {1, 2, 3}, other[3] = {4, 5, 6};
    float dst[3] = {1, 1, 1};
    assert_int_equal(umt_cpu_accumulate(dst, src, 0.5f, 3), UMT_OK);
    for (int i = 0; i < 3; i++) assert_near(dst[i], 1.0 + 0.5 * src[i], 0.0, "accumulate", i);
    float prod[3] = {1, 1, 1};
    assert_int_equal(umt_cpu_accumulate_product(prod, src, other, 3), UMT_OK);
    for (int i = 0; i < 3; i++) assert_near(prod[i], 1.0 + src[i] * other[i], 0.0, "accumulate_product", i);
    float last[3] = {9, 9, 9}, sum[3] = {0.5f, 1, 2};
    assert_int_equal(umt_cpu_keep_and_add(last, sum, src, 3), UMT_OK);
    for (int i = 0; i < 3; i++) assert_near(last[i], src[i], 0.0, "keep_and_add last", i);
    const float want_sum[3] = {1.5f, 3, 5};
    for (int i = 0; i < 3; i++) assert_near(sum[i], want_sum[i], 0.0, "keep_and_add sum", i);
    assert_int_equal(umt_cpu_keep_and_add(last, sum, sum, 3), UMT_OK); /* x may be sum itself */
    for (int i = 0; i < 3; i++) assert_near(last[i], want_sum[i], 0.0, "keep_and_add last, x = sum", i);
    for (int i = 0; i < 3; i++) assert_near(sum[i], 2 * want_sum[i], 0.0, "keep_and_add sum, x = sum", i);
    float dy[6] = {1, 2, 3, 4, 5, 6}, dbias[3] = {100, 200, 300};
    assert_int_equal(umt_cpu_sum_rows(dy, dbias, 2, 3), UMT_OK);
    const float want_dbias[3] = {105, 207, 309};
    for (int i = 0; i < 3; i++) assert_near(dbias[i], want_dbias[i], 0.0, "sum_rows", i);
}

static void test_relu_backward_adds_dy_only_where_the_output_is_positive(void **state) {
    (void)state;
    float y[4] = {0, 2, 0, 0.1f}, dy[4] = {5, 6, 7, 8}, dx[4] = {1, 1, 1, 1};
    assert_int_equal(umt_cpu_relu_backward(y, dy, dx, 4), UMT_OK);
    const float want[4] = {1, 7, 1, 9};
    for (int i = 0; i < 4; i++) assert_near(dx[i], want[i], 0.0, "relu_backward", i);
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions and losses                                                                       */

enum { ROWS = 5, COLS = 7 };
static const int32_t loss_labels[ROWS] = {0, 6, 3, 3, 1};

static void test_mean_and_its_backward_spread_the_gradient_evenly(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 10}, out[1], dx[4] = {1, 1, 1, 1}, dout[1] = {2};
    assert_int_equal(umt_cpu_mean(x, out, 4), UMT_OK);
    assert_near(out[0], 4.0, 0.0, "mean", 0);
    assert_int_equal(umt_cpu_mean_backward(dout, dx, 4), UMT_OK);
    for (int i = 0; i < 4; i++) assert_near(dx[i], 1.5, 0.0, "mean_backward", i);
}

static void test_log_softmax_rows_exponentiate_to_one_and_match_double_reference(void **state) {
    (void)state;
    lcg_seed(99);
    float x[ROWS * COLS], y[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) x[i] = 8.0f * lcg_uniform();
    assert_int_equal(umt_cpu_log_softmax(x, y, ROWS, COLS), UMT_OK);
    for (int r = 0; r < ROWS; r++) {
        double sum_exp_x = 0.0, sum_exp_y = 0.0;
        for (int c = 0; c < COLS; c++) sum_exp_x += exp((double)x[r * COLS + c]);
        for (int c = 0; c < COLS; c++) {
            sum_exp_y += exp((double)y[r * COLS + c]);
            assert_near(y[r * COLS + c], x[r * COLS + c] - log(sum_exp_x), 1e-6, "log_softmax", r * COLS + c);
        }
        assert_near(sum_exp_y, 1.0, 1e-6, "sum exp(log_softmax) of row", r);
    }
}

static void test_log_softmax_of_huge_logits_stays_finite(void **state) {
    (void)state;
    float x[3] = {1e4f, -1e4f, 1e4f - 1.0f}, y[3];
    assert_int_equal(umt_cpu_log_softmax(x, y, 1, 3), UMT_OK);
    for (int i = 0; i < 3; i++) assert_true(isfinite(y[i]));
    double log_sum = log(1.0 + exp(-1.0));
    assert_near(y[0], -log_sum, 1e-6, "log_softmax", 0);
    assert_near(y[1], -2e4 - log_sum, 1e-6, "log_softmax", 1);
}

static void test_softmax_xent_equals_nll_of_log_softmax(void **state) {
    (void)state;
    lcg_seed(5);
    float x[ROWS * COLS], logp[ROWS * COLS], probs[ROWS * COLS], nll[1], xent[1];
    for (int i = 0; i < ROWS * COLS; i++) x[i] = 5.0f * lcg_uniform();
    assert_int_equal(umt_cpu_log_softmax(x, logp, ROWS, COLS), UMT_OK);
    assert_int_equal(umt_cpu_nll_loss(logp, loss_labels, nll, ROWS, COLS), UMT_OK);
    assert_int_equal(umt_cpu_softmax_xent(x, loss_labels, probs, xent, ROWS, COLS), UMT_OK);
    assert_near(xent[0], nll[0], 1e-6, "xent vs nll", 0);
    double want = 0.0;
    for (int r = 0; r < ROWS; r++) want -= logp[r * COLS + loss_labels[r]];
    assert_near(nll[0], want / ROWS, 1e-6, "nll", 0);
    for (int i = 0; i < ROWS * COLS; i++) assert_near(probs[i], exp((double)logp[i]), 1e-6, "probs", i);
}

static void test_log_softmax_backward_accumulates_dy_minus_softmax_times_row_sum(void **state) {
    (void)state;
    lcg_seed(17);
    float x[ROWS * COLS], y[ROWS * COLS], dy[ROWS * COLS], dx[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) {
        x[i] = 3.0f * lcg_uniform();
        dy[i] = lcg_uniform();
        dx[i] = 0.25f;
    }
    assert_int_equal(umt_cpu_log_softmax(x, y, ROWS, COLS), UMT_OK);
    assert_int_equal(umt_cpu_log_softmax_backward(y, dy, dx, ROWS, COLS), UMT_OK);
    for (int r = 0; r < ROWS; r++) {
        double dy_sum = 0.0, z = 0.0;
        for (int c = 0; c < COLS; c++) dy_sum += dy[r * COLS + c];
        for (int c = 0; c < COLS; c++) z += exp((double)x[r * COLS + c]);
        for (int c = 0; c < COLS; c++) {
            int i = r * COLS + c;
            assert_near(dx[i], 0.25 + dy[i] - exp((double)x[i]) / z * dy_sum, 1e-6, "dx", i);
        }
    }
}

static void test_nll_and_xent_backwards_accumulate_the_derived_gradients(void **state) {
    (void)state;
    lcg_seed(23);
    float x[ROWS * COLS], probs[ROWS * COLS], loss[1], dloss[1] = {3.0f};
    float dlogp[ROWS * COLS], dlogits[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) {
        x[i] = 2.0f * lcg_uniform();
        dlogp[i] = dlogits[i] = 1.0f;
    }
    assert_int_equal(umt_cpu_nll_loss_backward(dloss, loss_labels, dlogp, ROWS, COLS), UMT_OK);
    assert_int_equal(umt_cpu_softmax_xent(x, loss_labels, probs, loss, ROWS, COLS), UMT_OK);
    assert_int_equal(umt_cpu_softmax_xent_backward(probs, loss_labels, dloss, dlogits, ROWS, COLS), UMT_OK);
    for (int r = 0; r < ROWS; r++) {
        double z = 0.0;
        for (int c = 0; c < COLS; c++) z += exp((double)x[r * COLS + c]);
        for (int c = 0; c < COLS; c++) {
            int i = r * COLS + c;
            double onehot = c == loss_labels[r] ? 1.0 : 0.0;
            assert_near(dlogp[i], 1.0 - 3.0 / ROWS * onehot, 1e-7, "dlogp", i);
            assert_near(dlogits[i], 1.0 + 3.0 / ROWS * (exp((double)x[i]) / z - onehot), 1e-6, "dlogits", i);
        }
    }
}

static void test_count_correct_breaks_ties_to_the_lowest_index(void **state) {
    (void)state;
    const float scores[4 * 3] = {0.1f, 0.9f, 0.2f, /* arg-max 1 */
                                 0.5f, 0.5f, 0.1f, /* tie: 0 */
                                 0.3f, 0.7f, 0.7f, /* tie: 1 */
                                 2.0f, 1.0f, 3.0f /* arg-max 2 */};
    const int32_t labels[4] = {1, 0, 1, 0};
    int64_t correct = -1;
    assert_int_equal(umt_cpu_count_correct(scores, labels, 4, 3, &correct), UMT_OK);
    assert_int_equal(correct, 3);
}

static void test_labels_out_of_range_are_refused_naming_row_and_label(void **state) {
    (void)state;
    float scores[3 * 4] = {0}, probs[3 * 4], loss[1] = {0}, dloss[1] = {1};
    const int32_t labels[3] = {0, 3, 4};
    assert_int_equal(umt_cpu_nll_loss(scores, labels, loss, 3, 4), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "row 2 has label 4"));
    assert_int_equal(umt_cpu_softmax_xent(scores, labels, probs, loss, 3, 4), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_cpu_softmax_xent_backward(probs, labels, dloss, scores, 3, 4), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_cpu_nll_loss_backward(dloss, labels, scores, 3, 4), UMT_ERR_INVALID_ARGUMENT);
    const int32_t negative[1] = {-1};
    int64_t correct;
    assert_int_equal(umt_cpu_count_correct(scores, negative, 1, 4, &correct), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "row 0 has label -1"));
    for (int i = 0; i < 12; i++) assert_near(scores[i], 0.0, 0.0, "untouched dlogits", i);
}

/* ------------------------------------------------------------------------------------------ */
/* Memory and the backend table                                                                */

static void test_fill_and_copy_write_every_element(void **state) {
    (void)state;
    float x[5], y[5] = {0};
    assert_int_equal(umt_cpu_fill(x, 5, -1.5f), UMT_OK);
    assert_int_equal(umt_cpu_copy(y, x, sizeof x), UMT_OK);
    for (int i = 0; i < 5; i++) assert_near(y[i], -1.5, 0.0, "copy", i);
}

/* Two blocks of one buffer zeroed in one call; the floats around them keep their values; a size
 * that is not whole floats is refused, naming the block, before anything is written. */
static void test_zero_many_zeroes_each_block_and_nothing_else(void **state) {
    (void)state;
    float buffer[12];
    for (int i = 0; i < 12; i++) buffer[i] = (float)(i + 1);
    void *blocks[2] = {&buffer[1], &buffer[6]};
    size_t bytes[2] = {3 * sizeof(float), 4 * sizeof(float)};
    assert_int_equal(umt_cpu_zero_many(2, blocks, bytes), UMT_OK);
    const float want[12] = {1, 0, 0, 0, 5, 6, 0, 0, 0, 0, 11, 12};
    assert_memory_equal(buffer, want, sizeof want);
    buffer[1] = 2.0f;
    size_t odd[2] = {4, 6};
    assert_int_equal(umt_cpu_zero_many(2, blocks, odd), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "block 1 has 6 bytes"));
    assert_true(buffer[1] == 2.0f);
}

static void test_cpu_backend_fills_every_slot_with_its_kernels(void **state) {
    (void)state;
    const umt_backend *cpu = umt_cpu_backend();
    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    assert_ptr_equal(cpu->f32.gemm, umt_cpu_gemm);
    assert_ptr_equal(cpu->f32.upload, umt_cpu_copy);
    assert_ptr_equal(cpu->f32.download, umt_cpu_copy);
    /* Every other slot, named, so a forgotten one fails here instead of crashing an op. */
#define ASSERT_SLOT(slot)                                                                          \
    do {                                                                                           \
        if (cpu->f32.slot == NULL) fail_msg("cpu backend slot %s is NULL", #slot);                 \
    } while (0)
    ASSERT_SLOT(fill);
    ASSERT_SLOT(zero_many);
    ASSERT_SLOT(copy);
    ASSERT_SLOT(convert);
    ASSERT_SLOT(add);
    ASSERT_SLOT(add_rows);
    ASSERT_SLOT(accumulate);
    ASSERT_SLOT(keep_and_add);
    ASSERT_SLOT(sum_rows);
    ASSERT_SLOT(mul);
    ASSERT_SLOT(accumulate_product);
    ASSERT_SLOT(relu);
    ASSERT_SLOT(relu_backward);
    ASSERT_SLOT(mean);
    ASSERT_SLOT(mean_backward);
    ASSERT_SLOT(log_softmax);
    ASSERT_SLOT(log_softmax_backward);
    ASSERT_SLOT(nll_loss);
    ASSERT_SLOT(nll_loss_backward);
    ASSERT_SLOT(softmax_xent);
    ASSERT_SLOT(softmax_xent_backward);
    ASSERT_SLOT(count_correct);
    ASSERT_SLOT(gather_batch);
    ASSERT_SLOT(sgd_update);
    ASSERT_SLOT(adam_update);
    ASSERT_SLOT(adadelta_update);
#undef ASSERT_SLOT
    /* And every slot of the reference group, named above or not (the group holds function
     * pointers only, all of one size). */
    void (*slots[sizeof cpu->f32 / sizeof(void (*)(void))])(void);
    assert_int_equal(sizeof slots, sizeof cpu->f32);
    memcpy(slots, &cpu->f32, sizeof slots);
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (!slots[i]) fail_msg("cpu backend: slot %zu of the f32 group is NULL", i);
    /* The CPU fills the reference group only: low precision and the fused paths are CUDA's. */
    const umt_backend_lowp no_lowp = {0};
    const umt_backend_fused no_fused = {0};
    assert_memory_equal(&cpu->lowp, &no_lowp, sizeof no_lowp);
    assert_memory_equal(&cpu->fused, &no_fused, sizeof no_fused);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_double_reference_for_all_transposes_with_nan_c_and_beta_0),
        cmocka_unit_test(test_gemm_with_beta_1_accumulates_into_c),
        cmocka_unit_test(test_gemm_scales_product_by_alpha_and_c_by_beta),
        cmocka_unit_test(test_gemm_with_alpha_0_does_not_read_a_or_b),
        cmocka_unit_test(test_gemm_with_k_0_sets_c_to_beta_c),
        cmocka_unit_test(test_gemm_refuses_negative_sizes_and_short_strides),
        cmocka_unit_test(test_gemm_512_cubed_is_correct_and_reports_its_throughput),
        cmocka_unit_test(test_add_mul_and_relu_write_their_outputs),
        cmocka_unit_test(test_add_rows_adds_the_bias_to_every_row_also_in_place),
        cmocka_unit_test(test_accumulating_kernels_add_to_what_is_there),
        cmocka_unit_test(test_relu_backward_adds_dy_only_where_the_output_is_positive),
        cmocka_unit_test(test_mean_and_its_backward_spread_the_gradient_evenly),
        cmocka_unit_test(test_log_softmax_rows_exponentiate_to_one_and_match_double_reference),
        cmocka_unit_test(test_log_softmax_of_huge_logits_stays_finite),
        cmocka_unit_test(test_softmax_xent_equals_nll_of_log_softmax),
        cmocka_unit_test(test_log_softmax_backward_accumulates_dy_minus_softmax_times_row_sum),
        cmocka_unit_test(test_nll_and_xent_backwards_accumulate_the_derived_gradients),
        cmocka_unit_test(test_count_correct_breaks_ties_to_the_lowest_index),
        cmocka_unit_test(test_labels_out_of_range_are_refused_naming_row_and_label),
        cmocka_unit_test(test_fill_and_copy_write_every_element),
        cmocka_unit_test(test_zero_many_zeroes_each_block_and_nothing_else),
        cmocka_unit_test(test_cpu_backend_fills_every_slot_with_its_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
