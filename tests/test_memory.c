/*
 * tests/test_memory.c — the pools: where tensors come from, arena reset and merge, statistics,
 * alignment, and clear refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "memory/budget.h"
#include "memory/pool.h"
#include "umtrain.h"

static void test_every_pool_has_a_policy_row_with_its_own_name(void **state) {
    (void)state;
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        const umt_pool_policy *row = umt_pool_policy_of((umt_pool)p);
        assert_non_null(row);
        assert_int_equal(row->pool, p);
        for (int q = 0; q < p; ++q) assert_string_not_equal(row->name, umt_pool_name((umt_pool)q));
    }
    assert_string_equal(umt_pool_name(UMT_POOL_ACTIVATIONS), "activations");
    assert_null(umt_pool_policy_of(UMT_POOL_COUNT));
}

static void test_allocations_are_aligned_and_counted(void **state) {
    (void)state;
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    void *a, *b;
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_WEIGHTS, 10, &a), UMT_OK);
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_WEIGHTS, 1000, &b), UMT_OK);
    assert_int_equal((uintptr_t)a % UMT_POOL_ALIGN, 0);
    assert_int_equal((uintptr_t)b % UMT_POOL_ALIGN, 0);
    umt_pool_stats s;
    umt_memory_stats(&mem, UMT_POOL_WEIGHTS, &s);
    assert_int_equal(s.allocations, 2);
    assert_int_equal(s.in_use_bytes, 256 + 1024);
    umt_memory_free(&mem, UMT_POOL_WEIGHTS, a);
    umt_memory_stats(&mem, UMT_POOL_WEIGHTS, &s);
    assert_int_equal(s.in_use_bytes, 1024);
    assert_int_equal(s.peak_bytes, 256 + 1024);
    umt_memory_release(&mem);
}

static void test_zero_byte_request_is_refused_naming_the_pool(void **state) {
    (void)state;
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    void *p = (void *)1;
    assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_GRADS, 0, &p), UMT_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_non_null(strstr(umt_last_error(), "grads"));
    umt_memory_release(&mem);
}

static void test_arena_overflow_is_merged_into_one_block_at_reset(void **state) {
    (void)state;
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    void *p;
    /* 3 MiB in 1 MiB pieces: the arena must grow past its first block within the step. */
    for (int i = 0; i < 3; ++i) assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_ACTIVATIONS, 1 << 20, &p), UMT_OK);
    assert_true(mem.pools[UMT_POOL_ACTIVATIONS].block_count > 1);
    assert_int_equal(umt_memory_reset(&mem, UMT_POOL_ACTIVATIONS), UMT_OK);
    assert_int_equal(mem.pools[UMT_POOL_ACTIVATIONS].block_count, 1);
    umt_pool_stats s;
    umt_memory_stats(&mem, UMT_POOL_ACTIVATIONS, &s);
    assert_int_equal(s.in_use_bytes, 0);
    assert_true(s.capacity_bytes >= 3u << 20);
    /* The next step of the same size fits in the merged block: no new block. */
    for (int i = 0; i < 3; ++i) assert_int_equal(umt_memory_alloc(&mem, UMT_POOL_ACTIVATIONS, 1 << 20, &p), UMT_OK);
    assert_int_equal(mem.pools[UMT_POOL_ACTIVATIONS].block_count, 1);
    umt_memory_stats(&mem, UMT_POOL_ACTIVATIONS, &s);
    assert_int_equal(s.peak_bytes, 3u << 20);
    umt_memory_release(&mem);
}

/* With recycling on (the offload tier's activations), the recorded step hands out again the
 * bytes whose life ended, so it needs about what the plan will; re-recording forgets the plan. */
