/*
 * tests/test_precision.c — the precision policy's CPU side: names, defaults, and the CPU
 * backend's clear refusal of bf16/fp16 (their kernels exist on CUDA only; the GPU side is
 * tests/gpu/test_cuda_precision.c and tests/gpu/test_cuda_lowp.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "umtrain.h"

static void test_names_round_trip(void **state) {
    (void)state;
    const char *names[] = {"fp32", "bf16", "fp16"};
    for (int i = 0; i < 3; ++i) {
        umt_precision p;
        assert_int_equal(umt_precision_parse(names[i], &p), UMT_OK);
        assert_int_equal(p, i);
        assert_string_equal(umt_precision_name(p), names[i]);
    }
    umt_precision p;
    assert_int_equal(umt_precision_parse("tf32", &p), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "'tf32'"));
    assert_int_equal(umt_precision_parse(NULL, &p), UMT_ERR_INVALID_ARGUMENT);
    assert_string_equal(umt_precision_name((umt_precision)7), "invalid-precision");
}

static void test_cpu_defaults_to_fp32(void **state) {
    (void)state;
    assert_int_equal(umt_precision_default(UMT_DEVICE_CPU, 0), UMT_PRECISION_FP32);
    assert_int_equal(umt_context_defaults().precision, UMT_PRECISION_FP32);
}

static void test_cpu_refuses_half_precision(void **state) {
    (void)state;
    for (umt_precision p = UMT_PRECISION_BF16; p <= UMT_PRECISION_FP16; ++p) {
        umt_context_options co = umt_context_defaults();
        co.device = UMT_DEVICE_CPU;
        co.precision = p;
        umt_context *ctx = (umt_context *)&co; /* must be reset to NULL */
        assert_int_equal(umt_context_create(&co, &ctx), UMT_ERR_UNSUPPORTED);
        assert_null(ctx);
        assert_non_null(strstr(umt_last_error(), umt_precision_name(p)));
        assert_non_null(strstr(umt_last_error(), "CUDA"));
    }
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    co.precision = (umt_precision)9;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_ERR_INVALID_ARGUMENT);
}

/* TF32 is how CUDA's tensor cores take fp32: asked for on the CPU (or with half precision, which
 * has no fp32 convolutions) it would change nothing, so it is refused, naming it and the setting. */
static void test_tf32_is_refused_where_it_would_change_nothing(void **state) {
    (void)state;
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    o.tf32 = true;
    umt_context *ctx = (umt_context *)&o;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(umt_last_error(), "tf32 with cpu fp32"));
    o.device = UMT_DEVICE_CUDA;
    o.precision = UMT_PRECISION_BF16;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "tf32 with cuda bf16"));
}

/* A bf16 tensor made by hand on the CPU is refused by an op with a message, not computed on. */
static void test_cpu_op_refuses_bf16_tensor(void **state) {
    (void)state;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_tensor *x = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_BF16, 8);
    assert_non_null(x);
    assert_null(umt_relu(ctx, x));
    assert_int_equal(umt_last_status(), UMT_ERR_UNSUPPORTED);
    assert_non_null(strstr(umt_last_error(), "bf16"));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_cpu_defaults_to_fp32),
        cmocka_unit_test(test_cpu_refuses_half_precision),
        cmocka_unit_test(test_cpu_op_refuses_bf16_tensor),
        cmocka_unit_test(test_tf32_is_refused_where_it_would_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
