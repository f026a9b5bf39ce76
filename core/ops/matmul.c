/* core/ops/matmul.c — matmul and linear (also fused with a ReLU), forward and backward, on the GEMM. */
#include "core/branch.h"
#include "core/ops/ops.h"

/* What a product reads of operand t: a parameter's compute copy under bf16/fp16, else t. */
static const void *operand(const umt_tensor *t) { return t->is_parameter && t->lowp ? t->lowp->data : t->data; }

/* ----------------------------------------------------------------------------------------- */
/* matmul: C[M,N] = A[M,K] B[K,N] */

/* Under bf16/fp16: the same products on tensor cores; each gradient in its own dtype (f32 for a
 * parameter's, the compute dtype for an activation's). */
static umt_status matmul_backward_lp(umt_context *ctx, const umt_node *node) {
    const umt_tensor *a = node->inputs[0], *b = node->inputs[1], *c = node->output;
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    const void *dc = c->grad->data;
    void *da = umt_input_grad(node, 0), *db = umt_input_grad(node, 1);
    if (da)
        UMT_TRY(umt_kernels(ctx)->lowp.gemm(false, true, m, k, n, 1.0f, dc, n, operand(b), n, 1.0f, da, k, c->dtype,
                                      a->grad->dtype));
    if (db)
        UMT_TRY(umt_kernels(ctx)->lowp.gemm(true, false, k, n, m, 1.0f, operand(a), k, dc, n, 1.0f, db, n, c->dtype,
                                      b->grad->dtype));
    return UMT_OK;
}

static umt_status matmul_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *a = node->inputs[0], *b = node->inputs[1], *c = node->output;
    if (umt_dtype_is_lowp(c->dtype)) return matmul_backward_lp(ctx, node);
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    const float *dc = c->grad->data;
    float *da = umt_input_grad(node, 0), *db = umt_input_grad(node, 1);
    /* dA += dC Bᵀ ; dB += Aᵀ dC (beta = 1 accumulates) */
    if (da) UMT_TRY(umt_kernels(ctx)->f32.gemm(false, true, m, k, n, 1.0f, dc, n, b->data, n, 1.0f, da, k));
    if (db) UMT_TRY(umt_kernels(ctx)->f32.gemm(true, false, k, n, m, 1.0f, a->data, k, dc, n, 1.0f, db, n));
    return UMT_OK;
}

/* A product's operand in the compute dtype: a parameter's compute copy is made ready (the tape
 * keeps the parameter itself), anything else is converted by a recorded recast. */
static umt_tensor *as_operand(umt_context *ctx, umt_tensor *t) {
    if (t->is_parameter) return umt_weight_for_compute(ctx, t) ? t : NULL;
    return umt_to_compute(ctx, t);
}

