/*
 * tests/test_loader.c — the prefetching loader on the CPU device: every sample exactly once per
 * epoch in the seeded order, intact batches under a slow consumer, the pageable-sync path and
 * the GPU-resident dataset giving the same batches, augmentation, statistics, an epoch started at a
 * batch inside it (a resumed run) and bad options.
 *
 * The samples are a synthetic IDX pair the test writes: sample i's pixels spell i, so a batch
 * says which samples it holds and whether any byte of it was overwritten.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "umtrain.h"

enum { N = 103, SIDE = 4, PIXELS = SIDE * SIDE };

static char dir[64], images_path[128], labels_path[128];

/* Pixel k of sample i: i in the first two bytes, then a pattern that depends on both. */
static uint8_t pixel_of(int64_t i, int k) {
    if (k == 0) return (uint8_t)(i % 256);
    if (k == 1) return (uint8_t)(i / 256);
    return (uint8_t)((i * 31 + k * 7) % 251);
}

static void write_be32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    fwrite(b, 1, 4, f);
}

static int write_idx_pair(void) {
    FILE *f = fopen(images_path, "wb"), *g = fopen(labels_path, "wb");
    if (!f || !g) return -1;
    fwrite((uint8_t[]){0, 0, 8, 3}, 1, 4, f);
    write_be32(f, N), write_be32(f, SIDE), write_be32(f, SIDE);
    fwrite((uint8_t[]){0, 0, 8, 1}, 1, 4, g);
    write_be32(g, N);
    for (int64_t i = 0; i < N; ++i) {
        for (int k = 0; k < PIXELS; ++k) fputc(pixel_of(i, k), f);
        fputc((int)(i % 10), g);
    }
    return fclose(f) | fclose(g);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_loader_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(images_path, sizeof images_path, "%s/images-idx3-ubyte", dir);
    snprintf(labels_path, sizeof labels_path, "%s/labels-idx1-ubyte", dir);
    return write_idx_pair();
}

static int teardown(void **state) {
    (void)state;
    unlink(images_path);
    unlink(labels_path);
    return rmdir(dir);
}

/* ----------------------------------------------------------------------------------------- */
/* Helpers */

typedef struct {
    umt_context *ctx;
    umt_samples *samples;
    umt_loader *loader;
} fixture;

static fixture make(umt_loader_options o, uint64_t seed) {
    fixture f = {0};
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    co.seed = seed;
    if (umt_context_create(&co, &f.ctx) || umt_samples_load_idx(images_path, labels_path, 10, &f.samples) ||
        umt_loader_create(f.ctx, f.samples, &o, &f.loader))
        fail_msg("%s", umt_last_error());
    return f;
}

static void release(fixture *f) {
    umt_loader_destroy(f->loader);
    umt_context_destroy(f->ctx);
    umt_samples_destroy(f->samples);
}

static umt_loader_options options(int64_t batch, int depth, int workers) {
    umt_loader_options o = umt_loader_defaults();
    o.batch_size = batch;
    o.depth = depth;
    o.workers = workers;
    return o;
}

/* Checks every pixel and the label of each row of a batch (mean 0, std 1: v/255) and returns
 * the sample indices in it. */
static int64_t batch_indices(umt_tensor *images, umt_tensor *labels, int64_t *out) {
    int64_t n = umt_tensor_dim(images, 0);
    float x[64 * PIXELS];
    int32_t y[64];
    assert_true(n <= 64);
    assert_int_equal(umt_tensor_copy_to_host(images, x, (size_t)(n * PIXELS) * sizeof *x), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(labels, y, (size_t)n * sizeof *y), UMT_OK);
    for (int64_t r = 0; r < n; ++r) {
        int64_t i = (int64_t)(x[r * PIXELS] * 255.0f + 0.5f) + 256 * (int64_t)(x[r * PIXELS + 1] * 255.0f + 0.5f);
        assert_true(i >= 0 && i < N);
        for (int k = 0; k < PIXELS; ++k) assert_float_equal(x[r * PIXELS + k], (float)pixel_of(i, k) / 255.0f, 1e-6);
        assert_int_equal(y[r], i % 10);
        out[r] = i;
    }
    return n;
}

