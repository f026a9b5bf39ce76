/*
 * tests/test_contexts.c — several contexts in one process: trainings on host threads of their
 * own, or as the members of one step group, give the bits each gives alone, and one dataset is
 * shared by them, counted once (CPU; the GPU twin is tests/gpu/test_contexts_gpu.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/micro_batch_run.h"
#include "tests/scratch.h"
#include "umtrain.h"

enum { RUNS = 3 };

/* Three configurations of a sweep: seeds, rates and optimizers differ. */
static void sweep_runs(mb_run runs[RUNS], const umt_dataset *shared) {
    const umt_optimizer_kind optimizers[RUNS] = {UMT_OPT_SGD, UMT_OPT_ADAM, UMT_OPT_ADADELTA};
    for (int i = 0; i < RUNS; ++i)
        runs[i] = (mb_run){.device = UMT_DEVICE_CPU, .micro_batches = 1, .dropout = 0.25f, .optimizer = optimizers[i],
                           .seed = 11 + (uint64_t)i, .lr = i == 2 ? 1.0f : 0.0f, .shared = shared};
}

static void free_results(mb_result *results, int count) {
    for (int i = 0; i < count; ++i) free(results[i].params);
}

static void test_trainings_on_threads_at_once_give_the_bits_each_gives_alone(void **state) {
    (void)state;
    mb_run runs[RUNS];
    sweep_runs(runs, NULL);
    mb_result alone[RUNS], together[RUNS];
    for (int i = 0; i < RUNS; ++i) mb_train(&runs[i], scratch_folder(), &alone[i]);
    mb_train_at_once(runs, RUNS, scratch_folder(), together);
    mb_expect_same_bits(&alone[0], &together[0], "SGD, seed 11, on a thread beside two others");
    mb_expect_same_bits(&alone[1], &together[1], "Adam, seed 12, on a thread beside two others");
    mb_expect_same_bits(&alone[2], &together[2], "Adadelta, seed 13, on a thread beside two others");
    free_results(alone, RUNS);
    free_results(together, RUNS);
}

/* On the CPU a group captures nothing: each member runs its own (eager) step graph, in turn,
 * with the bits it gives alone, and the group says nothing is off (the members chose no capture). */
static void test_a_step_group_on_the_cpu_runs_each_member_as_alone(void **state) {
    (void)state;
    mb_run runs[RUNS];
    sweep_runs(runs, NULL);
    mb_result alone[RUNS], grouped[RUNS];
    for (int i = 0; i < RUNS; ++i) mb_train(&runs[i], scratch_folder(), &alone[i]);
    umt_step_graph_stats stats;
    mb_train_grouped(runs, RUNS, scratch_folder(), grouped, &stats);
    for (int i = 0; i < RUNS; ++i) mb_expect_same_bits(&alone[i], &grouped[i], "a member of a step group on the CPU");
    assert_int_equal(stats.captures, 0);
    assert_int_equal(stats.replayed_steps, 0);
    free_results(alone, RUNS);
    free_results(grouped, RUNS);
}

/* Misuse is refused with the argument named, and nothing made. */
static void test_a_step_group_refuses_no_members_and_null_ones(void **state) {
    (void)state;
    umt_step_group *group = (umt_step_group *)&group;
    umt_step_graph *none[1] = {NULL};
    assert_int_equal(umt_step_group_create(none, 1, &group), UMT_ERR_INVALID_ARGUMENT);
    assert_null(group);
    assert_non_null(strstr(umt_last_error(), "graphs[0]"));
    assert_int_equal(umt_step_group_create(none, 0, &group), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "count 0"));
    assert_int_equal(umt_step_group_create(NULL, 1, &group), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_step_group_run(NULL, NULL, NULL, NULL, NULL), UMT_ERR_INVALID_ARGUMENT);
    umt_step_group_destroy(NULL);
}

/* The source context holds the dataset; the trainings read it from their own contexts. */
static umt_context *load_source(umt_dataset **data) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *source = NULL;
    assert_int_equal(umt_context_create(&co, &source), UMT_OK);
    assert_int_equal(umt_dataset_load_idx(source, scratch_path("mb-images.idx"), scratch_path("mb-labels.idx"), 10,
                                          data),
                     UMT_OK);
    return source;
}