umt_tensor *umt_matmul(umt_context *ctx, umt_tensor *a, umt_tensor *b) {
    if (!a || !b) return NULL;
    if (umt_check_input(ctx, "umt_matmul", "a", a, UMT_ANY_FLOAT, 2) != UMT_OK ||
        umt_check_input(ctx, "umt_matmul", "b", b, UMT_ANY_FLOAT, 2) != UMT_OK)
        return NULL;
    if (!(a = as_operand(ctx, a)) || !(b = as_operand(ctx, b))) return NULL;
    if (a->shape[1] != b->shape[0]) {
        char sa[64], sb[64];
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_matmul: a %s and b %s: inner dimensions differ",
                 umt_shape_string(a, sa, sizeof sa), umt_shape_string(b, sb, sizeof sb));
        return NULL;
    }
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    umt_dtype dtype = umt_compute_dtype(ctx);
    umt_tensor *c = umt_op_output_typed(ctx, dtype, false, 2, (int64_t[]){m, n});
    if (!c) return NULL;
    umt_status st = umt_dtype_is_lowp(dtype)
                        ? umt_kernels(ctx)->lowp.gemm(false, false, m, n, k, 1.0f, operand(a), k, operand(b), n, 0.0f,
                                                c->data, n, dtype, dtype)
                        : umt_kernels(ctx)->f32.gemm(false, false, m, n, k, 1.0f, a->data, k, b->data, n, 0.0f, c->data, n);
    return umt_op_finish(ctx, st, "umt_matmul", matmul_backward, c, NULL, a, b, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* linear: y[B,out] = x[B,in] Wᵀ + bias, W [out,in] as PyTorch stores it */

/* dW += dyᵀ x, on tensor cores under bf16/fp16 (dW stays f32). */
static umt_status weight_product(umt_context *ctx, const umt_tensor *x, const umt_tensor *w, const umt_tensor *y,
                                 void *dw) {
    int64_t batch = x->shape[0], in = x->shape[1], out = w->shape[0];
    if (umt_dtype_is_lowp(y->dtype))
        return umt_kernels(ctx)->lowp.gemm(true, false, out, in, batch, 1.0f, y->grad->data, out, operand(x), in, 1.0f,
                                           dw, in, y->dtype, w->grad->dtype);
    return umt_kernels(ctx)->f32.gemm(true, false, out, in, batch, 1.0f, y->grad->data, out, x->data, in, 1.0f, dw, in);
}

/* weight_product on the side stream beside the input gradient where the branch takes it
 * (core/branch.h), called before dx so that the side starts from the point before it; *dw is
 * then NULL, so the caller makes it in order after dx only if not. */
static umt_status weight_product_beside(umt_context *ctx, const umt_tensor *x, const umt_tensor *w,
                                        const umt_tensor *y, const void *dx, void **dw) {
    double flops = 2.0 * (double)x->shape[0] * (double)x->shape[1] * (double)w->shape[0];
    if (!*dw || !umt_branch_takes(ctx, w, dx, flops)) return UMT_OK;
    UMT_TRY(umt_branch_begin(ctx, true));
    UMT_TRY(umt_branch_end(ctx, weight_product(ctx, x, w, y, *dw)));
    *dw = NULL;
    return UMT_OK;
}

static umt_status linear_backward_lp(umt_context *ctx, const umt_node *node, bool sum_bias) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    int64_t batch = x->shape[0], in = x->shape[1], out = w->shape[0];
    const void *dy = y->grad->data;
    void *dx = umt_input_grad(node, 0), *dw = umt_input_grad(node, 1);
    float *dbias = sum_bias && node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    float beta = umt_input_grad_fresh(node, 0) ? 0.0f : 1.0f; /* a fresh dx is written, not added to */
    UMT_TRY(weight_product_beside(ctx, x, w, y, dx, &dw));
    if (dx)
        UMT_TRY(umt_kernels(ctx)->lowp.gemm(false, false, batch, in, out, 1.0f, dy, out, operand(w), in, beta, dx, in,
                                      y->dtype, x->grad->dtype));
    if (dw) UMT_TRY(weight_product(ctx, x, w, y, dw));
    if (dbias) UMT_TRY(umt_kernels(ctx)->lowp.sum_rows(y->dtype, dy, dbias, batch, out));
    return UMT_OK;
}

/* The gradients of x and w (and of the bias, if sum_bias) from the output's gradient. */
static umt_status linear_backward_from(umt_context *ctx, const umt_node *node, bool sum_bias) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    if (umt_dtype_is_lowp(y->dtype)) return linear_backward_lp(ctx, node, sum_bias);
    int64_t batch = x->shape[0], in = x->shape[1], out = w->shape[0];
    const float *dy = y->grad->data;
    float *dx = umt_input_grad(node, 0);
    void *dw = umt_input_grad(node, 1); /* f32 */
    float *dbias = sum_bias && node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    /* dx += dy W (dx = when fresh) ; dW += dyᵀ x ; dbias += column sums of dy */
    float beta = umt_input_grad_fresh(node, 0) ? 0.0f : 1.0f;
    UMT_TRY(weight_product_beside(ctx, x, w, y, dx, &dw));
    if (dx) UMT_TRY(umt_kernels(ctx)->f32.gemm(false, false, batch, in, out, 1.0f, dy, out, w->data, in, beta, dx, in));
    if (dw) UMT_TRY(weight_product(ctx, x, w, y, dw));
    if (dbias) UMT_TRY(umt_kernels(ctx)->f32.sum_rows(dy, dbias, batch, out));
    return UMT_OK;
}

static umt_status linear_backward(umt_context *ctx, const umt_node *node) { return linear_backward_from(ctx, node, true); }

umt_status umt_linear_bias_relu_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    float *dbias = node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    const umt_backend *be = umt_kernels(ctx);
    int64_t rows = y->shape[0], k = y->shape[1];
    if (node->fparam > 0.0f)
        return be->f32.bias_relu_dropout_backward(y->dtype, y->data, y->grad->data, dbias, rows, k, node->fparam);
    return be->f32.bias_relu_backward(y->dtype, false, y->data, y->grad->data, dbias, rows, k, 1);
}

/* The fused op's backward: the ReLU mask (after the dropout's, when one followed) written over
 * the output's gradient in place (nothing reads it after this node) with the bias gradient taken
 * on the way, then the two products. */
static umt_status linear_relu_backward(umt_context *ctx, const umt_node *node) {
    UMT_TRY(umt_linear_bias_relu_backward(ctx, node));
    return linear_backward_from(ctx, node, false);
}

