/*
 * tests/gpu/cuda_test_context.h — the context the end-to-end GPU tests train in, made one way.
 */
#ifndef UMT_TESTS_GPU_CUDA_TEST_CONTEXT_H
#define UMT_TESTS_GPU_CUDA_TEST_CONTEXT_H

#include <stdint.h>

#include "umtrain.h"

/* A CUDA context with options o (its device set to CUDA); the calling cmocka test fails, with
 * the library's message, when it cannot be made. */
umt_context *cuda_test_context_with(umt_context_options o);
/* The same with the default options but seed and precision. */
umt_context *cuda_test_context(uint64_t seed, umt_precision precision);

#endif /* UMT_TESTS_GPU_CUDA_TEST_CONTEXT_H */
