/* core/device.c — which devices exist, and starting the one a context runs on. */
#include "core/device.h"

#include <string.h>
#include <time.h>

#include "core/base/error.h"
#include "core/context.h"
#include "kernels/cpu/threads.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "memory/budget.h"

#endif

umt_status umt_device_parse(const char *name, umt_device *out) {
    if (!name || !out) return umt_fail_null("umt_device_parse", name ? "out" : "name");
    if (!strcmp(name, "cpu")) return *out = UMT_DEVICE_CPU, UMT_OK;
    if (!strcmp(name, "cuda")) return *out = UMT_DEVICE_CUDA, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "device '%s': expected cpu or cuda", name);
}

int umt_cuda_device_count(void) {
#ifdef UMT_WITH_CUDA
    int count = 0;
    /* No driver or no GPU is an answer (zero), not an error. */
    return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
#else
    return 0;
#endif
}

umt_device umt_default_device(void) { return umt_cuda_device_count() > 0 ? UMT_DEVICE_CUDA : UMT_DEVICE_CPU; }

#ifdef UMT_WITH_CUDA
static umt_status start_cuda(umt_context *ctx) {
    int count = umt_cuda_device_count(), device = ctx->options.cuda_device;
    if (device < 0 || device >= count)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "cuda device %d: this machine has %d GPU(s)", device, count);
    UMT_TRY(umt_budget_measure(device, &ctx->memory));
    /* The cuBLAS workspace and the kernels' scratch (their partial sums, the label report) are
     * the context's own, so that contexts on other threads never share them. */
    void *workspace = NULL, *scratch = NULL;
    UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_WORKSPACE, UMT_CUBLAS_WORKSPACE_BYTES, &workspace));
    UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_WORKSPACE, umt_cuda_scratch_bytes(), &scratch));
    /* The side stream for weight gradients (core/branch.h), unless every kernel stays on one. */
    UMT_TRY(umt_cuda_state_create(device, workspace, UMT_CUBLAS_WORKSPACE_BYTES, !ctx->options.one_stream, scratch,
                                  umt_cuda_scratch_bytes(), &ctx->cuda));
    umt_cuda_state_set_tf32(ctx->cuda, ctx->options.tf32);
    umt_cuda_state_set_conv_workspace_limit(ctx->cuda, umt_budget_conv_workspace_limit(ctx->memory.budget_bytes));
    ctx->memory.stream = umt_cuda_compute_stream();
    ctx->backend = umt_cuda_backend();
    return UMT_OK;
}
#endif

umt_status umt_device_start(umt_context *ctx) {
    switch (ctx->options.device) {
    case UMT_DEVICE_CPU:
        /* The kernels cannot refuse a bad UMT_CPU_THREADS mid-step; the context refuses it here. */
        UMT_TRY(umt_cpu_threads_check_environment());
        ctx->backend = umt_cpu_backend();
        return UMT_OK;
    case UMT_DEVICE_CUDA:
#ifdef UMT_WITH_CUDA
        return start_cuda(ctx);
#else
        return umt_fail(UMT_ERR_UNSUPPORTED, "device cuda: this build has no CUDA (build with --config=cuda)");
#endif
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "device %d: expected UMT_DEVICE_CPU or UMT_DEVICE_CUDA",
                    (int)ctx->options.device);
}

void umt_device_stop(umt_context *ctx) {
#ifdef UMT_WITH_CUDA
    if (ctx->timer_start) cudaEventDestroy((cudaEvent_t)ctx->timer_start);
    umt_cuda_state_destroy(ctx->cuda);
    ctx->cuda = NULL;
#else
    (void)ctx;
#endif
}

umt_status umt_synchronize(umt_context *ctx) {
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_synchronize: ctx is NULL");
#ifdef UMT_WITH_CUDA
    if (ctx->options.device == UMT_DEVICE_CUDA) {
        umt_device_bind(ctx);
        return umt_cuda_synchronize();
    }
#endif
    return UMT_OK;
}

void umt_device_bind(const umt_context *ctx) {
#ifdef UMT_WITH_CUDA
    if (ctx->cuda) umt_cuda_bind(ctx->cuda);
#else
    (void)ctx;
#endif
}

/* ----------------------------------------------------------------------------------------- */
/* Timing on the device's own clock */

static double clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

umt_status umt_timer_start(umt_context *ctx) {
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_timer_start: ctx is NULL");
#ifdef UMT_WITH_CUDA
    if (ctx->options.device == UMT_DEVICE_CUDA) {
        umt_device_bind(ctx);
        if (!ctx->timer_start) UMT_CUDA_TRY(cudaEventCreate((cudaEvent_t *)&ctx->timer_start));
        UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)ctx->timer_start, umt_cuda_stream()));
        return UMT_OK;
    }
#endif
    ctx->timer_start_s = clock_seconds();
    return UMT_OK;
}

umt_status umt_timer_stop(umt_context *ctx, double *elapsed_ms) {
    if (!ctx || !elapsed_ms) return umt_fail_null("umt_timer_stop", ctx ? "elapsed_ms" : "ctx");
#ifdef UMT_WITH_CUDA
    if (ctx->options.device == UMT_DEVICE_CUDA) {
        if (!ctx->timer_start) return umt_fail(UMT_ERR_STATE, "umt_timer_stop: umt_timer_start was not called");
        umt_device_bind(ctx);
        cudaEvent_t stop;
        float ms = 0;
        UMT_CUDA_TRY(cudaEventCreate(&stop));
        cudaError_t e = cudaEventRecord(stop, umt_cuda_stream());
        if (e == cudaSuccess) e = cudaEventSynchronize(stop);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, (cudaEvent_t)ctx->timer_start, stop);
        cudaEventDestroy(stop);
        UMT_CUDA_TRY(e);
        *elapsed_ms = ms;
        return UMT_OK;
    }
#endif
    *elapsed_ms = 1e3 * (clock_seconds() - ctx->timer_start_s);
    return UMT_OK;
}
