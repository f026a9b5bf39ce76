/*
 * kernels/cuda/gemm.cu — single-precision matrix product through cuBLAS, row-major.
 *
 *     C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
 *
 * lda, ldb and ldc are row strides in elements, as in kernels/cpu/gemm.c.
 *
 * cuBLAS is column-major. A row-major [r, c] matrix with row stride ld is, read column-major,
 * its transpose: a [c, r] matrix with leading dimension ld. So the row-major C we want is the
 * column-major Cᵀ, and
 *
 *     Cᵀ = alpha * op(B)ᵀ op(A)ᵀ + beta * Cᵀ
 *
 * is one column-major GEMM with the operands swapped (B first), m and n swapped, and each
 * operand's transpose flag unchanged: B's buffer read column-major is already Bᵀ, which is
 * op(B)ᵀ when op is the identity, and transposing it again gives op(B)ᵀ when op is a transpose.
 * No data moves.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

/* C = beta * C over [m, n] with row stride ldc; beta = 0 writes zeros without reading C. */
static __global__ void scale_c_kernel(float *c, int64_t ldc, int64_t m, int64_t n, float beta) {
    int64_t count = m * n;
    FOR_EACH_INDEX(i, count) {
        float *element = c + (i / n) * ldc + i % n;
        *element = beta == 0.0f ? 0.0f : beta * *element;
    }
}

extern "C" umt_status umt_cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                    int64_t ldc) {
    UMT_TRY(umt_gemm_check_arguments(trans_a, trans_b, m, n, k, lda, ldb, ldc));
    cublasHandle_t handle = umt_cuda_cublas_handle();
    if (!handle) return umt_fail(UMT_ERR_STATE, "gemm: cuda backend not started (no cuBLAS handle)");
    if (m == 0 || n == 0) return UMT_OK;
    /* As in the CPU reference, alpha = 0 or k = 0 leaves C = beta * C without reading A or B.
     * Done here rather than by cuBLAS, which would refuse the leading dimension 0 that an empty
     * A or B may legitimately have. */
    if (alpha == 0.0f || k == 0) {
        if (beta == 1.0f) return UMT_OK;
        scale_c_kernel<<<blocks_for(m * n), THREADS, 0, umt_cuda_stream()>>>(c, ldc, m, n, beta);
        UMT_CUDA_LAUNCHED();
        return UMT_OK;
    }
    /* Swapped operands and sizes (see the top of the file). CUBLAS_COMPUTE_32F keeps the
     * products and sums in fp32; cuBLAS does not read C when beta is 0. The _64 entry point
     * takes the int64 sizes as they are. */
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    UMT_CUBLAS_TRY(cublasGemmEx_64(handle, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta,
                                   c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Mixed precision (core/precision.h)                                                          */

static cudaDataType_t cuda_dtype(umt_dtype dtype) {
    return dtype == UMT_BF16 ? CUDA_R_16BF : dtype == UMT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* C = beta * C for any float dtype of C (the alpha = 0 or k = 0 case, as above). */
static __global__ void scale_c_lp_kernel(void *c, umt_dtype dtype, int64_t ldc, int64_t m, int64_t n, float beta) {
    int64_t count = m * n;
    FOR_EACH_INDEX(i, count) {
        int64_t at = (i / n) * ldc + i % n;
        umt_dev_store_from_f32(c, dtype, at, beta == 0.0f ? 0.0f : beta * umt_dev_load_as_f32(c, dtype, at));
    }
}

/* A and B in bf16 or f16, C in f32 or A's dtype. cuBLAS runs 16-bit inputs on tensor cores with
 * CUBLAS_COMPUTE_32F: f32 products and sums, one rounding when C is half. */
extern "C" umt_status umt_cuda_gemm_lp(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                       const void *a, int64_t lda, const void *b, int64_t ldb, float beta, void *c,
                                       int64_t ldc, umt_dtype ab_dtype, umt_dtype c_dtype) {
    if ((ab_dtype != UMT_BF16 && ab_dtype != UMT_F16) || (c_dtype != UMT_F32 && c_dtype != ab_dtype))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "gemm_lp: A, B %s and C %s (expected bf16 or f16, and C f32 or the same)",
                        umt_dtype_name(ab_dtype), umt_dtype_name(c_dtype));
    UMT_TRY(umt_gemm_check_arguments(trans_a, trans_b, m, n, k, lda, ldb, ldc));
    cublasHandle_t handle = umt_cuda_cublas_handle();
    if (!handle) return umt_fail(UMT_ERR_STATE, "gemm_lp: cuda backend not started (no cuBLAS handle)");
    if (m == 0 || n == 0) return UMT_OK;
    if (alpha == 0.0f || k == 0) {
        if (beta == 1.0f) return UMT_OK;
        scale_c_lp_kernel<<<blocks_for(m * n), THREADS, 0, umt_cuda_stream()>>>(c, c_dtype, ldc, m, n, beta);
        UMT_CUDA_LAUNCHED();
        return UMT_OK;
    }
    cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t ab = cuda_dtype(ab_dtype);
    UMT_CUBLAS_TRY(cublasGemmEx_64(handle, op_b, op_a, n, m, k, &alpha, b, ab, ldb, a, ab, lda, &beta, c,
                                   cuda_dtype(c_dtype), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return UMT_OK;
}
