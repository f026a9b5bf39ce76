/*
 * core/offload.c — the offload tier at run time: the plan applied at the first step, the double
 * buffer, and streaming in forward and backward (core/offload.h tells the story; the update is
 * in core/offload_update.c).
 */
#include "core/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/context.h"
#include "core/error.h"
#include "core/offload_state.h"
#include "core/optim.h"
#include "core/tensor.h"
#include "memory/trace.h"

#ifdef UMT_WITH_CUDA
#include "core/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

double umt_offload_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_streamed_kind(umt_pool pool) {
    return pool == UMT_POOL_WEIGHTS || pool == UMT_POOL_GRADS || pool == UMT_POOL_OPTIM;
}

umt_pool umt_offload_initial_pool(const umt_context *ctx, umt_pool pool) {
    bool waiting = ctx->offload && !ctx->offload->planned;
    return waiting && is_streamed_kind(pool) ? UMT_POOL_OFFLOAD : pool;
}

umt_status umt_offload_stats_get(const umt_context *ctx, umt_offload_stats *out) {
    if (!ctx || !out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_stats_get: NULL argument");
    *out = ctx->offload ? ctx->offload->stats : (umt_offload_stats){0};
    return UMT_OK;
}

static const char *const optimizer_names[] = {"auto", "gpu", "cpu", "backward"};

const char *umt_offload_optimizer_name(umt_offload_optimizer where) {
    return (unsigned)where <= UMT_OFFLOAD_OPTIM_BACKWARD ? optimizer_names[where] : "invalid-offload-optimizer";
}

umt_status umt_offload_optimizer_parse(const char *name, umt_offload_optimizer *out) {
    for (int i = 0; i <= UMT_OFFLOAD_OPTIM_BACKWARD && name; ++i)
        if (!strcmp(name, optimizer_names[i])) return *out = (umt_offload_optimizer)i, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "offload optimizer '%s': expected auto, gpu, cpu or backward", name ? name : "(null)");
}

#ifdef UMT_WITH_CUDA

/* ----------------------------------------------------------------------------------------- */
/* Streams, events, copies */

umt_status umt_offload_wait(void *stream, void *event) {
    UMT_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return UMT_OK;
}

umt_status umt_offload_record(void *event, void *stream) {
    UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    return UMT_OK;
}

umt_status umt_offload_copy(umt_offload *o, void *dst, const void *src, size_t bytes, bool to_device, const char *what) {
    void *stream = to_device ? o->copy_in : o->copy_out;
    umt_trace *trace = o->ctx->memory.trace;
    void *begin = umt_trace_begin(trace, stream);
    UMT_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                 (cudaStream_t)stream));
    umt_trace_end(trace, stream, begin, what, to_device ? "prefetch" : "offload",
                  to_device ? UMT_TRACE_COPY_IN : UMT_TRACE_COPY_OUT, bytes);
    if (to_device) o->stats.bytes_to_device += bytes;
    else o->stats.bytes_to_host += bytes;
    return UMT_OK;
}

static umt_status create_streams(umt_offload *o) {
    UMT_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)&o->copy_in, cudaStreamNonBlocking));
    UMT_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)&o->copy_out, cudaStreamNonBlocking));
    UMT_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)&o->update, cudaStreamNonBlocking));
    UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&o->updated, cudaEventDisableTiming));
    for (int s = 0; s < 2; ++s) {
        umt_offload_slot *slot = &o->slots[s];
        void **events[] = {&slot->loaded, &slot->released, &slot->drained};
        for (int e = 0; e < 3; ++e) UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)events[e], cudaEventDisableTiming));
    }
    return UMT_OK;
}

void umt_offload_destroy(umt_context *ctx) {
    umt_offload *o = ctx->offload;
    if (!o) return;
    /* Errors here leave nothing to undo: they are ignored. */
    void *streams[] = {o->copy_in, o->copy_out, o->update};
    for (int i = 0; i < 3; ++i)
        if (streams[i]) cudaStreamSynchronize((cudaStream_t)streams[i]), cudaStreamDestroy((cudaStream_t)streams[i]);
    for (int s = 0; s < 2; ++s) {
        void *events[] = {o->slots[s].loaded, o->slots[s].released, o->slots[s].drained};
        for (int e = 0; e < 3; ++e)
            if (events[e]) cudaEventDestroy((cudaEvent_t)events[e]);
    }
    if (o->updated) cudaEventDestroy((cudaEvent_t)o->updated);
    umt_offload_activations_destroy(o);
    free(o->uses);
    free(o->cpu_jobs);
    free(o);
    ctx->offload = NULL;
}

