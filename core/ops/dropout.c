/* core/ops/dropout.c — inverted dropout: forward and backward share one mask. */
#include <string.h>

#include "core/ops/ops.h"

static umt_status dropout_backward(umt_context *ctx, const umt_node *node) {
    const umt_tensor *y = node->output;
    if (umt_dtype_is_lowp(y->dtype))
        return umt_kernels(ctx)->lowp.dropout_backward(y->dtype, node->saved->data, y->grad->data, umt_input_grad(node, 0),
                                                 y->numel, node->fparam);
    return umt_kernels(ctx)->f32.dropout_backward(node->saved->data, y->grad->data, umt_input_grad(node, 0), y->numel,
                                          node->fparam);
}

/* A replay's seed: the next draw of the context's RNG, as the eager call makes it. */
static void draw_seed(void *context, void *dst, size_t bytes) {
    uint64_t seed = umt_rng_next(&((umt_context *)context)->rng);
    memcpy(dst, &seed, bytes);
}

/* One draw from the context's RNG per call: the run is reproducible from its seed, and the
 * kernel derives every element's draw from it on whichever device it runs. A captured step
 * reads it from the step's values instead (*seed_on_device), where each replay puts its own.
 * A micro-batch after the first takes the first one's draw again, and *first places x's
 * elements in the whole batch (core/micro_batch.h): the masks are the unsplit step's. */
umt_status umt_dropout_seed(umt_context *ctx, const umt_tensor *x, const char *op, uint64_t *seed,
                            void **seed_on_device, int64_t *first) {
    *seed = 0;
    *seed_on_device = NULL;
    bool repeated;
    UMT_TRY(umt_micro_batch_dropout(ctx, x, op, first, seed, seed_on_device, &repeated));
    if (repeated) return UMT_OK;
    if (ctx->values.recording) UMT_TRY(umt_step_values_remade(ctx, sizeof *seed, draw_seed, ctx, seed_on_device));
    else *seed = umt_rng_next(&ctx->rng);
    return umt_micro_batch_keep_draw(ctx, *seed, *seed_on_device);
}

umt_tensor *umt_dropout(umt_context *ctx, umt_tensor *x, float p) {
    if (!x) return NULL;
    if (umt_check_input(ctx, "umt_dropout", "x", x, UMT_ANY_FLOAT, 0) != UMT_OK) return NULL;
    if (!(p >= 0.0f && p < 1.0f)) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dropout: p = %g (expected 0 <= p < 1)", p);
        return NULL;
    }
    /* Evaluation, or nothing to drop: the identity, with nothing to record. */
    if (!ctx->training || p == 0.0f) return x;
    umt_tensor *y = umt_op_output_like(ctx, x);
    umt_tensor *mask = y ? umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_U8, x->ndim, x->shape) : NULL;
    if (!mask) return NULL;
    uint64_t seed;
    void *seed_on_device;
    int64_t first;
    umt_status st = umt_dropout_seed(ctx, x, "umt_dropout", &seed, &seed_on_device, &first);
    /* The mask follows x's storage order; the draw depends only on the element's index. */
    if (st == UMT_OK)
        st = umt_dtype_is_lowp(x->dtype)
                 ? umt_kernels(ctx)->lowp.dropout_forward(x->dtype, x->data, y->data, mask->data, x->numel, first, p, seed,
                                                      seed_on_device)
                 : umt_kernels(ctx)->f32.dropout_forward(x->data, y->data, mask->data, x->numel, first, p, seed,
                                                     seed_on_device);
    return umt_op_finish_with(ctx, st, "umt_dropout", dropout_backward, y, mask, x, NULL, NULL, 0, 0, p);
}
