/* core/step_values.c — the step's host values: a pinned ring and one stable device block. */
#include "core/step_values.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

/* Enough for the indices of a batch of 8192 samples; a larger step grows the block. */
#define MIN_CAPACITY ((size_t)64 << 10)
/* Each value starts on a 16-byte boundary, so kernels may read it with any load. */
#define VALUE_ALIGN 16

static bool on_gpu(const umt_context *ctx) { return ctx->options.device == UMT_DEVICE_CUDA; }

/* What a ring of capacity per slot grows to for bytes. */
static size_t grown_capacity(size_t capacity, size_t bytes) {
    capacity = capacity ? 2 * capacity : MIN_CAPACITY;
    while (capacity < bytes) capacity *= 2;
    return capacity;
}

size_t umt_step_values_capacity_for(size_t bytes) { return bytes ? grown_capacity(0, bytes) : 0; }

/* A ring of at least bytes per slot. The old buffers are not freed: queued copies and kernels
 * may still read them; their pools free them with the context (growth is rare and doubles). */
static umt_status grow(umt_context *ctx, size_t bytes) {
    umt_step_values *v = &ctx->values;
    size_t capacity = grown_capacity(v->capacity, bytes);
    void *host = NULL, *device = NULL;
    UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_STAGING, capacity * UMT_STEP_VALUE_SLOTS, &host));
    if (on_gpu(ctx)) UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_INPUTS, capacity, &device));
    /* This step's values so far move along to the new slot. */
    if (v->used) memcpy((char *)host + (size_t)v->slot * capacity, v->host + (size_t)v->slot * v->capacity, v->used);
    v->host = host;
    v->device = device;
    v->capacity = capacity;
    return UMT_OK;
}

#ifdef UMT_WITH_CUDA
/* The context's compute stream, the context bound to the calling thread. */
static cudaStream_t stream_of(const umt_context *ctx) {
    umt_device_bind(ctx);
    return umt_cuda_stream();
}

/* The slot's copies so far are the last to read it until the ring comes round again. */
static umt_status mark_slot(umt_context *ctx, umt_step_values *v) {
    if (!v->events[v->slot]) UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&v->events[v->slot],
                                                                   cudaEventDisableTiming));
    UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)v->events[v->slot], stream_of(ctx)));
    return UMT_OK;
}
#endif

umt_status umt_step_values_begin(umt_context *ctx) {
    umt_step_values *v = &ctx->values;
    /* Inside a capture the slot was chosen before it began; events cannot be waited on there. */
    if (v->recording) return UMT_OK;
#ifdef UMT_WITH_CUDA
    if (on_gpu(ctx) && v->used) UMT_TRY(mark_slot(ctx, v));
    v->slot = (v->slot + 1) % UMT_STEP_VALUE_SLOTS;
    /* Normally long finished: a wait here means the host is a whole ring of steps ahead. */
    if (on_gpu(ctx) && v->events[v->slot]) UMT_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)v->events[v->slot]));
#endif
    v->used = 0;
    return UMT_OK;
}

/* Room for bytes in this step's slot: *offset within it. */
static umt_status reserve(umt_context *ctx, size_t bytes, size_t *offset) {
    umt_step_values *v = &ctx->values;
    size_t start = (v->used + VALUE_ALIGN - 1) / VALUE_ALIGN * VALUE_ALIGN;
    if (start + bytes > v->capacity) {
        /* The graph would read values from the old block that the flush no longer fills. */
        if (v->recording) {
            v->unreplayable = "the step's values outgrew their block during the capture";
            return umt_fail(UMT_ERR_STATE, "step graph: %s", v->unreplayable);
        }
        UMT_TRY(grow(ctx, start + bytes));
    }
    v->used = start + bytes;
    *offset = start;
    return UMT_OK;
}

static char *slot_at(umt_step_values *v, size_t offset) { return v->host + (size_t)v->slot * v->capacity + offset; }

static void *device_at(umt_context *ctx, size_t offset) {
    umt_step_values *v = &ctx->values;
    return on_gpu(ctx) ? (void *)(v->device + offset) : (void *)slot_at(v, offset);
}

static umt_status add_record(umt_step_values *v, umt_step_value_record record) {
    if (v->record_count == v->record_slots) {
        int slots = v->record_slots ? 2 * v->record_slots : 16;
        umt_step_value_record *grown = realloc(v->records, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "step graph: no memory for %d value records", slots);
        v->records = grown;
        v->record_slots = slots;
    }
    v->records[v->record_count++] = record;
    return UMT_OK;
}

