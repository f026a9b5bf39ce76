/*
 * offload/activations.c — the offload tier's saved activations (umt_offload_options.activations):
 * out to pinned memory after their forward use, back one layer ahead in backward.
 *
 *   forward   when the tape records an op, each activation it read (or saved) for its backward
 *             is copied to its pinned copy on the copy-out stream, after the op's kernels. One
 *             send later the compute stream waits for that copy, and only then are the arena
 *             bytes given up (memory/plan.h: their life ends there, so later activations reuse
 *             them) and the tensor's data pointed at the pinned copy: the copy overlaps one op's
 *             compute, and whatever still reads the tensor reads valid bytes.
 *   backward  before an op's backward, its activations that are away are copied back into
 *             arena buffers on the copy-in stream (the compute stream waits for them), and the
 *             next op's are started: one op ahead. After the backward of the earliest op that
 *             reads one, its buffer's life ends.
 *   micro-batches  each micro-batch's forward (the tape's node 0 again, after a backward) sends
 *             its own, into the same pinned copies: sized by the first step's first micro-batch,
 *             the largest.
 *   planning  before a forward pass has run nothing says how large the activations are, so the
 *             first step sends every one (the arena reuses freed bytes while it records that
 *             step: memory/pool.h, recycling). At the second step the placement planner's
 *             stage 3 (memory/offload_plan.h) runs on what the first step saw: what fits the
 *             budget beside everything the GPU holds now stays on the GPU, largest layers are
 *             offloaded first; when that changes anything the arena records the second step
 *             afresh.
 *
 * Which tensors an op's backward reads is the op's own business, so every activation an op
 * touches (inputs, output, saved) is on the GPU during its backward. Views and tensors with a
 * view of their bytes stay in the arena (a view would keep reading the freed bytes).
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"
#include "offload/state.h"

/* Smaller activations stay on the GPU: a copy's fixed cost would outweigh the bytes saved. */
#define UMT_OFFLOAD_MIN_ACTIVATION_BYTES ((size_t)256 << 10)

static bool is_candidate(const umt_tensor *t) {
    return t && t->pool == UMT_POOL_ACTIVATIONS && t->owns_storage && !t->is_parameter &&
           t->bytes >= UMT_OFFLOAD_MIN_ACTIVATION_BYTES;
}

static umt_offload_activation *record_of(umt_offload *o, const umt_tensor *t) {
    for (int i = 0; i < o->activation_count; ++i)
        if (o->activations[i].tensor == t) return &o->activations[i];
    return NULL;
}

/* The next record, its events made once and kept for the steps after. */
static umt_status next_record(umt_offload *o, umt_offload_activation **out) {
    if (o->activation_count == o->activation_slots) {
        int slots = o->activation_slots ? 2 * o->activation_slots : 64;
        umt_offload_activation *grown = realloc(o->activations, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to track %d saved activations", slots);
        for (int i = o->activation_slots; i < slots; ++i) grown[i] = (umt_offload_activation){0};
        o->activations = grown;
        o->activation_slots = slots;
    }
    umt_offload_activation *r = &o->activations[o->activation_count];
    if (o->activation_count == o->activation_events) {
        UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&r->left, cudaEventDisableTiming));
        UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&r->loaded, cudaEventDisableTiming));
        o->activation_events++;
    }
    o->activation_count++;
    *out = r;
    return UMT_OK;
}

/* The earliest tape node that produced t (its backward may read its output), or node n. */
static int first_reader(const umt_context *ctx, const umt_tensor *t, int n) {
    for (int i = 0; i < n; ++i)
        if (ctx->tape.nodes[i].output == t || ctx->tape.nodes[i].saved == t) return i;
    return n;
}

