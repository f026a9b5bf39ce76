/* core/ops/common.c — making an op's output and recording it (see core/ops/ops.h). */
#include "core/ops/ops.h"

umt_tensor *umt_op_output(umt_context *ctx, int ndim, const int64_t *shape) {
    return umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, ndim, shape);
}

umt_tensor *umt_op_output_typed(umt_context *ctx, umt_dtype dtype, bool nhwc, int ndim, const int64_t *shape) {
    umt_tensor *t = umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, dtype, ndim, shape);
    if (t) t->nhwc = nhwc && ndim == 4;
    return t;
}

umt_tensor *umt_op_output_like(umt_context *ctx, const umt_tensor *x) {
    return umt_op_output_typed(ctx, x->dtype, x->nhwc, x->ndim, x->shape);
}

umt_tensor *umt_op_finish(umt_context *ctx, umt_status kernel_status, const char *op, umt_backward_fn backward,
                          umt_tensor *out, umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2) {
    if (kernel_status != UMT_OK) {
        umt_fail(kernel_status, "%s: %s", op, umt_last_error());
        return NULL;
    }
    if (umt_tape_record(ctx, op, backward, out, saved, in0, in1, in2) != UMT_OK) return NULL;
    return out;
}

umt_tensor *umt_op_overwrites_input_grad(umt_context *ctx, umt_tensor *out, int i) {
    if (out && out->requires_grad) ctx->tape.nodes[ctx->tape.count - 1].overwrites |= 1u << i;
    return out;
}

umt_tensor *umt_op_finish_with(umt_context *ctx, umt_status kernel_status, const char *op, umt_backward_fn backward,
                               umt_tensor *out, umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2,
                               int64_t param0, int64_t param1, float fparam) {
    if (!umt_op_finish(ctx, kernel_status, op, backward, out, saved, in0, in1, in2)) return NULL;
    /* A recorded op is the tape's last node. */
    if (out->requires_grad) {
        umt_node *node = &ctx->tape.nodes[ctx->tape.count - 1];
        node->params[0] = param0;
        node->params[1] = param1;
        node->fparam = fparam;
    }
    return out;
}
