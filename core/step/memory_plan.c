/*
 * core/step/memory_plan.c — the memory plan (include/umtrain.h): dry steps measure, memory/fit.c
 * decides, and the plan is printed as one short table before the first step.
 *
 * A measure at micro-batch b is a short epoch in dry steps (core/step/dry_step.h): two training
 * passes of b (the first recorded, the second on the arena's plan), the other sizes the epoch's
 * micro-batches take (epoch_passes), and two evaluation passes, each begun as umt_step_begin
 * begins a step. So every pool's peak is what the arena's own code reaches over an epoch, not
 * an estimate of it.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/precision.h"
#include "core/step/dry_step.h"
#include "core/tensor.h"
#include "memory/budget.h"
#include "memory/fit.h"
#include "memory/offload_plan.h"
#include "memory/pool.h"

/* Kept free under the budget, besides 1% of it: what no dry step allocates (the step's values, a
 * slot of at least 64 KiB in the inputs pool, made at the first step) and a trainer's own small
 * tensors around its step. */
#define UMT_PLAN_MARGIN_BYTES ((size_t)1 << 20)

static int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------------------------------------- */
/* The model's state: where it is, and what the offload tier's planner would take */

typedef struct {
    size_t bytes[3];      /* weights (with the compute copies they get), grads, optim, wherever they are */
    size_t on_device;     /* the tensors' own bytes in pools on the device now */
    size_t in_tier;       /* ... in the offload pool, where the tier makes them before its first step */
    umt_plan_item *items; /* one per tensor, grouped by parameter, as offload/offload.c collects them */
    int count;
} model_state;

static const umt_pool state_pools[3] = {UMT_POOL_WEIGHTS, UMT_POOL_GRADS, UMT_POOL_OPTIM};

/* The parameter a tensor of the state belongs to (its index), or -1 for anything else. */
static int parameter_of(const umt_context *ctx, const umt_tensor *t) {
    bool weights = t->kind_pool == UMT_POOL_WEIGHTS;
    if (!weights && t->kind_pool != UMT_POOL_GRADS && t->kind_pool != UMT_POOL_OPTIM) return -1;
    const umt_tensor *p = weights ? t : t->owner;
    for (int i = 0; p && p->is_parameter && i < ctx->parameter_count; ++i)
        if (ctx->parameters[i] == p) return i;
    return -1;
}

