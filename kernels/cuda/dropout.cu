/*
 * kernels/cuda/dropout.cu — inverted dropout, forward and backward (kernels/cpu/dropout.c is the
 * reference, and the results equal it bit for bit).
 *
 * Element i is kept when umt_dropout_keep(seed, i, p): the same inline hash as on the CPU
 * (kernels/backend.h compiles it for the device too), so both backends keep the same elements,
 * whatever order the threads run in. The scale 1/(1-p) is computed once on the host, in float,
 * exactly as the CPU does, and __fmul_rn / __fadd_rn keep nvcc from fusing the backward's
 * multiply-add into one FMA, which would round once where the CPU rounds twice.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

/* The CPU's check, in its words: p in [0, 1) (NaN fails), n >= 0. */
static umt_status check_dropout(const char *op, int64_t n, float p) {
    if (!(p >= 0.0f && p < 1.0f)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g, expected 0 <= p < 1", op, (double)p);
    }
    if (n < 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n = %lld, expected n >= 0", op, (long long)n);
    return UMT_OK;
}

/* A dropped element is written as 0, not x * 0, so a dropped NaN or infinity does not pass. */
static __global__ void dropout_forward_kernel(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first,
                                              float p, float scale, uint64_t seed, const uint64_t *seed_on_device) {
    if (seed_on_device) seed = *seed_on_device;
    FOR_EACH_INDEX(i, n) {
        bool keep = umt_dropout_keep(seed, (uint64_t)(first + i), p);
        if (mask) mask[i] = keep ? 1 : 0;
        y[i] = keep ? __fmul_rn(x[i], scale) : 0.0f;
    }
}

static __global__ void dropout_backward_kernel(const uint8_t *mask, const float *dy, float *dx, int64_t n,
                                               float scale) {
    FOR_EACH_INDEX(i, n) {
        if (mask[i]) dx[i] = __fadd_rn(dx[i], __fmul_rn(dy[i], scale));
    }
}

extern "C" umt_status umt_cuda_dropout_forward(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first,
                                               float p, uint64_t seed, const uint64_t *seed_on_device) {
    UMT_TRY(check_dropout("dropout_forward", n, p));
    if (first < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "dropout_forward: first = %lld, expected >= 0", (long long)first);
    if (n == 0) return UMT_OK;
    float scale = 1.0f / (1.0f - p);
    dropout_forward_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(x, y, mask, n, first, p, scale,
                                                                             seed, seed_on_device);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_dropout_backward(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p) {
    UMT_TRY(check_dropout("dropout_backward", n, p));
    if (n == 0) return UMT_OK;
    float scale = 1.0f / (1.0f - p);
    dropout_backward_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(mask, dy, dx, n, scale);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}
