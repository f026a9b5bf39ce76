/*
 * kernels/cpu/pool.c — max and average pooling over square windows (no padding), each next to
 * its backward.
 *
 * x [n, c, h, w] -> y [n, c, p, q]; output (oy, ox) covers input rows oy*stride ..
 * oy*stride + window - 1 and the same columns. Every channel plane is pooled on its own, so
 * the kernels walk n*c planes of h*w inputs and p*q outputs.
 *
 * Max pooling saves, per output, the index (iy*w + ix, within its plane) of the window element
 * it took, and backward adds dy there. Which element is taken, scanning rows then columns:
 * the first maximum (a later equal value does not replace it), except that a NaN beats any
 * number, as PyTorch propagates NaN through max pooling; among several NaNs the first wins.
 * Backwards accumulate: dx += ..., and overlapping windows (stride < window) add up.
 */
#include <math.h>
#include <stdint.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

/* Sizes positive, the window inside the input, p and q as the ops derive them, and plane
 * indices small enough for the int32 argmax. */
umt_status umt_cpu_check_pool_shape(const char *op, const umt_pool_shape *s) {
    if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->window < 1 || s->stride < 1) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "%s: n=%lld c=%lld h=%lld w=%lld window=%lld stride=%lld, expected all >= 1", op,
                        (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->window,
                        (long long)s->stride);
    }
    if (s->window > s->h || s->window > s->w) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: window %lld larger than the input %lldx%lld", op,
                        (long long)s->window, (long long)s->h, (long long)s->w);
    }
    int64_t p = (s->h - s->window) / s->stride + 1, q = (s->w - s->window) / s->stride + 1;
    if (s->p != p || s->q != q) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: output %lldx%lld, expected %lldx%lld for this input and window",
                        op, (long long)s->p, (long long)s->q, (long long)p, (long long)q);
    }
    if (s->h > INT32_MAX / s->w) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: plane %lldx%lld has more than INT32_MAX elements", op,
                        (long long)s->h, (long long)s->w);
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Max pooling                                                                                 */

/* The window of output (oy, ox) in one plane: its pick's index and value. */
static void max_of_window(const umt_pool_shape *s, const float *plane, int64_t oy, int64_t ox, float *max,
                          int32_t *index) {
    int64_t y0 = oy * s->stride, x0 = ox * s->stride;
    int64_t best_index = y0 * s->w + x0;
    float best = plane[best_index];
    for (int64_t i = 0; i < s->window; i++) {
        for (int64_t j = 0; j < s->window; j++) {
            int64_t at = (y0 + i) * s->w + x0 + j;
            if (umt_cpu_takes_over(plane[at], best)) {
                best = plane[at];
                best_index = at;
            }
        }
    }
    *max = best;
    *index = (int32_t)best_index;
}

umt_status umt_cpu_max_pool_forward(const umt_pool_shape *shape, const float *x, float *y, int32_t *argmax) {
    UMT_TRY(umt_cpu_check_pool_shape("max_pool_forward", shape));
    const umt_pool_shape *s = shape;
    for (int64_t plane = 0; plane < s->n * s->c; plane++) {
        const float *x_plane = x + plane * s->h * s->w;
        for (int64_t oy = 0; oy < s->p; oy++) {
            for (int64_t ox = 0; ox < s->q; ox++) {
                int64_t out = plane * s->p * s->q + oy * s->q + ox;
                max_of_window(s, x_plane, oy, ox, &y[out], &argmax[out]);
            }
        }
    }
    return UMT_OK;
}

umt_status umt_cpu_max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const float *dy, float *dx) {
    UMT_TRY(umt_cpu_check_pool_shape("max_pool_backward", shape));
    const umt_pool_shape *s = shape;
    int64_t plane_size = s->h * s->w, outputs = s->p * s->q;
    for (int64_t plane = 0; plane < s->n * s->c; plane++) {
        for (int64_t o = 0; o < outputs; o++) {
            int32_t index = argmax[plane * outputs + o];
            /* A corrupt argmax would write outside the plane: refuse rather than scribble. */
            if (index < 0 || index >= plane_size) {
                return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                                "max_pool_backward: argmax[%lld] = %d, expected 0 <= index < %lld (h*w)",
                                (long long)(plane * outputs + o), (int)index, (long long)plane_size);
            }
            dx[plane * plane_size + index] += dy[plane * outputs + o];
        }
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Average pooling                                                                             */

umt_status umt_cpu_avg_pool_forward(const umt_pool_shape *shape, const float *x, float *y) {
    UMT_TRY(umt_cpu_check_pool_shape("avg_pool_forward", shape));
    const umt_pool_shape *s = shape;
    double area = (double)(s->window * s->window);
    for (int64_t plane = 0; plane < s->n * s->c; plane++) {
        const float *x_plane = x + plane * s->h * s->w;
        float *y_plane = y + plane * s->p * s->q;
        for (int64_t oy = 0; oy < s->p; oy++) {
            for (int64_t ox = 0; ox < s->q; ox++) {
                double sum = 0.0;
                for (int64_t i = 0; i < s->window; i++) {
                    const float *row = x_plane + (oy * s->stride + i) * s->w + ox * s->stride;
                    for (int64_t j = 0; j < s->window; j++) sum += row[j];
                }
                y_plane[oy * s->q + ox] = (float)(sum / area);
            }
        }
    }
    return UMT_OK;
}

umt_status umt_cpu_avg_pool_backward(const umt_pool_shape *shape, const float *dy, float *dx) {
    UMT_TRY(umt_cpu_check_pool_shape("avg_pool_backward", shape));
    const umt_pool_shape *s = shape;
    float area = (float)(s->window * s->window);
    for (int64_t plane = 0; plane < s->n * s->c; plane++) {
        const float *dy_plane = dy + plane * s->p * s->q;
        float *dx_plane = dx + plane * s->h * s->w;
        for (int64_t oy = 0; oy < s->p; oy++) {
            for (int64_t ox = 0; ox < s->q; ox++) {
                /* Every element of the window had weight 1/area in the output. */
                float share = dy_plane[oy * s->q + ox] / area;
                for (int64_t i = 0; i < s->window; i++) {
                    float *row = dx_plane + (oy * s->stride + i) * s->w + ox * s->stride;
                    for (int64_t j = 0; j < s->window; j++) row[j] += share;
                }
            }
        }
    }
    return UMT_OK;
}
