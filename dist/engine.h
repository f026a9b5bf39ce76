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
/* Gradients that a subsystem holds outside the grads pool (the offload tier: pinned host memory
 * and device slots they pass through) are reduced one by one where they are, not in buckets:
 * the engine is in place when, at its creation, some gradient is held so (core/tensor.h:
 * kind_pool); it then makes no bucket buffers (they would hold every gradient on the GPU at
 * once). Each call all-reduces (ncclAvg, f32) the numel floats at data on the
 * communication stream, after the compute stream's work so far, and makes the compute stream wait
 * for it: the subsystem's next work on the gradient (its copy home) reads the average. */
bool umt_engine_in_place(const umt_engine *engine);
umt_status umt_engine_reduce_in_place(umt_engine *engine, void *data, int64_t numel);
/* Buckets [first, first + count): packed on the compute stream, all-reduced on the
 * communication stream once the compute stream reaches them. */
umt_status umt_engine_start_buckets(umt_engine *engine, const umt_bucket_plan *plan, int first, int count);
/* The compute stream waits for every bucket, then unpacks the averages into the gradients. */
umt_status umt_engine_finish(umt_engine *engine, const umt_bucket_plan *plan);
/* A step graph's launch of a captured step: before, a failure the watchdog saw (the graph's
 * collectives would wait on a dead peer); after, the watchdog follows the replay as a whole. */
umt_status umt_engine_before_replay(umt_engine *engine);
umt_status umt_engine_after_replay(umt_engine *engine);
/* The buckets' all-reduces issued so far: eagerly, and into step graphs' captures. */
void umt_engine_counts(const umt_engine *engine, int64_t *eager, int64_t *captured);
/* Sum or maximum of count (<= 64) host doubles over the ranks, in place; waits. */
umt_status umt_engine_reduce_host(umt_engine *engine, double *values, int count, bool maximum);
void umt_engine_destroy(umt_engine *engine);

#endif /* UMT_DIST_ENGINE_H */
