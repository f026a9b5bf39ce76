/*
 * tests/test_cpu_convert.c — the f32 <-> bf16 <-> f16 conversions of kernels/cpu/memory.c:
 * exact values, round-to-nearest-even (by hand and at every midpoint), NaN, infinity, f16
 * overflow and subnormals, and a round trip of every 16-bit pattern.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "umtrain.h"

static float bits_to_float(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* Exact comparison of a conversion result, naming what was converted. */
static void assert_exactly(double got, double want, const char *what) {
    if (got != want) fail_msg("%s = %.9g, expected exactly %.9g", what, got, want);
}

static void test_bf16_and_f16_encode_exact_values(void **state) {
    (void)state;
    assert_int_equal(umt_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(umt_f32_to_bf16(-2.5f), 0xc020);
    assert_int_equal(umt_f32_to_bf16(-0.0f), 0x8000);
    assert_exactly(umt_bf16_to_f32(0x7f7f), 3.3895313892515355e38, "bf16 max");
    assert_int_equal(umt_f32_to_bf16(umt_bf16_to_f32(0x7f7f)), 0x7f7f);
    assert_int_equal(umt_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(umt_f32_to_f16(-2.5f), 0xc100);
    assert_int_equal(umt_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(umt_f32_to_f16(-0.0f), 0x8000);
    assert_exactly(umt_f16_to_f32(0x7bff), 65504.0, "f16 max");
    assert_exactly(umt_f16_to_f32(0xc100), -2.5, "f16 0xc100");
}

static void test_halfway_values_round_to_even(void **state) {
    (void)state;
    /* bf16: 1 + 2^-8 lies halfway between 0x3f80 (even) and 0x3f81; 1 + 3 * 2^-8 between
     * 0x3f81 and 0x3f82 (even); one bit above halfway rounds up. */
    assert_int_equal(umt_f32_to_bf16(bits_to_float(0x3f808000u)), 0x3f80);
    assert_int_equal(umt_f32_to_bf16(bits_to_float(0x3f818000u)), 0x3f82);
    assert_int_equal(umt_f32_to_bf16(bits_to_float(0x3f808001u)), 0x3f81);
    assert_int_equal(umt_f32_to_bf16(bits_to_float(0x3f807fffu)), 0x3f80);
    /* f16: the same around 1.0, where one step is 2^-10. */
    assert_int_equal(umt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(umt_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(umt_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    /* f16 subnormals: steps of 2^-24. */
    assert_int_equal(umt_f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(umt_f32_to_f16(3 * 0x1p-25f), 0x0002);
    assert_int_equal(umt_f32_to_f16(0x1p-25f + 0x1p-35f), 0x0001);
}

/* The exhaustive version: the midpoint of every pair of neighbouring finite values (exact in
 * f32) must go to the one with an even mantissa. */
static void test_every_midpoint_between_neighbours_rounds_to_even(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 0x7c00u; h++) { /* f16, up to the midpoint of 65504 and infinity */
        double mid = ((double)umt_f16_to_f32((uint16_t)h) + umt_f16_to_f32((uint16_t)(h + 1))) / 2;
        if (h == 0x7bffu) mid = 65520.0;
        uint16_t want = (uint16_t)((h & 1) ? h + 1 : h);
        if (umt_f32_to_f16((float)mid) != want) fail_msg("f16 midpoint above 0x%04x rounds wrong", h);
        if (umt_f32_to_f16(-(float)mid) != (want | 0x8000u)) fail_msg("f16 -midpoint above 0x%04x", h);
    }
    for (uint32_t h = 0; h < 0x7f7fu; h++) {
        double mid = ((double)umt_bf16_to_f32((uint16_t)h) + umt_bf16_to_f32((uint16_t)(h + 1))) / 2;
        uint16_t want = (uint16_t)((h & 1) ? h + 1 : h);
        if (umt_f32_to_bf16((float)mid) != want) fail_msg("bf16 midpoint above 0x%04x rounds wrong", h);
    }
}

static void test_nan_and_infinity_survive_conversion_and_overflow_gives_infinity(void **state) {
    (void)state;
    assert_true(isnan(umt_bf16_to_f32(umt_f32_to_bf16(NAN))));
    assert_true(isnan(umt_f16_to_f32(umt_f32_to_f16(NAN))));
    /* A NaN whose payload lives only in the low bits must not truncate to infinity. */
    assert_true(isnan(umt_bf16_to_f32(umt_f32_to_bf16(bits_to_float(0x7f800001u)))));
    assert_true(isnan(umt_f16_to_f32(umt_f32_to_f16(bits_to_float(0xff800001u)))));
    assert_int_equal(umt_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(umt_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(umt_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(umt_f32_to_f16(-INFINITY), 0xfc00);
    assert_true(isinf(umt_f16_to_f32(0xfc00)) && umt_f16_to_f32(0xfc00) < 0);
    assert_int_equal(umt_f32_to_f16(65519.0f), 0x7bff); /* below the midpoint: largest finite */
    assert_int_equal(umt_f32_to_f16(65520.0f), 0x7c00); /* the midpoint: to even, i.e. infinity */
    assert_int_equal(umt_f32_to_f16(1e5f), 0x7c00);
    assert_int_equal(umt_f32_to_f16(-1e30f), 0xfc00);
    assert_int_equal(umt_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds past bf16 max */
}

static void test_f16_subnormals_convert_both_ways(void **state) {
    (void)state;
    assert_int_equal(umt_f32_to_f16(0x1p-24f), 0x0001);
    assert_exactly(umt_f16_to_f32(0x0001), 0x1p-24, "f16 0x0001");
    assert_exactly(umt_f16_to_f32(0x03ff), 1023 * 0x1p-24, "f16 0x03ff");
    assert_exactly(umt_f16_to_f32(0x8200), -0x1p-15, "f16 0x8200");
    assert_int_equal(umt_f32_to_f16(1023 * 0x1p-24f), 0x03ff);
    assert_int_equal(umt_f32_to_f16(0x1p-14f), 0x0400);
    assert_int_equal(umt_f32_to_f16(0x1p-14f - 0x1p-26f), 0x0400); /* rounds up into the normals */
    assert_int_equal(umt_f32_to_f16(0x1p-30f), 0x0000);
    assert_int_equal(umt_f32_to_f16(-0x1p-140f), 0x8000); /* an f32 subnormal */
}

static void test_every_bf16_and_f16_pattern_round_trips_through_f32(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float wide = umt_bf16_to_f32((uint16_t)h);
        uint16_t back = umt_f32_to_bf16(wide);
        if (isnan(wide)) {
            if (!isnan(umt_bf16_to_f32(back))) fail_msg("bf16 NaN 0x%04x lost its NaN-ness", h);
        } else if (back != h) {
            fail_msg("bf16 0x%04x -> %g -> 0x%04x", h, wide, back);
        }
        wide = umt_f16_to_f32((uint16_t)h);
        back = umt_f32_to_f16(wide);
        if (isnan(wide)) {
            if (!isnan(umt_f16_to_f32(back))) fail_msg("f16 NaN 0x%04x lost its NaN-ness", h);
        } else if (back != h) {
            fail_msg("f16 0x%04x -> %g -> 0x%04x", h, wide, back);
        }
    }
}

static void test_convert_goes_between_every_float_dtype_and_refuses_others(void **state) {
    (void)state;
    const float src[4] = {1.0f, -2.5f, 65280.0f, 1.0f + 0x1p-11f};
    uint16_t bf16[4], f16[4], f16_again[4];
    float back[4];
    assert_int_equal(umt_cpu_convert(src, UMT_F32, bf16, UMT_BF16, 4), UMT_OK);
    assert_int_equal(bf16[1], 0xc020);
    assert_int_equal(umt_cpu_convert(bf16, UMT_BF16, f16, UMT_F16, 4), UMT_OK);
    assert_int_equal(f16[0], 0x3c00);
    assert_int_equal(f16[1], 0xc100);
    assert_int_equal(f16[2], 0x7bf8); /* 65280 is exact in bf16 (0x477f) and in f16 */
    assert_int_equal(f16[3], 0x3c00); /* bf16 rounded 1 + 2^-11 to 1 already */
    assert_int_equal(umt_cpu_convert(f16, UMT_F16, f16_again, UMT_F16, 4), UMT_OK);
    assert_memory_equal(f16, f16_again, sizeof f16);
    assert_int_equal(umt_cpu_convert(f16, UMT_F16, back, UMT_F32, 4), UMT_OK);
    assert_exactly(back[2], 65280.0, "f16 65280 back to f32");
    assert_int_equal(umt_cpu_convert(src, UMT_F32, back, UMT_F32, 4), UMT_OK);
    assert_memory_equal(src, back, sizeof src);
    assert_int_equal(umt_cpu_convert(src, UMT_F32, back, UMT_I32, 4), UMT_ERR_UNSUPPORTED);
    assert_non_null(strstr(umt_last_error(), "f32 -> non-float"));
    assert_int_equal(umt_cpu_convert(src, UMT_U8, back, UMT_F16, 4), UMT_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_and_f16_encode_exact_values),
        cmocka_unit_test(test_halfway_values_round_to_even),
        cmocka_unit_test(test_every_midpoint_between_neighbours_rounds_to_even),
        cmocka_unit_test(test_nan_and_infinity_survive_conversion_and_overflow_gives_infinity),
        cmocka_unit_test(test_f16_subnormals_convert_both_ways),
        cmocka_unit_test(test_every_bf16_and_f16_pattern_round_trips_through_f32),
        cmocka_unit_test(test_convert_goes_between_every_float_dtype_and_refuses_others),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
