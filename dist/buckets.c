/* dist/buckets.c — the bucket plan (see the header). */
#include "dist/buckets.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

void umt_bucket_plan_free(umt_bucket_plan *plan) {
    free(plan->bucket_of);
    free(plan->offset);
    free(plan->first);
    free(plan->order);
    free(plan->elements);
    free(plan->pending);
    free(plan->announced);
    memset(plan, 0, sizeof *plan);
}

static umt_status allocate(umt_bucket_plan *plan, int count) {
    size_t n = (size_t)count;
    plan->bucket_of = calloc(n, sizeof *plan->bucket_of);
    plan->offset = calloc(n, sizeof *plan->offset);
    /* At most one bucket per parameter, so parameter-sized arrays hold the buckets too. */
    plan->first = calloc(n + 1, sizeof *plan->first);
    plan->order = calloc(n, sizeof *plan->order);
    plan->elements = calloc(n, sizeof *plan->elements);
    plan->pending = calloc(n, sizeof *plan->pending);
    plan->announced = calloc(n, sizeof *plan->announced);
    if (plan->bucket_of && plan->offset && plan->first && plan->order && plan->elements && plan->pending &&
        plan->announced)
        return UMT_OK;
    umt_bucket_plan_free(plan);
    return umt_fail(UMT_ERR_OUT_OF_MEMORY, "bucket plan: no memory for %d parameters", count);
}

/* Parameters in reverse creation order into buckets of `limit` elements: at most limit (a bucket
 * that would pass it closes first), or, with close_at_limit, until they hold limit (the parameter
 * that reaches it stays in). An empty bucket takes any parameter. */
static umt_status pack(const int64_t *numel, int count, int64_t limit, bool close_at_limit, umt_bucket_plan *out) {
    UMT_TRY(allocate(out, count));
    out->parameter_count = count;
    int b = -1;
    for (int i = 0; i < count; ++i) {
        int p = count - 1 - i;
        if (numel[p] <= 0) {
            umt_bucket_plan_free(out);
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bucket plan: parameter %d has %lld elements", p,
                            (long long)numel[p]);
        }
        bool full = b >= 0 && (close_at_limit ? out->elements[b] >= limit : out->elements[b] + numel[p] > limit);
        if (b < 0 || full) out->first[++b] = i;
        out->order[i] = p;
        out->bucket_of[p] = b;
        out->offset[p] = out->elements[b];
        out->elements[b] += numel[p];
    }
    out->bucket_count = b + 1;
    out->first[out->bucket_count] = count;
    umt_bucket_plan_reset(out);
    return UMT_OK;
}

umt_status umt_bucket_plan_make(const int64_t *numel, int count, int64_t cap_elements, umt_bucket_plan *out) {
    memset(out, 0, sizeof *out);
    if (!numel || count <= 0 || cap_elements <= 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bucket plan: %d parameters, cap %lld elements (expected > 0 each)",
                        count, (long long)cap_elements);
    return pack(numel, count, cap_elements, false, out);
}

umt_status umt_bucket_plan_make_auto(const int64_t *numel, int count, size_t element_bytes, umt_bucket_plan *out) {
    memset(out, 0, sizeof *out);
    if (!numel || count <= 0 || element_bytes == 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bucket plan: %d parameters of %zu-byte elements (expected > 0 each)",
                        count, element_bytes);
    int64_t total = 0;
    for (int p = 0; p < count; ++p) total += numel[p] > 0 ? numel[p] : 0;
    int64_t total_bytes = total * (int64_t)element_bytes, target_bytes = total_bytes / 2;
    if (total_bytes < UMT_BUCKET_ONE_BELOW_BYTES) target_bytes = total_bytes;
    if (target_bytes > UMT_BUCKET_LARGEST_BYTES) target_bytes = UMT_BUCKET_LARGEST_BYTES;
    int64_t target = target_bytes / (int64_t)element_bytes;
    return pack(numel, count, target > 0 ? target : 1, true, out);
}

int umt_bucket_size(const umt_bucket_plan *plan, int b) { return plan->first[b + 1] - plan->first[b]; }

void umt_bucket_plan_reset(umt_bucket_plan *plan) {
    for (int b = 0; b < plan->bucket_count; ++b) plan->pending[b] = umt_bucket_size(plan, b);
    memset(plan->announced, 0, (size_t)plan->parameter_count);
    plan->next_start = 0;
}

/* Buckets from next_start on that are complete, in order, become started. */
static int start_complete(umt_bucket_plan *plan, int *start_first) {
    *start_first = plan->next_start;
    while (plan->next_start < plan->bucket_count && plan->pending[plan->next_start] == 0) plan->next_start++;
    return plan->next_start - *start_first;
}

int umt_bucket_plan_announce(umt_bucket_plan *plan, int p, int *start_first, umt_status *status) {
    *start_first = plan->next_start;
    if (p < 0 || p >= plan->parameter_count) {
        *status = umt_fail(UMT_ERR_INVALID_ARGUMENT, "bucket plan: parameter %d of %d announced", p,
                           plan->parameter_count);
        return 0;
    }
    if (plan->announced[p]) {
        *status = umt_fail(UMT_ERR_STATE, "bucket plan: parameter %d announced twice in one step (one backward per "
                           "step with data parallelism)", p);
        return 0;
    }
    plan->announced[p] = 1;
    plan->pending[plan->bucket_of[p]]--;
    *status = UMT_OK;
    return start_complete(plan, start_first);
}

int umt_bucket_plan_rest(umt_bucket_plan *plan, int *start_first) {
    *start_first = plan->next_start;
    plan->next_start = plan->bucket_count;
    return plan->bucket_count - *start_first;
}
