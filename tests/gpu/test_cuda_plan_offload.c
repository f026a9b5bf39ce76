/*
 * tests/gpu/test_cuda_plan_offload.c — the memory plan turns the offload tier on by itself (issue 24,
 * "Defaults" and "A CNN whose parameters and activations both exceed the budget"), as the trainers
 * and an embedder use it: a model made without the tier whose state the budget refuses, or whose
 * plan says it needs the tier, is made again with it (the same seed), planned again there, and the
 * tier given the plan (umt_offload_adopt_plan); then it trains as the plan says, in bf16:
 *   - a wide CNN with a large fully connected layer, its parameters (weights, compute copies,
 *     gradients, Adam state) and its whole batch's activations each past a budget of a quarter of
 *     what it needs: the tier takes the state, the batch runs as micro-batches that fit what the
 *     tier leaves, and the losses are the in-memory run's within bf16's tolerance;
 *   - the plan made without the tier at a budget the state just fits names the tier, the pools and
 *     the sizes in its table;
 *   - a deep CNN on large images (the TALL shape below), little state and many saved activations
 *     per sample, at a budget where one sample's step does not fit even with the tier: the plan
 *     sends saved activations home too (the ladder's last stage), in micro-batches, and the losses
 *     are the in-memory run's within bf16's tolerance. Its depth is what lets the stage be reached:
 *     with activations away the plan counts a working set of the UMT_FIT_ACTIVATION_WORKING_SET
 *     largest (memory/fit.h), which must be well under all of one sample's.
 * The device never passes the budget: every allocation is checked against it (a refused one fails
 * the step, and the test), and the bytes held at the end are within it.
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
#include <cuda_runtime_api.h>

#include "core/base/error.h"
#include "tests/gpu/cuda_test_context.h"
#include "umtrain.h"

#define MIB ((size_t)1 << 20)
#define MAX_LAYERS 64

/* The two models: wide (768 channels at 28 x 28, a 37632 x 256 fully connected layer: about 52M
 * parameters, 0.94 GB of bf16 training state) and tall (49 convolutions of 64 channels at 256 x 256:
 * little state, a saved activation of 8 MiB per sample after each). */
typedef enum { WIDE, TALL } shape;

typedef struct {
    shape shape;
    int64_t chw[3], batch;
    int steps;
    umt_context *ctx;
    umt_layer *layers[MAX_LAYERS];
    int count;
    umt_optimizer *opt;
} net;

#define WIDE_CHANNELS 768
#define WIDE_CONVS 8
#define WIDE_HIDDEN 256
#define TALL_SIZE 256
#define TALL_CHANNELS 64
#define TALL_CONVS 48

static umt_context *alive;

static int destroy_leftover(void **state) {
    (void)state;
    umt_context_destroy(alive);
    alive = NULL;
    return 0;
}

static void destroy(net *n) {
    destroy_leftover(NULL);
    n->ctx = NULL;
}

static umt_tensor *loss_of(umt_context *ctx, const net *n, umt_tensor *images, umt_tensor *labels) {
    umt_tensor *h = umt_layer_forward_relu(ctx, n->layers[0], images);
    if (n->shape == WIDE) h = umt_max_pool2d(ctx, h, 2, 2); /* 14 x 14 */
    for (int l = 1; l < n->count - (n->shape == WIDE ? 2 : 1); ++l) h = umt_layer_forward_relu(ctx, n->layers[l], h);
    h = umt_max_pool2d(ctx, h, n->shape == WIDE ? 2 : 4, n->shape == WIDE ? 2 : 4);
    h = umt_flatten(ctx, h);
    if (n->shape == WIDE) h = umt_layer_forward_relu(ctx, n->layers[n->count - 2], h);
    return umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, n->layers[n->count - 1], h), labels);
}

static umt_status add(net *n, umt_layer *layer) {
    if (!layer) return umt_last_status();
    n->layers[n->count++] = layer;
    return UMT_OK;
}

/* The model and Adam in bf16, seed 11, under budget (NULL: none), with the tier first when
 * offload; the status of what the budget refused. */
