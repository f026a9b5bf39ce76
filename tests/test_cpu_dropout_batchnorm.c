/*
 * tests/test_cpu_dropout_batchnorm.c — the CPU reference kernels of dropout (the counter-based
 * draw shared with CUDA, the 1/(1-p) scale, seeds) and batch norm (training against a double
 * reference, running statistics, evaluation, backward against the formula in double, and a
 * finite-difference check of backward through the kernels themselves). Every backward starts
 * from non-zero gradients, to check that it accumulates.
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
#include "umtrain.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers: a fixed-seed LCG and a comparison that names the failing element.                 */

static uint32_t lcg_state;

static void lcg_seed(uint32_t seed) { lcg_state = seed; }

/* Uniform in [-1, 1) from the top 24 bits of a 32-bit LCG (Numerical Recipes constants). */
static float lcg_uniform(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)(lcg_state >> 8) / (float)(1u << 23) - 1.0f;
}

static float *random_floats(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = lcg_uniform();
    return x;
}

static float *copy_floats(const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof *y);
    assert_non_null(y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* |got - want| <= bound, else fail naming what and where. */
static void assert_within(double got, double want, double bound, const char *what, int64_t index) {
    if (!(fabs(got - want) <= bound)) {
        fail_msg("%s[%lld] = %.9g, expected %.9g (bound %.3g)", what, (long long)index, got, want, bound);
    }
}

static void assert_error_mentions(const char *text) {
    if (strstr(umt_last_error(), text) == NULL) {
        fail_msg("error \"%s\" does not mention \"%s\"", umt_last_error(), text);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout                                                                                     */

enum { DROPOUT_N = 100000 };

static void test_dropout_with_p_0_is_the_identity(void **state) {
    (void)state;
    lcg_seed(1);
    float *x = random_floats(DROPOUT_N), *y = random_floats(DROPOUT_N);
    uint8_t *mask = malloc(DROPOUT_N);
    assert_non_null(mask);
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, DROPOUT_N, 0, 0.0f, 42, NULL), UMT_OK);
    assert_memory_equal(x, y, DROPOUT_N * sizeof *x);
    for (int64_t i = 0; i < DROPOUT_N; i++) assert_int_equal(mask[i], 1);
    free(x);
    free(y);
    free(mask);
}

/* Runs forward and checks every element against umt_dropout_keep; returns the kept count. */
static int64_t check_dropout_forward(const float *x, float *y, uint8_t *mask, float p, uint64_t seed) {
    float scale = 1.0f / (1.0f - p);
    int64_t kept = 0;
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, DROPOUT_N, 0, p, seed, NULL), UMT_OK);
    for (int64_t i = 0; i < DROPOUT_N; i++) {
        bool keep = umt_dropout_keep(seed, (uint64_t)i, p);
        assert_int_equal(mask[i], keep ? 1 : 0);
        assert_within(y[i], keep ? x[i] * scale : 0.0f, 0.0, "dropout y", i);
        kept += keep;
    }
    return kept;
}

static void test_dropout_keeps_the_elements_of_the_shared_draw_scaled_by_one_over_keep(void **state) {
    (void)state;
    lcg_seed(3);
    float *x = random_floats(DROPOUT_N), *y = malloc(DROPOUT_N * sizeof *y);
    uint8_t *mask = malloc(DROPOUT_N);
    assert_true(y && mask);
    int64_t kept = check_dropout_forward(x, y, mask, 0.5f, 1234);
    assert_in_range(kept, 49000, 51000);
    kept = check_dropout_forward(x, y, mask, 0.3f, 1234); /* 1/(1-0.3) is not a power of two */
    assert_in_range(kept, 69000, 71000);
    free(x);
    free(y);
    free(mask);
}

