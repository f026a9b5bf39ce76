/* core/ops/conv.c — 2-D convolution (with bias, and fused with a ReLU), forward and backward. */
#include "core/branch.h"
#include "core/ops/ops.h"

/* The backend's view of x (*) w with the given stride and padding. */
static umt_conv_shape conv_shape(const umt_tensor *x, const umt_tensor *w, int64_t stride, int64_t padding) {
    umt_conv_shape s = {.n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3],
                        .k = w->shape[0], .r = w->shape[2], .s = w->shape[3], .stride = stride, .pad = padding};
    s.p = (s.h + 2 * padding - s.r) / stride + 1;
    s.q = (s.w + 2 * padding - s.s) / stride + 1;
    /* f32 NCHW unless x is a bf16/f16 NHWC activation (core/precision.h) */
    s.dtype = x->dtype;
    s.nhwc = x->nhwc;
    return s;
}

static umt_status check_conv(const umt_context *ctx, const char *op, const umt_tensor *x, const umt_tensor *w,
                             const umt_tensor *bias, int64_t stride, int64_t padding) {
    char sx[64], sw[64];
    UMT_TRY(umt_check_input(ctx, op, "x", x, UMT_ANY_FLOAT, 4));
    UMT_TRY(umt_check_input(ctx, op, "weight", w, UMT_F32, 4));
    if (x->shape[1] != w->shape[1])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: x %s has %lld channels, weight %s expects %lld", op,
                        umt_shape_string(x, sx, sizeof sx), (long long)x->shape[1], umt_shape_string(w, sw, sizeof sw),
                        (long long)w->shape[1]);
    if (stride < 1 || padding < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: stride %lld, padding %lld (expected >= 1, >= 0)", op,
                        (long long)stride, (long long)padding);
    if (x->shape[2] + 2 * padding < w->shape[2] || x->shape[3] + 2 * padding < w->shape[3])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: kernel %s larger than the padded input %s", op,
                        umt_shape_string(w, sw, sizeof sw), umt_shape_string(x, sx, sizeof sx));
    if (!bias) return UMT_OK;
    UMT_TRY(umt_check_input(ctx, op, "bias", bias, UMT_F32, 1));
    if (bias->shape[0] != w->shape[0])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: bias has %lld elements for %lld filters", op,
                        (long long)bias->shape[0], (long long)w->shape[0]);
    return UMT_OK;
}

/* *dw += the weight gradient, on the side stream beside the input gradient where the branch
 * takes it (core/branch.h); *dw is then NULL, so the caller makes it in order only if not. */
static umt_status weight_gradient_beside(umt_context *ctx, const umt_conv_shape *s, const umt_tensor *x,
                                         const umt_tensor *w, const void *dx, const void *dy, void **dw,
                                         size_t bytes) {
    double flops = 2.0 * (double)(s->n * s->p * s->q) * (double)(s->k * s->c * s->r * s->s);
    if (!*dw || !umt_branch_takes(ctx, w, dx, flops)) return UMT_OK;
    void *workspace = NULL;
    UMT_TRY(umt_branch_workspace(ctx, bytes, &workspace));
    const umt_backend *be = umt_kernels(ctx);
    UMT_TRY(umt_branch_begin(ctx, false));
    UMT_TRY(umt_branch_end(ctx, umt_dtype_is_lowp(s->dtype)
                                    ? be->lowp.conv2d_backward_filter(s, x->data, dy, *dw, workspace, bytes)
                                    : be->f32.conv2d_backward_filter(s, x->data, dy, *dw, workspace, bytes)));
    *dw = NULL;
    return UMT_OK;
}

/* dx (+)= the data gradient from dy: written whole when fresh (f32 zeroes it first: its slot
 * always adds). */
