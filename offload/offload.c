/*
 * offload/offload.c — the offload tier at run time: the plan applied at the first step, the double
 * buffer, and streaming in forward and backward (offload/offload.h tells the story; the update is
 * in offload/update.c).
 */
#include "offload/offload.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "memory/trace.h"
#include "offload/state.h"

#include "core/base/cuda_check.h"

double umt_offload_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_streamed_kind(umt_pool pool) {
    return pool == UMT_POOL_WEIGHTS || pool == UMT_POOL_GRADS || pool == UMT_POOL_OPTIM;
}

umt_pool umt_offload_place(const umt_offload *o, umt_pool pool) {
    return !o->planned && is_streamed_kind(pool) ? UMT_POOL_OFFLOAD : pool;
}

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

/* A copy engine serves the copies of one direction one whole copy at a time, whatever their
 * streams: a 256 MiB weight copy would hold the state copies of the update ring back for
 * milliseconds. Copies go in pieces of this size, so that streams take turns. */
#define COPY_PIECE_BYTES ((size_t)16 << 20)

umt_status umt_offload_copy_on(umt_offload *o, void *stream, int track, void *dst, const void *src, size_t bytes,
                               bool to_device, const char *what) {
    umt_trace *trace = o->ctx->memory.trace;
    void *begin = umt_trace_begin(trace, stream);
    for (size_t done = 0; done < bytes; done += COPY_PIECE_BYTES)
        UMT_CUDA_TRY(cudaMemcpyAsync((char *)dst + done, (const char *)src + done,
                                     bytes - done < COPY_PIECE_BYTES ? bytes - done : COPY_PIECE_BYTES,
                                     to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, (cudaStream_t)stream));
    umt_trace_end(trace, stream, begin, what, to_device ? "prefetch" : "offload", track, bytes);
    if (to_device) o->stats.bytes_to_device += bytes;
    else o->stats.bytes_to_host += bytes;
    return UMT_OK;
}

umt_status umt_offload_copy(umt_offload *o, void *dst, const void *src, size_t bytes, bool to_device, const char *what) {
    return to_device ? umt_offload_copy_on(o, o->copy_in, UMT_TRACE_COPY_IN, dst, src, bytes, true, what)
                     : umt_offload_copy_on(o, o->copy_out, UMT_TRACE_COPY_OUT, dst, src, bytes, false, what);
}

static umt_status create_events(void **events[], int count) {
    for (int e = 0; e < count; ++e) UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)events[e], cudaEventDisableTiming));
    return UMT_OK;
}

static umt_status create_streams(umt_offload *o) {
    void **streams[] = {&o->copy_in, &o->copy_out, &o->state_in};
    for (int i = 0; i < 3; ++i) UMT_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)streams[i], cudaStreamNonBlocking));
    /* The updates in backward are short kernels that free ring entries for the link: at the
     * highest priority they take SMs as soon as backward's long kernels free any. */
    int least, greatest;
    UMT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    UMT_CUDA_TRY(cudaStreamCreateWithPriority((cudaStream_t *)&o->update, cudaStreamNonBlocking, greatest));
    UMT_TRY(create_events((void **[]){&o->updated, &o->homed, &o->gradient_final, &o->update_ready}, 4));
    for (int s = 0; s < 2; ++s) {
        umt_offload_slot *slot = &o->slots[s];
        UMT_TRY(create_events((void **[]){&slot->loaded, &slot->released, &slot->drained}, 3));
    }
    for (int e = 0; e < UMT_OFFLOAD_RING_MAX_ENTRIES; ++e) {
        umt_offload_ring_entry *r = &o->ring[e];
        UMT_TRY(create_events((void **[]){&r->loaded, &r->released, &r->drained}, 3));
    }
    return UMT_OK;
}

static void destroy_events(void *const events[], int count) {
    for (int e = 0; e < count; ++e)
        if (events[e]) cudaEventDestroy((cudaEvent_t)events[e]);
}

