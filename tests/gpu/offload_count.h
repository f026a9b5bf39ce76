/*
 * tests/gpu/offload_count.h — what the offload tier holds, counted the same way by its tests.
 */
#ifndef UMT_TESTS_GPU_OFFLOAD_COUNT_H
#define UMT_TESTS_GPU_OFFLOAD_COUNT_H

#include "umtrain.h"

/* Parameters with anything in the offload tier: their weights, or some of their state. */
int offload_count_parameters(const umt_context *ctx);

#endif /* UMT_TESTS_GPU_OFFLOAD_COUNT_H */