static umt_status data_gradient(const umt_backend *be, const umt_conv_shape *s, const umt_tensor *w, const void *dy,
                                void *dx, bool fresh, void *workspace, size_t bytes) {
    if (umt_dtype_is_lowp(s->dtype))
        return be->lowp.conv2d_backward_data(s, w->lowp->data, dy, dx, fresh, workspace, bytes);
    if (fresh) UMT_TRY(be->f32.zero(dx, (size_t)(s->n * s->c * s->h * s->w) * sizeof(float)));
    return be->f32.conv2d_backward_data(s, w->data, dy, dx, workspace, bytes);
}

/* The gradients of x and w (and of the bias, if sum_bias) from the output's gradient; under
 * bf16/fp16 the tensors are NHWC, w is read as its compute copy, dw stays f32. */
static umt_status conv_backward_from(umt_context *ctx, const umt_node *node, bool sum_bias) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    umt_conv_shape s = conv_shape(x, w, node->params[0], node->params[1]);
    void *dx = umt_input_grad(node, 0), *dw = umt_input_grad(node, 1), *dy = y->grad->data;
    float *dbias = sum_bias && node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    const umt_backend *be = umt_kernels(ctx);
    size_t bytes = 0;
    void *workspace = NULL;
    UMT_TRY(be->f32.conv2d_workspace_bytes(&s, &bytes));
    UMT_TRY(umt_context_workspace(ctx, bytes, &workspace));
    /* First, so that the side starts from the point before the input gradient. */
    UMT_TRY(weight_gradient_beside(ctx, &s, x, w, dx, dy, &dw, bytes));
    if (dx) UMT_TRY(data_gradient(be, &s, w, dy, dx, umt_input_grad_fresh(node, 0), workspace, bytes));
    if (umt_dtype_is_lowp(s.dtype)) {
        if (dw) UMT_TRY(be->lowp.conv2d_backward_filter(&s, x->data, dy, dw, workspace, bytes));
        if (dbias) UMT_TRY(be->lowp.sum_channel_bias(s.dtype, s.nhwc, dy, dbias, s.n, s.k, s.p * s.q));
        return UMT_OK;
    }
    if (dw) UMT_TRY(be->f32.conv2d_backward_filter(&s, x->data, dy, dw, workspace, bytes));
    if (dbias) UMT_TRY(be->f32.sum_channel_bias(dy, dbias, s.n, s.k, s.p * s.q));
    return UMT_OK;
}

static umt_status conv_backward(umt_context *ctx, const umt_node *node) { return conv_backward_from(ctx, node, true); }

/* Whether the backend runs this convolution, its bias and its ReLU as one (kernels/backend.h). */
static bool fused_by_backend(const umt_backend *be, const umt_conv_shape *s) {
    return be->fused.conv2d_relu_supports && be->fused.conv2d_relu_supports(s);
}

/* The backend's fused backward: the weight gradient reads y and dy once, masks, and sums the
 * bias; the masked gradient is kept only for the input's gradient. */
static umt_status conv_relu_backward_fused(umt_context *ctx, const umt_node *node, const umt_conv_shape *s) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    void *dx = umt_input_grad(node, 0), *dy = y->grad->data;
    float *dbias = node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    size_t bytes = 0;
    void *workspace = NULL;
    const umt_backend *be = umt_kernels(ctx);
    UMT_TRY(be->f32.conv2d_workspace_bytes(s, &bytes));
    UMT_TRY(umt_context_workspace(ctx, bytes, &workspace));
    UMT_TRY(be->fused.conv2d_relu_backward_filter(s, x->data, y->data, dy, dx != NULL, umt_input_grad(node, 1), dbias,
                                                  workspace, bytes));
    return dx ? data_gradient(be, s, w, dy, dx, umt_input_grad_fresh(node, 0), workspace, bytes) : UMT_OK;
}

/* The fused op's backward: one pass turns the output's gradient into the pre-ReLU gradient, in
 * place (nothing reads the output's gradient after this node), and takes the bias gradient on
 * the way; the convolution's gradients then read it. */