static void test_recorded_step_recycles_ended_bytes_and_rerecord_forgets_the_plan(void **state) {
    (void)state;
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    umt_memory_set_recycle(&mem, UMT_POOL_ACTIVATIONS, true);
    void *a, *b, *c;
    int slot_a, slot_b, slot_c;
    assert_int_equal(umt_memory_alloc_slot(&mem, UMT_POOL_ACTIVATIONS, 4 << 20, &a, &slot_a), UMT_OK);
    assert_int_equal(umt_memory_alloc_slot(&mem, UMT_POOL_ACTIVATIONS, 4 << 20, &b, &slot_b), UMT_OK);
    umt_memory_end_of_life(&mem, UMT_POOL_ACTIVATIONS, slot_a);
    /* A smaller request takes the front of a's bytes, a larger one cannot. */
    assert_int_equal(umt_memory_alloc_slot(&mem, UMT_POOL_ACTIVATIONS, 1 << 20, &c, &slot_c), UMT_OK);
    assert_ptr_equal(c, a);
    void *d;
    int slot_d;
    assert_int_equal(umt_memory_alloc_slot(&mem, UMT_POOL_ACTIVATIONS, 8 << 20, &d, &slot_d), UMT_OK);
    assert_true((char *)d >= (char *)b + (4 << 20) || (char *)d + (8 << 20) <= (char *)a);
    /* The plan made from that step reuses a's bytes too: its peak is below the sum of the sizes. */
    assert_int_equal(umt_memory_reset(&mem, UMT_POOL_ACTIVATIONS), UMT_OK);
    umt_pool_stats s;
    umt_memory_stats(&mem, UMT_POOL_ACTIVATIONS, &s);
    assert_true(s.planned_peak_bytes < s.planned_total_bytes);
    umt_memory_rerecord(&mem, UMT_POOL_ACTIVATIONS);
    assert_false(mem.pools[UMT_POOL_ACTIVATIONS].plan.planned);
    /* Recorded afresh from offset 0 of the block the plan left, with slots again. */
    assert_int_equal(umt_memory_alloc_slot(&mem, UMT_POOL_ACTIVATIONS, 1 << 20, &a, &slot_a), UMT_OK);
    assert_int_equal(slot_a, 0);
    assert_ptr_equal(a, mem.pools[UMT_POOL_ACTIVATIONS].blocks[0].ptr);
    umt_memory_release(&mem);
}

static void test_parameters_live_in_weights_and_gradients_in_grads(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_tensor *w = umt_parameter_new(ctx, "w", 2, (int64_t[]){3, 4});
    assert_non_null(w);
    assert_int_equal(umt_tensor_pool(w), UMT_POOL_WEIGHTS);
    assert_int_equal(umt_tensor_device(w), UMT_DEVICE_CPU);
    assert_int_equal(umt_tensor_pool(umt_tensor_grad(w)), UMT_POOL_GRADS);
    assert_string_equal(umt_tensor_name(w), "w");
    assert_int_equal(umt_parameter_count(ctx), 1);
    umt_step_begin(ctx);
    umt_tensor *y = umt_relu(ctx, w);
    assert_int_equal(umt_tensor_pool(y), UMT_POOL_ACTIVATIONS);
    umt_tensor_free(w);
    assert_int_equal(umt_parameter_count(ctx), 0);
    umt_pool_stats s;
    umt_pool_stats_get(ctx, UMT_POOL_GRADS, &s);
    assert_int_equal(s.in_use_bytes, 0);
    umt_context_destroy(ctx);
}

static void test_bad_shapes_are_refused_with_the_dimension(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    assert_null(umt_tensor_new_2d(ctx, UMT_POOL_WEIGHTS, UMT_F32, 3, 0));
    assert_non_null(strstr(umt_last_error(), "dimension 1 is 0"));
    assert_null(umt_tensor_new(ctx, UMT_POOL_WEIGHTS, UMT_F32, 5, (int64_t[]){1, 1, 1, 1, 1}));
    assert_non_null(strstr(umt_last_error(), "rank 5"));
    assert_null(umt_tensor_new_2d(ctx, UMT_POOL_WEIGHTS, UMT_F32, INT64_MAX / 2, 1024));
    assert_non_null(strstr(umt_last_error(), "too large"));
    umt_context_destroy(ctx);
}

static void test_conversion_to_bf16_and_back_keeps_representable_values(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    float values[4] = {1.0f, -2.5f, 0.15625f, 384.0f}, back[4];
    umt_tensor *f = umt_tensor_new_1d(ctx, UMT_POOL_WEIGHTS, UMT_F32, 4);
    umt_tensor *h = umt_tensor_new_1d(ctx, UMT_POOL_WEIGHTS, UMT_BF16, 4);
    assert_int_equal(umt_tensor_copy_from_host(f, values, sizeof values), UMT_OK);
    assert_int_equal(umt_tensor_convert(f, h), UMT_OK);
    umt_tensor_fill(f, 0.0f);
    assert_int_equal(umt_tensor_convert(h, f), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(f, back, sizeof back), UMT_OK);
    assert_memory_equal(values, back, sizeof values);
    umt_context_destroy(ctx);
}

