/*
 * tests/test_offload_plan.c — the placement planner's decisions for given sizes and budgets:
 * nothing moves when everything fits, optimizer state goes first and largest first, then
 * whole parameters (weights with their gradients), then saved activations, the double buffers
 * are counted (and the update ring, when updates run in backward), and a model that cannot fit
 * even fully offloaded is refused with the numbers; the least device bytes the stages can reach
 * (what the memory plan counts for the state the tier takes). Under bf16/fp16 a matrix weight counts its
 * compute copy too, and an update in chunks (offload/copy_ranges.h) writes a conv weight's NHWC
 * copy exactly as one update of the whole does.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/precision.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "memory/offload_plan.h"
#include "offload/copy_ranges.h"
#include "offload/host_share.h"
#include "umtrain.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* An MLP of `layers` square layers of `width` f32: per layer weights, grads, two Adam moments
 * (group = layer) and one saved activation of batch x width (group = layer). */
static int mlp_items(umt_plan_item *items, int layers, size_t width, size_t batch) {
    int n = 0;
    for (int l = 0; l < layers; ++l) {
        size_t w = width * width * 4;
        items[n++] = (umt_plan_item){"w", UMT_POOL_WEIGHTS, l, w, false, 0};
        items[n++] = (umt_plan_item){"g", UMT_POOL_GRADS, l, w, false, 0};
        items[n++] = (umt_plan_item){"m", UMT_POOL_OPTIM, l, w, false, 0};
        items[n++] = (umt_plan_item){"v", UMT_POOL_OPTIM, l, w, false, 0};
        items[n++] = (umt_plan_item){"a", UMT_POOL_ACTIVATIONS, l, batch * width * 4, false, 0};
    }
    return n;
}

static int count_offloaded(const umt_plan_item *items, int n, umt_pool pool) {
    int c = 0;
    for (int i = 0; i < n; ++i) c += items[i].pool == pool && items[i].offloaded;
    return c;
}

static void test_everything_stays_on_the_gpu_when_it_fits(void **state) {
    (void)state;
    umt_plan_item items[40];
    int n = mlp_items(items, 4, 1024, 256); /* 4 x 16 MiB per tensor: 256 MiB + activations */
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, GIB, 64 * MIB, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 0);
    assert_int_equal(plan.offloaded_bytes, 0);
    assert_int_equal(plan.weight_slot_bytes, 0);
    for (int i = 0; i < n; ++i) assert_false(items[i].offloaded);
    assert_true(plan.device_bytes <= GIB);
}

static void test_optimizer_state_goes_first_and_only_as_much_as_needed(void **state) {
    (void)state;
    umt_plan_item items[40];
    /* 4 layers of 64 MiB tensors: weights 256, grads 256, Adam 512 MiB, activations 4 MiB. */
    int n = mlp_items(items, 4, 4096, 256);
    umt_placement_plan plan;
    /* 1 GiB budget: 1040 MiB wanted, and the 128 MiB of buffers comes with the first move. */
    assert_int_equal(umt_plan_placement(items, n, GIB, 16 * MIB, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 1);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_WEIGHTS), 0);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_GRADS), 0);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_ACTIVATIONS), 0);
    int optim = count_offloaded(items, n, UMT_POOL_OPTIM);
    /* 1040 + 128 - 64 k <= 1024 needs k = 3: no more than that moves. */
    assert_int_equal(optim, 3);
    assert_int_equal(plan.weight_slot_bytes, UMT_OFFLOAD_MIN_SLOT_BYTES);
    assert_true(plan.device_bytes <= GIB);
}

static void test_largest_optimizer_state_moves_before_smaller_ones(void **state) {
    (void)state;
    umt_plan_item items[] = {
        {"small.m", UMT_POOL_OPTIM, 0, 8 * MIB, false, 0},
        {"big.m", UMT_POOL_OPTIM, 1, 512 * MIB, false, 0},
        {"big.w", UMT_POOL_WEIGHTS, 1, 128 * MIB, false, 0},
    };
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, 3, 400 * MIB, 0, false, &plan), UMT_OK);
    assert_false(items[0].offloaded);
    assert_true(items[1].offloaded);
    assert_false(items[2].offloaded);
}