/* One epoch's sample indices in the order handed out; returns how many. */
static int64_t run_epoch(fixture *f, int64_t *order, int sleep_us) {
    int64_t batches = 0, count = 0;
    assert_int_equal(umt_loader_start_epoch(f->loader, 0, &batches), UMT_OK);
    for (int64_t b = 0;; ++b) {
        umt_tensor *images, *labels;
        assert_int_equal(umt_step_begin(f->ctx), UMT_OK);
        assert_int_equal(umt_loader_next(f->loader, &images, &labels), UMT_OK);
        if (!images) {
            assert_int_equal(b, batches);
            break;
        }
        count += batch_indices(images, labels, order + count);
        if (sleep_us) nanosleep(&(struct timespec){0, 1000L * sleep_us}, NULL);
    }
    return count;
}

/* ----------------------------------------------------------------------------------------- */
/* Tests */

static void test_every_sample_once_per_epoch_in_the_seeded_order(void **state) {
    (void)state;
    fixture f = make(options(8, 3, 3), 42);
    umt_context *reference;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    co.seed = 42;
    assert_int_equal(umt_context_create(&co, &reference), UMT_OK);
    int64_t got[N], expected[N], first_epoch[N];
    for (int epoch = 0; epoch < 3; ++epoch) {
        assert_int_equal(run_epoch(&f, got, 0), N);
        assert_int_equal(umt_permutation(reference, N, expected), UMT_OK);
        assert_memory_equal(got, expected, sizeof got);
        bool seen[N] = {false};
        for (int i = 0; i < N; ++i) {
            assert_false(seen[got[i]]);
            seen[got[i]] = true;
        }
        if (epoch == 0) memcpy(first_epoch, got, sizeof got);
        else assert_memory_not_equal(got, first_epoch, sizeof got);
    }
    umt_context_destroy(reference);
    release(&f);
}

static void test_a_slow_consumer_gets_intact_batches_from_a_shallow_ring(void **state) {
    (void)state;
    /* Four threads race to refill two slots while the consumer dawdles: a slot handed out
     * while being rewritten would show up as a row whose pixels disagree (batch_indices). */
    fixture f = make(options(5, 2, 4), 7);
    int64_t got[N];
    for (int epoch = 0; epoch < 2; ++epoch) assert_int_equal(run_epoch(&f, got, 2000), N);
    release(&f);
}

static void test_pageable_sync_and_thread_counts_give_the_same_batches(void **state) {
    (void)state;
    umt_loader_options pageable = options(16, 1, 1);
    pageable.kind = UMT_LOADER_PAGEABLE_SYNC;
    fixture a = make(pageable, 3), b = make(options(16, 4, 2), 3), c = make(options(16, 1, 1), 3);
    int64_t order_a[N], order_b[N], order_c[N];
    for (int epoch = 0; epoch < 2; ++epoch) {
        assert_int_equal(run_epoch(&a, order_a, 0), N);
        assert_int_equal(run_epoch(&b, order_b, 0), N);
        assert_int_equal(run_epoch(&c, order_c, 0), N);
        assert_memory_equal(order_a, order_b, sizeof order_a);
        assert_memory_equal(order_a, order_c, sizeof order_a);
    }
    release(&a);
    release(&b);
    release(&c);
}

