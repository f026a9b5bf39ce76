/*
 * memory/trace.h — the memory picture: UMT_MEM_TRACE=path.json writes a Chrome trace-event file
 * (Perfetto and chrome://tracing open it; tools/mem_trace_svg.py draws it).
 *
 * What it holds:
 *   - a counter track "pool bytes" with every pool's bytes in use, written at each change;
 *   - instant events for allocations and frees ("alloc weights", with the bytes), and step marks;
 *   - complete events for the offload tier's copies and chunked updates, on one track per
 *     stream (copy-in, compute, copy-out, update, state-in), timed on the device by CUDA events: a copy's bar is
 *     when the copy engine really ran it, not when it was queued;
 *   - complete events for work on the host (the CPU threads' optimizer updates), timed on the host
 *     clock by the threads that did it;
 *   - in "otherData", what the picture needs to read the counters: the pools whose bytes are GPU
 *     memory (stacked, their sum is the GPU's use) and the device budget.
 * Host times are microseconds since the trace opened; device times are placed on the same axis
 * through an event recorded on the compute stream when the trace opened, the stream drained first
 * (so that the event happens as it is queued: "clock_alignment_us" in otherData is how long the
 * record and its wait took, a bound on the offset between the two clocks).
 *
 * Threads: the host intervals may be written from any thread (the CPU updates run in a CUDA host
 * function and on worker threads); everything else from the thread that queues the GPU's work.
 */
#ifndef UMT_MEMORY_TRACE_H
#define UMT_MEMORY_TRACE_H

#include <stdbool.h>
#include <stddef.h>

#include "memory/pool.h"
#include "umtrain.h"

typedef struct umt_trace umt_trace;

/* Track numbers of the device events. */
/* UMT_TRACE_UPDATE and UMT_TRACE_STATE_IN: updates during backward and the copies in of their
 * optimizer state, on streams of their own (their bars overlap the compute and copy-in tracks',
 * and a track's bars must nest). */
/* UMT_TRACE_HOST_UPDATE: updates by CPU threads (offload/host.c in backward, offload/update.c
 * after it), timed on the host clock around the threads' work. */
enum { UMT_TRACE_HOST = 0, UMT_TRACE_COPY_IN = 1, UMT_TRACE_COMPUTE = 2, UMT_TRACE_COPY_OUT = 3, UMT_TRACE_UPDATE = 4,
       UMT_TRACE_STATE_IN = 5, UMT_TRACE_HOST_UPDATE = 6, UMT_TRACE_TRACKS = 7 };

/* Opens path for writing, for the pools of mem: its stream is the compute stream (NULL on the CPU: no
 * device events), its budget and placements go into otherData. */
umt_status umt_trace_open(const char *path, const umt_memory *mem, umt_trace **out);
/* Waits for the device events still pending, writes them and closes the file. NULL is ok. */
void umt_trace_close(umt_trace *trace);

/* Every pool's bytes in use now, as one counter event (names from the pool table). */
void umt_trace_counters(umt_trace *trace, const size_t in_use_bytes[UMT_POOL_COUNT]);
void umt_trace_alloc(umt_trace *trace, umt_pool pool, size_t bytes, bool freed);
/* An instant event on the host track (e.g. "step 3"); also writes finished device events. */
void umt_trace_mark(umt_trace *trace, const char *name);

/* A device interval on stream: begin before queuing the work, end after, with what it was. Both
 * are no-ops (and begin returns NULL) when trace is NULL or has no device. */
void *umt_trace_begin(umt_trace *trace, void *stream);
void umt_trace_end(umt_trace *trace, void *stream, void *begin, const char *name, const char *category, int track,
                   size_t bytes);

/* The trace's clock: microseconds since it opened (0 when trace is NULL). Thread-safe. */
double umt_trace_now_us(const umt_trace *trace);
/* Work done on the host from begin_us to end_us (umt_trace_now_us before and after it), on track.
 * Thread-safe: the thread that did the work writes it, as it ends; no CUDA call. NULL is ok. */
void umt_trace_host_interval(umt_trace *trace, double begin_us, double end_us, const char *name, const char *category,
                             int track, size_t bytes);

#endif /* UMT_MEMORY_TRACE_H */
