/*
 * core/ops/ops.h — what every op (core/ops/) shares: making its output and finishing it.
 *
 * The shape of an op: return NULL at once if an input is NULL (an earlier op failed and its
 * message stands); check each input with umt_check_input (core/tensor.h: ctx given, the input made
 * by ctx, its dtype and rank) before anything reads it, then the shapes; umt_op_output; call the
 * backend kernel; umt_op_finish records the tape node. Its backward function sits right below it.
 */
#ifndef UMT_CORE_OPS_OPS_H
#define UMT_CORE_OPS_OPS_H

#include "core/base/error.h"
#include "core/context.h"
#include "core/precision.h"
#include "core/tape.h"
#include "core/tensor.h"
#include "kernels/backend.h"

/* An f32 output of the given shape in the activations pool. */
umt_tensor *umt_op_output(umt_context *ctx, int ndim, const int64_t *shape);
/* The same in dtype, stored NHWC if nhwc (4-D only; core/precision.h). */
umt_tensor *umt_op_output_typed(umt_context *ctx, umt_dtype dtype, bool nhwc, int ndim, const int64_t *shape);
/* An output like x: its dtype, layout and shape. */
umt_tensor *umt_op_output_like(umt_context *ctx, const umt_tensor *x);

/* out if the kernel succeeded and the node was recorded; NULL otherwise (the message says why). */
umt_tensor *umt_op_finish(umt_context *ctx, umt_status kernel_status, const char *op, umt_backward_fn backward,
                          umt_tensor *out, umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2);

/* umt_op_finish for ops with arguments that backward needs: they are kept in the node. */
umt_tensor *umt_op_finish_with(umt_context *ctx, umt_status kernel_status, const char *op, umt_backward_fn backward,
                               umt_tensor *out, umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2,
                               int64_t param0, int64_t param1, float fparam);

/* A linear op's output [rows, k] in place (core/ops/matmul.c): its bias and ReLU, then a dropout
 * of p when training (0: none), in one pass; *dropped: the p applied (0 in evaluation), which the
 * node keeps as its fparam for umt_linear_bias_relu_backward. op names the caller in errors. */
umt_status umt_linear_bias_relu(umt_context *ctx, const char *op, umt_tensor *y, const umt_tensor *bias, float p,
                                float *dropped);
/* That node's first backward pass over the output's gradient in place: the gradient before the
 * dropout (the node's fparam, 0: none) and the ReLU, and the bias gradient taken on the way. */
umt_status umt_linear_bias_relu_backward(umt_context *ctx, const umt_node *node);

/* A dropout op's seed (core/ops/dropout.c) for its input x: a draw of the context's RNG, or,
 * while a step graph is recorded, *seed_on_device: where each replay puts its own draw; under
 * micro-batching the first micro-batch's draw again, and *first: x's element 0 in the whole
 * batch (core/micro_batch.h). op names the caller in errors. */
umt_status umt_dropout_seed(umt_context *ctx, const umt_tensor *x, const char *op, uint64_t *seed,
                            void **seed_on_device, int64_t *first);

/* Input i's gradient if it takes one, else NULL (backward functions skip NULL gradients). */
static inline void *umt_input_grad(const umt_node *node, int i) {
    umt_tensor *t = node->inputs[i];
    return t->requires_grad ? t->grad->data : NULL;
}

/* Whether input i's gradient is new and unzeroed: the backward writes all of it (umt_node). */
static inline bool umt_input_grad_fresh(const umt_node *node, int i) { return node->fresh >> i & 1u; }

/* Marks out's node (the tape's last, if out was recorded) as writing input i's whole gradient
 * when it is the first to produce it; returns out. */
umt_tensor *umt_op_overwrites_input_grad(umt_context *ctx, umt_tensor *out, int i);

/* ----------------------------------------------------------------------------------------- */
/* Crossing between precisions (core/ops/recast.c; the policy is core/precision.h) */

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
/* Under bf16/fp16, the compute copy of a linear weight w [out, c*h*w] that reads x [n,c,h,w]
 * NHWC as it lies (core/ops/flatten_linear.c): [out,c,h,w] stored K,R,S,C, so that its columns
 * follow x's H,W,C storage. *out is NULL, with UMT_OK, when w already has a copy in another
 * layout (the offload tier's plain one): the caller then flattens as usual. */
umt_status umt_weight_for_compute_hwc(umt_context *ctx, umt_tensor *w, const umt_tensor *x, umt_tensor **out);

/* A tensor's images, channels and pixels for recast: [n,c,h,w] -> n, c, h*w; else 1, 1, numel. */
void umt_recast_dims(const umt_tensor *t, int64_t *n, int64_t *c, int64_t *hw);

#endif /* UMT_CORE_OPS_OPS_H */