static umt_status collect_state(const umt_context *ctx, model_state *st) {
    *st = (model_state){0};
    int n = 0;
    for (const umt_tensor *t = ctx->run_tensors; t; t = t->next) n += parameter_of(ctx, t) >= 0;
    st->items = calloc((size_t)n + 1, sizeof *st->items);
    if (!st->items) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_memory_plan_make: no memory for %d state tensors", n);
    umt_dtype compute = umt_compute_dtype(ctx);
    for (const umt_tensor *t = ctx->run_tensors; t; t = t->next) {
        int group = parameter_of(ctx, t);
        if (group < 0) continue;
        size_t copy = umt_compute_copy_bytes(compute, t), bytes = t->bytes + copy;
        const umt_tensor *p = ctx->parameters[group];
        /* A streamed weight's slot holds its compute copy alone (umt_plan_item.stream_bytes). */
        st->items[st->count++] = (umt_plan_item){p->name ? p->name : "?", t->kind_pool, group, bytes, false, copy};
        st->bytes[t->kind_pool == UMT_POOL_WEIGHTS ? 0 : t->kind_pool == UMT_POOL_GRADS ? 1 : 2] += bytes;
        if (t->pool == UMT_POOL_OFFLOAD) st->in_tier += t->bytes;
        else if (umt_placement_uses_device(ctx->memory.pools[t->pool].placement)) st->on_device += t->bytes;
    }
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Measures: dry steps */

typedef struct {
    umt_context *ctx;
    const umt_memory_plan_request *request;
    umt_plan_forward_fn forward;
    void *user;
    const umt_fit_inputs *in;
    size_t in_tier;      /* the state the tier holds off the device, which the dry steps do not see */
    umt_dry_result last; /* the latest measure's dry result */
} measuring;

/* The most dry passes a measure runs (epoch_passes). */
enum { MAX_PASSES = 7 };

/* The sizes of `samples` samples in `parts` near-equal micro-batches: ceil and floor of samples
 * / parts, the larger first (the floor only where it differs and is not 0); returns how many. */
static int split_sizes(int64_t samples, int64_t parts, int64_t sizes[2]) {
    sizes[0] = (samples + parts - 1) / parts, sizes[1] = samples / parts;
    return sizes[1] == sizes[0] || sizes[1] == 0 ? 1 : 2;
}

/* The dry passes of an epoch at micro-batch b, at every size its steps will run: a step of the
 * batch as k = ceil(batch / b) near-equal micro-batches (two passes of the larger, the first
 * recorded, the second on the arena's plan, then the smaller), the epoch's last shorter step as
 * as many (include/umtrain.h, umt_memory_plan.micro_batch), and two evaluation passes. Every
 * size, not b alone: a convolution's workspace is its engines', which cuDNN chooses by the exact
 * shape (a size the plan had not measured once asked for more workspace than the budget had
 * left: docs/PERF.md, "Dropout drawn by the pool"). Evaluation keeps its batch while the
 * training step is whole, and takes micro-batches no larger than the training's once split. */
static int epoch_passes(const umt_memory_plan_request *rq, int64_t b, umt_dry_pass passes[MAX_PASSES]) {
    int64_t k = (rq->batch + b - 1) / b, sizes[2];
    int count = 0, parts = split_sizes(rq->batch, k, sizes);
    passes[count++] = (umt_dry_pass){sizes[0], true};
    for (int i = 0; i < parts; ++i) passes[count++] = (umt_dry_pass){sizes[i], true};
    parts = rq->last_batch > 0 ? split_sizes(rq->last_batch, smaller(rq->last_batch, k), sizes) : 0;
    for (int i = 0; i < parts; ++i) passes[count++] = (umt_dry_pass){sizes[i], true};
    int64_t eval = b == rq->batch ? rq->eval_batch : smaller(rq->eval_batch, b);
    for (int i = 0; i < 2 && eval > 0; ++i) passes[count++] = (umt_dry_pass){eval, false};
    return count;
}

/* The step's own device bytes are what the dry steps' peak holds beyond the rest and the state
 * (with the state the tier holds counted as if it were on the device). */
static umt_status measure(void *user, int64_t micro_batch, umt_fit_measure *out) {
    measuring *m = user;
    umt_dry_pass passes[MAX_PASSES];
    int count = epoch_passes(m->request, micro_batch, passes);
    umt_status st = umt_dry_steps(m->ctx, passes, count, m->forward, m->user, &m->last);
    const umt_fit_inputs *in = m->in;
    size_t peak = m->last.device_peak_bytes + m->in_tier;
    size_t others = in->held_bytes + in->state_bytes[0] + in->state_bytes[1] + in->state_bytes[2];
    const umt_pool_stats *activations = &m->last.pools[UMT_POOL_ACTIVATIONS];
    *out = (umt_fit_measure){.step_bytes = peak > others ? peak - others : 0,
                             .activation_bytes = activations->peak_bytes,
                             .activation_total_bytes = activations->planned_total_bytes,
                             .largest_bytes = m->last.largest_bytes, .largest_elements = m->last.largest_elements};
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

/* The decision's inputs: the budget, what the device holds now, the state, the tier's least. */
static umt_fit_inputs fit_inputs(const umt_context *ctx, const umt_memory_plan_request *rq, const model_state *st) {
    bool cuda = ctx->options.device == UMT_DEVICE_CUDA;
    /* cuDNN's limit binds on CUDA only: the CPU's kernels index with 64 bits. */
    int64_t limit = cuda ? INT_MAX : INT64_MAX;
    size_t device_now = ctx->memory.device_bytes;
    umt_fit_inputs in = {.batch = rq->batch, .forced_k = rq->micro_batches,
                         .element_limit = rq->element_limit ? rq->element_limit : limit,
                         .budget_bytes = ctx->memory.budget_bytes,
                         .margin_bytes = ctx->memory.budget_bytes / 100 + UMT_PLAN_MARGIN_BYTES,
                         .held_bytes = (device_now > st->on_device ? device_now - st->on_device : 0) +
                                       rq->later_device_bytes + rq->later_dataset_bytes,
                         .state_bytes = {st->bytes[0], st->bytes[1], st->bytes[2]}, .tier = cuda};
    /* Only where a budget binds: the least is a search over the stages, and the host a file read. */
    if (cuda && in.budget_bytes) {
        in.tier_bytes = umt_plan_least_device_bytes(st->items, st->count, rq->updates_in_backward);
        /* What the tier holds already (it makes the state at home before its first step) is its own. */
        size_t available = umt_host_available_bytes();
        in.host_available_bytes = available ? available + st->in_tier : 0;
    }
    return in;
}

/* ----------------------------------------------------------------------------------------- */
/* The plan */

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
    bool needed = choice->arrangement != UMT_FIT_IN_MEMORY;
    out->offload = (umt_plan_offload){
        .needed = needed, .enabled = umt_hooks_place(ctx, UMT_POOL_WEIGHTS) == UMT_POOL_OFFLOAD,
        .activations = choice->arrangement == UMT_FIT_TIER_ACTIVATIONS,
        .reserve_bytes = in->budget_bytes ? choice->reserve_bytes : 0,
        .state_bytes = in->state_bytes[0] + in->state_bytes[1] + in->state_bytes[2],
        .least_device_bytes = in->tier_bytes, .host_bytes = needed ? choice->host_bytes : 0,
        .host_available_bytes = in->host_available_bytes};
    out->offload.pools[UMT_POOL_ACTIVATIONS] = out->offload.activations;
}

/* Where the tier takes part (needed, or enabled and planning the state's place at the first step),
 * the state's pools as its planner will place them with the plan's reserve: what stays in the
 * weights, grads and optim pools, what goes home (offload), its buffers (stream). */
static void place_state(const umt_fit_inputs *in, const umt_fit_choice *choice, bool updates_in_backward,
                        model_state *st, umt_memory_plan *out) {
    if (!(out->offload.needed || out->offload.enabled) || !in->budget_bytes || !choice->fits) return;
    umt_placement_plan placed;
    size_t fixed = in->held_bytes + choice->reserve_bytes;
    if (umt_plan_placement(st->items, st->count, in->budget_bytes, fixed, updates_in_backward, &placed) != UMT_OK)
        return;
    size_t off_device = 0;
    for (int i = 0; i < 3; ++i) out->peak_bytes[state_pools[i]] = 0;
    for (int i = 0; i < st->count; ++i) {
        const umt_plan_item *it = &st->items[i];
        if (it->offloaded) off_device += it->bytes, out->offload.pools[it->pool] = true;
        else out->peak_bytes[it->pool] += it->bytes;
    }
    out->peak_bytes[UMT_POOL_OFFLOAD] = off_device + (out->offload.activations ? choice->at.activation_total_bytes : 0);
    out->peak_bytes[UMT_POOL_STREAM] =
        2 * placed.weight_slot_bytes + 2 * placed.activation_slot_bytes + placed.ring_bytes;
    /* Saved activations away, the arena holds the working set the decision counted. */
    size_t working = UMT_FIT_ACTIVATION_WORKING_SET * choice->at.largest_bytes;
    if (out->offload.activations && working < out->peak_bytes[UMT_POOL_ACTIVATIONS])
        out->peak_bytes[UMT_POOL_ACTIVATIONS] = working;
    out->device_peak_bytes = placed.device_bytes - in->margin_bytes;
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
    model_state st;
    UMT_TRY(collect_state(ctx, &st));
    umt_fit_inputs in = fit_inputs(ctx, request, &st);
    umt_memory_plan_request rq = *request;
    rq.element_limit = in.element_limit;
    measuring m = {.ctx = ctx, .request = &rq, .forward = forward, .user = user, .in = &in, .in_tier = st.in_tier};
    umt_fit_choice choice;
    umt_status status = umt_fit_choose(&in, measure, &m, &choice);
    /* The table shows the chosen micro-batch (the decision's last measure may be another). */
    umt_fit_measure at;
    if (status == UMT_OK) status = measure(&m, choice.micro_batch, &at);
    if (status == UMT_OK) {
        fill_plan(ctx, &in, &choice, &m.last, out);
        /* What the caller adds later is on the device: a loader's ring in the inputs pool, a batch
         * made once in the dataset pool. */
        out->peak_bytes[UMT_POOL_INPUTS] += rq.later_device_bytes;
        out->peak_bytes[UMT_POOL_DATASET] += rq.later_dataset_bytes;
        out->device_peak_bytes += rq.later_device_bytes + rq.later_dataset_bytes;
        place_state(&in, &choice, rq.updates_in_backward, &st, out);
        add_step_values(ctx, &rq, out);
    }
    free(st.items);
    return status;
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

/* The tier's line: which pools it takes, and why in sizes (the state against its least, the step's
 * reserve, host memory); or that it is on and keeps everything on the GPU. */
static void print_offload(const umt_memory_plan *plan, FILE *out) {
    const umt_plan_offload *o = &plan->offload;
    char a[32], b[32], c[32];
    if (!o->needed) {
        if (o->enabled && plan->budget_bytes)
            fprintf(out, "  offload tier: on, the state (%s) fits beside the step: it stays on the GPU\n",
                    readable(o->state_bytes, a, sizeof a));
        return;
    }
    fprintf(out, "  offload tier: to pinned host memory:");
    static const umt_pool order[] = {UMT_POOL_OPTIM, UMT_POOL_WEIGHTS, UMT_POOL_GRADS, UMT_POOL_ACTIVATIONS};
    for (int i = 0, first = 1; i < 4; ++i)
        if (o->pools[order[i]]) fprintf(out, "%s %s", first ? "" : ",", umt_pool_name(order[i])), first = 0;
    fprintf(out, "%s\n", o->enabled ? "" : " (the tier is not on yet: the model is made again with it)");
    fprintf(out, "    the state %s does not fit beside one sample's step; the tier holds it in %s of the device at "
            "least, leaves %s for a micro-batch's step", readable(o->state_bytes, a, sizeof a),
            readable(o->least_device_bytes, b, sizeof b), readable(o->reserve_bytes, c, sizeof c));
    if (o->activations) fprintf(out, " with its saved activations in host memory");
    fprintf(out, "; host %s", readable(o->host_bytes, a, sizeof a));
    if (o->host_available_bytes) fprintf(out, " of %s available", readable(o->host_available_bytes, b, sizeof b));
    fputc('\n', out);
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
    print_offload(plan, out);
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
