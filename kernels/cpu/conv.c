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
 * image's cols; images are processed one after another, the threads each filling and using their
 * own block of it (below).
 */
#include <stdint.h>
#include <string.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"

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

/* The output columns ox whose tap j falls inside the input row: [*first, *end), where
 * 0 <= ox * stride - pad + j < w (the others read the padding). */
static void columns_inside(const umt_conv_shape *s, int64_t j, int64_t *first, int64_t *end) {
    int64_t before = s->pad - j, after = s->w + s->pad - j; /* ox * stride must reach the one, stay below the other */
    *first = before > 0 ? (before + s->stride - 1) / s->stride : 0;
    *end = after > 0 ? (after + s->stride - 1) / s->stride : 0;
    if (*first > s->q) *first = s->q;
    if (*end > s->q) *end = s->q;
    if (*end < *first) *end = *first;
}

/* Rows [row_first, row_end) of cols [c*r*s, p*q], pixels [px_first, px_end) of each, for one image
 * x_img [c, h, w]: row (ci, i, j) holds the input under filter tap (i, j) of channel ci for each
 * output pixel, 0 where the tap falls in the padding. A part of a kernel fills its own block. */
static void im2col(const umt_conv_shape *s, const float *x_img, float *cols, int64_t row_first, int64_t row_end,
                   int64_t px_first, int64_t px_end) {
    int64_t pixels = s->p * s->q;
    for (int64_t row = row_first; row < row_end; row++) {
        int64_t ci = row / (s->r * s->s), i = row / s->s % s->r, j = row % s->s, inside_first, inside_end;
        columns_inside(s, j, &inside_first, &inside_end);
        const float *plane = x_img + ci * s->h * s->w;
        float *out = cols + row * pixels;
        for (int64_t px = px_first; px < px_end;) {
            int64_t oy = px / s->q, ox = px % s->q, ox_end = px_end - oy * s->q < s->q ? px_end - oy * s->q : s->q;
            int64_t iy = oy * s->stride - s->pad + i, lo = inside_first, hi = inside_end;
            if (iy < 0 || iy >= s->h) lo = hi = ox_end; /* a padding row: all zeros */
            lo = lo < ox ? ox : lo > ox_end ? ox_end : lo;
            hi = hi < lo ? lo : hi > ox_end ? ox_end : hi;
            float *dst = out + oy * s->q;
            const float *in_row = plane + (lo < hi ? iy : 0) * s->w; /* in_row[ox * stride + shift] under ox */
            int64_t shift = j - s->pad;
            for (int64_t x = ox; x < lo; x++) dst[x] = 0.0f;
            if (s->stride == 1) {
                if (hi > lo) memcpy(dst + lo, in_row + lo + shift, (size_t)(hi - lo) * sizeof *dst);
            } else {
                for (int64_t x = lo; x < hi; x++) dst[x] = in_row[x * s->stride + shift];
            }
            for (int64_t x = hi; x < ox_end; x++) dst[x] = 0.0f;
            px = oy * s->q + ox_end;
        }
    }
}

/* dx_img [c, h, w] += each entry of cols rows [c_first*r*s, c_end*r*s) (channels [c_first, c_end))
 * put back where im2col took it; padding taps are dropped. Each input pixel receives its terms in
 * the order (i, j, oy, ox), whichever part runs the channel. */
