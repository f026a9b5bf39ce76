/*
 * core/base/cuda_check.h — every CUDA, cuBLAS and cuDNN call is checked, and a failure names the file,
 * the line, the call and the library's own error string (C and CUDA sources alike).
 *
 *     UMT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
 *
 * returns UMT_ERR_DEVICE from the enclosing function on failure.
 */
#ifndef UMT_CORE_BASE_CUDA_CHECK_H
#define UMT_CORE_BASE_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/base/error.h"

#define UMT_CUDA_TRY(call)                                                                                         \
    do {                                                                                                           \
        cudaError_t umt_cuda_error_ = (call);                                                                      \
        if (umt_cuda_error_ != cudaSuccess)                                                                        \
            return umt_fail(UMT_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                            \
                            cudaGetErrorString(umt_cuda_error_));                                                  \
    } while (0)

#define UMT_CUBLAS_TRY(call)                                                                                       \
    do {                                                                                                           \
        cublasStatus_t umt_cublas_status_ = (call);                                                                \
        if (umt_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return umt_fail(UMT_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                            \
                            cublasGetStatusString(umt_cublas_status_));                                            \
    } while (0)

#define UMT_CUDNN_TRY(call)                                                                                        \
    do {                                                                                                           \
        cudnnStatus_t umt_cudnn_status_ = (call);                                                                  \
        if (umt_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                                             \
            return umt_fail(UMT_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,                            \
                            cudnnGetErrorString(umt_cudnn_status_));                                               \
    } while (0)

/* After a kernel launch: launch errors (bad configuration) surface here, not later. */
#define UMT_CUDA_LAUNCHED() UMT_CUDA_TRY(cudaGetLastError())

#endif /* UMT_CORE_BASE_CUDA_CHECK_H */
