/*
 * kernels/cpu/fused.c — bias + ReLU and its backward, max pool + dropout's backward, and bias +
 * ReLU + max pool (+ dropout) each way: the reference for kernels/cuda/fused.cu and pool.cu.
 *
 * On the CPU a fusion saves nothing worth the code: each slot is the composition of the
 * unfused kernels it replaces (or their loops, where composing would need a buffer), so the
 * fused op means exactly what the unfused ops mean. Only f32 reaches the CPU
 * (core/precision.c keeps bf16/f16 on CUDA).
 */
#include <math.h>
#include <string.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"

/* Planes of a pooling kernel per part of the CPU's threads: at least 64 KiB of input each. */
#define PLANES_PER_PART(s) (1 + (16 << 10) / ((s)->h * (s)->w))

static umt_status check_f32(const char *op, umt_dtype dtype, int64_t n, int64_t k, int64_t hw) {
    if (dtype != UMT_F32)
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: dtype %s on the CPU (expected f32)", op, umt_dtype_name(dtype));
    if (n < 0 || k < 0 || hw < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n=%lld k=%lld hw=%lld, expected sizes >= 0", op, (long long)n,
                        (long long)k, (long long)hw);
    return UMT_OK;
}

/* NHWC, and any layout with one pixel, is a matrix of n*hw rows by k channels. */
static bool channels_last(bool nhwc, int64_t hw) { return nhwc || hw == 1; }

umt_status umt_cpu_bias_relu(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y, int64_t n,
                             int64_t k, int64_t hw) {
    UMT_TRY(check_f32("bias_relu", dtype, n, k, hw));
    const float *in = x;
    if (bias) {
        UMT_TRY(channels_last(nhwc, hw) ? umt_cpu_add_rows(x, bias, y, n * hw, k)
                                        : umt_cpu_add_channel_bias(x, bias, y, n, k, hw));
        in = y;
    }
    return umt_cpu_relu(in, y, n * k * hw);
}

typedef struct {
    const float *y;
    float *dy;
} relu_mask_job;

/* relu_backward's rule (the gradient at 0 is 0), written over dy in place, elements [first, end). */
static void relu_mask(void *arg, int64_t first, int64_t end) {
    const relu_mask_job *job = arg;
    for (int64_t i = first; i < end; i++)
        if (!(job->y[i] > 0.0f)) job->dy[i] = 0.0f;
}

umt_status umt_cpu_bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                      int64_t k, int64_t hw) {
    UMT_TRY(check_f32("bias_relu_backward", dtype, n, k, hw));
    float *grad = dy;
    relu_mask_job job = {y, dy};
    umt_cpu_parallel_range(n * k * hw, 1 << 14, relu_mask, &job);
    if (!dbias) return UMT_OK;
    return channels_last(nhwc, hw) ? umt_cpu_sum_rows(grad, dbias, n * hw, k)
                                   : umt_cpu_sum_channel_bias(grad, dbias, n, k, hw);
}

/* bias_relu over the rows, then dropout_forward over its output in place, without a mask. */
umt_status umt_cpu_bias_relu_dropout(umt_dtype dtype, const void *x, const float *bias, void *y, int64_t rows,
                                     int64_t k, const umt_dropout_draw *drop) {
    UMT_TRY(umt_cpu_bias_relu(dtype, false, x, bias, y, rows, k, 1));
    if (!drop || drop->p == 0.0f) return UMT_OK;
    return umt_cpu_dropout_forward(y, y, NULL, rows * k, drop->first, drop->p, drop->seed, drop->seed_on_device);
}

typedef struct {
    const float *y;
    float *dy;
    float scale;
} dropped_mask_job;

/* dropout_backward into a zeroed gradient (0 + dy * scale where kept), then relu_backward's
 * mask: an element is kept and positive exactly where the dropout's output y is > 0. */
static void dropped_mask(void *arg, int64_t first, int64_t end) {
    const dropped_mask_job *job = arg;
    for (int64_t i = first; i < end; i++) job->dy[i] = job->y[i] > 0.0f ? 0.0f + job->dy[i] * job->scale : 0.0f;
}

