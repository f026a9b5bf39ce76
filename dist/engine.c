/*
 * dist/engine.c — NCCL data parallelism on one rank (see engine.h).
 *
 * Two streams. The compute stream (the CUDA backend's) runs backward; when the tape announces
 * the last gradient of a bucket, the bucket is packed there into its own contiguous buffer
 * (a copy, or a conversion to bf16), an event marks the point, and the communication stream
 * waits on that event and runs ncclAllReduce(ncclAvg) on the buffer, while the compute stream
 * goes on with the rest of backward. Before the optimizer the compute stream waits on each
 * bucket's "done" event and unpacks the averages into the gradients (the conversion back for
 * bf16). The buffers live in the grads pool, so they count against the device budget.
 */
#include "dist/engine.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"
#include "dist/bootstrap.h"
#include "dist/watchdog.h"
#include "kernels/cuda/cuda_kernels.h"

enum { HOST_VALUES = 64 };

typedef struct {
    umt_tensor *buffer; /* the bucket's gradients, contiguous, in the reduce dtype */
    cudaEvent_t packed; /* on the compute stream, after the pack */
    cudaEvent_t done;   /* on the communication stream, after the all-reduce */
} bucket_state;

struct umt_engine {
    umt_context *ctx;
    int rank, size;
    ncclComm_t comm;
    bool comm_made;
    cudaStream_t compute, communication;
    umt_dtype reduce_dtype;
    bucket_state *buckets;
    int bucket_count;
    umt_tensor *host_values; /* staging for umt_engine_reduce_host */
    cudaEvent_t host_done;
    bool in_place;              /* gradients reduced one by one where they are (engine.h) */
    cudaEvent_t gradient_final, gradient_reduced; /* in place: compute -> communication -> compute */
    umt_watchdog *watchdog;
};

#define NCCL_TRY(engine, call)                                                                                     \
    do {                                                                                                           \
        ncclResult_t umt_nccl_result_ = (call);                                                                    \
        if (umt_nccl_result_ != ncclSuccess)                                                                       \
            return umt_fail(UMT_ERR_DEVICE, "rank %d: %s:%d: %s: %s (%s)", (engine)->rank, __FILE__, __LINE__,      \
                            #call, ncclGetErrorString(umt_nccl_result_), ncclGetLastError((engine)->comm));        \
    } while (0)

static ncclDataType_t nccl_type(umt_dtype dtype) {
    switch (dtype) {
    case UMT_BF16: return ncclBfloat16;
    case UMT_F16: return ncclFloat16;
    case UMT_I32: return ncclInt32;
    case UMT_U8: return ncclUint8;
    default: return ncclFloat32;
    }
}

/* ----------------------------------------------------------------------------------------- */
/* Start-up */

static umt_status make_communicator(umt_engine *e, const umt_dist_process *process, const umt_dist_options *options) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (process->rank == 0) NCCL_TRY(e, ncclGetUniqueId(&id));
    UMT_TRY(umt_bootstrap_share_id(process, &id, sizeof id, options->timeout_s));
    NCCL_TRY(e, ncclCommInitRank(&e->comm, process->size, id, process->rank));
    e->comm_made = true;
    umt_bootstrap_share_done(process);
    return UMT_OK;
}

/* Every rank starts from rank 0's parameters and buffers (batch norm's running statistics). */
static umt_status broadcast_model(umt_engine *e) {
    umt_context *ctx = e->ctx;
    NCCL_TRY(e, ncclGroupStart());
    for (int i = 0; i < ctx->parameter_count + ctx->buffer_count; ++i) {
        umt_tensor *t = i < ctx->parameter_count ? ctx->parameters[i] : ctx->buffers[i - ctx->parameter_count];
        /* One rank has nothing to take from rank 0, and a tensor a subsystem holds (the offload
         * tier, before its plan: pinned host memory) is left where it is. */
        if (e->size == 1 && t->pool != t->kind_pool) continue;
        ncclResult_t r = ncclBroadcast(t->data, t->data, (size_t)t->numel, nccl_type(t->dtype), 0, e->comm, e->compute);
        if (r != ncclSuccess) {
            ncclGroupEnd();
            NCCL_TRY(e, r);
        }
        t->lowp_stale = true; /* a bf16/fp16 compute copy, if one was made, is refreshed from it */
    }
    NCCL_TRY(e, ncclGroupEnd());
    UMT_CUDA_TRY(cudaStreamSynchronize(e->compute));
    return UMT_OK;
}

