/*
 * offload/host_rate.c — how fast the CPU threads update, timed alone and beside the link.
 *
 * The tier's CPU updates (offload/host.c) and the link's copies both run through the host's
 * memory: an element of Adam with a compute copy reads and writes about 30 bytes there, and every
 * byte the link moves is read or written there too. Timed alone, each runs faster than when both
 * run at once, as they do in an offloaded step (docs/PERF.md). The tier's plan takes the CPU's
 * rate alone (umt_offload_cpu_rate); a benchmark can also ask for the rates of both at once
 * (umt_offload_host_memory_measure) and so for what the host's memory carries in all.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/precision.h"
#include "memory/placement.h"
#include "memory/pool.h"
#include "offload/state.h"

/* Timed rounds of the CPU's update: their median is the rate. One round's rate moves between
 * rounds of one run (docs/PERF.md, "Figures behind the comments"): a best of three read the
 * fastest. */
#define RATE_ROUNDS 5

/* Bytes each way of each of the link's copies while the CPU is timed beside it. */
#define LINK_BYTES ((size_t)128 << 20)

/* A job on scratch arrays: Adam (the common rule, and a costlier one than SGD's) with a compute
 * copy of dtype `copy` under bf16/fp16 and the gradient in bf16 or f32, as the tier's jobs run.
 * The arrays are where the tier's are, in pinned memory (malloc'd memory ran faster: docs/PERF.md,
 * "Figures behind the comments"), and as long as the streamed parameters, up to 16 work items a
 * thread (with 15 threads, about one of big_mlp's layers): small arrays would be timed in the
 * caches. Scratch from the placement itself: a pool would keep it in its peak, which the memory
 * plan predicts. */
typedef struct {
    umt_offload_cpu_job job;
    umt_offload_host_rule rule;
    float *arrays;
} scratch;

