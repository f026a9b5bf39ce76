/*
 * kernels/cuda/float16.h — f32 <-> bf16 / f16 element conversions in device code (CUDA sources
 * only), shared by the convert kernel (memory.cu) and the fused optimizer updates (optim.cu).
 *
 * They match kernels/cpu/memory.c bit for bit. Numbers go through the hardware's
 * round-to-nearest-even conversions (__float2bfloat16_rn, __float2half_rn), which handle
 * overflow to infinity and f16 subnormals as the CPU code does. NaNs are built by hand with
 * the CPU's rule (keep sign and top payload, set the quiet bit), because the hardware returns a
 * canonical NaN whatever the input was (0x7fff for bf16; tests/gpu checks the NaNs).
 */
#ifndef UMT_KERNELS_CUDA_FLOAT16_H
#define UMT_KERNELS_CUDA_FLOAT16_H

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "umtrain.h"

static __device__ inline bool umt_dev_f32_is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

/* Both results are computed and one is selected: written as an early return for the NaN, the
 * test became a branch in every unrolled kernel (a pool forward held 49 of them). */
static __device__ inline uint16_t umt_dev_f32_to_bf16(float x) {
    uint32_t bits = __float_as_uint(x);
    uint16_t nan = (uint16_t)((bits >> 16) | 0x0040u), number = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return umt_dev_f32_is_nan(bits) ? nan : number;
}

static __device__ inline uint16_t umt_dev_f32_to_f16(float x) {
    uint32_t bits = __float_as_uint(x);
    uint16_t nan = (uint16_t)(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu));
    uint16_t number = __half_as_ushort(__float2half_rn(x));
    return umt_dev_f32_is_nan(bits) ? nan : number;
}

/* bf16 is the top half of an f32: the shift is the exact widening, NaN payload included. */
static __device__ inline float umt_dev_bf16_to_f32(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }

static __device__ inline float umt_dev_f16_to_f32(uint16_t x) {
    bool is_nan = (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu) != 0;
    float nan = __uint_as_float(((uint32_t)(x & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)(x & 0x3ffu) << 13));
    return is_nan ? nan : __half2float(__ushort_as_half(x));
}

/* Element i of a float array of the given dtype, widened to f32 (always exact). */
static __device__ inline float umt_dev_load_as_f32(const void *src, umt_dtype dtype, int64_t i) {
    switch (dtype) {
    case UMT_BF16: return umt_dev_bf16_to_f32(((const uint16_t *)src)[i]);
    case UMT_F16: return umt_dev_f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

/* Stores x into element i of a float array of the given dtype, rounding to nearest even. */
static __device__ inline void umt_dev_store_from_f32(void *dst, umt_dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case UMT_BF16: ((uint16_t *)dst)[i] = umt_dev_f32_to_bf16(x); break;
    case UMT_F16: ((uint16_t *)dst)[i] = umt_dev_f32_to_f16(x); break;
    default: ((float *)dst)[i] = x; break;
    }
}

/* Eight halves in one 16-byte load or store: the vector kernels' unit (8 channels of an NHWC
 * pixel when the channel count is a multiple of 8 and the pointers 16-byte aligned). */
enum { UMT_HALVES_PER_VECTOR = 8 };
typedef union {
    uint4 bits;
    uint16_t h[UMT_HALVES_PER_VECTOR];
} umt_halves8;

/* bf16 or f16 (a template argument: no switch per element) <-> f32, as above. */
template <umt_dtype D> static __device__ inline float umt_dev_widen(uint16_t v) {
    return D == UMT_BF16 ? umt_dev_bf16_to_f32(v) : umt_dev_f16_to_f32(v);
}
template <umt_dtype D> static __device__ inline uint16_t umt_dev_narrow(float v) {
    return D == UMT_BF16 ? umt_dev_f32_to_bf16(v) : umt_dev_f32_to_f16(v);
}

/* The same for values known to be numbers (no NaN in or out): the hardware's conversions alone,
 * which give exactly the results above for every number, infinities included. */
template <umt_dtype D> static __device__ inline float umt_dev_widen_number(uint16_t v) {
    return D == UMT_BF16 ? umt_dev_bf16_to_f32(v) : __half2float(__ushort_as_half(v));
}
template <umt_dtype D> static __device__ inline uint16_t umt_dev_narrow_number(float v) {
    return D == UMT_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

/* Whether none of the eight halves is an infinity or a NaN (exponent bits all set). */
template <umt_dtype D> static __device__ inline bool umt_dev_all_finite8(uint4 v) {
    const unsigned int exponent = D == UMT_BF16 ? 0x7f807f80u : 0x7c007c00u;
    unsigned int any = __vcmpeq2(v.x & exponent, exponent) | __vcmpeq2(v.y & exponent, exponent) |
                       __vcmpeq2(v.z & exponent, exponent) | __vcmpeq2(v.w & exponent, exponent);
    return any == 0;
}

#endif /* UMT_KERNELS_CUDA_FLOAT16_H */
