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

struct umt_layer {
    const char *kind;
    umt_layer_forward_fn forward;
    umt_context *ctx;
    umt_tensor *weight; /* NULL for layers without parameters */
    umt_tensor *bias;   /* NULL when the layer has none */
};

/* A layer of the given kind, owned by the context (freed with it). */
umt_layer *umt_layer_alloc(umt_context *ctx, const char *kind, umt_layer_forward_fn forward);

#endif /* UMT_LAYERS_LAYER_H */
