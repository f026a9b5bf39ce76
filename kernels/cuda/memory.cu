/*
 * kernels/cuda/memory.cu — fill, copies between host and device, and dtype conversion.
 *
 * Copies are cudaMemcpyAsync on the compute stream, so they stay in order with the kernels.
 * upload and download also wait for the stream: the caller may reuse its host buffer (upload)
 * or read it (download) as soon as they return; a training step uses neither (core/step_values.c
 * queues its per-step uploads from pinned memory).
 *
 * Conversions match kernels/cpu/memory.c bit for bit; the per-element conversions live in
 * kernels/cuda/float16.h (which says how), shared with the fused optimizer updates.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
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

/* A host read: the first place a deferred label error (loss.cu) can be reported. */
extern "C" umt_status umt_cuda_download(void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return UMT_OK;
    UMT_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, umt_cuda_stream()));
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    return umt_cuda_take_label_verdict();
}

/* ------------------------------------------------------------------------------------------ */
/* Conversion                                                                                  */

/* Through f32, which holds every bf16 and f16 exactly: one rounding, at the store. The dtype
 * switches are uniform across the grid, so they cost no divergence. */
static __global__ void convert_kernel(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype,
                                      int64_t n) {
    FOR_EACH_INDEX(i, n) umt_dev_store_from_f32(dst, dst_dtype, i, umt_dev_load_as_f32(src, src_dtype, i));
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
