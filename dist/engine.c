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
 *
 * Inside a step graph's capture the same calls build the graph: the event after the pack forks
 * the communication stream into the capture, the all-reduce becomes the graph's NCCL node on that
 * branch, and the compute stream's wait on "done" joins it back before the unpack, so that a
 * replay overlaps the all-reduces with the rest of backward as an eager step does. A capture
 * uses events of its own (an event last recorded in a capture cannot be queried, and the
 * watchdog queries the eager ones), and the watchdog follows a replay as a whole instead: an
 * event recorded after each launch (umt_engine_after_replay).
 *
 * The average. f32 buckets use ncclAvg (each rank's gradient times 1/N in f32, then summed). In
 * bf16 ncclAvg would multiply by 1/N rounded to bf16's 8 bits (1/3 becomes 0.333984: every
 * average 0.2% too large), so where 1/N is not a power of two the buckets are summed (ncclSum)
 * and the sum multiplied by 1/N in f32 after the conversion back (dist/README.md, "Numerics").
 */
#include "dist/engine.h"

#include <stdio.h>
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

/* Host values per umt_engine_reduce_host; elements of 1/N (bf16 sums scaled after, in chunks). */
enum { HOST_VALUES = 64, INVERSE_ELEMENTS = 1 << 20 };

typedef struct {
    umt_tensor *buffer; /* the bucket's gradients, contiguous, in the reduce dtype */
    cudaEvent_t packed; /* on the compute stream, after the pack */
    cudaEvent_t done;   /* on the communication stream, after the all-reduce */
    cudaEvent_t captured_packed, captured_done; /* the same inside a step graph's capture */
} bucket_state;

struct umt_engine {
    umt_context *ctx;
    int rank, size;
    ncclComm_t comm;
    bool comm_made;
    cudaStream_t compute, communication;
    umt_dtype reduce_dtype;
    ncclRedOp_t reduce_op; /* ncclAvg, or ncclSum with the 1/N in f32 after it (the file's comment) */
    umt_tensor *inverse;   /* ncclSum: INVERSE_ELEMENTS floats of 1/N */
    bucket_state *buckets;
    int bucket_count;
    int slot_host, slot_replay; /* the watchdog's slots past the buckets' */
    cudaEvent_t replayed;       /* after each launch of a captured step */
    int64_t eager_collectives, captured_collectives;
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
        UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->captured_packed, cudaEventDisableTiming));
        UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->captured_done, cudaEventDisableTiming));
    }
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&e->replayed, cudaEventDisableTiming));
    if (e->reduce_op == ncclSum && e->bucket_count > 0) {
        e->inverse = umt_tensor_new_1d(e->ctx, UMT_POOL_GRADS, UMT_F32, INVERSE_ELEMENTS);
        if (!e->inverse) return umt_last_status();
        UMT_TRY(umt_kernels(e->ctx)->f32.fill(e->inverse->data, INVERSE_ELEMENTS, 1.0f / (float)e->size));
    }
    e->host_values = umt_tensor_new_1d(e->ctx, UMT_POOL_GRADS, UMT_U8, HOST_VALUES * (int64_t)sizeof(double));
    if (!e->host_values) return umt_last_status();
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&e->host_done, cudaEventDisableTiming));
    return UMT_OK;
}

