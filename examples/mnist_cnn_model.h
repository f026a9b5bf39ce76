/*
 * examples/mnist_cnn_model.h — the network of PyTorch's classic MNIST example, shared by the
 * trainer (mnist_cnn.c) and the image classifier (predict.c):
 *
 *   conv 1->32 3x3, relu, conv 32->64 3x3, relu, max-pool 2, dropout 0.25, flatten,
 *   linear 9216->128, relu, dropout 0.5, linear 128->10, log-softmax
 *
 * With fuse (the default) conv1 and fc1 run with their ReLU as one op (umt_conv2d_relu,
 * umt_linear_relu); conv2 is its product alone, then its bias, ReLU, max pool and dropout one op
 * over the pooled quarter (umt_layer_forward_relu_max_pool2d_dropout); the training loss is
 * umt_softmax_cross_entropy, log-softmax and NLL in one op. Without it every op runs on its own.
 * Both compute the same function, with the same dropout draws.
 */
#ifndef UMT_EXAMPLE_MNIST_CNN_MODEL_H
#define UMT_EXAMPLE_MNIST_CNN_MODEL_H

#include "umtrain.h"

typedef struct {
    umt_layer *conv1, *conv2, *fc1, *fc2;
    bool fuse; /* fused ops (see above); mnist_cnn_build sets it */
} mnist_cnn;

/* The layers, initialised as PyTorch does, with parameters conv1.weight ... fc2.bias; fuse on. */
int mnist_cnn_build(umt_context *ctx, mnist_cnn *model);
/* The same with fc1 of `hidden` units instead of 128 (a sweep's width). */
int mnist_cnn_build_width(umt_context *ctx, mnist_cnn *model, int64_t hidden);
/* images f32 [N,1,28,28] (normalised) -> log-probabilities [N,10]. */
umt_tensor *mnist_cnn_forward(umt_context *ctx, const void *model, umt_tensor *images);
/* The training loss: mean NLL of the log-probabilities for labels (i32 [N]). */
umt_tensor *mnist_cnn_loss(umt_context *ctx, const mnist_cnn *model, umt_tensor *images, umt_tensor *labels);

#endif /* UMT_EXAMPLE_MNIST_CNN_MODEL_H */