void umt_offload_destroy(umt_offload *o) {
    if (!o) return;
    /* Errors here leave nothing to undo: they are ignored. The CPU's threads end first: their
     * jobs wait for pieces from the copy-out stream, and the streams' waits for their counts. */
    umt_offload_queue_stop(o);
    void *streams[] = {o->copy_in, o->copy_out, o->update, o->state_in};
    for (int i = 0; i < 4; ++i)
        if (streams[i]) cudaStreamSynchronize((cudaStream_t)streams[i]), cudaStreamDestroy((cudaStream_t)streams[i]);
    for (int s = 0; s < 2; ++s) destroy_events((void *[]){o->slots[s].loaded, o->slots[s].released, o->slots[s].drained}, 3);
    for (int e = 0; e < UMT_OFFLOAD_RING_MAX_ENTRIES; ++e)
        destroy_events((void *[]){o->ring[e].loaded, o->ring[e].released, o->ring[e].drained}, 3);
    destroy_events((void *[]){o->updated, o->homed, o->gradient_final, o->update_ready}, 4);
    umt_offload_activations_destroy(o);
    umt_offload_host_destroy(o);
    free(o->uses);
    free(o->finals);
    free(o->cpu_jobs);
    free(o);
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
        umt_dtype compute = umt_compute_dtype(ctx);
        (*items)[i] = (umt_plan_item){p && p->name ? p->name : "?", t->kind_pool, group_of(ctx, t),
                                      umt_offload_plan_bytes(compute, t), false,
                                      umt_compute_copy_bytes(compute, t)}; /* a slot holds the copy alone */
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

/* Both halves of the double buffer: weights (or their compute copy) first, the gradient after the
 * largest. */
static umt_status make_slots(umt_offload *o, umt_tensor **tensors, const umt_plan_item *items, int count) {
    size_t largest_weights = 0, largest_grads = 0;
    bool copies = false;
    for (int i = 0; i < count; ++i) {
        if (!items[i].offloaded || items[i].pool != UMT_POOL_WEIGHTS) continue;
        const umt_tensor *streamed = umt_offload_streamed(tensors[i]);
        copies |= streamed != tensors[i];
        if (streamed->bytes > largest_weights) largest_weights = streamed->bytes;
        if (tensors[i]->grad && tensors[i]->grad->bytes > largest_grads) largest_grads = tensors[i]->grad->bytes;
    }
    largest_weights = (largest_weights + 255) / 256 * 256;
    o->slot_bytes = o->plan.weight_slot_bytes;
    /* The plan counted a streamed weight's compute copy alone (umt_plan_item.stream_bytes), in its
     * pool's alignment: a slot needs no more than the copy and the gradient. */
    size_t needed = largest_weights + (largest_grads + 255) / 256 * 256;
    if (needed < UMT_OFFLOAD_MIN_SLOT_BYTES) needed = UMT_OFFLOAD_MIN_SLOT_BYTES;
    if (copies && needed < o->slot_bytes) o->slot_bytes = needed;
    for (int s = 0; s < 2; ++s) {
        UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_STREAM, o->slot_bytes, &o->slots[s].base));
        o->slots[s].grads = (char *)o->slots[s].base + largest_weights;
    }
    return o->plan.ring_bytes ? umt_offload_make_ring(o) : UMT_OK;
}

static umt_status apply_plan(umt_offload *o, umt_plan_item *items, umt_tensor **tensors, int count) {
    umt_context *ctx = o->ctx;
    bool any = false;
    /* The kernels that zeroed gradients and state in pinned memory must be done before the
     * bytes are moved or streamed. */
    UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->compute));
    for (int i = 0; i < count; ++i) {
        if (items[i].offloaded) {
            tensors[i]->offload.home = tensors[i]->data;
            o->stats.offloaded_tensors++;
            o->stats.offloaded_bytes += tensors[i]->bytes;
            any = true;
        } else {
            UMT_TRY(move_to_gpu(ctx, tensors[i]));
        }
    }
    /* Under bf16/fp16 an offloaded weight streams its compute copy, made home now (before the
     * first forward, which would otherwise make it in the weights pool). */
    for (int i = 0; i < count; ++i)
        if (items[i].offloaded && items[i].pool == UMT_POOL_WEIGHTS)
            UMT_TRY(umt_offload_make_compute_copy(o, tensors[i]));
    return any ? make_slots(o, tensors, items, count) : UMT_OK;
}

