/*
 * core/precision.h — the mixed-precision policy: which dtype and layout each op computes in.
 *
 * Under fp32 every function here is the identity. Under bf16 or fp16 (CUDA only):
 *   - matrix ops (linear, matmul, conv2d) take their activations in the compute dtype, 4-D ones
 *     NHWC (the layout cuDNN's tensor-core kernels want), and their weights through the
 *     parameter's compute copy (tensor->lowp), refreshed by the optimizer's update kernel;
 *   - elementwise ops, pooling and dropout keep the dtype and layout they are given;
 *   - losses, softmax, batch norm and anything that reduces run in f32 NCHW.
 * A tensor crosses between these worlds only through umt_recast below, a recorded op whose
 * backward converts the gradient back, so the input (f32, NCHW) is converted once, not per layer.
 */
#ifndef UMT_CORE_PRECISION_H
#define UMT_CORE_PRECISION_H

#include "core/tape.h"
#include "umtrain.h"

/* Refuses a precision the context's backend cannot run (bf16/fp16 need the CUDA slots). */
umt_status umt_precision_check(const umt_context *ctx);

/* f32 under fp32, else bf16 or f16. */
umt_dtype umt_compute_dtype(const umt_context *ctx);
static inline bool umt_dtype_is_lowp(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }

/* x in dtype and layout (nhwc applies to 4-D tensors only): x itself when it already is, else
 * a recorded conversion. */
umt_tensor *umt_recast(umt_context *ctx, umt_tensor *x, umt_dtype dtype, bool nhwc);
/* x as a matrix op's input: the compute dtype, NHWC if 4-D (identity under fp32). */
umt_tensor *umt_to_compute(umt_context *ctx, umt_tensor *x);
/* x as a loss or reduction's input: f32, NCHW. */
umt_tensor *umt_to_f32(umt_context *ctx, umt_tensor *x);

/* The storage a matrix op reads for parameter w: w itself under fp32, else its compute copy,
 * made on first use (4-D weights as K,R,S,C) and converted again if the host wrote w since. */
umt_tensor *umt_weight_for_compute(umt_context *ctx, umt_tensor *w);

/* A tensor's images, channels and pixels for recast: [n,c,h,w] -> n, c, h*w; else 1, 1, numel. */
void umt_recast_dims(const umt_tensor *t, int64_t *n, int64_t *c, int64_t *hw);

#endif /* UMT_CORE_PRECISION_H */
