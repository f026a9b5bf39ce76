/*
 * examples/mnist_cnn_minimal.c — PyTorch's classic MNIST example in one file to read in one sitting:
 * the network, the data, the training loop, the test; examples/mnist_cnn.c is the feature tour.
 * It runs on umt_default_device() (the GPU if there is one, else the CPU) in f32, op by op, with
 * the example's recipe: Adadelta lr 1.0, lr x0.7 after each epoch, batch 64, log-softmax + NLL.
 *   tools/fetch_mnist.sh data/mnist && bazel build //examples:mnist_cnn_minimal
 *   bazel-bin/examples/mnist_cnn_minimal [--data-dir DIR] [--epochs N]     # data/mnist, 2 epochs
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "umtrain.h" /* defines: every umt_ name below; the library's one public header */

enum { BATCH = 64, TEST_BATCH = 1000, MAX_TRAIN = 60000 /* MNIST's training set */ };
static const float MEAN = 0.1307f, STD = 0.3081f; /* of MNIST's training pixels, scaled to [0, 1] */

/* Every call is checked: a failure prints the line and the library's message (naming the culprit). */
#define CHECK(call) do { if ((call) != UMT_OK) return fail(__LINE__); } while (0)
#define CHECK_PTR(ptr) do { if (!(ptr)) return fail(__LINE__); } while (0)
static int fail(int line) { fprintf(stderr, "mnist_cnn_minimal.c:%d: %s\n", line, umt_last_error()); return 1; }

/* ---- The model: layers hold their parameters, initialised as PyTorch's nn.Conv2d, nn.Linear ---- */
typedef struct { umt_layer *conv1, *conv2, *fc1, *fc2; } model;
/* images [N,1,28,28] -> log-probabilities [N,10]; an op given NULL returns NULL: callers check once. */
static umt_tensor *forward(umt_context *ctx, const model *m, umt_tensor *x) {
    x = umt_relu(ctx, umt_layer_forward(ctx, m->conv1, x));                 /* [N,32,26,26] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->conv2, x));                 /* [N,64,24,24] */
    x = umt_dropout(ctx, umt_max_pool2d(ctx, x, 2, 2), 0.25f);              /* [N,64,12,12] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->fc1, umt_flatten(ctx, x))); /* [N,128] */
    x = umt_layer_forward(ctx, m->fc2, umt_dropout(ctx, x, 0.5f));          /* [N,10] */
    return umt_log_softmax(ctx, x);
}

/* ---- Data: an IDX pair uploaded once into the dataset pool; batches are gathered from it ---- */
static umt_status load(umt_context *ctx, const char *dir, const char *split, umt_dataset **out) {
    char images[1024], labels[1024];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte", dir, split);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte", dir, split);
    return umt_dataset_load_idx(ctx, images, labels, 10, out);
}

/* ---- Training and test ---- */
static int train_epoch(umt_context *ctx, const model *m, umt_optimizer *opt, const umt_dataset *train, int epoch) {
    static int64_t order[MAX_TRAIN]; /* the sample indices, shuffled anew every epoch */
    int64_t n = umt_dataset_size(train), steps = (n + BATCH - 1) / BATCH;
    if (n > MAX_TRAIN) return fprintf(stderr, "mnist_cnn_minimal: more than %d training images\n", MAX_TRAIN), 1;
    CHECK(umt_permutation(ctx, n, order));
    for (int64_t step = 0; step < steps; ++step) {
        int64_t first = step * BATCH, count = n - first < BATCH ? n - first : BATCH;
        umt_tensor *images, *labels, *loss;
        CHECK(umt_step_begin(ctx)); /* frees the previous step's activations and clears the tape */
        CHECK(umt_zero_grad(ctx));  /* backward adds to the gradients */
        CHECK(umt_dataset_batch(ctx, train, order + first, count, MEAN, STD, &images, &labels));
        CHECK_PTR(loss = umt_nll_loss(ctx, forward(ctx, m, images), labels));
        CHECK(umt_backward(ctx, loss));
        CHECK(umt_optimizer_step(opt));
        if (step % 100 != 0 && step + 1 != steps) continue;
        float value; /* reading the loss waits for the device: only now and then */
        CHECK(umt_tensor_get_f32(loss, 0, &value));
        printf("epoch %d step %lld/%lld loss %.4f\n", epoch + 1, (long long)(step + 1), (long long)steps, value);
    }
    return 0;
}