/* The placement, with the update ring when updates run in backward. Where the budget cannot hold
 * the ring beside the streamed parameters, updates run after backward instead (auto: the GPU and
 * the CPU timed, the faster kept), as they do when the optimizer needs every gradient first: the
 * run trains, and says why once. */
static umt_status plan_updates(umt_offload *o, umt_plan_item *items, int count, size_t fixed) {
    size_t budget = o->ctx->memory.budget_bytes;
    bool in_backward = o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD;
    umt_status st = umt_plan_placement(items, count, budget, fixed, in_backward, &o->plan);
    if (st != UMT_ERR_BUDGET || !in_backward) return st;
    st = umt_plan_placement(items, count, budget, fixed, false, &o->plan);
    if (st != UMT_OK) return st;
    fprintf(stderr, "offload: the device budget (%zu bytes) cannot hold the update ring beside the streamed "
            "parameters: offloaded parameters are updated after backward instead (update mode auto: the gpu and the "
            "cpu timed, the faster kept)\n", budget);
    o->optimizer = o->stats.optimizer = UMT_OFFLOAD_OPTIM_AUTO;
    return UMT_OK;
}

static umt_status plan_once(umt_offload *o) {
    umt_context *ctx = o->ctx;
    umt_plan_item *items = NULL;
    umt_tensor **tensors = NULL;
    int count = 0;
    umt_status st = collect_items(ctx, &items, &tensors, &count);
    size_t fixed = ctx->memory.device_bytes + o->options.reserve_bytes;
    if (st == UMT_OK) st = plan_updates(o, items, count, fixed);
    /* What the plan leaves deepens the update ring, unless saved activations may stay on the GPU
     * (the planner's stage 3, after the first step): they use it then. */
    if (st == UMT_OK && !o->options.activations) umt_plan_deepen_ring(&o->plan);
    if (st == UMT_OK || st == UMT_ERR_BUDGET) umt_plan_print(stderr, items, count, &o->plan);
    if (st == UMT_OK) st = umt_offload_host_plan(o, items, tensors, count);
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

umt_status umt_offload_step_begin(umt_offload *o) {
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

/* Elements from src in slot s to dst home, `element` bytes each, on the copy-out stream once
 * queued compute is done with the slot; with a job, in its pieces, each one's arrival written after it.
 * The slot's gradient is no longer live, and the gradient tensor points home. */
static umt_status send_home(umt_offload *o, int s, void *dst, const void *src, size_t element,
                            umt_offload_host_job *job) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *p = slot->holder;
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_out, slot->released));
    for (int k = 0; k < (job ? job->pieces : 1); ++k) {
        int64_t first = 0, n = job ? umt_offload_piece(job, k, p->numel, &first) : p->numel;
        UMT_TRY(umt_offload_copy(o, (char *)dst + first * element, (const char *)src + first * element,
                                 (size_t)n * element, false, p->name ? p->name : "gradient"));
        if (job) UMT_TRY(umt_offload_queue_piece_home(o, job));
    }
    UMT_TRY(umt_offload_record(slot->drained, o->copy_out));
    slot->grads_live = false;
    p->grad->data = p->grad->offload.home;
    return UMT_OK;
}

/* The slot's gradient goes home on the copy-out stream once queued compute is done with it. */
umt_status umt_offload_gradient_out(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *g = slot->holder->grad;
    UMT_TRY(send_home(o, s, g->offload.home, slot->grads, sizeof(float), NULL));
    slot->holder->offload.grad_zero = false;
    return UMT_OK;
}

