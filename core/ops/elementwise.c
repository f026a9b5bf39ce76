/* core/ops/elementwise.c — add, mul, relu, reshape/flatten: forward and backward. */
#include "core/ops/ops.h"

static bool same_shape(const umt_tensor *a, const umt_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static umt_status shape_mismatch(const char *op, const umt_tensor *a, const umt_tensor *b, const char *expected) {
    char sa[64], sb[64];
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: a %s and b %s (expected %s)", op, umt_shape_string(a, sa, sizeof sa),
                    umt_shape_string(b, sb, sizeof sb), expected);
}

/* ----------------------------------------------------------------------------------------- */
/* add: a + b, b of a's shape or a row vector broadcast over a's last dimension */

static umt_status add_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *a = node->inputs[0], *b = node->inputs[1], *out = node->output;
    float *da = umt_input_grad(node, 0), *db = umt_input_grad(node, 1);
    if (da) UMT_TRY(umt_kernels(ctx)->f32.accumulate(da, out->grad->data, 1.0f, a->numel));
    if (!db) return UMT_OK;
    if (b->numel == a->numel) return umt_kernels(ctx)->f32.accumulate(db, out->grad->data, 1.0f, b->numel);
    return umt_kernels(ctx)->f32.sum_rows(out->grad->data, db, a->numel / b->numel, b->numel);
}

/* add and mul compute in f32 whatever the precision (bf16/fp16 inputs are converted first): they
 * are rare in the models here, and their f32 kernels are the reference ones. */
static bool f32_inputs(umt_context *ctx, const char *op, umt_tensor **a, umt_tensor **b) {
    if (umt_check_input(ctx, op, "a", *a, UMT_ANY_FLOAT, 0) != UMT_OK ||
        umt_check_input(ctx, op, "b", *b, UMT_ANY_FLOAT, 0) != UMT_OK)
        return false;
    *a = umt_to_f32(ctx, *a);
    *b = *a ? umt_to_f32(ctx, *b) : NULL;
    return *b != NULL;
}

umt_tensor *umt_add(umt_context *ctx, umt_tensor *a, umt_tensor *b) {
    if (!a || !b || !f32_inputs(ctx, "umt_add", &a, &b)) return NULL;
    bool broadcast = b->ndim == 1 && b->shape[0] == a->shape[a->ndim - 1] && !same_shape(a, b);
    if (!broadcast && !same_shape(a, b)) {
        shape_mismatch("umt_add", a, b, "equal shapes, or b 1-D of a's last dimension");
        return NULL;
    }
    umt_tensor *out = umt_op_output(ctx, a->ndim, a->shape);
    if (!out) return NULL;
    umt_status st = broadcast ? umt_kernels(ctx)->f32.add_rows(a->data, b->data, out->data, a->numel / b->numel, b->numel)
                              : umt_kernels(ctx)->f32.add(a->data, b->data, out->data, a->numel);
    return umt_op_finish(ctx, st, "umt_add", add_backward, out, NULL, a, b, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* mul: a * b elementwise */

static umt_status mul_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *a = node->inputs[0], *b = node->inputs[1], *out = node->output;
    float *da = umt_input_grad(node, 0), *db = umt_input_grad(node, 1);
    if (da) UMT_TRY(umt_kernels(ctx)->f32.accumulate_product(da, out->grad->data, b->data, a->numel));
    if (db) UMT_TRY(umt_kernels(ctx)->f32.accumulate_product(db, out->grad->data, a->data, b->numel));
    return UMT_OK;
}

umt_tensor *umt_mul(umt_context *ctx, umt_tensor *a, umt_tensor *b) {
    if (!a || !b || !f32_inputs(ctx, "umt_mul", &a, &b)) return NULL;
    if (!same_shape(a, b)) {
        shape_mismatch("umt_mul", a, b, "equal shapes");
        return NULL;
    }
    umt_tensor *out = umt_op_output(ctx, a->ndim, a->shape);
    if (!out) return NULL;
    umt_status st = umt_kernels(ctx)->f32.mul(a->data, b->data, out->data, a->numel);
    return umt_op_finish(ctx, st, "umt_mul", mul_backward, out, NULL, a, b, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* relu: max(x, 0); backward reads the output (y > 0 exactly where x > 0) */

static umt_status relu_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    if (umt_dtype_is_lowp(y->dtype))
        return umt_kernels(ctx)->lowp.relu_backward(y->dtype, y->data, y->grad->data, umt_input_grad(node, 0), y->numel);
    return umt_kernels(ctx)->f32.relu_backward(y->data, y->grad->data, umt_input_grad(node, 0), y->numel);
}

umt_tensor *umt_relu(umt_context *ctx, umt_tensor *x) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_relu", "x", x, UMT_ANY_FLOAT, 0) != UMT_OK) return NULL;
    umt_tensor *y = umt_op_output_like(ctx, x);
    if (!y) return NULL;
    umt_status st = umt_dtype_is_lowp(x->dtype) ? umt_kernels(ctx)->lowp.relu(x->dtype, x->data, y->data, x->numel)
                                                : umt_kernels(ctx)->f32.relu(x->data, y->data, x->numel);
    return umt_op_finish(ctx, st, "umt_relu", relu_backward, y, NULL, x, NULL, NULL);
}

/* ----------------------------------------------------------------------------------------- */
/* reshape / flatten: a view; the gradient flows through unchanged */

/* The gradient passes through: added to x's, or copied when this is its first (core/tape.h). */
static umt_status reshape_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    bool fresh = umt_input_grad_fresh(node, 0);
    if (umt_dtype_is_lowp(y->dtype))
        return umt_kernels(ctx)->lowp.recast(y->grad->data, y->dtype, false, umt_input_grad(node, 0), y->dtype, false, 1, 1,
                                    y->numel, !fresh);
    if (fresh) return umt_kernels(ctx)->f32.copy(umt_input_grad(node, 0), y->grad->data, y->grad->bytes);
    return umt_kernels(ctx)->f32.accumulate(umt_input_grad(node, 0), y->grad->data, 1.0f, y->numel);
}

