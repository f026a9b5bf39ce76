/* core/ops/loss.c — mean, log-softmax, NLL, softmax cross-entropy, accuracy counting. */
#include "core/branch.h"
#include "core/ops/ops.h"

static const int64_t scalar_shape[1] = {1};

/* ----------------------------------------------------------------------------------------- */
/* mean of all elements */

static umt_status mean_backward(umt_context *ctx, const umt_node *node) {
    return umt_kernels(ctx)->f32.mean_backward(node->output->grad->data, umt_input_grad(node, 0), node->inputs[0]->numel);
}

umt_tensor *umt_mean(umt_context *ctx, umt_tensor *x) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_mean", "x", x, UMT_ANY_FLOAT, 0) != UMT_OK) return NULL;
    /* Reductions and losses run in f32 whatever the precision (core/precision.h). */
    if (!(x = umt_to_f32(ctx, x))) return NULL;
    umt_tensor *out = umt_op_output(ctx, 1, scalar_shape);
    if (!out) return NULL;
    umt_status st = umt_kernels(ctx)->f32.mean(x->data, out->data, x->numel);
    return umt_op_finish(ctx, st, "umt_mean", mean_backward, out, NULL, x, NULL, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* log_softmax over the rows of a 2-D tensor */

static umt_status log_softmax_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    return umt_kernels(ctx)->f32.log_softmax_backward(y->data, y->grad->data, umt_input_grad(node, 0), y->shape[0], y->shape[1]);
}

umt_tensor *umt_log_softmax(umt_context *ctx, umt_tensor *x) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_log_softmax", "x", x, UMT_ANY_FLOAT, 2) != UMT_OK) return NULL;
    if (!(x = umt_to_f32(ctx, x))) return NULL;
    umt_tensor *y = umt_op_output(ctx, 2, x->shape);
    if (!y) return NULL;
    umt_status st = umt_kernels(ctx)->f32.log_softmax(x->data, y->data, x->shape[0], x->shape[1]);
    return umt_op_finish(ctx, st, "umt_log_softmax", log_softmax_backward, y, NULL, x, NULL, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* Losses over [N,C] scores and i32 labels [N] */

/* scores is argument scores_name of op (log_probs, logits, scores); checked before it is widened to f32. */
static umt_status check_scores_labels(const umt_context *ctx, const char *op, const char *scores_name,
                                      const umt_tensor *scores, const umt_tensor *labels) {
    UMT_TRY(umt_check_input(ctx, op, scores_name, scores, UMT_ANY_FLOAT, 2));
    UMT_TRY(umt_check_input(ctx, op, "labels", labels, UMT_I32, 1));
    if (labels->shape[0] != scores->shape[0]) {
        char s[64];
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %lld labels for %s %s (expected one per row)", op,
                        (long long)labels->shape[0], scores_name, umt_shape_string(scores, s, sizeof s));
    }
    return UMT_OK;
}

static umt_status nll_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *logp = node->inputs[0];
    return umt_kernels(ctx)->f32.nll_loss_backward(node->output->grad->data, node->inputs[1]->data, umt_input_grad(node, 0),
                                           logp->shape[0], logp->shape[1]);
}

umt_tensor *umt_nll_loss(umt_context *ctx, umt_tensor *log_probs, umt_tensor *labels) {
    if (!log_probs || !labels) return NULL;
    if (check_scores_labels(ctx, "umt_nll_loss", "log_probs", log_probs, labels) != UMT_OK) return NULL;
    if (!(log_probs = umt_to_f32(ctx, log_probs))) return NULL;
    umt_tensor *loss = umt_op_output(ctx, 1, scalar_shape);
    if (!loss) return NULL;
    umt_status st = umt_kernels(ctx)->f32.nll_loss(log_probs->data, labels->data, loss->data, log_probs->shape[0], log_probs->shape[1]);
    return umt_op_finish(ctx, st, "umt_nll_loss", nll_backward, loss, NULL, log_probs, labels, NULL);
}

static umt_status xent_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *probs = node->saved, *logits = node->inputs[0];
    const umt_backend *be = umt_kernels(ctx);
    if (logits->dtype != UMT_F32)
        return be->lowp.softmax_xent_backward(logits->dtype, probs->data, node->inputs[1]->data,
                                              node->output->grad->data, umt_input_grad(node, 0), probs->shape[0],
                                              probs->shape[1], umt_input_grad_fresh(node, 0));
    return be->f32.softmax_xent_backward(probs->data, node->inputs[1]->data, node->output->grad->data,
                                         umt_input_grad(node, 0), probs->shape[0], probs->shape[1]);
}

umt_tensor *umt_softmax_cross_entropy(umt_context *ctx, umt_tensor *logits, umt_tensor *labels) {
    if (!logits || !labels) return NULL;
    if (check_scores_labels(ctx, "umt_softmax_cross_entropy", "logits", logits, labels) != UMT_OK) return NULL;
    /* bf16/fp16 logits are read as they lie where the backend can (their gradient is written
     * in their dtype, whole: no f32 copy either way, no zeroed gradient); else widened first. */
    const umt_backend *be = umt_kernels(ctx);
    bool half = umt_dtype_is_lowp(logits->dtype) && be->lowp.softmax_xent;
    if (!half && !(logits = umt_to_f32(ctx, logits))) return NULL;
    /* The probabilities are kept for backward: (p - onehot) is the whole gradient. */
    umt_tensor *probs = umt_op_output(ctx, 2, logits->shape);
    umt_tensor *loss = probs ? umt_op_output(ctx, 1, scalar_shape) : NULL;
    if (!loss) return NULL;
    int64_t rows = logits->shape[0], cols = logits->shape[1];
    umt_status st = half ? be->lowp.softmax_xent(logits->dtype, logits->data, labels->data, probs->data, loss->data,
                                                 rows, cols)
                         : be->f32.softmax_xent(logits->data, labels->data, probs->data, loss->data, rows, cols);
    umt_tensor *out = umt_op_finish(ctx, st, "umt_softmax_cross_entropy", xent_backward, loss, probs, logits, labels,
                                    NULL);
    return half ? umt_op_overwrites_input_grad(ctx, out, 0) : out;
}

