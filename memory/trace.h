/*
 * memory/trace.h — the memory picture: UMT_MEM_TRACE=path.json writes a Chrome trace-event file
 * (Perfetto and chrome://tracing open it; tools/mem_trace_svg.py draws it).
 *
 * What it holds:
 *   - a counter track "pool bytes" with every pool's bytes in use, written at each change;
 *   - instant events for allocations and frees ("alloc weights", with the bytes), and step marks;
 *   - complete events for the offload tier's copies and chunked updates, on one track per
 *     stream (copy-in, compute, copy-out, update, state-in), timed on the device by CUDA events: a copy's bar is
 *     when the copy engine really ran it, not when it was queued.
 * Host times are microseconds since the trace opened; device times are placed on the same axis
 * through an event recorded on the compute stream when the trace opened (the stream is idle then).
 */
#ifndef UMT_MEMORY_TRACE_H
#define UMT_MEMORY_TRACE_H

#include <stdbool.h>
#include <stddef.h>

#include "umtrain.h"

typedef struct umt_trace umt_trace;

/* Track numbers of the device events. */
/* UMT_TRACE_UPDATE and UMT_TRACE_STATE_IN: updates during backward and the copies in of their
 * optimizer state, on streams of their own (their bars overlap the compute and copy-in tracks',
 * and a track's bars must nest). */
/* UMT_TRACE_HOST_UPDATE: updates in backward by CPU threads (offload/host.c), the bars of
 * their host functions on the stream that runs them. */
enum { UMT_TRACE_HOST = 0, UMT_TRACE_COPY_IN = 1, UMT_TRACE_COMPUTE = 2, UMT_TRACE_COPY_OUT = 3, UMT_TRACE_UPDATE = 4,
       UMT_TRACE_STATE_IN = 5, UMT_TRACE_HOST_UPDATE = 6, UMT_TRACE_TRACKS = 7 };

/* Opens path for writing; stream is the compute stream (NULL on the CPU: no device events). */
umt_status umt_trace_open(const char *path, void *stream, umt_trace **out);
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

#endif /* UMT_MEMORY_TRACE_H */