static void test_sizes_parse_with_binary_units_and_bad_text_is_refused(void **state) {
    (void)state;
    size_t v = 0;
    assert_int_equal(umt_parse_bytes("2G", &v), UMT_OK);
    assert_int_equal(v, (size_t)2 << 30);
    assert_int_equal(umt_parse_bytes("64MiB", &v), UMT_OK);
    assert_int_equal(v, (size_t)64 << 20);
    assert_int_equal(umt_parse_bytes("512k", &v), UMT_OK);
    assert_int_equal(v, (size_t)512 << 10);
    assert_int_equal(umt_parse_bytes("1048576", &v), UMT_OK);
    assert_int_equal(v, 1048576);
    assert_int_equal(umt_parse_bytes("2X", &v), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "2X"));
    assert_int_equal(umt_parse_bytes("-1G", &v), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_parse_bytes("", &v), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_parse_bytes("99999999999T", &v), UMT_ERR_INVALID_ARGUMENT);
}

static void test_budget_is_free_memory_less_headroom_and_the_variable_only_lowers_it(void **state) {
    (void)state;
    size_t gib = (size_t)1 << 30, budget = 0;
    /* 80 GiB card, 70 GiB free: headroom 4 GiB (5%). */
    assert_int_equal(umt_budget_compute(70 * gib, 80 * gib, NULL, &budget), UMT_OK);
    assert_int_equal(budget, 66 * gib);
    assert_int_equal(umt_budget_compute(70 * gib, 80 * gib, "2G", &budget), UMT_OK);
    assert_int_equal(budget, 2 * gib);
    assert_int_equal(umt_budget_compute(70 * gib, 80 * gib, "500G", &budget), UMT_OK);
    assert_int_equal(budget, 66 * gib);
    /* Small card, almost full: the 512 MiB floor leaves nothing. */
    assert_int_equal(umt_budget_compute(gib / 4, 4 * gib, NULL, &budget), UMT_OK);
    assert_int_equal(budget, 0);
    assert_int_equal(umt_budget_compute(70 * gib, 80 * gib, "lots", &budget), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "UMT_DEVICE_BUDGET"));
}

static void test_the_convolution_workspace_limit_is_an_eighth_of_the_budget_between_256_mib_and_8_gib(void **state) {
    (void)state;
    size_t mib = (size_t)1 << 20, gib = (size_t)1 << 30;
    assert_int_equal(umt_budget_conv_workspace_limit(0), 256 * mib);
    assert_int_equal(umt_budget_conv_workspace_limit(2 * gib), 256 * mib); /* UMT_DEVICE_BUDGET=2G: as before */
    assert_int_equal(umt_budget_conv_workspace_limit(2 * gib + 8), 256 * mib + 1);
    assert_int_equal(umt_budget_conv_workspace_limit(10 * gib), 1280 * mib);
    assert_int_equal(umt_budget_conv_workspace_limit(64 * gib), 8 * gib);
    assert_int_equal(umt_budget_conv_workspace_limit(66 * gib), 8 * gib); /* an 80 GiB card, 70 GiB free */
    assert_int_equal(umt_budget_conv_workspace_limit(SIZE_MAX), 8 * gib);
}

static void test_the_hosts_available_memory_is_read_from_meminfo(void **state) {
    (void)state;
    const char *meminfo = "MemTotal:       131072000 kB\nMemFree:         2048000 kB\n"
                          "MemAvailable:   98304000 kB\nBuffers:          100000 kB\n";
    assert_int_equal(umt_meminfo_available_bytes(meminfo), (size_t)98304000 << 10);
    assert_int_equal(umt_meminfo_available_bytes("MemTotal: 1 kB\n"), 0);
    assert_int_equal(umt_meminfo_available_bytes(NULL), 0);
    /* This machine's, read now: Linux has the line. */
    assert_true(umt_host_available_bytes() > 0);
}