static void test_batches_match_the_resident_dataset_path(void **state) {
    (void)state;
    umt_loader_options o = options(N, 2, 2);
    o.shuffle = false;
    o.mean = 0.1307f;
    o.std = 0.3081f;
    fixture f = make(o, 1);
    umt_dataset *ds;
    assert_int_equal(umt_dataset_load_idx(f.ctx, images_path, labels_path, 10, &ds), UMT_OK);
    int64_t indices[N];
    for (int i = 0; i < N; ++i) indices[i] = i;
    umt_tensor *x0, *y0, *x1, *y1;
    assert_int_equal(umt_loader_start_epoch(f.loader, 0, NULL), UMT_OK);
    assert_int_equal(umt_step_begin(f.ctx), UMT_OK);
    assert_int_equal(umt_loader_next(f.loader, &x0, &y0), UMT_OK);
    assert_int_equal(umt_dataset_batch(f.ctx, ds, indices, N, o.mean, o.std, &x1, &y1), UMT_OK);
    static float a[N * PIXELS], b[N * PIXELS];
    int32_t la[N], lb[N];
    assert_int_equal(umt_tensor_copy_to_host(x0, a, sizeof a), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(x1, b, sizeof b), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(y0, la, sizeof la), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(y1, lb, sizeof lb), UMT_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(la, lb, sizeof la);
    release(&f);
}

/* Sample i cropped from its image padded by 1 at offset (dy, dx), flipped first if flip. */
static void augmented(int64_t i, int dy, int dx, bool flip, float *out) {
    for (int y = 0; y < SIDE; ++y)
        for (int x = 0; x < SIDE; ++x) {
            int sy = y + dy, sx = (flip ? SIDE - 1 - x : x) + dx;
            bool inside = sy >= 0 && sy < SIDE && sx >= 0 && sx < SIDE;
            out[y * SIDE + x] = inside ? (float)pixel_of(i, sy * SIDE + sx) / 255.0f : 0.0f;
        }
}

static void test_augmentation_crops_and_flips_and_is_reproducible(void **state) {
    (void)state;
    umt_loader_options o = options(N, 2, 3);
    o.shuffle = false;
    o.crop_padding = 1;
    o.flip = true;
    fixture f = make(o, 5), g = make(o, 5);
    static float a[N * PIXELS], b[N * PIXELS];
    umt_tensor *x, *y;
    assert_int_equal(umt_loader_start_epoch(f.loader, 0, NULL), UMT_OK);
    assert_int_equal(umt_loader_start_epoch(g.loader, 0, NULL), UMT_OK);
    assert_int_equal(umt_loader_next(f.loader, &x, &y), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(x, a, sizeof a), UMT_OK);
    assert_int_equal(umt_loader_next(g.loader, &x, &y), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(x, b, sizeof b), UMT_OK);
    assert_memory_equal(a, b, sizeof a);
    /* Each row must be one of the 18 crops-and-flips of its sample; count which. */
    int flipped = 0, shifted = 0;
    for (int64_t i = 0; i < N; ++i) {
        bool found = false;
        for (int c = 0; c < 18 && !found; ++c) {
            float want[PIXELS];
            int dy = c / 6 - 1, dx = c / 2 % 3 - 1;
            augmented(i, dy, dx, c % 2, want);
            found = !memcmp(want, a + i * PIXELS, sizeof want);
            if (found) flipped += c % 2, shifted += dy != 0 || dx != 0;
        }
        assert_true(found);
    }
    /* About half flipped; eight in nine shifted. */
    assert_true(flipped > N / 4 && flipped < 3 * N / 4);
    assert_true(shifted > N / 2);
    release(&f);
    release(&g);
}

static void test_statistics_count_batches_and_waits(void **state) {
    (void)state;
    fixture f = make(options(10, 2, 1), 1);
    int64_t got[N];
    umt_loader_stats stats;
    assert_int_equal(run_epoch(&f, got, 0), N);
    assert_int_equal(umt_loader_take_stats(f.loader, &stats), UMT_OK);
    assert_int_equal(stats.batches, (N + 9) / 10);
    assert_true(stats.wait_ms >= 0);
    assert_int_equal(umt_loader_take_stats(f.loader, &stats), UMT_OK);
    assert_int_equal(stats.batches, 0);
    assert_true(stats.wait_ms == 0);
    release(&f);
}

static void test_an_unfinished_epoch_can_be_restarted_and_limited(void **state) {
    (void)state;
    fixture f = make(options(4, 3, 2), 9);
    umt_tensor *x, *y;
    int64_t batches = 0, got[N];
    assert_int_equal(umt_loader_start_epoch(f.loader, 0, &batches), UMT_OK);
    assert_int_equal(umt_loader_next(f.loader, &x, &y), UMT_OK);
    assert_int_equal(umt_loader_start_epoch(f.loader, 10, &batches), UMT_OK);
    assert_int_equal(batches, 3);
    int64_t count = 0;
    for (;;) {
        assert_int_equal(umt_loader_next(f.loader, &x, &y), UMT_OK);
        if (!x) break;
        count += batch_indices(x, y, got + count);
    }
    assert_int_equal(count, 10);
    assert_int_equal(run_epoch(&f, got, 0), N);
    release(&f);
}

/* A run resumed inside an epoch: the same draws, the epoch's order from batch 5 on, the batches
 * before it never handed out. */
static void test_an_epoch_started_at_a_batch_hands_out_the_rest_of_the_same_order(void **state) {
    (void)state;
    fixture whole = make(options(8, 3, 2), 5), resumed = make(options(8, 3, 2), 5);
    int64_t all[N], rest[N], batches = 0;
    assert_int_equal(run_epoch(&whole, all, 0), N);
    assert_int_equal(umt_loader_start_epoch_at(resumed.loader, 0, 5, &batches), UMT_OK);
    assert_int_equal(batches, (N + 7) / 8); /* still the whole epoch's count */
    int64_t count = 0;
    for (;;) {
        umt_tensor *x, *y;
        assert_int_equal(umt_step_begin(resumed.ctx), UMT_OK);
        assert_int_equal(umt_loader_next(resumed.loader, &x, &y), UMT_OK);
        if (!x) break;
        count += batch_indices(x, y, rest + count);
    }
    assert_int_equal(count, N - 5 * 8);
    assert_memory_equal(rest, all + 5 * 8, (size_t)count * sizeof *rest);
    /* Past the end: an epoch with nothing left. */
    umt_tensor *x, *y;
    assert_int_equal(umt_loader_start_epoch_at(resumed.loader, 0, 99, &batches), UMT_OK);
    assert_int_equal(umt_loader_next(resumed.loader, &x, &y), UMT_OK);
    assert_null(x);
    assert_int_equal(umt_loader_start_epoch_at(resumed.loader, 0, -1, &batches), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "first_batch -1"));
    release(&whole);
    release(&resumed);
}

