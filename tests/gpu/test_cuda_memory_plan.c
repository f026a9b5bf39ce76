/*
 * tests/gpu/test_cuda_memory_plan.c — the memory plan on a GPU (issue 24, "A memory plan before the
 * first step"), for mnist_cnn's model in the GPU's default precision:
 *   - each pool's predicted peak is what two real steps then reach (within 1%), and the plan
 *     changes nothing: training after it gives the same losses and parameters, bit for bit;
 *   - at UMT_DEVICE_BUDGET=1G, batch 32768 (refused in one piece before) gets micro-batches that
 *     fit, and a real step at the planned micro-batch runs within the budget;
 *   - batch 60000, which cuDNN refused (a tensor over INT_MAX elements), is split so that no tensor
 *     passes INT_MAX, and a real step at the planned micro-batch runs.
 * The trainers do not micro-batch yet: the real steps here run one micro-batch of the plan's size.
 */
#include <limits.h>
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

typedef struct {
    umt_context *ctx;
    mnist_cnn model;
    umt_optimizer *opt;
} run;

static void start(run *r, umt_precision precision, const char *budget) {
    if (budget) setenv("UMT_DEVICE_BUDGET", budget, 1);
    r->ctx = cuda_test_context(1, precision);
    unsetenv("UMT_DEVICE_BUDGET");
    assert_int_equal(mnist_cnn_build(r->ctx, &r->model), 0);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    assert_int_equal(umt_optimizer_create(r->ctx, &oo, &r->opt), UMT_OK);
}

/* Images then labels, as umt_dataset_batch makes them. */
static umt_tensor *new_inputs(umt_context *ctx, int64_t batch, umt_tensor **labels) {
    umt_tensor *images = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, 1, 28, 28);
    *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch);
    return images;
}

static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    umt_tensor *labels = NULL, *images = new_inputs(ctx, batch, &labels);
    return labels ? mnist_cnn_loss(ctx, user, images, labels) : NULL;
}

