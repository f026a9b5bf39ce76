/*
 * tests/gpu/test_cuda_loader.c — the loader on a GPU: with a deliberately slow compute stream
 * (a host function that sleeps after every batch), the copy stream must not overwrite a device
 * slot the compute stream has not read yet, and loader threads must not refill a pinned buffer a
 * copy still reads. Every batch is copied, in stream order, into a results buffer that is checked
 * at the end: a slot reused too early shows up as a batch with the wrong samples.
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
#include <cuda_runtime_api.h>

#include "core/tensor.h"
#include "kernels/cuda/cuda_kernels.h"
#include "umtrain.h"

enum { N = 999, SIDE = 28, PIXELS = SIDE * SIDE, BATCH = 37 };

static char dir[64], images_path[128], labels_path[128];

static uint8_t pixel_of(int64_t i, int k) { return (uint8_t)((i * 131 + k * 7 + i / 256) % 256); }

static void write_be32(FILE *f, uint32_t v) {
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    fwrite(b, 1, 4, f);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_gpu_loader_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(images_path, sizeof images_path, "%s/images", dir);
    snprintf(labels_path, sizeof labels_path, "%s/labels", dir);
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

static int teardown(void **state) {
    (void)state;
    unlink(images_path);
    unlink(labels_path);
    return rmdir(dir);
}

static void CUDART_CB sleep_a_while(void *microseconds) {
    nanosleep(&(struct timespec){0, 1000L * (long)(intptr_t)microseconds}, NULL);
}

/* One epoch with a slow compute stream; returns the batches' images and labels, in order. */
static void slow_epoch(umt_loader_kind kind, int depth, int workers, float *images, int32_t *labels, int64_t *order) {
    umt_context *ctx;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.seed = 11;
    umt_samples *samples;
    umt_loader *loader;
    umt_loader_options o = umt_loader_defaults();
    o.batch_size = BATCH;
    o.depth = depth;
    o.workers = workers;
    o.kind = kind;
    if (umt_context_create(&co, &ctx) || umt_samples_load_idx(images_path, labels_path, 10, &samples) ||
        umt_loader_create(ctx, samples, &o, &loader))
        fail_msg("%s", umt_last_error());
    float *d_images;
    int32_t *d_labels;
    assert_int_equal(cudaMalloc((void **)&d_images, (size_t)N * PIXELS * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&d_labels, (size_t)N * sizeof(int32_t)), cudaSuccess);
    cudaStream_t compute = umt_cuda_stream();
    int64_t done = 0;
    assert_int_equal(umt_loader_start_epoch(loader, 0, NULL), UMT_OK);
    for (;;) {
        umt_tensor *x, *y;
        assert_int_equal(umt_step_begin(ctx), UMT_OK);
        if (umt_loader_next(loader, &x, &y) != UMT_OK) fail_msg("%s", umt_last_error());
        if (!x) break;
        /* The compute stream dawdles before it reads the batch, so later copies pile up behind it. */
        assert_int_equal(cudaLaunchHostFunc(compute, sleep_a_while, (void *)(intptr_t)3000), cudaSuccess);
        int64_t n = umt_tensor_dim(x, 0);
        assert_int_equal(cudaMemcpyAsync(d_images + done * PIXELS, x->data, x->bytes, cudaMemcpyDeviceToDevice, compute), cudaSuccess);
        assert_int_equal(cudaMemcpyAsync(d_labels + done, y->data, y->bytes, cudaMemcpyDeviceToDevice, compute), cudaSuccess);
        done += n;
    }
    assert_int_equal(done, N);
    assert_int_equal(umt_synchronize(ctx), UMT_OK);
    assert_int_equal(cudaMemcpy(images, d_images, (size_t)N * PIXELS * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(labels, d_labels, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_images);
    cudaFree(d_labels);
    umt_loader_stats stats;
    assert_int_equal(umt_loader_take_stats(loader, &stats), UMT_OK);
    assert_int_equal(stats.batches, (N + BATCH - 1) / BATCH);
    assert_true(stats.wait_ms >= 0);
    /* The expected order: the same seed's permutation. */
    umt_context *reference;
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &reference), UMT_OK);
    assert_int_equal(umt_permutation(reference, N, order), UMT_OK);
    umt_context_destroy(reference);
    umt_context_destroy(ctx);
    umt_samples_destroy(samples);
}

static void check_batches(const float *images, const int32_t *labels, const int64_t *order) {
    for (int64_t r = 0; r < N; ++r) {
        int64_t i = order[r];
        assert_int_equal(labels[r], i % 10);
        for (int k = 0; k < PIXELS; ++k)
            if (images[r * PIXELS + k] != (float)pixel_of(i, k) / 255.0f)
                fail_msg("row %lld (sample %lld) pixel %d: %g, expected %g", (long long)r, (long long)i, k,
                         (double)images[r * PIXELS + k], (double)pixel_of(i, k) / 255.0f);
    }
}

static void test_a_slow_compute_stream_never_sees_a_slot_overwritten(void **state) {
    (void)state;
    static float images[N * PIXELS];
    static int32_t labels[N];
    static int64_t order[N];
    slow_epoch(UMT_LOADER_PINNED, 2, 3, images, labels, order);
    check_batches(images, labels, order);
    slow_epoch(UMT_LOADER_PINNED, 8, 1, images, labels, order);
    check_batches(images, labels, order);
}

static void test_pageable_sync_gives_the_same_batches_on_the_gpu(void **state) {
    (void)state;
    static float images[N * PIXELS];
    static int32_t labels[N];
    static int64_t order[N];
    slow_epoch(UMT_LOADER_PAGEABLE_SYNC, 1, 1, images, labels, order);
    check_batches(images, labels, order);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_slow_compute_stream_never_sees_a_slot_overwritten),
        cmocka_unit_test(test_pageable_sync_gives_the_same_batches_on_the_gpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
