/*
 * tests/test_train_smoke.c — end-to-end training on the CPU through the public API only.
 *
 * The test writes a small synthetic image dataset as IDX files (10 classes, each a random
 * 28x28 prototype plus heavy noise), loads it with the IDX reader, trains a 784-64-10 MLP
 * for a few epochs and requires the loss and test accuracy to beat fixed thresholds; then it
 * checks that the same seed gives the same parameters bit for bit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "umtrain.h"

#define SIDE 28
#define PIXELS (SIDE * SIDE)
#define CLASSES 10
#define TRAIN_N 2000
#define TEST_N 500

static char dir[64];

static uint32_t rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static void write_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* Writes <split>-images / <split>-labels IDX files of n noisy copies of the prototypes. */
static void write_split(const char *split, int n, const uint8_t *prototypes, uint64_t *seed) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s-images", dir, split);
    FILE *images = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/%s-labels", dir, split);
    FILE *labels = fopen(path, "wb");
    assert_non_null(images);
    assert_non_null(labels);
    write_be32(images, 0x803);
    write_be32(images, (uint32_t)n);
    write_be32(images, SIDE);
    write_be32(images, SIDE);
    write_be32(labels, 0x801);
    write_be32(labels, (uint32_t)n);
    for (int i = 0; i < n; ++i) {
        uint8_t label = (uint8_t)(rnd(seed) % CLASSES), pixels[PIXELS];
        for (int p = 0; p < PIXELS; ++p) {
            int v = prototypes[label * PIXELS + p] + (int)(rnd(seed) % 201) - 100;
            pixels[p] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        fwrite(pixels, 1, PIXELS, images);
        fwrite(&label, 1, 1, labels);
    }
    fclose(images);
    fclose(labels);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_smoke_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    uint64_t seed = 7;
    uint8_t *prototypes = malloc(CLASSES * PIXELS);
    for (int i = 0; i < CLASSES * PIXELS; ++i) prototypes[i] = (uint8_t)(rnd(&seed) % 256);
    write_split("train", TRAIN_N, prototypes, &seed);
    write_split("test", TEST_N, prototypes, &seed);
    free(prototypes);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    const char *names[] = {"train-images", "train-labels", "test-images", "test-labels"};
    char path[128];
    for (int i = 0; i < 4; ++i) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    return rmdir(dir);
}

static umt_dataset *load(umt_context *ctx, const char *split) {
    char images[128], labels[128];
    snprintf(images, sizeof images, "%s/%s-images", dir, split);
    snprintf(labels, sizeof labels, "%s/%s-labels", dir, split);
    umt_dataset *ds = NULL;
    if (umt_dataset_load_idx(ctx, images, labels, CLASSES, &ds) != UMT_OK) fail_msg("%s", umt_last_error());
    return ds;
}

typedef struct {
    double last_epoch_loss;
    double test_accuracy;
} result;

/* Trains 784-64-10 for 3 epochs of batch 50 with SGD; returns the final weights in fc1_out. */
static result train(uint64_t seed, float *fc1_out) {
    umt_context_options co = umt_context_defaults();
    co.seed = seed;
    umt_context *ctx;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_dataset *train_set = load(ctx, "train"), *test_set = load(ctx, "test");
    umt_layer *fc1 = umt_linear_layer_new(ctx, "fc1", PIXELS, 64, true);
    umt_layer *fc2 = umt_linear_layer_new(ctx, "fc2", 64, CLASSES, true);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.lr = 0.05f;
    oo.momentum = 0.9f;
    umt_optimizer *opt;
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    int64_t order[TRAIN_N];
    result r = {0, 0};
    for (int epoch = 0; epoch < 3; ++epoch) {
        assert_int_equal(umt_permutation(ctx, TRAIN_N, order), UMT_OK);
        r.last_epoch_loss = 0;
        for (int first = 0; first < TRAIN_N; first += 50) {
            umt_tensor *x, *y;
            umt_step_begin(ctx);
            umt_zero_grad(ctx);
            assert_int_equal(umt_dataset_batch(ctx, train_set, order + first, 50, 0.5f, 0.25f, &x, &y), UMT_OK);
            umt_tensor *h = umt_relu(ctx, umt_layer_forward(ctx, fc1, umt_flatten(ctx, x)));
            umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, fc2, h), y);
            assert_non_null(loss);
            assert_int_equal(umt_backward(ctx, loss), UMT_OK);
            assert_int_equal(umt_optimizer_step(opt), UMT_OK);
            float v;
            umt_tensor_get_f32(loss, 0, &v);
            r.last_epoch_loss += v / (TRAIN_N / 50);
        }
    }
    int64_t all[TEST_N], correct = 0;
    for (int i = 0; i < TEST_N; ++i) all[i] = i;
    umt_set_grad_enabled(ctx, false);
    umt_tensor *x, *y;
    umt_step_begin(ctx);
    assert_int_equal(umt_dataset_batch(ctx, test_set, all, TEST_N, 0.5f, 0.25f, &x, &y), UMT_OK);
    umt_tensor *logits = umt_layer_forward(ctx, fc2, umt_relu(ctx, umt_layer_forward(ctx, fc1, umt_flatten(ctx, x))));
    assert_int_equal(umt_count_correct(ctx, logits, y, &correct), UMT_OK);
    r.test_accuracy = (double)correct / TEST_N;
    assert_int_equal(umt_tensor_copy_to_host(umt_parameter_at(ctx, 0), fc1_out, 64 * PIXELS * sizeof(float)), UMT_OK);
    umt_context_destroy(ctx);
    return r;
}

static void test_mlp_learns_the_synthetic_classes(void **state) {
    (void)state;
    static float weights[64 * PIXELS];
    result r = train(1, weights);
    print_message("last epoch loss %.4f, test accuracy %.3f\n", r.last_epoch_loss, r.test_accuracy);
    assert_true(r.last_epoch_loss < 0.2);
    assert_true(r.test_accuracy > 0.95);
}

static void test_same_seed_gives_the_same_parameters_bit_for_bit(void **state) {
    (void)state;
    static float first[64 * PIXELS], second[64 * PIXELS], other[64 * PIXELS];
    train(3, first);
    train(3, second);
    train(4, other);
    assert_memory_equal(first, second, sizeof first);
    assert_memory_not_equal(first, other, sizeof first);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_learns_the_synthetic_classes),
        cmocka_unit_test(test_same_seed_gives_the_same_parameters_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