static void col2im_accumulate(const umt_conv_shape *s, const float *cols, float *dx_img, int64_t c_first,
                              int64_t c_end) {
    int64_t pixels = s->p * s->q;
    for (int64_t ci = c_first; ci < c_end; ci++) {
        float *plane = dx_img + ci * s->h * s->w;
        for (int64_t i = 0; i < s->r; i++) {
            for (int64_t j = 0; j < s->s; j++) {
                const float *row = cols + ((ci * s->r + i) * s->s + j) * pixels;
                int64_t lo, hi;
                columns_inside(s, j, &lo, &hi);
                for (int64_t oy = 0; oy < s->p; oy++) {
                    int64_t iy = oy * s->stride - s->pad + i;
                    if (iy < 0 || iy >= s->h) continue;
                    float *restrict dst = plane + iy * s->w; /* dst[ox * stride + shift] under ox */
                    const float *restrict src = row + oy * s->q;
                    int64_t shift = j - s->pad;
                    if (s->stride == 1) {
                        for (int64_t ox = lo; ox < hi; ox++) dst[ox + shift] += src[ox];
                    } else {
                        for (int64_t ox = lo; ox < hi; ox++) dst[ox * s->stride + shift] += src[ox];
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Convolution, forward and backward, on the CPU backend's threads                             */

/* Each part owns a block of the outputs, for every image: forward a range of output pixels,
 * backward_data a range of input channels, backward_filter a range of filter taps (columns of
 * dw). Its block of cols (the workspace) is its own too, so parts never wait for each other, and
 * every output is reduced in the one-thread order: images in turn, each image's terms in the
 * GEMM's order. */
typedef struct {
    const umt_conv_shape *s;
    const float *x, *w, *dy;
    float *y, *dx, *dw, *cols;
} conv_job;

/* Work of at least this many multiply-adds per part (see gemm.c). */
enum { CONV_MIN_PART = 1 << 20 };

static int conv_parts(const umt_conv_shape *s, int64_t units) {
    double work = (double)s->n * (double)s->k * (double)(s->c * s->r * s->s) * (double)(s->p * s->q);
    int by_units = umt_cpu_parts(units, 1);
    int by_work = work / CONV_MIN_PART >= (double)by_units ? by_units : umt_cpu_parts((int64_t)work, CONV_MIN_PART);
    return by_units < by_work ? by_units : by_work;
}

static void forward_part(void *arg, int part, int parts) {
    const conv_job *job = arg;
    const umt_conv_shape *s = job->s;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q, first, end;
    umt_cpu_part_range(pixels, 16, part, parts, &first, &end); /* 16 floats: a cache line */
    for (int64_t img = 0; img < s->n; img++) {
        im2col(s, job->x + img * s->c * s->h * s->w, job->cols, 0, taps, first, end);
        umt_cpu_gemm_one_thread(false, false, s->k, end - first, taps, 1.0f, job->w, taps, job->cols + first, pixels,
                                0.0f, job->y + img * s->k * pixels + first, pixels);
    }
}

static void backward_data_part(void *arg, int part, int parts) {
    const conv_job *job = arg;
    const umt_conv_shape *s = job->s;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q, per_channel = s->r * s->s, first, end;
    umt_cpu_part_range(s->c, 1, part, parts, &first, &end);
    for (int64_t img = 0; img < s->n; img++) {
        /* cols rows of these channels = those rows of w^T times dy_img */
        umt_cpu_gemm_one_thread(true, false, (end - first) * per_channel, pixels, s->k, 1.0f,
                                job->w + first * per_channel, taps, job->dy + img * s->k * pixels, pixels, 0.0f,
                                job->cols + first * per_channel * pixels, pixels);
        col2im_accumulate(s, job->cols, job->dx + img * s->c * s->h * s->w, first, end);
    }
}

static void backward_filter_part(void *arg, int part, int parts) {
    const conv_job *job = arg;
    const umt_conv_shape *s = job->s;
    int64_t taps = s->c * s->r * s->s, pixels = s->p * s->q, first, end;
    umt_cpu_part_range(taps, 1, part, parts, &first, &end);
    /* beta 1: each image's contribution adds onto dw, which starts with what the caller had. */
    for (int64_t img = 0; img < s->n; img++) {
        im2col(s, job->x + img * s->c * s->h * s->w, job->cols, first, end, 0, pixels);
        umt_cpu_gemm_one_thread(false, true, s->k, end - first, pixels, 1.0f, job->dy + img * s->k * pixels, pixels,
                                job->cols + first * pixels, pixels, 1.0f, job->dw + first, taps);
    }
}

umt_status umt_cpu_conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                  void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_forward", shape, workspace, workspace_bytes));
    conv_job job = {.s = shape, .x = x, .w = w, .y = y, .cols = workspace};
    umt_cpu_parallel(conv_parts(shape, (shape->p * shape->q + 15) / 16), forward_part, &job);
    return UMT_OK;
}

umt_status umt_cpu_conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                        void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_backward_data", shape, workspace, workspace_bytes));
    conv_job job = {.s = shape, .w = w, .dy = dy, .dx = dx, .cols = workspace};
    umt_cpu_parallel(conv_parts(shape, shape->c), backward_data_part, &job);
    return UMT_OK;
}

umt_status umt_cpu_conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                          void *workspace, size_t workspace_bytes) {
    UMT_TRY(check_conv_call("conv2d_backward_filter", shape, workspace, workspace_bytes));
    conv_job job = {.s = shape, .x = x, .dy = dy, .dw = dw, .cols = workspace};
    umt_cpu_parallel(conv_parts(shape, shape->c * shape->r * shape->s), backward_filter_part, &job);
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

typedef struct {
    const float *dy;
    float *dbias;
    int64_t n, k, hw;
} channel_sum_job;

/* Channels [first, end): each channel's sum whole, on one thread. */
static void sum_channels(void *arg, int64_t first, int64_t end) {
    const channel_sum_job *job = arg;
    for (int64_t ch = first; ch < end; ch++) {
        double sum = 0.0;
        for (int64_t img = 0; img < job->n; img++) {
            const float *plane = job->dy + (img * job->k + ch) * job->hw;
            for (int64_t i = 0; i < job->hw; i++) sum += plane[i];
        }
        job->dbias[ch] = (float)((double)job->dbias[ch] + sum);
    }
}

umt_status umt_cpu_sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(umt_conv_check_channel_sizes("sum_channel_bias", n, k, hw));
    /* Each channel's n*hw terms summed in double, then added once: the result does not depend
     * on how a batch's terms were split, up to the final rounding. Threads split the channels. */
    channel_sum_job job = {dy, dbias, n, k, hw};
    if (n > 0 && hw > 0) umt_cpu_parallel_range(k, 1 + (16 << 10) / (n * hw), sum_channels, &job);
    return UMT_OK;
}