umt_status umt_step_values_input(umt_context *ctx, const void *src, size_t bytes, void **device) {
    umt_step_values *v = &ctx->values;
    size_t offset = 0;
    UMT_TRY(reserve(ctx, bytes, &offset));
    memcpy(slot_at(v, offset), src, bytes);
    *device = device_at(ctx, offset);
    if (v->recording) {
        const char *input = v->input;
        if (!input || (const char *)src < input || (const char *)src + bytes > input + v->input_bytes) {
            v->unreplayable = "the step read host memory other than its input (a replay could not follow it)";
            return UMT_OK;
        }
        size_t input_offset = (size_t)((const char *)src - input);
        return add_record(v, (umt_step_value_record){offset, bytes, NULL, NULL, NULL, input_offset});
    }
#ifdef UMT_WITH_CUDA
    /* From pinned memory: queued, the host goes on; the slot's event guards the buffer. */
    if (on_gpu(ctx)) UMT_CUDA_TRY(cudaMemcpyAsync(*device, slot_at(v, offset), bytes, cudaMemcpyHostToDevice,
                                                  stream_of(ctx)));
#endif
    return UMT_OK;
}

umt_status umt_step_values_remade(umt_context *ctx, size_t bytes, umt_step_value_redo redo, void *object,
                                  void **device) {
    umt_step_values *v = &ctx->values;
    if (!v->recording) return umt_fail(UMT_ERR_STATE, "umt_step_values_remade: no capture is being recorded");
    size_t offset = 0;
    UMT_TRY(reserve(ctx, bytes, &offset));
    redo(object, slot_at(v, offset), bytes);
    *device = device_at(ctx, offset);
    return add_record(v, (umt_step_value_record){offset, bytes, redo, NULL, object, 0});
}

umt_status umt_step_values_host_effect(umt_context *ctx, umt_step_value_redo redo, umt_step_value_redo undo,
                                       void *object) {
    umt_step_values *v = &ctx->values;
    if (!v->recording) return umt_fail(UMT_ERR_STATE, "umt_step_values_host_effect: no capture is being recorded");
    return add_record(v, (umt_step_value_record){0, 0, redo, undo, object, 0});
}

void umt_step_values_undo(umt_context *ctx) {
    umt_step_values *v = &ctx->values;
    for (int i = v->record_count - 1; i >= 0; --i)
        if (v->records[i].undo) v->records[i].undo(v->records[i].object, NULL, 0);
    v->record_count = 0;
}

umt_status umt_step_values_flush(umt_context *ctx) {
    umt_step_values *v = &ctx->values;
    if (!v->used || !on_gpu(ctx)) return UMT_OK;
#ifdef UMT_WITH_CUDA
    UMT_CUDA_TRY(cudaMemcpyAsync(v->device, slot_at(v, 0), v->used, cudaMemcpyHostToDevice, stream_of(ctx)));
#endif
    return UMT_OK;
}

void umt_step_values_unreplayable(umt_context *ctx, const char *why) {
    if (ctx->values.recording) ctx->values.unreplayable = why;
}

umt_status umt_step_values_record_begin(umt_context *ctx, const void *input, size_t input_bytes) {
    umt_step_values *v = &ctx->values;
    /* A step whose eager runs handed over no values (one fed by a loader's held batch) still
     * records a few in the capture (the rate, dropout seeds), which may not grow the ring. */
    if (!v->capacity) UMT_TRY(grow(ctx, MIN_CAPACITY));
    UMT_TRY(umt_step_values_begin(ctx));
    v->recording = true;
    v->input = input;
    v->input_bytes = input_bytes;
    v->record_count = 0;
    v->unreplayable = NULL;
    v->skipped_zero_fill = false;
    return UMT_OK;
}

void umt_step_values_record_end(umt_context *ctx) {
    umt_step_values *v = &ctx->values;
    v->recording = false;
    v->input = NULL;
    v->recorded_bytes = v->used;
}

umt_status umt_step_values_replay(umt_context *ctx, const void *input) {
    umt_step_values *v = &ctx->values;
    UMT_TRY(umt_step_values_begin(ctx));
    v->used = v->recorded_bytes;
    for (int i = 0; i < v->record_count; ++i) {
        const umt_step_value_record *r = &v->records[i];
        if (r->redo)
            r->redo(r->object, slot_at(v, r->offset), r->bytes);
        else
            memcpy(slot_at(v, r->offset), (const char *)input + r->input_offset, r->bytes);
    }
    return umt_step_values_flush(ctx);
}

const void *umt_step_values_device_block(const umt_context *ctx) { return ctx->values.device; }

void umt_step_values_release(umt_context *ctx) {
    umt_step_values *v = &ctx->values;
#ifdef UMT_WITH_CUDA
    for (int i = 0; i < UMT_STEP_VALUE_SLOTS; ++i)
        if (v->events[i]) cudaEventDestroy((cudaEvent_t)v->events[i]);
#endif
    free(v->records);
    /* The buffers belong to their pools, which free them with the context. */
    *v = (umt_step_values){0};
}