static void test_a_shared_dataset_trains_as_a_loaded_one_and_is_counted_once(void **state) {
    (void)state;
    umt_dataset *data = NULL;
    umt_context *source = load_source(&data);
    umt_pool_stats held;
    assert_int_equal(umt_pool_stats_get(source, UMT_POOL_DATASET, &held), UMT_OK);
    assert_true(held.in_use_bytes > 0);
    mb_run loaded[RUNS], shared[RUNS];
    sweep_runs(loaded, NULL);
    sweep_runs(shared, data);
    mb_result alone[RUNS], together[RUNS];
    for (int i = 0; i < RUNS; ++i) mb_train(&loaded[i], scratch_folder(), &alone[i]);
    mb_train_at_once(shared, RUNS, scratch_folder(), together);
    for (int i = 0; i < RUNS; ++i) {
        mb_expect_same_bits(&alone[i], &together[i], "a run on the shared dataset against one that loaded its own");
        assert_true(alone[i].dataset_bytes > 0);
        assert_int_equal(together[i].dataset_bytes, 0); /* counted in the source's pool only */
    }
    umt_pool_stats after;
    assert_int_equal(umt_pool_stats_get(source, UMT_POOL_DATASET, &after), UMT_OK);
    assert_int_equal(after.in_use_bytes, held.in_use_bytes);
    free_results(alone, RUNS);
    free_results(together, RUNS);
    umt_context_destroy(source);
}

static void test_a_share_is_the_source_s_size_and_shape_and_goes_with_its_context(void **state) {
    (void)state;
    umt_dataset *data = NULL;
    umt_context *source = load_source(&data), *reader = NULL;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &reader), UMT_OK);
    umt_dataset *share = NULL;
    assert_int_equal(umt_dataset_share(reader, data, &share), UMT_OK);
    assert_int_equal(umt_dataset_size(share), umt_dataset_size(data));
    assert_int_equal(umt_dataset_num_classes(share), 10);
    int64_t a[3], b[3];
    umt_dataset_sample_shape(data, a);
    umt_dataset_sample_shape(share, b);
    assert_memory_equal(a, b, sizeof a);
    /* A batch of the share is the source's batch. */
    const int64_t indices[3] = {5, 0, 47};
    umt_tensor *x1, *y1, *x2, *y2;
    assert_int_equal(umt_step_begin(source), UMT_OK);
    assert_int_equal(umt_step_begin(reader), UMT_OK);
    assert_int_equal(umt_dataset_batch(source, data, indices, 3, 0.5f, 0.25f, &x1, &y1), UMT_OK);
    assert_int_equal(umt_dataset_batch(reader, share, indices, 3, 0.5f, 0.25f, &x2, &y2), UMT_OK);
    float h1[3 * 144], h2[3 * 144];
    assert_int_equal(umt_tensor_copy_to_host(x1, h1, sizeof h1), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(x2, h2, sizeof h2), UMT_OK);
    assert_memory_equal(h1, h2, sizeof h1);
    /* A share belongs to its own context: the source's refuses it. */
    assert_int_equal(umt_dataset_batch(source, share, indices, 3, 0.5f, 0.25f, &x1, &y1), UMT_ERR_INVALID_ARGUMENT);
    umt_context_destroy(reader); /* frees the share */
    umt_context_destroy(source);
}

static int setup(void **state) {
    (void)state;
    if (scratch_make("contexts") != 0) return -1;
    mb_write_data();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

/* The CPU backend's thread count comes from UMT_CPU_THREADS; a value that is not a count from 1
 * to 256 is refused where it can be reported, by the CPU context, naming it (the kernels
 * themselves cannot fail mid-step). */
static void test_a_cpu_context_refuses_a_UMT_CPU_THREADS_that_is_not_a_count(void **state) {
    (void)state;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    const char *refused[] = {"abc", "0", "257", "2x", "-1", " "};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; ++i) {
        assert_int_equal(setenv("UMT_CPU_THREADS", refused[i], 1), 0);
        umt_context *ctx = NULL;
        umt_status status = umt_context_create(&co, &ctx);
        if (status == UMT_OK) umt_context_destroy(ctx);
        if (status != UMT_ERR_INVALID_ARGUMENT)
            fail_msg("UMT_CPU_THREADS='%s': umt_context_create returned %s, expected UMT_ERR_INVALID_ARGUMENT",
                     refused[i], umt_status_name(status));
        char expected[64];
        snprintf(expected, sizeof expected, "UMT_CPU_THREADS '%s': expected a whole number from 1 to 256", refused[i]);
        if (!strstr(umt_last_error(), expected)) fail_msg("error \"%s\" lacks \"%s\"", umt_last_error(), expected);
    }
    assert_int_equal(setenv("UMT_CPU_THREADS", "2", 1), 0);
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_context_destroy(ctx);
    assert_int_equal(unsetenv("UMT_CPU_THREADS"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainings_on_threads_at_once_give_the_bits_each_gives_alone),
        cmocka_unit_test(test_a_shared_dataset_trains_as_a_loaded_one_and_is_counted_once),
        cmocka_unit_test(test_a_share_is_the_source_s_size_and_shape_and_goes_with_its_context),
        cmocka_unit_test(test_a_step_group_on_the_cpu_runs_each_member_as_alone),
        cmocka_unit_test(test_a_step_group_refuses_no_members_and_null_ones),
        cmocka_unit_test(test_a_cpu_context_refuses_a_UMT_CPU_THREADS_that_is_not_a_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