static void test_placement_follows_the_table_device_and_mode(void **state) {
    (void)state;
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        assert_int_equal(umt_pool_placement((umt_pool)p, UMT_DEVICE_CPU, UMT_MEM_MANAGED), UMT_PLACE_HOST);
        assert_false(umt_pool_advised((umt_pool)p, UMT_DEVICE_CPU, UMT_MEM_MANAGED));
        assert_false(umt_pool_advised((umt_pool)p, UMT_DEVICE_CUDA, UMT_MEM_MANAGED_PLAIN));
    }
    assert_int_equal(umt_pool_placement(UMT_POOL_WEIGHTS, UMT_DEVICE_CUDA, UMT_MEM_MANAGED), UMT_PLACE_MANAGED);
    assert_true(umt_pool_advised(UMT_POOL_WEIGHTS, UMT_DEVICE_CUDA, UMT_MEM_MANAGED));
    assert_int_equal(umt_pool_placement(UMT_POOL_WEIGHTS, UMT_DEVICE_CUDA, UMT_MEM_MANAGED_PLAIN), UMT_PLACE_MANAGED);
    assert_int_equal(umt_pool_placement(UMT_POOL_ACTIVATIONS, UMT_DEVICE_CUDA, UMT_MEM_DEVICE), UMT_PLACE_DEVICE);
    assert_int_equal(umt_pool_placement(UMT_POOL_STAGING, UMT_DEVICE_CUDA, UMT_MEM_DEVICE), UMT_PLACE_PINNED);
    assert_true(umt_pool_policy_of(UMT_POOL_DATASET)->advice & UMT_ADVISE_READ_MOSTLY);
}

static void test_memory_modes_and_devices_parse_by_name(void **state) {
    (void)state;
    umt_memory_mode mode;
    assert_int_equal(umt_memory_mode_parse("managed-plain", &mode), UMT_OK);
    assert_int_equal(mode, UMT_MEM_MANAGED_PLAIN);
    assert_string_equal(umt_memory_mode_name(UMT_MEM_DEVICE), "device");
    assert_int_equal(umt_memory_mode_parse("unified", &mode), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "unified"));
    umt_device device;
    assert_int_equal(umt_device_parse("cuda", &device), UMT_OK);
    assert_int_equal(device, UMT_DEVICE_CUDA);
    assert_int_equal(umt_device_parse("tpu", &device), UMT_ERR_INVALID_ARGUMENT);
}

static void test_timer_measures_elapsed_time_and_needs_a_start(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    double ms = -1;
    assert_int_equal(umt_timer_start(ctx), UMT_OK);
    struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    assert_int_equal(umt_timer_stop(ctx, &ms), UMT_OK);
    assert_true(ms >= 19.0 && ms < 5000.0);
    assert_int_equal(umt_timer_stop(ctx, NULL), UMT_ERR_INVALID_ARGUMENT);
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_pool_has_a_policy_row_with_its_own_name),
        cmocka_unit_test(test_allocations_are_aligned_and_counted),
        cmocka_unit_test(test_zero_byte_request_is_refused_naming_the_pool),
        cmocka_unit_test(test_arena_overflow_is_merged_into_one_block_at_reset),
        cmocka_unit_test(test_recorded_step_recycles_ended_bytes_and_rerecord_forgets_the_plan),
        cmocka_unit_test(test_parameters_live_in_weights_and_gradients_in_grads),
        cmocka_unit_test(test_bad_shapes_are_refused_with_the_dimension),
        cmocka_unit_test(test_conversion_to_bf16_and_back_keeps_representable_values),
        cmocka_unit_test(test_sizes_parse_with_binary_units_and_bad_text_is_refused),
        cmocka_unit_test(test_budget_is_free_memory_less_headroom_and_the_variable_only_lowers_it),
        cmocka_unit_test(test_the_convolution_workspace_limit_is_an_eighth_of_the_budget_between_256_mib_and_8_gib),
        cmocka_unit_test(test_the_hosts_available_memory_is_read_from_meminfo),
        cmocka_unit_test(test_placement_follows_the_table_device_and_mode),
        cmocka_unit_test(test_memory_modes_and_devices_parse_by_name),
        cmocka_unit_test(test_timer_measures_elapsed_time_and_needs_a_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
