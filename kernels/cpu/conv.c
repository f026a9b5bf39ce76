/*
 * kernels/cpu/conv.c — 2-D convolution (NCHW, dilation 1, no groups) as im2col + the blocked
 * GEMM, with its two backwards and the per-channel bias kernels.
 *
 * For one image, im2col lays the input patches out as a [c*r*s, p*q] matrix `cols`: row
 * (ci, i, j) holds, for every output pixel (oy, ox), the input value under filter tap (i, j)
 * of channel ci, or 0 where the tap falls in the padding. The filters w [k, c, r, s] read as a
 * [k, c*r*s] matrix, so the whole convolution of one image is one matrix product:
 *
 *     forward          y_img [k, p*q]     = w [k, c*r*s]      x cols [c*r*s, p*q]
 *     backward_data    cols  [c*r*s, p*q] = w^T [c*r*s, k]    x dy_img [k, p*q], then col2im into dx
 *     backward_filter  dw    [k, c*r*s]  += dy_img [k, p*q]   x cols^T [p*q, c*r*s]
 *
 * col2im is im2col's adjoint: it adds each column entry back onto the input pixel it came
 * from, so pixels under several overlapping taps receive the sum. The workspace holds one
 * image's cols; images are processed one after another.
 */
#include <stdint.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

/* ------------------------------------------------------------------------------------------ */
/* Shape checks                                                                                */

/* Every size positive, stride >= 1, pad >= 0, the filter fits the padded input, and p, q as
 * kernels/backend.h defines them: an op that computed them differently is caught here. */
umt_status umt_conv_check_shape(const char *op, const umt_conv_shape *s) {
    if (s->n < 1 || s->c < 1 || s->h < 1 || s->w < 1 || s->k < 1 || s->r < 1 || s->s < 1 || s->stride < 1 ||
        s->pad < 0) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "%s: n=%lld c=%lld h=%lld w=%lld k=%lld r=%lld s=%lld stride=%lld pad=%lld, expected sizes "
                        "and stride >= 1, pad >= 0",
                        op, (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k,
                        (long long)s->r, (long long)s->s, (long long)s->stride, (long long)s->pad);
    }
    if (s->h + 2 * s->pad < s->r || s->w + 2 * s->pad < s->s) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: filter %lldx%lld larger than the padded input %lldx%lld", op,
                        (long long)s->r, (long long)s->s, (long long)(s->h + 2 * s->pad),
                        (long long)(s->w + 2 * s->pad));
    }
    int64_t p = (s->h + 2 * s->pad - s->r) / s->stride + 1, q = (s->w + 2 * s->pad - s->s) / s->stride + 1;
    if (s->p != p || s->q != q) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: output %lldx%lld, expected %lldx%lld for this input and filter",
                        op, (long long)s->p, (long long)s->q, (long long)p, (long long)q);
    }
    return UMT_OK;
}

/* The elements of one image's cols, c*r*s*p*q, after checking the shape; their byte count
 * must fit in 64 bits. */
static umt_status cols_numel(const char *op, const umt_conv_shape *s, int64_t *numel) {
    UMT_TRY(umt_conv_check_shape(op, s));
    const int64_t factors[5] = {s->c, s->r, s->s, s->p, s->q};
    int64_t product = 1;
    for (int f = 0; f < 5; f++) {
        if (product > INT64_MAX / (int64_t)sizeof(float) / factors[f]) {
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: im2col columns of c*r*s*p*q floats overflow 64 bits", op);
        }
        product *= factors[f];
    }
    *numel = product;
    return UMT_OK;
}

/* The shape is valid and the workspace holds one image's cols. */
static umt_status check_conv_call(const char *op, const umt_conv_shape *s, const void *workspace,
                                  size_t workspace_bytes) {
    int64_t numel = 0;
    UMT_TRY(cols_numel(op, s, &numel));
    size_t needed = (size_t)numel * sizeof(float);
    if (workspace == NULL || workspace_bytes < needed) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: workspace %p of %zu bytes, expected at least %zu bytes", op,
                        workspace, workspace_bytes, needed);
    }
    return UMT_OK;
}