/* ----------------------------------------------------------------------------------------- */
/* The plan, applied once at the first step */

/* The parameter a weights, grads or optim tensor belongs to: its index, the plan's group. */
static int group_of(const umt_context *ctx, const umt_tensor *t) {
    const umt_tensor *p = t->kind_pool == UMT_POOL_WEIGHTS ? t : t->owner;
    for (int i = 0; i < ctx->parameter_count; ++i)
        if (ctx->parameters[i] == p) return i;
    return -1 - (int)(((uintptr_t)t >> 4) & 0xffffff); /* no parameter (a buffer): a group of its own */
}

static umt_status collect_items(umt_context *ctx, umt_plan_item **items, umt_tensor ***tensors, int *count) {
    int n = 0;
    for (umt_tensor *t = ctx->run_tensors; t; t = t->next) n += t->pool == UMT_POOL_OFFLOAD && is_streamed_kind(t->kind_pool);
    *items = calloc((size_t)n + 1, sizeof **items);
    *tensors = calloc((size_t)n + 1, sizeof **tensors);
    if (!*items || !*tensors) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload plan: no memory for %d items", n);
    int i = 0;
    for (umt_tensor *t = ctx->run_tensors; t; t = t->next) {
        if (t->pool != UMT_POOL_OFFLOAD || !is_streamed_kind(t->kind_pool)) continue;
        const umt_tensor *p = t->kind_pool == UMT_POOL_WEIGHTS ? t : t->owner;
        (*items)[i] = (umt_plan_item){p && p->name ? p->name : "?", t->kind_pool, group_of(ctx, t), t->bytes, false};
        (*tensors)[i++] = t;
    }
    *count = n;
    return UMT_OK;
}

/* A tensor the plan keeps on the GPU leaves the offload tier for its own pool. */
static umt_status move_to_gpu(umt_context *ctx, umt_tensor *t) {
    void *device = NULL;
    UMT_TRY(umt_memory_alloc(&ctx->memory, t->kind_pool, t->bytes, &device));
    UMT_CUDA_TRY(cudaMemcpy(device, t->data, t->bytes, cudaMemcpyHostToDevice));
    umt_memory_free(&ctx->memory, UMT_POOL_OFFLOAD, t->data);
    t->data = device;
    t->pool = t->kind_pool;
    return UMT_OK;
}

/* Both halves of the double buffer: weights first, the gradient after the largest weights. */
static umt_status make_slots(umt_offload *o, umt_tensor **tensors, const umt_plan_item *items, int count) {
    size_t largest_weights = 0;
    for (int i = 0; i < count; ++i)
        if (items[i].offloaded && items[i].pool == UMT_POOL_WEIGHTS && tensors[i]->bytes > largest_weights)
            largest_weights = tensors[i]->bytes;
    largest_weights = (largest_weights + 255) / 256 * 256;
    o->slot_bytes = o->plan.weight_slot_bytes;
    for (int s = 0; s < 2; ++s) {
        UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_STREAM, o->slot_bytes, &o->slots[s].base));
        o->slots[s].grads = (char *)o->slots[s].base + largest_weights;
    }
    return UMT_OK;
}

static umt_status check_offloadable(const umt_context *ctx, const umt_tensor *t) {
    if (ctx->options.precision != UMT_PRECISION_FP32)
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: %s would be offloaded, but the offload tier streams fp32 only "
                        "(precision %s)", t->owner && t->owner->name ? t->owner->name : t->name ? t->name : "a tensor",
                        umt_precision_name(ctx->options.precision));
    return UMT_OK;
}

static umt_status apply_plan(umt_offload *o, umt_plan_item *items, umt_tensor **tensors, int count) {
    umt_context *ctx = o->ctx;
    bool any = false;
    /* The kernels that zeroed gradients and state in pinned memory must be done before the
     * bytes are moved or streamed. */
    UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->compute));
    for (int i = 0; i < count; ++i) {
        if (items[i].offloaded) {
            UMT_TRY(check_offloadable(ctx, tensors[i]));
            tensors[i]->home = tensors[i]->data;
            o->stats.offloaded_tensors++;
            o->stats.offloaded_bytes += tensors[i]->bytes;
            any = true;
        } else {
            UMT_TRY(move_to_gpu(ctx, tensors[i]));
        }
    }
    return any ? make_slots(o, tensors, items, count) : UMT_OK;
}