static umt_status create(umt_engine *e, const umt_dist_process *process, const umt_dist_options *options,
                         const umt_bucket_plan *plan) {
    /* The highest priority: a bucket's all-reduce (a few blocks) starts as soon as its gradients
     * are in, not after the compute stream's queued kernels (kernels/cuda/backend.cu). */
    int least, greatest;
    UMT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    UMT_CUDA_TRY(cudaStreamCreateWithPriority(&e->communication, cudaStreamNonBlocking, greatest));
    UMT_TRY(make_communicator(e, process, options));
    UMT_TRY(broadcast_model(e));
    UMT_TRY(make_buckets(e, plan));
    /* One watchdog slot per bucket, one for the host reductions, one for a step graph's replay. */
    e->slot_host = plan->bucket_count;
    e->slot_replay = plan->bucket_count + 1;
    UMT_TRY(umt_watchdog_start(e->comm, e->ctx->options.cuda_device, e->rank, options->timeout_s,
                               plan->bucket_count + 2, &e->watchdog));
    char name[64];
    for (int b = 0; b < plan->bucket_count; ++b) {
        if (e->in_place) snprintf(name, sizeof name, "a gradient's all-reduce (in place)");
        else snprintf(name, sizeof name, "bucket %d's all-reduce", b);
        umt_watchdog_name(e->watchdog, b, name);
    }
    umt_watchdog_name(e->watchdog, e->slot_host, "a host reduction (umt_dist_sum or umt_dist_max)");
    umt_watchdog_name(e->watchdog, e->slot_replay, "a replayed step graph (its all-reduces)");
    return UMT_OK;
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
    umt_device_bind(ctx); /* the compute stream below is the context's */
    *e = (umt_engine){.ctx = ctx, .rank = process->rank, .size = process->size, .compute = umt_cuda_stream(),
                      .reduce_dtype = options->reduce_bf16 ? UMT_BF16 : UMT_F32, .in_place = any_gradient_held(ctx)};
    /* 1/N is exact in bf16 when N is a power of two (1, 2, 4, ...): NCCL's average is then right. */
    bool exact_inverse = (process->size & (process->size - 1)) == 0;
    e->reduce_op = e->reduce_dtype == UMT_BF16 && !exact_inverse ? ncclSum : ncclAvg;
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

/* A summed gradient (ncclSum) times 1/N, in f32, in chunks of the inverse's length. */
static umt_status divide(umt_engine *e, umt_tensor *grad) {
    float *g = grad->data;
    for (int64_t at = 0; at < grad->numel; at += INVERSE_ELEMENTS) {
        int64_t n = grad->numel - at < INVERSE_ELEMENTS ? grad->numel - at : INVERSE_ELEMENTS;
        UMT_TRY(umt_kernels(e->ctx)->f32.mul(g + at, e->inverse->data, g + at, n));
    }
    return UMT_OK;
}

static umt_status pack(umt_engine *e, const umt_bucket_plan *plan, int b, bool into_buffer) {
    const umt_backend *backend = umt_kernels(e->ctx);
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
        if (!into_buffer && e->reduce_op == ncclSum) UMT_TRY(divide(e, grad));
    }
    return UMT_OK;
}

/* Whether the compute stream is being captured into a step graph now. */
static umt_status capturing(const umt_engine *e, bool *out) {
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    UMT_CUDA_TRY(cudaStreamIsCapturing(e->compute, &status));
    *out = status != cudaStreamCaptureStatusNone;
    return UMT_OK;
}

umt_status umt_engine_start_buckets(umt_engine *e, const umt_bucket_plan *plan, int first, int count) {
    UMT_TRY(umt_watchdog_check(e->watchdog));
    bool captured;
    UMT_TRY(capturing(e, &captured));
    for (int b = first; b < first + count; ++b) {
        bucket_state *s = &e->buckets[b];
        cudaEvent_t packed = captured ? s->captured_packed : s->packed, done = captured ? s->captured_done : s->done;
        UMT_TRY(pack(e, plan, b, true));
        /* Inside a capture: the fork of the communication branch from backward. */
        UMT_CUDA_TRY(cudaEventRecord(packed, e->compute));
        UMT_CUDA_TRY(cudaStreamWaitEvent(e->communication, packed, 0));
        NCCL_TRY(e, ncclAllReduce(s->buffer->data, s->buffer->data, (size_t)s->buffer->numel, nccl_type(e->reduce_dtype),
                                  e->reduce_op, e->comm, e->communication));
        UMT_CUDA_TRY(cudaEventRecord(done, e->communication));
        if (captured) {
            e->captured_collectives++;
        } else {
            e->eager_collectives++;
            umt_watchdog_mark(e->watchdog, b, done);
        }
    }
    return UMT_OK;
}

bool umt_engine_in_place(const umt_engine *e) { return e->in_place; }