static void test_weights_and_gradients_move_together_after_all_optimizer_state(void **state) {
    (void)state;
    umt_plan_item items[60];
    /* 8 layers of 8192 x 8192: 256 MiB per tensor, 8 GiB of state in all, against 2 GiB. */
    int n = mlp_items(items, 8, 8192, 1024);
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 64 * MIB, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 2);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_OPTIM), 16);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_ACTIVATIONS), 0);
    /* A parameter's weights and gradient are always on the same side. */
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_WEIGHTS) assert_int_equal(items[i].offloaded, items[i + 1].offloaded);
    /* Buffers of one layer's weights + grads each; 2 GiB holds 2 x 512 MiB of buffers, 256 MiB
     * of activations, 64 MiB fixed and one resident layer (512 MiB) at most. */
    assert_int_equal(plan.weight_slot_bytes, 512 * MIB);
    assert_true(count_offloaded(items, n, UMT_POOL_WEIGHTS) >= 7);
    assert_true(plan.device_bytes <= 2 * GIB);
    assert_true(plan.offloaded_bytes >= 6 * GIB);
}

/* Equal sizes: state and weights of the last layers go first, the first layer's stay (its
 * update ends backward, its weights start forward); saved activations of the first layers go first. */
static void test_equal_sizes_move_the_last_parameters_and_the_first_activations_first(void **state) {
    (void)state;
    umt_plan_item items[60];
    int n = mlp_items(items, 4, 4096, 256); /* 64 MiB per tensor, 4 MiB of activations a layer */
    umt_placement_plan plan;
    /* Stage 1: 1040 MiB of tensors and 128 MiB of buffers in 920 MiB: four of the eight moments go. */
    assert_int_equal(umt_plan_placement(items, n, 920 * MIB, 0, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 1);
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_OPTIM) assert_int_equal(items[i].offloaded, items[i].group >= 2);
    /* Stage 2: all state out, then the layers from the last: layers 2 and 3 stream, 0 and 1 stay. */
    assert_int_equal(umt_plan_placement(items, n, 600 * MIB, 0, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 2);
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_WEIGHTS) assert_int_equal(items[i].offloaded, items[i].group >= 2);
    /* Stage 3 (64 MiB of activations a layer at batch 4096): in 450 MiB the first three layers' go. */
    n = mlp_items(items, 4, 4096, 4096);
    assert_int_equal(umt_plan_placement(items, n, 450 * MIB, 0, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 3);
    int out = count_offloaded(items, n, UMT_POOL_ACTIVATIONS);
    assert_int_equal(out, 3);
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_ACTIVATIONS) assert_int_equal(items[i].offloaded, items[i].group < out);
}

/* Updates in backward, weights streaming anyway: the first layer stays whole on the GPU when
 * streaming one more layer pays for its state; without room for that, the order stands. */
static void test_updates_in_backward_keep_the_first_layer_whole_when_there_is_room(void **state) {
    (void)state;
    umt_plan_item items[60];
    int n = mlp_items(items, 8, 8192, 512); /* 256 MiB per tensor */
    umt_placement_plan plan;
    /* 3 GiB: updates after backward keep three layers' weights and gradients, with all state out. */
    assert_int_equal(umt_plan_placement(items, n, 3 * GIB, 64 * MIB, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 2);
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_WEIGHTS || items[i].pool == UMT_POOL_OPTIM)
            assert_int_equal(items[i].offloaded, items[i].pool == UMT_POOL_OPTIM || items[i].group >= 3);
    /* In backward: layer 0 whole and layer 1's weights and gradients, the rest streamed. */
    assert_int_equal(umt_plan_placement(items, n, 3 * GIB, 64 * MIB, true, &plan), UMT_OK);
    assert_int_equal(plan.stage, 2);
    assert_true(plan.device_bytes <= 3 * GIB);
    for (int i = 0; i < n; ++i) {
        if (items[i].pool == UMT_POOL_ACTIVATIONS) continue;
        bool expected = items[i].group == 0 ? false : items[i].group == 1 ? items[i].pool == UMT_POOL_OPTIM : true;
        assert_int_equal(items[i].offloaded, expected);
    }
    /* 2 GiB keeps one layer's weights and gradients, which cannot hold its state too. */
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 64 * MIB, true, &plan), UMT_OK);
    for (int i = 0; i < n; ++i)
        if (items[i].pool != UMT_POOL_ACTIVATIONS)
            assert_int_equal(items[i].offloaded, items[i].pool == UMT_POOL_OPTIM || items[i].group >= 1);
}