static umt_status plan_once(umt_offload *o) {
    umt_context *ctx = o->ctx;
    umt_plan_item *items = NULL;
    umt_tensor **tensors = NULL;
    int count = 0;
    umt_status st = collect_items(ctx, &items, &tensors, &count);
    size_t fixed = ctx->memory.device_bytes + ctx->options.offload_reserve_bytes;
    if (st == UMT_OK) st = umt_plan_placement(items, count, ctx->memory.budget_bytes, fixed, &o->plan);
    if (st == UMT_OK || st == UMT_ERR_BUDGET) umt_plan_print(stderr, items, count, &o->plan);
    /* A plan that does not fit is a refused allocation too: show where the budget went. */
    if (st == UMT_ERR_BUDGET) umt_memory_print_contents(&ctx->memory, stderr);
    /* Planned even on failure: new tensors now go to their own pools, and the refusal stands. */
    o->planned = true;
    if (st == UMT_OK) st = apply_plan(o, items, tensors, count);
    free(items);
    free(tensors);
    o->recording = true;
    return st;
}

umt_status umt_offload_step_begin(umt_context *ctx) {
    umt_offload *o = ctx->offload;
    if (!o) return UMT_OK;
    UMT_TRY(umt_offload_activations_step_begin(o));
    if (!o->planned) return plan_once(o);
    o->next_use = 0;
    o->following = !o->recording;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The double buffer */

static int slot_holding(const umt_offload *o, const umt_tensor *p) {
    for (int s = 0; s < 2; ++s)
        if (o->slots[s].holder == p) return s;
    return -1;
}

/* The slot's gradient goes home on the copy-out stream once queued compute is done with it. */
static umt_status copy_gradient_out(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *g = slot->holder->grad;
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_out, slot->released));
    UMT_TRY(umt_offload_copy(o, g->home, slot->grads, g->bytes, false, slot->holder->name ? slot->holder->name : "gradient"));
    UMT_TRY(umt_offload_record(slot->drained, o->copy_out));
    slot->grads_live = false;
    g->data = g->home;
    slot->holder->grad_zero = false;
    return UMT_OK;
}

umt_status umt_offload_evict(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    if (!slot->holder) return UMT_OK;
    if (slot->grads_live) UMT_TRY(copy_gradient_out(o, s));
    slot->holder->data = slot->holder->home;
    slot->holder = NULL;
    return UMT_OK;
}

/* The gradient part of slot s, for its holder's backward: zeroed, or the running sum brought in. */
static umt_status bring_gradient_in(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *g = slot->holder->grad;
    UMT_TRY(umt_offload_wait(o->copy_in, slot->drained));
    UMT_TRY(umt_offload_wait(o->copy_in, slot->released));
    if (slot->holder->grad_zero)
        UMT_CUDA_TRY(cudaMemsetAsync(slot->grads, 0, g->bytes, (cudaStream_t)o->copy_in));
    else
        UMT_TRY(umt_offload_copy(o, slot->grads, g->home, g->bytes, true, "gradient"));
    UMT_TRY(umt_offload_record(slot->loaded, o->copy_in));
    slot->grads_live = true;
    return UMT_OK;
}

/* Fills slot s with p's weights (and gradient), once queued compute is done with what it held. */
static umt_status load(umt_offload *o, int s, umt_tensor *p, bool for_backward) {
    umt_offload_slot *slot = &o->slots[s];
    UMT_TRY(umt_offload_evict(o, s));
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_in, slot->released));
    UMT_TRY(umt_offload_wait(o->copy_in, slot->drained));
    UMT_TRY(umt_offload_copy(o, slot->base, p->home, p->bytes, true, p->name ? p->name : "weights"));
    UMT_TRY(umt_offload_record(slot->loaded, o->copy_in));
    slot->holder = p;
    return for_backward ? bring_gradient_in(o, s) : UMT_OK;
}