/* Held batches (umt_loader_hold_next, then umt_loader_take_held) are the batches umt_loader_next
 * hands out, in the same order from the same seed; taking a held batch twice gives it twice (a
 * failed capture runs its step again); at the epoch's end nothing is held. */
static void test_held_batches_are_the_batches_next_hands_out(void **state) {
    (void)state;
    enum { BATCH = 37 };
    fixture f = make(options(BATCH, 3, 2), 9), g = make(options(BATCH, 3, 2), 9);
    static int64_t expected[N], held[N];
    int64_t count = run_epoch(&g, expected, 0), taken = 0, batches = 0, n = -1;
    assert_int_equal(umt_loader_start_epoch(f.loader, 0, &batches), UMT_OK);
    for (int64_t b = 0; b < batches; ++b) {
        umt_tensor *images, *labels;
        assert_int_equal(umt_loader_hold_next(f.loader, &n), UMT_OK);
        assert_int_equal(n, count - taken < BATCH ? count - taken : BATCH);
        for (int again = 0; again < 2; ++again) {
            assert_int_equal(umt_step_begin(f.ctx), UMT_OK);
            assert_int_equal(umt_loader_take_held(f.loader, &images, &labels), UMT_OK);
            assert_int_equal(batch_indices(images, labels, held + taken), n);
        }
        taken += n;
    }
    assert_int_equal(taken, count);
    assert_memory_equal(held, expected, (size_t)count * sizeof *held);
    umt_tensor *images = (umt_tensor *)&f, *labels = (umt_tensor *)&f;
    assert_int_equal(umt_loader_hold_next(f.loader, &n), UMT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(umt_loader_take_held(f.loader, &images, &labels), UMT_OK);
    assert_null(images);
    assert_null(labels);
    release(&f);
    release(&g);
}

static void test_bad_options_are_refused_with_their_values(void **state) {
    (void)state;
    umt_context *ctx;
    umt_samples *samples;
    umt_loader *loader = NULL;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    assert_int_equal(umt_samples_load_idx(images_path, labels_path, 10, &samples), UMT_OK);
    umt_loader_options o = options(0, 2, 1);
    assert_int_equal(umt_loader_create(ctx, samples, &o, &loader), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "batch 0"));
    o = options(8, 0, 1);
    assert_int_equal(umt_loader_create(ctx, samples, &o, &loader), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "depth 0"));
    assert_null(loader);
    umt_loader_kind kind;
    assert_int_equal(umt_loader_kind_parse("pageable-sync", &kind), UMT_OK);
    assert_int_equal(kind, UMT_LOADER_PAGEABLE_SYNC);
    assert_int_equal(umt_loader_kind_parse("fast", &kind), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "fast"));
    umt_samples *too_few_classes = NULL;
    assert_int_equal(umt_samples_load_idx(images_path, labels_path, 5, &too_few_classes), UMT_ERR_FORMAT);
    assert_null(too_few_classes);
    assert_non_null(strstr(umt_last_error(), "label"));
    umt_context_destroy(ctx);
    umt_samples_destroy(samples);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_sample_once_per_epoch_in_the_seeded_order),
        cmocka_unit_test(test_a_slow_consumer_gets_intact_batches_from_a_shallow_ring),
        cmocka_unit_test(test_pageable_sync_and_thread_counts_give_the_same_batches),
        cmocka_unit_test(test_batches_match_the_resident_dataset_path),
        cmocka_unit_test(test_augmentation_crops_and_flips_and_is_reproducible),
        cmocka_unit_test(test_statistics_count_batches_and_waits),
        cmocka_unit_test(test_an_unfinished_epoch_can_be_restarted_and_limited),
        cmocka_unit_test(test_an_epoch_started_at_a_batch_hands_out_the_rest_of_the_same_order),
        cmocka_unit_test(test_held_batches_are_the_batches_next_hands_out),
        cmocka_unit_test(test_bad_options_are_refused_with_their_values),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