static umt_status scratch_make(umt_dtype copy, bool grad_bf16, int64_t streamed, scratch *out) {
    int64_t threads = umt_offload_cpu_thread_count(UMT_OFFLOAD_SPARE_CORES), least = threads * UMT_OFFLOAD_CPU_CHUNK;
    int64_t n = streamed < least ? least : streamed > 16 * least ? 16 * least : streamed;
    bool lowp = copy == UMT_BF16 || copy == UMT_F16;
    size_t bytes = (size_t)n * sizeof(float) * (lowp ? 5 : 4); /* a fifth array holds two copies' bytes */
    float *a = NULL;
    UMT_TRY(umt_placement_alloc(UMT_PLACE_PINNED, bytes, UMT_POOL_ALIGN, (void **)&a));
    memset(a, 0, bytes);
    out->arrays = a;
    out->rule = (umt_offload_host_rule){umt_optimizer_defaults(UMT_OPT_ADAM), 1};
    umt_update_fusion fusion = {.lowp = lowp ? a + 4 * n : NULL, .lowp_dtype = lowp ? copy : UMT_F32};
    if (lowp && grad_bf16) fusion.grad_bf16 = (uint16_t *)(a + 4 * n) + n; /* the fifth array's second half */
    float *grad = fusion.grad_bf16 ? NULL : a + n;
    out->job = (umt_offload_cpu_job){umt_offload_host_rule_run, &out->rule, a, grad, a + 2 * n, a + 3 * n, n, fusion,
                                     UMT_OFFLOAD_CPU_CHUNK};
    return UMT_OK;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median rate of RATE_ROUNDS rounds over the scratch job, after one untimed round (which
 * touches the pages the first time). */
static umt_status median_rate(scratch *s, double *rate) {
    double rates[RATE_ROUNDS];
    for (int r = -1; r < RATE_ROUNDS; ++r) {
        double start = umt_offload_seconds();
        if (!umt_offload_cpu_threads(&s->job, 1, UMT_OFFLOAD_SPARE_CORES))
            return umt_fail(UMT_ERR_STATE, "offload: timing the CPU's update: %s", umt_last_error());
        double seconds = umt_offload_seconds() - start;
        if (r >= 0) rates[r] = seconds > 0 ? (double)s->job.n / seconds : 0;
    }
    qsort(rates, RATE_ROUNDS, sizeof *rates, compare_doubles);
    *rate = rates[RATE_ROUNDS / 2];
    return UMT_OK;
}

umt_status umt_offload_cpu_rate(umt_dtype copy, bool grad_bf16, int64_t streamed, double *rate) {
    scratch s;
    UMT_TRY(scratch_make(copy, grad_bf16, streamed, &s));
    umt_status st = median_rate(&s, rate);
    umt_placement_free(UMT_PLACE_PINNED, s.arrays);
    return st;
}

/* ----------------------------------------------------------------------------------------- */
/* Both at once */

typedef struct {
    umt_context *ctx;
    atomic_int started, stop, finished;
    double gbps;
    umt_status status;
    char error[256];
} link_run;

static void *keep_link_busy(void *arg) {
    link_run *run = arg;
    run->status = umt_link_copy_until(run->ctx, LINK_BYTES, &run->started, &run->stop, &run->gbps);
    if (run->status != UMT_OK) snprintf(run->error, sizeof run->error, "%s", umt_last_error());
    atomic_store(&run->finished, 1);
    return NULL;
}

/* The host's memory: each element of the update reads and writes its master and two states (24
 * bytes), reads its gradient and writes its compute copy. A bf16 copy is streamed past the caches
 * (kernels/cpu/optim.c), so no line of it is read first; an f16 copy's lines are read before they
 * are written, its bytes twice. */
static double update_bytes(const scratch *s) {
    const umt_update_fusion *f = &s->job.fusion;
    double bytes = 6 * sizeof(float) + (f->grad_bf16 ? 2 : sizeof(float));
    if (f->lowp) bytes += (double)umt_dtype_size(f->lowp_dtype) * (f->lowp_dtype == UMT_BF16 ? 1 : 2);
    return bytes;
}

/* The CPU's rate while another thread keeps the link copying both ways, and the link's meanwhile. */
static umt_status rate_beside_link(umt_context *ctx, scratch *s, umt_host_memory_speed *out) {
    link_run run = {.ctx = ctx};
    atomic_init(&run.started, 0);
    atomic_init(&run.stop, 0);
    atomic_init(&run.finished, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, keep_link_busy, &run) != 0)
        return umt_fail(UMT_ERR_STATE, "offload: no thread to keep the link busy beside the CPU's update");
    struct timespec poll = {0, 1000000};
    while (!atomic_load(&run.started) && !atomic_load(&run.finished)) nanosleep(&poll, NULL);
    umt_status st = atomic_load(&run.started) ? median_rate(s, &out->cpu_beside_link) : UMT_OK;
    atomic_store(&run.stop, 1);
    pthread_join(thread, NULL);
    out->link_beside_cpu_gbps = run.gbps;
    if (st == UMT_OK && run.status != UMT_OK)
        st = umt_fail(run.status, "offload: keeping the link busy beside the CPU's update: %s", run.error);
    return st;
}

umt_status umt_offload_host_memory(umt_offload *o, umt_host_memory_speed *out) {
    umt_dtype compute = umt_compute_dtype(o->ctx);
    bool grad_bf16 = compute == UMT_BF16 && o->options.bf16_gradients_home;
    umt_link_speed alone;
    UMT_TRY(umt_link_measure(o->ctx, LINK_BYTES, &alone));
    scratch s;
    UMT_TRY(scratch_make(compute, grad_bf16, INT64_MAX, &s)); /* as long as a timing takes */
    *out = (umt_host_memory_speed){.link_alone_gbps = alone.both_ways_gbps, .update_bytes = update_bytes(&s)};
    umt_status st = median_rate(&s, &out->cpu_alone);
    if (st == UMT_OK) st = rate_beside_link(o->ctx, &s, out);
    umt_placement_free(UMT_PLACE_PINNED, s.arrays);
    return st;
}
