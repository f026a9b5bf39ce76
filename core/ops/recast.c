/*
 * core/ops/recast.c — crossing between precisions (the policy is core/precision.h): the recast op,
 * a dtype and/or layout change recorded on the tape, and the compute copies of weights.
 */
#include "core/ops/ops.h"

void umt_recast_dims(const umt_tensor *t, int64_t *n, int64_t *c, int64_t *hw) {
    if (t->ndim == 4) {
        *n = t->shape[0], *c = t->shape[1], *hw = t->shape[2] * t->shape[3];
    } else {
        *n = 1, *c = 1, *hw = t->numel;
    }
}

/* ----------------------------------------------------------------------------------------- */
/* recast: a dtype and/or layout change, and back in backward */

static umt_status recast_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *x = node->inputs[0], *y = node->output;
    int64_t n, c, hw;
    umt_recast_dims(x, &n, &c, &hw);
    /* Added to x's gradient, or written over it when this is its first (core/tape.h). */
    return umt_kernels(ctx)->lowp.recast(y->grad->data, y->dtype, y->nhwc, x->grad->data, x->dtype, x->nhwc, n, c, hw,
                                !umt_input_grad_fresh(node, 0));
}

umt_tensor *umt_recast(umt_context *ctx, umt_tensor *x, umt_dtype dtype, bool nhwc) {
    if (!x) return NULL;
    nhwc = nhwc && x->ndim == 4;
    if (x->dtype == dtype && x->nhwc == nhwc) return x;
    if (!umt_kernels(ctx)->lowp.recast) {
        umt_fail(UMT_ERR_UNSUPPORTED, "recast %s -> %s: not on the %s backend", umt_dtype_name(x->dtype),
                 umt_dtype_name(dtype), umt_kernels(ctx)->name);
        return NULL;
    }
    umt_tensor *y = umt_op_output_typed(ctx, dtype, nhwc, x->ndim, x->shape);
    if (!y) return NULL;
    int64_t n, c, hw;
    umt_recast_dims(x, &n, &c, &hw);
    umt_status st = umt_kernels(ctx)->lowp.recast(x->data, x->dtype, x->nhwc, y->data, dtype, nhwc, n, c, hw, false);
    return umt_op_overwrites_input_grad(ctx, umt_op_finish(ctx, st, "recast", recast_backward, y, NULL, x, NULL, NULL),
                                        0);
}

umt_tensor *umt_to_compute(umt_context *ctx, umt_tensor *x) {
    umt_dtype dtype = umt_compute_dtype(ctx);
    return umt_recast(ctx, x, dtype, umt_dtype_is_lowp(dtype));
}

umt_tensor *umt_to_f32(umt_context *ctx, umt_tensor *x) { return umt_recast(ctx, x, UMT_F32, false); }

/* ----------------------------------------------------------------------------------------- */
/* Compute copies of weights */

/* w's compute copy: made at its first use (shape and layout as given, in the weights pool beside
 * its master: it lives as long, and is read every step), and converted again from the master
 * when the host wrote w since (lowp_stale). The conversion takes the copy's own dims, so a copy
 * laid out as a 4-D K,R,S,C block over a 2-D master (umt_weight_for_compute_hwc) refreshes in
 * its layout too. */
static umt_tensor *compute_copy(umt_context *ctx, umt_tensor *w, int ndim, const int64_t *shape, bool nhwc) {
    umt_dtype dtype = umt_compute_dtype(ctx);
    if (!w->lowp) {
        w->lowp = umt_tensor_alloc(ctx, UMT_POOL_WEIGHTS, dtype, ndim, shape);
        if (!w->lowp) return NULL;
        w->lowp->nhwc = nhwc;
        w->lowp_stale = true;
    }
    if (w->lowp_stale) {
        int64_t n, c, hw;
        umt_recast_dims(w->lowp, &n, &c, &hw);
        umt_status st = umt_kernels(ctx)->lowp.recast(w->data, UMT_F32, false, w->lowp->data, dtype, w->lowp->nhwc, n, c, hw, false);
        if (st != UMT_OK) {
            umt_fail(st, "compute copy of %s: %s", w->name ? w->name : "a parameter", umt_last_error());
            return NULL;
        }
        w->lowp_stale = false;
    }
    return w->lowp;
}

umt_tensor *umt_weight_for_compute(umt_context *ctx, umt_tensor *w) {
    /* A subsystem holding the weights elsewhere brings them in first (core/hooks.h). */
    if (w && umt_hooks_parameter_read(ctx, w) != UMT_OK) return NULL;
    umt_dtype dtype = umt_compute_dtype(ctx);
    if (!w || !umt_dtype_is_lowp(dtype) || w->dtype != UMT_F32) return w;
    if (w->lowp && w->lowp->ndim != w->ndim) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT,
                 "%s: its compute copy is laid out for umt_flatten_linear (columns in H,W,C order), not as a "
                 "matrix: use this weight with umt_flatten_linear only",
                 w->name ? w->name : "a parameter");
        return NULL;
    }
    return compute_copy(ctx, w, w->ndim, w->shape, w->ndim == 4);
}

umt_status umt_weight_for_compute_hwc(umt_context *ctx, umt_tensor *w, const umt_tensor *x, umt_tensor **out) {
    *out = NULL;
    UMT_TRY(umt_hooks_parameter_read(ctx, w));
    const int64_t shape[4] = {w->shape[0], x->shape[1], x->shape[2], x->shape[3]};
    const umt_tensor *have = w->lowp;
    bool same = have && have->ndim == 4 && have->nhwc && have->shape[1] == shape[1] && have->shape[2] == shape[2] &&
                have->shape[3] == shape[3];
    if (have && !same) return UMT_OK; /* a plain copy (the offload tier's, or another op's): flatten as usual */
    *out = compute_copy(ctx, w, 4, shape, true);
    return *out ? UMT_OK : umt_last_status();
}