/* Makes the use's parameter resident in a slot (not `avoid`), ready for its use. */
static umt_status make_resident(umt_offload *o, umt_tensor *p, bool for_backward, int avoid, int *slot_out) {
    int s = slot_holding(o, p);
    if (s < 0) {
        s = avoid >= 0 ? 1 - avoid : 1 - o->last_slot;
        UMT_TRY(load(o, s, p, for_backward));
    } else if (for_backward && !o->slots[s].grads_live) {
        UMT_TRY(bring_gradient_in(o, s));
    }
    *slot_out = s;
    return UMT_OK;
}

/* Follows (or, in the first step, records) the order of uses; true when the use was expected. */
static umt_status note_use(umt_offload *o, umt_tensor *p, bool for_backward) {
    if (o->recording) {
        if (o->use_count == o->use_slots) {
            int slots = o->use_slots ? 2 * o->use_slots : 64;
            umt_offload_use *grown = realloc(o->uses, (size_t)slots * sizeof *grown);
            if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to record the order of uses");
            o->uses = grown;
            o->use_slots = slots;
        }
        o->uses[o->use_count++] = (umt_offload_use){p, for_backward};
        return UMT_OK;
    }
    const umt_offload_use *next = o->next_use < o->use_count ? &o->uses[o->next_use] : NULL;
    if (o->following && next && next->parameter == p && next->for_backward == for_backward) o->next_use++;
    else o->following = false; /* this step departs from the first: no more guessing */
    return UMT_OK;
}

umt_status umt_offload_acquire(umt_context *ctx, umt_tensor *p, bool for_backward) {
    umt_offload *o = ctx->offload;
    if (!o || !p || !p->home || !p->is_parameter) return UMT_OK;
    UMT_TRY(note_use(o, p, for_backward));
    int s;
    UMT_TRY(make_resident(o, p, for_backward, -1, &s));
    o->last_slot = s;
    UMT_TRY(umt_offload_wait(o->compute, o->slots[s].loaded));
    p->data = o->slots[s].base;
    if (for_backward) p->grad->data = o->slots[s].grads;
    /* One use ahead: its copy runs while the work just queued computes. */
    if (o->following && o->next_use < o->use_count) {
        const umt_offload_use *next = &o->uses[o->next_use];
        int ignored;
        if (next->parameter != p) UMT_TRY(make_resident(o, next->parameter, next->for_backward, s, &ignored));
    }
    return UMT_OK;
}

umt_status umt_offload_before_backward(umt_context *ctx, const umt_node *node) {
    UMT_TRY(umt_offload_activations_before_backward(ctx, (int)(node - ctx->tape.nodes)));
    int offloaded = 0;
    for (int i = 0; i < node->input_count; ++i) offloaded += node->inputs[i]->is_parameter && node->inputs[i]->home != NULL;
    /* Two would share the double buffer with the prefetch, which could evict one mid-op. */
    if (offloaded > 1)
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: %s reads %d offloaded parameters (the offload tier streams one "
                        "per op)", node->op, offloaded);
    for (int i = 0; offloaded && i < node->input_count; ++i)
        if (node->inputs[i]->is_parameter && node->inputs[i]->requires_grad)
            UMT_TRY(umt_offload_acquire(ctx, node->inputs[i], true));
    return UMT_OK;
}

/* UMT_OFFLOAD_OPTIM_BACKWARD: the update runs on the slot's weights and gradient, reading and
 * writing the optimizer state where it lives (pinned memory is addressable from the GPU), and
 * only the updated weights go home; the slot keeps them, still valid for the next forward. The
 * kernel waits on the PCIe link for the state, so it runs on its own stream: the compute stream
 * goes on with the next layer's backward meanwhile. */