umt_status umt_cpu_conv2d_workspace_bytes(const umt_conv_shape *shape, size_t *bytes) {
    int64_t numel = 0;
    UMT_TRY(cols_numel("conv2d_workspace_bytes", shape, &numel));
    *bytes = (size_t)numel * sizeof(float);
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* im2col and its adjoint                                                                      */

/* cols [c*r*s, p*q] of one image x_img [c, h, w]; taps in the padding read 0. */
static void im2col(const umt_conv_shape *s, const float *x_img, float *cols) {
    int64_t pixels = s->p * s->q;
    for (int64_t ci = 0; ci < s->c; ci++) {
        const float *plane = x_img + ci * s->h * s->w;
        for (int64_t i = 0; i < s->r; i++) {
            for (int64_t j = 0; j < s->s; j++) {
                float *row = cols + ((ci * s->r + i) * s->s + j) * pixels;
                for (int64_t oy = 0; oy < s->p; oy++) {
                    int64_t iy = oy * s->stride - s->pad + i;
                    for (int64_t ox = 0; ox < s->q; ox++) {
                        int64_t ix = ox * s->stride - s->pad + j;
                        bool inside = iy >= 0 && iy < s->h && ix >= 0 && ix < s->w;
                        row[oy * s->q + ox] = inside ? plane[iy * s->w + ix] : 0.0f;
                    }
                }
            }
        }
    }
}

/* dx_img [c, h, w] += each entry of cols put back where im2col took it; padding taps are dropped. */
static void col2im_accumulate(const umt_conv_shape *s, const float *cols, float *dx_img) {
    int64_t pixels = s->p * s->q;
    for (int64_t ci = 0; ci < s->c; ci++) {
        float *plane = dx_img + ci * s->h * s->w;
        for (int64_t i = 0; i < s->r; i++) {
            for (int64_t j = 0; j < s->s; j++) {
                const float *row = cols + ((ci * s->r + i) * s->s + j) * pixels;
                for (int64_t oy = 0; oy < s->p; oy++) {
                    int64_t iy = oy * s->stride - s->pad + i;
                    if (iy < 0 || iy >= s->h) continue;
                    for (int64_t ox = 0; ox < s->q; ox++) {
                        int64_t ix = ox * s->stride - s->pad + j;
                        if (ix >= 0 && ix < s->w) plane[iy * s->w + ix] += row[oy * s->q + ox];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Convolution, forward and backward                                                           */

umt_status umt_cpu_conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                  void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_forward", shape, workspace, workspace_bytes));
    const umt_conv_shape *s = shape;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q;
    float *cols = workspace;
    for (int64_t img = 0; img < s->n; img++) {
        im2col(s, x + img * s->c * s->h * s->w, cols);
        UMT_TRY(umt_cpu_gemm(false, false, s->k, pixels, taps, 1.0f, w, taps, cols, pixels, 0.0f,
                             y + img * s->k * pixels, pixels));
    }
    return UMT_OK;
}

umt_status umt_cpu_conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                        void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_backward_data", shape, workspace, workspace_bytes));
    const umt_conv_shape *s = shape;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q;
    float *cols = workspace;
    for (int64_t img = 0; img < s->n; img++) {
        UMT_TRY(umt_cpu_gemm(true, false, taps, pixels, s->k, 1.0f, w, taps, dy + img * s->k * pixels, pixels, 0.0f,
                             cols, pixels));
        col2im_accumulate(s, cols, dx + img * s->c * s->h * s->w);
    }
    return UMT_OK;
}

umt_status umt_cpu_conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                          void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_backward_filter", shape, workspace, workspace_bytes));
    const umt_conv_shape *s = shape;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q;
    float *cols = workspace;
    /* beta 1: each image's contribution adds onto dw, which starts with what the caller had. */
    for (int64_t img = 0; img < s->n; img++) {
        im2col(s, x + img * s->c * s->h * s->w, cols);
        UMT_TRY(umt_cpu_gemm(false, true, s->k, taps, pixels, 1.0f, dy + img * s->k * pixels, pixels, cols, pixels,
                             1.0f, dw, taps));
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Per-channel bias                                                                            */

/* Refuses a negative count: n, k or hw of 0 is an empty tensor and does nothing. */
umt_status umt_conv_check_channel_sizes(const char *op, int64_t n, int64_t k, int64_t hw) {
    if (n < 0 || k < 0 || hw < 0) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n=%lld k=%lld hw=%lld, expected sizes >= 0", op, (long long)n,
                        (long long)k, (long long)hw);
    }
    return UMT_OK;
}

/* y = x + bias per channel; the ops pass y == x, which is the "y += bias" of kernels/backend.h. */
umt_status umt_cpu_add_channel_bias(const float *x, const float *bias, float *y, int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(umt_conv_check_channel_sizes("add_channel_bias", n, k, hw));
    for (int64_t img = 0; img < n; img++) {
        for (int64_t ch = 0; ch < k; ch++) {
            const float *x_plane = x + (img * k + ch) * hw;
            float *y_plane = y + (img * k + ch) * hw;
            for (int64_t i = 0; i < hw; i++) y_plane[i] = x_plane[i] + bias[ch];
        }
    }
    return UMT_OK;
}

umt_status umt_cpu_sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(umt_conv_check_channel_sizes("sum_channel_bias", n, k, hw));
    /* Each channel's n*hw terms summed in double, then added once: the result does not depend
     * on how a batch's terms were split, up to the final rounding. */
    for (int64_t ch = 0; ch < k; ch++) {
        double sum = 0.0;
        for (int64_t img = 0; img < n; img++) {
            const float *plane = dy + (img * k + ch) * hw;
            for (int64_t i = 0; i < hw; i++) sum += plane[i];
        }
        dbias[ch] = (float)((double)dbias[ch] + sum);
    }
    return UMT_OK;
}
