/*
 * offload/host.c — updates in backward on the CPU, beside the GPU's update ring
 * (UMT_OFFLOAD_OPTIM_BACKWARD with umt_offload_options.host_updates > 0, or UMT_OFFLOAD_HOST_AUTO: the
 * share of the measured rates for the first step, then the count searched on whole steps).
 *
 * Through the ring (offload/update.c) a streamed parameter's optimizer state crosses the
 * link both ways every step: with Adam, twice its weights' bytes each way. Updated by CPU threads
 * in pinned memory, where its weights, gradient and state live, only the gradient crosses (out),
 * and the weights come in again at the next forward. The CPU's time then runs beside the link's
 * instead of adding to it, so the first parameters of each backward (the last layers, which the
 * next forward needs last) go to the CPU and the rest through the ring.
 *
 * The update is a job of the CPU threads' queue (offload/host_queue.c), which runs it as the
 * gradient's pieces come home, newest gradient first: the host thread queues the rest of backward
 * meanwhile. The slot's weights are given up (they are the old ones); the next copy of the
 * parameter's weights waits for the update, a piece at a time.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "memory/trace.h"
#include "offload/state.h"

#include "core/base/cuda_check.h"

umt_status umt_offload_host_rule_run(const void *user, const umt_backend *be, float *param, const float *grad,
                                     float *s0, float *s1, const umt_update_fusion *fusion, int64_t n) {
    const umt_offload_host_rule *rule = user;
    return umt_optimizer_update_with(&rule->options, rule->step, be, param, grad, s0, s1, n, fusion);
}

/* The CPU's share (umt_plan_host_share) from the rates measured now. */
umt_status umt_offload_host_plan(umt_offload *o, const umt_plan_item *items, umt_tensor *const *tensors, int count) {
    int wanted = o->options.host_updates;
    o->stats.host_updates = wanted == UMT_OFFLOAD_HOST_AUTO ? 0 : wanted;
    if (wanted != UMT_OFFLOAD_HOST_AUTO || !o->plan.ring_bytes) return UMT_OK;
    int64_t streamed = 0;
    for (int i = 0; i < count; ++i)
        if (items[i].pool == UMT_POOL_WEIGHTS && items[i].offloaded) {
            streamed += tensors[i]->numel;
            o->host_streamed++;
        }
    if (!streamed) return UMT_OK;
    double rate = 0;
    umt_link_speed link;
    umt_dtype compute = umt_compute_dtype(o->ctx);
    bool grad_bf16 = compute == UMT_BF16 && o->options.bf16_gradients_home;
    umt_status st = umt_offload_cpu_rate(compute, grad_bf16, streamed, &rate);
    if (st == UMT_OK) st = umt_link_measure(o->ctx, (size_t)16 << 20, &link);
    if (st != UMT_OK) {
        fprintf(stderr, "offload: updates in backward stay on the GPU: %s\n", umt_last_error());
        return UMT_OK;
    }
    double per_way = link.both_ways_gbps / 2 * 1e9; /* backward sends and receives at once */
    double share = umt_plan_host_share(rate, per_way, o->plan.ring_arrays - 1);
    o->host_target_elements = (int64_t)(share * (double)streamed);
    o->stats.host_update_rate = rate;
    o->stats.host_updates = -1; /* searched from the second step */
    const char *copy = umt_compute_dtype(o->ctx) == UMT_F32 ? "" : " and the compute copy";
    fprintf(stderr, "offload: CPU threads update %.2f G elements/s (Adam%s), the link moves %.1f GB/s each way at "
            "once: the CPU takes %.0f%% of the %.3f G streamed elements in backward at first, then the count is "
            "searched step by step\n", rate / 1e9, copy, per_way / 1e9, 100 * share, (double)streamed / 1e9);
    return UMT_OK;
}

/* Steps at each count of the search: the first ones not timed, then the timed ones. */
#define SEARCH_UNTIMED_STEPS 2
#define SEARCH_TIMED_STEPS 2

/* UMT_OFFLOAD_HOST_AUTO: one step of the count's search (umt_plan_host_search_step), at the step's
 * end, before the step's counts are reset. The first step's count (the share's) starts it. A
 * count is timed by the mean of its steps after the SEARCH_UNTIMED_STEPS first: after a change of
 * count the CPU's backlog of updates takes steps to settle, and its steps alternate long and
 * short meanwhile, the short ones far below what the count then takes (docs/PERF.md, "Figures
 * behind the comments"). A step runs from the last step's end to this one, the compute stream
 * drained at both. */
