/* core/ops/pool.c — max and average pooling (and max pooling fused with dropout, and with a
 * convolution's bias and ReLU before it), forward and backward. */
#include "core/ops/ops.h"

static umt_status check_pool(const umt_context *ctx, const char *op, const umt_tensor *x, int64_t window,
                             int64_t stride) {
    char sx[64];
    UMT_TRY(umt_check_input(ctx, op, "x", x, UMT_ANY_FLOAT, 4));
    if (window < 1 || stride < 1 || window > x->shape[2] || window > x->shape[3])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: window %lld, stride %lld on x %s (expected 1 <= window <= H, W)",
                        op, (long long)window, (long long)stride, umt_shape_string(x, sx, sizeof sx));
    return UMT_OK;
}

static umt_pool_shape pool_shape(const umt_tensor *x, int64_t window, int64_t stride) {
    return (umt_pool_shape){.n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3],
                            .p = (x->shape[2] - window) / stride + 1, .q = (x->shape[3] - window) / stride + 1,
                            .window = window, .stride = stride, .dtype = x->dtype, .nhwc = x->nhwc};
}

/* ----------------------------------------------------------------------------------------- */
/* max pool: the window's first maximum is kept (saved) for backward */

static umt_status max_pool_backward(umt_context *ctx, const umt_node *node) {
    umt_pool_shape s = pool_shape(node->inputs[0], node->params[0], node->params[1]);
    if (umt_dtype_is_lowp(s.dtype))
        return umt_kernels(ctx)->lowp.max_pool_backward(&s, node->saved->data, node->output->grad->data,
                                                  umt_input_grad(node, 0));
    return umt_kernels(ctx)->f32.max_pool_backward(&s, node->saved->data, node->output->grad->data, umt_input_grad(node, 0));
}

umt_tensor *umt_max_pool2d(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride) {
    if (!x) return NULL;
    if (check_pool(ctx, "umt_max_pool2d", x, window, stride) != UMT_OK) return NULL;
    umt_pool_shape s = pool_shape(x, window, stride);
    int64_t out_shape[4] = {s.n, s.c, s.p, s.q};
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, x->nhwc, 4, out_shape);
    umt_tensor *argmax = y ? umt_op_output_typed(ctx, UMT_I32, x->nhwc, 4, out_shape) : NULL;
    if (!argmax) return NULL;
    umt_status st = umt_dtype_is_lowp(s.dtype) ? umt_kernels(ctx)->lowp.max_pool_forward(&s, x->data, y->data, argmax->data)
                                               : umt_kernels(ctx)->f32.max_pool_forward(&s, x->data, y->data, argmax->data);
    return umt_op_finish_with(ctx, st, "umt_max_pool2d", max_pool_backward, y, argmax, x, NULL, NULL, window, stride,
                              0.0f);
}

/* ----------------------------------------------------------------------------------------- */
/* average pool */

static umt_status avg_pool_backward(umt_context *ctx, const umt_node *node) {
    umt_pool_shape s = pool_shape(node->inputs[0], node->params[0], node->params[1]);
    if (umt_dtype_is_lowp(s.dtype))
        return umt_kernels(ctx)->lowp.avg_pool_backward(&s, node->output->grad->data, umt_input_grad(node, 0));
    return umt_kernels(ctx)->f32.avg_pool_backward(&s, node->output->grad->data, umt_input_grad(node, 0));
}

umt_tensor *umt_avg_pool2d(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride) {
    if (!x) return NULL;
    if (check_pool(ctx, "umt_avg_pool2d", x, window, stride) != UMT_OK) return NULL;
    umt_pool_shape s = pool_shape(x, window, stride);
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, x->nhwc, 4, (int64_t[]){s.n, s.c, s.p, s.q});
    if (!y) return NULL;
    umt_status st = umt_dtype_is_lowp(s.dtype) ? umt_kernels(ctx)->lowp.avg_pool_forward(&s, x->data, y->data)
                                               : umt_kernels(ctx)->f32.avg_pool_forward(&s, x->data, y->data);
    return umt_op_finish_with(ctx, st, "umt_avg_pool2d", avg_pool_backward, y, NULL, x, NULL, NULL, window, stride,
                              0.0f);
}

/* ----------------------------------------------------------------------------------------- */
/* max pool + dropout: dropout(max_pool2d(x)) as one op. The forward runs the two kernels (the
 * dropout in place on the pool's output); the backward is one pass that puts each kept, scaled
 * gradient on its window's pick, with no gradient tensor for the pool's output in between. */

/* The saved block: the picks (i32, first) and then the dropout mask (u8), one per output. */
static umt_status max_pool_dropout_backward(umt_context *ctx, const umt_node *node) {
    umt_pool_shape s = pool_shape(node->inputs[0], node->params[0], node->params[1]);
    const int32_t *argmax = node->saved->data;
    const uint8_t *mask = (const uint8_t *)(argmax + node->output->numel);
    return umt_kernels(ctx)->f32.max_pool_dropout_backward(&s, argmax, mask, node->output->grad->data, umt_input_grad(node, 0),
                                                   node->fparam);
}

