/*
 * tests/test_cpu_cnn_kernels.c — the CPU reference kernels of convolutional layers against
 * direct double-precision formulas: convolution (forward and both backwards, through im2col +
 * GEMM, against the 7-nested-loop definition), channel bias, and max and average pooling
 * (ties, NaN, overlapping windows); also the backend table's CNN slots. Dropout and batch norm
 * are in tests/test_cpu_dropout_batchnorm.c. Every backward starts from non-zero gradients,
 * to check that it accumulates.
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
#include "tests/conv_shape.h"
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
/* Convolution against the direct definition                                                   */

/* Index helpers for the three tensors of a convolution. */
#define X_AT(t, img, ci, iy, ix) ((((img) * (t).c + (ci)) * (t).h + (iy)) * (t).w + (ix))
#define W_AT(t, ko, ci, i, j) ((((ko) * (t).c + (ci)) * (t).r + (i)) * (t).s + (j))
#define Y_AT(t, img, ko, oy, ox) ((((img) * (t).k + (ko)) * (t).p + (oy)) * (t).q + (ox))

/* y, dx and dw by the definition, in double, each with the sum of |terms| of its elements:
 * the scale of the rounding of any summation order. */
typedef struct {
    double *y, *y_scale, *dx, *dx_scale, *dw, *dw_scale;
} conv_reference;

static conv_reference conv_reference_new(umt_conv_shape t) {
    size_t x_numel = (size_t)(t.n * t.c * t.h * t.w), w_numel = (size_t)(t.k * t.c * t.r * t.s);
    size_t y_numel = (size_t)(t.n * t.k * t.p * t.q);
    conv_reference ref = {calloc(y_numel, sizeof(double)), calloc(y_numel, sizeof(double)),
                          calloc(x_numel, sizeof(double)), calloc(x_numel, sizeof(double)),
                          calloc(w_numel, sizeof(double)), calloc(w_numel, sizeof(double))};
    assert_true(ref.y && ref.y_scale && ref.dx && ref.dx_scale && ref.dw && ref.dw_scale);
    return ref;
}

static void conv_reference_free(conv_reference *ref) {
    double *blocks[] = {ref->y, ref->y_scale, ref->dx, ref->dx_scale, ref->dw, ref->dw_scale};
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) free(blocks[b]);
}

/* The seven loops of the definition: every (image, filter, channel, output pixel, tap) whose
 * tap lands inside the input contributes one product to y, dx and dw. */
static void conv_reference_compute(umt_conv_shape t, const float *x, const float *w, const float *dy,
                                   conv_reference *ref) {
    for (int64_t img = 0; img < t.n; img++)
        for (int64_t ko = 0; ko < t.k; ko++)
            for (int64_t ci = 0; ci < t.c; ci++)
                for (int64_t oy = 0; oy < t.p; oy++)
                    for (int64_t ox = 0; ox < t.q; ox++)
                        for (int64_t i = 0; i < t.r; i++)
                            for (int64_t j = 0; j < t.s; j++) {
                                int64_t iy = oy * t.stride - t.pad + i, ix = ox * t.stride - t.pad + j;
                                if (iy < 0 || iy >= t.h || ix < 0 || ix >= t.w) continue;
                                int64_t xe = X_AT(t, img, ci, iy, ix), we = W_AT(t, ko, ci, i, j);
                                int64_t ye = Y_AT(t, img, ko, oy, ox);
                                double xv = x[xe], wv = w[we], dyv = dy[ye];
                                ref->y[ye] += wv * xv;
                                ref->y_scale[ye] += fabs(wv * xv);
                                ref->dx[xe] += wv * dyv;
                                ref->dx_scale[xe] += fabs(wv * dyv);
                                ref->dw[we] += dyv * xv;
                                ref->dw_scale[we] += fabs(dyv * xv);
                            }
}

/* got against start + reference, each element within 1e-5 of its scale plus |start|. */
static void assert_matches_reference(const float *got, const float *start, const double *ref, const double *scale,
                                     int64_t numel, const char *what) {
    for (int64_t e = 0; e < numel; e++) {
        double base = start ? start[e] : 0.0;
        assert_within(got[e], base + ref[e], 1e-5 * (scale[e] + fabs(base)) + 1e-30, what, e);
    }
}