static umt_status search(umt_offload *o) {
    umt_host_count_search *s = &o->host_search;
    if (o->stats.host_updates != -1) return UMT_OK; /* a fixed count, or the search settled */
    UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->compute));
    double now = umt_offload_seconds(), ms = 1e3 * (now - o->host_last_end_s);
    o->host_last_end_s = now;
    if (!o->host_searching) {
        o->host_searching = true;
        *s = umt_plan_host_search_start(o->host_updates_this_step, o->host_streamed);
    } else if (++o->host_steps_at_count > SEARCH_UNTIMED_STEPS) {
        o->host_count_ms += ms;
        if (o->host_steps_at_count == SEARCH_UNTIMED_STEPS + SEARCH_TIMED_STEPS) {
            double mean = o->host_count_ms / SEARCH_TIMED_STEPS;
            size_t used = strlen(o->host_search_log);
            snprintf(o->host_search_log + used, sizeof o->host_search_log - used, "%s%d: %.1f ms", used ? ", " : "",
                     s->count, mean);
            umt_plan_host_search_step(s, mean);
            o->host_steps_at_count = 0;
            o->host_count_ms = 0;
        }
    }
    if (s->direction) return UMT_OK;
    o->stats.host_updates = s->count;
    fprintf(stderr, "offload: streamed parameters updated by CPU threads, step time per count: %s; %d from now on\n",
            o->host_search_log, s->count);
    return UMT_OK;
}

/* Whether p, with its state, goes to the CPU this step. */
static bool takes(const umt_offload *o, const umt_tensor *p, umt_tensor *const state[2]) {
    int wanted = o->options.host_updates;
    if (o->host_searching) wanted = o->host_search.count;
    /* auto's first step: the nearest whole parameters to the share, counting from backward's first */
    if (wanted == UMT_OFFLOAD_HOST_AUTO ? o->host_elements_this_step + p->numel / 2 > o->host_target_elements
                                        : o->host_updates_this_step >= wanted)
        return false;
    /* Every array in pinned memory (the compute copy too): the CPU reaches nothing on the GPU. */
    return p->offload.home && p->grad->offload.home && (!state[0] || state[0]->offload.home) &&
           (!state[1] || state[1]->offload.home) && (!p->lowp || p->lowp->offload.home);
}

static const char *label(const umt_tensor *p) { return p->name ? p->name : "a parameter"; }

/* Whether p's gradient crosses home in bf16 (umt_offload_options.bf16_gradients_home): under bf16,
 * where its compute copy streams (the slot's weights part then has room for it). */
static bool gradient_home_in_bf16(const umt_offload *o, const umt_tensor *p) {
    return o->options.bf16_gradients_home && p->lowp && p->lowp->dtype == UMT_BF16;
}

static umt_offload_host_job *find_job(const umt_offload *o, const umt_tensor *p) {
    for (int j = 0; j < o->host_job_count; ++j)
        if (o->host_jobs[j]->parameter == p) return o->host_jobs[j];
    return NULL;
}

static umt_status job_of(umt_offload *o, umt_tensor *p, umt_offload_host_job **out) {
    if ((*out = find_job(o, p))) return UMT_OK;
    if (o->host_job_count == o->host_job_slots) {
        int slots = o->host_job_slots ? 2 * o->host_job_slots : 16;
        umt_offload_host_job **grown = realloc(o->host_jobs, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for %s's CPU update", label(p));
        o->host_jobs = grown;
        o->host_job_slots = slots;
    }
    umt_offload_host_job *job = calloc(1, sizeof *job);
    if (!job) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for %s's CPU update", label(p));
    job->parameter = p;
    atomic_init(&job->failed, 0);
    o->host_jobs[o->host_job_count++] = job; /* freed by umt_offload_host_destroy from here on */
    /* Its work items, in pieces of consecutive items (the last piece may be shorter). */
    job->job.n = p->numel;
    UMT_TRY(umt_offload_cpu_chunk(p, &job->job.chunk)); /* kept by each update's job below */
    job->items = umt_offload_cpu_items(&job->job);
    job->piece_items = (job->items + UMT_OFFLOAD_HOST_PIECES - 1) / UMT_OFFLOAD_HOST_PIECES;
    job->pieces = (int)((job->items + job->piece_items - 1) / job->piece_items);
    job->piece_elements = job->piece_items * job->job.chunk;
    /* The counts of pieces home (the copy-out stream writes it, the threads read it), and of
     * finished updates and pieces (the threads write them, streams wait on them), in pinned memory
     * (offload/host_queue.c). */
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, sizeof *job->pieces_home, (void **)&job->pieces_home));
    atomic_init(job->pieces_home, 0);
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, sizeof *job->finished, (void **)&job->finished));
    atomic_init(job->finished, 0);
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, (size_t)job->pieces * sizeof *job->piece_finished,
                             (void **)&job->piece_finished));
    for (int k = 0; k < job->pieces; ++k) atomic_init(&job->piece_finished[k], 0);
    return *out = job, UMT_OK;
}

