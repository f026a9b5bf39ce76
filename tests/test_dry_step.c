/*
 * tests/test_dry_step.c — dry steps and the memory plan made from them, on the CPU:
 *   - a plan made before the first step, and again between steps, changes nothing: the losses
 *     and the parameters of the training after it are those of the same training without it,
 *     bit for bit, for mnist_cnn's model and for an MLP, with dropout on;
 *   - it leaves every pool's statistics, the tape and the step count as they were, and no hook
 *     fires during it;
 *   - it predicts every pool's peak: exactly what two real steps then reach, and the arena's plan;
 *   - the largest tensor is measured, and an element limit sets the micro-batches;
 *   - a forward that begins a step of its own is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/context.h"
#include "examples/mnist_cnn_model.h"
#include "umtrain.h"

/* ----------------------------------------------------------------------------------------- */
/* Two models, each with a loss on inputs of a batch */

enum { MLP_IN = 32, MLP_HIDDEN = 64, CLASSES = 10 };

typedef struct {
    bool cnn;
    mnist_cnn cnn_model;
    umt_layer *fc1, *fc2;
} model;

static void build(umt_context *ctx, model *m, bool cnn) {
    m->cnn = cnn;
    if (cnn) {
        assert_int_equal(mnist_cnn_build(ctx, &m->cnn_model), 0);
        return;
    }
    m->fc1 = umt_linear_layer_new(ctx, "fc1", MLP_IN, MLP_HIDDEN, true);
    m->fc2 = umt_linear_layer_new(ctx, "fc2", MLP_HIDDEN, CLASSES, true);
    assert_non_null(m->fc1);
    assert_non_null(m->fc2);
}

static umt_tensor *model_loss(umt_context *ctx, const model *m, umt_tensor *x, umt_tensor *labels) {
    if (m->cnn) return mnist_cnn_loss(ctx, &m->cnn_model, x, labels);
    umt_tensor *h = umt_dropout(ctx, umt_layer_forward_relu(ctx, m->fc1, x), 0.5f);
    return umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, m->fc2, h), labels);
}

/* The inputs of a batch, in the order a real step makes them: images, then labels. */
static umt_tensor *new_inputs(umt_context *ctx, const model *m, int64_t batch, umt_tensor **labels) {
    umt_tensor *x = m->cnn ? umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, 1, 28, 28)
                           : umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, MLP_IN);
    *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch);
    return x;
}

/* The plan's forward: inputs that are never filled (a dry step backs no byte). */
static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    umt_tensor *labels = NULL;
    umt_tensor *x = new_inputs(ctx, user, batch, &labels);
    return labels ? model_loss(ctx, user, x, labels) : NULL;
}

enum { BATCH = 8, STEPS = 3 };

static umt_context *new_context(void) {
    umt_context *ctx = NULL;
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    o.seed = 7;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    return ctx;
}

/* One real step on deterministic inputs of step `step`; returns the loss. */
static float real_step(umt_context *ctx, const model *m, umt_optimizer *opt, int step) {
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(ctx), UMT_OK);
    umt_tensor *labels = NULL;
    umt_tensor *x = new_inputs(ctx, m, BATCH, &labels);
    assert_non_null(labels);
    static float pixels[BATCH * 28 * 28];
    int32_t classes[BATCH];
    for (int64_t i = 0; i < umt_tensor_numel(x); ++i) pixels[i] = (float)((i * 31 + step * 17) % 97) / 97.0f - 0.5f;
    for (int i = 0; i < BATCH; ++i) classes[i] = (i * 3 + step) % CLASSES;
    assert_int_equal(umt_tensor_copy_from_host(x, pixels, (size_t)umt_tensor_numel(x) * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(labels, classes, sizeof classes), UMT_OK);
    umt_tensor *loss = model_loss(ctx, m, x, labels);
    assert_non_null(loss);
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    float value = 0;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    return value;
}

static umt_memory_plan make_plan(umt_context *ctx, model *m, int64_t batch) {
    umt_memory_plan_request rq = {.batch = batch};
    umt_memory_plan plan;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, m, &plan), UMT_OK);
    return plan;
}

/* Trains STEPS steps; with plans, one before the first step and one after the second. Fills the
 * losses and the parameters' bytes. */
static void train(bool cnn, bool with_plans, float losses[STEPS], float *parameters, size_t capacity) {
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, cnn);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    for (int s = 0; s < STEPS; ++s) {
        if (with_plans && (s == 0 || s == 2)) make_plan(ctx, &m, BATCH);
        losses[s] = real_step(ctx, &m, opt, s);
    }
    size_t at = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) {
        umt_tensor *p = umt_parameter_at(ctx, i);
        size_t bytes = (size_t)umt_tensor_numel(p) * sizeof(float);
        assert_true(at + bytes <= capacity * sizeof(float));
        assert_int_equal(umt_tensor_copy_to_host(p, (char *)parameters + at, bytes), UMT_OK);
        at += bytes;
    }
    umt_context_destroy(ctx);
}

