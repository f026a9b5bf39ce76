/*
 * memory/policy.c — THE table: for each pool, its lifetime and placement.
 *
 * Everything else in memory/ reads this table; nothing else decides where bytes go.
 * The CUDA backend adds its placement, access advice and prefetch columns here.
 */
#include "memory/policy.h"

static const umt_pool_policy policies[UMT_POOL_COUNT] = {
    /* pool                  name           lifetime           cpu placement   holds */
    {UMT_POOL_WEIGHTS,     "weights",     UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "fp32 master parameters"},
    {UMT_POOL_GRADS,       "grads",       UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "parameter gradients"},
    {UMT_POOL_OPTIM,       "optim",       UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "optimizer state"},
    {UMT_POOL_ACTIVATIONS, "activations", UMT_LIFETIME_STEP, UMT_PLACE_HOST, "forward outputs, their gradients, batches"},
    {UMT_POOL_WORKSPACE,   "workspace",   UMT_LIFETIME_STEP, UMT_PLACE_HOST, "scratch for one call"},
    {UMT_POOL_DATASET,     "dataset",     UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "resident datasets"},
    {UMT_POOL_STAGING,     "staging",     UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "batches on their way in"},
    {UMT_POOL_OFFLOAD,     "offload",     UMT_LIFETIME_RUN,  UMT_PLACE_HOST, "what does not fit the device budget"},
};

const umt_pool_policy *umt_pool_policy_of(umt_pool pool) {
    return (unsigned)pool < UMT_POOL_COUNT ? &policies[pool] : NULL;
}

const char *umt_pool_name(umt_pool pool) {
    const umt_pool_policy *p = umt_pool_policy_of(pool);
    return p ? p->name : "invalid-pool";
}