static void test_updates_in_backward_count_the_ring_once_anything_is_offloaded(void **state) {
    (void)state;
    umt_plan_item items[60];
    int n = mlp_items(items, 8, 8192, 1024);
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 64 * MIB, true, &plan), UMT_OK);
    assert_int_equal(plan.stage, 2);
    /* Adam: weights and two moments per entry. */
    assert_int_equal(plan.ring_chunk_bytes, UMT_OFFLOAD_RING_CHUNK_BYTES); /* a sixteenth of 512 MiB is more */
    assert_int_equal(plan.ring_bytes, 3 * UMT_OFFLOAD_RING_ENTRIES * UMT_OFFLOAD_RING_CHUNK_BYTES);
    size_t with_ring = plan.device_bytes;
    assert_true(with_ring <= 2 * GIB);
    int streamed = count_offloaded(items, n, UMT_POOL_WEIGHTS);
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 64 * MIB, false, &plan), UMT_OK);
    assert_int_equal(plan.ring_bytes, 0);
    /* The ring's bytes come from what could stay resident: never fewer layers streamed. */
    assert_true(streamed >= count_offloaded(items, n, UMT_POOL_WEIGHTS));
    /* Optimizer state alone offloaded (stage 1): resident layers' state comes through the ring,
     * in chunks of a sixteenth of the smallest slot (4 MiB): 16 fixed + 1040 + 128 + 48 - 64 k <=
     * 1024 needs k = 4 moments offloaded, one more than without the ring. */
    n = mlp_items(items, 4, 4096, 256);
    assert_int_equal(umt_plan_placement(items, n, GIB, 16 * MIB, true, &plan), UMT_OK);
    assert_int_equal(plan.stage, 1);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_OPTIM), 4);
    assert_int_equal(plan.ring_chunk_bytes, UMT_OFFLOAD_MIN_SLOT_BYTES / 16);
    assert_int_equal(plan.ring_bytes, 3 * UMT_OFFLOAD_RING_ENTRIES * UMT_OFFLOAD_MIN_SLOT_BYTES / 16);
    /* Nothing offloaded: no ring. */
    n = mlp_items(items, 4, 1024, 256);
    assert_int_equal(umt_plan_placement(items, n, GIB, 64 * MIB, true, &plan), UMT_OK);
    assert_int_equal(plan.stage, 0);
    assert_int_equal(plan.ring_bytes, 0);
}

/* big_mlp's sizes with a 352 MiB reserve (fixed), as at UMT_DEVICE_BUDGET=budget: the plan and its
 * ring deepened. */
static void deepened(umt_plan_item *items, size_t budget, umt_placement_plan *plan) {
    int n = mlp_items(items, 8, 8192, 512);
    assert_int_equal(umt_plan_placement(items, n, budget, 352 * MIB, true, plan), UMT_OK);
    assert_int_equal(plan->ring_entries, UMT_OFFLOAD_RING_ENTRIES);
    umt_plan_deepen_ring(plan);
    assert_true(plan->device_bytes <= budget);
    assert_int_equal(plan->ring_bytes, 3 * (size_t)plan->ring_entries * plan->ring_chunk_bytes);
}

static void test_the_ring_deepens_with_what_the_budget_leaves_and_no_further(void **state) {
    (void)state;
    umt_plan_item items[60];
    umt_placement_plan plan;
    /* 2 GiB: every layer streamed, 0.42 GiB left: room for more entries than the most. */
    deepened(items, 2 * GIB, &plan);
    assert_int_equal(plan.ring_entries, UMT_OFFLOAD_RING_MAX_ENTRIES);
    size_t device = plan.device_bytes;
    umt_plan_deepen_ring(&plan); /* once only */
    assert_int_equal(plan.device_bytes, device);
    /* Room for two entries less a byte beside the plan's own needs: one more entry. */
    size_t entry = 3 * UMT_OFFLOAD_RING_CHUNK_BYTES;
    size_t needs = plan.device_bytes - (size_t)(UMT_OFFLOAD_RING_MAX_ENTRIES - UMT_OFFLOAD_RING_ENTRIES) * entry;
    deepened(items, needs + 2 * entry - 1, &plan);
    assert_int_equal(plan.ring_entries, UMT_OFFLOAD_RING_ENTRIES + 1);
    assert_int_equal(plan.device_bytes, needs + entry);
    /* Nothing streamed, no ring: nothing to deepen. */
    int n = mlp_items(items, 4, 1024, 256);
    assert_int_equal(umt_plan_placement(items, n, GIB, 64 * MIB, true, &plan), UMT_OK);
    umt_plan_deepen_ring(&plan);
    assert_int_equal(plan.ring_entries, 0);
    assert_int_equal(plan.ring_bytes, 0);
}

