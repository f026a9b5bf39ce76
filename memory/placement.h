/*
 * memory/placement.h — where a pool's bytes physically come from.
 *
 * The only place in umtrain that calls the system allocators for tensor storage.
 */
#ifndef UMT_MEMORY_PLACEMENT_H
#define UMT_MEMORY_PLACEMENT_H

#include <stddef.h>

#include "memory/policy.h"

/* bytes from the given placement, aligned to align; *out is NULL on failure. */
umt_status umt_placement_alloc(umt_placement placement, size_t bytes, size_t align, void **out);
void umt_placement_free(umt_placement placement, void *ptr);

#endif /* UMT_MEMORY_PLACEMENT_H */
