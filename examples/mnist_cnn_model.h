/*
 * examples/mnist_cnn_model.h — the network of PyTorch's classic MNIST example, shared by the
 * trainer (mnist_cnn.c) and the image classifier (predict.c):
 *
 *   conv 1->32 3x3, relu, conv 32->64 3x3, relu, max-pool 2, dropout 0.25, flatten,
 *   linear 9216->128, relu, dropout 0.5, linear 128->10, log-softmax
 */
#ifndef UMT_EXAMPLE_MNIST_CNN_MODEL_H
#define UMT_EXAMPLE_MNIST_CNN_MODEL_H

#include "umtrain.h"

typedef struct {
    umt_layer *conv1, *conv2, *fc1, *fc2;
} mnist_cnn;

/* The layers, initialised as PyTorch does, with parameters conv1.weight ... fc2.bias. */
int mnist_cnn_build(umt_context *ctx, mnist_cnn *model);
/* images f32 [N,1,28,28] (normalised) -> log-probabilities [N,10]. */
umt_tensor *mnist_cnn_forward(umt_context *ctx, const void *model, umt_tensor *images);

#endif /* UMT_EXAMPLE_MNIST_CNN_MODEL_H */