/* A micro-batch's elements [first, first + n) of the whole batch draw the whole batch's masks. */
static void test_dropout_from_first_draws_the_whole_batchs_elements(void **state) {
    (void)state;
    lcg_seed(5);
    float *x = random_floats(DROPOUT_N), *y = malloc(DROPOUT_N * sizeof *y), *part_y = malloc(DROPOUT_N * sizeof *y);
    uint8_t *mask = malloc(DROPOUT_N), *part = malloc(DROPOUT_N);
    assert_true(y && part_y && mask && part);
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, DROPOUT_N, 0, 0.4f, 99, NULL), UMT_OK);
    static const int64_t firsts[] = {0, 1, 777, DROPOUT_N - 3};
    for (size_t f = 0; f < sizeof firsts / sizeof firsts[0]; f++) {
        int64_t first = firsts[f], n = DROPOUT_N - first;
        assert_int_equal(umt_cpu_dropout_forward(x + first, part_y, part, n, first, 0.4f, 99, NULL), UMT_OK);
        assert_memory_equal(part, mask + first, (size_t)n);
        assert_memory_equal(part_y, y + first, (size_t)n * sizeof *y);
    }
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, 2, -1, 0.4f, 99, NULL), UMT_ERR_INVALID_ARGUMENT);
    free(x);
    free(y);
    free(part_y);
    free(mask);
    free(part);
}

static void test_dropout_mask_repeats_for_a_seed_and_changes_with_it(void **state) {
    (void)state;
    lcg_seed(4);
    float *x = random_floats(DROPOUT_N), *y = malloc(DROPOUT_N * sizeof *y);
    uint8_t *first = malloc(DROPOUT_N), *again = malloc(DROPOUT_N), *other = malloc(DROPOUT_N);
    assert_true(y && first && again && other);
    assert_int_equal(umt_cpu_dropout_forward(x, y, first, DROPOUT_N, 0, 0.5f, 77, NULL), UMT_OK);
    assert_int_equal(umt_cpu_dropout_forward(x, y, again, DROPOUT_N, 0, 0.5f, 77, NULL), UMT_OK);
    assert_int_equal(umt_cpu_dropout_forward(x, y, other, DROPOUT_N, 0, 0.5f, 78, NULL), UMT_OK);
    assert_memory_equal(first, again, DROPOUT_N);
    int64_t differ = 0;
    for (int64_t i = 0; i < DROPOUT_N; i++) differ += first[i] != other[i];
    /* Independent masks of p = 0.5 differ in half the places. */
    assert_in_range(differ, 49000, 51000);
    free(x);
    free(y);
    free(first);
    free(again);
    free(other);
}

static void test_dropout_backward_accumulates_scaled_dy_where_kept(void **state) {
    (void)state;
    enum { N = 1000 };
    lcg_seed(6);
    float *x = random_floats(N), *y = random_floats(N), *dy = random_floats(N), *dx = random_floats(N);
    float *dx_start = copy_floats(dx, N), p = 0.25f, scale = 1.0f / (1.0f - p);
    uint8_t mask[N];
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, N, 0, p, 9, NULL), UMT_OK);
    assert_int_equal(umt_cpu_dropout_backward(mask, dy, dx, N, p), UMT_OK);
    for (int64_t i = 0; i < N; i++) {
        assert_within(dx[i], mask[i] ? dx_start[i] + dy[i] * scale : dx_start[i], 0.0, "dropout dx", i);
    }
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(dx_start);
}

static void test_dropout_refuses_p_outside_0_to_1(void **state) {
    (void)state;
    float x[2] = {1, 2}, y[2];
    uint8_t mask[2] = {1, 1};
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, 2, 0, 1.0f, 0, NULL), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("p = 1");
    assert_int_equal(umt_cpu_dropout_forward(x, y, mask, 2, 0, -0.1f, 0, NULL), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_cpu_dropout_backward(mask, x, y, 2, NAN), UMT_ERR_INVALID_ARGUMENT);
}

/* ------------------------------------------------------------------------------------------ */
/* Batch norm                                                                                  */

enum { BN_N = 4, BN_C = 3, BN_HW = 10, BN_NUMEL = BN_N * BN_C * BN_HW, BN_M = BN_N * BN_HW };
#define BN_AT(img, ch, i) (((img) * BN_C + (ch)) * BN_HW + (i))

/* x with a different offset and spread per channel, so normalisation has work to do. */
static float *bn_input(void) {
    float *x = random_floats(BN_NUMEL);
    for (int64_t e = 0; e < BN_NUMEL; e++) x[e] = x[e] * (1.0f + (float)((e / BN_HW) % BN_C)) + 3.0f;
    return x;
}

