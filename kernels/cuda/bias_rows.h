/*
 * kernels/cuda/bias_rows.h — a per-channel bias over rows of bf16/f16 values, eight halves per
 * 16-byte load (CUDA sources only): lowp.cu's bias rows (add_rows_lp) and fused.cu's bias +
 * ReLU, which differ only in the ReLU, share it.
 */
#ifndef UMT_KERNELS_CUDA_BIAS_ROWS_H
#define UMT_KERNELS_CUDA_BIAS_ROWS_H

#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

/* Written as "v < 0 ? 0 : v" so that a NaN passes through, as umt_cpu_relu does. */
static __device__ inline float umt_dev_relu(float v) { return v < 0.0f ? 0.0f : v; }

/* One vector's y = x + bias[channel] (then max(., 0) with RELU) in f32, rounded once to D:
 * its values are channels first, first + 1, ... (k % 8 == 0). A NULL bias adds 0. */
template <umt_dtype D, bool RELU>
static __device__ __forceinline__ umt_halves8 umt_dev_bias_row_vector(uint4 x, const float *bias, int64_t first) {
    umt_halves8 in, out;
    in.bits = x;
    for (int e = 0; e < UMT_HALVES_PER_VECTOR; e++) {
        float sum = umt_dev_widen<D>(in.h[e]) + (bias ? bias[first + e] : 0.0f);
        out.h[e] = umt_dev_narrow<D>(RELU ? umt_dev_relu(sum) : sum);
    }
    return out;
}

/* The same for the grid's share of `vectors` umt_halves8: vector v's values are channels
 * v * 8 % k onwards, in order. */
template <umt_dtype D, bool RELU>
static __device__ void umt_dev_bias_rows_vectors(const uint4 *x, const float *bias, uint4 *y, int64_t vectors,
                                                 int64_t k) {
    FOR_EACH_INDEX(v, vectors) y[v] = umt_dev_bias_row_vector<D, RELU>(x[v], bias, v * UMT_HALVES_PER_VECTOR % k).bits;
}

#endif /* UMT_KERNELS_CUDA_BIAS_ROWS_H */