/* Forward into a NaN-filled y (it must overwrite every element), backwards onto random dx, dw. */
static void check_conv_case(umt_conv_shape t) {
    int64_t x_numel = t.n * t.c * t.h * t.w, w_numel = t.k * t.c * t.r * t.s, y_numel = t.n * t.k * t.p * t.q;
    size_t bytes = 0;
    assert_int_equal(umt_cpu_conv2d_workspace_bytes(&t, &bytes), UMT_OK);
    assert_int_equal(bytes, (size_t)(t.c * t.r * t.s * t.p * t.q) * sizeof(float));
    void *workspace = malloc(bytes);
    float *x = random_floats(x_numel), *w = random_floats(w_numel), *dy = random_floats(y_numel);
    float *y = malloc((size_t)y_numel * sizeof *y), *dx = random_floats(x_numel), *dw = random_floats(w_numel);
    float *dx_start = copy_floats(dx, x_numel), *dw_start = copy_floats(dw, w_numel);
    assert_true(workspace && y);
    for (int64_t e = 0; e < y_numel; e++) y[e] = NAN;
    conv_reference ref = conv_reference_new(t);
    conv_reference_compute(t, x, w, dy, &ref);

    assert_int_equal(umt_cpu_conv2d_forward(&t, x, w, y, workspace, bytes), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_backward_data(&t, w, dy, dx, workspace, bytes), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_backward_filter(&t, x, dy, dw, workspace, bytes), UMT_OK);
    assert_matches_reference(y, NULL, ref.y, ref.y_scale, y_numel, "conv y");
    assert_matches_reference(dx, dx_start, ref.dx, ref.dx_scale, x_numel, "conv dx");
    assert_matches_reference(dw, dw_start, ref.dw, ref.dw_scale, w_numel, "conv dw");

    conv_reference_free(&ref);
    void *blocks[] = {workspace, x, w, dy, y, dx, dw, dx_start, dw_start};
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) free(blocks[b]);
}

static void test_conv_forward_and_backwards_match_the_direct_definition_on_several_shapes(void **state) {
    (void)state;
    lcg_seed(2024);
    check_conv_case(conv_shape(1, 1, 5, 5, 1, 3, 3, 1, 0));
    check_conv_case(conv_shape(2, 3, 7, 6, 4, 3, 3, 1, 1));
    check_conv_case(conv_shape(2, 3, 7, 6, 4, 3, 3, 2, 0)); /* stride 2: the last input column is never read */
    check_conv_case(conv_shape(3, 2, 8, 8, 3, 5, 5, 1, 2));
    check_conv_case(conv_shape(2, 4, 5, 3, 3, 1, 1, 1, 0)); /* 1x1 filters: a per-pixel matrix product */
    check_conv_case(conv_shape(2, 2, 9, 8, 3, 3, 2, 2, 1)); /* non-square filter, stride and padding together */
    check_conv_case(conv_shape(2, 16, 12, 12, 20, 3, 3, 1, 1)); /* c*r*s = 144 > one GEMM panel depth */
}