/* Mean and biased variance of channel ch, in double. */
static void bn_moments(const float *x, int64_t ch, double *mean, double *var) {
    double sum = 0.0, squares = 0.0;
    for (int64_t img = 0; img < BN_N; img++)
        for (int64_t i = 0; i < BN_HW; i++) sum += x[BN_AT(img, ch, i)];
    *mean = sum / BN_M;
    for (int64_t img = 0; img < BN_N; img++)
        for (int64_t i = 0; i < BN_HW; i++) squares += pow(x[BN_AT(img, ch, i)] - *mean, 2);
    *var = squares / BN_M;
}

static void test_batchnorm_train_normalises_each_channel_and_moves_running_stats(void **state) {
    (void)state;
    lcg_seed(11);
    float *x = bn_input(), y[BN_NUMEL], gamma[BN_C] = {1, 1, 1}, beta[BN_C] = {0, 0, 0};
    float running_mean[BN_C] = {0.5f, -1.0f, 0.0f}, running_var[BN_C] = {2.0f, 1.0f, 0.5f};
    float save_mean[BN_C], save_inv_std[BN_C], momentum = 0.1f, eps = 1e-5f;
    assert_int_equal(umt_cpu_batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean,
                                                     save_inv_std, BN_N, BN_C, BN_HW, momentum, eps),
                     UMT_OK);
    const float old_mean[BN_C] = {0.5f, -1.0f, 0.0f}, old_var[BN_C] = {2.0f, 1.0f, 0.5f};
    for (int64_t ch = 0; ch < BN_C; ch++) {
        double mean, var, y_mean, y_var;
        bn_moments(x, ch, &mean, &var);
        assert_within(save_mean[ch], mean, 1e-6 * fabs(mean), "save_mean", ch);
        assert_within(save_inv_std[ch], 1.0 / sqrt(var + eps), 1e-6 / sqrt(var), "save_inv_std", ch);
        bn_moments(y, ch, &y_mean, &y_var);
        assert_within(y_mean, 0.0, 1e-5, "y channel mean", ch);
        assert_within(y_var, var / (var + eps), 1e-5, "y channel var", ch);
        double unbiased = var * BN_M / (BN_M - 1.0);
        assert_within(running_mean[ch], 0.9 * old_mean[ch] + 0.1 * mean, 1e-6, "running_mean", ch);
        assert_within(running_var[ch], 0.9 * old_var[ch] + 0.1 * unbiased, 1e-6, "running_var", ch);
    }
    free(x);
}

static void test_batchnorm_train_applies_gamma_and_beta_as_the_double_reference(void **state) {
    (void)state;
    lcg_seed(12);
    float *x = bn_input(), y[BN_NUMEL], gamma[BN_C] = {0.5f, -2.0f, 1.5f}, beta[BN_C] = {1.0f, 0.0f, -3.0f};
    float running_mean[BN_C] = {0}, running_var[BN_C] = {1, 1, 1}, save_mean[BN_C], save_inv_std[BN_C];
    assert_int_equal(umt_cpu_batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean,
                                                     save_inv_std, BN_N, BN_C, BN_HW, 0.1f, 1e-3f),
                     UMT_OK);
    for (int64_t e = 0; e < BN_NUMEL; e++) {
        int64_t ch = (e / BN_HW) % BN_C;
        double mean, var;
        bn_moments(x, ch, &mean, &var);
        double want = (x[e] - mean) / sqrt(var + 1e-3) * gamma[ch] + beta[ch];
        assert_within(y[e], want, 1e-5 * (1.0 + fabs(want)), "bn y", e);
    }
    free(x);
}

static void test_batchnorm_with_one_value_per_channel_outputs_beta_and_decays_running_var(void **state) {
    (void)state;
    float x[2] = {4.0f, -7.0f}, y[2], gamma[2] = {2, 3}, beta[2] = {0.25f, -0.5f};
    float running_mean[2] = {0, 0}, running_var[2] = {1, 1}, save_mean[2], save_inv_std[2];
    assert_int_equal(
        umt_cpu_batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_inv_std, 1, 2,
                                        1, 0.5f, 1e-5f),
        UMT_OK);
    assert_within(y[0], 0.25, 0.0, "y", 0);
    assert_within(y[1], -0.5, 0.0, "y", 1);
    assert_within(running_mean[1], -3.5, 1e-6, "running_mean", 1);
    assert_within(running_var[1], 0.5, 1e-6, "running_var (biased var 0 when m = 1)", 1);
}

