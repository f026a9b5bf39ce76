/*
 * kernels/cuda/pool_scatter.h — the max-pool backward's scatter, shared by pool.cu (max pool's
 * backward, bias + ReLU + max pool's pick scatter) and fused.cu (max pool + dropout's backward),
 * so that every path puts a gradient on its pick the same way (CUDA sources only).
 *
 * Windows apart (stride >= window): each output adds its gradient at its pick, one thread per
 * output, with 32-bit coordinates (the callers check that the input has fewer than 2^31
 * elements), in any storage order and float dtype.
 */
#ifndef UMT_KERNELS_CUDA_POOL_SCATTER_H
#define UMT_KERNELS_CUDA_POOL_SCATTER_H

#include "kernels/cuda/float16.h"

/* Storage offset of (image, channel, row, column) in a tensor of c channels of h x w pixels. */
static __device__ inline int umt_dev_pool_offset32(bool nhwc, int n, int ch, int row, int col, int c, int h, int w) {
    return nhwc ? ((n * h + row) * w + col) * c + ch : ((n * c + ch) * h + row) * w + col;
}

/* The inverse: storage index i -> (image, channel, row, column). */
static __device__ inline void umt_dev_pool_coordinates32(bool nhwc, int i, int c, int h, int w, int *n, int *ch,
                                                         int *row, int *col) {
    if (nhwc) {
        *ch = i % c, *col = i / c % w, *row = i / (c * w) % h, *n = i / (c * w * h);
    } else {
        *col = i % w, *row = i / w % h, *ch = i / (w * h) % c, *n = i / (w * h * c);
    }
}

/* The scatter's single addition, dx[at] += grad: dx widened to f32, one f32 addition, rounded
 * to D once at the store (the unfused backward's bits). */
template <umt_dtype D> static __device__ inline void umt_dev_scatter_add(void *dx, int at, float grad) {
    umt_dev_store_from_f32(dx, D, at, umt_dev_load_as_f32(dx, D, at) + grad);
}

#endif /* UMT_KERNELS_CUDA_POOL_SCATTER_H */
