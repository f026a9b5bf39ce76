/*
 * dist/buckets.h — which gradients go into which all-reduce, and when a bucket may start.
 *
 * Pure bookkeeping (no CUDA), so that the CPU tests check it. Parameters are taken in reverse
 * order of creation, the order in which backward finishes their gradients for a network built
 * input to output, and packed greedily into buckets of at most `cap_elements` elements (one
 * larger parameter gets a bucket of its own). Buckets start strictly in order: NCCL needs every
 * rank to issue the same collectives in the same order, and a bucket that becomes complete
 * early (a parameter used out of the expected order) simply waits for the ones before it.
 */
#ifndef UMT_DIST_BUCKETS_H
#define UMT_DIST_BUCKETS_H

#include <stdint.h>

#include "umtrain.h"

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

/* Plans buckets over parameters with numel[0..count) elements. */
umt_status umt_bucket_plan_make(const int64_t *numel, int count, int64_t cap_elements, umt_bucket_plan *out);
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