static void test_batchnorm_eval_normalises_with_the_running_statistics(void **state) {
    (void)state;
    lcg_seed(13);
    float *x = bn_input(), y[BN_NUMEL], gamma[BN_C] = {0.5f, -2.0f, 1.5f}, beta[BN_C] = {1.0f, 0.0f, -3.0f};
    float running_mean[BN_C] = {3.0f, 2.5f, -1.0f}, running_var[BN_C] = {0.4f, 1.3f, 2.0f};
    assert_int_equal(
        umt_cpu_batchnorm_forward_eval(x, gamma, beta, running_mean, running_var, y, BN_N, BN_C, BN_HW, 1e-5f),
        UMT_OK);
    for (int64_t e = 0; e < BN_NUMEL; e++) {
        int64_t ch = (e / BN_HW) % BN_C;
        double want = (x[e] - running_mean[ch]) / sqrt(running_var[ch] + 1e-5) * gamma[ch] + beta[ch];
        assert_within(y[e], want, 1e-5 * (1.0 + fabs(want)), "bn eval y", e);
    }
    free(x);
}

/* The forward of the fixed test input, saving the statistics backward needs. */
static void bn_forward(const float *x, const float *gamma, const float *beta, float *y, float *save_mean,
                       float *save_inv_std) {
    float running_mean[BN_C] = {0}, running_var[BN_C] = {1, 1, 1};
    assert_int_equal(umt_cpu_batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean,
                                                     save_inv_std, BN_N, BN_C, BN_HW, 0.1f, 1e-5f),
                     UMT_OK);
}

static void test_batchnorm_backward_accumulates_the_three_term_formula(void **state) {
    (void)state;
    lcg_seed(14);
    float *x = bn_input(), *dy = random_floats(BN_NUMEL), *dx = random_floats(BN_NUMEL), y[BN_NUMEL];
    float *dx_start = copy_floats(dx, BN_NUMEL), gamma[BN_C] = {0.5f, -2.0f, 1.5f}, beta[BN_C] = {0};
    float dgamma[BN_C] = {1, 2, 3}, dbeta[BN_C] = {-1, -2, -3}, save_mean[BN_C], save_inv_std[BN_C];
    bn_forward(x, gamma, beta, y, save_mean, save_inv_std);
    assert_int_equal(umt_cpu_batchnorm_backward(x, dy, gamma, save_mean, save_inv_std, dx, dgamma, dbeta, BN_N,
                                                BN_C, BN_HW),
                     UMT_OK);
    for (int64_t ch = 0; ch < BN_C; ch++) {
        double mean, var, sum_dy = 0.0, sum_dy_xhat = 0.0;
        bn_moments(x, ch, &mean, &var);
        double inv_std = 1.0 / sqrt(var + 1e-5);
        for (int64_t img = 0; img < BN_N; img++) {
            for (int64_t i = 0; i < BN_HW; i++) {
                sum_dy += dy[BN_AT(img, ch, i)];
                sum_dy_xhat += dy[BN_AT(img, ch, i)] * (x[BN_AT(img, ch, i)] - mean) * inv_std;
            }
        }
        assert_within(dbeta[ch], -(ch + 1.0) + sum_dy, 1e-5, "dbeta", ch);
        assert_within(dgamma[ch], (ch + 1.0) + sum_dy_xhat, 1e-5, "dgamma", ch);
        for (int64_t img = 0; img < BN_N; img++) {
            for (int64_t i = 0; i < BN_HW; i++) {
                int64_t e = BN_AT(img, ch, i);
                double xhat = (x[e] - mean) * inv_std;
                double want = gamma[ch] * inv_std / BN_M * (BN_M * dy[e] - sum_dy - xhat * sum_dy_xhat);
                assert_within(dx[e], dx_start[e] + want, 1e-5 * (1.0 + fabs(want)), "bn dx", e);
            }
        }
    }
    /* A NULL gradient is one nobody asked for: skipped, the others still written. */
    float dgamma_again[BN_C] = {0};
    assert_int_equal(umt_cpu_batchnorm_backward(x, dy, gamma, save_mean, save_inv_std, NULL, dgamma_again, NULL,
                                                BN_N, BN_C, BN_HW),
                     UMT_OK);
    for (int64_t ch = 0; ch < BN_C; ch++) assert_within(dgamma_again[ch], dgamma[ch] - (ch + 1.0), 1e-5, "dg", ch);
    free(x);
    free(dy);
    free(dx);
    free(dx_start);
}

