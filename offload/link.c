/*
 * offload/link.c — measuring the host <-> device link with pinned memory, so that a benchmark can
 * say how close a run that streams over it comes to what the link allows (docs/PERF.md); and the
 * link kept busy both ways while the CPU's update is timed beside it (offload/host_rate.c).
 */
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#include "offload/state.h"

#define ROUNDS 5

typedef struct {
    void *host[2], *device[2];
    cudaStream_t streams[2];
    cudaEvent_t start[2], stop[2];
} link_buffers;

static void release(umt_context *ctx, link_buffers *b) {
    for (int i = 0; i < 2; ++i) {
        if (b->streams[i]) cudaStreamSynchronize(b->streams[i]), cudaStreamDestroy(b->streams[i]);
        if (b->start[i]) cudaEventDestroy(b->start[i]);
        if (b->stop[i]) cudaEventDestroy(b->stop[i]);
        umt_memory_free(&ctx->memory, UMT_POOL_STAGING, b->host[i]);
        umt_memory_free(&ctx->memory, UMT_POOL_STREAM, b->device[i]);
    }
}

static umt_status acquire(umt_context *ctx, link_buffers *b, size_t bytes) {
    for (int i = 0; i < 2; ++i) {
        UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_STAGING, bytes, &b->host[i]));
        UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_STREAM, bytes, &b->device[i]));
        UMT_CUDA_TRY(cudaStreamCreateWithFlags(&b->streams[i], cudaStreamNonBlocking));
        UMT_CUDA_TRY(cudaEventCreate(&b->start[i]));
        UMT_CUDA_TRY(cudaEventCreate(&b->stop[i]));
    }
    return UMT_OK;
}

/* One timed round: copy 0 to the device and/or copy 1 to the host, each on its own stream; the
 * seconds from the first start to the last stop. */
static umt_status round_seconds(link_buffers *b, size_t bytes, bool in, bool out, double *seconds) {
    UMT_CUDA_TRY(cudaDeviceSynchronize());
    for (int i = 0; i < 2; ++i) {
        if (!(i == 0 ? in : out)) continue;
        UMT_CUDA_TRY(cudaEventRecord(b->start[i], b->streams[i]));
        if (i == 0) UMT_CUDA_TRY(cudaMemcpyAsync(b->device[0], b->host[0], bytes, cudaMemcpyHostToDevice, b->streams[0]));
        else UMT_CUDA_TRY(cudaMemcpyAsync(b->host[1], b->device[1], bytes, cudaMemcpyDeviceToHost, b->streams[1]));
        UMT_CUDA_TRY(cudaEventRecord(b->stop[i], b->streams[i]));
    }
    float longest = 0;
    for (int i = 0; i < 2; ++i) {
        if (!(i == 0 ? in : out)) continue;
        float ms = 0;
        UMT_CUDA_TRY(cudaEventSynchronize(b->stop[i]));
        UMT_CUDA_TRY(cudaEventElapsedTime(&ms, b->start[in ? 0 : i], b->stop[i]));
        if (ms > longest) longest = ms;
    }
    *seconds = 1e-3 * longest;
    return UMT_OK;
}

static umt_status best_gbps(link_buffers *b, size_t bytes, bool in, bool out, double *gbps) {
    double best = 0;
    for (int r = 0; r < ROUNDS; ++r) {
        double s = 0;
        UMT_TRY(round_seconds(b, bytes, in, out, &s));
        double rate = s > 0 ? (double)bytes * (in + out) / s / 1e9 : 0;
        if (rate > best) best = rate;
    }
    *gbps = best;
    return UMT_OK;
}

umt_status umt_link_measure(umt_context *ctx, size_t bytes, umt_link_speed *out) {
    if (!ctx || !out) return umt_fail_null("umt_link_measure", ctx ? "out" : "ctx");
    if (bytes == 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_link_measure: 0 bytes (expected > 0)");
    if (ctx->options.device != UMT_DEVICE_CUDA)
        return umt_fail(UMT_ERR_UNSUPPORTED, "umt_link_measure: the context runs on the CPU: there is no link");
    link_buffers b = {0};
    umt_status st = acquire(ctx, &b, bytes);
    if (st == UMT_OK) st = best_gbps(&b, bytes, true, false, &out->to_device_gbps);
    if (st == UMT_OK) st = best_gbps(&b, bytes, false, true, &out->to_host_gbps);
    if (st == UMT_OK) st = best_gbps(&b, bytes, true, true, &out->both_ways_gbps);
    release(ctx, &b);
    return st;
}

umt_status umt_link_copy_until(umt_context *ctx, size_t bytes, atomic_int *started, const atomic_int *stop,
                               double *gbps) {
    link_buffers b = {0};
    umt_status st = acquire(ctx, &b, bytes);
    if (st == UMT_OK) atomic_store(started, 1);
    double moved = 0, seconds = 0;
    while (st == UMT_OK && !atomic_load(stop)) {
        double s = 0;
        st = round_seconds(&b, bytes, true, true, &s);
        moved += 2.0 * (double)bytes;
        seconds += s;
    }
    release(ctx, &b);
    *gbps = seconds > 0 ? moved / seconds / 1e9 : 0;
    return st;
}

#else

umt_status umt_link_measure(umt_context *ctx, size_t bytes, umt_link_speed *out) {
    if (!ctx || !out) return umt_fail_null("umt_link_measure", ctx ? "out" : "ctx");
    return umt_fail(UMT_ERR_UNSUPPORTED, "umt_link_measure of %zu bytes: this build has no CUDA", bytes);
}

#endif
