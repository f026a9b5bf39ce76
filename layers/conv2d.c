/* layers/conv2d.c — the 2-D convolution layer, initialised as PyTorch's nn.Conv2d. */
#include "core/base/error.h"
#include "layers/layer.h"

static umt_tensor *conv2d_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_conv2d(ctx, x, layer->weight, layer->bias, layer->stride, layer->padding);
}

static umt_tensor *conv2d_forward_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_conv2d_relu(ctx, x, layer->weight, layer->bias, layer->stride, layer->padding);
}

static umt_tensor *conv2d_product(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_conv2d(ctx, x, layer->weight, NULL, layer->stride, layer->padding);
}

umt_layer *umt_conv2d_layer_new(umt_context *ctx, const char *name, int64_t in_channels, int64_t out_channels,
                                int64_t kernel, int64_t stride, int64_t padding, bool bias) {
    if (!ctx || !name) return umt_fail_null("umt_conv2d_layer_new", ctx ? "name" : "ctx"), NULL;
    if (in_channels <= 0 || out_channels <= 0 || kernel <= 0 || stride <= 0 || padding < 0) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT,
                 "umt_conv2d_layer_new: %s: in %lld, out %lld, kernel %lld, stride %lld, padding %lld "
                 "(expected > 0, padding >= 0)",
                 name, (long long)in_channels, (long long)out_channels, (long long)kernel,
                 (long long)stride, (long long)padding);
        return NULL;
    }
    umt_layer *layer = umt_layer_alloc(ctx, "conv2d", conv2d_forward);
    if (!layer) return NULL;
    layer->forward_relu = conv2d_forward_relu;
    layer->product = conv2d_product;
    layer->stride = stride;
    layer->padding = padding;
    char buf[256];
    layer->weight = umt_parameter_new(ctx, umt_layer_tensor_name(buf, sizeof buf, name, "weight"), 4,
                                      (int64_t[]){out_channels, in_channels, kernel, kernel});
    if (!layer->weight) return NULL;
    if (bias && !(layer->bias = umt_parameter_new(ctx, umt_layer_tensor_name(buf, sizeof buf, name, "bias"), 1,
                                                  (int64_t[]){out_channels})))
        return NULL;
    return umt_layer_init_fan_in(ctx, layer, in_channels * kernel * kernel) == UMT_OK ? layer : NULL;
}