umt_status umt_offload_gradient_out_pieces(umt_offload *o, int s, umt_offload_host_job *job, bool bf16) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *p = slot->holder;
    /* The caller marks the gradient as consumed by the update (grad_zero) */
    if (!bf16) return send_home(o, s, p->grad->offload.home, slot->grads, sizeof(float), job);
    /* The slot's weights part holds p's old compute copy, bf16 like the rounded gradient and as
     * long: the gradient goes there, since the caller gives the weights up next (evict). The f32
     * gradient home is not rewritten: the update consumes the bf16 one. */
    UMT_TRY(umt_kernels(o->ctx)->f32.convert(slot->grads, UMT_F32, slot->base, UMT_BF16, p->numel));
    return send_home(o, s, job->grad_bf16, slot->base, sizeof *job->grad_bf16, job);
}

umt_status umt_offload_evict(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    UMT_TRY(umt_offload_deferred_piece(o, SIZE_MAX));
    if (!slot->holder) return UMT_OK;
    if (slot->grads_live) UMT_TRY(umt_offload_gradient_out(o, s));
    umt_tensor *weights = umt_offload_streamed(slot->holder);
    weights->data = weights->offload.home;
    slot->holder = NULL;
    return UMT_OK;
}

/* The gradient part of slot s, for its holder's backward: zeroed, or the running sum brought in. */
static umt_status bring_gradient_in(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *g = slot->holder->grad;
    UMT_TRY(umt_offload_wait(o->copy_in, slot->drained));
    UMT_TRY(umt_offload_wait(o->copy_in, slot->released));
    if (slot->holder->offload.grad_zero)
        UMT_CUDA_TRY(cudaMemsetAsync(slot->grads, 0, g->bytes, (cudaStream_t)o->copy_in));
    else
        UMT_TRY(umt_offload_copy(o, slot->grads, g->offload.home, g->bytes, true, "gradient"));
    UMT_TRY(umt_offload_record(slot->loaded, o->copy_in));
    slot->grads_live = true;
    return UMT_OK;
}

/* Backward's prefetched weights are put off when the update ring's chunks can carry them in (see
 * umt_offload_deferred in offload/state.h): the gradient part is made ready now. Weights
 * for the use at hand are needed before any chunk. */
static bool defer(const umt_offload *o, bool for_backward, bool ahead) {
    return ahead && for_backward && o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD && o->attached && o->ring_arrays;
}

/* Fills slot s with p's weights (and gradient), once queued compute is done with what it held;
 * ahead: for a later use than the one at hand. */
static umt_status load(umt_offload *o, int s, umt_tensor *p, bool for_backward, bool ahead) {
    umt_offload_slot *slot = &o->slots[s];
    UMT_TRY(umt_offload_evict(o, s));
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    if (defer(o, for_backward, ahead)) {
        slot->holder = p;
        UMT_TRY(bring_gradient_in(o, s));
        o->deferred = (umt_offload_deferred){p, s, 0};
        return UMT_OK;
    }
    UMT_TRY(umt_offload_wait(o->copy_in, slot->released));
    UMT_TRY(umt_offload_wait(o->copy_in, slot->drained));
    UMT_TRY(umt_offload_host_copy_in(o, p, slot->base)); /* piece by piece after a CPU update */
    UMT_TRY(umt_offload_record(slot->loaded, o->copy_in));
    slot->holder = p;
    return for_backward ? bring_gradient_in(o, s) : UMT_OK;
}

/* Makes the use's parameter resident in a slot, ready for its use; avoid >= 0: a prefetch, for
 * the use after the one whose parameter is in slot avoid. */