/* The queue's threads, at the first update the CPU takes. Where they cannot run (no stream write
 * or wait on pinned memory in this driver), the streamed parameters are updated through the ring
 * from now on, said once: the run goes on. */
static bool queue_started(umt_offload *o) {
    if (umt_offload_queue_start(o, UMT_OFFLOAD_SPARE_CORES) == UMT_OK) return true;
    fprintf(stderr, "offload: updates in backward stay on the GPU: %s\n", umt_last_error());
    o->options.host_updates = 0;
    o->host_searching = false;
    o->stats.host_updates = 0;
    return false;
}

umt_status umt_offload_update_on_host(umt_offload *o, int s, bool *taken) {
    umt_tensor *p = o->slots[s].holder;
    umt_tensor *state[2] = {0};
    *taken = false;
    UMT_TRY(umt_offload_state_of(o, p, state));
    if (!takes(o, p, state) || !queue_started(o)) return UMT_OK;
    *taken = true;
    umt_offload_host_job *job = NULL;
    UMT_TRY(job_of(o, p, &job));
    /* The job is rewritten below: last step's update must have run (the host is rarely a whole
     * step ahead of the GPU). */
    UMT_TRY(umt_offload_queue_host_wait(o, job));
    bool half = gradient_home_in_bf16(o, p);
    if (half && !job->grad_bf16)
        UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, (size_t)p->numel * sizeof *job->grad_bf16,
                                 (void **)&job->grad_bf16));
    UMT_TRY(umt_offload_gradient_out_pieces(o, s, job, half));
    UMT_TRY(umt_offload_evict(o, s)); /* its weights there are the old ones now */
    umt_update_fusion fusion = umt_offload_fusion(p, p->lowp ? p->lowp->offload.home : NULL, 0, NULL);
    fusion.grad_bf16 = half ? job->grad_bf16 : NULL;
    job->job = (umt_offload_cpu_job){umt_offload_host_rule_run, &job->rule, p->offload.home,
                                     half ? NULL : p->grad->offload.home, state[0] ? state[0]->offload.home : NULL,
                                     state[1] ? state[1]->offload.home : NULL, p->numel, fusion, job->job.chunk};
    umt_optimizer_snapshot(o->attached, &job->rule.options, &job->rule.step);
    UMT_TRY(umt_offload_queue_job(o, job)); /* runs a piece at a time, once the piece is home */
    p->offload.grad_zero = true; /* consumed by the update */
    p->offload.updated_early = true;
    o->stats.updates_in_backward++;
    o->host_updates_this_step++;
    o->host_elements_this_step += p->numel;
    o->stats.host_updated_elements += (uint64_t)p->numel;
    return UMT_OK;
}

umt_status umt_offload_host_wait(umt_offload *o, void *stream, const umt_tensor *p) {
    const umt_offload_host_job *job = find_job(o, p);
    return job ? umt_offload_queue_stream_wait(o, stream, job) : UMT_OK;
}

umt_status umt_offload_host_copy_in(umt_offload *o, umt_tensor *p, void *dst) {
    const umt_offload_host_job *job = find_job(o, p);
    const umt_tensor *weights = umt_offload_streamed(p);
    const char *what = p->name ? p->name : "weights";
    if (!job) return umt_offload_copy(o, dst, weights->offload.home, weights->bytes, true, what);
    /* A piece's items are whole output channels of a conv weight (umt_offload_cpu_chunk), which
     * lie at the same element offsets in the compute copy as in the master. */
    size_t element = umt_dtype_size(weights->dtype);
    for (int k = 0; k < job->pieces; ++k) {
        int64_t first, n = umt_offload_piece(job, k, p->numel, &first);
        UMT_TRY(umt_offload_queue_piece_wait(o, o->copy_in, job, k));
        UMT_TRY(umt_offload_copy(o, (char *)dst + first * element, (const char *)weights->offload.home + first * element,
                                 (size_t)n * element, true, what));
    }
    return UMT_OK;
}

umt_status umt_offload_host_step_end(umt_offload *o) {
    UMT_TRY(search(o));
    o->host_updates_this_step = 0;
    o->host_elements_this_step = 0;
    for (int j = 0; j < o->host_job_count; ++j) {
        umt_offload_host_job *job = o->host_jobs[j];
        if (atomic_load(&job->failed))
            return umt_fail(UMT_ERR_STATE, "offload: the CPU update of %s failed in backward", label(job->parameter));
    }
    return UMT_OK;
}

void umt_offload_host_destroy(umt_offload *o) {
    for (int j = 0; j < o->host_job_count; ++j) {
        umt_offload_host_job *job = o->host_jobs[j];
        umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, (void *)job->finished);
        umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, (void *)job->pieces_home);
        umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, (void *)job->piece_finished);
        umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, job->grad_bf16);
        free(job);
    }
    free(o->host_jobs);
}
