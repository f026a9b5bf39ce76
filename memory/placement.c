/* memory/placement.c — the system allocators behind each placement. */
#include "memory/placement.h"

#include <stdlib.h>

#include "core/error.h"

umt_status umt_placement_alloc(umt_placement placement, size_t bytes, size_t align, void **out) {
    *out = NULL;
    switch (placement) {
    case UMT_PLACE_HOST: {
        /* aligned_alloc wants a size that is a multiple of the alignment. */
        size_t rounded = (bytes + align - 1) / align * align;
        *out = aligned_alloc(align, rounded);
        if (!*out) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
        return UMT_OK;
    }
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "unknown placement %d", (int)placement);
}

void umt_placement_free(umt_placement placement, void *ptr) {
    switch (placement) {
    case UMT_PLACE_HOST: free(ptr); return;
    }
}
