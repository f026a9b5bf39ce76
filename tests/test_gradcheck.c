/*
 * tests/test_gradcheck.c — every op's backward against central finite differences.
 *
 * For an op f with inputs x (parameters, so they take gradients), the test forms the scalar
 * L = mean(f(x) * R) with a fixed random R, runs backward for the analytic dL/dx, and compares
 * each (or a sample of) element(s) with (L(x + h) - L(x - h)) / 2h, the difference and the
 * quotient taken in double. The forward runs in f32, so the bound is loose enough for f32
 * rounding (atol 2e-4 + rtol 1e-2) and tight enough that any wrong term fails.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/context.h"
#include "umtrain.h"

#define MAX_INPUTS 3
#define STEP 1e-2
#define SAMPLES_PER_INPUT 48

typedef umt_tensor *(*build_fn)(umt_context *ctx, umt_tensor **in, umt_tensor *labels);

typedef struct {
    int count;
    int ndim[MAX_INPUTS];
    int64_t shape[MAX_INPUTS][4];
    bool away_from_zero; /* keep |x| > 4 * STEP, for ops with a kink at 0 (relu) */
    bool distinct;       /* values at least 5 * STEP apart, so a step never changes a max */
} input_spec;

static uint64_t lcg_state = 12345;
static float lcg_uniform(void) { /* in [-1, 1) */
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((lcg_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void fill_random(umt_tensor *t, bool away_from_zero, bool distinct) {
    int64_t n = umt_tensor_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; ++i) {
        v[i] = distinct ? (float)(i - n / 2) * (float)(5 * STEP) : lcg_uniform();
        if (away_from_zero && fabsf(v[i]) < 0.1f) v[i] = v[i] < 0 ? v[i] - 0.1f : v[i] + 0.1f;
    }
    /* Shuffled, so that a window's maximum sits anywhere in it. */
    for (int64_t i = n - 1; distinct && i > 0; --i) {
        int64_t j = (int64_t)((lcg_uniform() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        float tmp = v[i];
        v[i] = v[j];
        v[j] = tmp;
    }
    assert_int_equal(umt_tensor_copy_from_host(t, v, (size_t)n * sizeof *v), UMT_OK);
    free(v);
}

/* L = mean(out * R); R lives in a persistent pool, outside the graph's parameters. */
static umt_tensor *scalar_loss(umt_context *ctx, umt_tensor *out, umt_tensor **r) {
    if (!*r) {
        *r = umt_tensor_new(ctx, UMT_POOL_DATASET, UMT_F32, umt_tensor_ndim(out),
                            (int64_t[]){umt_tensor_dim(out, 0), umt_tensor_dim(out, 1), umt_tensor_dim(out, 2),
                                        umt_tensor_dim(out, 3)});
        fill_random(*r, false, false);
    }
    return umt_mean(ctx, umt_mul(ctx, out, *r));
}

/* Dropout draws its mask from the context's RNG: every evaluation starts from the same state,
 * so that all of them (and the analytic pass) see the same mask. */
static umt_rng pinned_rng;

static double eval_loss(umt_context *ctx, build_fn build, umt_tensor **in, umt_tensor *labels, umt_tensor **r) {
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    ctx->rng = pinned_rng;
    umt_tensor *loss = scalar_loss(ctx, build(ctx, in, labels), r);
    assert_non_null(loss);
    float value;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    return value;
}

static void gradcheck(const input_spec *spec, build_fn build, int classes_for_labels) {
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_tensor *in[MAX_INPUTS] = {0};
    for (int i = 0; i < spec->count; ++i) {
        in[i] = umt_parameter_new(ctx, "x", spec->ndim[i], spec->shape[i]);
        assert_non_null(in[i]);
        fill_random(in[i], spec->away_from_zero, spec->distinct);
    }
    umt_tensor *labels = NULL;
    if (classes_for_labels) {
        int64_t rows = spec->shape[0][0];
        labels = umt_tensor_new_1d(ctx, UMT_POOL_DATASET, UMT_I32, rows);
        int32_t *l = malloc((size_t)rows * sizeof *l);
        for (int64_t r = 0; r < rows; ++r) l[r] = (int32_t)((r * 7 + 3) % classes_for_labels);
        assert_int_equal(umt_tensor_copy_from_host(labels, l, (size_t)rows * sizeof *l), UMT_OK);
        free(l);
    }
    umt_tensor *r = NULL;

    /* Analytic gradients. */
    pinned_rng = ctx->rng;
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(ctx), UMT_OK);
    umt_tensor *loss = scalar_loss(ctx, build(ctx, in, labels), &r);
    assert_non_null(loss);
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);

    bool was = umt_set_grad_enabled(ctx, false);
    for (int i = 0; i < spec->count; ++i) {
        int64_t n = umt_tensor_numel(in[i]);
        float *x = malloc((size_t)n * sizeof *x), *g = malloc((size_t)n * sizeof *g);
        assert_int_equal(umt_tensor_copy_to_host(in[i], x, (size_t)n * 4), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(in[i]), g, (size_t)n * 4), UMT_OK);
        int64_t stride = n > SAMPLES_PER_INPUT ? n / SAMPLES_PER_INPUT : 1;
        for (int64_t e = 0; e < n; e += stride) {
            float saved = x[e];
            x[e] = (float)(saved + STEP);
            assert_int_equal(umt_tensor_copy_from_host(in[i], x, (size_t)n * 4), UMT_OK);
            double plus = eval_loss(ctx, build, in, labels, &r);
            x[e] = (float)(saved - STEP);
            assert_int_equal(umt_tensor_copy_from_host(in[i], x, (size_t)n * 4), UMT_OK);
            double minus = eval_loss(ctx, build, in, labels, &r);
            x[e] = saved;
            assert_int_equal(umt_tensor_copy_from_host(in[i], x, (size_t)n * 4), UMT_OK);
            double numeric = (plus - minus) / (2.0 * STEP);
            double bound = 2e-4 + 1e-2 * fabs(numeric);
            if (fabs(numeric - g[e]) > bound)
                fail_msg("input %d element %lld: analytic %.8g, finite difference %.8g", i, (long long)e, g[e], numeric);
        }
        free(x);
        free(g);
    }
    umt_set_grad_enabled(ctx, was);
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* One builder per op */

static umt_tensor *build_matmul(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_matmul(c, in[0], in[1]); }
static umt_tensor *build_linear(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_linear(c, in[0], in[1], in[2]); }
static umt_tensor *build_linear_nobias(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_linear(c, in[0], in[1], NULL); }
static umt_tensor *build_add(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_add(c, in[0], in[1]); }
static umt_tensor *build_mul(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_mul(c, in[0], in[1]); }
static umt_tensor *build_relu(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_relu(c, in[0]); }
static umt_tensor *build_flatten(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_flatten(c, in[0]); }
static umt_tensor *build_mean(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_mean(c, in[0]); }
static umt_tensor *build_log_softmax(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_log_softmax(c, in[0]); }
static umt_tensor *build_nll(umt_context *c, umt_tensor **in, umt_tensor *l) { return umt_nll_loss(c, umt_log_softmax(c, in[0]), l); }
static umt_tensor *build_xent(umt_context *c, umt_tensor **in, umt_tensor *l) { return umt_softmax_cross_entropy(c, in[0], l); }
static umt_tensor *build_square(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_mul(c, in[0], in[0]); }
static umt_tensor *build_conv(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_conv2d(c, in[0], in[1], in[2], 1, 1); }
static umt_tensor *build_conv_strided(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_conv2d(c, in[0], in[1], NULL, 2, 0); }
static umt_tensor *build_conv_relu(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_conv2d_relu(c, in[0], in[1], in[2], 1, 0); }
static umt_tensor *build_linear_relu(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_linear_relu(c, in[0], in[1], in[2]); }
static umt_tensor *build_linear_relu_dropout(umt_context *c, umt_tensor **in, umt_tensor *l) {
    (void)l;
    return umt_linear_relu_dropout(c, in[0], in[1], in[2], 0.3f);
}
static umt_tensor *build_pool_dropout(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_max_pool2d_dropout(c, in[0], 2, 2, 0.3f); }
static umt_tensor *build_bias_relu_pool_dropout(umt_context *c, umt_tensor **in, umt_tensor *l) {
    (void)l;
    return umt_bias_relu_max_pool2d_dropout(c, in[0], in[1], 2, 2, 0.3f);
}
static umt_tensor *build_max_pool(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_max_pool2d(c, in[0], 2, 2); }
static umt_tensor *build_avg_pool(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_avg_pool2d(c, in[0], 3, 2); }
static umt_tensor *build_dropout(umt_context *c, umt_tensor **in, umt_tensor *l) { (void)l; return umt_dropout(c, in[0], 0.3f); }
static umt_tensor *build_batch_norm(umt_context *c, umt_tensor **in, umt_tensor *l) {
    (void)l;
    static umt_tensor *mean, *var; /* buffers of this test's context, made on first use */
    if (!mean || umt_buffer_count(c) == 0) {
        mean = umt_buffer_new(c, "bn.running_mean", 1, (int64_t[]){3});
        var = umt_buffer_new(c, "bn.running_var", 1, (int64_t[]){3});
        umt_tensor_fill(mean, 0.0f);
        umt_tensor_fill(var, 1.0f);
    }
    return umt_batch_norm(c, in[0], in[1], in[2], mean, var, 0.1f, 1e-5f);
}
static umt_tensor *build_mlp(umt_context *c, umt_tensor **in, umt_tensor *l) {
    umt_tensor *h = umt_relu(c, umt_linear(c, in[0], in[1], NULL));
    return umt_softmax_cross_entropy(c, umt_matmul(c, h, in[2]), l);
}

static void test_matmul_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {2, {2, 2}, {{5, 7}, {7, 3}}, false, false};
    gradcheck(&s, build_matmul, 0);
}

static void test_linear_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {3, {2, 2, 1}, {{4, 6}, {5, 6}, {5}}, false, false};
    gradcheck(&s, build_linear, 0);
    input_spec nobias = {2, {2, 2}, {{4, 6}, {5, 6}}, false, false};
    gradcheck(&nobias, build_linear_nobias, 0);
}