/* ----------------------------------------------------------------------------------------- */
/* A linear layer and the softmax cross-entropy as one op                                       */

/* The weight and bias gradients go to the side stream where the branch takes both (core/branch.h),
 * first, so that the side starts beside the input gradient; else in order after it. */
static umt_status linear_xent_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *bias = node->inputs[2];
    const umt_backend *be = umt_kernels(ctx);
    void *dx = umt_input_grad(node, 0);
    float *dw = umt_input_grad(node, 1), *dbias = umt_input_grad(node, 2);
    int64_t rows = x->shape[0], in = x->shape[1], cols = w->shape[0];
    double flops = 2.0 * (double)rows * (double)in * (double)cols;
    if ((dw || dbias) && (!dw || umt_branch_takes(ctx, w, dx, flops)) &&
        (!dbias || umt_branch_takes(ctx, bias, dx, flops))) {
        UMT_TRY(umt_branch_begin(ctx, false));
        UMT_TRY(umt_branch_end(ctx, be->fused.linear_xent_backward(x->dtype, x->data, w->lowp->data, node->saved->data,
                                                                   node->output->grad->data, NULL, false, dw, dbias,
                                                                   rows, in, cols)));
        dw = dbias = NULL;
    }
    return be->fused.linear_xent_backward(x->dtype, x->data, w->lowp->data, node->saved->data, node->output->grad->data,
                                          dx, umt_input_grad_fresh(node, 0), dw, dbias, rows, in, cols);
}

/* Whether the backend's head takes these: half x [rows, in], weight [cols, in] and bias [cols]
 * f32, labels i32 [rows], a shape the slot takes. Anything else (a wrong shape too: its error
 * comes from the two ops) runs as umt_linear then umt_softmax_cross_entropy. */
static bool head_fused(umt_context *ctx, const umt_tensor *x, const umt_tensor *w, const umt_tensor *bias,
                       const umt_tensor *labels) {
    const umt_backend *be = umt_kernels(ctx);
    if (!be->fused.linear_xent || !bias || !umt_dtype_is_lowp(x->dtype) || x->ndim != 2 || w->ndim != 2 ||
        bias->ndim != 1 || labels->ndim != 1 || w->dtype != UMT_F32 || bias->dtype != UMT_F32 ||
        labels->dtype != UMT_I32)
        return false;
    int64_t rows = x->shape[0], in = x->shape[1], cols = w->shape[0];
    return w->shape[1] == in && bias->shape[0] == cols && labels->shape[0] == rows &&
           be->fused.linear_xent_supports(x->dtype, rows, in, cols);
}

umt_tensor *umt_linear_softmax_cross_entropy(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias,
                                             umt_tensor *labels) {
    if (!x || !weight || !labels) return NULL;
    const char *op = "umt_linear_softmax_cross_entropy";
    if (umt_check_input(ctx, op, "x", x, UMT_ANY_FLOAT, 2) != UMT_OK ||
        umt_check_input(ctx, op, "weight", weight, UMT_F32, 2) != UMT_OK ||
        (bias && umt_check_input(ctx, op, "bias", bias, UMT_F32, 1) != UMT_OK) ||
        umt_check_input(ctx, op, "labels", labels, UMT_I32, 1) != UMT_OK)
        return NULL;
    if (!head_fused(ctx, x, weight, bias, labels))
        return umt_softmax_cross_entropy(ctx, umt_linear(ctx, x, weight, bias), labels);
    /* The weight's compute copy, in x's dtype (the context's compute dtype). */
    const umt_tensor *w = umt_weight_for_compute(ctx, weight);
    if (!w) return NULL;
    if (w->dtype != x->dtype) return umt_softmax_cross_entropy(ctx, umt_linear(ctx, x, weight, bias), labels);
    int64_t rows = x->shape[0], in = x->shape[1], cols = weight->shape[0];
    /* softmax - onehot(label) is kept for backward: with dloss, the logits' whole gradient. */
    umt_tensor *diff = umt_op_output(ctx, 2, (int64_t[]){rows, cols});
    umt_tensor *loss = diff ? umt_op_output(ctx, 1, scalar_shape) : NULL;
    if (!loss) return NULL;
    umt_status st = umt_kernels(ctx)->fused.linear_xent(x->dtype, x->data, w->data, bias->data, labels->data,
                                                        diff->data, loss->data, rows, in, cols);
    umt_tensor *out = umt_op_finish(ctx, st, op, linear_xent_backward, loss, diff, x, weight, bias);
    return umt_op_overwrites_input_grad(ctx, out, 0);
}

umt_status umt_count_correct(umt_context *ctx, const umt_tensor *scores, const umt_tensor *labels, int64_t *correct) {
    if (!ctx || !correct) return umt_fail_null("umt_count_correct", ctx ? "correct" : "ctx");
    UMT_TRY(check_scores_labels(ctx, "umt_count_correct", "scores", scores, labels));
    /* Scores straight from a bf16/fp16 layer are widened first (a no-op for f32). */
    if (!(scores = umt_to_f32(ctx, (umt_tensor *)scores))) return umt_last_status();
    return umt_kernels(ctx)->f32.count_correct(scores->data, labels->data, scores->shape[0], scores->shape[1], correct);
}
