/*
 * offload/copy_ranges.h — an offloaded weight's compute copy under bf16/fp16 (offload/offload.h),
 * in numbers: the bytes the placement plan counts for it, and where an update's chunk of the
 * master lands in it. Pure C (tests/test_offload_plan.c); offload/compute_copy.c makes the copies.
 */
#ifndef UMT_OFFLOAD_COPY_RANGES_H
#define UMT_OFFLOAD_COPY_RANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/optim_step.h"
#include "umtrain.h"

/* Whether umt_weight_for_compute will give t a compute copy under the compute dtype: a weight read
 * by a matrix op (linear, matmul, conv2d: every such weight has two or more axes) under bf16/fp16. */
bool umt_offload_gets_compute_copy(umt_dtype compute, const umt_tensor *t);
/* The bytes the plan counts for tensor t: its own, and for such a weight the copy's too, wherever
 * the plan puts the weight (on the GPU umt_weight_for_compute makes it in the weights pool). */
size_t umt_offload_plan_bytes(umt_dtype compute, const umt_tensor *t);
/* Elements a chunk of p's update must be a multiple of: a conv weight's copy is K,R,S,C, so a
 * chunk of whole output channels (C R S elements) lands in one contiguous range of it; 1
 * otherwise. *chunk is rounded down to such a multiple (UMT_ERR_STATE if that leaves none). */
umt_status umt_offload_align_chunk(const umt_tensor *p, int64_t *chunk);
/* The fusion for elements [offset, ...) of p's update: scalars, and the compute copy written at
 * lowp_base (where the copy's element 0 is, or NULL: none written) plus the range's offset. */
umt_update_fusion umt_offload_fusion(const umt_tensor *p, void *lowp_base, int64_t offset,
                                     const umt_step_scalars *scalars);
/* Bytes of p's compute copy for n elements (0 without one). */
size_t umt_offload_lowp_bytes(const umt_tensor *p, int64_t n);

#endif /* UMT_OFFLOAD_COPY_RANGES_H */
