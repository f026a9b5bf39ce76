/*
 * tests/gpu/test_cuda_memory.c — the pools on a real GPU: the device budget refuses without
 * allocating, each memory mode places the pools where the policy table says, managed pools
 * carry their advice and prefetch, and all three modes (and the CPU) train to the same losses.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "tests/gpu/cuda_test_context.h"
#include "umtrain.h"

static umt_context *cuda_context(umt_memory_mode mode, uint64_t seed) {
    umt_context_options o = umt_context_defaults();
    o.memory_mode = mode;
    o.seed = seed;
    return cuda_test_context_with(o);
}

static int range_int(enum cudaMemRangeAttribute attribute, const umt_tensor *t) {
    int value = -100;
    assert_int_equal(cudaMemRangeGetAttribute(&value, sizeof value, attribute, t->data, t->bytes), cudaSuccess);
    return value;
}

static enum cudaMemoryType memory_type(const umt_tensor *t) {
    struct cudaPointerAttributes a;
    assert_int_equal(cudaPointerGetAttributes(&a, t->data), cudaSuccess);
    return a.type;
}

static void test_request_past_the_budget_is_refused_and_allocates_nothing(void **state) {
    (void)state;
    setenv("UMT_DEVICE_BUDGET", "64M", 1);
    umt_context *ctx = cuda_context(UMT_MEM_MANAGED, 1);
    unsetenv("UMT_DEVICE_BUDGET");
    size_t budget, used_before, used_after, free_before, free_after, total;
    assert_int_equal(umt_device_budget(ctx, &budget, &used_before), UMT_OK);
    assert_true(budget <= (size_t)64 << 20);
    assert_int_equal(cudaMemGetInfo(&free_before, &total), cudaSuccess);
    /* 100 MiB of weights against a 64 MiB budget. */
    umt_tensor *w = umt_parameter_new(ctx, "too_big", 2, (int64_t[]){25 << 10, 1 << 10});
    assert_null(w);
    assert_int_equal(umt_last_status(), UMT_ERR_BUDGET);
    print_message("refusal: %s\n", umt_last_error());
    assert_non_null(strstr(umt_last_error(), "pool weights"));
    assert_non_null(strstr(umt_last_error(), "104857600 bytes"));
    assert_non_null(strstr(umt_last_error(), "left"));
    assert_int_equal(cudaMemGetInfo(&free_after, &total), cudaSuccess);
    assert_int_equal(umt_device_budget(ctx, &budget, &used_after), UMT_OK);
    assert_int_equal(used_after, used_before);
    /* Nothing reached the driver: free memory did not drop by the request (allow 2 MiB of
     * driver bookkeeping noise). */
    assert_true(free_before < free_after + ((size_t)2 << 20));
    umt_pool_stats stats;
    umt_pool_stats_get(ctx, UMT_POOL_WEIGHTS, &stats);
    assert_int_equal(stats.in_use_bytes, 0);
    /* A request that fits still works after the refusal. */
    assert_non_null(umt_parameter_new(ctx, "fits", 2, (int64_t[]){1024, 1024}));
    umt_context_destroy(ctx);
}

static void test_malformed_budget_variable_fails_context_creation(void **state) {
    (void)state;
    setenv("UMT_DEVICE_BUDGET", "two gigabytes", 1);
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_ERR_INVALID_ARGUMENT);
    unsetenv("UMT_DEVICE_BUDGET");
    assert_null(ctx);
    assert_non_null(strstr(umt_last_error(), "UMT_DEVICE_BUDGET"));
}

static void test_managed_mode_advises_and_prefetches_each_pool_as_the_table_says(void **state) {
    (void)state;
    umt_context *ctx = cuda_context(UMT_MEM_MANAGED, 1);
    umt_tensor *w = umt_parameter_new(ctx, "w", 2, (int64_t[]){256, 256});
    umt_tensor *data = umt_tensor_new_1d(ctx, UMT_POOL_DATASET, UMT_U8, 1 << 20);
    umt_tensor *staging = umt_tensor_new_1d(ctx, UMT_POOL_STAGING, UMT_F32, 1024);
    assert_non_null(w);
    assert_non_null(data);
    assert_non_null(staging);
    assert_int_equal(umt_synchronize(ctx), UMT_OK);
    assert_int_equal(memory_type(w), cudaMemoryTypeManaged);
    assert_int_equal(memory_type(w->grad), cudaMemoryTypeManaged);
    assert_int_equal(range_int(cudaMemRangeAttributePreferredLocationType, w), cudaMemLocationTypeDevice);
    assert_int_equal(range_int(cudaMemRangeAttributePreferredLocationId, w), 0);
    assert_int_equal(range_int(cudaMemRangeAttributeLastPrefetchLocationType, w), cudaMemLocationTypeDevice);
    assert_int_equal(range_int(cudaMemRangeAttributeReadMostly, data), 1);
    assert_int_equal(range_int(cudaMemRangeAttributeReadMostly, w), 0);
    assert_int_equal(memory_type(staging), cudaMemoryTypeHost);
    umt_context_destroy(ctx);
}