/* Evaluation mode: dropout off, and nothing recorded on the tape, since nothing goes backward. */
static int test_epoch(umt_context *ctx, const model *m, const umt_dataset *test, int epoch) {
    int64_t n = umt_dataset_size(test), correct = 0, indices[TEST_BATCH];
    umt_set_training(ctx, false);
    umt_set_grad_enabled(ctx, false);
    for (int64_t first = 0; first < n; first += TEST_BATCH) {
        int64_t count = n - first < TEST_BATCH ? n - first : TEST_BATCH, right = 0;
        umt_tensor *images, *labels, *scores;
        for (int64_t i = 0; i < count; ++i) indices[i] = first + i;
        CHECK(umt_step_begin(ctx));
        CHECK(umt_dataset_batch(ctx, test, indices, count, MEAN, STD, &images, &labels));
        CHECK_PTR(scores = forward(ctx, m, images));
        CHECK(umt_count_correct(ctx, scores, labels, &right));
        correct += right;
    }
    umt_set_training(ctx, true);
    umt_set_grad_enabled(ctx, true);
    printf("epoch %d test accuracy %.2f%%\n", epoch + 1, 100.0 * (double)correct / (double)n);
    return 0;
}

static int run(umt_context *ctx, const char *dir, int epochs) {
    umt_dataset *train, *test; umt_optimizer *opt; /* owned by the context, as the layers are */
    CHECK(load(ctx, dir, "train", &train));
    CHECK(load(ctx, dir, "t10k", &test));
    model m = {umt_conv2d_layer_new(ctx, "conv1", 1, 32, 3, 1, 0, true),
               umt_conv2d_layer_new(ctx, "conv2", 32, 64, 3, 1, 0, true),
               umt_linear_layer_new(ctx, "fc1", 9216, 128, true), umt_linear_layer_new(ctx, "fc2", 128, 10, true)};
    CHECK_PTR(m.conv1 && m.conv2 && m.fc1 && m.fc2);
    umt_optimizer_options options = umt_optimizer_defaults(UMT_OPT_ADADELTA); /* lr 1.0, rho 0.9, eps 1e-6 */
    CHECK(umt_optimizer_create(ctx, &options, &opt)); /* after the model: it covers the parameters made so far */
    for (int epoch = 0; epoch < epochs; ++epoch) {
        umt_optimizer_set_lr(opt, umt_lr_step(1.0f, 0.7f, 1, epoch)); /* 1.0 x 0.7^epoch, as StepLR */
        if (train_epoch(ctx, &m, opt, train, epoch) || test_epoch(ctx, &m, test, epoch)) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = "data/mnist", *usage = "usage: mnist_cnn_minimal [--data-dir DIR] [--epochs N]\n";
    long epochs = 2;
    bool help = argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")), ok = argc % 2 == 1 && !help;
    for (int i = 1; ok && i < argc; i += 2) { /* ok: every flag has its value */
        char *end = NULL;
        if (!strcmp(argv[i], "--data-dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--epochs")) epochs = strtol(argv[i + 1], &end, 10), ok = !*end && epochs > 0;
        else ok = false;
    }
    if (help || !ok || epochs > 1000) return fprintf(help ? stdout : stderr, "%s", usage), help ? 0 : 2;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it is printed, even into a pipe */
    umt_context *ctx = NULL;          /* the defaults: umt_default_device(), seed 1, f32 */
    int rc = umt_context_create(NULL, &ctx) != UMT_OK ? fail(__LINE__) : run(ctx, dir, (int)epochs);
    umt_context_destroy(ctx);
    return rc;
}
