/*
 * tests/gpu/test_contexts_gpu.c — several CUDA contexts in one process on one GPU: trainings on
 * host threads of their own, each context with its own stream, handles and kernel scratch
 * (kernels/cuda/backend.cu), give the bits each gives alone, eager and through captured step
 * graphs, in fp32 and bf16, and as the branches of one group graph (umt_step_group) driven from
 * one thread; one dataset shared by them is on the GPU once. tests/test_contexts.c has the CPU's.
 *
 * UMT_CONV_TIMING=0: the half-precision convolutions take cuDNN's first engine instead of timing
 * them (kernels/cuda/conv_engines.cu), since timings taken beside other trainings may choose
 * another engine than alone, and two engines may round differently.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/micro_batch_run.h"
#include "tests/scratch.h"
#include "umtrain.h"

enum { MOST_RUNS = 4 };

/* Eager runs cycle through SGD, Adam and Adadelta; graphed ones through SGD and Adadelta, since
 * Adam without step scalars counts its steps on the host and so runs eagerly (core/step). */
static void sweep_runs(mb_run *runs, int count, umt_precision precision, bool graph, const umt_dataset *shared) {
    const umt_optimizer_kind eager[3] = {UMT_OPT_SGD, UMT_OPT_ADAM, UMT_OPT_ADADELTA};
    const umt_optimizer_kind graphed[2] = {UMT_OPT_SGD, UMT_OPT_ADADELTA};
    for (int i = 0; i < count; ++i) {
        umt_optimizer_kind kind = graph ? graphed[i % 2] : eager[i % 3];
        runs[i] = (mb_run){.device = UMT_DEVICE_CUDA, .precision = precision, .micro_batches = 1, .dropout = 0.25f,
                           .graph = graph, .optimizer = kind, .seed = 21 + (uint64_t)i,
                           .lr = kind == UMT_OPT_ADADELTA ? 1.0f : 0.0f, .shared = shared};
    }
}

/* Each run alone, then all at once on threads: the same bits. */
static void expect_alone_bits(umt_precision precision, bool graph, int count, const umt_dataset *shared) {
    mb_run alone_runs[MOST_RUNS], runs[MOST_RUNS];
    sweep_runs(alone_runs, count, precision, graph, NULL);
    sweep_runs(runs, count, precision, graph, shared);
    mb_result alone[MOST_RUNS], together[MOST_RUNS];
    for (int i = 0; i < count; ++i) mb_train(&alone_runs[i], scratch_folder(), &alone[i]);
    mb_train_at_once(runs, count, scratch_folder(), together);
    for (int i = 0; i < count; ++i) {
        char what[128];
        snprintf(what, sizeof what, "%s%s, run %d of %d at once%s", umt_precision_name(precision),
                 graph ? " with step graphs" : "", i + 1, count, shared ? " on a shared dataset" : "");
        mb_expect_same_bits(&alone[i], &together[i], what);
        if (graph) assert_int_equal(together[i].replayed_steps, MB_STEPS - 2);
        if (shared) assert_int_equal(together[i].dataset_bytes, 0);
        free(alone[i].params);
        free(together[i].params);
    }
}

static void test_fp32_trainings_on_threads_at_once_give_the_bits_each_gives_alone(void **state) {
    (void)state;
    expect_alone_bits(UMT_PRECISION_FP32, false, 3, NULL);
}

static void test_bf16_step_graphs_on_threads_at_once_give_the_bits_each_gives_alone(void **state) {
    (void)state;
    expect_alone_bits(UMT_PRECISION_BF16, true, MOST_RUNS, NULL);
}

static void test_a_shared_dataset_is_on_the_gpu_once_and_trains_as_a_loaded_one(void **state) {
    (void)state;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    umt_context *source = NULL;
    umt_dataset *data = NULL;
    assert_int_equal(umt_context_create(&co, &source), UMT_OK);
    assert_int_equal(umt_dataset_load_idx(source, scratch_path("mb-images.idx"), scratch_path("mb-labels.idx"), 10,
                                          &data),
                     UMT_OK);
    umt_pool_stats held;
    assert_int_equal(umt_pool_stats_get(source, UMT_POOL_DATASET, &held), UMT_OK);
    assert_true(held.in_use_bytes > 0);
    expect_alone_bits(UMT_PRECISION_BF16, true, 3, data);
    umt_pool_stats after;
    assert_int_equal(umt_pool_stats_get(source, UMT_POOL_DATASET, &after), UMT_OK);
    assert_int_equal(after.peak_bytes, held.peak_bytes);
    umt_context_destroy(source);
}

/* Each run alone, then all of them as one step group from one thread: one graph with a branch
 * per run, captured once after the warm-up and replayed; the same bits. */
static void test_bf16_steps_in_one_group_graph_give_the_bits_each_gives_alone(void **state) {
    (void)state;
    mb_run alone_runs[MOST_RUNS], runs[MOST_RUNS];
    sweep_runs(alone_runs, MOST_RUNS, UMT_PRECISION_BF16, true, NULL);
    sweep_runs(runs, MOST_RUNS, UMT_PRECISION_BF16, true, NULL);
    mb_result alone[MOST_RUNS], grouped[MOST_RUNS];
    for (int i = 0; i < MOST_RUNS; ++i) mb_train(&alone_runs[i], scratch_folder(), &alone[i]);
    umt_step_graph_stats stats;
    mb_train_grouped(runs, MOST_RUNS, scratch_folder(), grouped, &stats);
    assert_int_equal(stats.captures, 1);
    assert_int_equal(stats.replayed_steps, MB_STEPS - 2);
    for (int i = 0; i < MOST_RUNS; ++i) {
        char what[64];
        snprintf(what, sizeof what, "bf16 run %d of %d in one group graph", i + 1, MOST_RUNS);
        mb_expect_same_bits(&alone[i], &grouped[i], what);
        assert_int_equal(grouped[i].replayed_steps, MB_STEPS - 2);
        free(alone[i].params);
        free(grouped[i].params);
    }
}

static int make_data(void **state) {
    (void)state;
    if (setenv("UMT_CONV_TIMING", "0", 1) != 0 || scratch_make("contexts_gpu")) return -1;
    mb_write_data();
    return 0;
}

static int remove_data(void **state) {
    (void)state;
    return scratch_remove();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_trainings_on_threads_at_once_give_the_bits_each_gives_alone),
        cmocka_unit_test(test_bf16_step_graphs_on_threads_at_once_give_the_bits_each_gives_alone),
        cmocka_unit_test(test_a_shared_dataset_is_on_the_gpu_once_and_trains_as_a_loaded_one),
        cmocka_unit_test(test_bf16_steps_in_one_group_graph_give_the_bits_each_gives_alone),
    };
    return cmocka_run_group_tests(tests, make_data, remove_data);
}
