/* memory/staging.c — the staging ring (see staging.h for a slot's lifecycle). */
#include "memory/staging.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/error.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#endif

typedef struct {
    void *host;   /* staging pool (pinned on CUDA), or malloc'ed in pageable-sync mode */
    void *device; /* inputs pool */
    /* CUDA events: the copy has finished; the compute stream has finished with the device
     * buffer; the compute stream started and stopped waiting for this slot's data. */
    void *copied, *released, *wait_begin, *wait_end;
    bool timing_pending; /* wait_begin/wait_end recorded, not yet added to wait_ms */
    double wait_begin_s; /* the CPU's clock at umt_staging_wait_begin (CPU device) */
} staging_slot;

struct umt_staging {
    umt_memory *mem;
    bool cuda;
    bool pageable_sync;
    void *copy_stream; /* CUDA, pinned mode: the copies' own stream, beside the compute stream */
    int slot_count;
    staging_slot *slots;
    double wait_ms;
};

static double clock_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ----------------------------------------------------------------------------------------- */
/* CUDA: the copy stream and the events (the CPU device has neither) */

#ifdef UMT_WITH_CUDA

static umt_status cuda_create(umt_staging *s) {
    UMT_CUDA_TRY(cudaSetDevice(s->mem->cuda_device));
    /* Non-blocking: copies never wait for (or hold up) the legacy default stream. */
    if (!s->pageable_sync) UMT_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)&s->copy_stream, cudaStreamNonBlocking));
    for (int i = 0; i < s->slot_count; ++i) {
        staging_slot *slot = &s->slots[i];
        UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&slot->copied, cudaEventDisableTiming));
        UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&slot->released, cudaEventDisableTiming));
        UMT_CUDA_TRY(cudaEventCreate((cudaEvent_t *)&slot->wait_begin));
        UMT_CUDA_TRY(cudaEventCreate((cudaEvent_t *)&slot->wait_end));
    }
    return UMT_OK;
}

static void cuda_destroy(umt_staging *s) {
    /* Errors here leave nothing to undo: they are ignored. */
    if (s->copy_stream) cudaStreamSynchronize((cudaStream_t)s->copy_stream);
    for (int i = 0; i < s->slot_count; ++i) {
        staging_slot *slot = &s->slots[i];
        void *events[] = {slot->copied, slot->released, slot->wait_begin, slot->wait_end};
        for (int e = 0; e < 4; ++e)
            if (events[e]) cudaEventDestroy((cudaEvent_t)events[e]);
    }
    if (s->copy_stream) cudaStreamDestroy((cudaStream_t)s->copy_stream);
}

/* Adds a slot's last timed wait to the total; its events are a few steps old by now. */
static umt_status cuda_collect_wait(umt_staging *s, staging_slot *slot) {
    if (!slot->timing_pending) return UMT_OK;
    float ms = 0;
    UMT_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)slot->wait_end));
    UMT_CUDA_TRY(cudaEventElapsedTime(&ms, (cudaEvent_t)slot->wait_begin, (cudaEvent_t)slot->wait_end));
    s->wait_ms += ms;
    slot->timing_pending = false;
    return UMT_OK;
}

static umt_status cuda_submit(umt_staging *s, staging_slot *slot, size_t bytes) {
    cudaStream_t compute = (cudaStream_t)s->mem->stream;
    if (s->pageable_sync) {
        /* The comparison's naive path: the compute stream copies and everything waits. */
        UMT_CUDA_TRY(cudaMemcpyAsync(slot->device, slot->host, bytes, cudaMemcpyHostToDevice, compute));
        UMT_CUDA_TRY(cudaStreamSynchronize(compute));
        return UMT_OK;
    }
    cudaStream_t copy = (cudaStream_t)s->copy_stream;
    /* The device buffer may still be read by work queued on the compute stream. */
    UMT_CUDA_TRY(cudaStreamWaitEvent(copy, (cudaEvent_t)slot->released, 0));
    UMT_CUDA_TRY(cudaMemcpyAsync(slot->device, slot->host, bytes, cudaMemcpyHostToDevice, copy));
    UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)slot->copied, copy));
    return UMT_OK;
}

#endif

/* ----------------------------------------------------------------------------------------- */
/* Creating and destroying */

static umt_status alloc_buffers(umt_staging *s, size_t slot_bytes) {
    for (int i = 0; i < s->slot_count; ++i) {
        staging_slot *slot = &s->slots[i];
        if (s->pageable_sync) {
            /* Deliberately not from a pool: ordinary pageable memory is what this mode compares with. */
            slot->host = malloc(slot_bytes);
            if (!slot->host) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "staging: no memory for a %zu-byte slot", slot_bytes);
        } else {
            UMT_TRY(umt_memory_alloc(s->mem, UMT_POOL_STAGING, slot_bytes, &slot->host));
        }
        UMT_TRY(umt_memory_alloc(s->mem, UMT_POOL_INPUTS, slot_bytes, &slot->device));
    }
    return UMT_OK;
}

