/* layers/linear.c — the fully connected layer, initialised as PyTorch's nn.Linear. */
#include "core/base/error.h"
#include "layers/layer.h"

static umt_tensor *linear_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_linear(ctx, x, layer->weight, layer->bias);
}

static umt_tensor *linear_forward_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_linear_relu(ctx, x, layer->weight, layer->bias);
}

static umt_tensor *linear_flatten_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_flatten_linear_relu(ctx, x, layer->weight, layer->bias);
}

static umt_tensor *linear_flatten_relu_dropout(umt_context *ctx, umt_layer *layer, umt_tensor *x, float p) {
    return umt_flatten_linear_relu_dropout(ctx, x, layer->weight, layer->bias, p);
}

static umt_tensor *linear_softmax_cross_entropy(umt_context *ctx, umt_layer *layer, umt_tensor *x,
                                                umt_tensor *labels) {
    return umt_linear_softmax_cross_entropy(ctx, x, layer->weight, layer->bias, labels);
}

umt_layer *umt_linear_layer_new(umt_context *ctx, const char *name, int64_t in_features, int64_t out_features,
                                bool bias) {
    if (!ctx || !name) return umt_fail_null("umt_linear_layer_new", ctx ? "name" : "ctx"), NULL;
    if (in_features <= 0 || out_features <= 0) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_linear_layer_new: %s: in %lld, out %lld (expected > 0)", name,
                 (long long)in_features, (long long)out_features);
        return NULL;
    }
    umt_layer *layer = umt_layer_alloc(ctx, "linear", linear_forward);
    if (!layer) return NULL;
    layer->forward_relu = linear_forward_relu;
    layer->flatten_relu = linear_flatten_relu;
    layer->flatten_relu_dropout = linear_flatten_relu_dropout;
    layer->softmax_cross_entropy = linear_softmax_cross_entropy;
    char buf[256];
    layer->weight = umt_parameter_new(ctx, umt_layer_tensor_name(buf, sizeof buf, name, "weight"), 2,
                                      (int64_t[]){out_features, in_features});
    if (!layer->weight) return NULL;
    if (bias && !(layer->bias = umt_parameter_new(ctx, umt_layer_tensor_name(buf, sizeof buf, name, "bias"), 1,
                                                  (int64_t[]){out_features})))
        return NULL;
    return umt_layer_init_fan_in(ctx, layer, in_features) == UMT_OK ? layer : NULL;
}