/* Shapes are NCHW whatever the storage, so an NHWC tensor's values are put in NCHW order: the
 * flattened features then mean the same under every precision (and in checkpoints). That is
 * one transpose straight into the new shape, and one back in backward (written over x's
 * gradient when it is the first), with no NCHW copy of x in between. */
static umt_status reshape_nhwc_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *x = node->inputs[0], *y = node->output;
    int64_t n, c, hw;
    umt_recast_dims(x, &n, &c, &hw);
    return umt_kernels(ctx)->lowp.recast(y->grad->data, y->dtype, false, x->grad->data, x->dtype, true, n, c, hw,
                                !umt_input_grad_fresh(node, 0));
}

static umt_tensor *reshape_nhwc(umt_context *ctx, umt_tensor *x, int ndim, const int64_t *shape) {
    int64_t numel = 1, n, c, hw;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel != x->numel) {
        char sx[64];
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_reshape: %lld elements into a shape of %lld (input %s)",
                 (long long)x->numel, (long long)numel, umt_shape_string(x, sx, sizeof sx));
        return NULL;
    }
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, false, ndim, shape);
    if (!y) return NULL;
    umt_recast_dims(x, &n, &c, &hw);
    umt_status st = umt_kernels(ctx)->lowp.recast(x->data, x->dtype, true, y->data, y->dtype, false, n, c, hw, false);
    return umt_op_overwrites_input_grad(
        ctx, umt_op_finish(ctx, st, "umt_reshape", reshape_nhwc_backward, y, NULL, x, NULL, NULL), 0);
}

umt_tensor *umt_reshape(umt_context *ctx, umt_tensor *x, int ndim, const int64_t *shape) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_reshape", "x", x, UMT_ANY_DTYPE, 0) != UMT_OK) return NULL;
    if (!shape) return umt_fail_null("umt_reshape", "shape"), NULL;
    if (x->nhwc) return reshape_nhwc(ctx, x, ndim, shape);
    umt_tensor *y = umt_tensor_view(ctx, x, ndim, shape);
    if (!y) return NULL;
    return umt_op_overwrites_input_grad(ctx, umt_op_finish(ctx, UMT_OK, "umt_reshape", reshape_backward, y, NULL, x,
                                                           NULL, NULL),
                                        0);
}

umt_tensor *umt_flatten(umt_context *ctx, umt_tensor *x) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_flatten", "x", x, UMT_ANY_DTYPE, 0) != UMT_OK) return NULL;
    return umt_reshape(ctx, x, 2, (int64_t[]){x->shape[0], x->numel / x->shape[0]});
}
