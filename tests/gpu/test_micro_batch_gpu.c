/*
 * tests/gpu/test_micro_batch_gpu.c — micro-batching on a GPU (core/micro_batch.h): in fp32 a
 * step run as k micro-batches gives the whole batch's losses and parameters within float
 * rounding, with dropout off and on, eager and through a captured step graph; in bf16 and in
 * fp16 with loss scaling, within their rounding. tests/test_micro_batch.c has the CPU's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/micro_batch_run.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* fp32: the whole batch's sums in another order (cuBLAS and cuDNN on other batch sizes). */
#define FP32_WITHIN 1e-5
/* bf16 and fp16 round activations to 8 or 11 bits: the split's other sums move them by ulps. */
#define HALF_WITHIN 2e-2

static int make_data(void **state) {
    (void)state;
    if (scratch_make("micro_batch_gpu")) return -1;
    mb_write_data();
    return 0;
}

static int remove_data(void **state) {
    (void)state;
    return scratch_remove();
}

static mb_run gpu_run(umt_precision precision, int micro_batches, float dropout, bool graph) {
    return (mb_run){.device = UMT_DEVICE_CUDA, .precision = precision, .micro_batches = micro_batches,
                    .dropout = dropout, .graph = graph, .optimizer = UMT_OPT_SGD};
}

static void compare(mb_run whole_run, mb_run split_run, double within, const char *what) {
    mb_result whole, split;
    mb_train(&whole_run, scratch_folder(), &whole);
    mb_train(&split_run, scratch_folder(), &split);
    mb_expect_close(&whole, &split, within, what);
    if (!whole_run.graph && !split_run.graph) assert_int_equal(split.grad_ready_calls, whole.grad_ready_calls);
    /* A graph run launches every step after its two eager ones (the capture launched too). */
    if (whole_run.graph) assert_int_equal(whole.replayed_steps, MB_STEPS - 2);
    if (split_run.graph) assert_int_equal(split.replayed_steps, MB_STEPS - 2);
    free(whole.params);
    free(split.params);
}

static void test_fp32_micro_batches_give_the_whole_batch(void **state) {
    (void)state;
    compare(gpu_run(UMT_PRECISION_FP32, 1, 0, false), gpu_run(UMT_PRECISION_FP32, 3, 0, false), FP32_WITHIN,
            "fp32, 3 micro-batches, no dropout");
    compare(gpu_run(UMT_PRECISION_FP32, 1, 0.3f, false), gpu_run(UMT_PRECISION_FP32, 5, 0.3f, false), FP32_WITHIN,
            "fp32, 5 micro-batches, dropout 0.3");
}

/* All k micro-batches in one captured graph: the replays draw the whole batch's masks too. */
static void test_fp32_micro_batches_through_the_step_graph(void **state) {
    (void)state;
    compare(gpu_run(UMT_PRECISION_FP32, 1, 0.3f, false), gpu_run(UMT_PRECISION_FP32, 4, 0.3f, true), FP32_WITHIN,
            "fp32, 4 micro-batches in a step graph, dropout 0.3");
    compare(gpu_run(UMT_PRECISION_FP32, 1, 0.3f, true), gpu_run(UMT_PRECISION_FP32, 3, 0.3f, true), FP32_WITHIN,
            "fp32, both in a step graph, dropout 0.3");
}

static void test_half_precision_micro_batches_within_their_rounding(void **state) {
    (void)state;
    compare(gpu_run(UMT_PRECISION_BF16, 1, 0.3f, true), gpu_run(UMT_PRECISION_BF16, 3, 0.3f, true), HALF_WITHIN,
            "bf16, 3 micro-batches, dropout 0.3, step graph");
    /* fp16: the loss scale multiplies each micro-batch's weighted seed; one inf check per step. */
    compare(gpu_run(UMT_PRECISION_FP16, 1, 0.3f, true), gpu_run(UMT_PRECISION_FP16, 3, 0.3f, true), HALF_WITHIN,
            "fp16 with loss scaling, 3 micro-batches, dropout 0.3, step graph");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_micro_batches_give_the_whole_batch),
        cmocka_unit_test(test_fp32_micro_batches_through_the_step_graph),
        cmocka_unit_test(test_half_precision_micro_batches_within_their_rounding),
    };
    return cmocka_run_group_tests(tests, make_data, remove_data);
}