static void test_conv_refuses_inconsistent_shapes_and_short_workspaces(void **state) {
    (void)state;
    float x[25] = {0}, w[9] = {0}, y[9], workspace[81];
    umt_conv_shape t = conv_shape(1, 1, 5, 5, 1, 3, 3, 1, 0);
    size_t bytes = sizeof workspace;
    assert_int_equal(umt_cpu_conv2d_forward(&t, x, w, y, workspace, bytes), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_forward(&t, x, w, y, workspace, 80 * sizeof(float)), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("expected at least 324 bytes");
    assert_int_equal(umt_cpu_conv2d_backward_data(&t, w, y, x, NULL, bytes), UMT_ERR_INVALID_ARGUMENT);
    umt_conv_shape wrong = t;
    wrong.p = 4;
    assert_int_equal(umt_cpu_conv2d_backward_filter(&wrong, x, y, w, workspace, bytes), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("expected 3x3");
    umt_conv_shape empty = t;
    empty.k = 0;
    assert_int_equal(umt_cpu_conv2d_workspace_bytes(&empty, &bytes), UMT_ERR_INVALID_ARGUMENT);
    umt_conv_shape too_big = conv_shape(1, 1, 2, 2, 1, 5, 5, 1, 1);
    assert_int_equal(umt_cpu_conv2d_workspace_bytes(&too_big, &bytes), UMT_ERR_INVALID_ARGUMENT);
}

static void test_channel_bias_adds_per_channel_and_its_sum_accumulates(void **state) {
    (void)state;
    enum { N = 2, K = 3, HW = 4, NUMEL = N * K * HW };
    lcg_seed(7);
    float *x = random_floats(NUMEL), *y = random_floats(NUMEL), bias[K] = {0.5f, -1.0f, 2.0f};
    float *in_place = copy_floats(x, NUMEL), dbias[K] = {1.0f, 2.0f, 3.0f};
    assert_int_equal(umt_cpu_add_channel_bias(x, bias, y, N, K, HW), UMT_OK);
    assert_int_equal(umt_cpu_add_channel_bias(in_place, bias, in_place, N, K, HW), UMT_OK);
    for (int64_t e = 0; e < NUMEL; e++) {
        float want = x[e] + bias[(e / HW) % K];
        assert_within(y[e], want, 0.0, "bias y", e);
        assert_within(in_place[e], want, 0.0, "bias in place", e);
    }
    assert_int_equal(umt_cpu_sum_channel_bias(x, dbias, N, K, HW), UMT_OK);
    for (int64_t ch = 0; ch < K; ch++) {
        double sum = ch + 1.0;
        for (int64_t e = 0; e < NUMEL; e++) sum += (e / HW) % K == ch ? x[e] : 0.0;
        assert_within(dbias[ch], sum, 1e-6, "dbias", ch);
    }
    free(x);
    free(y);
    free(in_place);
}

/* ------------------------------------------------------------------------------------------ */
/* Pooling                                                                                     */

static umt_pool_shape pool_shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t window, int64_t stride) {
    return (umt_pool_shape){.n = n, .c = c, .h = h, .w = w, .p = (h - window) / stride + 1,
                            .q = (w - window) / stride + 1, .window = window, .stride = stride};
}

static void test_max_pool_2x2_takes_the_first_of_tied_maxima(void **state) {
    (void)state;
    const float x[16] = {1, 3, 2, 2, /**/ 3, 0, 2, 1, /**/ 5, 5, -1, -2, /**/ 5, 5, -3, -1};
    const float want_y[4] = {3, 2, 5, -1};
    const int32_t want_index[4] = {1, 2, 8, 10};
    umt_pool_shape t = pool_shape(1, 1, 4, 4, 2, 2);
    float y[4];
    int32_t argmax[4];
    assert_int_equal(umt_cpu_max_pool_forward(&t, x, y, argmax), UMT_OK);
    for (int o = 0; o < 4; o++) {
        assert_within(y[o], want_y[o], 0.0, "max y", o);
        assert_int_equal(argmax[o], want_index[o]);
    }
}

static void test_max_pool_lets_the_first_nan_of_a_window_win(void **state) {
    (void)state;
    const float x[8] = {1, NAN, 9, 2, /**/ NAN, 7, -INFINITY, -INFINITY};
    umt_pool_shape t = pool_shape(1, 1, 2, 4, 2, 2);
    float y[2];
    int32_t argmax[2];
    assert_int_equal(umt_cpu_max_pool_forward(&t, x, y, argmax), UMT_OK);
    assert_true(isnan(y[0]));
    assert_int_equal(argmax[0], 1); /* index 4 is a later NaN */
    assert_within(y[1], 9.0, 0.0, "max y", 1);
    assert_int_equal(argmax[1], 2);
}

/* Random planes against a direct scan (first maximum), then backward against routing by hand. */
static void test_max_pool_3x3_stride_2_overlapping_matches_direct_scan_and_backward_accumulates(void **state) {
    (void)state;
    umt_pool_shape t = pool_shape(2, 3, 7, 8, 3, 2);
    int64_t x_numel = t.n * t.c * t.h * t.w, y_numel = t.n * t.c * t.p * t.q;
    lcg_seed(99);
    float *x = random_floats(x_numel), *y = random_floats(y_numel), *dy = random_floats(y_numel);
    float *dx = random_floats(x_numel);
    double *dx_want = malloc((size_t)x_numel * sizeof *dx_want);
    int32_t *argmax = malloc((size_t)y_numel * sizeof *argmax);
    assert_true(dx_want && argmax);
    for (int64_t e = 0; e < x_numel; e++) dx_want[e] = dx[e];
    assert_int_equal(umt_cpu_max_pool_forward(&t, x, y, argmax), UMT_OK);
    for (int64_t plane = 0; plane < t.n * t.c; plane++) {
        for (int64_t oy = 0; oy < t.p; oy++) {
            for (int64_t ox = 0; ox < t.q; ox++) {
                int64_t o = (plane * t.p + oy) * t.q + ox, best = -1;
                for (int64_t i = 0; i < 3; i++) {
                    for (int64_t j = 0; j < 3; j++) {
                        int64_t at = (oy * 2 + i) * t.w + ox * 2 + j;
                        if (best < 0 || x[plane * t.h * t.w + at] > x[plane * t.h * t.w + best]) best = at;
                    }
                }
                assert_int_equal(argmax[o], best);
                assert_within(y[o], x[plane * t.h * t.w + best], 0.0, "max y", o);
                dx_want[plane * t.h * t.w + best] += dy[o];
            }
        }
    }
    assert_int_equal(umt_cpu_max_pool_backward(&t, argmax, dy, dx), UMT_OK);
    for (int64_t e = 0; e < x_numel; e++) assert_within(dx[e], dx_want[e], 1e-6, "max dx", e);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(dx_want);
    free(argmax);
}

static void test_max_pool_backward_adds_both_gradients_to_a_maximum_shared_by_two_windows(void **state) {
    (void)state;
    const float x[15] = {0, 0, 0, 0, 0, /**/ 0, 0, 9, 0, 0, /**/ 0, 0, 0, 0, 0};
    umt_pool_shape t = pool_shape(1, 1, 3, 5, 3, 2);
    float y[2], dy[2] = {0.25f, 0.5f}, dx[15];
    int32_t argmax[2];
    for (int e = 0; e < 15; e++) dx[e] = 1.0f;
    assert_int_equal(umt_cpu_max_pool_forward(&t, x, y, argmax), UMT_OK);
    assert_int_equal(argmax[0], 7);
    assert_int_equal(argmax[1], 7);
    assert_int_equal(umt_cpu_max_pool_backward(&t, argmax, dy, dx), UMT_OK);
    for (int e = 0; e < 15; e++) assert_within(dx[e], e == 7 ? 1.75 : 1.0, 0.0, "max dx", e);
}

static void test_avg_pool_forward_and_overlapping_backward_match_direct_sums(void **state) {
    (void)state;
    umt_pool_shape t = pool_shape(2, 2, 7, 9, 3, 2);
    int64_t x_numel = t.n * t.c * t.h * t.w, y_numel = t.n * t.c * t.p * t.q;
    lcg_seed(5);
    float *x = random_floats(x_numel), *y = random_floats(y_numel), *dy = random_floats(y_numel);
    float *dx = random_floats(x_numel);
    double *dx_want = malloc((size_t)x_numel * sizeof *dx_want);
    assert_non_null(dx_want);
    for (int64_t e = 0; e < x_numel; e++) dx_want[e] = dx[e];
    assert_int_equal(umt_cpu_avg_pool_forward(&t, x, y), UMT_OK);
    assert_int_equal(umt_cpu_avg_pool_backward(&t, dy, dx), UMT_OK);
    for (int64_t plane = 0; plane < t.n * t.c; plane++) {
        for (int64_t o = 0; o < t.p * t.q; o++) {
            int64_t oy = o / t.q, ox = o % t.q;
            double sum = 0.0;
            for (int64_t i = 0; i < 3; i++) {
                for (int64_t j = 0; j < 3; j++) {
                    int64_t at = plane * t.h * t.w + (oy * 2 + i) * t.w + ox * 2 + j;
                    sum += x[at];
                    dx_want[at] += dy[plane * t.p * t.q + o] / 9.0;
                }
            }
            assert_within(y[plane * t.p * t.q + o], sum / 9.0, 1e-6, "avg y", plane * t.p * t.q + o);
        }
    }
    for (int64_t e = 0; e < x_numel; e++) assert_within(dx[e], dx_want[e], 1e-6, "avg dx", e);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(dx_want);
}

static void test_pooling_refuses_bad_shapes_and_out_of_plane_argmax(void **state) {
    (void)state;
    float x[16] = {0}, y[4], dy[4] = {0};
    int32_t argmax[4] = {0, 1, 2, 16};
    umt_pool_shape t = pool_shape(1, 1, 4, 4, 2, 2);
    assert_int_equal(umt_cpu_max_pool_backward(&t, argmax, dy, x), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("argmax[3] = 16");
    umt_pool_shape wrong = t;
    wrong.q = 3;
    assert_int_equal(umt_cpu_avg_pool_forward(&wrong, x, y), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("expected 2x2");
    umt_pool_shape too_big = t;
    too_big.window = 5;
    assert_int_equal(umt_cpu_max_pool_forward(&too_big, x, y, argmax), UMT_ERR_INVALID_ARGUMENT);
    umt_pool_shape no_stride = t;
    no_stride.stride = 0;
    assert_int_equal(umt_cpu_avg_pool_backward(&no_stride, dy, x), UMT_ERR_INVALID_ARGUMENT);
}

static void test_cpu_backend_fills_the_cnn_slots_with_these_kernels(void **state) {
    (void)state;
    const umt_backend *cpu = umt_cpu_backend();
    assert_ptr_equal(cpu->f32.conv2d_workspace_bytes, umt_cpu_conv2d_workspace_bytes);
    assert_ptr_equal(cpu->f32.conv2d_forward, umt_cpu_conv2d_forward);
    assert_ptr_equal(cpu->f32.conv2d_backward_data, umt_cpu_conv2d_backward_data);
    assert_ptr_equal(cpu->f32.conv2d_backward_filter, umt_cpu_conv2d_backward_filter);
    assert_ptr_equal(cpu->f32.add_channel_bias, umt_cpu_add_channel_bias);
    assert_ptr_equal(cpu->f32.sum_channel_bias, umt_cpu_sum_channel_bias);
    assert_ptr_equal(cpu->f32.max_pool_forward, umt_cpu_max_pool_forward);
    assert_ptr_equal(cpu->f32.max_pool_backward, umt_cpu_max_pool_backward);
    assert_ptr_equal(cpu->f32.avg_pool_forward, umt_cpu_avg_pool_forward);
    assert_ptr_equal(cpu->f32.avg_pool_backward, umt_cpu_avg_pool_backward);
    assert_ptr_equal(cpu->f32.dropout_forward, umt_cpu_dropout_forward);
    assert_ptr_equal(cpu->f32.dropout_backward, umt_cpu_dropout_backward);
    assert_ptr_equal(cpu->f32.batchnorm_forward_train, umt_cpu_batchnorm_forward_train);
    assert_ptr_equal(cpu->f32.batchnorm_forward_eval, umt_cpu_batchnorm_forward_eval);
    assert_ptr_equal(cpu->f32.batchnorm_backward, umt_cpu_batchnorm_backward);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_forward_and_backwards_match_the_direct_definition_on_several_shapes),
        cmocka_unit_test(test_conv_refuses_inconsistent_shapes_and_short_workspaces),
        cmocka_unit_test(test_channel_bias_adds_per_channel_and_its_sum_accumulates),
        cmocka_unit_test(test_max_pool_2x2_takes_the_first_of_tied_maxima),
        cmocka_unit_test(test_max_pool_lets_the_first_nan_of_a_window_win),
        cmocka_unit_test(test_max_pool_3x3_stride_2_overlapping_matches_direct_scan_and_backward_accumulates),
        cmocka_unit_test(test_max_pool_backward_adds_both_gradients_to_a_maximum_shared_by_two_windows),
        cmocka_unit_test(test_avg_pool_forward_and_overlapping_backward_match_direct_sums),
        cmocka_unit_test(test_pooling_refuses_bad_shapes_and_out_of_plane_argmax),
        cmocka_unit_test(test_cpu_backend_fills_the_cnn_slots_with_these_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
