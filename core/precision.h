/*
 * core/precision.h — the mixed-precision policy: which dtype and layout each op computes in.
 *
 * Under fp32 every function here is the identity. Under bf16 or fp16 (CUDA only):
 *   - matrix ops (linear, matmul, conv2d) take their activations in the compute dtype, 4-D ones
 *     NHWC (the layout cuDNN's tensor-core kernels want), and their weights through the
 *     parameter's compute copy (tensor->lowp), refreshed by the optimizer's update kernel;
 *   - elementwise ops, pooling and dropout keep the dtype and layout they are given;
 *   - losses, softmax, batch norm and anything that reduces run in f32 NCHW.
 * A tensor crosses between these worlds only through umt_recast (core/ops/recast.c), a recorded
 * op whose backward converts the gradient back, so the input (f32, NCHW) is converted once, not
 * per layer.
 */
#ifndef UMT_CORE_PRECISION_H
#define UMT_CORE_PRECISION_H

#include "umtrain.h"

/* Refuses a precision the context's backend cannot run (bf16/fp16 need the CUDA slots). */
umt_status umt_precision_check(const umt_context *ctx);

/* f32 under fp32, else bf16 or f16. */
umt_dtype umt_compute_dtype(const umt_context *ctx);
static inline bool umt_dtype_is_lowp(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }

/* The bytes of the compute copy umt_weight_for_compute (core/ops/recast.c) gives tensor t under
 * the compute dtype: an f32 parameter a matrix op reads (linear, matmul, conv2d: two or more axes)
 * under bf16/fp16; 0 for anything else. The memory plan and the offload tier count it with t. */
size_t umt_compute_copy_bytes(umt_dtype compute, const umt_tensor *t);

#endif /* UMT_CORE_PRECISION_H */
