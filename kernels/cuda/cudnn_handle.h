/*
 * kernels/cuda/cudnn_handle.h — the cuDNN state shared inside kernels/cuda/ (CUDA sources only).
 *
 * backend.cu owns the one cuDNN handle, bound to the compute stream like the cuBLAS handle;
 * conv.cu and batchnorm.cu run on it. conv.cu caches a plan per convolution shape (descriptors
 * and algorithms in f32, cuDNN graph-API engines in bf16/f16), which the backend's stop destroys
 * along with the handle.
 */
#ifndef UMT_KERNELS_CUDA_CUDNN_HANDLE_H
#define UMT_KERNELS_CUDA_CUDNN_HANDLE_H

#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The handle made by umt_cuda_backend_start, or NULL while the backend is stopped. */
cudnnHandle_t umt_cuda_cudnn_handle(void);
/* Destroys every cached convolution plan (conv.cu): the next call of a shape chooses anew. */
void umt_cuda_conv_forget_plans(void);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CUDA_CUDNN_HANDLE_H */
