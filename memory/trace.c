/* memory/trace.c — the Chrome trace-event file of UMT_MEM_TRACE (see trace.h). */
#include "memory/trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/base/error.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#endif

/* The longest event the trace writes (the counter event of every pool is the longest by far). */
#define EVENT_CHARS 1024
/* Names in events: a copy, cut to this, since the tensor that named it may be gone when it is written. */
#define NAME_CHARS 48

/* A device interval whose events may not have happened yet. */
typedef struct {
    void *begin, *end;
    char name[NAME_CHARS];
    const char *category; /* a string literal */
    int track;
    size_t bytes;
} pending_interval;

struct umt_trace {
    FILE *file;
    /* The file and first_event: CPU threads write their intervals while the main thread writes. */
    pthread_mutex_t lock;
    double start_s;
    bool first_event;
    void *reference; /* CUDA event on the compute stream at open: device time zero */
    /* Device intervals, touched only by the thread that queues the GPU's work. */
    pending_interval *pending;
    int pending_count, pending_slots;
};

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double umt_trace_now_us(const umt_trace *t) { return t ? 1e6 * (seconds_now() - t->start_s) : 0; }

/* name as a JSON string's contents: quotes, backslashes and control characters become '_'. */
static void json_name(char out[NAME_CHARS], const char *name) {
    int i = 0;
    for (; name && name[i] && i < NAME_CHARS - 1; ++i)
        out[i] = name[i] == '"' || name[i] == '\\' || (unsigned char)name[i] < 0x20 ? '_' : name[i];
    out[i] = '\0';
}

/* Writes one event object, with the separator before it, whole or not at all (a cut event would
 * leave the file unreadable). Any thread. */
static void event(umt_trace *t, const char *format, ...) {
    char text[EVENT_CHARS];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(text, sizeof text, format, args);
    va_end(args);
    if (n < 0 || n >= (int)sizeof text) return;
    pthread_mutex_lock(&t->lock);
    fputs(t->first_event ? "\n" : ",\n", t->file);
    fputs(text, t->file);
    t->first_event = false;
    pthread_mutex_unlock(&t->lock);
}

static const char *const track_names[] = {"host", "copy in (host to device)", "compute", "copy out (device to host)",
                                          "update (beside compute)", "copy in, optimizer state (host to device)",
                                          "update on the CPU (host threads)"};

/* Device time zero: an event on the drained compute stream, recorded as the host clock starts;
 * *alignment_us is how long the record and the wait for it took (0 without a device). */
static umt_status start_clocks(umt_trace *t, void *stream, double *alignment_us) {
    *alignment_us = 0;
    t->start_s = seconds_now();
#ifdef UMT_WITH_CUDA
    if (!stream) return UMT_OK;
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaEventCreate((cudaEvent_t *)&t->reference);
    if (e == cudaSuccess) {
        t->start_s = seconds_now();
        e = cudaEventRecord((cudaEvent_t)t->reference, (cudaStream_t)stream);
    }
    if (e == cudaSuccess) e = cudaEventSynchronize((cudaEvent_t)t->reference);
    *alignment_us = umt_trace_now_us(t);
    if (e != cudaSuccess) {
        if (t->reference) cudaEventDestroy((cudaEvent_t)t->reference);
        t->reference = NULL;
        return umt_fail(UMT_ERR_DEVICE, "UMT_MEM_TRACE: reference event: %s", cudaGetErrorString(e));
    }
#else
    (void)stream;
#endif
    return UMT_OK;
}

/* The file's head: otherData says which pools are GPU memory (on the CPU: every pool, in host
 * memory) and the budget, then the tracks' names. */
static void write_head(umt_trace *t, const umt_memory *mem, double alignment_us) {
    bool cuda = mem->device != UMT_DEVICE_CPU;
    fprintf(t->file, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"device\": \"%s\", ", cuda ? "cuda" : "cpu");
    if (cuda)
        fprintf(t->file, "\"budget_bytes\": %zu, \"clock_alignment_us\": %.3f, ", mem->budget_bytes, alignment_us);
    fputs("\"stacked_pools\": [", t->file);
    bool first = true;
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        if (cuda && !umt_placement_uses_device(mem->pools[p].placement)) continue;
        fprintf(t->file, "%s\"%s\"", first ? "" : ", ", umt_pool_name((umt_pool)p));
        first = false;
    }
    fputs("]}, \"traceEvents\": [", t->file);
    for (int k = 0; k < UMT_TRACE_TRACKS; ++k)
        event(t, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, \"args\": {\"name\": \"%s\"}}", k,
              track_names[k]);
}