static umt_status make_resident(umt_offload *o, umt_tensor *p, bool for_backward, int avoid, int *slot_out) {
    int s = slot_holding(o, p);
    if (s < 0) {
        s = avoid >= 0 ? 1 - avoid : 1 - o->last_slot;
        UMT_TRY(load(o, s, p, for_backward, avoid >= 0));
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

/* The rest of a put-off weight load, on the state-in stream; the slot is loaded after it. */
umt_status umt_offload_deferred_piece(umt_offload *o, size_t bytes) {
    umt_offload_deferred *d = &o->deferred;
    umt_tensor *p = d->parameter;
    if (!p) return UMT_OK;
    umt_offload_slot *slot = &o->slots[d->slot];
    /* The gradient part's copy in, queued at the load, waited for the slot to be free. */
    if (d->done == 0) {
        UMT_TRY(umt_offload_wait(o->state_in, slot->loaded));
        UMT_TRY(umt_offload_host_wait(o, o->state_in, p));
    }
    const umt_tensor *weights = umt_offload_streamed(p);
    size_t n = weights->bytes - d->done < bytes ? weights->bytes - d->done : bytes;
    UMT_TRY(umt_offload_copy_on(o, o->state_in, UMT_TRACE_STATE_IN, (char *)slot->base + d->done,
                                (const char *)weights->offload.home + d->done, n, true, p->name ? p->name : "weights"));
    d->done += n;
    if (d->done < weights->bytes) return UMT_OK;
    d->parameter = NULL;
    return umt_offload_record(slot->loaded, o->state_in);
}

umt_status umt_offload_acquire(umt_offload *o, umt_tensor *p, bool for_backward) {
    if (!p || !p->offload.home || !p->is_parameter) return UMT_OK;
    UMT_TRY(umt_offload_deferred_piece(o, SIZE_MAX));
    UMT_TRY(umt_offload_refresh_compute_copy(o, p));
    UMT_TRY(note_use(o, p, for_backward));
    int s;
    UMT_TRY(make_resident(o, p, for_backward, -1, &s));
    o->last_slot = s;
    UMT_TRY(umt_offload_wait(o->compute, o->slots[s].loaded));
    umt_offload_streamed(p)->data = o->slots[s].base;
    if (for_backward) p->grad->data = o->slots[s].grads;
    /* One use ahead: its copy runs while the work just queued computes. */
    if (o->following && o->next_use < o->use_count) {
        const umt_offload_use *next = &o->uses[o->next_use];
        int ignored;
        if (next->parameter != p) UMT_TRY(make_resident(o, next->parameter, next->for_backward, s, &ignored));
    }
    return UMT_OK;
}

umt_status umt_offload_before_backward(umt_offload *o, const umt_node *node) {
    UMT_TRY(umt_offload_activations_before_backward(o, (int)(node - o->ctx->tape.nodes)));
    int offloaded = 0;
    for (int i = 0; i < node->input_count; ++i) offloaded += node->inputs[i]->is_parameter && node->inputs[i]->offload.home != NULL;
    /* Two would share the double buffer with the prefetch, which could evict one mid-op. */
    if (offloaded > 1)
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: %s reads %d offloaded parameters (the offload tier streams one "
                        "per op)", node->op, offloaded);
    for (int i = 0; offloaded && i < node->input_count; ++i)
        if (node->inputs[i]->is_parameter && node->inputs[i]->requires_grad)
            UMT_TRY(umt_offload_acquire(o, node->inputs[i], true));
    return UMT_OK;
}

umt_status umt_offload_gradient_ready(umt_offload *o, umt_tensor *p) {
    if (o->final_count == o->final_slots) {
        int slots = o->final_slots ? 2 * o->final_slots : 16;
        umt_tensor **grown = realloc(o->finals, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to note %d final gradients", slots);
        o->finals = grown;
        o->final_slots = slots;
    }
    o->finals[o->final_count++] = p;
    return UMT_OK;
}

/* p's gradient is final and every hook table has queued its work on it (a gradient hook, data
 * parallelism's all-reduce, runs where the gradient is: in the slot, before it leaves). */
static umt_status gradient_final(umt_offload *o, umt_tensor *p) {
    bool in_backward = o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD && o->attached && o->ring_arrays;
    if (!p->offload.home) return in_backward ? umt_offload_update_resident(o, p) : UMT_OK;
    int s = slot_holding(o, p);
    if (s < 0 || !o->slots[s].grads_live) return UMT_OK;
    if (in_backward) {
        bool on_host;
        UMT_TRY(umt_offload_update_on_host(o, s, &on_host));
        return on_host ? UMT_OK : umt_offload_update_in_slot(o, s);
    }
    return umt_offload_gradient_out(o, s);
}

/* The gradients noted final in this node's backward, in the order they were announced. */
static umt_status flush_finals(umt_offload *o) {
    int count = o->final_count;
    o->final_count = 0;
    for (int i = 0; i < count; ++i) UMT_TRY(gradient_final(o, o->finals[i]));
    return UMT_OK;
}

umt_status umt_offload_after_op_backward(umt_offload *o, int node) {
    UMT_TRY(umt_offload_activations_after_backward(o, node));
    return flush_finals(o);
}

void umt_offload_attach_optimizer(umt_offload *o, const umt_optimizer *opt, bool attach) {
    if (!attach) {
        if (o->attached == opt) o->attached = NULL;
        return;
    }
    o->attached = opt;
    /* The global norm and the inf check read every gradient of the step; an update in backward
     * runs before the last is known. Said once: the mode changes for good. */
    if (o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD && umt_optimizer_has_step_scalars(opt)) {
        fprintf(stderr, "offload: the optimizer clips by the global gradient norm or scales the loss (fp16), which "
                "needs every gradient of a step before any update: offloaded parameters are updated after backward, "
                "on the gpu (update mode gpu), not during backward\n");
        o->optimizer = o->stats.optimizer = UMT_OFFLOAD_OPTIM_GPU;
    }
}

/* With step scalars the optimizer reads every gradient where it is before deciding the step: an
 * offloaded gradient that no backward wrote since umt_zero_grad is made zero at home first. */
static umt_status settle_zero_gradients(umt_offload *o) {
    if (!o->attached || !umt_optimizer_has_step_scalars(o->attached)) return UMT_OK;
    bool synced = false;
    for (int i = 0; i < o->ctx->parameter_count; ++i) {
        umt_tensor *p = o->ctx->parameters[i];
        if (!p->offload.grad_zero || !p->grad->offload.home || p->grad->data != p->grad->offload.home) continue;
        if (!synced) UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->copy_out));
        synced = true;
        memset(p->grad->offload.home, 0, p->grad->bytes);
        p->offload.grad_zero = false;
    }
    return UMT_OK;
}

umt_status umt_offload_backward_done(umt_offload *o) {
    if (!o->copy_out) return UMT_OK;
    UMT_TRY(flush_finals(o));
    UMT_TRY(settle_zero_gradients(o));
    UMT_TRY(umt_offload_deferred_piece(o, SIZE_MAX));
    for (int s = 0; s < 2; ++s) UMT_TRY(umt_offload_wait(o->compute, o->slots[s].drained));
    return UMT_OK;
}

bool umt_offload_zero_grad(umt_offload *o, umt_tensor *p) {
    if (!p->offload.home) return false;
    p->offload.grad_zero = true;
    int s = slot_holding(o, p);
    /* A gradient still being summed in a slot restarts from zero there too. */
    if (s >= 0 && o->slots[s].grads_live) cudaMemsetAsync(o->slots[s].grads, 0, p->grad->bytes, (cudaStream_t)o->compute);
    return true;
}

umt_status umt_offload_create(umt_context *ctx, const umt_offload_options *options, umt_offload **out) {
    umt_offload *o = calloc(1, sizeof *o);
    if (!o) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for its state");
    o->ctx = ctx;
    o->options = *options;
    o->compute = ctx->memory.stream;
    o->optimizer = options->optimizer;
    o->stats.optimizer = o->optimizer;
    o->activation_pending = -1;
    *out = o;
    /* The recorded first step hands ended activations and gradients out again, so that it needs
     * about what later steps do (big_mlp: 2 depth + 2 tensors at the peak, not 4 depth + 2); the
     * bytes it saves go to resident parameters, which do not stream (docs/PERF.md). */
    umt_memory_set_recycle(&ctx->memory, UMT_POOL_ACTIVATIONS, true);
    return create_streams(o);
}
