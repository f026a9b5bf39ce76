/* core/ops/batchnorm.c — batch normalisation over channels, training and evaluation. */
#include "core/ops/ops.h"

static umt_status check_batchnorm(const umt_context *ctx, const umt_tensor *x, const umt_tensor *gamma,
                                  const umt_tensor *beta, const umt_tensor *running_mean,
                                  const umt_tensor *running_var) {
    char sx[64];
    UMT_TRY(umt_check_input(ctx, "umt_batch_norm", "x", x, UMT_ANY_FLOAT, 0));
    if (x->ndim != 2 && x->ndim != 4)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_batch_norm: x %s (expected [N,C] or [N,C,H,W])",
                        umt_shape_string(x, sx, sizeof sx));
    const umt_tensor *per_channel[4] = {gamma, beta, running_mean, running_var};
    const char *names[4] = {"gamma", "beta", "running_mean", "running_var"};
    for (int i = 0; i < 4; ++i) {
        UMT_TRY(umt_check_input(ctx, "umt_batch_norm", names[i], per_channel[i], UMT_F32, 1));
        if (per_channel[i]->shape[0] != x->shape[1])
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_batch_norm: %s has %lld elements, x %s has %lld channels",
                            names[i], (long long)per_channel[i]->shape[0], umt_shape_string(x, sx, sizeof sx),
                            (long long)x->shape[1]);
    }
    return UMT_OK;
}

/* saved is [2, C]: the batch mean, then 1/sqrt(var + eps). */
static umt_status batchnorm_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *x = node->inputs[0], *gamma = node->inputs[1], *y = node->output;
    int64_t n = x->shape[0], c = x->shape[1], hw = x->numel / (n * c);
    const float *saved = node->saved->data;
    return umt_kernels(ctx)->f32.batchnorm_backward(x->data, y->grad->data, gamma->data, saved, saved + c,
                                            umt_input_grad(node, 0), umt_input_grad(node, 1), umt_input_grad(node, 2),
                                            n, c, hw);
}

umt_tensor *umt_batch_norm(umt_context *ctx, umt_tensor *x, umt_tensor *gamma, umt_tensor *beta,
                           umt_tensor *running_mean, umt_tensor *running_var, float momentum, float eps) {
    /* x, gamma and beta are the op's inputs (on the tape): NULL is an earlier failure, whose message
     * stands. The running statistics are state it updates: a NULL there is named. */
    if (!x || !gamma || !beta) return NULL;
    if (check_batchnorm(ctx, x, gamma, beta, running_mean, running_var) != UMT_OK) return NULL;
    /* Batch statistics are reductions: f32 NCHW under every precision (core/precision.h). */
    if (!(x = umt_to_f32(ctx, x))) return NULL;
    int64_t n = x->shape[0], c = x->shape[1], hw = x->numel / (n * c);
    umt_tensor *y = umt_op_output(ctx, x->ndim, x->shape);
    if (!y) return NULL;
    if (!ctx->training) {
        /* Evaluation normalises with fixed statistics; a gradient through it is not implemented,
         * and silently dropping one would be worse than refusing. */
        if (ctx->grad_enabled && (x->requires_grad || gamma->requires_grad || beta->requires_grad)) {
            umt_fail(UMT_ERR_UNSUPPORTED, "umt_batch_norm: evaluation mode with gradients enabled (disable grad to evaluate)");
            return NULL;
        }
        umt_status st = umt_kernels(ctx)->f32.batchnorm_forward_eval(x->data, gamma->data, beta->data, running_mean->data,
                                                             running_var->data, y->data, n, c, hw, eps);
        return umt_op_finish(ctx, st, "umt_batch_norm", NULL, y, NULL, NULL, NULL, NULL);
    }
    umt_tensor *saved = umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, (int64_t[]){2, c});
    if (!saved) return NULL;
    float *stats = saved->data;
    umt_status st = umt_kernels(ctx)->f32.batchnorm_forward_train(x->data, gamma->data, beta->data, y->data, running_mean->data,
                                                          running_var->data, stats, stats + c, n, c, hw, momentum, eps);
    return umt_op_finish(ctx, st, "umt_batch_norm", batchnorm_backward, y, saved, x, gamma, beta);
}