static umt_status copy_activation(umt_offload *o, umt_offload_activation *r, bool to_device) {
    char what[64];
    snprintf(what, sizeof what, "activation %d (%s)", (int)(r - o->activations), r->op ? r->op : "?");
    void *dst = to_device ? r->tensor->data : r->home;
    const void *src = to_device ? r->home : r->tensor->data;
    UMT_TRY(umt_offload_copy(o, dst, src, r->bytes, to_device, what));
    if (to_device) o->stats.activation_bytes_to_device += r->bytes;
    else o->stats.activation_bytes_to_host += r->bytes;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Forward: out after their use */

static bool has_view(const umt_context *ctx, const umt_offload_activation *r) {
    for (const umt_tensor *v = ctx->step_tensors; v; v = v->next) {
        const char *p = v->data;
        if (!v->owns_storage && p >= (const char *)r->arena && p < (const char *)r->arena + r->bytes) return true;
    }
    return false;
}

/* The copy out of r is older than one op's compute: the arena bytes are given up. */
static umt_status give_up_arena(umt_offload *o, umt_offload_activation *r) {
    UMT_TRY(umt_offload_wait(o->compute, r->left));
    if (has_view(o->ctx, r)) {
        r->state = UMT_ACTIVATION_RESIDENT;
        return UMT_OK;
    }
    umt_memory_end_of_life(&o->ctx->memory, UMT_POOL_ACTIVATIONS, r->tensor->arena_slot);
    r->tensor->data = r->home;
    r->state = UMT_ACTIVATION_AWAY;
    o->stats.activations_offloaded++;
    return UMT_OK;
}

static umt_status send(umt_offload *o, umt_tensor *t, int node, const char *op) {
    umt_context *ctx = o->ctx;
    int index = o->activation_count;
    umt_offload_activation *r = NULL;
    UMT_TRY(next_record(o, &r));
    /* The first step sends every one and sizes the pinned copies to the largest use: its first
     * micro-batch's (they are split larger first); a shorter one (the last micro-batch, an
     * epoch's last step) fits the same copy. Later steps follow the plan. */
    bool sending = o->activations_planned ? r->offload && t->bytes <= r->capacity : true;
    if (!o->activations_planned && (!r->home || r->capacity < t->bytes)) {
        if (r->home) umt_memory_free(&ctx->memory, UMT_POOL_OFFLOAD, r->home);
        r->home = NULL;
        UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_OFFLOAD, t->bytes, &r->home));
        r->capacity = t->bytes;
    }
    r->bytes = t->bytes;
    if (!o->activations_planned) r->offload = true;
    r->tensor = t;
    r->arena = t->data;
    r->op = op;
    r->group = node;
    r->first_node = first_reader(ctx, t, node);
    r->state = UMT_ACTIVATION_RESIDENT;
    if (!sending) return UMT_OK;
    UMT_TRY(umt_offload_record(r->left, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_out, r->left));
    UMT_TRY(copy_activation(o, r, false));
    UMT_TRY(umt_offload_record(r->left, o->copy_out));
    r->state = UMT_ACTIVATION_LEAVING;
    if (o->activation_pending >= 0) UMT_TRY(give_up_arena(o, &o->activations[o->activation_pending]));
    o->activation_pending = index;
    return UMT_OK;
}

/* A forward begins: the last one's records are free for this one's activations. */
static umt_status next_forward(umt_offload *o) {
    /* A forward without backward: its last copy out must be done before the bytes are reused. */
    if (o->activation_pending >= 0) UMT_TRY(umt_offload_wait(o->compute, o->activations[o->activation_pending].left));
    o->activation_count = 0;
    o->activation_pending = -1;
    o->in_backward = false;
    return UMT_OK;
}

