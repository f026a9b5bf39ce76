/*
 * memory/dry.h — allocations recorded, not backed: the memory side of a dry step.
 *
 * While a dry step runs (core/step/dry_step.c), every allocation gets a distinct address that no
 * byte lies behind (its kernels are no-ops: kernels/dry.c), and the pools count it exactly as
 * they count a real one. The STEP pools (activations) start empty, as before a first step, and
 * run their real arena code: the recording, the overflow blocks, the plan made at the next
 * reset (memory/plan.c). So the statistics after a dry step are those of the steps it stood
 * for, both the first (recorded, without reuse) and the later ones (planned). RUN pools keep
 * their real blocks; what a dry step adds to them (a compute copy of a weight, a larger
 * convolution workspace) is counted and listed apart. The device budget refuses nothing: the
 * most device bytes held at once is kept instead, and says how far past it the step went.
 *
 * umt_memory_dry_end puts every pool back exactly as umt_memory_dry_begin found it.
 */
#ifndef UMT_MEMORY_DRY_H
#define UMT_MEMORY_DRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

struct umt_memory;

/* A RUN-pool block a dry step made (it never joins the pool's list). */
typedef struct {
    void *ptr;
    size_t bytes;
    umt_pool pool;
} umt_dry_block;

typedef struct umt_memory_dry {
    uintptr_t next_address; /* the next address handed out */
    umt_dry_block *blocks;  /* RUN-pool blocks made dry */
    int block_count, block_slots;
    size_t device_peak_bytes; /* the most managed + device bytes held at once */
    /* what umt_memory_dry_begin found, put back by umt_memory_dry_end */
    void *saved_pools;
    size_t saved_device_bytes;
    struct umt_trace *saved_trace;
} umt_memory_dry;

/* Enters dry mode: STEP pools emptied (their real state kept aside), the trace silenced. */
umt_status umt_memory_dry_begin(struct umt_memory *mem, umt_memory_dry *dry);
/* Leaves it: out (may be NULL) gets every pool's statistics as the dry steps left them, then
 * every pool is put back as it was. */
void umt_memory_dry_end(struct umt_memory *mem, umt_memory_dry *dry, umt_pool_stats out[UMT_POOL_COUNT]);

/* For memory/pool.c, in dry mode: an address for bytes, and the accounting of a RUN-pool block. */
void *umt_memory_dry_address(umt_memory_dry *dry, size_t bytes);
umt_status umt_memory_dry_keep(umt_memory_dry *dry, umt_pool pool, void *ptr, size_t bytes);
/* The dry block at ptr (removed from the list), 0 when ptr is not one. */
size_t umt_memory_dry_forget(umt_memory_dry *dry, void *ptr);

#endif /* UMT_MEMORY_DRY_H */