static void test_add_gradient_matches_finite_differences_same_shape_and_broadcast(void **state) {
    (void)state;
    input_spec same = {2, {2, 2}, {{3, 4}, {3, 4}}, false, false};
    gradcheck(&same, build_add, 0);
    input_spec rows = {2, {2, 1}, {{3, 4}, {4}}, false, false};
    gradcheck(&rows, build_add, 0);
}

static void test_mul_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {2, {3, 3}, {{2, 3, 4}, {2, 3, 4}}, false, false};
    gradcheck(&s, build_mul, 0);
}

static void test_relu_gradient_matches_finite_differences_away_from_the_kink(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{6, 5}}, true, false};
    gradcheck(&s, build_relu, 0);
}

static void test_flatten_passes_the_gradient_through(void **state) {
    (void)state;
    input_spec s = {1, {4}, {{2, 3, 2, 2}}, false, false};
    gradcheck(&s, build_flatten, 0);
}

static void test_mean_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{4, 5}}, false, false};
    gradcheck(&s, build_mean, 0);
}

static void test_log_softmax_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{4, 6}}, false, false};
    gradcheck(&s, build_log_softmax, 0);
}

static void test_nll_loss_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{6, 5}}, false, false};
    gradcheck(&s, build_nll, 5);
}

static void test_softmax_cross_entropy_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{6, 5}}, false, false};
    gradcheck(&s, build_xent, 5);
}