static umt_status build(net *n, const char *budget, bool offload) {
    if (budget) setenv("UMT_DEVICE_BUDGET", budget, 1);
    n->ctx = alive = cuda_test_context(11, UMT_PRECISION_BF16);
    unsetenv("UMT_DEVICE_BUDGET");
    n->count = 0;
    if (offload) assert_int_equal(umt_offload_enable(n->ctx, NULL), UMT_OK);
    bool wide = n->shape == WIDE;
    int64_t channels = wide ? WIDE_CHANNELS : TALL_CHANNELS;
    UMT_TRY(add(n, umt_conv2d_layer_new(n->ctx, "stem", 1, channels, 3, 1, 1, true)));
    for (int l = 0; l < (wide ? WIDE_CONVS : TALL_CONVS); ++l) {
        char name[16];
        snprintf(name, sizeof name, "conv%d", l);
        UMT_TRY(add(n, umt_conv2d_layer_new(n->ctx, name, channels, channels, 3, 1, 1, true)));
    }
    int64_t features = wide ? WIDE_CHANNELS * 7 * 7 : TALL_CHANNELS * (TALL_SIZE / 4) * (TALL_SIZE / 4);
    if (wide) UMT_TRY(add(n, umt_linear_layer_new(n->ctx, "fc1", features, WIDE_HIDDEN, true)));
    UMT_TRY(add(n, umt_linear_layer_new(n->ctx, "fc", wide ? WIDE_HIDDEN : features, 10, true)));
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    oo.lr = 1e-4f; /* at Adam's 1e-3 the wide CNN's loss jumped from 2.3 to 57 in one step */
    return umt_optimizer_create(n->ctx, &oo, &n->opt);
}

/* ----------------------------------------------------------------------------------------- */
/* The plan and the steps */

static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    const net *n = user;
    umt_tensor *images = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, n->chw[0], n->chw[1], n->chw[2]);
    umt_tensor *labels = images ? umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch) : NULL;
    return labels ? loss_of(ctx, n, images, labels) : NULL;
}

/* The plan for the net's batch (micro_batches: 0, the plan chooses; else forced), printed. */
static umt_memory_plan plan(net *n, int64_t micro_batches) {
    umt_memory_plan_request rq = {.batch = n->batch, .micro_batches = micro_batches};
    umt_memory_plan p;
    assert_int_equal(umt_memory_plan_make(n->ctx, &rq, plan_forward, n, &p), UMT_OK);
    umt_memory_plan_print(&p, stdout);
    return p;
}

/* One step of the net's batch as k near-equal micro-batches, the larger first (the activation
 * arena is planned from the first); inputs from a fixed sequence that moves with the step. */
