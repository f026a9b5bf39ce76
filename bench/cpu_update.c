/*
 * bench/cpu_update.c — how fast the CPU backend's Adam update runs: the kernel the offload tier's
 * CPU threads run on pinned memory (offload/update.c), here on ordinary host memory.
 *
 *   bazel build //bench:cpu_update && bazel-bin/bench/cpu_update [millions of elements] [rounds]
 *
 * Times umt_cpu_adam_update over n elements (default 16 M: 448 MiB of parameters, gradients and
 * both moments), on one thread and then on one thread per core, each split into equal ranges,
 * and prints the best of `rounds` as elements per second and the bytes it moved per second (28
 * per element: four arrays read, three written). One thread is bound by the arithmetic when the
 * loop is not vectorized; all threads together, by the memory.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_kernels.h"
#include "umtrain.h"

#define MAX_THREADS 64

typedef struct {
    float *param, *grad, *m, *v;
    int64_t n;
    umt_status status;
} range;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *update(void *arg) {
    range *r = arg;
    r->status = umt_cpu_adam_update(r->param, r->grad, r->m, r->v, r->n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1);
    return NULL;
}

/* One timed update of n elements split among `threads` ranges; seconds, or a negative on error. */
static double timed(float *arrays[4], int64_t n, int threads) {
    pthread_t ids[MAX_THREADS];
    range ranges[MAX_THREADS];
    int64_t per = (n + threads - 1) / threads;
    double start = now_s();
    int started = 0;
    for (; started < threads; ++started) {
        int64_t first = started * per, count = first + per < n ? per : n - first;
        ranges[started] = (range){arrays[0] + first, arrays[1] + first, arrays[2] + first, arrays[3] + first, count, UMT_OK};
        if (pthread_create(&ids[started], NULL, update, &ranges[started]) != 0) break;
    }
    for (int t = 0; t < started; ++t) pthread_join(ids[t], NULL);
    double seconds = now_s() - start;
    if (started < threads) return fprintf(stderr, "cpu_update: could not start thread %d of %d\n", started + 1, threads), -1;
    for (int t = 0; t < threads; ++t)
        if (ranges[t].status != UMT_OK) return fprintf(stderr, "cpu_update: %s\n", umt_last_error()), -1;
    return seconds;
}

int main(int argc, char **argv) {
    int64_t n = (argc > 1 ? atoll(argv[1]) : 16) * 1000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int all = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    if (n <= 0 || rounds < 1) return fprintf(stderr, "usage: cpu_update [millions of elements > 0] [rounds >= 1]\n"), 2;
    float *arrays[4];
    for (int a = 0; a < 4; ++a)
        if (!(arrays[a] = malloc((size_t)n * sizeof(float)))) return fprintf(stderr, "cpu_update: no memory for %lld elements\n", (long long)n), 1;
    for (int64_t i = 0; i < n; ++i) { /* every page touched before timing */
        arrays[0][i] = (float)(i % 1000) * 1e-3f;
        arrays[1][i] = (float)(i % 997) * 1e-3f - 0.5f;
        arrays[2][i] = arrays[3][i] = 0.0f;
    }
    int counts[2] = {1, all};
    for (int k = 0; k < (all > 1 ? 2 : 1); ++k) {
        double best = 1e30;
        for (int r = 0; r < rounds; ++r) {
            double s = timed(arrays, n, counts[k]);
            if (s < 0) return 1;
            if (s < best) best = s;
        }
        printf("cpu_update: adam, %lld elements, %d thread(s): %.1f ms, %.0f M elements/s, %.1f GB/s\n", (long long)n,
               counts[k], 1e3 * best, (double)n / best / 1e6, 28.0 * (double)n / best / 1e9);
    }
    for (int a = 0; a < 4; ++a) free(arrays[a]);
    return 0;
}