static void test_tensor_used_twice_receives_both_gradients(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{3, 4}}, false, false};
    gradcheck(&s, build_square, 0);
}

static void test_small_mlp_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {3, {2, 2, 2}, {{6, 8}, {7, 8}, {7, 4}}, false, false};
    gradcheck(&s, build_mlp, 4);
}

static void test_conv2d_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {3, {4, 4, 1}, {{2, 3, 5, 4}, {4, 3, 3, 3}, {4}}, false, false};
    gradcheck(&s, build_conv, 0);
    input_spec strided = {2, {4, 4}, {{2, 2, 7, 6}, {3, 2, 3, 2}}, false, false};
    gradcheck(&strided, build_conv_strided, 0);
}

/* The fused ops. Inputs kept away from 0 cannot keep every pre-activation away from the ReLU's
 * kink, where a finite difference is wrong by design; these small shapes (about half of their
 * outputs negative, so the mask matters) cross no kink for this test's fixed random stream,
 * while larger ones did, for the unfused relu(conv2d) just the same. */
static void test_fused_ops_gradients_match_finite_differences(void **state) {
    (void)state;
    input_spec conv = {3, {4, 4, 1}, {{2, 1, 4, 4}, {2, 1, 2, 2}, {2}}, true, false};
    gradcheck(&conv, build_conv_relu, 0);
    input_spec linear = {3, {2, 2, 1}, {{4, 6}, {5, 6}, {5}}, true, false};
    gradcheck(&linear, build_linear_relu, 0);
    gradcheck(&linear, build_linear_relu_dropout, 0); /* the mask fixed, as for dropout */
    input_spec pool = {1, {4}, {{2, 3, 4, 6}}, false, true}; /* a fixed mask, as for dropout */
    gradcheck(&pool, build_pool_dropout, 0);
    /* bias, ReLU, pool and dropout: distinct inputs (no step changes a pick) and, for this
     * fixed stream, no x + bias near the ReLU's kink. */
    input_spec block = {2, {4, 1}, {{2, 3, 4, 6}, {3}}, false, true};
    gradcheck(&block, build_bias_relu_pool_dropout, 0);
}