umt_status umt_cpu_bias_relu_dropout_backward(umt_dtype dtype, const void *y, void *dy, float *dbias, int64_t rows,
                                              int64_t k, float p) {
    const char *op = "bias_relu_dropout_backward";
    UMT_TRY(check_f32(op, dtype, rows, k, 1));
    if (!(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g (expected 0 <= p < 1)", op, (double)p);
    if (p == 0.0f) return umt_cpu_bias_relu_backward(dtype, false, y, dy, dbias, rows, k, 1);
    dropped_mask_job job = {y, dy, 1.0f / (1.0f - p)}; /* the scale as the dropout kernels compute it */
    umt_cpu_parallel_range(rows * k, 1 << 14, dropped_mask, &job);
    return dbias ? umt_cpu_sum_rows(dy, dbias, rows, k) : UMT_OK;
}

/* What the CPU's fused pooling slots take: f32 NCHW, windows apart (each input in at most one
 * window: one addition per pick), a dropout probability in [0, 1). */
static umt_status check_pooled(const char *op, const umt_pool_shape *s, float p) {
    if (s->dtype != UMT_F32 || s->nhwc || s->stride < s->window || !(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "%s: dtype %s, %s, window %lld, stride %lld, p %g (expected f32 NCHW, stride >= window, "
                        "0 <= p < 1)", op, umt_dtype_name(s->dtype), s->nhwc ? "NHWC" : "NCHW", (long long)s->window,
                        (long long)s->stride, (double)p);
    return UMT_OK;
}

/* dropout_backward into the pool's output gradient, then max_pool_backward, without the
 * intermediate: each output's scaled gradient lands on its window's pick. */
umt_status umt_cpu_max_pool_dropout_backward(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                             const void *dy, void *dx, float p) {
    UMT_TRY(check_pooled("max_pool_dropout_backward", shape, p));
    float scale = 1.0f / (1.0f - p); /* as the dropout kernels compute it */
    const float *grad = dy;
    float *out = dx;
    int64_t planes = shape->n * shape->c, per_plane = shape->p * shape->q, hw = shape->h * shape->w;
    for (int64_t plane = 0; plane < planes; plane++)
        for (int64_t o = plane * per_plane; o < (plane + 1) * per_plane; o++) {
            if (argmax[o] < 0 || argmax[o] >= hw)
                return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                                "max_pool_dropout_backward: argmax[%lld] = %d, expected 0 <= index < %lld (h*w)",
                                (long long)o, argmax[o], (long long)hw);
            if (mask[o]) out[plane * hw + argmax[o]] += grad[o] * scale;
        }
    return UMT_OK;
}

/* bias_relu, then max_pool_forward's scan (first maximum; a NaN beats a number), per window,
 * without the full-size intermediate. Planes (one image's channel) are independent: each part of
 * the CPU's threads pools its own. */
typedef struct {
    const umt_pool_shape *s;
    const float *x, *bias;
    float *y;
    uint8_t *pick;
} pool_forward_job;

static void bias_relu_max_pool_planes(void *arg, int64_t first, int64_t end) {
    const pool_forward_job *job = arg;
    const umt_pool_shape *s = job->s;
    for (int64_t plane = first; plane < end; plane++) {
        const float *x_plane = job->x + plane * s->h * s->w;
        float b = job->bias[plane % s->c];
        for (int64_t oy = 0, o = plane * s->p * s->q; oy < s->p; oy++) {
            for (int64_t ox = 0; ox < s->q; ox++, o++) {
                const float *window = x_plane + oy * s->stride * s->w + ox * s->stride;
                int64_t best_at = 0;
                float best = 0.0f;
                for (int64_t i = 0; i < s->window; i++)
                    for (int64_t j = 0; j < s->window; j++) {
                        float v = window[i * s->w + j] + b;
                        v = v < 0.0f ? 0.0f : v; /* umt_cpu_relu's rule: a NaN passes */
                        if ((i == 0 && j == 0) || umt_cpu_takes_over(v, best)) best = v, best_at = i * s->window + j;
                    }
                job->y[o] = best;
                job->pick[o] = (uint8_t)best_at;
            }
        }
    }
}

umt_status umt_cpu_bias_relu_max_pool_dropout_forward(const umt_pool_shape *shape, const void *x, const float *bias,
                                                      void *y, uint8_t *pick, const umt_dropout_draw *drop) {
    const umt_pool_shape *s = shape;
    const char *op = "bias_relu_max_pool_dropout_forward";
    UMT_TRY(check_pooled(op, s, drop ? drop->p : 0.0f));
    if (s->window > 16) /* each pick is one byte */
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: window %lld (expected at most 16)", op, (long long)s->window);
    UMT_TRY(umt_cpu_check_pool_shape(op, s));
    if (drop && drop->first < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: first = %lld, expected >= 0", op, (long long)drop->first);
    pool_forward_job job = {s, x, bias, y, pick};
    umt_cpu_parallel_range(s->n * s->c, PLANES_PER_PART(s), bias_relu_max_pool_planes, &job);
    if (!drop || drop->p == 0.0f) return UMT_OK;
    return umt_cpu_dropout_forward(y, y, NULL, s->n * s->c * s->p * s->q, drop->first, drop->p, drop->seed,
                                   drop->seed_on_device);
}

/* dropout_backward and bias_relu_backward at the pooled size (the mask is y > 0), then
 * max_pool_backward's scatter (from window positions rather than plane indices), a plane per
 * part's turn: a plane's outputs pick only inputs of that plane. The bias sums come after, by
 * channel, from the finished gradient. */
typedef struct {
    const umt_pool_shape *s;
    const uint8_t *pick;
    const float *y;
    float *dy, *dx;
    bool dx_fresh;
    float scale;
} pool_backward_job;

static void pool_dropout_backward_planes(void *arg, int64_t first, int64_t end) {
    const pool_backward_job *job = arg;
    const umt_pool_shape *s = job->s;
    int64_t outputs = s->p * s->q, inputs = s->h * s->w;
    for (int64_t plane = first; plane < end; plane++) {
        float *grad = job->dy + plane * outputs;
        const float *out = job->y + plane * outputs;
        for (int64_t o = 0; o < outputs; o++) grad[o] = out[o] > 0.0f ? 0.0f + grad[o] * job->scale : 0.0f;
        if (!job->dx) continue;
        float *in = job->dx + plane * inputs;
        if (job->dx_fresh) memset(in, 0, (size_t)inputs * sizeof *in);
        const uint8_t *pick = job->pick + plane * outputs;
        for (int64_t oy = 0, o = 0; oy < s->p; oy++)
            for (int64_t ox = 0; ox < s->q; ox++, o++) {
                int64_t row = oy * s->stride + pick[o] / s->window, col = ox * s->stride + pick[o] % s->window;
                in[row * s->w + col] += grad[o];
            }
    }
}

umt_status umt_cpu_bias_relu_max_pool_dropout_backward(const umt_pool_shape *shape, const uint8_t *pick,
                                                       const void *y, void *dy, void *dx, bool dx_fresh, float *dbias,
                                                       float p) {
    const umt_pool_shape *s = shape;
    UMT_TRY(check_pooled("bias_relu_max_pool_dropout_backward", s, p));
    int64_t outputs = s->n * s->c * s->p * s->q;
    /* Every pick checked before anything is written, so that a bad one leaves dy and dx as they were. */
    for (int64_t o = 0; dx && o < outputs; o++) {
        if (pick[o] >= s->window * s->window)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                            "bias_relu_max_pool_dropout_backward: pick[%lld] = %d, expected < %lld (window^2)",
                            (long long)o, pick[o], (long long)(s->window * s->window));
    }
    pool_backward_job job = {s, pick, y, dy, dx, dx_fresh, 1.0f / (1.0f - p)};
    umt_cpu_parallel_range(s->n * s->c, PLANES_PER_PART(s), pool_dropout_backward_planes, &job);
    if (dbias) UMT_TRY(umt_cpu_sum_channel_bias(dy, dbias, s->n, s->c, s->p * s->q));
    return UMT_OK;
}
