/*
 * memory/policy.c — THE table: for each pool, its lifetime, placement, advice and prefetch.
 *
 * Everything else in memory/ reads this table; nothing else decides where bytes go.
 *
 * Why these rows: parameters, gradients and optimizer state are touched by the GPU every step
 * and by the host only for checkpoints, so they prefer the GPU and are prefetched before the
 * first step (weights also tell the driver the CPU reads them, so a checkpoint maps pages
 * instead of dragging them over). Activations and workspace are GPU-only scratch. A dataset is
 * written once and read every epoch: read-mostly. Staging and offload exist to be copied
 * asynchronously over the link, which needs page-locked host memory. The inputs pool is where
those copies land: written only by the copy engine and read only by the GPU, it gains nothing from
managed memory, so it is plain device memory (no pages to migrate, no advice to give). The stream
 * pool is the offload tier's double buffer, the same kind of landing place for copies: device memory.
 */
#include "memory/policy.h"

#define GPU UMT_ADVISE_PREFER_GPU

static const umt_pool_policy policies[UMT_POOL_COUNT] = {
    /* pool                  name           lifetime           CUDA placement     advice                           prefetch holds */
    {UMT_POOL_WEIGHTS,     "weights",     UMT_LIFETIME_RUN,  UMT_PLACE_MANAGED, GPU | UMT_ADVISE_CPU_READS,      true,  "fp32 master parameters"},
    {UMT_POOL_GRADS,       "grads",       UMT_LIFETIME_RUN,  UMT_PLACE_MANAGED, GPU,                             true,  "parameter gradients"},
    {UMT_POOL_OPTIM,       "optim",       UMT_LIFETIME_RUN,  UMT_PLACE_MANAGED, GPU,                             true,  "optimizer state"},
    {UMT_POOL_ACTIVATIONS, "activations", UMT_LIFETIME_STEP, UMT_PLACE_MANAGED, GPU,                             true,  "forward outputs, their gradients, batches"},
    {UMT_POOL_WORKSPACE,   "workspace",   UMT_LIFETIME_RUN,  UMT_PLACE_MANAGED, GPU,                             true,  "library scratch (cuBLAS), sized once"},
    {UMT_POOL_DATASET,     "dataset",     UMT_LIFETIME_RUN,  UMT_PLACE_MANAGED, GPU | UMT_ADVISE_READ_MOSTLY,    true,  "resident datasets"},
    {UMT_POOL_STAGING,     "staging",     UMT_LIFETIME_RUN,  UMT_PLACE_PINNED,  0,                               false, "batches on their way in"},
    {UMT_POOL_OFFLOAD,     "offload",     UMT_LIFETIME_RUN,  UMT_PLACE_PINNED,  0,                               false, "what does not fit the device budget"},
    {UMT_POOL_INPUTS,      "inputs",      UMT_LIFETIME_RUN,  UMT_PLACE_DEVICE,  0,                               false, "batches copied in from the staging ring"},
    {UMT_POOL_STREAM,      "stream",      UMT_LIFETIME_RUN,  UMT_PLACE_DEVICE,  0,                               false, "the offload tier's double buffer: layers in use"},
};

const umt_pool_policy *umt_pool_policy_of(umt_pool pool) {
    return (unsigned)pool < UMT_POOL_COUNT ? &policies[pool] : NULL;
}

const char *umt_pool_name(umt_pool pool) {
    const umt_pool_policy *p = umt_pool_policy_of(pool);
    return p ? p->name : "invalid-pool";
}

const char *umt_placement_name(umt_placement placement) {
    switch (placement) {
    case UMT_PLACE_HOST: return "host";
    case UMT_PLACE_MANAGED: return "managed";
    case UMT_PLACE_DEVICE: return "device";
    case UMT_PLACE_PINNED: return "pinned";
    }
    return "invalid-placement";
}

umt_placement umt_pool_placement(umt_pool pool, umt_device device, umt_memory_mode mode) {
    if (device == UMT_DEVICE_CPU) return UMT_PLACE_HOST;
    umt_placement p = policies[pool].cuda_placement;
    return p == UMT_PLACE_MANAGED && mode == UMT_MEM_DEVICE ? UMT_PLACE_DEVICE : p;
}

bool umt_pool_advised(umt_pool pool, umt_device device, umt_memory_mode mode) {
    return mode == UMT_MEM_MANAGED && umt_pool_placement(pool, device, mode) == UMT_PLACE_MANAGED;
}
