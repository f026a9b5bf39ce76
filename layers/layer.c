/* layers/layer.c — allocating layers and dispatching their forward. */
#include "layers/layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"

static void destroy_layer(void *object) {
    umt_layer *layer = object;
    umt_tensor_free(layer->weight);
    umt_tensor_free(layer->bias);
    umt_tensor_free(layer->running_mean);
    umt_tensor_free(layer->running_var);
    free(layer);
}

const char *umt_layer_tensor_name(char *buf, size_t size, const char *layer, const char *what) {
    snprintf(buf, size, "%s.%s", layer, what);
    return buf;
}

umt_status umt_layer_init_fan_in(umt_context *ctx, umt_layer *layer, int64_t fan_in) {
    float bound = 1.0f / sqrtf((float)fan_in);
    UMT_TRY(umt_tensor_uniform(ctx, layer->weight, -bound, bound));
    return layer->bias ? umt_tensor_uniform(ctx, layer->bias, -bound, bound) : UMT_OK;
}

umt_layer *umt_layer_alloc(umt_context *ctx, const char *kind, umt_layer_forward_fn forward) {
    umt_layer *layer = calloc(1, sizeof *layer);
    if (!layer || umt_context_own(ctx, layer, destroy_layer) != UMT_OK) {
        free(layer);
        umt_fail(UMT_ERR_OUT_OF_MEMORY, "no memory for a %s layer", kind);
        return NULL;
    }
    *layer = (umt_layer){.kind = kind, .forward = forward, .ctx = ctx};
    return layer;
}

/* Before a layer runs: ctx and layer given, and layer, and x when given, of ctx. A NULL x is an
 * earlier failure whose message stands: the op the layer calls returns NULL for it. */
static bool layer_call_ok(const char *function, const umt_context *ctx, const umt_layer *layer, const umt_tensor *x) {
    if (!ctx || !layer) return umt_fail_null(function, ctx ? "layer" : "ctx"), false;
    if (umt_check_owner(ctx, function, "layer", layer->ctx) != UMT_OK) return false;
    return !x || umt_check_owner(ctx, function, "x", x->ctx) == UMT_OK;
}

umt_tensor *umt_layer_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    if (!layer_call_ok("umt_layer_forward", ctx, layer, x)) return NULL;
    return layer->forward(ctx, layer, x);
}

umt_tensor *umt_layer_forward_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    if (!layer_call_ok("umt_layer_forward_relu", ctx, layer, x)) return NULL;
    if (layer->forward_relu) return layer->forward_relu(ctx, layer, x);
    return umt_relu(ctx, layer->forward(ctx, layer, x));
}

umt_tensor *umt_layer_forward_flatten_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    if (!layer_call_ok("umt_layer_forward_flatten_relu", ctx, layer, x)) return NULL;
    if (layer->flatten_relu) return layer->flatten_relu(ctx, layer, x);
    return umt_layer_forward_relu(ctx, layer, umt_flatten(ctx, x));
}

umt_tensor *umt_layer_forward_flatten_relu_dropout(umt_context *ctx, umt_layer *layer, umt_tensor *x, float p) {
    if (!layer_call_ok("umt_layer_forward_flatten_relu_dropout", ctx, layer, x)) return NULL;
    if (layer->flatten_relu_dropout) return layer->flatten_relu_dropout(ctx, layer, x, p);
    return umt_dropout(ctx, umt_layer_forward_flatten_relu(ctx, layer, x), p);
}

umt_tensor *umt_layer_forward_relu_max_pool2d_dropout(umt_context *ctx, umt_layer *layer, umt_tensor *x,
                                                      int64_t window, int64_t stride, float p) {
    if (!layer_call_ok("umt_layer_forward_relu_max_pool2d_dropout", ctx, layer, x)) return NULL;
    /* The bias and ReLU then ride on the pool (core/ops/pool.c), which needs windows apart. */
    if (layer->product && layer->bias && umt_bias_relu_max_pool2d_dropout_supports(window, stride))
        return umt_bias_relu_max_pool2d_dropout(ctx, layer->product(ctx, layer, x), layer->bias, window, stride, p);
    return umt_max_pool2d_dropout(ctx, umt_layer_forward_relu(ctx, layer, x), window, stride, p);
}

umt_tensor *umt_layer_softmax_cross_entropy(umt_context *ctx, umt_layer *layer, umt_tensor *x, umt_tensor *labels) {
    if (!layer_call_ok("umt_layer_softmax_cross_entropy", ctx, layer, x)) return NULL;
    if (labels && umt_check_owner(ctx, "umt_layer_softmax_cross_entropy", "labels", labels->ctx) != UMT_OK)
        return NULL;
    if (layer->softmax_cross_entropy) return layer->softmax_cross_entropy(ctx, layer, x, labels);
    return umt_softmax_cross_entropy(ctx, layer->forward(ctx, layer, x), labels);
}