umt_status umt_staging_create(umt_memory *mem, int slots, size_t slot_bytes, bool pageable_sync, umt_staging **out) {
    *out = NULL;
    if (slots < 1 || slot_bytes == 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "staging: %d slots of %zu bytes, expected >= 1 of > 0", slots, slot_bytes);
    umt_staging *s = calloc(1, sizeof *s);
    staging_slot *array = calloc((size_t)slots, sizeof *array);
    if (!s || !array) {
        free(s);
        free(array);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "staging: no memory for %d slots", slots);
    }
    *s = (umt_staging){.mem = mem, .cuda = mem->device == UMT_DEVICE_CUDA, .pageable_sync = pageable_sync,
                       .slot_count = slots, .slots = array};
    umt_status status = alloc_buffers(s, slot_bytes);
#ifdef UMT_WITH_CUDA
    if (status == UMT_OK && s->cuda) status = cuda_create(s);
#endif
    if (status != UMT_OK) {
        umt_staging_destroy(s);
        return status;
    }
    *out = s;
    return UMT_OK;
}

void umt_staging_destroy(umt_staging *s) {
    if (!s) return;
#ifdef UMT_WITH_CUDA
    if (s->cuda) cuda_destroy(s);
#endif
    /* Freeing device memory waits for the device, so no queued step still reads a buffer. */
    for (int i = 0; i < s->slot_count; ++i) {
        if (s->pageable_sync) free(s->slots[i].host);
        else umt_memory_free(s->mem, UMT_POOL_STAGING, s->slots[i].host);
        umt_memory_free(s->mem, UMT_POOL_INPUTS, s->slots[i].device);
    }
    free(s->slots);
    free(s);
}

int umt_staging_slots(const umt_staging *s) { return s->slot_count; }
void *umt_staging_host(umt_staging *s, int slot) { return s->slots[slot].host; }
void *umt_staging_device(umt_staging *s, int slot) { return s->slots[slot].device; }

/* ----------------------------------------------------------------------------------------- */
/* The loader's side */

umt_status umt_staging_thread_start(umt_staging *s) {
#ifdef UMT_WITH_CUDA
    /* The runtime's current device is per thread; a new thread starts on device 0. */
    if (s->cuda) UMT_CUDA_TRY(cudaSetDevice(s->mem->cuda_device));
#else
    (void)s;
#endif
    return UMT_OK;
}

umt_status umt_staging_wait_copied(umt_staging *s, int slot) {
#ifdef UMT_WITH_CUDA
    if (s->cuda && !s->pageable_sync) UMT_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)s->slots[slot].copied));
#else
    (void)s, (void)slot;
#endif
    return UMT_OK;
}

umt_status umt_staging_submit(umt_staging *s, int slot, size_t bytes) {
#ifdef UMT_WITH_CUDA
    if (s->cuda) return cuda_submit(s, &s->slots[slot], bytes);
#endif
    /* The CPU device: "device" memory is host memory, and the copy is done when it returns. */
    memcpy(s->slots[slot].device, s->slots[slot].host, bytes);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The compute side */

umt_status umt_staging_wait_begin(umt_staging *s, int slot) {
    staging_slot *sl = &s->slots[slot];
#ifdef UMT_WITH_CUDA
    if (s->cuda) {
        UMT_TRY(cuda_collect_wait(s, sl));
        UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)sl->wait_begin, (cudaStream_t)s->mem->stream));
        return UMT_OK;
    }
#endif
    sl->wait_begin_s = clock_seconds();
    return UMT_OK;
}

umt_status umt_staging_acquire(umt_staging *s, int slot) {
    staging_slot *sl = &s->slots[slot];
#ifdef UMT_WITH_CUDA
    if (s->cuda) {
        cudaStream_t compute = (cudaStream_t)s->mem->stream;
        if (!s->pageable_sync) UMT_CUDA_TRY(cudaStreamWaitEvent(compute, (cudaEvent_t)sl->copied, 0));
        UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)sl->wait_end, compute));
        sl->timing_pending = true;
        return UMT_OK;
    }
#endif
    s->wait_ms += 1e3 * (clock_seconds() - sl->wait_begin_s);
    return UMT_OK;
}

umt_status umt_staging_release(umt_staging *s, int slot) {
#ifdef UMT_WITH_CUDA
    if (s->cuda && !s->pageable_sync)
        UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)s->slots[slot].released, (cudaStream_t)s->mem->stream));
#else
    (void)s, (void)slot;
#endif
    return UMT_OK;
}

umt_status umt_staging_take_wait_ms(umt_staging *s, double *ms) {
#ifdef UMT_WITH_CUDA
    for (int i = 0; s->cuda && i < s->slot_count; ++i) UMT_TRY(cuda_collect_wait(s, &s->slots[i]));
#endif
    *ms = s->wait_ms;
    s->wait_ms = 0;
    return UMT_OK;
}