/* One real step of batch images (deterministic values); returns the loss. */
static float real_step(run *r, int64_t batch, int step) {
    assert_int_equal(umt_step_begin(r->ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(r->ctx), UMT_OK);
    umt_tensor *labels = NULL, *images = new_inputs(r->ctx, batch, &labels);
    assert_non_null(labels);
    size_t pixels = (size_t)batch * 28 * 28;
    float *x = malloc(pixels * sizeof *x);
    int32_t *y = malloc((size_t)batch * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (size_t i = 0; i < pixels; ++i) x[i] = (float)((i * 31 + (size_t)step * 17) % 97) / 97.0f - 0.5f;
    for (int64_t i = 0; i < batch; ++i) y[i] = (int32_t)((i * 3 + step) % 10);
    assert_int_equal(umt_tensor_copy_from_host(images, x, pixels * sizeof *x), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(labels, y, (size_t)batch * sizeof *y), UMT_OK);
    free(x);
    free(y);
    umt_tensor *loss = mnist_cnn_loss(r->ctx, &r->model, images, labels);
    assert_non_null(loss);
    assert_int_equal(umt_backward(r->ctx, loss), UMT_OK);
    assert_int_equal(umt_optimizer_step(r->opt), UMT_OK);
    float value = 0;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    return value;
}

static umt_memory_plan plan_for(run *r, int64_t batch) {
    umt_memory_plan_request rq = {.batch = batch};
    umt_memory_plan plan;
    assert_int_equal(umt_memory_plan_make(r->ctx, &rq, plan_forward, &r->model, &plan), UMT_OK);
    umt_memory_plan_print(&plan, stdout);
    return plan;
}

static void check_pools_against(const run *r, const umt_memory_plan *plan) {
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        umt_pool_stats s;
        assert_int_equal(umt_pool_stats_get(r->ctx, (umt_pool)p, &s), UMT_OK);
        double off = (double)plan->peak_bytes[p] - (double)s.peak_bytes;
        print_message("%-12s predicted %14zu reported %14zu\n", umt_pool_name((umt_pool)p), plan->peak_bytes[p],
                      s.peak_bytes);
        assert_true(off <= 0.01 * (double)s.peak_bytes && -off <= 0.01 * (double)s.peak_bytes);
    }
}

static void test_the_plan_predicts_two_real_steps_and_changes_nothing(void **state) {
    (void)state;
    umt_precision precision = umt_precision_default(UMT_DEVICE_CUDA, 0);
    float losses[2][3];
    float *parameters[2] = {NULL, NULL};
    size_t bytes = 0;
    for (int with_plan = 0; with_plan < 2; ++with_plan) {
        run r;
        start(&r, precision, NULL);
        umt_memory_plan plan = {0};
        if (with_plan) plan = plan_for(&r, 64);
        for (int s = 0; s < 3; ++s) losses[with_plan][s] = real_step(&r, 64, s);
        if (with_plan) {
            assert_int_equal(plan.micro_batches, 1);
            assert_true(plan.fits);
            check_pools_against(&r, &plan);
        }
        bytes = 0;
        for (int i = 0; i < umt_parameter_count(r.ctx); ++i)
            bytes += (size_t)umt_tensor_numel(umt_parameter_at(r.ctx, i));
        parameters[with_plan] = malloc(bytes * sizeof(float));
        assert_non_null(parameters[with_plan]);
        size_t at = 0;
        for (int i = 0; i < umt_parameter_count(r.ctx); ++i) {
            umt_tensor *p = umt_parameter_at(r.ctx, i);
            size_t n = (size_t)umt_tensor_numel(p);
            assert_int_equal(umt_tensor_copy_to_host(p, parameters[with_plan] + at, n * sizeof(float)), UMT_OK);
            at += n;
        }
        umt_context_destroy(r.ctx);
    }
    assert_memory_equal(losses[0], losses[1], sizeof losses[0]);
    assert_memory_equal(parameters[0], parameters[1], bytes * sizeof(float));
    free(parameters[0]);
    free(parameters[1]);
}

static void test_a_1g_budget_splits_batch_32768_into_micro_batches_that_fit(void **state) {
    (void)state;
    run r;
    start(&r, umt_precision_default(UMT_DEVICE_CUDA, 0), "1G");
    umt_memory_plan plan = plan_for(&r, 32768);
    assert_int_equal(plan.verdict, UMT_PLAN_MICRO_BATCHES);
    assert_true(plan.fits);
    assert_true(plan.micro_batches > 1);
    assert_true(plan.device_peak_bytes <= plan.budget_bytes);
    assert_true(plan.budget_bytes <= (size_t)1 << 30);
    /* The planned micro-batch trains within the budget (the whole batch was refused). */
    real_step(&r, plan.micro_batch, 0);
    real_step(&r, plan.micro_batch, 1);
    size_t budget = 0, used = 0;
    assert_int_equal(umt_device_budget(r.ctx, &budget, &used), UMT_OK);
    assert_true(used <= budget);
    umt_pool_stats a;
    assert_int_equal(umt_pool_stats_get(r.ctx, UMT_POOL_ACTIVATIONS, &a), UMT_OK);
    print_message("micro-batch %lld: activations peak %zu, planned %zu (predicted %zu)\n",
                  (long long)plan.micro_batch, a.peak_bytes, a.planned_peak_bytes,
                  plan.activations_planned_bytes);
    umt_context_destroy(r.ctx);
}

static void test_batch_60000_is_split_under_cudnns_element_limit(void **state) {
    (void)state;
    run r;
    start(&r, umt_precision_default(UMT_DEVICE_CUDA, 0), NULL);
    umt_memory_plan plan = plan_for(&r, 60000);
    assert_true(plan.fits);
    assert_true(plan.micro_batches >= 2);
    assert_true(plan.largest_elements <= INT_MAX);
    assert_int_equal(plan.element_limit, INT_MAX);
    real_step(&r, plan.micro_batch, 0);
    umt_context_destroy(r.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_plan_predicts_two_real_steps_and_changes_nothing),
        cmocka_unit_test(test_a_1g_budget_splits_batch_32768_into_micro_batches_that_fit),
        cmocka_unit_test(test_batch_60000_is_split_under_cudnns_element_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
