/*
 * tests/gpu/cuda_test_context.c — see cuda_test_context.h.
 */
#include "tests/gpu/cuda_test_context.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

umt_context *cuda_test_context_with(umt_context_options o) {
    o.device = UMT_DEVICE_CUDA;
    umt_context *ctx = NULL;
    if (umt_context_create(&o, &ctx) != UMT_OK) fail_msg("umt_context_create failed: %s", umt_last_error());
    return ctx;
}

umt_context *cuda_test_context(uint64_t seed, umt_precision precision) {
    umt_context_options o = umt_context_defaults();
    o.seed = seed;
    o.precision = precision;
    return cuda_test_context_with(o);
}
