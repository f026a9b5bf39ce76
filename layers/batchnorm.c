/* layers/batchnorm.c — batch normalisation, as PyTorch's nn.BatchNorm2d (and 1d over [N,C]). */
#include "core/base/error.h"
#include "layers/layer.h"

static umt_tensor *batchnorm_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_batch_norm(ctx, x, layer->weight, layer->bias, layer->running_mean, layer->running_var,
                          layer->momentum, layer->eps);
}

/* A [channels] tensor made by make (parameter or buffer) and filled with value. */
static umt_tensor *per_channel(umt_context *ctx, umt_tensor *(*make)(umt_context *, const char *, int, const int64_t *),
                               const char *layer, const char *what, int64_t channels, float value) {
    char buf[256];
    umt_tensor *t = make(ctx, umt_layer_tensor_name(buf, sizeof buf, layer, what), 1, (int64_t[]){channels});
    return t && umt_tensor_fill(t, value) == UMT_OK ? t : NULL;
}

umt_layer *umt_batchnorm_layer_new(umt_context *ctx, const char *name, int64_t channels) {
    if (!ctx || !name) return umt_fail_null("umt_batchnorm_layer_new", ctx ? "name" : "ctx"), NULL;
    if (channels <= 0) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_batchnorm_layer_new: %s: %lld channels (expected > 0)", name,
                 (long long)channels);
        return NULL;
    }
    umt_layer *layer = umt_layer_alloc(ctx, "batchnorm", batchnorm_forward);
    if (!layer) return NULL;
    layer->momentum = 0.1f;
    layer->eps = 1e-5f;
    layer->weight = per_channel(ctx, umt_parameter_new, name, "weight", channels, 1.0f);
    layer->bias = layer->weight ? per_channel(ctx, umt_parameter_new, name, "bias", channels, 0.0f) : NULL;
    layer->running_mean = layer->bias ? per_channel(ctx, umt_buffer_new, name, "running_mean", channels, 0.0f) : NULL;
    layer->running_var = layer->running_mean ? per_channel(ctx, umt_buffer_new, name, "running_var", channels, 1.0f) : NULL;
    return layer->running_var ? layer : NULL;
}