static void test_the_cpu_share_balances_its_time_against_the_link(void **state) {
    (void)state;
    /* Adam (two states) at 4 G elements/s against 50 GB/s each way: 12 R / (B + 8 R) = 48 / 82. */
    double share = umt_plan_host_share(4e9, 50e9, 2);
    assert_float_equal(share, 48.0 / 82.0, 1e-12);
    /* At that share the CPU's seconds per element streamed equal the link's. */
    assert_float_equal(share / 4e9, 4 * (3 * (1 - share) + share) / 50e9, 1e-21);
    /* SGD with momentum (one state): 8 R / (B + 4 R). */
    assert_float_equal(umt_plan_host_share(1e9, 20e9, 1), 8.0 / 24.0, 1e-12);
    /* A CPU faster than the link can use: all of it; no rate measured: none. */
    assert_float_equal(umt_plan_host_share(1e12, 10e9, 2), 1.0, 0);
    assert_float_equal(umt_plan_host_share(0, 50e9, 2), 0.0, 0);
    assert_float_equal(umt_plan_host_share(4e9, 0, 2), 0.0, 0);
}

/* umt_host_memory_least_seconds against what it must give at the edges, and against a fine scan of
 * T(x) on the H100 host's figures of docs/PERF.md (131.6 ms for batch 512's work). */
static double scanned_least(const umt_host_memory_speed *s, double e, double b) {
    double most = e / s->cpu_beside_link > b / (s->link_beside_cpu_gbps * 1e9) ? e / s->cpu_beside_link
                                                                               : b / (s->link_beside_cpu_gbps * 1e9);
    double least = 1e30;
    for (int i = 0; i <= 100000; ++i) {
        double x = most * i / 100000, cpu = e - s->cpu_beside_link * x, link = b - s->link_beside_cpu_gbps * 1e9 * x;
        double t = x + (cpu > 0 ? cpu / s->cpu_alone : 0) + (link > 0 ? link / (s->link_alone_gbps * 1e9) : 0);
        if (t < least) least = t;
    }
    return least;
}

static void test_the_least_time_of_shared_host_memory_lies_between_overlap_and_turns(void **state) {
    (void)state;
    double t = 0;
    /* Neither slows the other: the larger side alone. */
    umt_host_memory_speed free_ = {.cpu_alone = 4e9, .cpu_beside_link = 4e9, .link_alone_gbps = 90,
                                   .link_beside_cpu_gbps = 90, .update_bytes = 30};
    assert_int_equal(umt_host_memory_least_seconds(&free_, 0.4e9, 7.2e9, &t), UMT_OK);
    assert_float_equal(t, 0.1, 1e-12);
    /* Both at once much slower than taking turns: one side after the other. */
    umt_host_memory_speed turns = {.cpu_alone = 4e9, .cpu_beside_link = 1e8, .link_alone_gbps = 90,
                                   .link_beside_cpu_gbps = 2, .update_bytes = 30};
    assert_int_equal(umt_host_memory_least_seconds(&turns, 0.4e9, 7.2e9, &t), UMT_OK);
    assert_float_equal(t, 0.1 + 0.08, 1e-12);
    /* The H100 host's figures: between the two, equal to the scan. */
    umt_host_memory_speed h100 = {.cpu_alone = 3.46e9, .cpu_beside_link = 2.33e9, .link_alone_gbps = 98.0,
                                  .link_beside_cpu_gbps = 68.6, .update_bytes = 30};
    assert_int_equal(umt_host_memory_least_seconds(&h100, 0.336e9, 7.25e9, &t), UMT_OK);
    assert_float_equal(t, scanned_least(&h100, 0.336e9, 7.25e9), 1e-6);
    assert_float_equal(t, 0.1316, 5e-5);
    assert_true(t > 0.336e9 / 3.46e9 && t < 0.336e9 / 3.46e9 + 7.25e9 / 98e9);
    /* No CPU work: the link alone. */
    assert_int_equal(umt_host_memory_least_seconds(&h100, 0, 7.25e9, &t), UMT_OK);
    assert_float_equal(t, 7.25e9 / 98e9, 1e-12);
    /* A rate not measured, negative work, a missing argument: refused, naming it. */
    h100.link_beside_cpu_gbps = 0;
    assert_int_equal(umt_host_memory_least_seconds(&h100, 1, 1, &t), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "link_beside_cpu_gbps 0"));
    assert_int_equal(umt_host_memory_least_seconds(&free_, -1, 1, &t), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "elements -1"));
    assert_int_equal(umt_host_memory_least_seconds(&free_, 1, 1, NULL), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "seconds"));
}

