/*
 * dist/engine.h — the NCCL side of data parallelism (dist/engine.c, CUDA builds only): the
 * communicator, the communication stream, one buffer and two events per bucket, and the
 * watchdog. dist/dist.c drives it from the bucket plan.
 */
#ifndef UMT_DIST_ENGINE_H
#define UMT_DIST_ENGINE_H

#include <stdbool.h>

#include "dist/buckets.h"
#include "dist/umt_dist.h"

typedef struct umt_engine umt_engine;

/* The communicator (the id from rank 0 through the bootstrap), rank 0's parameters and buffers
 * broadcast, bucket buffers and events, the watchdog. */
umt_status umt_engine_create(umt_context *ctx, const umt_dist_process *process, const umt_dist_options *options,
                             const umt_bucket_plan *plan, umt_engine **out);
/* Buckets [first, first + count): packed on the compute stream, all-reduced on the
 * communication stream once the compute stream reaches them. */
umt_status umt_engine_start_buckets(umt_engine *engine, const umt_bucket_plan *plan, int first, int count);
/* The compute stream waits for every bucket, then unpacks the averages into the gradients. */
umt_status umt_engine_finish(umt_engine *engine, const umt_bucket_plan *plan);
/* Sum or maximum of count (<= 64) host doubles over the ranks, in place; waits. */
umt_status umt_engine_reduce_host(umt_engine *engine, double *values, int count, bool maximum);
void umt_engine_destroy(umt_engine *engine);

#endif /* UMT_DIST_ENGINE_H */