/* loss(x) = sum(y * weights), y from the training forward, in double. */
static double bn_weighted_loss(const float *x, const float *gamma, const float *beta, const float *weights) {
    float y[BN_NUMEL], save_mean[BN_C], save_inv_std[BN_C];
    bn_forward(x, gamma, beta, y, save_mean, save_inv_std);
    double loss = 0.0;
    for (int64_t e = 0; e < BN_NUMEL; e++) loss += (double)y[e] * weights[e];
    return loss;
}

/* Central differences of the float forward: step h trades truncation (h^2) against the
 * forward's float rounding (~1e-7 * sum|y*w| / h). h = 1e-2 on inputs of spread 1 to 3 leaves
 * errors of about 2e-5 (measured); the tolerance 5e-4 is far below what a wrong term costs. */
static void test_batchnorm_backward_matches_finite_differences_of_the_forward(void **state) {
    (void)state;
    lcg_seed(15);
    float *x = bn_input(), *weights = random_floats(BN_NUMEL), dx[BN_NUMEL] = {0}, y[BN_NUMEL];
    float gamma[BN_C] = {0.5f, -2.0f, 1.5f}, beta[BN_C] = {1.0f, 0.0f, -3.0f}, dgamma[BN_C] = {0}, dbeta[BN_C] = {0};
    float save_mean[BN_C], save_inv_std[BN_C];
    bn_forward(x, gamma, beta, y, save_mean, save_inv_std);
    assert_int_equal(umt_cpu_batchnorm_backward(x, weights, gamma, save_mean, save_inv_std, dx, dgamma, dbeta, BN_N,
                                                BN_C, BN_HW),
                     UMT_OK);
    const float h = 1e-2f;
    for (int64_t e = 0; e < BN_NUMEL; e++) {
        float saved = x[e];
        x[e] = saved + h;
        double up = bn_weighted_loss(x, gamma, beta, weights);
        x[e] = saved - h;
        double down = bn_weighted_loss(x, gamma, beta, weights);
        x[e] = saved;
        double step = (double)(saved + h) - (double)(saved - h); /* the step as float actually took it */
        assert_within(dx[e], (up - down) / step, 5e-4 * (1.0 + fabs(dx[e])), "bn dx vs finite difference", e);
    }
    free(x);
    free(weights);
}

static void test_batchnorm_refuses_empty_sizes_and_bad_momentum_or_eps(void **state) {
    (void)state;
    float v[2] = {1, 2}, s[2];
    assert_int_equal(umt_cpu_batchnorm_forward_train(v, v, v, s, s, s, s, s, 0, 1, 1, 0.1f, 1e-5f),
                     UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("n=0");
    assert_int_equal(umt_cpu_batchnorm_forward_train(v, v, v, s, s, s, s, s, 2, 1, 1, 1.5f, 1e-5f),
                     UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("momentum");
    assert_int_equal(umt_cpu_batchnorm_forward_eval(v, v, v, v, v, s, 2, 1, 1, -1.0f), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_cpu_batchnorm_backward(v, v, v, v, v, s, s, s, 2, 0, 1), UMT_ERR_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_with_p_0_is_the_identity),
        cmocka_unit_test(test_dropout_keeps_the_elements_of_the_shared_draw_scaled_by_one_over_keep),
        cmocka_unit_test(test_dropout_mask_repeats_for_a_seed_and_changes_with_it),
        cmocka_unit_test(test_dropout_from_first_draws_the_whole_batchs_elements),
        cmocka_unit_test(test_dropout_backward_accumulates_scaled_dy_where_kept),
        cmocka_unit_test(test_dropout_refuses_p_outside_0_to_1),
        cmocka_unit_test(test_batchnorm_train_normalises_each_channel_and_moves_running_stats),
        cmocka_unit_test(test_batchnorm_train_applies_gamma_and_beta_as_the_double_reference),
        cmocka_unit_test(test_batchnorm_with_one_value_per_channel_outputs_beta_and_decays_running_var),
        cmocka_unit_test(test_batchnorm_eval_normalises_with_the_running_statistics),
        cmocka_unit_test(test_batchnorm_backward_accumulates_the_three_term_formula),
        cmocka_unit_test(test_batchnorm_backward_matches_finite_differences_of_the_forward),
        cmocka_unit_test(test_batchnorm_refuses_empty_sizes_and_bad_momentum_or_eps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
