/*
 * tests/test_memory_fit.c — the memory plan's decision (memory/fit.h), sizes in, choices out: one
 * micro-batch when the step fits; the smallest k whose micro-batch fits the budget, then the
 * fewest micro-batches of that size; k set by the element limit alone where no budget binds (the
 * 60000-image batch cuDNN refuses); a forced k kept, fitting or not; and the offload tier named,
 * with the pools and sizes, when the state alone or one sample already passes the budget.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "memory/fit.h"
#include "umtrain.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* A step whose device peak is fixed + per_sample * b, and whose largest tensor is
 * elements_per_sample * b; counts its measures. */
typedef struct {
    size_t fixed, per_sample;
    int64_t elements_per_sample;
    int measures;
} linear_step;

static umt_status measure(void *user, int64_t b, umt_fit_measure *out) {
    linear_step *s = user;
    s->measures++;
    *out = (umt_fit_measure){s->fixed + s->per_sample * (size_t)b, s->elements_per_sample * b, false};
    return UMT_OK;
}

static umt_fit_inputs inputs(int64_t batch, size_t budget) {
    return (umt_fit_inputs){.batch = batch, .element_limit = 2147483647, .budget_bytes = budget,
                            .state_bytes = {10 * MIB, 10 * MIB, 20 * MIB}};
}

static void test_one_micro_batch_when_the_whole_batch_fits(void **state) {
    (void)state;
    linear_step step = {100 * MIB, MIB, 1000, 0};
    umt_fit_inputs in = inputs(512, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_FITS);
    assert_true(c.fits);
    assert_int_equal(c.k, 1);
    assert_int_equal(c.micro_batch, 512);
    assert_int_equal(step.measures, 1);
}

static void test_the_smallest_k_that_fits_the_budget(void **state) {
    (void)state;
    /* 32768 samples of 1 MiB each on a 1 GiB budget with 100 MiB held: 924 samples fit at once. */
    linear_step step = {100 * MIB, MIB, 1000, 0};
    umt_fit_inputs in = inputs(32768, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_MICRO_BATCHES);
    assert_true(c.fits);
    int64_t fit = (int64_t)((GIB - 100 * MIB) / MIB);
    assert_true(c.micro_batch <= fit);
    /* k - 1 micro-batches would be larger than what fits. */
    assert_true((32768 + (c.k - 1) - 1) / (c.k - 1) > fit);
    assert_int_equal(c.k, (32768 + c.micro_batch - 1) / c.micro_batch);
    assert_true(c.at.device_peak_bytes <= GIB);
    /* Bisection: a few dozen measures, not one per k. */
    assert_true(step.measures < 40);
}

static void test_the_fewest_micro_batches_of_the_chosen_size(void **state) {
    (void)state;
    /* 10 samples, 3 fit: k = 4 gives micro-batches of 3 (3 + 3 + 3 + 1), and so does no smaller k. */
    linear_step step = {0, 100, 1, 0};
    umt_fit_inputs in = inputs(10, 350);
    in.state_bytes[0] = in.state_bytes[1] = in.state_bytes[2] = 0;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.micro_batch, 3);
    assert_int_equal(c.k, 4);
    /* 11 samples, 5 fit: k = 3 gives micro-batches of 4, which k = 3 needs; never more. */
    step = (linear_step){0, 100, 1, 0};
    in = inputs(11, 500);
    in.state_bytes[0] = in.state_bytes[1] = in.state_bytes[2] = 0;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.k, 3);
    assert_int_equal(c.micro_batch, 4);
}

static void test_the_element_limit_alone_sets_k_without_a_budget(void **state) {
    (void)state;
    /* mnist_cnn at batch 60000: conv2's output has 64 x 24 x 24 = 36864 elements per image. */
    linear_step step = {0, MIB, 36864, 0};
    umt_fit_inputs in = inputs(60000, 0);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_MICRO_BATCHES);
    assert_int_equal(c.k, 2);
    assert_int_equal(c.micro_batch, 30000);
    assert_true(c.at.largest_elements <= 2147483647);
    assert_non_null(strstr(c.why, "2211840000 elements"));
}