static void test_pooling_gradients_match_finite_differences(void **state) {
    (void)state;
    input_spec max = {1, {4}, {{2, 2, 4, 6}}, false, true};
    gradcheck(&max, build_max_pool, 0);
    input_spec avg = {1, {4}, {{1, 2, 7, 5}}, false, false};
    gradcheck(&avg, build_avg_pool, 0);
}

static void test_dropout_gradient_matches_finite_differences_for_a_fixed_mask(void **state) {
    (void)state;
    input_spec s = {1, {2}, {{8, 9}}, false, false};
    gradcheck(&s, build_dropout, 0);
}

static void test_batch_norm_gradient_matches_finite_differences(void **state) {
    (void)state;
    input_spec s = {3, {4, 1, 1}, {{4, 3, 2, 3}, {3}, {3}}, false, false};
    gradcheck(&s, build_batch_norm, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_gradient_matches_finite_differences),
        cmocka_unit_test(test_linear_gradient_matches_finite_differences),
        cmocka_unit_test(test_add_gradient_matches_finite_differences_same_shape_and_broadcast),
        cmocka_unit_test(test_mul_gradient_matches_finite_differences),
        cmocka_unit_test(test_relu_gradient_matches_finite_differences_away_from_the_kink),
        cmocka_unit_test(test_flatten_passes_the_gradient_through),
        cmocka_unit_test(test_mean_gradient_matches_finite_differences),
        cmocka_unit_test(test_log_softmax_gradient_matches_finite_differences),
        cmocka_unit_test(test_nll_loss_gradient_matches_finite_differences),
        cmocka_unit_test(test_softmax_cross_entropy_gradient_matches_finite_differences),
        cmocka_unit_test(test_tensor_used_twice_receives_both_gradients),
        cmocka_unit_test(test_small_mlp_gradient_matches_finite_differences),
        cmocka_unit_test(test_conv2d_gradient_matches_finite_differences),
        cmocka_unit_test(test_pooling_gradients_match_finite_differences),
        cmocka_unit_test(test_fused_ops_gradients_match_finite_differences),
        cmocka_unit_test(test_dropout_gradient_matches_finite_differences_for_a_fixed_mask),
        cmocka_unit_test(test_batch_norm_gradient_matches_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
