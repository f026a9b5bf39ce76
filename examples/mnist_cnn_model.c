/* examples/mnist_cnn_model.c — the MNIST CNN (see the header for the architecture). */
#include "examples/mnist_cnn_model.h"

int mnist_cnn_build(umt_context *ctx, mnist_cnn *m) { return mnist_cnn_build_width(ctx, m, 128); }

int mnist_cnn_build_width(umt_context *ctx, mnist_cnn *m, int64_t hidden) {
    m->fuse = true;
    m->conv1 = umt_conv2d_layer_new(ctx, "conv1", 1, 32, 3, 1, 0, true);
    m->conv2 = m->conv1 ? umt_conv2d_layer_new(ctx, "conv2", 32, 64, 3, 1, 0, true) : NULL;
    m->fc1 = m->conv2 ? umt_linear_layer_new(ctx, "fc1", 9216, hidden, true) : NULL;
    m->fc2 = m->fc1 ? umt_linear_layer_new(ctx, "fc2", hidden, 10, true) : NULL;
    return m->fc2 ? 0 : -1;
}

/* relu(layer(x)): one fused op, or the layer's op and a ReLU. */
static umt_tensor *layer_relu(umt_context *ctx, const mnist_cnn *m, umt_layer *layer, umt_tensor *x) {
    return m->fuse ? umt_layer_forward_relu(ctx, layer, x) : umt_relu(ctx, umt_layer_forward(ctx, layer, x));
}

/* What fc2 reads: fc1's dropped-out activations, [N,128] (the width). */
static umt_tensor *features(umt_context *ctx, const mnist_cnn *m, umt_tensor *images) {
    umt_tensor *x = layer_relu(ctx, m, m->conv1, images); /* [N,32,26,26] */
    /* conv2 [N,64,24,24], its ReLU, the pool and the dropout [N,64,12,12]; fused, the bias and
     * the ReLU are applied inside the pool, so only the pooled quarter is written. */
    x = m->fuse ? umt_layer_forward_relu_max_pool2d_dropout(ctx, m->conv2, x, 2, 2, 0.25f)
                : umt_dropout(ctx, umt_max_pool2d(ctx, layer_relu(ctx, m, m->conv2, x), 2, 2), 0.25f);
    /* fc1 on the flattened features, its ReLU and the dropout [N,128] (the width); fused, one op
     * whose bias pass draws the dropout, and an NHWC x (bf16/fp16) read as it lies. */
    return m->fuse ? umt_layer_forward_flatten_relu_dropout(ctx, m->fc1, x, 0.5f)
                   : umt_dropout(ctx, layer_relu(ctx, m, m->fc1, umt_flatten(ctx, x)), 0.5f);
}

/* The scores before the log-softmax, [N,10]. */
static umt_tensor *logits(umt_context *ctx, const mnist_cnn *m, umt_tensor *images) {
    return umt_layer_forward(ctx, m->fc2, features(ctx, m, images));
}

umt_tensor *mnist_cnn_forward(umt_context *ctx, const void *model, umt_tensor *images) {
    return umt_log_softmax(ctx, logits(ctx, model, images));
}

umt_tensor *mnist_cnn_loss(umt_context *ctx, const mnist_cnn *m, umt_tensor *images, umt_tensor *labels) {
    if (!m->fuse) return umt_nll_loss(ctx, mnist_cnn_forward(ctx, m, images), labels);
    /* The same loss, with fc2 in it: on a GPU under bf16/fp16 one kernel forward (the logits never
     * written) and two backward (umt_linear_softmax_cross_entropy). */
    return umt_layer_softmax_cross_entropy(ctx, m->fc2, features(ctx, m, images), labels);
}