/* Runs the count search on step times of the form (count - best)^2 + 100 ms; the counts timed,
 * in order, go to timed (the search's count when it settles is returned). */
static int search(int first, int most, int best, int *timed, int *steps) {
    umt_host_count_search s = umt_plan_host_search_start(first, most);
    *steps = 0;
    while (s.direction && *steps < 32) {
        timed[(*steps)++] = s.count;
        umt_plan_host_search_step(&s, (s.count - best) * (s.count - best) + 100.0);
    }
    return s.count;
}

static void test_the_cpu_count_is_searched_from_the_share_to_the_fastest(void **state) {
    (void)state;
    int timed[32], steps;
    /* Up from the share's 3 while faster: 3, 4, 5, then 6 is slower. */
    assert_int_equal(search(3, 8, 5, timed, &steps), 5);
    assert_int_equal(steps, 4);
    assert_int_equal(timed[0], 3);
    assert_int_equal(timed[3], 6);
    /* The first step up slower: down instead, 2, 1, and 0 is slower. */
    assert_int_equal(search(3, 8, 1, timed, &steps), 1);
    assert_int_equal(steps, 5);
    assert_int_equal(timed[1], 4);
    assert_int_equal(timed[2], 2);
    /* At the ends: all of them, none. */
    assert_int_equal(search(8, 8, 8, timed, &steps), 8);
    assert_int_equal(steps, 2); /* 8, then 7 */
    assert_int_equal(search(0, 8, 0, timed, &steps), 0);
    assert_int_equal(steps, 2); /* 0, then 1 */
    /* A share past the streamed parameters starts at the most; nothing streamed, nothing to search. */
    assert_int_equal(umt_plan_host_search_start(12, 8).count, 8);
    assert_int_equal(umt_plan_host_search_start(0, 0).direction, 0);
}

static void test_small_parameters_are_never_streamed(void **state) {
    (void)state;
    umt_plan_item items[8];
    int n = 0;
    for (int l = 0; l < 3; ++l) { /* three layers of 128 MiB weights and gradients */
        items[n++] = (umt_plan_item){"fc.weight", UMT_POOL_WEIGHTS, l, 128 * MIB, false, 0};
        items[n++] = (umt_plan_item){"fc.weight", UMT_POOL_GRADS, l, 128 * MIB, false, 0};
    }
    items[n++] = (umt_plan_item){"fc.bias", UMT_POOL_WEIGHTS, 3, 256 * 1024, false, 0};
    items[n++] = (umt_plan_item){"fc.bias", UMT_POOL_GRADS, 3, 256 * 1024, false, 0};
    umt_placement_plan plan;
    /* 768.5 MiB wanted in 700: every layer goes (2 x 256 MiB of buffers), the bias stays. */
    assert_int_equal(umt_plan_placement(items, n, 700 * MIB, 0, false, &plan), UMT_OK);
    for (int i = 0; i < 6; ++i) assert_true(items[i].offloaded);
    assert_false(items[6].offloaded || items[7].offloaded);
    assert_int_equal(plan.device_bytes, 512 * MIB + 512 * 1024);
    /* A budget that would need the bias streamed too is refused instead. */
    assert_int_equal(umt_plan_placement(items, n, 512 * MIB, 0, false, &plan), UMT_ERR_BUDGET);
}

