/* memory/trace.c — the Chrome trace-event file of UMT_MEM_TRACE (see trace.h). */
#include "memory/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/base/error.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#endif

/* A device interval whose events may not have happened yet. */
typedef struct {
    void *begin, *end;
    char name[48];        /* a copy: the tensor that named it may be gone when it is written */
    const char *category; /* a string literal */
    int track;
    size_t bytes;
} pending_interval;

struct umt_trace {
    FILE *file;
    double start_s;
    bool first_event;
    void *reference; /* CUDA event on the compute stream at open: device time zero */
    pending_interval *pending;
    int pending_count, pending_slots;
};

static double host_us(const umt_trace *t) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * ((double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t->start_s);
}

/* Starts one event object (the separator between events is written here). */
static void begin_event(umt_trace *t) {
    fputs(t->first_event ? "\n" : ",\n", t->file);
    t->first_event = false;
}

static const char *const track_names[] = {"host", "copy in (host to device)", "compute", "copy out (device to host)",
                                          "update (beside compute)", "copy in, optimizer state (host to device)",
                                          "update on the CPU (host threads)"};

umt_status umt_trace_open(const char *path, void *stream, umt_trace **out) {
    *out = NULL;
    umt_trace *t = calloc(1, sizeof *t);
    if (!t) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "UMT_MEM_TRACE: no memory for the trace");
    t->file = fopen(path, "w");
    if (!t->file) {
        free(t);
        return umt_fail(UMT_ERR_IO, "UMT_MEM_TRACE: cannot write '%s'", path);
    }
    t->start_s = 0;
    t->start_s = host_us(t) * 1e-6;
    t->first_event = true;
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", t->file);
    for (int k = 0; k < UMT_TRACE_TRACKS; ++k) {
        begin_event(t);
        fprintf(t->file, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                k, track_names[k]);
    }
#ifdef UMT_WITH_CUDA
    if (stream) {
        cudaError_t e = cudaEventCreate((cudaEvent_t *)&t->reference);
        if (e == cudaSuccess) e = cudaEventRecord((cudaEvent_t)t->reference, (cudaStream_t)stream);
        if (e != cudaSuccess) {
            fclose(t->file);
            free(t);
            return umt_fail(UMT_ERR_DEVICE, "UMT_MEM_TRACE: reference event: %s", cudaGetErrorString(e));
        }
    }
#else
    (void)stream;
#endif
    *out = t;
    return UMT_OK;
}

void umt_trace_counters(umt_trace *t, const size_t in_use_bytes[UMT_POOL_COUNT]) {
    if (!t) return;
    begin_event(t);
    fprintf(t->file, "{\"name\": \"pool bytes\", \"ph\": \"C\", \"pid\": 1, \"tid\": 0, \"ts\": %.3f, \"args\": {", host_us(t));
    for (int p = 0; p < UMT_POOL_COUNT; ++p)
        fprintf(t->file, "%s\"%s\": %zu", p ? ", " : "", umt_pool_name((umt_pool)p), in_use_bytes[p]);
    fputs("}}", t->file);
}

void umt_trace_alloc(umt_trace *t, umt_pool pool, size_t bytes, bool freed) {
    if (!t) return;
    begin_event(t);
    fprintf(t->file, "{\"name\": \"%s %s\", \"cat\": \"allocation\", \"ph\": \"i\", \"s\": \"t\", \"pid\": 1, \"tid\": 0, "
            "\"ts\": %.3f, \"args\": {\"pool\": \"%s\", \"bytes\": %zu}}", freed ? "free" : "alloc", umt_pool_name(pool),
            host_us(t), umt_pool_name(pool), bytes);
}

#ifdef UMT_WITH_CUDA

/* Writes the intervals whose end event has happened (all of them with wait); keeps the rest. */
static void write_finished(umt_trace *t, bool wait) {
    int kept = 0;
    for (int i = 0; i < t->pending_count; ++i) {
        pending_interval *p = &t->pending[i];
        if (wait) cudaEventSynchronize((cudaEvent_t)p->end);
        if (cudaEventQuery((cudaEvent_t)p->end) != cudaSuccess) {
            t->pending[kept++] = *p;
            continue;
        }
        float begin_ms = 0, end_ms = 0;
        cudaEventElapsedTime(&begin_ms, (cudaEvent_t)t->reference, (cudaEvent_t)p->begin);
        cudaEventElapsedTime(&end_ms, (cudaEvent_t)t->reference, (cudaEvent_t)p->end);
        begin_event(t);
        fprintf(t->file, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f, "
                "\"dur\": %.3f, \"args\": {\"bytes\": %zu}}", p->name, p->category, p->track, 1e3 * begin_ms,
                1e3 * (end_ms - begin_ms), p->bytes);
        cudaEventDestroy((cudaEvent_t)p->begin);
        cudaEventDestroy((cudaEvent_t)p->end);
    }
    t->pending_count = kept;
}

void *umt_trace_begin(umt_trace *t, void *stream) {
    if (!t || !t->reference) return NULL;
    cudaEvent_t e = NULL;
    if (cudaEventCreate(&e) != cudaSuccess) return NULL;
    cudaEventRecord(e, (cudaStream_t)stream);
    return e;
}

void umt_trace_end(umt_trace *t, void *stream, void *begin, const char *name, const char *category, int track,
                   size_t bytes) {
    if (!t || !begin) return;
    if (t->pending_count == t->pending_slots) {
        int slots = t->pending_slots ? 2 * t->pending_slots : 256;
        pending_interval *grown = realloc(t->pending, (size_t)slots * sizeof *grown);
        if (!grown) return; /* the trace loses an interval rather than the run failing */
        t->pending = grown;
        t->pending_slots = slots;
    }
    cudaEvent_t end = NULL;
    if (cudaEventCreate(&end) != cudaSuccess) return;
    cudaEventRecord(end, (cudaStream_t)stream);
    pending_interval *p = &t->pending[t->pending_count++];
    *p = (pending_interval){.begin = begin, .end = end, .category = category, .track = track, .bytes = bytes};
    snprintf(p->name, sizeof p->name, "%s", name);
}

#else

static void write_finished(umt_trace *t, bool wait) { (void)t, (void)wait; }

void *umt_trace_begin(umt_trace *t, void *stream) {
    (void)t, (void)stream;
    return NULL;
}

void umt_trace_end(umt_trace *t, void *stream, void *begin, const char *name, const char *category, int track,
                   size_t bytes) {
    (void)t, (void)stream, (void)begin, (void)name, (void)category, (void)track, (void)bytes;
}

#endif

void umt_trace_mark(umt_trace *t, const char *name) {
    if (!t) return;
    write_finished(t, false);
    begin_event(t);
    fprintf(t->file, "{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 1, \"tid\": 0, \"ts\": %.3f}",
            name, host_us(t));
}

void umt_trace_close(umt_trace *t) {
    if (!t) return;
    write_finished(t, true);
    fputs("\n]}\n", t->file);
    fclose(t->file);
#ifdef UMT_WITH_CUDA
    if (t->reference) cudaEventDestroy((cudaEvent_t)t->reference);
#endif
    free(t->pending);
    free(t);
}