umt_status umt_offload_activations_recorded(umt_offload *o, int n) {
    umt_context *ctx = o->ctx;
    if (!o->options.activations || !o->planned) return UMT_OK;
    /* The tape's first node after a backward: the next micro-batch's forward (umt_micro_batch_begin
     * cleared the tape and freed the last one's activations, within the same step). */
    if (o->in_backward && n == 0) UMT_TRY(next_forward(o));
    if (o->in_backward) return UMT_OK;
    const umt_node *node = &ctx->tape.nodes[n];
    umt_tensor *read[UMT_MAX_INPUTS + 1] = {node->inputs[0], node->inputs[1], node->inputs[2], node->saved};
    for (int i = 0; i < UMT_MAX_INPUTS + 1; ++i)
        if (is_candidate(read[i]) && !record_of(o, read[i])) UMT_TRY(send(o, read[i], n, node->op));
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Backward: back one op ahead */

static umt_status bring_back(umt_offload *o, umt_offload_activation *r) {
    void *buffer = NULL;
    UMT_TRY(umt_memory_alloc_slot(&o->ctx->memory, UMT_POOL_ACTIVATIONS, r->bytes, &buffer, &r->buffer_slot));
    /* The buffer may be bytes whose life ended: their last use is queued on compute before now. */
    UMT_TRY(umt_offload_record(r->loaded, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_in, r->loaded));
    r->tensor->data = buffer;
    UMT_TRY(copy_activation(o, r, true));
    UMT_TRY(umt_offload_record(r->loaded, o->copy_in));
    r->state = UMT_ACTIVATION_BACK;
    return UMT_OK;
}

/* Brings back node n's activations that are away; true in *any if there were some. */
static umt_status bring_back_node(umt_offload *o, int n, bool *any) {
    const umt_node *node = &o->ctx->tape.nodes[n];
    umt_tensor *touched[UMT_MAX_INPUTS + 2] = {node->inputs[0], node->inputs[1], node->inputs[2], node->saved,
                                               node->output};
    *any = false;
    for (int i = 0; i < UMT_MAX_INPUTS + 2; ++i) {
        umt_offload_activation *r = touched[i] ? record_of(o, touched[i]) : NULL;
        if (!r || r->state != UMT_ACTIVATION_AWAY) continue;
        UMT_TRY(bring_back(o, r));
        *any = true;
    }
    return UMT_OK;
}

/* The forward pass is over: the last activation sent keeps its arena bytes (it is needed first). */
static umt_status backward_starts(umt_offload *o) {
    o->in_backward = true;
    if (o->activation_pending < 0) return UMT_OK;
    umt_offload_activation *r = &o->activations[o->activation_pending];
    /* Its copy out must be done before the next step reuses the bytes. */
    UMT_TRY(umt_offload_wait(o->compute, r->left));
    r->state = UMT_ACTIVATION_RESIDENT;
    o->activation_pending = -1;
    return UMT_OK;
}

umt_status umt_offload_activations_before_backward(umt_offload *o, int n) {
    umt_context *ctx = o->ctx;
    if (!o->options.activations || !o->activation_count) return UMT_OK;
    if (!o->in_backward) UMT_TRY(backward_starts(o));
    bool any;
    UMT_TRY(bring_back_node(o, n, &any));
    const umt_node *node = &ctx->tape.nodes[n];
    umt_tensor *touched[UMT_MAX_INPUTS + 2] = {node->inputs[0], node->inputs[1], node->inputs[2], node->saved,
                                               node->output};
    for (int i = 0; i < UMT_MAX_INPUTS + 2; ++i) {
        umt_offload_activation *r = touched[i] ? record_of(o, touched[i]) : NULL;
        if (r && r->state == UMT_ACTIVATION_BACK) UMT_TRY(umt_offload_wait(o->compute, r->loaded));
    }
    /* One op ahead: the next op down the tape that has activations away. */
    for (int m = n - 1, found = 0; m >= 0 && !found; --m) {
        bool some;
        UMT_TRY(bring_back_node(o, m, &some));
        found = some;
    }
    return UMT_OK;
}

umt_status umt_offload_activations_after_backward(umt_offload *o, int n) {
    umt_context *ctx = o->ctx;
    if (!o->options.activations) return UMT_OK;
    for (int i = 0; i < o->activation_count; ++i) {
        umt_offload_activation *r = &o->activations[i];
        if (r->first_node != n || r->state != UMT_ACTIVATION_BACK) continue;
        /* Nothing reads it again this step: the buffer's bytes are free for what comes next. */
        umt_memory_end_of_life(&ctx->memory, UMT_POOL_ACTIVATIONS, r->buffer_slot);
        r->tensor->data = r->home;
        r->state = UMT_ACTIVATION_AWAY;
    }
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Stage 3, on the first step's activations */

static umt_status plan_activations(umt_offload *o) {
    umt_context *ctx = o->ctx;
    int n = o->activation_count;
    umt_plan_item *items = calloc((size_t)n, sizeof *items);
    if (!items) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to plan %d activations", n);
    for (int i = 0; i < n; ++i) {
        const umt_offload_activation *r = &o->activations[i];
        items[i] = (umt_plan_item){r->op, UMT_POOL_ACTIVATIONS, r->group, r->capacity, false, 0};
    }
    /* Fixed: what the GPU holds now, the arena counted at the first step's peak rather than its
     * plan's, because keeping any activation means recording the second step afresh, and a
     * recorded step places its tensors less tightly than a plan (first fit, no merging of freed
     * ranges, growth by blocks): around the kept ones, the rest of the step may need more than
     * the first step's arena (the deep CNN of tests/gpu/test_cuda_plan_offload.c was refused in
     * its second step with only the planner's buffers as the margin). So the recorded peak is
     * counted twice: once as the arena, once as the margin for that. The planner's two activation
     * buffers (the largest layer's, twice) come on top. */
    umt_pool_stats arena;
    umt_memory_stats(&ctx->memory, UMT_POOL_ACTIVATIONS, &arena);
    size_t recorded = arena.peak_bytes > arena.capacity_bytes ? arena.peak_bytes : arena.capacity_bytes;
    size_t fixed = ctx->memory.device_bytes - arena.capacity_bytes + 2 * recorded;
    umt_placement_plan plan;
    umt_status st = umt_plan_placement(items, n, ctx->memory.budget_bytes, fixed, false, &plan);
    fprintf(stderr, "placement plan: the first step saved %d activations for backward; stage 3 on them:\n", n);
    if (st == UMT_OK) umt_plan_print(stderr, items, n, &plan);
    bool any_kept = false;
    for (int i = 0; i < n; ++i) {
        /* A plan that does not fit keeps every one away, as the first step did (which fitted). */
        o->activations[i].offload = st != UMT_OK || items[i].offloaded;
        any_kept |= !o->activations[i].offload;
    }
    if (st != UMT_OK) fprintf(stderr, "placement plan: %s; every saved activation stays offloaded\n", umt_last_error());
    free(items);
    /* The arena's plan was made from the first step; a different choice allocates differently. */
    if (any_kept) umt_memory_rerecord(&ctx->memory, UMT_POOL_ACTIVATIONS);
    o->activations_planned = true;
    return UMT_OK;
}

umt_status umt_offload_activations_step_begin(umt_offload *o) {
    if (!o->options.activations) return UMT_OK;
    if (!o->activations_planned && o->in_backward && o->activation_count) UMT_TRY(plan_activations(o));
    return next_forward(o);
}

void umt_offload_activations_destroy(umt_offload *o) {
    for (int i = 0; i < o->activation_events; ++i) {
        cudaEventDestroy((cudaEvent_t)o->activations[i].left);
        cudaEventDestroy((cudaEvent_t)o->activations[i].loaded);
    }
    free(o->activations); /* the pinned copies belong to the offload pool */
    o->activations = NULL;
}