static void test_saved_activations_move_last(void **state) {
    (void)state;
    umt_plan_item items[60];
    /* 4 layers of 4096 (64 MiB per tensor) with 256 MiB of activations per layer at batch 16384. */
    int n = mlp_items(items, 4, 4096, 16384);
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, GIB, 0, false, &plan), UMT_OK);
    assert_int_equal(plan.stage, 3);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_OPTIM), 8);
    assert_int_equal(count_offloaded(items, n, UMT_POOL_WEIGHTS), 4);
    assert_true(count_offloaded(items, n, UMT_POOL_ACTIVATIONS) >= 1);
    assert_int_equal(plan.activation_slot_bytes, 256 * MIB);
    assert_true(plan.device_bytes <= GIB);
}

static void test_a_model_that_cannot_fit_even_offloaded_is_refused_with_the_numbers(void **state) {
    (void)state;
    umt_plan_item items[40];
    /* One layer's weights + grads (2 x 256 MiB) doubled is 1 GiB of buffers: not in 512 MiB. */
    int n = mlp_items(items, 2, 8192, 64);
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, 512 * MIB, 0, false, &plan), UMT_ERR_BUDGET);
    const char *msg = umt_last_error();
    assert_non_null(strstr(msg, "536870912"));       /* the budget */
    assert_non_null(strstr(msg, "two weight buffers of 536870912")); /* what a buffer needs */
    for (int i = 0; i < n; ++i) assert_true(items[i].offloaded);
}

/* The state items of mlp_items (no activations). */
static int state_items(umt_plan_item *items, int layers, size_t width) {
    umt_plan_item all[80];
    int n = mlp_items(all, layers, width, 1), kept = 0;
    for (int i = 0; i < n; ++i)
        if (all[i].pool != UMT_POOL_ACTIVATIONS) items[kept++] = all[i];
    return kept;
}

static void test_the_least_device_bytes_are_the_smallest_the_stages_pass_through(void **state) {
    (void)state;
    umt_plan_item items[40];
    /* 4 layers of 16 MiB tensors: 256 MiB on the GPU; streamed, every layer leaves only the two
     * smallest buffers (64 MiB each). */
    int n = state_items(items, 4, 2048);
    assert_int_equal(umt_plan_least_device_bytes(items, n, false), 2 * UMT_OFFLOAD_MIN_SLOT_BYTES);
    /* One layer of 200 MiB tensors: its optimizer state out (and the two buffers it streams
     * through) is the least; streaming the layer would take two buffers of 400 MiB. */
    umt_plan_item big[4] = {{"w", UMT_POOL_WEIGHTS, 0, 200 * MIB, false, 0}, {"g", UMT_POOL_GRADS, 0, 200 * MIB, false, 0},
                            {"m", UMT_POOL_OPTIM, 0, 200 * MIB, false, 0}, {"v", UMT_POOL_OPTIM, 0, 200 * MIB, false, 0}};
    assert_int_equal(umt_plan_least_device_bytes(big, 4, false), 400 * MIB + 2 * UMT_OFFLOAD_MIN_SLOT_BYTES);
    /* A small model: the tier's buffers would cost more than all of it, which stays the least. */
    size_t kib256 = 256 * 1024;
    umt_plan_item small[4] = {{"w", UMT_POOL_WEIGHTS, 0, kib256, false, 0}, {"g", UMT_POOL_GRADS, 0, kib256, false, 0},
                              {"m", UMT_POOL_OPTIM, 0, kib256, false, 0}, {"v", UMT_POOL_OPTIM, 0, kib256, false, 0}};
    assert_int_equal(umt_plan_least_device_bytes(small, 4, false), MIB);
    /* The planner reaches it: at that budget it finds a placement. */
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(big, 4, 400 * MIB + 2 * UMT_OFFLOAD_MIN_SLOT_BYTES, 0, false, &plan), UMT_OK);
    assert_int_equal(umt_plan_placement(big, 4, 400 * MIB + 2 * UMT_OFFLOAD_MIN_SLOT_BYTES - 1, 0, false, &plan),
                     UMT_ERR_BUDGET);
}

static void test_the_plan_prints_one_line_per_pool_with_its_counts(void **state) {
    (void)state;
    umt_plan_item items[60];
    int n = mlp_items(items, 8, 8192, 1024);
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 64 * MIB, false, &plan), UMT_OK);
    char buf[4096] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    umt_plan_print(f, items, n, &plan);
    fclose(f);
    print_message("%s", buf);
    assert_non_null(strstr(buf, "optim"));
    assert_non_null(strstr(buf, "       0        0.000       16        4.000")); /* optim: 0 on GPU, 16 offloaded */
    assert_non_null(strstr(buf, "weights"));
    assert_non_null(strstr(buf, "activations"));
    assert_non_null(strstr(buf, "streaming buffers 2 x 0.500 GiB"));
}