umt_status umt_engine_reduce_in_place(umt_engine *e, void *data, int64_t numel) {
    UMT_TRY(umt_watchdog_check(e->watchdog));
    /* The offload tier's steps are never captured (its table is unreplayable); a capture that is
     * about to be refused still reaches here, and must not leave a captured event to the watchdog. */
    bool captured;
    UMT_TRY(capturing(e, &captured));
    UMT_CUDA_TRY(cudaEventRecord(e->gradient_final, e->compute));
    UMT_CUDA_TRY(cudaStreamWaitEvent(e->communication, e->gradient_final, 0));
    NCCL_TRY(e, ncclAllReduce(data, data, (size_t)numel, ncclFloat32, ncclAvg, e->comm, e->communication));
    UMT_CUDA_TRY(cudaEventRecord(e->gradient_reduced, e->communication));
    if (!captured) umt_watchdog_mark(e->watchdog, 0, e->gradient_reduced);
    UMT_CUDA_TRY(cudaStreamWaitEvent(e->compute, e->gradient_reduced, 0));
    return UMT_OK;
}

umt_status umt_engine_finish(umt_engine *e, const umt_bucket_plan *plan) {
    bool captured;
    UMT_TRY(capturing(e, &captured));
    /* Bucket by bucket: each unpack waits for its own all-reduce only. In a capture, the join of
     * the communication branch back into the step. */
    for (int b = 0; b < e->bucket_count; ++b) {
        UMT_CUDA_TRY(cudaStreamWaitEvent(e->compute, captured ? e->buckets[b].captured_done : e->buckets[b].done, 0));
        UMT_TRY(pack(e, plan, b, false));
    }
    return umt_watchdog_check(e->watchdog);
}

umt_status umt_engine_before_replay(umt_engine *e) { return umt_watchdog_check(e->watchdog); }

umt_status umt_engine_after_replay(umt_engine *e) {
    /* The replay's collectives are done when the compute stream passes this point (the graph
     * joins its communication branches before its end). */
    UMT_CUDA_TRY(cudaEventRecord(e->replayed, e->compute));
    umt_watchdog_mark(e->watchdog, e->slot_replay, e->replayed);
    return UMT_OK;
}

void umt_engine_counts(const umt_engine *e, int64_t *eager, int64_t *captured) {
    *eager = e->eager_collectives;
    *captured = e->captured_collectives;
}

umt_status umt_engine_reduce_host(umt_engine *e, double *values, int count, bool maximum) {
    if (count <= 0 || count > HOST_VALUES)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "rank %d: reducing %d host values, expected 1..%d", e->rank, count,
                        HOST_VALUES);
    UMT_TRY(umt_watchdog_check(e->watchdog));
    size_t bytes = (size_t)count * sizeof *values;
    UMT_TRY(umt_kernels(e->ctx)->f32.upload(e->host_values->data, values, bytes));
    NCCL_TRY(e, ncclAllReduce(e->host_values->data, e->host_values->data, (size_t)count, ncclFloat64,
                              maximum ? ncclMax : ncclSum, e->comm, e->compute));
    UMT_CUDA_TRY(cudaEventRecord(e->host_done, e->compute));
    umt_watchdog_mark(e->watchdog, e->slot_host, e->host_done);
    umt_status status = umt_kernels(e->ctx)->f32.download(values, e->host_values->data, bytes);
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
        bucket_state *s = &e->buckets[b];
        cudaEvent_t events[] = {s->packed, s->done, s->captured_packed, s->captured_done};
        for (size_t i = 0; i < sizeof events / sizeof *events; ++i)
            if (events[i]) cudaEventDestroy(events[i]);
        umt_tensor_free(s->buffer);
    }
    if (e->replayed) cudaEventDestroy(e->replayed);
    umt_tensor_free(e->inverse);
    if (e->host_done) cudaEventDestroy(e->host_done);
    if (e->gradient_final) cudaEventDestroy(e->gradient_final);
    if (e->gradient_reduced) cudaEventDestroy(e->gradient_reduced);
    umt_tensor_free(e->host_values);
    if (e->communication) cudaStreamDestroy(e->communication);
    free(e->buckets);
    free(e);
}
