/*
 * kernels/cuda/launch.h — how our elementwise-style kernels are launched (CUDA sources only).
 *
 * A kernel covers n elements with a grid-stride loop, so any n (64-bit) works with a grid
 * capped at MAX_BLOCKS: enough blocks to fill the GPU many times over, never a grid too large.
 */
#ifndef UMT_KERNELS_CUDA_LAUNCH_H
#define UMT_KERNELS_CUDA_LAUNCH_H

#include <stdint.h>

enum { THREADS = 256, MAX_BLOCKS = 65535 };

/* Enough blocks for one element per thread, capped: the kernels stride over the rest. */
static inline unsigned int blocks_for(int64_t n) {
    int64_t blocks = (n + THREADS - 1) / THREADS;
    return blocks < 1 ? 1u : blocks > MAX_BLOCKS ? (unsigned int)MAX_BLOCKS : (unsigned int)blocks;
}

/* A grid-stride loop over [0, n) with 64-bit indices (n may pass 2^31). */
#define FOR_EACH_INDEX(i, n)                                                                                       \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#endif /* UMT_KERNELS_CUDA_LAUNCH_H */