umt_tensor *umt_max_pool2d_dropout(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride, float p) {
    if (!x) return NULL;
    if (check_pool(ctx, "umt_max_pool2d_dropout", x, window, stride) != UMT_OK) return NULL;
    if (!(p >= 0.0f && p < 1.0f)) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_max_pool2d_dropout: p = %g (expected 0 <= p < 1)", p);
        return NULL;
    }
    /* Nothing to drop, or overlapping windows (whose picks the one-pass backward cannot share):
     * the two ops, which mean the same. */
    if (!ctx->training || p == 0.0f || stride < window)
        return umt_dropout(ctx, umt_max_pool2d(ctx, x, window, stride), p);
    umt_pool_shape s = pool_shape(x, window, stride);
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, x->nhwc, 4, (int64_t[]){s.n, s.c, s.p, s.q});
    umt_tensor *saved = y ? umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_U8, 1, (int64_t[]){y->numel * 5}) : NULL;
    if (!saved) return NULL;
    int32_t *argmax = saved->data;
    uint8_t *mask = (uint8_t *)(argmax + y->numel);
    /* One draw, after the pool, as umt_dropout would make it: the same run from the same seed. */
    uint64_t seed;
    void *seed_on_device;
    int64_t first;
    umt_status st = umt_dropout_seed(ctx, y, "umt_max_pool2d_dropout", &seed, &seed_on_device, &first);
    const umt_backend *be = umt_kernels(ctx);
    if (st == UMT_OK && umt_dtype_is_lowp(s.dtype)) {
        st = be->lowp.max_pool_forward(&s, x->data, y->data, argmax);
        if (st == UMT_OK)
            st = be->lowp.dropout_forward(s.dtype, y->data, y->data, mask, y->numel, first, p, seed, seed_on_device);
    } else if (st == UMT_OK) {
        st = be->f32.max_pool_forward(&s, x->data, y->data, argmax);
        if (st == UMT_OK) st = be->f32.dropout_forward(y->data, y->data, mask, y->numel, first, p, seed, seed_on_device);
    }
    return umt_op_finish_with(ctx, st, "umt_max_pool2d_dropout", max_pool_dropout_backward, y, saved, x, NULL, NULL,
                              window, stride, p);
}

/* ----------------------------------------------------------------------------------------- */
/* bias + ReLU + max pool + dropout: a convolution's bias and ReLU move past the pool, which
 * commutes with both (the same bias over a window, and both monotone), so the full-size
 * activation is read once and never written: the op's output, argmax and mask are a quarter. */

static umt_status bias_relu_pool_dropout_backward(umt_context *ctx, const umt_node *node) {
    umt_pool_shape s = pool_shape(node->inputs[0], node->params[0], node->params[1]);
    const umt_tensor *y = node->output;
    return umt_kernels(ctx)->f32.bias_relu_max_pool_dropout_backward(&s, node->saved->data, y->data, y->grad->data,
                                                             umt_input_grad(node, 0), umt_input_grad_fresh(node, 0),
                                                             umt_input_grad(node, 1), node->fparam);
}

/* The backward puts each output's gradient on its one pick: windows may not share inputs. */
bool umt_bias_relu_max_pool2d_dropout_supports(int64_t window, int64_t stride) {
    return stride >= window && window <= 16;
}

static umt_status check_bias_relu_pool(const umt_context *ctx, const umt_tensor *x, const umt_tensor *bias,
                                       int64_t window, int64_t stride, float p) {
    const char *op = "umt_bias_relu_max_pool2d_dropout";
    UMT_TRY(check_pool(ctx, op, x, window, stride));
    UMT_TRY(umt_check_input(ctx, op, "bias", bias, UMT_F32, 1));
    if (bias->shape[0] != x->shape[1])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: bias has %lld elements for %lld channels", op,
                        (long long)bias->shape[0], (long long)x->shape[1]);
    if (!(p >= 0.0f && p < 1.0f)) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g (expected 0 <= p < 1)", op, p);
    if (!umt_bias_relu_max_pool2d_dropout_supports(window, stride))
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: window %lld, stride %lld (expected stride >= window and window <= "
                        "16, a pick in one byte; otherwise umt_conv2d_relu and umt_max_pool2d_dropout)", op,
                        (long long)window, (long long)stride);
    return UMT_OK;
}

umt_tensor *umt_bias_relu_max_pool2d_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *bias, int64_t window,
                                             int64_t stride, float p) {
    if (!x || !bias) return NULL;
    if (check_bias_relu_pool(ctx, x, bias, window, stride, p) != UMT_OK) return NULL;
    umt_pool_shape s = pool_shape(x, window, stride);
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, x->nhwc, 4, (int64_t[]){s.n, s.c, s.p, s.q});
    /* Each output's pick (its window position, a byte). */
    umt_tensor *saved = y ? umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_U8, 1, (int64_t[]){y->numel}) : NULL;
    if (!saved) return NULL;
    /* Dropout as umt_dropout would draw it (in evaluation, or with p = 0, none), drawn by the
     * pool's kernel as it writes y. The backward needs no mask: the output is 0 wherever the
     * dropout or the ReLU zeroed it. */
    float dropped = ctx->training ? p : 0.0f;
    umt_dropout_draw drop = {.p = dropped};
    void *seed_on_device = NULL;
    umt_status st = UMT_OK;
    if (dropped > 0.0f)
        st = umt_dropout_seed(ctx, y, "umt_bias_relu_max_pool2d_dropout", &drop.seed, &seed_on_device, &drop.first);
    drop.seed_on_device = seed_on_device;
    if (st == UMT_OK)
        st = umt_kernels(ctx)->f32.bias_relu_max_pool_dropout_forward(&s, x->data, bias->data, y->data, saved->data,
                                                                      dropped > 0.0f ? &drop : NULL);
    /* Its backward writes x's whole gradient (0 off the picks) when it is the first to. */
    return umt_op_overwrites_input_grad(ctx,
                                        umt_op_finish_with(ctx, st, "umt_bias_relu_max_pool2d_dropout",
                                                           bias_relu_pool_dropout_backward, y, saved, x, bias, NULL,
                                                           window, stride, dropped),
                                        0);
}
