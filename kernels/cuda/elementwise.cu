/*
 * kernels/cuda/elementwise.cu — elementwise arithmetic, bias rows and ReLU, with their backwards.
 *
 * Semantics are those of kernels/backend.h and kernels/cpu/elementwise.c: the kernels named
 * accumulate* and *_backward ADD into their output. Outputs may alias inputs of the same shape,
 * so no pointer is __restrict__.
 *
 * Every kernel strides over the grid with 64-bit indices. Where the CPU multiplies then adds,
 * the intrinsics __fmul_rn / __fadd_rn keep nvcc from fusing the two into one FMA (one rounding
 * instead of two), so the results equal the CPU's bit for bit; only sum_rows, a reduction, adds
 * in another order.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"

/* sum_rows' block: 32 columns by 16 row groups (512 threads). */
enum { SUM_COLUMNS = 32, SUM_ROW_GROUPS = 16 };

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

static __global__ void keep_and_add_kernel(float *last, float *sum, const float *x, int64_t n) {
    FOR_EACH_INDEX(i, n) {
        float v = x[i]; /* x may be last or sum */
        last[i] = v;
        sum[i] = __fadd_rn(sum[i], v);
    }
}

/* dbias[c] += sum over r of dy[r, c]. A block takes 32 neighbouring columns (a warp reads 32
 * consecutive floats of a row) and 16 row groups: thread (x, y) sums rows y, y + 16, ... of its
 * column, then warp 0 adds the 16 partial sums of each column in a fixed order. The batch is
 * summed by 16 threads per column instead of one, and the result is still deterministic (it
 * differs from the CPU's row-by-row sum only by float rounding). */
static __global__ void sum_rows_kernel(const float *dy, float *dbias, int64_t rows, int64_t cols) {
    __shared__ float partial[SUM_ROW_GROUPS][SUM_COLUMNS];
    for (int64_t first = (int64_t)blockIdx.x * SUM_COLUMNS; first < cols; first += (int64_t)gridDim.x * SUM_COLUMNS) {
        int64_t c = first + threadIdx.x;
        float sum = 0.0f;
        if (c < cols) {
            for (int64_t r = threadIdx.y; r < rows; r += SUM_ROW_GROUPS) sum += dy[r * cols + c];
        }
        partial[threadIdx.y][threadIdx.x] = sum;
        __syncthreads();
        if (threadIdx.y == 0 && c < cols) {
            float total = 0.0f;
            for (int group = 0; group < SUM_ROW_GROUPS; group++) total += partial[group][threadIdx.x];
            dbias[c] += total;
        }
        /* The next column tile reuses partial. */
        __syncthreads();
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

extern "C" umt_status umt_cuda_keep_and_add(float *last, float *sum, const float *x, int64_t n) {
    LAUNCH_OVER(n, keep_and_add_kernel, last, sum, x, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return UMT_OK;
    int64_t tiles = (cols + SUM_COLUMNS - 1) / SUM_COLUMNS;
    dim3 block(SUM_COLUMNS, SUM_ROW_GROUPS);
    sum_rows_kernel<<<tiles < MAX_BLOCKS ? (unsigned int)tiles : (unsigned int)MAX_BLOCKS, block, 0,
                      umt_cuda_stream()>>>(dy, dbias, rows, cols);
    UMT_CUDA_LAUNCHED();
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