static void test_plain_mode_is_managed_without_advice_and_device_mode_is_cudamalloc(void **state) {
    (void)state;
    umt_context *plain = cuda_context(UMT_MEM_MANAGED_PLAIN, 1);
    umt_tensor *w = umt_parameter_new(plain, "w", 2, (int64_t[]){256, 256});
    umt_tensor *data = umt_tensor_new_1d(plain, UMT_POOL_DATASET, UMT_U8, 1 << 20);
    assert_int_equal(memory_type(w), cudaMemoryTypeManaged);
    assert_int_equal(range_int(cudaMemRangeAttributePreferredLocationType, w), cudaMemLocationTypeInvalid);
    assert_int_equal(range_int(cudaMemRangeAttributeReadMostly, data), 0);
    umt_context_destroy(plain);
    umt_context *device = cuda_context(UMT_MEM_DEVICE, 1);
    w = umt_parameter_new(device, "w", 2, (int64_t[]){256, 256});
    assert_int_equal(memory_type(w), cudaMemoryTypeDevice);
    umt_context_destroy(device);
}

/* Five SGD steps of a small MLP on fixed random data; the losses go into losses[5]. */
static void train_five_steps(umt_context *ctx, float *losses) {
    umt_layer *fc1 = umt_linear_layer_new(ctx, "fc1", 64, 32, true);
    umt_layer *fc2 = umt_linear_layer_new(ctx, "fc2", 32, 10, true);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.lr = 0.1f;
    oo.momentum = 0.9f;
    umt_optimizer *opt;
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    float x[128 * 64];
    int32_t y[128];
    uint64_t s = 99;
    for (int i = 0; i < 128 * 64; ++i) x[i] = (float)((s = s * 6364136223846793005ULL + 1) >> 41) / 8388608.0f - 1.0f;
    for (int i = 0; i < 128; ++i) y[i] = i % 10;
    for (int step = 0; step < 5; ++step) {
        umt_step_begin(ctx);
        umt_zero_grad(ctx);
        umt_tensor *xt = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 128, 64);
        umt_tensor *yt = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, 128);
        umt_tensor_copy_from_host(xt, x, sizeof x);
        umt_tensor_copy_from_host(yt, y, sizeof y);
        umt_tensor *h = umt_relu(ctx, umt_layer_forward(ctx, fc1, xt));
        umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, fc2, h), yt);
        assert_non_null(loss);
        assert_int_equal(umt_backward(ctx, loss), UMT_OK);
        assert_int_equal(umt_optimizer_step(opt), UMT_OK);
        assert_int_equal(umt_tensor_get_f32(loss, 0, &losses[step]), UMT_OK);
    }
}

static void test_every_memory_mode_and_the_cpu_train_to_the_same_losses(void **state) {
    (void)state;
    float reference[5], losses[5];
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *cpu;
    assert_int_equal(umt_context_create(&o, &cpu), UMT_OK);
    train_five_steps(cpu, reference);
    umt_context_destroy(cpu);
    for (int mode = UMT_MEM_MANAGED; mode <= UMT_MEM_DEVICE; ++mode) {
        umt_context *ctx = cuda_context((umt_memory_mode)mode, 1);
        train_five_steps(ctx, losses);
        umt_context_destroy(ctx);
        for (int i = 0; i < 5; ++i) {
            print_message("%s step %d: cuda %.7f cpu %.7f\n", umt_memory_mode_name((umt_memory_mode)mode), i,
                          losses[i], reference[i]);
            assert_true(fabsf(losses[i] - reference[i]) <= 1e-5f * fabsf(reference[i]));
        }
    }
}

static void test_device_timer_sees_queued_work(void **state) {
    (void)state;
    umt_context *ctx = cuda_context(UMT_MEM_MANAGED, 1);
    umt_tensor *a = umt_tensor_new_2d(ctx, UMT_POOL_DATASET, UMT_F32, 2048, 2048);
    assert_int_equal(umt_tensor_uniform(ctx, a, -1.0f, 1.0f), UMT_OK);
    double ms = -1;
    assert_int_equal(umt_timer_stop(ctx, &ms), UMT_ERR_STATE);
    assert_int_equal(umt_timer_start(ctx), UMT_OK);
    for (int i = 0; i < 10; ++i) {
        umt_step_begin(ctx);
        assert_non_null(umt_matmul(ctx, a, a)); /* ~17 GFLOP each in fp32 */
    }
    assert_int_equal(umt_timer_stop(ctx, &ms), UMT_OK);
    print_message("10 fp32 matmuls of 2048^3: %.3f ms\n", ms);
    assert_true(ms > 0.1 && ms < 10000.0);
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_past_the_budget_is_refused_and_allocates_nothing),
        cmocka_unit_test(test_malformed_budget_variable_fails_context_creation),
        cmocka_unit_test(test_managed_mode_advises_and_prefetches_each_pool_as_the_table_says),
        cmocka_unit_test(test_plain_mode_is_managed_without_advice_and_device_mode_is_cudamalloc),
        cmocka_unit_test(test_every_memory_mode_and_the_cpu_train_to_the_same_losses),
        cmocka_unit_test(test_device_timer_sees_queued_work),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
