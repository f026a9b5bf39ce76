/*
 * memory/policy.h — the memory policy of umtrain: one row per pool, in one table (policy.c).
 *
 * A pool's policy says how long its allocations live, where its bytes come from on each
 * backend, which access advice CUDA gets for them, and whether they are prefetched to the GPU.
 * This is the idea the project exists for: memory is placed by what it is.
 */
#ifndef UMT_MEMORY_POLICY_H
#define UMT_MEMORY_POLICY_H

#include <stdbool.h>

#include "umtrain.h"

typedef enum {
    UMT_LIFETIME_RUN, /* individual allocations, freed one by one or at context destruction */
    UMT_LIFETIME_STEP /* an arena: bump allocation, all of it reset by umt_step_begin */
} umt_lifetime;

typedef enum {
    UMT_PLACE_HOST,    /* ordinary host memory (the CPU backend) */
    UMT_PLACE_MANAGED, /* CUDA managed memory: one pointer, pages migrate between host and GPU */
    UMT_PLACE_DEVICE,  /* cudaMalloc: GPU memory only */
    UMT_PLACE_PINNED   /* page-locked host memory (cudaHostAlloc): fast, asynchronous copies */
} umt_placement;

/* cudaMemAdvise hints, as bits: what the driver should know about how the pool is used. */
enum {
    UMT_ADVISE_PREFER_GPU = 1,  /* preferred location = the GPU: pages stay there */
    UMT_ADVISE_CPU_READS = 2,   /* accessed-by = the CPU: host reads map pages, no migration */
    UMT_ADVISE_READ_MOSTLY = 4, /* read-mostly: readers get read-only copies */
};

typedef struct {
    umt_pool pool;
    const char *name;
    umt_lifetime lifetime;
    umt_placement cuda_placement; /* on the CUDA backend in --mem managed (CPU: always host) */
    unsigned advice;              /* UMT_ADVISE_* bits applied to managed blocks */
    bool prefetch;                /* managed blocks are prefetched to the GPU when allocated */
    const char *holds;            /* one line for reports and readers */
} umt_pool_policy;

/* The table row of a pool (NULL for an invalid pool). */
const umt_pool_policy *umt_pool_policy_of(umt_pool pool);

/* "host", "managed", "device", "pinned". */
const char *umt_placement_name(umt_placement placement);

/* The placement a pool gets for a device and memory mode: the table's, except that the CPU
 * backend keeps everything in host memory and --mem device turns managed into device. */
umt_placement umt_pool_placement(umt_pool pool, umt_device device, umt_memory_mode mode);

/* Whether advice and prefetch apply: only to managed blocks in --mem managed. */
bool umt_pool_advised(umt_pool pool, umt_device device, umt_memory_mode mode);

#endif /* UMT_MEMORY_POLICY_H */
