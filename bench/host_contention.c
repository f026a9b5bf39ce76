/*
 * bench/host_contention.c — the host memory that the offload tier's CPU threads and the GPU's copy
 * engines share: how fast the pinned link runs while CPU threads run Adam updates beside it, and
 * how fast those threads run while the link copies.
 *
 *   bazel build --config=cuda //bench:host_contention && bazel-bin/bench/host_contention [threads ...]
 *
 * For each thread count (default 4, 8 and one per core less one, as the tier uses), threads run
 * the CPU backend's Adam update (kernels/cpu/optim.c: 28 bytes of host memory per element) over
 * their own 256 MiB arrays in 1 M-element pieces until told to stop; meanwhile umt_link_measure
 * times the link (to the device, to the host, both ways at once). Printed: the link alone, the
 * CPU threads alone, then both at once, and the host-memory bytes per second of the two together.
 * The offload tier's floor (examples/big_mlp.c --bench) counts the link and the CPU's update each
 * at its rate alone; this shows how much of that the other takes away.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_kernels.h"
#include "umtrain.h"

#define MAX_THREADS 64
#define PIECE ((int64_t)1 << 20)
#define PIECES 64 /* per thread: 64 M elements, 256 MiB an array */
#define ADAM_BYTES 28.0

typedef struct {
    float *arrays[4];
    bool touched; /* its pages faulted in, by itself */
    atomic_int *stop, *ready;
    atomic_llong *elements;
} worker;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *run(void *arg) {
    worker *w = arg;
    if (!w->touched)
        for (int k = 0; k < 4; ++k) memset(w->arrays[k], 0, (size_t)(PIECES * PIECE) * sizeof(float));
    w->touched = true;
    atomic_fetch_add(w->ready, 1);
    for (int64_t piece = 0; !atomic_load(w->stop); piece = (piece + 1) % PIECES) {
        float *a[4];
        for (int k = 0; k < 4; ++k) a[k] = w->arrays[k] + piece * PIECE;
        if (umt_cpu_adam_update(a[0], a[1], a[2], a[3], PIECE, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1) != UMT_OK)
            return NULL;
        atomic_fetch_add(w->elements, PIECE);
    }
    return NULL;
}

/* The threads' elements per second over `seconds`, or while the link is measured when ctx. */
static int measure(int threads, worker *workers, umt_context *ctx, double seconds, double *cpu_rate,
                   umt_link_speed *link) {
    atomic_int stop = 0, ready = 0;
    atomic_llong elements = 0;
    pthread_t ids[MAX_THREADS];
    for (int t = 0; t < threads; ++t) {
        workers[t].stop = &stop;
        workers[t].ready = &ready;
        workers[t].elements = &elements;
        if (pthread_create(&ids[t], NULL, run, &workers[t])) return fprintf(stderr, "pthread_create failed\n"), 1;
    }
    struct timespec warm = {0, 200000000}; /* every thread's pages in, and the threads at speed */
    while (atomic_load(&ready) < threads) nanosleep(&warm, NULL);
    nanosleep(&warm, NULL);
    long long before = atomic_load(&elements);
    double start = now_s();
    int rc = 0;
    if (ctx) rc = umt_link_measure(ctx, (size_t)256 << 20, link) != UMT_OK;
    else
        while (now_s() - start < seconds) nanosleep(&warm, NULL);
    double elapsed = now_s() - start;
    *cpu_rate = (double)(atomic_load(&elements) - before) / elapsed;
    atomic_store(&stop, 1);
    for (int t = 0; t < threads; ++t) pthread_join(ids[t], NULL);
    if (rc) fprintf(stderr, "host_contention: link: %s\n", umt_last_error());
    return rc;
}

int main(int argc, char **argv) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int counts[8] = {4, 8, cores > 1 ? (int)cores - 1 : 1}, n_counts = 3;
    if (argc > 1) n_counts = 0;
    for (int i = 1; i < argc && n_counts < 8; ++i) counts[n_counts++] = atoi(argv[i]);
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    umt_context *ctx = NULL;
    if (umt_context_create(&co, &ctx) != UMT_OK) return fprintf(stderr, "context: %s\n", umt_last_error()), 1;
    umt_link_speed alone;
    if (umt_link_measure(ctx, (size_t)256 << 20, &alone) != UMT_OK)
        return fprintf(stderr, "link: %s\n", umt_last_error()), 1;
    printf("link alone: %.1f GB/s to device, %.1f to host, %.1f both ways (%ld cores)\n", alone.to_device_gbps,
           alone.to_host_gbps, alone.both_ways_gbps, cores);
    static worker workers[MAX_THREADS];
    for (int c = 0; c < n_counts; ++c) {
        int threads = counts[c] < 1 ? 1 : counts[c] > MAX_THREADS ? MAX_THREADS : counts[c];
        for (int t = 0; t < threads; ++t)
            for (int k = 0; k < 4 && !workers[t].arrays[k]; ++k)
                if (!(workers[t].arrays[k] = malloc((size_t)(PIECES * PIECE) * sizeof(float))))
                    return fprintf(stderr, "out of host memory\n"), 1;
        double cpu_alone = 0, cpu_beside = 0;
        umt_link_speed link;
        if (measure(threads, workers, NULL, 1.0, &cpu_alone, NULL) ||
            measure(threads, workers, ctx, 0, &cpu_beside, &link))
            return 1;
        printf("%2d CPU threads: alone %.2f G elements/s (%.1f GB/s); beside the link %.2f G/s (%.1f GB/s), the link "
               "then %.1f to device, %.1f to host, %.1f both ways: host memory %.1f GB/s in all\n",
               threads, cpu_alone / 1e9, cpu_alone * ADAM_BYTES / 1e9, cpu_beside / 1e9, cpu_beside * ADAM_BYTES / 1e9,
               link.to_device_gbps, link.to_host_gbps, link.both_ways_gbps,
               cpu_beside * ADAM_BYTES / 1e9 + link.both_ways_gbps);
    }
    umt_context_destroy(ctx);
    return 0;
}