static umt_status make_buckets(umt_engine *e, const umt_bucket_plan *plan) {
    e->buckets = calloc((size_t)plan->bucket_count, sizeof *e->buckets);
    if (!e->buckets) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "rank %d: no memory for %d buckets", e->rank, plan->bucket_count);
    /* In place: no bucket buffers (engine.h), the bucket count 0 (nothing to start or finish). */
    e->bucket_count = e->in_place ? 0 : plan->bucket_count;
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&e->gradient_final, cudaEventDisableTiming));
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&e->gradient_reduced, cudaEventDisableTiming));
    for (int b = 0; b < e->bucket_count; ++b) {
        bucket_state *s = &e->buckets[b];
        s->buffer = umt_tensor_new_1d(e->ctx, UMT_POOL_GRADS, e->reduce_dtype, plan->elements[b]);
        if (!s->buffer) return umt_last_status();
        /* Timing off: these events only order streams, and untimed events are cheaper. */
        UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->packed, cudaEventDisableTiming));
        UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
    }
    e->host_values = umt_tensor_new_1d(e->ctx, UMT_POOL_GRADS, UMT_U8, HOST_VALUES * (int64_t)sizeof(double));
    if (!e->host_values) return umt_last_status();
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&e->host_done, cudaEventDisableTiming));
    return UMT_OK;
}

static umt_status create(umt_engine *e, const umt_dist_process *process, const umt_dist_options *options,
                         const umt_bucket_plan *plan) {
    UMT_CUDA_TRY(cudaStreamCreateWithFlags(&e->communication, cudaStreamNonBlocking));
    UMT_TRY(make_communicator(e, process, options));
    UMT_TRY(broadcast_model(e));
    UMT_TRY(make_buckets(e, plan));
    /* One watchdog slot per bucket, and one for the host reductions. */
    return umt_watchdog_start(e->comm, e->ctx->options.cuda_device, e->rank, options->timeout_s,
                              plan->bucket_count + 1, &e->watchdog);
}

/* A tensor a subsystem holds elsewhere than its kind's pool (core/tensor.h: kind_pool). */
static bool any_gradient_held(const umt_context *ctx) {
    for (int i = 0; i < ctx->parameter_count; ++i)
        if (ctx->parameters[i]->grad->pool != ctx->parameters[i]->grad->kind_pool) return true;
    return false;
}

umt_status umt_engine_create(umt_context *ctx, const umt_dist_process *process, const umt_dist_options *options,
                             const umt_bucket_plan *plan, umt_engine **out) {
    if (ctx->options.device != UMT_DEVICE_CUDA)
        return umt_fail(UMT_ERR_UNSUPPORTED, "rank %d of %d: data parallelism needs --device cuda (NCCL)",
                        process->rank, process->size);
    umt_engine *e = calloc(1, sizeof *e);
    if (!e) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "rank %d: no memory for the NCCL engine", process->rank);
    *e = (umt_engine){.ctx = ctx, .rank = process->rank, .size = process->size, .compute = umt_cuda_stream(),
                      .reduce_dtype = options->reduce_bf16 ? UMT_BF16 : UMT_F32, .in_place = any_gradient_held(ctx)};
    umt_status status = create(e, process, options, plan);
    if (status != UMT_OK) {
        umt_engine_destroy(e);
        return status;
    }
    *out = e;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Each step */

static umt_status pack(umt_engine *e, const umt_bucket_plan *plan, int b, bool into_buffer) {
    const umt_backend *backend = e->ctx->backend;
    char *buffer = e->buckets[b].buffer->data;
    size_t element = umt_dtype_size(e->reduce_dtype);
    for (int i = plan->first[b]; i < plan->first[b + 1]; ++i) {
        int p = plan->order[i];
        umt_tensor *grad = e->ctx->parameters[p]->grad;
        void *slice = buffer + (size_t)plan->offset[p] * element;
        if (e->reduce_dtype == UMT_F32)
            UMT_TRY(into_buffer ? backend->f32.copy(slice, grad->data, grad->bytes) : backend->f32.copy(grad->data, slice, grad->bytes));
        else if (into_buffer)
            UMT_TRY(backend->f32.convert(grad->data, UMT_F32, slice, e->reduce_dtype, grad->numel));
        else
            UMT_TRY(backend->f32.convert(slice, e->reduce_dtype, grad->data, UMT_F32, grad->numel));
    }
    return UMT_OK;
}