/* A library's refusal counts as not fitting, whatever the sizes say. */
static umt_status refuse_above_100(void *user, int64_t b, umt_fit_measure *out) {
    (void)user;
    *out = (umt_fit_measure){MIB, b, b > 100};
    return UMT_OK;
}

static void test_the_margin_is_kept_free_under_the_budget(void **state) {
    (void)state;
    /* 100 samples of 1 MiB fit a 100 MiB budget exactly; with 10 MiB kept free, 90 do. */
    linear_step step = {0, MIB, 1, 0};
    umt_fit_inputs in = inputs(100, 100 * MIB);
    in.state_bytes[0] = in.state_bytes[1] = in.state_bytes[2] = 0;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.k, 1);
    in.margin_bytes = 10 * MIB;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.k, 2);
    assert_int_equal(c.micro_batch, 50);
}

static void test_a_refused_shape_does_not_fit(void **state) {
    (void)state;
    umt_fit_inputs in = inputs(1000, 0);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, refuse_above_100, NULL, &c), UMT_OK);
    assert_int_equal(c.k, 10);
    assert_int_equal(c.micro_batch, 100);
}

static void test_a_forced_k_is_kept_fitting_or_not(void **state) {
    (void)state;
    linear_step step = {100 * MIB, MIB, 1000, 0};
    umt_fit_inputs in = inputs(4096, GIB);
    in.forced_k = 2;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_FORCED);
    assert_int_equal(c.k, 2);
    assert_int_equal(c.micro_batch, 2048);
    assert_false(c.fits);
    assert_non_null(strstr(c.why, "does not fit"));
    in.forced_k = 8;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_true(c.fits);
    assert_int_equal(c.micro_batch, 512);
}

static void test_state_past_the_budget_needs_the_offload_tier_named_with_sizes(void **state) {
    (void)state;
    linear_step step = {0, MIB, 1000, 0};
    umt_fit_inputs in = inputs(64, GIB);
    in.state_bytes[0] = 512 * MIB;
    in.state_bytes[1] = 512 * MIB;
    in.state_bytes[2] = GIB;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_false(c.fits);
    assert_int_equal(step.measures, 0);
    assert_non_null(strstr(c.why, "weights 536870912 + grads 536870912 + optim 1073741824"));
    assert_non_null(strstr(c.why, "umt_offload_enable"));
}

static void test_one_sample_past_the_budget_needs_offloaded_activations(void **state) {
    (void)state;
    linear_step step = {GIB, MIB, 1000, 0};
    umt_fit_inputs in = inputs(64, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_ACTIVATIONS);
    assert_false(c.fits);
    assert_int_equal(c.micro_batch, 1);
    assert_non_null(strstr(c.why, "even one sample"));
    assert_non_null(strstr(c.why, "1074790400 device bytes"));
}

static umt_status failing(void *user, int64_t b, umt_fit_measure *out) {
    (void)user, (void)b;
    *out = (umt_fit_measure){0, 0, false};
    return UMT_ERR_DEVICE;
}

static void test_a_failing_measure_fails_the_choice(void **state) {
    (void)state;
    umt_fit_inputs in = inputs(64, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, failing, NULL, &c), UMT_ERR_DEVICE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_micro_batch_when_the_whole_batch_fits),
        cmocka_unit_test(test_the_smallest_k_that_fits_the_budget),
        cmocka_unit_test(test_the_fewest_micro_batches_of_the_chosen_size),
        cmocka_unit_test(test_the_element_limit_alone_sets_k_without_a_budget),
        cmocka_unit_test(test_the_margin_is_kept_free_under_the_budget),
        cmocka_unit_test(test_a_refused_shape_does_not_fit),
        cmocka_unit_test(test_a_forced_k_is_kept_fitting_or_not),
        cmocka_unit_test(test_state_past_the_budget_needs_the_offload_tier_named_with_sizes),
        cmocka_unit_test(test_one_sample_past_the_budget_needs_offloaded_activations),
        cmocka_unit_test(test_a_failing_measure_fails_the_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
