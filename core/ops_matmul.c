/* core/ops_matmul.c — matmul and linear, forward and backward, on the backend's GEMM. */
#include "core/ops.h"

/* ----------------------------------------------------------------------------------------- */
/* matmul: C[M,N] = A[M,K] B[K,N] */

static umt_status matmul_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *a = node->inputs[0], *b = node->inputs[1], *c = node->output;
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    const float *dc = c->grad->data;
    float *da = umt_input_grad(node, 0), *db = umt_input_grad(node, 1);
    /* dA += dC Bᵀ ; dB += Aᵀ dC (beta = 1 accumulates) */
    if (da) UMT_TRY(ctx->backend->gemm(false, true, m, k, n, 1.0f, dc, n, b->data, n, 1.0f, da, k));
    if (db) UMT_TRY(ctx->backend->gemm(true, false, k, n, m, 1.0f, a->data, k, dc, n, 1.0f, db, n));
    return UMT_OK;
}

umt_tensor *umt_matmul(umt_context *ctx, umt_tensor *a, umt_tensor *b) {
    if (!a || !b) return NULL;
    if (umt_check_tensor("umt_matmul", "a", a, UMT_F32, 2) != UMT_OK ||
        umt_check_tensor("umt_matmul", "b", b, UMT_F32, 2) != UMT_OK)
        return NULL;
    if (a->shape[1] != b->shape[0]) {
        char sa[64], sb[64];
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_matmul: a %s and b %s: inner dimensions differ",
                 umt_shape_string(a, sa, sizeof sa), umt_shape_string(b, sb, sizeof sb));
        return NULL;
    }
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    umt_tensor *c = umt_op_output(ctx, 2, (int64_t[]){m, n});
    if (!c) return NULL;
    umt_status st = ctx->backend->gemm(false, false, m, n, k, 1.0f, a->data, k, b->data, n, 0.0f, c->data, n);
    return umt_op_finish(ctx, st, "umt_matmul", matmul_backward, c, NULL, a, b, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* linear: y[B,out] = x[B,in] Wᵀ + bias, W [out,in] as PyTorch stores it */

static umt_status linear_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    int64_t batch = x->shape[0], in = x->shape[1], out = w->shape[0];
    const float *dy = y->grad->data;
    float *dx = umt_input_grad(node, 0), *dw = umt_input_grad(node, 1);
    float *dbias = node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    /* dx += dy W ; dW += dyᵀ x ; dbias += column sums of dy */
    if (dx) UMT_TRY(ctx->backend->gemm(false, false, batch, in, out, 1.0f, dy, out, w->data, in, 1.0f, dx, in));
    if (dw) UMT_TRY(ctx->backend->gemm(true, false, out, in, batch, 1.0f, dy, out, x->data, in, 1.0f, dw, in));
    if (dbias) UMT_TRY(ctx->backend->sum_rows(dy, dbias, batch, out));
    return UMT_OK;
}

static umt_status check_linear(const umt_tensor *x, const umt_tensor *w, const umt_tensor *bias) {
    UMT_TRY(umt_check_tensor("umt_linear", "x", x, UMT_F32, 2));
    UMT_TRY(umt_check_tensor("umt_linear", "weight", w, UMT_F32, 2));
    char sx[64], sw[64];
    if (x->shape[1] != w->shape[1])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_linear: x %s has %lld features, weight %s expects %lld",
                        umt_shape_string(x, sx, sizeof sx), (long long)x->shape[1], umt_shape_string(w, sw, sizeof sw),
                        (long long)w->shape[1]);
    if (!bias) return UMT_OK;
    UMT_TRY(umt_check_tensor("umt_linear", "bias", bias, UMT_F32, 1));
    if (bias->shape[0] != w->shape[0])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_linear: bias has %lld elements, weight %s has %lld outputs",
                        (long long)bias->shape[0], umt_shape_string(w, sw, sizeof sw), (long long)w->shape[0]);
    return UMT_OK;
}

umt_tensor *umt_linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias) {
    if (!x || !weight) return NULL;
    if (check_linear(x, weight, bias) != UMT_OK) return NULL;
    int64_t batch = x->shape[0], in = x->shape[1], out = weight->shape[0];
    umt_tensor *y = umt_op_output(ctx, 2, (int64_t[]){batch, out});
    if (!y) return NULL;
    umt_status st = ctx->backend->gemm(false, true, batch, out, in, 1.0f, x->data, in, weight->data, in, 0.0f, y->data, out);
    if (st == UMT_OK && bias) st = ctx->backend->add_rows(y->data, bias->data, y->data, batch, out);
    return umt_op_finish(ctx, st, "umt_linear", linear_backward, y, NULL, x, weight, bias);
}
