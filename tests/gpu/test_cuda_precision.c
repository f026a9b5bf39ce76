/*
 * tests/gpu/test_cuda_precision.c — mixed precision end to end: the MNIST CNN trained on one
 * fixed batch for a few steps under fp32, bf16 and fp16 (fp16 with dynamic loss scaling), from
 * the same seed. The half-precision runs must follow the fp32 run's losses closely, stay finite,
 * and hold a smaller activation peak; scores straight from a half-precision layer are counted.
 * fp32 with umt_context_options.tf32 follows fp32 within TF32's rounding, and not bit for bit.
 * (The CPU's refusal of half precision: tests/test_precision.c.)
 *
 * Dropout is switched off (evaluation mode), because under bf16/fp16 it draws per element of the
 * NHWC storage, so it drops other elements than under fp32. Needs a GPU (tag "gpu"):
 *     bazel test --config=cuda //tests/gpu:test_cuda_precision
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "examples/mnist_cnn_model.h"
#include "tests/gpu/cuda_test_context.h"
#include "umtrain.h"

enum { BATCH = 64, PIXELS = 28 * 28, STEPS = 12 };

#define EXPECT_OK(call)                                                                                            \
    do {                                                                                                           \
        if ((call) != UMT_OK) fail_msg("%s failed: %s", #call, umt_last_error());                                  \
    } while (0)

typedef struct {
    float losses[STEPS];
    size_t activation_peak;
} run_result;

/* The same batch for every run: images from a fixed xorshift stream, labels 0..9 in turn. */
static void make_batch(float *images, int32_t *labels) {
    uint32_t state = 12345u;
    for (int i = 0; i < BATCH * PIXELS; ++i) {
        state ^= state << 13, state ^= state >> 17, state ^= state << 5;
        images[i] = (float)(state >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    for (int i = 0; i < BATCH; ++i) labels[i] = i % 10;
}

/* tf32: fp32 convolutions on TF32 tensor cores (umt_context_options.tf32). */
static void train_with(umt_precision precision, bool tf32, run_result *out) {
    static float images[BATCH * PIXELS];
    static int32_t labels[BATCH];
    make_batch(images, labels);
    umt_context_options co = umt_context_defaults();
    co.seed = 7;
    co.precision = precision;
    co.tf32 = tf32;
    umt_context *ctx = cuda_test_context_with(co);
    mnist_cnn model;
    if (mnist_cnn_build(ctx, &model)) fail_msg("mnist_cnn_build: %s", umt_last_error());
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.lr = 0.02f;
    oo.momentum = 0.9f;
    oo.loss_scaling = precision == UMT_PRECISION_FP16;
    umt_optimizer *opt = NULL;
    EXPECT_OK(umt_optimizer_create(ctx, &oo, &opt));
    umt_set_training(ctx, false);
    for (int step = 0; step < STEPS; ++step) {
        EXPECT_OK(umt_step_begin(ctx));
        EXPECT_OK(umt_zero_grad(ctx));
        umt_tensor *x = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, BATCH, 1, 28, 28);
        umt_tensor *y = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, BATCH);
        if (!x || !y) fail_msg("batch: %s", umt_last_error());
        EXPECT_OK(umt_tensor_copy_from_host(x, images, sizeof images));
        EXPECT_OK(umt_tensor_copy_from_host(y, labels, sizeof labels));
        umt_tensor *loss = umt_nll_loss(ctx, mnist_cnn_forward(ctx, &model, x), y);
        if (!loss) fail_msg("forward under %s: %s", umt_precision_name(precision), umt_last_error());
        EXPECT_OK(umt_backward_scaled(ctx, loss, opt));
        EXPECT_OK(umt_optimizer_step(opt));
        EXPECT_OK(umt_tensor_get_f32(loss, 0, &out->losses[step]));
    }
    umt_pool_stats stats;
    EXPECT_OK(umt_pool_stats_get(ctx, UMT_POOL_ACTIVATIONS, &stats));
    out->activation_peak = stats.peak_bytes;
    printf("%s%s: losses", umt_precision_name(precision), tf32 ? " with tf32" : "");
    for (int step = 0; step < STEPS; ++step) printf(" %.5f", out->losses[step]);
    printf("; activation peak %zu bytes; skipped steps %lld\n", out->activation_peak,
           (long long)umt_optimizer_skipped_steps(opt));
    umt_context_destroy(ctx);
}

