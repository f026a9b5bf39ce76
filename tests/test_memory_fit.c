/*
 * tests/test_memory_fit.c — the memory plan's decision (memory/fit.h), sizes in, choices out: one
 * micro-batch when the step fits; the smallest k whose micro-batch fits the budget, then the
 * fewest micro-batches of that size; k set by the element limit alone where no budget binds (the
 * 60000-image batch cuDNN refuses); a forced k kept, fitting or not. Where one sample does not fit
 * beside the model's state: the offload tier, with the whole batch or the smallest k that fits
 * beside the tier's least device bytes (and the reserve it leaves, the host bytes it needs), then
 * saved activations offloaded too; a refusal naming the pools and sizes when even that does not
 * fit, or when host memory cannot hold what the tier keeps there.
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

/* A step that adds fixed + per_sample * b device bytes (all but fixed in activations, largest
 * tensor a 40th of them), and whose largest tensor is elements_per_sample * b elements;
 * counts its measures. */
typedef struct {
    size_t fixed, per_sample;
    int64_t elements_per_sample;
    int measures;
} linear_step;

static umt_status measure(void *user, int64_t b, umt_fit_measure *out) {
    linear_step *s = user;
    s->measures++;
    size_t activations = s->per_sample * (size_t)b;
    *out = (umt_fit_measure){.step_bytes = s->fixed + activations, .activation_bytes = activations,
                             .activation_total_bytes = 2 * activations, .largest_bytes = activations / 40,
                             .largest_elements = s->elements_per_sample * b};
    return UMT_OK;
}

/* 40 MiB of state on the device, no tier (as on a GPU without it: the old decision). */
static umt_fit_inputs inputs(int64_t batch, size_t budget) {
    return (umt_fit_inputs){.batch = batch, .element_limit = 2147483647, .budget_bytes = budget,
                            .state_bytes = {10 * MIB, 10 * MIB, 20 * MIB}};
}

static void test_one_micro_batch_when_the_whole_batch_fits(void **state) {
    (void)state;
    linear_step step = {60 * MIB, MIB, 1000, 0};
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
    /* 32768 samples of 1 MiB each on a 1 GiB budget with 100 MiB held (40 of them state): 924
     * samples fit at once. */
    linear_step step = {60 * MIB, MIB, 1000, 0};
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
    assert_true(c.device_bytes <= GIB);
    assert_int_equal(c.device_bytes, 100 * MIB + (size_t)c.micro_batch * MIB);
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
    *out = (umt_fit_measure){.step_bytes = MIB, .largest_elements = b, .refused = b > 100};
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

static umt_status refuse_all(void *user, int64_t b, umt_fit_measure *out) {
    (void)user;
    *out = (umt_fit_measure){.step_bytes = MIB, .largest_elements = 3000000000LL * b, .refused = true};
    return UMT_OK;
}

static void test_a_shape_refused_even_for_one_sample_is_named(void **state) {
    (void)state;
    umt_fit_inputs in = inputs(64, 0);
    in.tier = true;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, refuse_all, NULL, &c), UMT_OK);
    assert_false(c.fits);
    assert_int_equal(c.micro_batch, 1);
    assert_non_null(strstr(c.why, "a tensor of 3000000000 elements (limit 2147483647)"));
}

