/*
 * kernels/cuda/cudnn_handle.h — the cuDNN state shared inside kernels/cuda/ (CUDA sources only).
 *
 * backend.cu owns one cuDNN handle per context's state, bound to its compute stream like the
 * cuBLAS handle; conv.cu and batchnorm.cu run on the bound state's. conv.cu caches a plan per
 * convolution shape (descriptors and algorithms in f32, cuDNN graph-API engines in bf16/f16) in
 * the state's own table, which the state's destruction frees along with the handle.
 */
#ifndef UMT_KERNELS_CUDA_CUDNN_HANDLE_H
#define UMT_KERNELS_CUDA_CUDNN_HANDLE_H

#include <cudnn.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bound state's handle (umt_cuda_bind), or NULL when none is bound. */
cudnnHandle_t umt_cuda_cudnn_handle(void);

/* A state's table of convolution plans (conv.cu). */
typedef struct umt_conv_plans umt_conv_plans;
umt_status umt_cuda_conv_plans_new(umt_conv_plans **out);
/* Destroys every plan of the table, and the table (NULL is a no-op). */
void umt_cuda_conv_plans_free(umt_conv_plans *plans);
/* The bound state's table, or NULL when none is bound. */
umt_conv_plans *umt_cuda_conv_plans(void);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CUDA_CUDNN_HANDLE_H */
