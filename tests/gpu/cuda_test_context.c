/*
 * tests/gpu/cuda_test_context.c — see cuda_test_context.h.
 */
#include "tests/gpu/cuda_test_context.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

umt_context *cuda_test_context(uint64_t seed, umt_precision precision) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.seed = seed;
    co.precision = precision;
    umt_context *ctx = NULL;
    if (umt_context_create(&co, &ctx) != UMT_OK) fail_msg("umt_context_create(&co, &ctx) failed: %s", umt_last_error());
    return ctx;
}
