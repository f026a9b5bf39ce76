/* examples/mnist_cnn_model.c — the MNIST CNN (see the header for the architecture). */
#include "examples/mnist_cnn_model.h"

int mnist_cnn_build(umt_context *ctx, mnist_cnn *m) {
    m->conv1 = umt_conv2d_layer_new(ctx, "conv1", 1, 32, 3, 1, 0, true);
    m->conv2 = m->conv1 ? umt_conv2d_layer_new(ctx, "conv2", 32, 64, 3, 1, 0, true) : NULL;
    m->fc1 = m->conv2 ? umt_linear_layer_new(ctx, "fc1", 9216, 128, true) : NULL;
    m->fc2 = m->fc1 ? umt_linear_layer_new(ctx, "fc2", 128, 10, true) : NULL;
    return m->fc2 ? 0 : -1;
}

umt_tensor *mnist_cnn_forward(umt_context *ctx, const void *model, umt_tensor *images) {
    const mnist_cnn *m = model;
    umt_tensor *x = umt_relu(ctx, umt_layer_forward(ctx, m->conv1, images));  /* [N,32,26,26] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->conv2, x));                   /* [N,64,24,24] */
    x = umt_dropout(ctx, umt_max_pool2d(ctx, x, 2, 2), 0.25f);                /* [N,64,12,12] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->fc1, umt_flatten(ctx, x)));   /* [N,128] */
    x = umt_layer_forward(ctx, m->fc2, umt_dropout(ctx, x, 0.5f));            /* [N,10] */
    return umt_log_softmax(ctx, x);
}
