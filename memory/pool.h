/*
 * memory/pool.h — the pools every tensor's storage comes from.
 *
 * One umt_memory per context holds one umt_pool_state per pool kind. Pools of lifetime RUN
 * hand out individual blocks; pools of lifetime STEP are arenas: a bump pointer over one
 * block, reset as a whole at each step. An arena that overflows in a step takes extra blocks
 * for that step, and at the next reset merges them into one block of the size the step
 * needed, so from the second step on an arena is a single allocation.
 *
 * Allocations are aligned to UMT_POOL_ALIGN bytes (enough for any vector load, and for CUDA).
 */
#ifndef UMT_MEMORY_POOL_H
#define UMT_MEMORY_POOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "memory/dry.h"
#include "memory/ledger.h"
#include "memory/plan.h"
#include "memory/policy.h"

#define UMT_POOL_ALIGN 256

typedef struct {
    void *ptr;
    size_t bytes;
} umt_block;

typedef struct {
    umt_pool pool;
    const umt_pool_policy *policy;
    umt_placement placement; /* resolved for this context's device and memory mode */
    bool advised;            /* apply the policy's advice and prefetch to new blocks */
    /* RUN pools: the live blocks. STEP pools: blocks[0] is the arena, later ones overflow. */
    umt_block *blocks;
    int block_count;
    int block_slots;
    size_t arena_offset; /* STEP pools: bytes used in blocks[block_count-1] */
    umt_arena_plan plan; /* STEP pools: offsets planned from the first training step */
    /* STEP pools with recycling on (the offload tier's activations): while a step is recorded,
     * bytes whose life has ended are handed out again, first fit, so that the recorded step
     * needs about what the plan will, not the sum of every size. */
    bool recycle;
    umt_block *dead;
    int dead_count;
    int dead_slots;
    /* statistics */
    size_t in_use_bytes;
    size_t peak_bytes;
    size_t capacity_bytes;
    uint64_t allocations;
} umt_pool_state;

typedef struct umt_memory {
    umt_pool_state pools[UMT_POOL_COUNT];
    umt_device device;
    int cuda_device;
    void *stream;        /* CUDA: the compute stream prefetches are queued on */
    size_t budget_bytes; /* CUDA: the most managed + device memory this context may hold */
    size_t device_bytes; /* CUDA: managed + device memory held now, all pools together */
    /* CUDA: this context's entry in its GPU's ledger (memory/ledger.h), which every device block
     * is reserved in first and which holds device_bytes; and what the ledger's rule (c) needs: the
     * GPU's free memory measured now, less guard_bytes. NULL on the CPU. */
    umt_ledger *ledger;
    umt_status (*measure_free)(int cuda_device, size_t *free_bytes);
    size_t guard_bytes;
    struct umt_trace *trace; /* UMT_MEM_TRACE: where allocations and pool bytes are written, or NULL */
    umt_memory_dry *dry;     /* set only during a dry step (memory/dry.h): allocations recorded, not backed */
} umt_memory;

/* Resolves each pool's placement from the policy table for the device and memory mode. */
void umt_memory_init(umt_memory *mem, umt_device device, umt_memory_mode mode, int cuda_device);
/* Frees every block of every pool, and leaves the GPU's ledger. */
void umt_memory_release(umt_memory *mem);

/* bytes (> 0) from the pool, aligned to UMT_POOL_ALIGN. On failure nothing is allocated and
 * the message names the pool and the request; past the device budget, or refused by the GPU's
 * ledger, the status is UMT_ERR_BUDGET and the message also says what is left and names the
 * other holders of the GPU. */
umt_status umt_memory_alloc(umt_memory *mem, umt_pool pool, size_t bytes, void **out);
/* The same, and for STEP pools *slot names the allocation in the arena's plan (for
 * umt_memory_end_of_life); UMT_PLAN_NO_SLOT otherwise. */
umt_status umt_memory_alloc_slot(umt_memory *mem, umt_pool pool, size_t bytes, void **out, int *slot);
/* Backward is done with the activation in slot: the plan may reuse its bytes after this (and,
 * with recycling on, the recorded step itself: the caller has ordered every queued use of them
 * before any later work on the compute stream). */
void umt_memory_end_of_life(umt_memory *mem, umt_pool pool, int slot);
/* Recycling on or off for a STEP pool (see umt_pool_state.recycle). */
void umt_memory_set_recycle(umt_memory *mem, umt_pool pool, bool on);
/* Forgets a STEP pool's plan: this step (just begun) is recorded afresh and the next one planned
 * from it. For a context whose sequence of allocations has changed on purpose. */
void umt_memory_rerecord(umt_memory *mem, umt_pool pool);
/* Returns a block to a RUN pool (a no-op for STEP pools, which free at reset). */
void umt_memory_free(umt_memory *mem, umt_pool pool, void *ptr);
/* Resets a STEP pool: every pointer it handed out becomes invalid. */
umt_status umt_memory_reset(umt_memory *mem, umt_pool pool);

void umt_memory_stats(const umt_memory *mem, umt_pool pool, umt_pool_stats *out);

/* Every pool that holds memory, largest first, with its largest blocks: what a refused request
 * prints, so that the reader sees where the budget went. */
void umt_memory_print_contents(const umt_memory *mem, FILE *out);

/* True for placements that take GPU memory, which the device budget covers. */
bool umt_placement_uses_device(umt_placement placement);

#endif /* UMT_MEMORY_POOL_H */