static void test_items_of_other_pools_are_refused(void **state) {
    (void)state;
    umt_plan_item items[] = {{"staging", UMT_POOL_STAGING, 0, MIB, false, 0}};
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, 1, GIB, 0, false, &plan), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "staging"));
}

/* ----------------------------------------------------------------------------------------- */
/* Compute copies (offload/copy_ranges.h) */

static umt_tensor weight_of(int ndim, const int64_t *shape, umt_pool kind) {
    umt_tensor t = {.dtype = UMT_F32, .ndim = ndim, .numel = 1, .kind_pool = kind, .pool = UMT_POOL_OFFLOAD};
    for (int d = 0; d < ndim; ++d) t.shape[d] = shape[d], t.numel *= shape[d];
    t.bytes = (size_t)t.numel * 4;
    return t;
}

static void test_half_precision_plans_count_a_matrix_weights_compute_copy(void **state) {
    (void)state;
    umt_tensor matrix = weight_of(2, (int64_t[]){8, 16}, UMT_POOL_WEIGHTS);
    umt_tensor conv = weight_of(4, (int64_t[]){4, 3, 3, 3}, UMT_POOL_WEIGHTS);
    umt_tensor bias = weight_of(1, (int64_t[]){16}, UMT_POOL_WEIGHTS);
    umt_tensor grad = weight_of(2, (int64_t[]){8, 16}, UMT_POOL_GRADS);
    assert_int_equal(umt_offload_plan_bytes(UMT_F32, &matrix), 512);
    assert_int_equal(umt_offload_plan_bytes(UMT_BF16, &matrix), 512 + 256);
    assert_int_equal(umt_offload_plan_bytes(UMT_F16, &conv), 432 + 216);
    assert_int_equal(umt_offload_plan_bytes(UMT_BF16, &bias), 64);  /* read in f32: no copy */
    assert_int_equal(umt_offload_plan_bytes(UMT_BF16, &grad), 512); /* gradients stay f32 */
    /* Only the copy streams: a slot holds it, not the master. */
    assert_int_equal(umt_compute_copy_bytes(UMT_BF16, &matrix), 256);
    assert_int_equal(umt_compute_copy_bytes(UMT_F32, &matrix), 0);
    assert_int_equal(umt_compute_copy_bytes(UMT_BF16, &bias), 0);
    assert_int_equal(umt_compute_copy_bytes(UMT_BF16, &grad), 0);
}

/* big_mlp in bf16 with updates in backward at 2 GiB, and 1.5 GiB held besides (the saved
 * activations' reserve of batch 2048): a slot holds a streamed weight's bf16 copy (128 MiB) and
 * its f32 gradient (256 MiB), not the master too. Counting the master made two slots of 640 MiB,
 * past the budget with the ring, and the plan refused a step that fits. */
static void test_half_precision_slots_hold_the_compute_copy_not_the_master(void **state) {
    (void)state;
    umt_plan_item items[60];
    int n = mlp_items(items, 8, 8192, 0);
    for (int i = 0; i < n; ++i)
        if (items[i].pool == UMT_POOL_WEIGHTS) {
            items[i].stream_bytes = items[i].bytes / 2;
            items[i].bytes += items[i].stream_bytes;
        }
    umt_placement_plan plan;
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 640 * MIB, true, &plan), UMT_OK);
    assert_int_equal(plan.weight_slot_bytes, 384 * MIB);
    assert_true(plan.device_bytes <= 2 * GIB);
    for (int i = 0; i < n; ++i) items[i].stream_bytes = 0;
    assert_int_equal(umt_plan_placement(items, n, 2 * GIB, 640 * MIB, true, &plan), UMT_ERR_BUDGET);
}

/* A conv weight K=5, C=3, 3x3 updated by SGD in chunks as the tier's paths cut them (a chunk of 40
 * elements rounded down to whole output channels, 27), each chunk's copy addressed by
 * umt_offload_fusion: master and K,R,S,C copy equal one update of the whole, bit for bit. */