static void train(umt_precision precision, run_result *out) { train_with(precision, false, out); }

/* Each half-precision loss within `tolerance` (relative) of fp32's, every one finite. */
static void expect_close(const run_result *half, const run_result *full, double tolerance, const char *name) {
    for (int step = 0; step < STEPS; ++step) {
        double a = half->losses[step], b = full->losses[step];
        if (!isfinite(a)) fail_msg("%s: loss %g at step %d is not finite", name, a, step);
        if (fabs(a - b) > tolerance * fabs(b))
            fail_msg("%s: loss %.6f at step %d, fp32 %.6f: relative difference %.2e > %.0e", name, a, step, b,
                     fabs(a - b) / fabs(b), tolerance);
    }
}

static void test_half_precisions_follow_fp32(void **state) {
    (void)state;
    run_result fp32, bf16, fp16;
    train(UMT_PRECISION_FP32, &fp32);
    train(UMT_PRECISION_BF16, &bf16);
    train(UMT_PRECISION_FP16, &fp16);
    /* The runs learn (the batch is being memorised: the loss drops by several percent in 12
     * steps), so a match is not two flat lines; the half runs stay within a fraction of that drop
     * of fp32. */
    assert_true(fp32.losses[STEPS - 1] < 0.97f * fp32.losses[0]);
    expect_close(&bf16, &fp32, 5e-3, "bf16");
    expect_close(&fp16, &fp32, 5e-3, "fp16");
    /* Activations (the conv outputs dominate) are stored in two bytes instead of four. */
    if (!(bf16.activation_peak < 0.65 * fp32.activation_peak))
        fail_msg("bf16 activation peak %zu, fp32 %zu: expected well under the fp32 peak", bf16.activation_peak,
                 fp32.activation_peak);
}

/* fp32 with tf32 on: the convolutions take TF32 tensor cores, so the losses leave fp32's last bits
 * (the option does something) but stay within TF32's rounding of them. */
static void test_tf32_convolutions_follow_fp32_within_tf32_rounding(void **state) {
    (void)state;
    run_result fp32, tf32;
    train(UMT_PRECISION_FP32, &fp32);
    train_with(UMT_PRECISION_FP32, true, &tf32);
    expect_close(&tf32, &fp32, 5e-3, "tf32");
    assert_true(memcmp(fp32.losses, tf32.losses, sizeof fp32.losses) != 0);
}

/* Scores straight from a bf16/fp16 linear layer (the MLP's case: no log-softmax before the
 * argmax) are counted like f32 ones: the same layer from the same seed agrees with fp32 up to
 * the few samples whose two best scores round together. */
static int64_t count_with_linear_scores(umt_precision precision) {
    static float images[BATCH * PIXELS];
    static int32_t labels[BATCH];
    make_batch(images, labels);
    umt_context *ctx = cuda_test_context(11, precision);
    umt_layer *fc = umt_linear_layer_new(ctx, "fc", PIXELS, 10, true);
    EXPECT_OK(umt_step_begin(ctx));
    umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, BATCH, PIXELS);
    umt_tensor *y = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, BATCH);
    if (!fc || !x || !y) fail_msg("setup: %s", umt_last_error());
    EXPECT_OK(umt_tensor_copy_from_host(x, images, sizeof images));
    EXPECT_OK(umt_tensor_copy_from_host(y, labels, sizeof labels));
    umt_set_grad_enabled(ctx, false);
    umt_tensor *scores = umt_layer_forward(ctx, fc, x);
    if (!scores) fail_msg("forward: %s", umt_last_error());
    int64_t correct = -1;
    EXPECT_OK(umt_count_correct(ctx, scores, y, &correct));
    umt_context_destroy(ctx);
    return correct;
}

static void test_count_correct_takes_half_scores(void **state) {
    (void)state;
    int64_t full = count_with_linear_scores(UMT_PRECISION_FP32);
    for (umt_precision p = UMT_PRECISION_BF16; p <= UMT_PRECISION_FP16; ++p) {
        int64_t half = count_with_linear_scores(p);
        printf("%s: %lld of %d right, fp32 %lld\n", umt_precision_name(p), (long long)half, BATCH, (long long)full);
        assert_in_range(half, full > 3 ? full - 3 : 0, full + 3);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_precisions_follow_fp32),
        cmocka_unit_test(test_count_correct_takes_half_scores),
        cmocka_unit_test(test_tf32_convolutions_follow_fp32_within_tf32_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
