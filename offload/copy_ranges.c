/*
 * offload/copy_ranges.c — where an offloaded weight's compute copy is in the plan and in an update's
 * chunks (offload/copy_ranges.h). Pure C: tests/test_offload_plan.c checks it on the CPU.
 */
#include "offload/copy_ranges.h"

#include "core/base/error.h"
#include "core/precision.h"
#include "core/tensor.h"

/* The rule is the core's (core/precision.h): the memory plan counts the same bytes. */
bool umt_offload_gets_compute_copy(umt_dtype compute, const umt_tensor *t) {
    return umt_compute_copy_bytes(compute, t) > 0;
}

size_t umt_offload_plan_bytes(umt_dtype compute, const umt_tensor *t) {
    return t->bytes + umt_compute_copy_bytes(compute, t);
}

umt_status umt_offload_align_chunk(const umt_tensor *p, int64_t *chunk) {
    const umt_tensor *copy = p->lowp;
    if (!copy || !copy->nhwc) return UMT_OK;
    int64_t row = copy->shape[1] * copy->shape[2] * copy->shape[3];
    if (*chunk < row)
        return umt_fail(UMT_ERR_STATE, "offload: %s's update goes in chunks of %lld elements, fewer than one output "
                        "channel's %lld (its compute copy is written a channel at a time)",
                        p->name ? p->name : "a parameter", (long long)*chunk, (long long)row);
    *chunk = *chunk / row * row;
    return UMT_OK;
}

size_t umt_offload_lowp_bytes(const umt_tensor *p, int64_t n) {
    return p->lowp ? (size_t)n * umt_dtype_size(p->lowp->dtype) : 0;
}

umt_update_fusion umt_offload_fusion(const umt_tensor *p, void *lowp_base, int64_t offset,
                                     const umt_step_scalars *scalars) {
    umt_update_fusion f = {.scalars = scalars, .lowp_dtype = UMT_F32};
    if (!p->lowp || !lowp_base) return f;
    /* A chunk of whole output channels starts at the same index in the copy as in the master
     * (umt_lowp_index(offset) == offset), and keeps the copy's layout from there. */
    f.lowp = (char *)lowp_base + umt_offload_lowp_bytes(p, offset);
    f.lowp_dtype = p->lowp->dtype;
    if (p->lowp->nhwc) {
        f.lowp_channels = p->lowp->shape[1];
        f.lowp_pixels = p->lowp->shape[2] * p->lowp->shape[3];
    }
    return f;
}
