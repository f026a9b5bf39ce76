/*
 * core/step/memory_plan.c — the memory plan (include/umtrain.h): dry steps measure, memory/fit.c
 * decides, and the plan is printed as one short table before the first step.
 *
 * A measure at micro-batch b is a short epoch in dry steps (core/step/dry_step.h): two training
 * passes of b (the first recorded, the second on the arena's plan), the epoch's last shorter
 * step, and two evaluation passes, each begun as umt_step_begin begins a step. So every pool's
 * peak is what the arena's own code reaches over an epoch, not an estimate of it.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/step/dry_step.h"
#include "memory/fit.h"
#include "memory/pool.h"

/* Kept free under the budget, besides 1% of it: what no dry step allocates (the step's values, a
 * slot of at least 64 KiB in the inputs pool, made at the first step) and a trainer's own small
 * tensors around its step. */
#define UMT_PLAN_MARGIN_BYTES ((size_t)1 << 20)

typedef struct {
    umt_context *ctx;
    const umt_memory_plan_request *request;
    umt_plan_forward_fn forward;
    void *user;
    umt_dry_result last; /* the latest measure's dry result */
} measuring;

static int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

/* The dry passes of an epoch at micro-batch b: evaluation keeps its batch while the training
 * step is whole, and takes micro-batches no larger than the training's once it is split. */
static int epoch_passes(const umt_memory_plan_request *rq, int64_t b, umt_dry_pass passes[5]) {
    int count = 0;
    passes[count++] = (umt_dry_pass){b, true};
    passes[count++] = (umt_dry_pass){b, true};
    if (rq->last_batch > 0) passes[count++] = (umt_dry_pass){smaller(rq->last_batch, b), true};
    int64_t eval = b == rq->batch ? rq->eval_batch : smaller(rq->eval_batch, b);
    for (int i = 0; i < 2 && eval > 0; ++i) passes[count++] = (umt_dry_pass){eval, false};
    return count;
}

static umt_status measure(void *user, int64_t micro_batch, umt_fit_measure *out) {
    measuring *m = user;
    umt_dry_pass passes[5];
    int count = epoch_passes(m->request, micro_batch, passes);
    umt_status st = umt_dry_steps(m->ctx, passes, count, m->forward, m->user, &m->last);
    *out = (umt_fit_measure){m->last.device_peak_bytes, m->last.largest_elements, false};
    if (st == UMT_OK) return UMT_OK;
    /* A library's refusal of a tensor past the element limit is a size the plan avoids, not an error. */
    if (m->last.largest_elements > m->request->element_limit) {
        out->refused = true;
        return UMT_OK;
    }
    return st;
}

static umt_status check_request(const umt_memory_plan_request *rq) {
    const char *bad = rq->batch < 1                                           ? "batch"
                      : rq->micro_batches < 0 || rq->micro_batches > rq->batch ? "micro_batches"
                      : rq->last_batch < 0 || rq->last_batch > rq->batch       ? "last_batch"
                      : rq->eval_batch < 0                                    ? "eval_batch"
                      : rq->element_limit < 0                                 ? "element_limit"
                                                                              : NULL;
    if (!bad) return UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                    "umt_memory_plan_make: request.%s out of range (batch %lld >= 1; micro_batches 0..batch: %lld; "
                    "last_batch 0..batch: %lld; eval_batch >= 0: %lld; element_limit >= 0: %lld)",
                    bad, (long long)rq->batch, (long long)rq->micro_batches, (long long)rq->last_batch,
                    (long long)rq->eval_batch, (long long)rq->element_limit);
}

/* The decision's inputs: the budget, and the state the device holds now. */
static umt_fit_inputs fit_inputs(const umt_context *ctx, const umt_memory_plan_request *rq) {
    /* cuDNN's limit binds on CUDA only: the CPU's kernels index with 64 bits. */
    int64_t limit = ctx->options.device == UMT_DEVICE_CUDA ? INT_MAX : INT64_MAX;
    umt_fit_inputs in = {.batch = rq->batch, .forced_k = rq->micro_batches,
                         .element_limit = rq->element_limit ? rq->element_limit : limit,
                         .budget_bytes = ctx->memory.budget_bytes,
                         .margin_bytes = ctx->memory.budget_bytes / 100 + UMT_PLAN_MARGIN_BYTES};
    const umt_pool state[3] = {UMT_POOL_WEIGHTS, UMT_POOL_GRADS, UMT_POOL_OPTIM};
    for (int i = 0; i < 3; ++i) {
        const umt_pool_state *s = &ctx->memory.pools[state[i]];
        in.state_bytes[i] = umt_placement_uses_device(s->placement) ? s->in_use_bytes : 0;
    }
    return in;
}