static float train_step(net *n, int64_t k, int step) {
    int64_t per = n->chw[0] * n->chw[1] * n->chw[2];
    float *x = malloc((size_t)(n->batch * per) * sizeof *x);
    int32_t *y = malloc((size_t)n->batch * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (int64_t i = 0; i < n->batch * per; ++i)
        x[i] = (float)(((i + step * 7919) * 2654435761u % 2001) / 1000.0 - 1.0);
    for (int64_t i = 0; i < n->batch; ++i) y[i] = (int32_t)((i * 37 + step) % 10);
    assert_int_equal(umt_step_begin(n->ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(n->ctx), UMT_OK);
    umt_tensor *loss = NULL;
    for (int64_t i = 0, first = 0; i < k; ++i) {
        int64_t samples = n->batch / k + (i < n->batch % k);
        if (k > 1) assert_int_equal(umt_micro_batch_begin(n->ctx, first, samples, n->batch), UMT_OK);
        umt_tensor *images = umt_tensor_new_4d(n->ctx, UMT_POOL_ACTIVATIONS, UMT_F32, samples, n->chw[0], n->chw[1],
                                               n->chw[2]);
        umt_tensor *labels = umt_tensor_new_1d(n->ctx, UMT_POOL_ACTIVATIONS, UMT_I32, samples);
        if (!images || !labels) fail_msg("step %d inputs: %s", step, umt_last_error());
        size_t bytes = (size_t)(samples * per) * sizeof *x;
        assert_int_equal(umt_tensor_copy_from_host(images, x + first * per, bytes), UMT_OK);
        assert_int_equal(umt_tensor_copy_from_host(labels, y + first, (size_t)samples * sizeof *y), UMT_OK);
        loss = loss_of(n->ctx, n, images, labels);
        if (!loss || umt_backward(n->ctx, loss) != UMT_OK) fail_msg("step %d: %s", step, umt_last_error());
        first += samples;
    }
    if (k > 1) loss = umt_micro_batch_loss(n->ctx);
    if (umt_optimizer_step(n->opt) != UMT_OK) fail_msg("step %d update: %s", step, umt_last_error());
    float value = 0;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    free(x);
    free(y);
    return value;
}

static void train(net *n, int64_t k, float *losses) {
    for (int s = 0; s < n->steps; ++s) losses[s] = train_step(n, k, s);
}

/* The same model in GPU memory, in the same k micro-batches: the reference. (Against the whole
 * batch, bf16's rounding of the split would be measured too, not the tier.) */
static void train_in_memory(net *n, int64_t k, float *losses) {
    assert_int_equal(build(n, NULL, false), UMT_OK);
    train(n, k, losses);
    destroy(n);
}

/* Micro-batched bf16 against the whole batch, and the tier's streaming: bf16's rounding, as the
 * wide CNN of test_cuda_offload_precision.c. */
#define TOLERANCE 2e-2

/* trains: the reference's loss falls too (the deep CNN's, on labels that change every step, need
 * not in three steps: there the equality is the test). */
static void expect_close(const float *got, const float *want, int steps, bool trains) {
    for (int s = 0; s < steps; ++s) {
        double rel = fabs((double)got[s] - want[s]) / fabs((double)want[s]);
        print_message("step %d: in memory %.7g, planned %.7g, relative %.2e\n", s + 1, want[s], got[s], rel);
        assert_true(rel <= TOLERANCE);
    }
    if (trains) assert_true(want[steps - 1] < want[0]);
}

/* The tier's run at budget, as the trainers make it (examples/example_common.c, example_plan):
 * made without the tier, the budget refuses the state or the plan asks for the tier; made again
 * with it, planned, the tier given the plan. Returns that plan. */
static umt_memory_plan made_again_with_the_tier(net *n, const char *budget) {
    umt_status built = build(n, budget, false);
    if (built == UMT_OK) {
        umt_memory_plan first = plan(n, 0);
        assert_true(first.offload.needed);
        assert_false(first.offload.enabled);
    } else {
        print_message("made without the tier at %s: %s\n", budget, umt_last_error());
        assert_int_equal(built, UMT_ERR_BUDGET);
    }
    destroy(n);
    assert_int_equal(build(n, budget, true), UMT_OK);
    umt_memory_plan p = plan(n, 0);
    assert_true(p.offload.enabled);
    assert_true(p.fits);
    assert_true(p.device_peak_bytes <= p.budget_bytes);
    assert_int_equal(umt_offload_adopt_plan(n->ctx, &p), UMT_OK);
    return p;
}

static void expect_within_budget(const net *n) {
    size_t budget = 0, used = 0;
    assert_int_equal(umt_device_budget(n->ctx, &budget, &used), UMT_OK);
    print_message("device %zu of a budget of %zu bytes\n", used, budget);
    assert_true(used <= budget);
}

static bool gpu_has(size_t bytes) {
    size_t free_bytes = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
    return free_bytes >= bytes;
}

/* ----------------------------------------------------------------------------------------- */
/* The tests */

static void test_a_wide_cnn_past_the_budget_in_state_and_activations_trains_with_the_tier_in_micro_batches(
    void **state) {
    (void)state;
    net n = {.shape = WIDE, .chw = {1, 28, 28}, .batch = 128, .steps = 5};
    assert_int_equal(build(&n, NULL, false), UMT_OK);
    umt_memory_plan whole = plan(&n, 0);
    destroy(&n);
    size_t need = whole.device_peak_bytes, state_bytes = whole.offload.state_bytes;
    if (!gpu_has(2 * need)) skip();
    char budget[32];
    snprintf(budget, sizeof budget, "%zuM", need / 4 / MIB);
    print_message("the wide CNN needs %zu MiB (state %zu MiB); a budget of %s\n", need / MIB, state_bytes / MIB,
                  budget);
    /* Both past it: the state alone, and the whole batch's step alone. */
    assert_true(state_bytes > need / 4);
    assert_true(need - state_bytes > need / 4);
    float reference[5], losses[5];
    umt_memory_plan p = made_again_with_the_tier(&n, budget);
    assert_int_equal(p.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_true(p.micro_batches > 1);
    assert_true(p.offload.pools[UMT_POOL_OPTIM]);
    assert_false(p.offload.activations);
    assert_true(p.offload.least_device_bytes < p.offload.state_bytes);
    train(&n, p.micro_batches, losses);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(n.ctx, &st), UMT_OK);
    print_message("%lld micro-batches of %lld; %d tensors (%zu MiB) in the tier\n", (long long)p.micro_batches,
                  (long long)p.micro_batch, st.offloaded_tensors, st.offloaded_bytes / MIB);
    assert_true(st.offloaded_tensors > 0);
    expect_within_budget(&n);
    destroy(&n);
    train_in_memory(&n, p.micro_batches, reference);
    expect_close(losses, reference, n.steps, true);
}

static void test_a_plan_made_without_the_tier_names_it_with_the_pools_and_sizes(void **state) {
    (void)state;
    net n = {.shape = WIDE, .chw = {1, 28, 28}, .batch = 128, .steps = 1};
    assert_int_equal(build(&n, NULL, false), UMT_OK);
    size_t budget_now = 0, built = 0;
    assert_int_equal(umt_device_budget(n.ctx, &budget_now, &built), UMT_OK);
    destroy(&n);
    /* The state fits (the compute copies come later), one sample's step beside it does not. */
    char budget[32];
    snprintf(budget, sizeof budget, "%zuM", built / MIB + 8);
    assert_int_equal(build(&n, budget, false), UMT_OK);
    umt_memory_plan p = plan(&n, 0);
    assert_int_equal(p.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_true(p.fits);
    assert_true(p.offload.needed);
    assert_false(p.offload.enabled);
    assert_true(p.offload.reserve_bytes > 0);
    assert_true(p.offload.host_bytes >= p.offload.state_bytes);
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    assert_non_null(f);
    umt_memory_plan_print(&p, f);
    fclose(f);
    assert_non_null(strstr(text, "offload tier: to pinned host memory: optim"));
    assert_non_null(strstr(text, "the tier is not on yet"));
    free(text);
    /* There is no tier to give the plan to. */
    assert_int_equal(umt_offload_adopt_plan(n.ctx, &p), UMT_ERR_STATE);
    destroy(&n);
}

/* The deep CNN in host memory's micro-batches: a budget where one sample's step fits only with its
 * saved activations away. Where that lies depends on the tier's least and the arena's working set,
 * so the budget is searched downward from one sample's whole step, in fifths of its activations. */
static void test_a_sample_past_what_is_left_sends_saved_activations_home_in_micro_batches(void **state) {
    (void)state;
    net n = {.shape = TALL, .chw = {1, TALL_SIZE, TALL_SIZE}, .batch = 4, .steps = 3};
    assert_int_equal(build(&n, NULL, true), UMT_OK);
    umt_memory_plan one = plan(&n, n.batch);
    destroy(&n);
    size_t activations = one.peak_bytes[UMT_POOL_ACTIVATIONS], peak = one.device_peak_bytes;
    print_message("one sample: %zu MiB on the device, %zu MiB of activations; the tier's least %zu MiB\n",
                  peak / MIB, activations / MIB, one.offload.least_device_bytes / MIB);
    if (!gpu_has(4 * peak)) skip();
    umt_memory_plan p = {0};
    char budget[32];
    for (int fifth = 1; fifth <= 4 && p.verdict != UMT_PLAN_OFFLOAD_ACTIVATIONS; ++fifth) {
        snprintf(budget, sizeof budget, "%zuM", (peak - (size_t)fifth * activations / 5) / MIB);
        assert_int_equal(build(&n, budget, true), UMT_OK);
        p = plan(&n, 0);
        print_message("at %s: %s\n", budget, umt_plan_verdict_name(p.verdict));
        if (p.verdict != UMT_PLAN_OFFLOAD_ACTIVATIONS) destroy(&n);
    }
    assert_int_equal(p.verdict, UMT_PLAN_OFFLOAD_ACTIVATIONS);
    assert_true(p.fits);
    assert_true(p.offload.activations);
    assert_true(p.offload.pools[UMT_POOL_ACTIVATIONS]);
    assert_true(p.device_peak_bytes <= p.budget_bytes);
    assert_int_equal(umt_offload_adopt_plan(n.ctx, &p), UMT_OK);
    float reference[3], losses[3];
    train(&n, p.micro_batches, losses);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(n.ctx, &st), UMT_OK);
    print_message("at %s: %lld micro-batches of %lld; %llu activations sent home\n", budget,
                  (long long)p.micro_batches, (long long)p.micro_batch, (unsigned long long)st.activations_offloaded);
    assert_true(st.activations_offloaded > 0);
    expect_within_budget(&n);
    destroy(&n);
    train_in_memory(&n, p.micro_batches, reference);
    expect_close(losses, reference, n.steps, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(
            test_a_wide_cnn_past_the_budget_in_state_and_activations_trains_with_the_tier_in_micro_batches,
            destroy_leftover),
        cmocka_unit_test_teardown(test_a_plan_made_without_the_tier_names_it_with_the_pools_and_sizes,
                                  destroy_leftover),
        cmocka_unit_test_teardown(test_a_sample_past_what_is_left_sends_saved_activations_home_in_micro_batches,
                                  destroy_leftover),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
