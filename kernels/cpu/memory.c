/*
 * kernels/cpu/memory.c — fill, copy and dtype conversion on host memory.
 *
 * The conversions between f32 and the two 16-bit floats are written out bit by bit, so that
 * the CPU reference is exact and independent of compiler support for _Float16 / __bf16.
 * Both narrowings round to nearest, ties to even, as the hardware and PyTorch do.
 *
 * Layouts (sign | exponent | mantissa, exponent bias):
 *     f32   1 | 8 | 23   bias 127
 *     bf16  1 | 8 |  7   bias 127   (the top half of an f32)
 *     f16   1 | 5 | 10   bias 15
 */
#include <string.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

static uint32_t f32_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

static float f32_from_bits(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* Drops the low `shift` bits of value, rounding to nearest with ties to even. A carry out of
 * the mantissa lands in the exponent, which is exactly the next binade (or infinity). */
static uint32_t shift_right_round_even(uint32_t value, int shift) {
    uint32_t kept = value >> shift;
    uint32_t dropped = value & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (dropped > half || (dropped == half && (kept & 1))) kept++;
    return kept;
}

/* |x| (the f32 bits without sign) that is finite and at least 2^-14, as f16 magnitude bits. */
static uint16_t f16_normal_magnitude(uint32_t magnitude) {
    /* Rebias the exponent (127 -> 15) in place, then round 23 mantissa bits to 10. A carry from
     * 0x7bff (65504) gives 0x7c00, infinity, which is the right answer for overflow. */
    uint32_t rebiased = magnitude - ((uint32_t)(127 - 15) << 23);
    return (uint16_t)shift_right_round_even(rebiased, 13);
}

/* |x| below 2^-14: an f16 subnormal, a count of 2^-24 units, or zero. */
static uint16_t f16_subnormal_magnitude(uint32_t magnitude) {
    int exponent = (int)(magnitude >> 23) - 127;
    /* f32 subnormals have no implicit 1 but lie far below 2^-25; they round to zero below. */
    uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
    /* x = significand * 2^(exponent - 23) = significand * 2^(exponent + 1) units of 2^-24. */
    int shift = -(exponent + 1);
    /* significand < 2^24, so a shift past 24 leaves less than half a unit: zero. */
    if (shift > 24) return 0;
    /* Rounding up from 0x3ff units gives 0x400, which is the smallest normal: also exact. */
    return (uint16_t)shift_right_round_even(significand, shift);
}

uint16_t umt_f32_to_f16(float x) {
    uint32_t bits = f32_bits(x);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        /* NaN: keep the top payload bits and force the quiet bit, so it stays a NaN. */
        return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    }
    if (magnitude >= 0x47800000u) return sign | 0x7c00u; /* >= 2^16 (or inf): infinity */
    if (magnitude >= 0x38800000u) return sign | f16_normal_magnitude(magnitude); /* >= 2^-14 */
    return sign | f16_subnormal_magnitude(magnitude);
}

float umt_f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exponent = (x >> 10) & 0x1fu;
    uint32_t mantissa = x & 0x3ffu;
    if (exponent == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13)); /* inf, NaN */
    if (exponent != 0) return f32_from_bits(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
    if (mantissa == 0) return f32_from_bits(sign);
    /* Subnormal: mantissa * 2^-24. Shift the leading 1 up to the implicit position (bit 10),
     * lowering the exponent once per shift; every f16 subnormal is an f32 normal. */
    int unbiased = -14;
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        unbiased--;
    }
    return f32_from_bits(sign | ((uint32_t)(unbiased + 127) << 23) | ((mantissa & 0x3ffu) << 13));
}

umt_status umt_cpu_fill(float *x, int64_t n, float value) {
    for (int64_t i = 0; i < n; i++) x[i] = value;
    return UMT_OK;
}

umt_status umt_cpu_zero(void *x, size_t bytes) {
    if (bytes > 0) memset(x, 0, bytes);
    return UMT_OK;
}

umt_status umt_cpu_check_zero_many(int count, const size_t *bytes) {
    for (int i = 0; i < count; i++)
        if (bytes[i] % sizeof(float) != 0)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "zero_many: block %d has %zu bytes (expected a multiple of 4)", i,
                            bytes[i]);
    return UMT_OK;
}

umt_status umt_cpu_zero_many(int count, void *const *blocks, const size_t *bytes) {
    UMT_TRY(umt_cpu_check_zero_many(count, bytes));
    for (int i = 0; i < count; i++) umt_cpu_zero(blocks[i], bytes[i]);
    return UMT_OK;
}

umt_status umt_cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes > 0) memcpy(dst, src, bytes);
    return UMT_OK;
}

static bool is_float_dtype(umt_dtype dtype) { return dtype == UMT_F32 || dtype == UMT_BF16 || dtype == UMT_F16; }

/* Element i of a float array of the given dtype, widened to f32 (always exact). */
static float load_as_f32(const void *src, umt_dtype dtype, int64_t i) {
    switch (dtype) {
    case UMT_BF16: return umt_bf16_to_f32(((const uint16_t *)src)[i]);
    case UMT_F16: return umt_f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

/* Stores x into element i of a float array of the given dtype, rounding to nearest even. */
static void store_from_f32(void *dst, umt_dtype dtype, int64_t i, float x) {
    switch (dtype) {
    case UMT_BF16: ((uint16_t *)dst)[i] = umt_f32_to_bf16(x); break;
    case UMT_F16: ((uint16_t *)dst)[i] = umt_f32_to_f16(x); break;
    default: ((float *)dst)[i] = x; break;
    }
}

umt_status umt_convert_check_arguments(umt_dtype src_dtype, umt_dtype dst_dtype, int64_t n) {
    static const char *const names[] = {[UMT_F32] = "f32", [UMT_BF16] = "bf16", [UMT_F16] = "f16"};
    if (!is_float_dtype(src_dtype) || !is_float_dtype(dst_dtype)) {
        return umt_fail(UMT_ERR_UNSUPPORTED, "convert: dtype %s -> %s (code %d -> %d), expected f32, bf16 or f16",
                        is_float_dtype(src_dtype) ? names[src_dtype] : "non-float",
                        is_float_dtype(dst_dtype) ? names[dst_dtype] : "non-float", (int)src_dtype, (int)dst_dtype);
    }
    if (n < 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "convert: n=%lld, expected >= 0", (long long)n);
    return UMT_OK;
}

umt_status umt_cpu_convert(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n) {
    UMT_TRY(umt_convert_check_arguments(src_dtype, dst_dtype, n));
    if (src_dtype == dst_dtype) return umt_cpu_copy(dst, src, (size_t)n * umt_dtype_size(src_dtype));
    /* Through f32, which holds every bf16 and f16 value exactly: one rounding, at the store. */
    for (int64_t i = 0; i < n; i++) store_from_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
    return UMT_OK;
}
