/*
 * tests/test_micro_batch.c — micro-batching on the CPU (core/micro_batch.h): a step run as k
 * micro-batches gives the whole batch's losses and parameters, dropout included; gradient hooks
 * hear once per step; misuse is refused with a message. tests/gpu/test_micro_batch_gpu.c runs
 * the same comparisons on a GPU, through a captured step graph and in every precision.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/micro_batch_run.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* The exact sums of the whole batch, in another order: float rounding only. */
#define SAME_WITHIN 1e-5

static int make_data(void **state) {
    (void)state;
    if (scratch_make("micro_batch")) return -1;
    mb_write_data();
    return 0;
}

static int remove_data(void **state) {
    (void)state;
    return scratch_remove();
}

static mb_run cpu_run(int micro_batches, float dropout) {
    return (mb_run){.device = UMT_DEVICE_CPU, .precision = UMT_PRECISION_FP32, .micro_batches = micro_batches,
                    .dropout = dropout, .optimizer = UMT_OPT_SGD};
}

static void compare(mb_run whole_run, mb_run split_run, const char *what) {
    mb_result whole, split;
    mb_train(&whole_run, scratch_folder(), &whole);
    mb_train(&split_run, scratch_folder(), &split);
    mb_expect_close(&whole, &split, SAME_WITHIN, what);
    free(whole.params);
    free(split.params);
}

static void test_micro_batches_give_the_whole_batchs_losses_and_parameters(void **state) {
    (void)state;
    compare(cpu_run(1, 0), cpu_run(3, 0), "3 micro-batches of 16, sgd");
    compare(cpu_run(1, 0), cpu_run(5, 0), "5 micro-batches of 9 or 10, sgd");
    mb_run adam = cpu_run(1, 0), adam_split = cpu_run(4, 0);
    adam.optimizer = adam_split.optimizer = UMT_OPT_ADAM;
    compare(adam, adam_split, "4 micro-batches, adam");
}

/* The masks are drawn by the sample's index in the whole batch: with dropout the split step is
 * still the whole one. */
static void test_micro_batches_draw_the_whole_batchs_dropout_masks(void **state) {
    (void)state;
    compare(cpu_run(1, 0.3f), cpu_run(3, 0.3f), "3 micro-batches, dropout 0.3");
    compare(cpu_run(1, 0.5f), cpu_run(7, 0.5f), "7 micro-batches of 6 or 7, dropout 0.5");
}

/* Checks that the comparison can fail: batch norm normalises each micro-batch by its own
 * statistics (as PyTorch under accumulation), so that run is not the whole batch's. */
static void test_batch_norm_keeps_per_micro_batch_statistics(void **state) {
    (void)state;
    mb_run whole = cpu_run(1, 0), split = cpu_run(3, 0);
    whole.batch_norm = split.batch_norm = true;
    mb_result a, b;
    mb_train(&whole, scratch_folder(), &a);
    mb_train(&split, scratch_folder(), &b);
    assert_true(mb_differ(&a, &b, SAME_WITHIN));
    free(a.params);
    free(b.params);
}

/* The gradient hook (data parallelism's all-reduce) hears each parameter once per step, in the
 * last micro-batch: 6 parameters, MB_STEPS steps. */
static void test_gradient_hooks_hear_once_per_step(void **state) {
    (void)state;
    mb_run split = cpu_run(4, 0.2f);
    mb_result r;
    mb_train(&split, scratch_folder(), &r);
    assert_int_equal(r.grad_ready_calls, 6 * MB_STEPS);
    free(r.params);
}

static void test_micro_batch_misuse_is_refused_with_a_message(void **state) {
    (void)state;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_tensor *w = umt_parameter_new(ctx, "w", 2, (int64_t[]){4, 3});
    assert_non_null(w);
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_null(umt_micro_batch_loss(ctx));
    assert_non_null(strstr(umt_last_error(), "not split"));
    assert_int_equal(umt_micro_batch_begin(ctx, 4, 4, 8), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "first = 4, expected 0"));
    assert_int_equal(umt_micro_batch_begin(ctx, 0, 9, 8), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_micro_batch_begin(ctx, 0, 0, 8), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_micro_batch_begin(NULL, 0, 4, 8), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_micro_batch_begin(ctx, 0, 4, 8), UMT_OK);
    assert_non_null(umt_micro_batch_loss(ctx));
    assert_int_equal(umt_micro_batch_begin(ctx, 4, 4, 9), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "a batch of 9"));
    /* A forward that has not run backward would lose its gradients. */
    umt_tensor *x = umt_tensor_new(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, (int64_t[]){4, 4});
    assert_non_null(x);
    assert_int_equal(umt_tensor_fill(x, 1.0f), UMT_OK);
    assert_non_null(umt_mean(ctx, umt_matmul(ctx, x, w)));
    assert_int_equal(umt_micro_batch_begin(ctx, 4, 4, 8), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "has not run backward"));
    /* A dropout whose first axis is not the micro-batch cannot place its masks. */
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_micro_batch_begin(ctx, 0, 4, 8), UMT_OK);
    umt_tensor *y = umt_tensor_new(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, (int64_t[]){3, 4});
    assert_non_null(y);
    assert_null(umt_dropout(ctx, y, 0.5f));
    assert_non_null(strstr(umt_last_error(), "first axis"));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_micro_batches_give_the_whole_batchs_losses_and_parameters),
        cmocka_unit_test(test_micro_batches_draw_the_whole_batchs_dropout_masks),
        cmocka_unit_test(test_batch_norm_keeps_per_micro_batch_statistics),
        cmocka_unit_test(test_gradient_hooks_hear_once_per_step),
        cmocka_unit_test(test_micro_batch_misuse_is_refused_with_a_message),
    };
    return cmocka_run_group_tests(tests, make_data, remove_data);
}
