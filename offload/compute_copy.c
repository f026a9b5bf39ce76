/*
 * offload/compute_copy.c — an offloaded weight's compute copy under bf16/fp16 (offload/offload.h).
 *
 * In GPU memory a weight's compute copy (tensor->lowp, core/precision.h) is made by
 * umt_weight_for_compute at its first use and rewritten by every fused update. An offloaded
 * weight's copy lives home instead, beside its master: the tier makes it when it applies its plan,
 * before the first forward, so that umt_weight_for_compute finds it made and never asks the
 * weights pool for it (the copies of all offloaded weights together may not fit the budget). The
 * conversion is the backend's own recast kernel, run on the pinned bytes, so the copy holds what
 * the in-memory path's would.
 */
#include <stdint.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "offload/state.h"

#include "core/base/cuda_check.h"

/* The master's bytes converted into the copy's, on the compute stream (both may be pinned: the
 * kernel reaches host memory through unified addressing). */
static umt_status convert(umt_context *ctx, const umt_tensor *p) {
    /* As core/ops/recast.c reads a weight: a conv weight K,C,R,S as K images of C channels. */
    bool conv = p->ndim == 4;
    int64_t n = conv ? p->shape[0] : 1, c = conv ? p->shape[1] : 1, hw = conv ? p->shape[2] * p->shape[3] : p->numel;
    umt_status st = umt_kernels(ctx)->lowp.recast(p->offload.home, UMT_F32, false, p->lowp->data, p->lowp->dtype,
                                              p->lowp->nhwc, n, c, hw, false);
    if (st != UMT_OK)
        return umt_fail(st, "offload: compute copy of %s: %s", p->name ? p->name : "a parameter", umt_last_error());
    return UMT_OK;
}

umt_status umt_offload_make_compute_copy(umt_offload *o, umt_tensor *p) {
    umt_context *ctx = o->ctx;
    if (!umt_offload_gets_compute_copy(umt_compute_dtype(ctx), p) || p->lowp) return UMT_OK;
    umt_tensor *copy = umt_tensor_alloc(ctx, UMT_POOL_OFFLOAD, umt_compute_dtype(ctx), p->ndim, p->shape);
    if (!copy)
        return umt_fail(umt_last_status(), "offload: no host memory for the compute copy of %s: %s",
                        p->name ? p->name : "a parameter", umt_last_error());
    copy->kind_pool = UMT_POOL_WEIGHTS;
    copy->owner = p;
    copy->nhwc = p->ndim == 4; /* a conv weight's copy is K,R,S,C, as umt_weight_for_compute makes it */
    copy->offload.home = copy->data;
    p->lowp = copy;
    UMT_TRY(convert(ctx, p));
    p->lowp_stale = false;
    o->stats.offloaded_tensors++;
    o->stats.offloaded_bytes += copy->bytes;
    return UMT_OK;
}

umt_status umt_offload_refresh_compute_copy(umt_offload *o, umt_tensor *p) {
    if (!p->lowp || !p->lowp->offload.home || !p->lowp_stale) return UMT_OK;
    /* Rare (a checkpoint loaded, parameters broadcast): every stream's work on the master and the
     * copy ends first, and a slot holding the old copy gives it up. */
    for (int s = 0; s < 2; ++s)
        if (o->slots[s].holder == p) UMT_TRY(umt_offload_evict(o, s));
    UMT_CUDA_TRY(cudaDeviceSynchronize());
    UMT_TRY(convert(o->ctx, p));
    p->lowp_stale = false;
    return UMT_OK;
}