static umt_status check_linear(const umt_context *ctx, const char *op, const umt_tensor *x, const umt_tensor *w,
                               const umt_tensor *bias) {
    UMT_TRY(umt_check_input(ctx, op, "x", x, UMT_ANY_FLOAT, 2));
    UMT_TRY(umt_check_input(ctx, op, "weight", w, UMT_ANY_FLOAT, 2));
    char sx[64], sw[64];
    if (x->shape[1] != w->shape[1])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: x %s has %lld features, weight %s expects %lld", op,
                        umt_shape_string(x, sx, sizeof sx), (long long)x->shape[1], umt_shape_string(w, sw, sizeof sw),
                        (long long)w->shape[1]);
    if (!bias) return UMT_OK;
    UMT_TRY(umt_check_input(ctx, op, "bias", bias, UMT_F32, 1));
    if (bias->shape[0] != w->shape[0])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: bias has %lld elements, weight %s has %lld outputs", op,
                        (long long)bias->shape[0], umt_shape_string(w, sw, sizeof sw), (long long)w->shape[0]);
    return UMT_OK;
}

umt_status umt_linear_bias_relu(umt_context *ctx, const char *op, umt_tensor *y, const umt_tensor *bias, float p,
                                float *dropped) {
    const float *b = bias ? bias->data : NULL;
    int64_t rows = y->shape[0], k = y->shape[1];
    /* As umt_dropout would draw it (in evaluation, or with p = 0, none). */
    umt_dropout_draw drop = {.p = ctx->training ? p : 0.0f};
    *dropped = drop.p;
    if (drop.p == 0.0f) return umt_kernels(ctx)->f32.bias_relu(y->dtype, false, y->data, b, y->data, rows, k, 1);
    void *seed_on_device = NULL;
    UMT_TRY(umt_dropout_seed(ctx, y, op, &drop.seed, &seed_on_device, &drop.first));
    drop.seed_on_device = seed_on_device;
    return umt_kernels(ctx)->f32.bias_relu_dropout(y->dtype, y->data, b, y->data, rows, k, &drop);
}

/* y = x Wᵀ + bias, then max(y, 0) when relu, then with relu a dropout of p (0: none): the bias,
 * the ReLU and the dropout in one pass. */
static umt_tensor *linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, bool relu, float p) {
    if (!x || !weight) return NULL;
    const char *op = p > 0.0f ? "umt_linear_relu_dropout" : relu ? "umt_linear_relu" : "umt_linear";
    if (check_linear(ctx, op, x, weight, bias) != UMT_OK) return NULL;
    if (!(x = as_operand(ctx, x)) || !(weight = as_operand(ctx, weight))) return NULL;
    int64_t batch = x->shape[0], in = x->shape[1], out = weight->shape[0];
    umt_dtype dtype = umt_compute_dtype(ctx);
    umt_tensor *y = umt_op_output_typed(ctx, dtype, false, 2, (int64_t[]){batch, out});
    if (!y) return NULL;
    umt_status st;
    bool lowp = umt_dtype_is_lowp(dtype);
    /* Under bf16/fp16 the bias stays f32 (a master read directly): adding it costs one pass. */
    if (lowp)
        st = umt_kernels(ctx)->lowp.gemm(false, true, batch, out, in, 1.0f, operand(x), in, operand(weight), in, 0.0f,
                                   y->data, out, dtype, dtype);
    else
        st = umt_kernels(ctx)->f32.gemm(false, true, batch, out, in, 1.0f, x->data, in, weight->data, in, 0.0f, y->data, out);
    const float *b = bias ? bias->data : NULL;
    float dropped = 0.0f;
    if (st == UMT_OK && relu)
        st = umt_linear_bias_relu(ctx, op, y, bias, p, &dropped);
    else if (st == UMT_OK && bias)
        st = lowp ? umt_kernels(ctx)->lowp.add_rows(dtype, y->data, b, y->data, batch, out)
                  : umt_kernels(ctx)->f32.add_rows(y->data, b, y->data, batch, out);
    /* x's gradient is written whole (the product's beta 0) when it is the first (core/tape.h). */
    umt_backward_fn backward = relu ? linear_relu_backward : linear_backward;
    return umt_op_overwrites_input_grad(
        ctx, umt_op_finish_with(ctx, st, op, backward, y, NULL, x, weight, bias, 0, 0, dropped), 0);
}

umt_tensor *umt_linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias) {
    return linear(ctx, x, weight, bias, false, 0.0f);
}

umt_tensor *umt_linear_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias) {
    return linear(ctx, x, weight, bias, true, 0.0f);
}

umt_tensor *umt_linear_relu_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, float p) {
    if (!(p >= 0.0f && p < 1.0f)) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_linear_relu_dropout: p = %g (expected 0 <= p < 1)", p);
        return NULL;
    }
    return linear(ctx, x, weight, bias, true, p);
}