static void test_an_update_in_chunks_writes_a_conv_weights_copy_as_one_update_does(void **state) {
    (void)state;
    enum { K = 5, C = 3, R = 3, N = K * C * R * R };
    umt_tensor copy = weight_of(4, (int64_t[]){K, C, R, R}, UMT_POOL_WEIGHTS);
    copy.dtype = UMT_BF16;
    copy.nhwc = true;
    umt_tensor p = weight_of(4, (int64_t[]){K, C, R, R}, UMT_POOL_WEIGHTS);
    p.lowp = &copy;
    float whole[N], chunked[N], grad[N];
    uint16_t copy_whole[N], copy_chunked[N];
    for (int i = 0; i < N; ++i) {
        whole[i] = chunked[i] = 0.01f * (float)((i * 37) % 101) - 0.5f;
        grad[i] = 0.3f - 0.007f * (float)i;
    }
    const umt_backend *cpu = umt_cpu_backend();
    assert_int_equal(cpu->f32.sgd_update_fused(whole, grad, NULL, N, 0.1f, 0.0f, 0.0f,
                                               umt_offload_fusion(&p, copy_whole, 0, NULL)), UMT_OK);
    int64_t chunk = 40;
    assert_int_equal(umt_offload_align_chunk(&p, &chunk), UMT_OK);
    assert_int_equal(chunk, C * R * R);
    for (int64_t offset = 0; offset < N; offset += chunk) {
        int64_t n = N - offset < chunk ? N - offset : chunk;
        umt_update_fusion f = umt_offload_fusion(&p, copy_chunked, offset, NULL);
        assert_ptr_equal(f.lowp, copy_chunked + offset);
        assert_int_equal(f.lowp_channels, C);
        assert_int_equal(f.lowp_pixels, R * R);
        assert_int_equal(cpu->f32.sgd_update_fused(chunked + offset, grad + offset, NULL, n, 0.1f, 0.0f, 0.0f, f),
                         UMT_OK);
    }
    assert_memory_equal(chunked, whole, sizeof whole);
    assert_memory_equal(copy_chunked, copy_whole, sizeof copy_whole);
    /* A chunk smaller than one output channel cannot be written a channel at a time. */
    chunk = C * R * R - 1;
    assert_int_equal(umt_offload_align_chunk(&p, &chunk), UMT_ERR_STATE);
    /* A matrix weight's copy is in the master's order: any chunk will do. */
    copy.nhwc = false;
    chunk = 40;
    assert_int_equal(umt_offload_align_chunk(&p, &chunk), UMT_OK);
    assert_int_equal(chunk, 40);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everything_stays_on_the_gpu_when_it_fits),
        cmocka_unit_test(test_optimizer_state_goes_first_and_only_as_much_as_needed),
        cmocka_unit_test(test_largest_optimizer_state_moves_before_smaller_ones),
        cmocka_unit_test(test_weights_and_gradients_move_together_after_all_optimizer_state),
        cmocka_unit_test(test_equal_sizes_move_the_last_parameters_and_the_first_activations_first),
        cmocka_unit_test(test_updates_in_backward_keep_the_first_layer_whole_when_there_is_room),
        cmocka_unit_test(test_updates_in_backward_count_the_ring_once_anything_is_offloaded),
        cmocka_unit_test(test_the_ring_deepens_with_what_the_budget_leaves_and_no_further),
        cmocka_unit_test(test_the_cpu_share_balances_its_time_against_the_link),
        cmocka_unit_test(test_the_cpu_count_is_searched_from_the_share_to_the_fastest),
        cmocka_unit_test(test_the_least_time_of_shared_host_memory_lies_between_overlap_and_turns),
        cmocka_unit_test(test_small_parameters_are_never_streamed),
        cmocka_unit_test(test_saved_activations_move_last),
        cmocka_unit_test(test_a_model_that_cannot_fit_even_offloaded_is_refused_with_the_numbers),
        cmocka_unit_test(test_the_least_device_bytes_are_the_smallest_the_stages_pass_through),
        cmocka_unit_test(test_the_plan_prints_one_line_per_pool_with_its_counts),
        cmocka_unit_test(test_items_of_other_pools_are_refused),
        cmocka_unit_test(test_half_precision_plans_count_a_matrix_weights_compute_copy),
        cmocka_unit_test(test_half_precision_slots_hold_the_compute_copy_not_the_master),
        cmocka_unit_test(test_an_update_in_chunks_writes_a_conv_weights_copy_as_one_update_does),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
