/*
 * kernels/cuda/pool_scatter.h — the max-pool backward's scatter, shared by pool.cu (max pool's
 * backward, bias + ReLU + max pool's pick scatter) and fused.cu (max pool + dropout's backward,
 * bias + ReLU + max pool + dropout's in one pass), so that every path puts a gradient on its
 * pick the same way (CUDA sources only).
 *
 * Windows apart (stride >= window): each output adds its gradient at its pick, one thread per
 * output, with 32-bit coordinates (the callers check that the input has fewer than 2^31
 * elements), in any storage order and float dtype.
 */
#ifndef UMT_KERNELS_CUDA_POOL_SCATTER_H
#define UMT_KERNELS_CUDA_POOL_SCATTER_H

#include "kernels/backend.h"
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

/* Whether the windows tile the input exactly: stride = window and no tail, so that every input
 * element lies in one window (the whole-window writes below apply). */
static inline bool umt_pool_windows_tile(const umt_pool_shape *s) {
    return s->stride == s->window && s->h == s->p * s->window && s->w == s->q * s->window;
}

/* A fresh gradient whose windows tile the input exactly (stride = window, no tail), NHWC halves
 * in eights: writes the whole window of pooled pixel `pixel` (its flat n, p, q index) for
 * channels 8 * group on, each channel's gradient grad.h[e] at its pick (byte e of picks) and 0
 * elsewhere, as 16-byte stores; nothing is read from dx, and nothing zeroed it first. Each value
 * is the scatter's (0 + (0 + g)), rounded the same. */
template <umt_dtype D>
static __device__ inline void umt_dev_pick_write8(const umt_pool_shape &s, int pixel, int group, uint64_t picks,
                                                  umt_halves8 grad, uint4 *dx) {
    int groups = (int)s.c / UMT_HALVES_PER_VECTOR, w = (int)s.w, q = (int)s.q, p = (int)s.p, window = (int)s.window;
    int ox = pixel % q, oy = pixel / q % p, n = pixel / (q * p);
    for (int i = 0; i < window; i++)
        for (int j = 0; j < window; j++) {
            umt_halves8 v;
            for (int e = 0; e < UMT_HALVES_PER_VECTOR; e++)
                v.h[e] = (int)(picks >> (8 * e) & 0xffu) == i * window + j
                             ? umt_dev_narrow<D>(0.0f + (0.0f + umt_dev_widen<D>(grad.h[e])))
                             : (uint16_t)0;
            dx[((n * (int)s.h + oy * window + i) * w + ox * window + j) * groups + group] = v.bits;
        }
}

#endif /* UMT_KERNELS_CUDA_POOL_SCATTER_H */