static void check_training_unchanged(bool cnn) {
    enum { MOST = 1300000 };
    static float with[MOST], without[MOST];
    float losses_with[STEPS], losses_without[STEPS];
    memset(with, 0, sizeof with);
    memset(without, 0, sizeof without);
    train(cnn, false, losses_without, without, MOST);
    train(cnn, true, losses_with, with, MOST);
    assert_memory_equal(losses_with, losses_without, sizeof losses_with);
    assert_memory_equal(with, without, sizeof with);
}

static void test_a_plan_leaves_mlp_training_bit_for_bit(void **state) {
    (void)state;
    check_training_unchanged(false);
}

static void test_a_plan_leaves_mnist_cnn_training_bit_for_bit(void **state) {
    (void)state;
    check_training_unchanged(true);
}

/* ----------------------------------------------------------------------------------------- */
/* What a dry step leaves, and what it predicts */

static int hook_calls;
static void count_hook(umt_tensor *parameter, void *user) {
    (void)parameter, (void)user;
    hook_calls++;
}

static void test_a_plan_leaves_pools_tape_and_step_count_and_fires_no_hook(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    hook_calls = 0;
    umt_set_grad_ready_hook(ctx, count_hook, NULL);
    real_step(ctx, &m, opt, 0);
    assert_int_equal(hook_calls, 4);
    umt_pool_stats before[UMT_POOL_COUNT], after[UMT_POOL_COUNT];
    for (int p = 0; p < UMT_POOL_COUNT; ++p) assert_int_equal(umt_pool_stats_get(ctx, (umt_pool)p, &before[p]), UMT_OK);
    int64_t steps = ctx->steps_begun;
    int tape = ctx->tape.count;
    size_t device_bytes = ctx->memory.device_bytes;
    make_plan(ctx, &m, 4 * BATCH);
    for (int p = 0; p < UMT_POOL_COUNT; ++p) assert_int_equal(umt_pool_stats_get(ctx, (umt_pool)p, &after[p]), UMT_OK);
    assert_memory_equal(before, after, sizeof before);
    assert_int_equal(hook_calls, 4);
    assert_int_equal(ctx->steps_begun, steps);
    assert_int_equal(ctx->tape.count, tape);
    assert_int_equal(ctx->memory.device_bytes, device_bytes);
    assert_false(ctx->dry);
    assert_null(ctx->memory.dry);
    assert_ptr_equal(ctx->backend, umt_cpu_backend());
    umt_context_destroy(ctx);
}

static void test_a_plan_predicts_every_pools_peak_of_the_first_steps(void **state) {
    (void)state;
    for (int cnn = 0; cnn < 2; ++cnn) {
        umt_context *ctx = new_context();
        model m;
        build(ctx, &m, cnn);
        umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADADELTA);
        umt_optimizer *opt = NULL;
        assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
        umt_memory_plan plan = make_plan(ctx, &m, BATCH);
        assert_int_equal(plan.verdict, UMT_PLAN_FITS);
        assert_true(plan.fits);
        assert_int_equal(plan.micro_batches, 1);
        assert_int_equal(plan.budget_bytes, 0);
        assert_true(plan.peak_bytes[UMT_POOL_ACTIVATIONS] > 0);
        assert_true(plan.activations_planned_bytes > 0);
        assert_true(plan.activations_planned_bytes <= plan.peak_bytes[UMT_POOL_ACTIVATIONS]);
        real_step(ctx, &m, opt, 0);
        real_step(ctx, &m, opt, 1);
        for (int p = 0; p < UMT_POOL_COUNT; ++p) {
            umt_pool_stats s;
            assert_int_equal(umt_pool_stats_get(ctx, (umt_pool)p, &s), UMT_OK);
            assert_int_equal(plan.peak_bytes[p], s.peak_bytes);
            assert_string_equal(plan.place[p], "host");
            if (p == UMT_POOL_ACTIVATIONS) assert_int_equal(plan.activations_planned_bytes, s.planned_peak_bytes);
        }
        umt_context_destroy(ctx);
    }
}

static void test_the_largest_tensor_is_measured_and_an_element_limit_sets_k(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    umt_memory_plan_request rq = {.batch = 64};
    umt_memory_plan plan;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &plan), UMT_OK);
    assert_int_equal(plan.largest_elements, 64 * MLP_HIDDEN);
    rq.element_limit = 16 * MLP_HIDDEN;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &plan), UMT_OK);
    assert_int_equal(plan.verdict, UMT_PLAN_MICRO_BATCHES);
    assert_true(plan.fits);
    assert_int_equal(plan.micro_batches, 4);
    assert_int_equal(plan.micro_batch, 16);
    assert_int_equal(plan.largest_elements, 16 * MLP_HIDDEN);
    rq.micro_batches = 2;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &plan), UMT_OK);
    assert_int_equal(plan.verdict, UMT_PLAN_FORCED);
    assert_false(plan.fits);
    assert_int_equal(plan.micro_batch, 32);
    umt_context_destroy(ctx);
}