static void test_a_forced_k_is_kept_fitting_or_not(void **state) {
    (void)state;
    linear_step step = {60 * MIB, MIB, 1000, 0};
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

/* ----------------------------------------------------------------------------------------- */
/* The offload tier */

/* 20 MiB held, the state in weights 400 MiB, grads 400 MiB, optim 800 MiB (1.6 GiB: more than the
 * budgets below), a tier that needs 128 MiB of the device at least, 64 GiB of host memory. */
static umt_fit_inputs tiered(int64_t batch, size_t budget) {
    return (umt_fit_inputs){.batch = batch, .element_limit = 2147483647, .budget_bytes = budget, .held_bytes = 20 * MIB,
                            .state_bytes = {400 * MIB, 400 * MIB, 800 * MIB}, .tier = true, .tier_bytes = 128 * MIB,
                            .host_available_bytes = 64 * GIB};
}

static void test_state_and_activations_past_the_budget_take_the_tier_and_the_fewest_micro_batches(void **state) {
    (void)state;
    /* Beside the tier's 148 MiB, 50 MiB + 4 MiB a sample: 206 samples fit, so 2 micro-batches of 128. */
    linear_step step = {50 * MIB, 4 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(256, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_int_equal(c.arrangement, UMT_FIT_TIER);
    assert_true(c.fits);
    assert_int_equal(c.k, 2);
    assert_int_equal(c.micro_batch, 128);
    /* The tier leaves the step its bytes; the rest of the budget is the tier's to keep state in. */
    assert_int_equal(c.reserve_bytes, 50 * MIB + 128 * 4 * MIB);
    assert_int_equal(c.device_bytes, 20 * MIB + 128 * MIB + c.reserve_bytes);
    assert_int_equal(c.host_bytes, 1600 * MIB);
    assert_non_null(strstr(c.why, "offload tier"));
}

static void test_the_whole_batch_takes_the_tier_alone_when_it_fits_beside_it(void **state) {
    (void)state;
    linear_step step = {50 * MIB, 4 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(32, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_int_equal(c.k, 1);
    assert_int_equal(c.micro_batch, 32);
    assert_true(c.fits);
}

static void test_micro_batches_in_memory_come_before_the_tier(void **state) {
    (void)state;
    /* 200 MiB of state: one sample fits beside it, so the state stays and the batch is split. */
    linear_step step = {50 * MIB, 4 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(256, GIB);
    in.state_bytes[0] = in.state_bytes[1] = 50 * MIB;
    in.state_bytes[2] = 100 * MIB;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_MICRO_BATCHES);
    assert_int_equal(c.arrangement, UMT_FIT_IN_MEMORY);
    assert_int_equal(c.host_bytes, 0);
    assert_true(c.fits);
    assert_true(c.k > 1);
}

static void test_one_sample_past_what_the_tier_leaves_offloads_saved_activations_too(void **state) {
    (void)state;
    /* A sample's step is 500 MiB, 550 with the fixed part: past the 502 MiB the tier leaves of 650.
     * Offloaded, its activations take UMT_FIT_ACTIVATION_WORKING_SET (20) largest tensors (12.5
     * MiB each: 250 MiB a sample) on the device: 1 sample fits, 2 do not. */
    linear_step step = {50 * MIB, 500 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(16, 650 * MIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_ACTIVATIONS);
    assert_int_equal(c.arrangement, UMT_FIT_TIER_ACTIVATIONS);
    assert_true(c.fits);
    assert_int_equal(c.micro_batch, 1);
    assert_int_equal(c.k, 16);
    assert_int_equal(c.reserve_bytes, 50 * MIB + 1 * UMT_FIT_ACTIVATION_WORKING_SET * (500 * MIB / 40));
    /* The host holds the state and every activation of a micro-batch. */
    assert_int_equal(c.host_bytes, 1600 * MIB + 2 * 1 * 500 * MIB);
}

static void test_nothing_fits_even_offloaded_refused_naming_the_tier_and_one_sample(void **state) {
    (void)state;
    linear_step step = {50 * MIB, 500 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(16, 200 * MIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_false(c.fits);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_ACTIVATIONS);
    assert_int_equal(c.micro_batch, 1);
    assert_non_null(strstr(c.why, "134217728"));              /* the tier's least */
    assert_non_null(strstr(c.why, "209715200"));              /* the budget */
    assert_non_null(strstr(c.why, "weights 419430400 + grads 419430400 + optim 838860800"));
}

static void test_host_memory_that_cannot_hold_the_state_refuses_naming_the_pools(void **state) {
    (void)state;
    linear_step step = {50 * MIB, 4 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(256, GIB);
    in.host_available_bytes = GIB;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_OFFLOAD_STATE);
    assert_false(c.fits);
    assert_non_null(strstr(c.why, "host"));
    assert_non_null(strstr(c.why, "weights 419430400 + grads 419430400 + optim 838860800"));
    assert_non_null(strstr(c.why, "1073741824"));
    /* Unknown host memory (0) is not checked. */
    in.host_available_bytes = 0;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_true(c.fits);
}

static void test_a_forced_k_takes_the_tier_when_the_state_does_not_fit_and_stays_in_memory_where_nothing_does(
    void **state) {
    (void)state;
    linear_step step = {50 * MIB, 4 * MIB, 1000, 0};
    umt_fit_inputs in = tiered(256, GIB);
    in.forced_k = 4;
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_FORCED);
    assert_int_equal(c.arrangement, UMT_FIT_TIER);
    assert_true(c.fits);
    assert_int_equal(c.micro_batch, 64);
    assert_non_null(strstr(c.why, "offload tier"));
    /* Where nothing fits, the split stays as asked, in memory, and says so. */
    in = tiered(256, 200 * MIB);
    in.forced_k = 1;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_int_equal(c.verdict, UMT_PLAN_FORCED);
    assert_int_equal(c.arrangement, UMT_FIT_IN_MEMORY);
    assert_false(c.fits);
    assert_non_null(strstr(c.why, "does not fit"));
}

static void test_without_a_tier_one_sample_past_the_budget_is_refused_naming_the_sizes(void **state) {
    (void)state;
    linear_step step = {GIB, MIB, 1000, 0};
    umt_fit_inputs in = inputs(64, GIB);
    umt_fit_choice c;
    assert_int_equal(umt_fit_choose(&in, measure, &step, &c), UMT_OK);
    assert_false(c.fits);
    assert_int_equal(c.micro_batch, 1);
    assert_non_null(strstr(c.why, "even one sample"));
    assert_non_null(strstr(c.why, "weights 10485760 + grads 10485760 + optim 20971520"));
}

static umt_status failing(void *user, int64_t b, umt_fit_measure *out) {
    (void)user, (void)b;
    *out = (umt_fit_measure){0};
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
        cmocka_unit_test(test_a_shape_refused_even_for_one_sample_is_named),
        cmocka_unit_test(test_a_forced_k_is_kept_fitting_or_not),
        cmocka_unit_test(test_state_and_activations_past_the_budget_take_the_tier_and_the_fewest_micro_batches),
        cmocka_unit_test(test_the_whole_batch_takes_the_tier_alone_when_it_fits_beside_it),
        cmocka_unit_test(test_micro_batches_in_memory_come_before_the_tier),
        cmocka_unit_test(test_one_sample_past_what_the_tier_leaves_offloads_saved_activations_too),
        cmocka_unit_test(test_nothing_fits_even_offloaded_refused_naming_the_tier_and_one_sample),
        cmocka_unit_test(test_host_memory_that_cannot_hold_the_state_refuses_naming_the_pools),
        cmocka_unit_test(
            test_a_forced_k_takes_the_tier_when_the_state_does_not_fit_and_stays_in_memory_where_nothing_does),
        cmocka_unit_test(test_without_a_tier_one_sample_past_the_budget_is_refused_naming_the_sizes),
        cmocka_unit_test(test_a_failing_measure_fails_the_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
