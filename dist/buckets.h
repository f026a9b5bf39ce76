/*
 * dist/buckets.h — which gradients go into which all-reduce, and when a bucket may start.
 *
 * Pure bookkeeping (no CUDA), so that the CPU tests check it. Parameters are taken in reverse
 * order of creation, the order in which backward finishes their gradients for a network built
 * input to output, and packed into buckets. Buckets start strictly in order: NCCL needs every
 * rank to issue the same collectives in the same order, and a bucket that becomes complete
 * early (a parameter used out of the expected order) simply waits for the ones before it.
 *
 * How big a bucket is. An all-reduce costs a latency of its own (NCCL's launch and handshakes,
 * the same for a few KB as for a few hundred) plus its bytes over the link; a bucket overlaps
 * backward only if it starts before backward ends. So a caller's cap (--bucket-mb) packs each
 * bucket up to it; without one (umt_bucket_plan_make_auto, the default) the model decides:
 *   - gradients under UMT_BUCKET_ONE_BELOW_BYTES: one bucket at the end (a second would add more
 *     latency than it could hide);
 *   - otherwise a bucket closes once it holds half the gradient bytes, at most
 *     UMT_BUCKET_LARGEST_BYTES (DDP's 25 MB): a small model gets two all-reduces, the last layers'
 *     gradients (final first) reduced while backward computes the first layers', then the rest;
 *     a large one gets DDP's many buckets of about 25 MB.
 * Bytes are the reduce dtype's: bf16 halves them.
 */
#ifndef UMT_DIST_BUCKETS_H
#define UMT_DIST_BUCKETS_H

#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

#define UMT_BUCKET_ONE_BELOW_BYTES ((int64_t)2 << 20)
#define UMT_BUCKET_LARGEST_BYTES ((int64_t)25 << 20)

typedef struct {
    int parameter_count;
    int bucket_count;
    int *bucket_of;        /* [parameter] -> its bucket */
    int64_t *offset;       /* [parameter] -> its first element inside its bucket's buffer */
    int *first;            /* [bucket] -> index into `order` of its first parameter */
    int *order;            /* parameters in bucket order (reverse creation order) */
    int64_t *elements;     /* [bucket] -> elements in it */
    int *pending;          /* [bucket] -> parameters not yet announced this step */
    char *announced;       /* [parameter] -> announced this step */
    int next_start;        /* buckets [0, next_start) have started this step */
} umt_bucket_plan;

/* Plans buckets of at most cap_elements over parameters with numel[0..count) elements (a larger
 * parameter gets a bucket of its own). */
umt_status umt_bucket_plan_make(const int64_t *numel, int count, int64_t cap_elements, umt_bucket_plan *out);
/* The same, the buckets sized by the model (above), for elements of element_bytes on the wire. */
umt_status umt_bucket_plan_make_auto(const int64_t *numel, int count, size_t element_bytes, umt_bucket_plan *out);
void umt_bucket_plan_free(umt_bucket_plan *plan);
/* A new step: nothing announced, nothing started. */
void umt_bucket_plan_reset(umt_bucket_plan *plan);
/* Parameter p's gradient is final. *start_first and the return value say which buckets may
 * start now: [*start_first, *start_first + n). A parameter announced twice in one step is an
 * error (UMT_ERR_STATE, returned through *status; the return value is then 0). */
int umt_bucket_plan_announce(umt_bucket_plan *plan, int p, int *start_first, umt_status *status);
/* The buckets not started yet this step (those whose parameters got no gradient): from
 * *start_first to the end; marks them started. */
int umt_bucket_plan_rest(umt_bucket_plan *plan, int *start_first);
/* Parameters of bucket b: plan->order[first[b] .. first[b] + umt_bucket_size(plan, b)). */
int umt_bucket_size(const umt_bucket_plan *plan, int b);

#endif /* UMT_DIST_BUCKETS_H */