/* The batch sizes a plan's forward was called with, in order. */
typedef struct {
    model *m;
    int64_t sizes[64];
    int count;
} recording;

static umt_tensor *recording_forward(umt_context *ctx, void *user, int64_t batch) {
    recording *r = user;
    if (r->count < 64) r->sizes[r->count++] = batch;
    return plan_forward(ctx, r->m, batch);
}

/* A step of 10 as 3 micro-batches runs 4, 3 and 3 samples; the epoch's last step of 7 as 3, 2
 * and 2; evaluation takes micro-batches of 4: the plan's last measure passes each size (a
 * convolution's workspace follows the exact shape), the larger of the step's twice. */
static void test_the_plan_measures_every_micro_batch_size_an_epoch_runs(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    recording r = {.m = &m};
    umt_memory_plan_request rq = {.batch = 10, .micro_batches = 3, .last_batch = 7, .eval_batch = 5};
    umt_memory_plan plan;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, recording_forward, &r, &plan), UMT_OK);
    assert_int_equal(plan.micro_batch, 4);
    static const int64_t last_measure[] = {4, 4, 3, 3, 2, 4, 4};
    int n = (int)(sizeof last_measure / sizeof last_measure[0]);
    assert_true(r.count >= n);
    for (int i = 0; i < n; ++i) assert_int_equal(r.sizes[r.count - n + i], last_measure[i]);
    umt_context_destroy(ctx);
}

/* What the caller allocates after the plan is counted in its pool: a loader's ring in inputs, a
 * batch made once in the dataset pool (big_mlp's), both in the device peak. */
static void test_bytes_made_after_the_plan_are_counted_in_their_pools(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    umt_memory_plan_request rq = {.batch = 64};
    umt_memory_plan before, after;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &before), UMT_OK);
    rq.later_device_bytes = 1000;
    rq.later_dataset_bytes = 70000;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &after), UMT_OK);
    assert_int_equal(after.peak_bytes[UMT_POOL_INPUTS], before.peak_bytes[UMT_POOL_INPUTS] + 1000);
    assert_int_equal(after.peak_bytes[UMT_POOL_DATASET], before.peak_bytes[UMT_POOL_DATASET] + 70000);
    assert_int_equal(after.device_peak_bytes, before.device_peak_bytes + 71000);
    umt_context_destroy(ctx);
}

static umt_tensor *forward_beginning_a_step(umt_context *ctx, void *user, int64_t batch) {
    if (umt_step_begin(ctx) != UMT_OK) return NULL;
    return plan_forward(ctx, user, batch);
}

static void test_a_forward_that_begins_a_step_is_refused(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    umt_memory_plan_request rq = {.batch = 4};
    umt_memory_plan plan;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, forward_beginning_a_step, &m, &plan), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "umt_step_begin: called during a dry step"));
    assert_false(ctx->dry);
    rq.batch = 0;
    assert_int_equal(umt_memory_plan_make(ctx, &rq, plan_forward, &m, &plan), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "request.batch"));
    umt_context_destroy(ctx);
}

static void test_the_plan_prints_one_short_table(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    model m;
    build(ctx, &m, false);
    umt_memory_plan plan = make_plan(ctx, &m, BATCH);
    char text[4096] = {0};
    FILE *f = fmemopen(text, sizeof text - 1, "w");
    assert_non_null(f);
    umt_memory_plan_print(&plan, f);
    fclose(f);
    assert_non_null(strstr(text, "memory plan: batch 8 as 1 micro-batch of 8 (fits)"));
    assert_non_null(strstr(text, "activations  host"));
    assert_non_null(strstr(text, "weights      host"));
    assert_non_null(strstr(text, "no device budget"));
    assert_non_null(strstr(text, "why: the whole batch fits"));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_plan_leaves_mlp_training_bit_for_bit),
        cmocka_unit_test(test_a_plan_leaves_mnist_cnn_training_bit_for_bit),
        cmocka_unit_test(test_a_plan_leaves_pools_tape_and_step_count_and_fires_no_hook),
        cmocka_unit_test(test_a_plan_predicts_every_pools_peak_of_the_first_steps),
        cmocka_unit_test(test_the_largest_tensor_is_measured_and_an_element_limit_sets_k),
        cmocka_unit_test(test_the_plan_measures_every_micro_batch_size_an_epoch_runs),
        cmocka_unit_test(test_bytes_made_after_the_plan_are_counted_in_their_pools),
        cmocka_unit_test(test_a_forward_that_begins_a_step_is_refused),
        cmocka_unit_test(test_the_plan_prints_one_short_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