static umt_status update_in_slot(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *p = slot->holder;
    umt_trace *trace = o->ctx->memory.trace;
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    UMT_TRY(umt_offload_wait(o->update, slot->released));
    void *begin = umt_trace_begin(trace, o->update);
    uint64_t state_bytes = 0;
    cudaStream_t previous = umt_cuda_launch_on((cudaStream_t)o->update);
    umt_status st = umt_optimizer_update_one(o->attached, p, slot->base, slot->grads, &state_bytes);
    umt_cuda_launch_on(previous);
    UMT_TRY(st);
    umt_trace_end(trace, o->update, begin, p->name ? p->name : "update", "optimizer", UMT_TRACE_UPDATE, state_bytes);
    /* The kernel read and wrote the offloaded state over the link: as many bytes each way. */
    o->stats.bytes_to_device += state_bytes;
    o->stats.bytes_to_host += state_bytes;
    UMT_TRY(umt_offload_record(o->updated, o->update));
    UMT_TRY(umt_offload_wait(o->copy_out, o->updated));
    UMT_TRY(umt_offload_copy(o, p->home, slot->base, p->bytes, false, p->name ? p->name : "weights"));
    UMT_TRY(umt_offload_record(slot->drained, o->copy_out));
    slot->grads_live = false;
    p->grad->data = p->grad->home;
    p->grad_zero = true; /* consumed by the update */
    p->updated_early = true;
    return UMT_OK;
}

umt_status umt_offload_gradient_ready(umt_context *ctx, umt_tensor *p) {
    umt_offload *o = ctx->offload;
    if (!o || !p->home) return UMT_OK;
    int s = slot_holding(o, p);
    if (s < 0 || !o->slots[s].grads_live) return UMT_OK;
    if (o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD && o->attached) return update_in_slot(o, s);
    return copy_gradient_out(o, s);
}

void umt_offload_attach_optimizer(umt_context *ctx, const umt_optimizer *opt, bool attach) {
    umt_offload *o = ctx->offload;
    if (!o) return;
    if (attach) o->attached = opt;
    else if (o->attached == opt) o->attached = NULL;
}

umt_status umt_offload_backward_done(umt_context *ctx) {
    umt_offload *o = ctx->offload;
    if (!o || !o->copy_out) return UMT_OK;
    for (int s = 0; s < 2; ++s) UMT_TRY(umt_offload_wait(o->compute, o->slots[s].drained));
    return UMT_OK;
}

bool umt_offload_zero_grad(umt_context *ctx, umt_tensor *p) {
    umt_offload *o = ctx->offload;
    if (!o || !p->home) return false;
    p->grad_zero = true;
    int s = slot_holding(o, p);
    /* A gradient still being summed in a slot restarts from zero there too. */
    if (s >= 0 && o->slots[s].grads_live) cudaMemsetAsync(o->slots[s].grads, 0, p->grad->bytes, (cudaStream_t)o->compute);
    return true;
}

umt_status umt_offload_create(umt_context *ctx) {
    if (!ctx->options.offload || ctx->options.device != UMT_DEVICE_CUDA) return UMT_OK;
    umt_offload *o = calloc(1, sizeof *o);
    if (!o) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for its state");
    o->ctx = ctx;
    o->compute = ctx->memory.stream;
    o->optimizer = ctx->options.offload_optimizer;
    o->stats.optimizer = o->optimizer;
    o->activation_pending = -1;
    ctx->offload = o;
    /* Saved activations use the copy streams even when every parameter stays on the GPU. */
    if (ctx->options.offload_activations) umt_memory_set_recycle(&ctx->memory, UMT_POOL_ACTIVATIONS, true);
    return create_streams(o);
}

#else /* no CUDA: the offload tier is never created, every hook is a no-op */

void umt_offload_attach_optimizer(umt_context *ctx, const umt_optimizer *opt, bool attach) {
    (void)ctx, (void)opt, (void)attach;
}

umt_status umt_offload_create(umt_context *ctx) {
    (void)ctx;
    return UMT_OK;
}
void umt_offload_destroy(umt_context *ctx) { (void)ctx; }
umt_status umt_offload_step_begin(umt_context *ctx) {
    (void)ctx;
    return UMT_OK;
}
umt_status umt_offload_acquire(umt_context *ctx, umt_tensor *p, bool for_backward) {
    (void)ctx, (void)p, (void)for_backward;
    return UMT_OK;
}
umt_status umt_offload_before_backward(umt_context *ctx, const umt_node *node) {
    (void)ctx, (void)node;
    return UMT_OK;
}
umt_status umt_offload_gradient_ready(umt_context *ctx, umt_tensor *p) {
    (void)ctx, (void)p;
    return UMT_OK;
}
umt_status umt_offload_backward_done(umt_context *ctx) {
    (void)ctx;
    return UMT_OK;
}
bool umt_offload_zero_grad(umt_context *ctx, umt_tensor *p) {
    (void)ctx, (void)p;
    return false;
}

#endif
