/* core/ops/flatten_linear.c — flatten then linear (and its ReLU) as one op: under bf16/fp16 the
 * NHWC features are read as they lie, not transposed.
 *
 * A convolution stack's activations are NHWC under bf16/fp16 (core/precision.h), but a flattened
 * feature vector means C,H,W order: PyTorch's, and the checkpoints'. umt_flatten therefore
 * transposes the activation, and its backward transposes the gradient back: two passes over the
 * largest tensors a small CNN's head sees (the MNIST CNN's [N,64,12,12]). Here the product reads
 * x as it lies, [N, h*w*c], against a compute copy of the weight whose columns are in the same
 * H,W,C order: the copy is [out, c, h, w] stored K,R,S,C, the layout of a convolution weight's
 * copy with the feature map as its kernel, so the optimizer's fused update keeps it that way
 * (core/optim/optim.c) and the master stays in C,H,W order.
 *   forward   y = x_hwc W_hwcᵀ (+ bias, ReLU)     the same products summed in another order
 *   dx        dx_hwc = dy W_hwc                   x's gradient in x's own layout
 *   dW        scratch = dyᵀ x_hwc, then added into the master's gradient transposed to C,H,W
 *             (a pass over the weight, 4.7 MB for the MNIST CNN's fc1, not over activations)
 * It pays only at large batches: the update then writes the copy through tiles (a transpose,
 * kernels/cuda/optim.cu), and the weight gradient is transposed each step, costs that scale
 * with the weight, while the transposes saved scale with the batch: taken at every batch, the
 * MNIST CNN (fc1: 128 outputs) gained at 4096 and lost at 64 and 512 (docs/PERF.md, "Flattened
 * features as they lie"). So the weight's copy takes this layout only when it is made
 * (its first use) at a batch of at least HWC_ROWS_PER_OUTPUT rows per output feature; then
 * every later call keeps to the layout its copy has.
 * Anything else (fp32, an f32 or NCHW x, a smaller first batch, a weight whose copy the offload
 * tier made plain) is umt_flatten then umt_linear, exactly.
 */
#include "core/branch.h"
#include "core/ops/ops.h"

/* The batch, in rows per output feature, from which a new copy is made H,W,C (see above). */
enum { HWC_ROWS_PER_OUTPUT = 8 };

/* The weight gradient in H,W,C column order into scratch (beta 0), then added into dw in the
 * master's C,H,W order (recast's transpose, accumulating). */
static umt_status hwc_weight_product(umt_context *ctx, const umt_node *node, void *dw, void *scratch) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    int64_t batch = x->shape[0], c = x->shape[1], hw = x->shape[2] * x->shape[3], in = c * hw, out = w->shape[0];
    const umt_backend *be = umt_kernels(ctx);
    UMT_TRY(be->lowp.gemm(true, false, out, in, batch, 1.0f, y->grad->data, out, x->data, in, 0.0f, scratch, in, y->dtype,
                          UMT_F32));
    return be->lowp.recast(scratch, UMT_F32, true, dw, UMT_F32, false, out, c, hw, true);
}

/* The weight gradient on the side stream beside dx where the branch takes it (core/branch.h),
 * with a scratch of its own there, called before dx so that the side starts from the point
 * before it; *dw is then NULL, so the caller makes it in order after dx only if not (as
 * core/ops/matmul.c's weight_product_beside). */
static umt_status hwc_weight_gradient_beside(umt_context *ctx, const umt_node *node, const void *dx, void **dw) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1];
    double flops = 2.0 * (double)x->numel * (double)w->shape[0];
    if (!*dw || !umt_branch_takes(ctx, w, dx, flops)) return UMT_OK;
    void *scratch = NULL;
    UMT_TRY(umt_branch_workspace(ctx, (size_t)w->numel * sizeof(float), &scratch));
    UMT_TRY(umt_branch_begin(ctx, true));
    UMT_TRY(umt_branch_end(ctx, hwc_weight_product(ctx, node, *dw, scratch)));
    *dw = NULL;
    return UMT_OK;
}

static umt_status flatten_linear_backward_from(umt_context *ctx, const umt_node *node, bool sum_bias) {
    const umt_tensor *x = node->inputs[0], *w = node->inputs[1], *y = node->output;
    const umt_tensor *w_hwc = w->lowp; /* the H,W,C copy the forward read */
    int64_t batch = x->shape[0], in = x->numel / batch, out = y->shape[1];
    void *dx = umt_input_grad(node, 0), *dw = umt_input_grad(node, 1);
    float *dbias = sum_bias && node->input_count > 2 ? umt_input_grad(node, 2) : NULL;
    const umt_backend *be = umt_kernels(ctx);
    UMT_TRY(hwc_weight_gradient_beside(ctx, node, dx, &dw));
    if (dx)
        UMT_TRY(be->lowp.gemm(false, false, batch, in, out, 1.0f, y->grad->data, out, w_hwc->data, in,
                              umt_input_grad_fresh(node, 0) ? 0.0f : 1.0f, dx, in, y->dtype, x->grad->dtype));
    if (dw) {
        void *scratch = NULL;
        UMT_TRY(umt_context_workspace(ctx, (size_t)w->numel * sizeof(float), &scratch));
        UMT_TRY(hwc_weight_product(ctx, node, dw, scratch));
    }
    if (dbias) UMT_TRY(be->lowp.sum_rows(y->dtype, y->grad->data, dbias, batch, out));
    return UMT_OK;
}

