/*
 * tests/gpu/test_cuda_loader.c — the loader on a GPU: with a deliberately slow compute stream
 * (a host function that sleeps after every batch), the copy stream must not overwrite a device
 * slot the compute stream has not read yet, and loader threads must not refill a pinned buffer a
 * copy still reads. Every batch is copied, in stream order, into a results buffer that is checked
 * at the end: a slot reused too early shows up as a batch with the wrong samples. And steps fed
 * by the loader's held batches (umt_loader_hold_next before the step, umt_loader_take_held inside
 * it) replay as a captured step graph with the losses and weights of the same steps op by op.
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

/* ----------------------------------------------------------------------------------------- */
/* Steps a step graph captures, fed by the loader's held batches */

typedef struct {
    umt_loader *loader;
    umt_layer *fc;
    umt_optimizer *opt;
    bool held; /* umt_loader_take_held (the batch held before the step), else umt_loader_next */
} loader_model;

static umt_tensor *loader_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    (void)input, (void)input_bytes;
    loader_model *m = user;
    umt_tensor *images = NULL, *labels = NULL;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx)) return NULL;
    umt_status got = m->held ? umt_loader_take_held(m->loader, &images, &labels)
                             : umt_loader_next(m->loader, &images, &labels);
    if (got != UMT_OK || !images) return NULL;
    umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, m->fc, umt_flatten(ctx, images)), labels);
    return loss && !umt_backward(ctx, loss) && !umt_optimizer_step(m->opt) ? loss : NULL;
}

/* Two epochs of a linear model on the loader's batches: each step's loss, the weights after, and
 * the replays. held: batches held before each step and the steps captured; else op by op. */
static void train_on_loader(bool held, double *losses, float *weights, int64_t *replayed) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.seed = 5;
    umt_context *ctx;
    umt_samples *samples;
    umt_loader_options o = umt_loader_defaults();
    o.batch_size = BATCH;
    loader_model m = {.held = held};
    umt_optimizer_options sgd = umt_optimizer_defaults(UMT_OPT_SGD);
    sgd.lr = 0.01f;
    umt_step_graph *graph;
    if (umt_context_create(&co, &ctx) || umt_samples_load_idx(images_path, labels_path, 10, &samples) ||
        umt_loader_create(ctx, samples, &o, &m.loader) || !(m.fc = umt_linear_layer_new(ctx, "fc", PIXELS, 10, true)) ||
        umt_optimizer_create(ctx, &sgd, &m.opt) || umt_step_graph_create(ctx, held, &graph))
        fail_msg("%s", umt_last_error());
    int64_t step = 0, batches = 0;
    for (int epoch = 0; epoch < 2; ++epoch) {
        assert_int_equal(umt_loader_start_epoch(m.loader, 0, &batches), UMT_OK);
        for (int64_t b = 0; b < batches; ++b, ++step) {
            int64_t count = BATCH;
            if (held && umt_loader_hold_next(m.loader, &count) != UMT_OK) fail_msg("%s", umt_last_error());
            if (umt_step_graph_run(graph, loader_step, &m, &count, sizeof count)) fail_msg("%s", umt_last_error());
            int64_t steps;
            assert_int_equal(umt_step_graph_take_mean_loss(graph, &losses[step], &steps), UMT_OK);
        }
    }
    assert_int_equal(umt_tensor_copy_to_host(umt_parameter_at(ctx, 0), weights, (size_t)PIXELS * 10 * sizeof(float)),
                     UMT_OK);
    *replayed = umt_step_graph_stats_get(graph).replayed_steps;
    umt_context_destroy(ctx);
    umt_samples_destroy(samples);
}

static void test_steps_fed_by_held_batches_replay_with_the_losses_of_steps_fed_op_by_op(void **state) {
    (void)state;
    enum { STEPS = 2 * ((N + BATCH - 1) / BATCH) };
    double eager[STEPS], graphed[STEPS];
    static float eager_weights[PIXELS * 10], graphed_weights[PIXELS * 10];
    int64_t eager_replayed, graphed_replayed;
    train_on_loader(false, eager, eager_weights, &eager_replayed);
    train_on_loader(true, graphed, graphed_weights, &graphed_replayed);
    assert_int_equal(eager_replayed, 0);
    /* Two eager warm-up steps, then one capture that runs, then replays. */
    assert_int_equal(graphed_replayed, STEPS - 2);
    for (int i = 0; i < STEPS; ++i)
        if (memcmp(&eager[i], &graphed[i], sizeof eager[i]) != 0)
            fail_msg("step %d: loss %.9g op by op, %.9g replayed", i, eager[i], graphed[i]);
    assert_memory_equal(eager_weights, graphed_weights, sizeof eager_weights);
    printf("%d steps fed by held batches: %lld replayed, the losses and weights of the steps op by op\n", STEPS,
           (long long)graphed_replayed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_slow_compute_stream_never_sees_a_slot_overwritten),
        cmocka_unit_test(test_pageable_sync_gives_the_same_batches_on_the_gpu),
        cmocka_unit_test(test_steps_fed_by_held_batches_replay_with_the_losses_of_steps_fed_op_by_op),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
