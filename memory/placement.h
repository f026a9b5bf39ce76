/*
 * memory/placement.h — where a pool's bytes physically come from, and the advice they get.
 *
 * The only place in umtrain that calls the system and CUDA allocators for tensor storage.
 * In a build without CUDA, the GPU placements fail with UMT_ERR_UNSUPPORTED.
 */
#ifndef UMT_MEMORY_PLACEMENT_H
#define UMT_MEMORY_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>

#include "memory/policy.h"

/* bytes from the given placement, aligned to align; *out is NULL on failure. */
umt_status umt_placement_alloc(umt_placement placement, size_t bytes, size_t align, void **out);
void umt_placement_free(umt_placement placement, void *ptr);

/* Gives a managed range its UMT_ADVISE_* advice for cuda_device and, with prefetch, queues its
 * migration to that GPU on stream (ahead of any kernel queued after it there). */
umt_status umt_placement_advise(void *ptr, size_t bytes, unsigned advice, bool prefetch, int cuda_device,
                                void *stream);

#endif /* UMT_MEMORY_PLACEMENT_H */