static umt_status flatten_linear_backward(umt_context *ctx, const umt_node *node) {
    return flatten_linear_backward_from(ctx, node, true);
}

/* The ReLU mask (after the dropout's, when one followed) written over the output's gradient in
 * place, the bias gradient taken on the way (as umt_linear_relu's backward), then the products. */
static umt_status flatten_linear_relu_backward(umt_context *ctx, const umt_node *node) {
    UMT_TRY(umt_linear_bias_relu_backward(ctx, node));
    return flatten_linear_backward_from(ctx, node, false);
}

/* Whether this op may read x as it lies: a 4-D NHWC activation in the compute dtype, an f32
 * parameter weight [out, c*h*w] with no compute copy yet and a batch of at least
 * HWC_ROWS_PER_OUTPUT * out rows, or with a copy (whose layout then decides: the caller asks),
 * an f32 bias [out] or none. Anything else (wrong shapes too) goes through umt_flatten and
 * umt_linear, which name what is wrong. */
static bool reads_as_lying(const umt_context *ctx, const umt_tensor *x, const umt_tensor *w, const umt_tensor *bias) {
    umt_dtype dtype = umt_compute_dtype(ctx);
    if (!umt_dtype_is_lowp(dtype)) return false;
    if (x->ndim != 4 || !x->nhwc || x->dtype != dtype) return false;
    if (!w->is_parameter || w->dtype != UMT_F32 || w->ndim != 2 || w->shape[1] != x->numel / x->shape[0]) return false;
    if (!w->lowp && x->shape[0] < HWC_ROWS_PER_OUTPUT * w->shape[0]) return false;
    return !bias || (bias->dtype == UMT_F32 && bias->ndim == 1 && bias->shape[0] == w->shape[0]);
}

/* relu: the ReLU, and with it a dropout of p (0: none) */
static umt_tensor *flatten_linear(umt_context *ctx, umt_tensor *x, umt_tensor *w, umt_tensor *bias, bool relu,
                                  float p) {
    if (!x || !w) return NULL;
    const char *op = p > 0.0f ? "umt_flatten_linear_relu_dropout" : relu ? "umt_flatten_linear_relu"
                                                                        : "umt_flatten_linear";
    if (umt_check_input(ctx, op, "x", x, UMT_ANY_FLOAT, 0) != UMT_OK ||
        umt_check_input(ctx, op, "weight", w, UMT_ANY_FLOAT, 2) != UMT_OK ||
        (bias && umt_check_input(ctx, op, "bias", bias, UMT_F32, 1) != UMT_OK))
        return NULL;
    umt_tensor *w_hwc = NULL;
    if (reads_as_lying(ctx, x, w, bias) && umt_weight_for_compute_hwc(ctx, w, x, &w_hwc) != UMT_OK) return NULL;
    if (!w_hwc) {
        umt_tensor *flat = umt_flatten(ctx, x);
        return p > 0.0f ? umt_linear_relu_dropout(ctx, flat, w, bias, p)
               : relu   ? umt_linear_relu(ctx, flat, w, bias)
                        : umt_linear(ctx, flat, w, bias);
    }
    int64_t batch = x->shape[0], in = w->shape[1], out = w->shape[0];
    umt_tensor *y = umt_op_output_typed(ctx, x->dtype, false, 2, (int64_t[]){batch, out});
    if (!y) return NULL;
    const umt_backend *be = umt_kernels(ctx);
    umt_status st = be->lowp.gemm(false, true, batch, out, in, 1.0f, x->data, in, w_hwc->data, in, 0.0f, y->data, out,
                                  x->dtype, x->dtype);
    float dropped = 0.0f;
    if (st == UMT_OK && relu)
        st = umt_linear_bias_relu(ctx, op, y, bias, p, &dropped);
    else if (st == UMT_OK && bias)
        st = be->lowp.add_rows(x->dtype, y->data, bias->data, y->data, batch, out);
    umt_tensor *done = umt_op_finish_with(ctx, st, op, relu ? flatten_linear_relu_backward : flatten_linear_backward,
                                          y, NULL, x, w, bias, 0, 0, dropped);
    /* x's gradient is written whole (the product's beta 0) when it is the first (core/tape.h). */
    return umt_op_overwrites_input_grad(ctx, done, 0);
}

umt_tensor *umt_flatten_linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias) {
    return flatten_linear(ctx, x, weight, bias, false, 0.0f);
}

umt_tensor *umt_flatten_linear_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias) {
    return flatten_linear(ctx, x, weight, bias, true, 0.0f);
}

umt_tensor *umt_flatten_linear_relu_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias,
                                            float p) {
    if (!(p >= 0.0f && p < 1.0f)) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_flatten_linear_relu_dropout: p = %g (expected 0 <= p < 1)", p);
        return NULL;
    }
    return flatten_linear(ctx, x, weight, bias, true, p);
}
