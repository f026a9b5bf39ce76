/*
 * layers/layer.h — what a layer is: its parameters and a forward that composes ops.
 *
 * A layer's backward is the tape's: every op its forward calls records its own. Adding a
 * layer kind means one file here with its constructor and forward.
 */
#ifndef UMT_LAYERS_LAYER_H
#define UMT_LAYERS_LAYER_H

#include "umtrain.h"

typedef umt_tensor *(*umt_layer_forward_fn)(umt_context *ctx, umt_layer *layer, umt_tensor *x);

/* One struct for every kind (as darknet does): each kind uses the fields it needs. */
struct umt_layer {
    const char *kind;
    umt_layer_forward_fn forward;
    umt_layer_forward_fn forward_relu; /* relu(forward) as one fused op; NULL: forward, then umt_relu */
    umt_layer_forward_fn product; /* forward without the bias (conv2d), which a later op adds; NULL: none */
    umt_layer_forward_fn flatten_relu; /* relu(forward(flatten(x))) as one op (linear); NULL: the three */
    /* dropout(relu(forward(flatten(x))), p) as one op (linear); NULL: flatten_relu, then umt_dropout */
    umt_tensor *(*flatten_relu_dropout)(umt_context *ctx, umt_layer *layer, umt_tensor *x, float p);
    /* softmax_cross_entropy(forward(x), labels) as one op (linear); NULL: forward, then the loss */
    umt_tensor *(*softmax_cross_entropy)(umt_context *ctx, umt_layer *layer, umt_tensor *x, umt_tensor *labels);
    umt_context *ctx;
    umt_tensor *weight; /* NULL for layers without parameters */
    umt_tensor *bias;   /* NULL when the layer has none */
    int64_t stride, padding;                /* conv2d */
    umt_tensor *running_mean, *running_var; /* batch norm buffers */
    float momentum, eps;                    /* batch norm */
};

/* A layer of the given kind, owned by the context (freed with it). */
umt_layer *umt_layer_alloc(umt_context *ctx, const char *kind, umt_layer_forward_fn forward);

/* "<layer>.<what>" into buf, for parameter and buffer names. */
const char *umt_layer_tensor_name(char *buf, size_t size, const char *layer, const char *what);

/* Weight and bias from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as PyTorch initialises linear and
 * convolution layers (Kaiming-uniform with a = sqrt(5) gives exactly that bound). */
umt_status umt_layer_init_fan_in(umt_context *ctx, umt_layer *layer, int64_t fan_in);

#endif /* UMT_LAYERS_LAYER_H */
