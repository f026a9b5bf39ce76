/*
 * kernels/cuda/memory.cu — fill, copies between host and device, and dtype conversion.
 *
 * Copies are cudaMemcpyAsync on the compute stream, so they stay in order with the kernels.
 * upload and download also wait for the stream: the caller may reuse its host buffer (upload)
 * or read it (download) as soon as they return.
 *
 * Conversions match kernels/cpu/memory.c bit for bit. Numbers go through the hardware's
 * round-to-nearest-even conversions (__float2bfloat16_rn, __float2half_rn), which handle
 * overflow to infinity and f16 subnormals as the CPU code does. NaNs are built by hand with
 * the CPU's rule (keep sign and top payload, set the quiet bit), because the hardware returns a
 * canonical NaN whatever the input was (0x7fff for bf16 on an H200: seen in tests/gpu).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"


static __global__ void fill_kernel(float *x, int64_t n, float value) {
    FOR_EACH_INDEX(i, n) x[i] = value;
}

extern "C" umt_status umt_cuda_fill(float *x, int64_t n, float value) {
    if (n <= 0) return UMT_OK;
    fill_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(x, n, value);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* cudaMemcpyDefault lets the runtime tell device, managed and host pointers apart (UVA). */
extern "C" umt_status umt_cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return UMT_OK;
    UMT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, umt_cuda_stream()));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_upload(void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return UMT_OK;
    UMT_CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, umt_cuda_stream()));
    /* From pageable memory the copy may still be reading host_src after the call returns. */
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_download(void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return UMT_OK;
    UMT_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, umt_cuda_stream()));
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Conversion                                                                                  */

static __device__ bool f32_is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

static __device__ uint16_t f32_to_bf16(float x) {
    uint32_t bits = __float_as_uint(x);
    if (f32_is_nan(bits)) return (uint16_t)((bits >> 16) | 0x0040u);
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

static __device__ uint16_t f32_to_f16(float x) {
    uint32_t bits = __float_as_uint(x);
    if (f32_is_nan(bits)) return (uint16_t)(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(x));
}

/* bf16 is the top half of an f32: the shift is the exact widening, NaN payload included. */
static __device__ float bf16_to_f32(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }

static __device__ float f16_to_f32(uint16_t x) {
    bool is_nan = (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu) != 0;
    if (is_nan) return __uint_as_float(((uint32_t)(x & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(x & 0x3ffu) << 13));
    return __half2float(__ushort_as_half(x));
}

static __device__ float load_as_f32(const void *src, umt_dtype dtype, int64_t i) {
    switch (dtype) {
    case UMT_BF16: return bf16_to_f32(((const uint16_t *)src)[i]);
    case UMT_F16: return f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

static __device__ void store_from_f32(void *dst, umt_dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case UMT_BF16: ((uint16_t *)dst)[i] = f32_to_bf16(x); break;
    case UMT_F16: ((uint16_t *)dst)[i] = f32_to_f16(x); break;
    default: ((float *)dst)[i] = x; break;
    }
}

/* Through f32, which holds every bf16 and f16 exactly: one rounding, at the store. The dtype
 * switches are uniform across the grid, so they cost no divergence. */
static __global__ void convert_kernel(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype,
                                      int64_t n) {
    FOR_EACH_INDEX(i, n) store_from_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
}

extern "C" umt_status umt_cuda_convert(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype,
                                       int64_t n) {
    UMT_TRY(umt_convert_check_arguments(src_dtype, dst_dtype, n));
    if (src_dtype == dst_dtype) return umt_cuda_copy(dst, src, (size_t)n * umt_dtype_size(src_dtype));
    if (n == 0) return UMT_OK;
    convert_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(src, src_dtype, dst, dst_dtype, n);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}
