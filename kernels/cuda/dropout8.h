/*
 * kernels/cuda/dropout8.h — the dropout of eight neighbouring halves, shared by lowp.cu's vector
 * dropout and pool.cu's pool forward, which draws it as it writes its output, so that both
 * drop, scale and round every element alike (CUDA sources only).
 */
#ifndef UMT_KERNELS_CUDA_DROPOUT8_H
#define UMT_KERNELS_CUDA_DROPOUT8_H

#include "kernels/backend.h"
#include "kernels/cuda/float16.h"

/* Elements first .. first + 7 of a tensor, held in `in` (their draws umt_dropout_keep's, from
 * one counter stepped: kernels/backend.h): each kept one scaled by `scale` (1/(1-p), computed
 * once on the host) in f32 and rounded to D, a dropped one 0 (not x * 0, so that a dropped NaN
 * or infinity does not pass). *kept (NULL: not wanted) gets element e's mask byte in byte e
 * (little-endian: the 8 mask bytes as one 8-byte store). */
template <umt_dtype D>
static __device__ inline umt_halves8 umt_dev_dropout8(umt_halves8 in, uint64_t seed, uint64_t first, float p,
                                                      float scale, uint64_t *kept) {
    umt_halves8 out;
    uint64_t bytes = 0, counter = seed + (first + 1) * UMT_DROPOUT_STEP;
#pragma unroll
    for (int e = 0; e < UMT_HALVES_PER_VECTOR; e++, counter += UMT_DROPOUT_STEP) {
        bool keep = umt_dropout_keep_counter(counter, p);
        bytes |= (uint64_t)keep << (8 * e);
        out.h[e] = umt_dev_narrow<D>(keep ? umt_dev_widen<D>(in.h[e]) * scale : 0.0f);
    }
    if (kept) *kept = bytes;
    return out;
}

#endif /* UMT_KERNELS_CUDA_DROPOUT8_H */
