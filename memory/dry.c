/* memory/dry.c — allocations recorded, not backed: entering and leaving a dry step's memory. */
#include "memory/dry.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "memory/pool.h"

/* Where the dry addresses start: far from any heap or device mapping, and never NULL. Nothing
 * reads or writes them (the dry step's kernels are no-ops); they only need to differ. */
#define UMT_DRY_FIRST_ADDRESS ((uintptr_t)1 << 46)

void *umt_memory_dry_address(umt_memory_dry *dry, size_t bytes) {
    void *ptr = (void *)dry->next_address;
    dry->next_address += (bytes + UMT_POOL_ALIGN - 1) / UMT_POOL_ALIGN * UMT_POOL_ALIGN;
    return ptr;
}

umt_status umt_memory_dry_keep(umt_memory_dry *dry, umt_pool pool, void *ptr, size_t bytes) {
    if (dry->block_count == dry->block_slots) {
        int slots = dry->block_slots ? 2 * dry->block_slots : 16;
        umt_dry_block *grown = realloc(dry->blocks, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "dry step: no memory to track a block of pool %s",
                                    umt_pool_name(pool));
        dry->blocks = grown;
        dry->block_slots = slots;
    }
    dry->blocks[dry->block_count++] = (umt_dry_block){ptr, bytes, pool};
    return UMT_OK;
}

size_t umt_memory_dry_forget(umt_memory_dry *dry, void *ptr) {
    for (int i = 0; i < dry->block_count; ++i) {
        if (dry->blocks[i].ptr != ptr) continue;
        size_t bytes = dry->blocks[i].bytes;
        dry->blocks[i] = dry->blocks[--dry->block_count];
        return bytes;
    }
    return 0;
}

umt_status umt_memory_dry_begin(umt_memory *mem, umt_memory_dry *dry) {
    if (mem->dry) return umt_fail(UMT_ERR_STATE, "dry step: one is already running on this context");
    umt_pool_state *saved = malloc(sizeof mem->pools);
    if (!saved) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "dry step: no memory to keep the pools aside");
    memcpy(saved, mem->pools, sizeof mem->pools);
    *dry = (umt_memory_dry){.next_address = UMT_DRY_FIRST_ADDRESS, .saved_pools = saved,
                            .saved_device_bytes = mem->device_bytes, .saved_trace = mem->trace};
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        umt_pool_state *s = &mem->pools[p];
        if (s->policy->lifetime != UMT_LIFETIME_STEP) continue;
        /* Empty, as before a first step: its real bytes are not held while the dry step runs. */
        if (umt_placement_uses_device(s->placement)) mem->device_bytes -= s->capacity_bytes;
        *s = (umt_pool_state){.pool = s->pool, .policy = s->policy, .placement = s->placement,
                              .advised = s->advised, .recycle = s->recycle};
    }
    dry->device_peak_bytes = mem->device_bytes;
    mem->trace = NULL; /* a dry step leaves no mark in the trace */
    mem->dry = dry;
    return UMT_OK;
}

void umt_memory_dry_end(umt_memory *mem, umt_memory_dry *dry, umt_pool_stats out[UMT_POOL_COUNT]) {
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        if (out) umt_memory_stats(mem, (umt_pool)p, &out[p]);
        umt_pool_state *s = &mem->pools[p];
        if (s->policy->lifetime != UMT_LIFETIME_STEP) continue;
        /* The dry arena's lists, not its blocks: those were addresses only. */
        free(s->blocks);
        free(s->dead);
        umt_plan_release(&s->plan);
    }
    memcpy(mem->pools, dry->saved_pools, sizeof mem->pools);
    free(dry->saved_pools);
    free(dry->blocks);
    mem->device_bytes = dry->saved_device_bytes;
    mem->trace = dry->saved_trace;
    mem->dry = NULL;
    dry->saved_pools = NULL;
    dry->blocks = NULL;
    dry->block_count = dry->block_slots = 0;
}
