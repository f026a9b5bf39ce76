// bench/kernel_timeline.c — every kernel, memset and copy a program runs on the GPU, with the
// times it really started and ended, written to a CSV file. A CUPTI injection library: CUDA's
// driver loads it into any CUDA program at start-up, so the program itself is not changed.
//
//     CUDA_INJECTION64_PATH=$PWD/lib/libumt_timeline.so UMT_TIMELINE=t.csv bin/mnist_cnn ...
//     python3 bench/kernel_timeline.py t.csv            (bench/kernel_timeline.sh does both)
//
// Why not Nsight Compute (tools/kernel_profile.sh)? It runs each kernel alone, caches flushed,
// one launch at a time: it says what a kernel costs by itself, not what a step is waiting for.
// A step replays a CUDA graph with two streams, so kernels overlap and the gaps between them count.
// CUPTI's activity records carry the GPU's own start and end timestamps for every kernel, graph
// replays included, while the program runs at its normal speed (the records are written into
// buffers that CUPTI hands back to us; we format them on the host, off the GPU's path).
//
// Not part of libumtrain: a development tool, built with --config=cuda only (bench/BUILD).
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// CUPTI wants the buffers it fills aligned to 8 bytes; 8 MiB holds about 30,000 kernel records.
#define TIMELINE_BUFFER_BYTES (8u << 20)
#define TIMELINE_ALIGN 8

static FILE *timeline_file;

// Prints a CUPTI failure with the call that failed; the tool then stays quiet rather than
// stopping the program it watches.
static int cupti_ok(CUptiResult status, const char *call) {
    if (status == CUPTI_SUCCESS) return 1;
    const char *text = NULL;
    cuptiGetResultString(status, &text);
    fprintf(stderr, "kernel_timeline: %s failed: %s\n", call, text ? text : "unknown CUPTI error");
    return 0;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(TIMELINE_ALIGN, TIMELINE_BUFFER_BYTES);
    *size = *buffer ? TIMELINE_BUFFER_BYTES : 0;
    *max_records = 0;  // as many as fit
}

// One CSV line a record: kind, start and end in GPU nanoseconds, the stream, the CUDA graph it
// was replayed from (0 when launched directly), the bytes a memset or copy moved, and the name.
static void write_record(const CUpti_Activity *record) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
        fprintf(timeline_file, "kernel,%llu,%llu,%u,%u,0,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId, k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)record;
        fprintf(timeline_file, "memset,%llu,%llu,%u,%u,%llu,memset\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->graphId, (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)record;
        fprintf(timeline_file, "memcpy,%llu,%llu,%u,%u,%llu,memcpy_kind%u\n", (unsigned long long)c->start,
                (unsigned long long)c->end, c->streamId, c->graphId, (unsigned long long)c->bytes,
                (unsigned)c->copyKind);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)context, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) write_record(record);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_timeline: CUPTI dropped %zu records\n", dropped);
    free(buffer);
}

// At exit, the records still in CUPTI's buffers are handed back and written.
static void flush_at_exit(void) {
    cupti_ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    if (timeline_file) fclose(timeline_file);
    timeline_file = NULL;
}

// Called by CUDA's driver when it starts, because CUDA_INJECTION64_PATH names this library.
int InitializeInjection(void) {
    const char *path = getenv("UMT_TIMELINE");
    if (!path || !*path) path = "kernel_timeline.csv";
    timeline_file = fopen(path, "w");
    if (!timeline_file) {
        fprintf(stderr, "kernel_timeline: cannot write %s\n", path);
        return 0;
    }
    fprintf(timeline_file, "kind,start_ns,end_ns,stream,graph,bytes,name\n");
    if (!cupti_ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                  "cuptiActivityRegisterCallbacks"))
        return 0;
    // CONCURRENT_KERNEL, not KERNEL: the latter serialises kernels to time them.
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMSET,
                                        CUPTI_ACTIVITY_KIND_MEMCPY};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!cupti_ok(cuptiActivityEnable(kinds[i]), "cuptiActivityEnable")) return 0;
    atexit(flush_at_exit);
    return 1;
}
