/*
 * kernels/cuda/fast_divide.h — n / d by a multiply-high, an add and a shift, for kernels that
 * turn a flat index into coordinates (CUDA sources only).
 *
 * A GPU has no divide instruction: a 32-bit division by a value known only at run time is a
 * subroutine of about twenty instructions, and an output's coordinates often need three. When d
 * is the same for the whole launch, two constants made once on the host do it exactly for every
 * 0 <= n < 2^31 (Granlund and Montgomery's method with a 33-bit multiplier, whose top bit is the
 * add; shift is ceil(log2 d)). The thin convolutions' and the f32 pools' GPU tests run it over
 * their shapes' coordinates against the CPU. (In the half-precision pool's forward, whose time
 * goes elsewhere, it gained nothing: docs/PERF.md.)
 */
#ifndef UMT_KERNELS_CUDA_FAST_DIVIDE_H
#define UMT_KERNELS_CUDA_FAST_DIVIDE_H

#include <stdint.h>

typedef struct {
    unsigned int magic, shift;
} umt_fast_divisor;

/* For 1 <= d < 2^31. */
static inline umt_fast_divisor umt_fast_divisor_of(int d) {
    unsigned int shift = 0;
    while ((1u << shift) < (unsigned int)d) shift++;
    uint64_t magic = (((uint64_t)1 << 32) * (((uint64_t)1 << shift) - (uint64_t)d)) / (uint64_t)d + 1;
    umt_fast_divisor divisor = {(unsigned int)magic, shift};
    return divisor;
}

/* n / d for 0 <= n < 2^31: the sum stays under 2^32 because the high product is at most n. */
static __device__ inline int umt_fast_divide(int n, umt_fast_divisor d) {
    return (int)((__umulhi((unsigned int)n, d.magic) + (unsigned int)n) >> d.shift);
}

#endif /* UMT_KERNELS_CUDA_FAST_DIVIDE_H */
