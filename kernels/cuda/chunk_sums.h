/*
 * kernels/cuda/chunk_sums.h — the second stage of the deterministic column sums (CUDA sources
 * only): bias gradients, which sum millions of rows into a few columns.
 *
 * The first stage (each caller's own kernel) cuts the rows into chunks, and the block of chunk
 * j writes its column sums to partials[j * columns + column]. This stage adds each column's
 * chunks. One thread per column, adding a thousand chunks one after the other, waits on each
 * load in turn (a fixed cost per call whatever the batch, a large share of a small step:
 * docs/PERF.md); so a block takes a column, its threads add interleaved runs of chunks, and a
 * fixed tree adds the threads' sums. The order is the same on every run (no atomics): the same bits.
 */
#ifndef UMT_KERNELS_CUDA_CHUNK_SUMS_H
#define UMT_KERNELS_CUDA_CHUNK_SUMS_H

#include "kernels/cuda/launch.h"

/* *sum += column `column`'s partials over chunks (partials[chunk * columns + column]), in T
 * (float or double), by the whole block: every thread must call it. */
template <typename T>
static __device__ void umt_dev_add_chunk_column(const T *partials, float *sum, int64_t columns, int64_t column,
                                                int chunks) {
    __shared__ T part[THREADS];
    T own = 0;
    for (int chunk = threadIdx.x; chunk < chunks; chunk += THREADS) own += partials[chunk * columns + column];
    part[threadIdx.x] = own;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) *sum = (float)((T)*sum + part[0]);
    __syncthreads(); /* part is rewritten for the next column */
}

/* sums[column] += the column's partials over chunks, for the columns of this block (launch with
 * umt_chunk_sum_blocks(columns) blocks of THREADS threads). */
template <typename T>
static __device__ void umt_dev_add_chunk_partials(const T *partials, float *sums, int64_t columns, int chunks) {
    for (int64_t column = blockIdx.x; column < columns; column += gridDim.x)
        umt_dev_add_chunk_column(partials, &sums[column], columns, column, chunks);
}

/* A block per column, as many as a grid takes. */
static inline unsigned int umt_chunk_sum_blocks(int64_t columns) {
    return columns < MAX_BLOCKS ? (unsigned int)columns : (unsigned int)MAX_BLOCKS;
}

#endif /* UMT_KERNELS_CUDA_CHUNK_SUMS_H */
