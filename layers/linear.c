/* layers/linear.c — the fully connected layer, initialised as PyTorch's nn.Linear. */
#include <math.h>
#include <stdio.h>

#include "core/error.h"
#include "layers/layer.h"

static umt_tensor *linear_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x) {
    return umt_linear(ctx, x, layer->weight, layer->bias);
}

/* PyTorch draws both weight and bias from U(-1/sqrt(in), 1/sqrt(in)): Kaiming-uniform with
 * a = sqrt(5) gives exactly that bound, sqrt(6 / ((1 + 5) * in)). */
static umt_status init_linear(umt_context *ctx, umt_layer *layer, int64_t in_features) {
    float bound = 1.0f / sqrtf((float)in_features);
    UMT_TRY(umt_tensor_uniform(ctx, layer->weight, -bound, bound));
    return layer->bias ? umt_tensor_uniform(ctx, layer->bias, -bound, bound) : UMT_OK;
}

umt_layer *umt_linear_layer_new(umt_context *ctx, const char *name, int64_t in_features, int64_t out_features,
                                bool bias) {
    if (!ctx || !name || in_features <= 0 || out_features <= 0) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_linear_layer_new: %s: in %lld, out %lld (expected > 0)",
                 name ? name : "(no name)", (long long)in_features, (long long)out_features);
        return NULL;
    }
    umt_layer *layer = umt_layer_alloc(ctx, "linear", linear_forward);
    if (!layer) return NULL;
    char param_name[256];
    snprintf(param_name, sizeof param_name, "%s.weight", name);
    layer->weight = umt_parameter_new(ctx, param_name, 2, (int64_t[]){out_features, in_features});
    if (!layer->weight) return NULL;
    if (bias) {
        snprintf(param_name, sizeof param_name, "%s.bias", name);
        layer->bias = umt_parameter_new(ctx, param_name, 1, (int64_t[]){out_features});
        if (!layer->bias) return NULL;
    }
    return init_linear(ctx, layer, in_features) == UMT_OK ? layer : NULL;
}
