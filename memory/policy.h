/*
 * memory/policy.h — the memory policy of umtrain: one row per pool, in one table (policy.c).
 *
 * A pool's policy says how long its allocations live and where its bytes come from. This is
 * the idea the project exists for: memory is placed by what it is.
 */
#ifndef UMT_MEMORY_POLICY_H
#define UMT_MEMORY_POLICY_H

#include "umtrain.h"

typedef enum {
    UMT_LIFETIME_RUN, /* individual allocations, freed one by one or at context destruction */
    UMT_LIFETIME_STEP /* an arena: bump allocation, all of it reset by umt_step_begin */
} umt_lifetime;

typedef enum {
    UMT_PLACE_HOST, /* ordinary host memory (the CPU backend) */
} umt_placement;

typedef struct {
    umt_pool pool;
    const char *name;
    umt_lifetime lifetime;
    umt_placement cpu_placement; /* where the pool lives when ops run on the CPU */
    const char *holds;           /* one line for reports and readers */
} umt_pool_policy;

/* The table, indexed by umt_pool. */
const umt_pool_policy *umt_pool_policy_of(umt_pool pool);

#endif /* UMT_MEMORY_POLICY_H */
