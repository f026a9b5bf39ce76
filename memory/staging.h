/*
 * memory/staging.h — the staging ring: batches on their way from host memory to the device.
 *
 * A ring of slots; each slot is a host buffer (staging pool: pinned on CUDA) that a loader thread
 * fills, and a device buffer (inputs pool) its copy lands in. The lifecycle of a slot:
 *
 *   loader thread                           compute thread
 *   umt_staging_wait_copied  (host buffer no longer read by the slot's previous copy)
 *   ... fill the host buffer ...
 *   umt_staging_submit       (copy stream: wait until the compute stream released the device
 *                             buffer, copy, record "copied")
 *                                           umt_staging_wait_begin   (timing starts)
 *                                           umt_staging_acquire      (compute stream waits for
 *                                                                     "copied"; timing stops)
 *                                           ... queue work reading the device buffer ...
 *                                           umt_staging_release      (record "released")
 *
 * So a host buffer is never rewritten while a copy reads it, and a device buffer is never
 * overwritten while queued compute work still reads it; neither side waits for the other on the
 * host except the loader, for a copy that is normally long finished.
 *
 * In pageable-sync mode (a comparison) the host buffers are ordinary malloc memory and submit
 * copies on the compute stream and waits: no copy stream, no overlap. On the CPU device the copy
 * is a memcpy and the timing the CPU's clock, so the same logic runs (and is tested) without a GPU.
 */
#ifndef UMT_MEMORY_STAGING_H
#define UMT_MEMORY_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "memory/pool.h"

typedef struct umt_staging umt_staging;

/* slots slots of slot_bytes each, host buffers pinned (pageable when pageable_sync). */
umt_status umt_staging_create(umt_memory *mem, int slots, size_t slot_bytes, bool pageable_sync, umt_staging **out);
/* Waits for every queued copy, then frees the slots' buffers and the stream. NULL is ok. */
void umt_staging_destroy(umt_staging *staging);

int umt_staging_slots(const umt_staging *staging);
void *umt_staging_host(umt_staging *staging, int slot);
void *umt_staging_device(umt_staging *staging, int slot);

/* Each thread that submits copies calls this first (CUDA: selects the context's GPU). */
umt_status umt_staging_thread_start(umt_staging *staging);
/* Loader side: waits until the slot's previous copy has finished reading its host buffer. */
umt_status umt_staging_wait_copied(umt_staging *staging, int slot);
/* Loader side: copies bytes of the slot's host buffer into its device buffer (see above). */
umt_status umt_staging_submit(umt_staging *staging, int slot, size_t bytes);

/* Compute side: the compute stream's wait for the slot's data is timed from here ... */
umt_status umt_staging_wait_begin(umt_staging *staging, int slot);
/* ... to when the compute stream may read the slot's device buffer (queued after this call). */
umt_status umt_staging_acquire(umt_staging *staging, int slot);
/* Compute side: work queued so far is the last to read the slot's device buffer. */
umt_status umt_staging_release(umt_staging *staging, int slot);
/* Milliseconds the compute stream waited since the previous call (waits for the timing events). */
umt_status umt_staging_take_wait_ms(umt_staging *staging, double *ms);

#endif /* UMT_MEMORY_STAGING_H */