static void fill_plan(const umt_context *ctx, const umt_fit_inputs *in, const umt_fit_choice *choice,
                      const umt_dry_result *dry, umt_memory_plan *out) {
    *out = (umt_memory_plan){.verdict = choice->verdict, .fits = choice->fits, .batch = in->batch,
                             .micro_batches = choice->k, .micro_batch = choice->micro_batch,
                             .activations_planned_bytes = dry->pools[UMT_POOL_ACTIVATIONS].planned_peak_bytes,
                             .device_peak_bytes = dry->device_peak_bytes, .budget_bytes = in->budget_bytes,
                             .largest_elements = dry->largest_elements, .element_limit = in->element_limit};
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        out->peak_bytes[p] = dry->pools[p].peak_bytes;
        out->place[p] = umt_placement_name(ctx->memory.pools[p].placement);
    }
    snprintf(out->why, sizeof out->why, "%s", choice->why);
}

/* The step values' ring (core/step_values.c): no dry step queues values, so the ring a step of
 * rq's values grows into is added to the staging pool (pinned, a slot per step in flight) and,
 * on a GPU, the inputs pool; a ring already large enough adds nothing. */
static void add_step_values(const umt_context *ctx, const umt_memory_plan_request *rq, umt_memory_plan *out) {
    size_t capacity = umt_step_values_capacity_for(rq->step_value_bytes);
    if (capacity <= ctx->values.capacity) return;
    out->peak_bytes[UMT_POOL_STAGING] += capacity * UMT_STEP_VALUE_SLOTS;
    if (ctx->options.device != UMT_DEVICE_CUDA) return;
    out->peak_bytes[UMT_POOL_INPUTS] += capacity;
    out->device_peak_bytes += capacity;
}

umt_status umt_memory_plan_make(umt_context *ctx, const umt_memory_plan_request *request, umt_plan_forward_fn forward,
                                void *user, umt_memory_plan *out) {
    if (!ctx || !request || !forward || !out)
        return umt_fail_null("umt_memory_plan_make",
                             !ctx ? "ctx" : !request ? "request" : !forward ? "forward" : "out");
    UMT_TRY(check_request(request));
    umt_fit_inputs in = fit_inputs(ctx, request);
    umt_memory_plan_request rq = *request;
    rq.element_limit = in.element_limit;
    measuring m = {.ctx = ctx, .request = &rq, .forward = forward, .user = user};
    umt_fit_choice choice;
    UMT_TRY(umt_fit_choose(&in, measure, &m, &choice));
    /* The table shows the chosen micro-batch (the decision's last measure may be another). */
    umt_fit_measure at;
    UMT_TRY(measure(&m, choice.micro_batch, &at));
    fill_plan(ctx, &in, &choice, &m.last, out);
    add_step_values(ctx, &rq, out);
    return UMT_OK;
}

static const char *const verdict_names[] = {"fits", "micro-batches", "forced", "offload-state",
                                            "offload-activations"};

const char *umt_plan_verdict_name(umt_plan_verdict verdict) {
    return (unsigned)verdict < sizeof verdict_names / sizeof *verdict_names ? verdict_names[verdict] : "invalid";
}

/* bytes as a short reading: "512 B", "3.4 MiB", "1.2 GiB". */
static const char *readable(size_t bytes, char *buf, size_t size) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
    return buf;
}

void umt_memory_plan_print(const umt_memory_plan *plan, FILE *out) {
    if (!out) {
        umt_fail_null("umt_memory_plan_print", "out");
        return;
    }
    if (!plan) return;
    char a[32], b[32];
    fprintf(out, "memory plan: batch %lld as %lld micro-batch%s of %lld (%s)\n", (long long)plan->batch,
            (long long)plan->micro_batches, plan->micro_batches == 1 ? "" : "es", (long long)plan->micro_batch,
            plan->fits ? umt_plan_verdict_name(plan->verdict) : "does not fit");
    fprintf(out, "  %-12s %-8s %16s\n", "pool", "place", "peak bytes");
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        if (!plan->peak_bytes[p]) continue;
        fprintf(out, "  %-12s %-8s %16zu %10s", umt_pool_name((umt_pool)p), plan->place[p], plan->peak_bytes[p],
                readable(plan->peak_bytes[p], a, sizeof a));
        if (p == UMT_POOL_ACTIVATIONS && plan->activations_planned_bytes)
            fprintf(out, "  (first step; %s planned from the second)",
                    readable(plan->activations_planned_bytes, b, sizeof b));
        fputc('\n', out);
    }
    if (plan->budget_bytes)
        fprintf(out, "  device peak %s of a budget of %s; ", readable(plan->device_peak_bytes, a, sizeof a),
                readable(plan->budget_bytes, b, sizeof b));
    else
        fprintf(out, "  no device budget (host memory); ");
    fprintf(out, "largest tensor %lld elements", (long long)plan->largest_elements);
    if (plan->element_limit < INT64_MAX) fprintf(out, " (limit %lld)", (long long)plan->element_limit);
    fputc('\n', out);
    fprintf(out, "  why: %s\n", plan->why);
}
