/*
 * kernels/cuda/elementwise.cu — elementwise arithmetic, bias rows and ReLU, with their backwards.
 *
 * Semantics are those of core/backend.h and kernels/cpu/elementwise.c: the kernels named
 * accumulate* and *_backward ADD into their output. Outputs may alias inputs of the same shape,
 * so no pointer is __restrict__.
 *
 * Every kernel strides over the grid with 64-bit indices. Where the CPU multiplies then adds,
 * the intrinsics __fmul_rn / __fadd_rn keep nvcc from fusing the two into one FMA (one rounding
 * instead of two), so the results equal the CPU's bit for bit.
 */
#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

enum { THREADS = 256, MAX_BLOCKS = 65535 };

/* Enough blocks for one element per thread, capped: the kernels stride over the rest. */
static unsigned int blocks_for(int64_t n) {
    int64_t blocks = (n + THREADS - 1) / THREADS;
    return blocks < 1 ? 1u : blocks > MAX_BLOCKS ? (unsigned int)MAX_BLOCKS : (unsigned int)blocks;
}

#define FOR_EACH_INDEX(i, n)                                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Launches kernel over n elements on the compute stream; nothing to do for n <= 0. */
#define LAUNCH_OVER(n, kernel, ...)                                                                                \
    do {                                                                                                           \
        if ((n) > 0) {                                                                                             \
            kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(__VA_ARGS__);                                 \
            UMT_CUDA_LAUNCHED();                                                                                   \
        }                                                                                                          \
    } while (0)

static __global__ void add_kernel(const float *a, const float *b, float *out, int64_t n) {
    FOR_EACH_INDEX(i, n) out[i] = a[i] + b[i];
}

static __global__ void add_rows_kernel(const float *x, const float *bias, float *out, int64_t rows, int64_t cols) {
    FOR_EACH_INDEX(i, rows * cols) out[i] = x[i] + bias[i % cols];
}

static __global__ void accumulate_kernel(float *dst, const float *src, float alpha, int64_t n) {
    FOR_EACH_INDEX(i, n) dst[i] = __fadd_rn(dst[i], __fmul_rn(alpha, src[i]));
}

/* One thread per column walking the rows in order: the additions happen in the CPU's order (so
 * the sums match it exactly), and neighbouring threads read neighbouring columns of a row. The
 * batch dimension summed here is small enough that no tree reduction is needed. */
static __global__ void sum_rows_kernel(const float *dy, float *dbias, int64_t rows, int64_t cols) {
    FOR_EACH_INDEX(c, cols) {
        float sum = dbias[c];
        for (int64_t r = 0; r < rows; r++) sum += dy[r * cols + c];
        dbias[c] = sum;
    }
}

static __global__ void mul_kernel(const float *a, const float *b, float *out, int64_t n) {
    FOR_EACH_INDEX(i, n) out[i] = a[i] * b[i];
}

static __global__ void accumulate_product_kernel(float *dst, const float *a, const float *b, int64_t n) {
    FOR_EACH_INDEX(i, n) dst[i] = __fadd_rn(dst[i], __fmul_rn(a[i], b[i]));
}

/* "x < 0 ? 0 : x" lets a NaN through, as the CPU and PyTorch do, so divergence stays visible. */
static __global__ void relu_kernel(const float *x, float *y, int64_t n) {
    FOR_EACH_INDEX(i, n) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

static __global__ void relu_backward_kernel(const float *y, const float *dy, float *dx, int64_t n) {
    FOR_EACH_INDEX(i, n) {
        if (y[i] > 0.0f) dx[i] += dy[i];
    }
}

extern "C" umt_status umt_cuda_add(const float *a, const float *b, float *out, int64_t n) {
    LAUNCH_OVER(n, add_kernel, a, b, out, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_add_rows(const float *x, const float *bias, float *out, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return UMT_OK;
    LAUNCH_OVER(rows * cols, add_rows_kernel, x, bias, out, rows, cols);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_accumulate(float *dst, const float *src, float alpha, int64_t n) {
    LAUNCH_OVER(n, accumulate_kernel, dst, src, alpha, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols) {
    if (rows <= 0) return UMT_OK;
    LAUNCH_OVER(cols, sum_rows_kernel, dy, dbias, rows, cols);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_mul(const float *a, const float *b, float *out, int64_t n) {
    LAUNCH_OVER(n, mul_kernel, a, b, out, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_accumulate_product(float *dst, const float *a, const float *b, int64_t n) {
    LAUNCH_OVER(n, accumulate_product_kernel, dst, a, b, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_relu(const float *x, float *y, int64_t n) {
    LAUNCH_OVER(n, relu_kernel, x, y, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_relu_backward(const float *y, const float *dy, float *dx, int64_t n) {
    LAUNCH_OVER(n, relu_backward_kernel, y, dy, dx, n);
    return UMT_OK;
}