umt_status umt_trace_open(const char *path, const umt_memory *mem, umt_trace **out) {
    *out = NULL;
    umt_trace *t = calloc(1, sizeof *t);
    if (!t) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "UMT_MEM_TRACE: no memory for the trace");
    t->file = fopen(path, "w");
    if (!t->file) {
        free(t);
        return umt_fail(UMT_ERR_IO, "UMT_MEM_TRACE: cannot write '%s'", path);
    }
    pthread_mutex_init(&t->lock, NULL);
    t->first_event = true;
    double alignment_us = 0;
    umt_status st = start_clocks(t, mem->stream, &alignment_us);
    if (st != UMT_OK) {
        fclose(t->file);
        pthread_mutex_destroy(&t->lock);
        free(t);
        return st;
    }
    write_head(t, mem, alignment_us);
    *out = t;
    return UMT_OK;
}

void umt_trace_counters(umt_trace *t, const size_t in_use_bytes[UMT_POOL_COUNT]) {
    if (!t) return;
    char pools[EVENT_CHARS / 2];
    int used = 0;
    for (int p = 0; p < UMT_POOL_COUNT && used < (int)sizeof pools; ++p)
        used += snprintf(pools + used, sizeof pools - (size_t)used, "%s\"%s\": %zu", p ? ", " : "",
                         umt_pool_name((umt_pool)p), in_use_bytes[p]);
    event(t, "{\"name\": \"pool bytes\", \"ph\": \"C\", \"pid\": 1, \"tid\": 0, \"ts\": %.3f, \"args\": {%s}}",
          umt_trace_now_us(t), pools);
}

void umt_trace_alloc(umt_trace *t, umt_pool pool, size_t bytes, bool freed) {
    if (!t) return;
    event(t, "{\"name\": \"%s %s\", \"cat\": \"allocation\", \"ph\": \"i\", \"s\": \"t\", \"pid\": 1, \"tid\": 0, "
          "\"ts\": %.3f, \"args\": {\"pool\": \"%s\", \"bytes\": %zu}}", freed ? "free" : "alloc", umt_pool_name(pool),
          umt_trace_now_us(t), umt_pool_name(pool), bytes);
}

/* One complete event ("X"): name is already JSON-safe. */
static void interval(umt_trace *t, double begin_us, double end_us, const char *name, const char *category, int track,
                     size_t bytes) {
    event(t, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
          "\"args\": {\"bytes\": %zu}}", name, category, track, begin_us, end_us - begin_us, bytes);
}

void umt_trace_host_interval(umt_trace *t, double begin_us, double end_us, const char *name, const char *category,
                             int track, size_t bytes) {
    if (!t) return;
    char safe[NAME_CHARS];
    json_name(safe, name);
    interval(t, begin_us, end_us, safe, category, track, bytes);
}

#ifdef UMT_WITH_CUDA

/* Writes the intervals whose end event has happened (all of them with wait); keeps the rest. No
 * lock is held while waiting: a host function the wait depends on may be writing its interval. */
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
        interval(t, 1e3 * begin_ms, 1e3 * end_ms, p->name, p->category, p->track, p->bytes);
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
    json_name(p->name, name);
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
    char safe[NAME_CHARS];
    json_name(safe, name);
    event(t, "{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 1, \"tid\": 0, \"ts\": %.3f}",
          safe, umt_trace_now_us(t));
}

void umt_trace_close(umt_trace *t) {
    if (!t) return;
    if (t->reference) write_finished(t, true);
    pthread_mutex_lock(&t->lock);
    fputs("\n]}\n", t->file);
    fclose(t->file);
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_destroy(&t->lock);
#ifdef UMT_WITH_CUDA
    if (t->reference) cudaEventDestroy((cudaEvent_t)t->reference);
#endif
    free(t->pending);
    free(t);
}
