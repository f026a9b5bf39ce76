/*
 * kernels/cuda/conv_thin.h — direct convolution for thin inputs (conv_thin.cu says which and
 * why), called by conv.cu in place of cuDNN (CUDA sources only).
 */
#ifndef UMT_KERNELS_CUDA_CONV_THIN_H
#define UMT_KERNELS_CUDA_CONV_THIN_H

#include <stddef.h>

#include "kernels/backend.h"

/* Whether the direct kernels take a shape: bf16/f16 NHWC, c*r*s <= 9, k = 8, 16, 32, 64 or 128. */
bool umt_cuda_conv_is_thin(const umt_conv_shape *s);
/* And the call: a thin shape whose vector-accessed tensors (y; dy and the workspace) are
 * 16-byte aligned (the pools align to 256, so in practice every call). */
bool umt_cuda_conv_thin_takes(const umt_conv_shape *s, const void *vectors_a, const void *vectors_b);
/* Whether the f32 direct kernels (forward and weight gradient) take a shape: f32 NCHW,
 * c*r*s <= 9, any k. */
bool umt_cuda_conv_is_thin_f32(const umt_conv_shape *s);
/* The weight and bias gradients' per-block partials, which the plan's workspace must hold (for
 * either kind of thin shape). */
size_t umt_cuda_conv_thin_workspace_bytes(const umt_conv_shape *s);

/* y = conv(x, w), w as K,R,S,C in the dtype; relu: y = max(that rounded + bias, 0) (bias may
 * be NULL), as umt_cuda_bias_relu after it would give. */
umt_status umt_cuda_conv2d_forward_thin(const umt_conv_shape *s, const void *x, const void *w, const float *bias,
                                        bool relu, void *y);
/* dw (f32, K,C,R,S) += the weight gradient from dy; the workspace holds the partials. With y
 * (a fused ReLU's output, 16-byte aligned): from dy masked by y > 0, written back when keep_dy,
 * and dbias += its channel sums (dbias may be NULL). */
umt_status umt_cuda_conv2d_backward_filter_thin(const umt_conv_shape *s, const void *x, const void *y, void *dy,
                                                bool keep_dy, float *dw, float *dbias, void *workspace);

/* The same two in f32 NCHW (w as K,C,R,S; relu: y = max(conv + bias, 0), as f32.bias_relu after
 * the plain forward computes it; no alignment needed). */
umt_status umt_cuda_conv2d_forward_thin_f32(const umt_conv_shape *s, const float *x, const float *w,
                                            const float *bias, bool relu, float *y);
umt_status umt_cuda_conv2d_backward_filter_thin_f32(const umt_conv_shape *s, const float *x, const float *y,
                                                    float *dy, bool keep_dy, float *dw, float *dbias,
                                                    void *workspace);

#endif /* UMT_KERNELS_CUDA_CONV_THIN_H */
