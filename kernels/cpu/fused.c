/*
 * kernels/cpu/fused.c — bias + ReLU and its backward, and max pool + dropout's backward: the
 * reference for kernels/cuda/fused.cu.
 *
 * On the CPU a fusion saves nothing worth the code: each slot is the composition of the
 * unfused kernels it replaces (or their loops, where composing would need a buffer), so the
 * fused op means exactly what the unfused ops mean. Only f32 reaches the CPU
 * (core/precision.c keeps bf16/f16 on CUDA).
 */
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

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

umt_status umt_cpu_bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                      int64_t k, int64_t hw) {
    UMT_TRY(check_f32("bias_relu_backward", dtype, n, k, hw));
    const float *out = y;
    float *grad = dy;
    /* relu_backward's rule (the gradient at 0 is 0), written over dy in place. */
    for (int64_t i = 0; i < n * k * hw; i++)
        if (!(out[i] > 0.0f)) grad[i] = 0.0f;
    if (!dbias) return UMT_OK;
    return channels_last(nhwc, hw) ? umt_cpu_sum_rows(grad, dbias, n * hw, k)
                                   : umt_cpu_sum_channel_bias(grad, dbias, n, k, hw);
}

/* dropout_backward into the pool's output gradient, then max_pool_backward, without the
 * intermediate: each output's scaled gradient lands on its window's pick. */
umt_status umt_cpu_max_pool_dropout_backward(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                             const void *dy, void *dx, float p) {
    if (shape->dtype != UMT_F32 || shape->nhwc || shape->stride < shape->window || !(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "max_pool_dropout_backward: dtype %s, %s, window %lld, stride %lld, p %g (expected f32 NCHW, "
                        "stride >= window, 0 <= p < 1)", umt_dtype_name(shape->dtype), shape->nhwc ? "NHWC" : "NCHW",
                        (long long)shape->window, (long long)shape->stride, (double)p);
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