umt_status umt_engine_start_buckets(umt_engine *e, const umt_bucket_plan *plan, int first, int count) {
    UMT_TRY(umt_watchdog_check(e->watchdog));
    for (int b = first; b < first + count; ++b) {
        bucket_state *s = &e->buckets[b];
        UMT_TRY(pack(e, plan, b, true));
        UMT_CUDA_TRY(cudaEventRecord(s->packed, e->compute));
        UMT_CUDA_TRY(cudaStreamWaitEvent(e->communication, s->packed, 0));
        NCCL_TRY(e, ncclAllReduce(s->buffer->data, s->buffer->data, (size_t)s->buffer->numel, nccl_type(e->reduce_dtype),
                                  ncclAvg, e->comm, e->communication));
        UMT_CUDA_TRY(cudaEventRecord(s->done, e->communication));
        umt_watchdog_mark(e->watchdog, b, s->done);
    }
    return UMT_OK;
}

bool umt_engine_in_place(const umt_engine *e) { return e->in_place; }

umt_status umt_engine_reduce_in_place(umt_engine *e, void *data, int64_t numel) {
    UMT_TRY(umt_watchdog_check(e->watchdog));
    UMT_CUDA_TRY(cudaEventRecord(e->gradient_final, e->compute));
    UMT_CUDA_TRY(cudaStreamWaitEvent(e->communication, e->gradient_final, 0));
    NCCL_TRY(e, ncclAllReduce(data, data, (size_t)numel, ncclFloat32, ncclAvg, e->comm, e->communication));
    UMT_CUDA_TRY(cudaEventRecord(e->gradient_reduced, e->communication));
    umt_watchdog_mark(e->watchdog, 0, e->gradient_reduced);
    UMT_CUDA_TRY(cudaStreamWaitEvent(e->compute, e->gradient_reduced, 0));
    return UMT_OK;
}

umt_status umt_engine_finish(umt_engine *e, const umt_bucket_plan *plan) {
    for (int b = 0; b < e->bucket_count; ++b) {
        UMT_CUDA_TRY(cudaStreamWaitEvent(e->compute, e->buckets[b].done, 0));
        UMT_TRY(pack(e, plan, b, false));
    }
    return umt_watchdog_check(e->watchdog);
}

umt_status umt_engine_reduce_host(umt_engine *e, double *values, int count, bool maximum) {
    if (count <= 0 || count > HOST_VALUES)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "rank %d: reducing %d host values, expected 1..%d", e->rank, count,
                        HOST_VALUES);
    UMT_TRY(umt_watchdog_check(e->watchdog));
    size_t bytes = (size_t)count * sizeof *values;
    UMT_TRY(e->ctx->backend->f32.upload(e->host_values->data, values, bytes));
    NCCL_TRY(e, ncclAllReduce(e->host_values->data, e->host_values->data, (size_t)count, ncclFloat64,
                              maximum ? ncclMax : ncclSum, e->comm, e->compute));
    UMT_CUDA_TRY(cudaEventRecord(e->host_done, e->compute));
    /* In place, slot 0 is the gradients' (there are no buckets). */
    umt_watchdog_mark(e->watchdog, e->in_place ? 1 : e->bucket_count, e->host_done);
    umt_status status = e->ctx->backend->f32.download(values, e->host_values->data, bytes);
    /* After an abort the wait ends with whatever the buffer held: the watchdog's word wins. */
    UMT_TRY(umt_watchdog_check(e->watchdog));
    return status;
}

void umt_engine_destroy(umt_engine *e) {
    if (!e) return;
    if (e->compute) cudaStreamSynchronize(e->compute);
    if (e->communication) cudaStreamSynchronize(e->communication);
    bool aborted = e->watchdog && umt_watchdog_aborted(e->watchdog);
    umt_watchdog_stop(e->watchdog);
    /* An aborted communicator is gone already. */
    if (e->comm_made && !aborted) ncclCommDestroy(e->comm);
    for (int b = 0; b < e->bucket_count; ++b) {
        if (e->buckets[b].packed) cudaEventDestroy(e->buckets[b].packed);
        if (e->buckets[b].done) cudaEventDestroy(e->buckets[b].done);
        umt_tensor_free(e->buckets[b].buffer);
    }
    if (e->host_done) cudaEventDestroy(e->host_done);
    if (e->gradient_final) cudaEventDestroy(e->gradient_final);
    if (e->gradient_reduced) cudaEventDestroy(e->gradient_reduced);
    umt_tensor_free(e->host_values);
    if (e->communication) cudaStreamDestroy(e->communication);
    free(e->buckets);
    free(e);
}