static umt_status conv_relu_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    umt_conv_shape s = conv_shape(node->inputs[0], node->inputs[1], node->params[0], node->params[1]);
    if (fused_by_backend(umt_kernels(ctx), &s) && umt_input_grad(node, 1)) return conv_relu_backward_fused(ctx, node, &s);
    float *dbias = node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    UMT_TRY(umt_kernels(ctx)->f32.bias_relu_backward(y->dtype, y->nhwc, y->data, y->grad->data, dbias, y->shape[0],
                                             y->shape[1], y->shape[2] * y->shape[3]));
    return conv_backward_from(ctx, node, false);
}

/* y = conv(x, w), then the bias (b may be NULL) and with relu the ReLU, in one pass after the
 * product, or with the product where the backend fuses all three. */
static umt_status forward_into(const umt_backend *be, const umt_conv_shape *s, const void *x, const void *w,
                               const float *b, bool relu, void *y, void *workspace, size_t bytes) {
    if (relu && fused_by_backend(be, s)) return be->fused.conv2d_relu_forward(s, x, w, b, y, workspace, bytes);
    bool lowp = umt_dtype_is_lowp(s->dtype);
    UMT_TRY(lowp ? be->lowp.conv2d_forward(s, x, w, y, workspace, bytes)
                 : be->f32.conv2d_forward(s, x, w, y, workspace, bytes));
    int64_t pixels = s->p * s->q;
    if (relu) return be->f32.bias_relu(s->dtype, s->nhwc, y, b, y, s->n, s->k, pixels);
    if (!b) return UMT_OK;
    return lowp ? be->lowp.add_channel_bias(s->dtype, s->nhwc, y, b, y, s->n, s->k, pixels)
                : be->f32.add_channel_bias(y, b, y, s->n, s->k, pixels);
}

/* y = conv(x, w) + bias, then max(y, 0) when relu: the bias and the ReLU in one pass. */
static umt_tensor *conv2d(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, int64_t stride,
                          int64_t padding, bool relu) {
    if (!x || !weight) return NULL;
    const char *op = relu ? "umt_conv2d_relu" : "umt_conv2d";
    if (check_conv(ctx, op, x, weight, bias, stride, padding) != UMT_OK) return NULL;
    /* Under bf16/fp16 the input becomes NHWC in the compute dtype: once, at the first conv. */
    if (!(x = umt_to_compute(ctx, x))) return NULL;
    const umt_tensor *w = umt_weight_for_compute(ctx, weight);
    if (!w) return NULL;
    umt_conv_shape s = conv_shape(x, weight, stride, padding);
    umt_tensor *y = umt_op_output_typed(ctx, s.dtype, s.nhwc, 4, (int64_t[]){s.n, s.k, s.p, s.q});
    if (!y) return NULL;
    size_t bytes = 0;
    void *workspace = NULL;
    umt_status st = umt_kernels(ctx)->f32.conv2d_workspace_bytes(&s, &bytes);
    if (st == UMT_OK) st = umt_context_workspace(ctx, bytes, &workspace);
    if (st == UMT_OK)
        st = forward_into(umt_kernels(ctx), &s, x->data, w->data, bias ? bias->data : NULL, relu, y->data, workspace,
                          bytes);
    /* The data gradient is written whole (cuDNN's beta 0) when it is the first (core/tape.h). */
    return umt_op_overwrites_input_grad(ctx,
                                        umt_op_finish_with(ctx, st, op, relu ? conv_relu_backward : conv_backward, y,
                                                           NULL, x, weight, bias, stride, padding, 0.0f),
                                        0);
}

umt_tensor *umt_conv2d(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, int64_t stride,
                       int64_t padding) {
    return conv2d(ctx, x, weight, bias, stride, padding, false);
}

umt_tensor *umt_conv2d_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, int64_t stride,
                            int64_t padding) {
    return conv2d(ctx, x, weight, bias, stride, padding, true);
}
