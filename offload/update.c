/*
 * offload/update.c — the optimizer's step for offloaded parameters (offload/offload.h).
 *
 * In the optimizer's step, two ways, both run core/optim/optim.c's rule through the backends' own
 * update kernels:
 *   gpu  (a parameter whose weights are resident and only state is offloaded: the kernel reads
 *        and writes the state in pinned memory directly, which the GPU can address.)
 *        every array of the parameter that lives in the offload tier is copied into a slot in
 *        chunks (a quarter of a slot per array); the update kernel runs on the chunk; the
 *        parameter and its state go back. Chunks alternate between the two slots, so chunk k+1
 *        comes in while chunk k is updated and chunk k-1 goes out.
 *   cpu  the CPU kernel updates the arrays in place in pinned memory, the elements split among
 *        one thread per core; only the gradients crossed the link (in backward).
 * With UMT_OFFLOAD_OPTIM_AUTO the first step's update runs on the GPU, the second's on the CPU,
 * each timed from the start of the update to the end of its last copy; the faster one stays.
 *
 * In backward (UMT_OFFLOAD_OPTIM_BACKWARD), a parameter streamed through a slot is updated there
 * as soon as its gradient is final, in chunks through the update ring: a chunk's state comes in
 * on the state-in stream, the update kernel runs on the update stream (the compute stream goes on
 * with the next layer's backward), the chunk's new weights are copied beside its state in the
 * entry, and all of it goes home on the copy-out stream. Copy engines carry every byte, so the
 * update kernels are short and leave the SMs to backward's own kernels. The slot keeps the new
 * weights (valid for the next forward) and takes the next layer once its last chunk is updated,
 * without waiting for the chunks' way home. A parameter the plan keeps on the GPU with its state
 * offloaded is updated in place the same way, only its state crossing the link, so that its
 * update too overlaps backward instead of following it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/tensor.h"
#include "memory/trace.h"
#include "offload/state.h"

#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"

/* Weights put off for backward's next layer go in WEIGHT_PIECES_PER_CHUNK chunks' worth after each
 * update chunk's state: two state arrays in, then two pieces of weights, against a chunk's weights
 * and state going out. Two was the fastest of 1, 2, 4 and 16 (docs/PERF.md, "Offload tier"). */
#define WEIGHT_PIECES_PER_CHUNK 2

bool umt_offload_involves(const umt_tensor *p, const umt_tensor *state0, const umt_tensor *state1) {
    return p->offload.home || p->grad->offload.home || (state0 && state0->offload.home) ||
           (state1 && state1->offload.home);
}

umt_status umt_offload_state_of(const umt_offload *o, const umt_tensor *p, umt_tensor *state[2]) {
    return umt_optimizer_state_of(o->attached, p, state);
}

static umt_offload_optimizer mode_this_step(const umt_offload *o) {
    /* backward: what reaches the step was not updated in backward (no optimizer attached then). */
    if (o->optimizer == UMT_OFFLOAD_OPTIM_BACKWARD) return UMT_OFFLOAD_OPTIM_GPU;
    if (o->optimizer != UMT_OFFLOAD_OPTIM_AUTO) return o->optimizer;
    /* auto: time the GPU first, then the CPU, then keep the faster (decided in update_end). */
    return o->stats.optimizer_gpu_ms == 0 ? UMT_OFFLOAD_OPTIM_GPU : UMT_OFFLOAD_OPTIM_CPU;
}

umt_status umt_offload_update_begin(umt_offload *o) {
    if (!o->copy_in) return UMT_OK;
    o->slots_claimed = false;
    /* auto's timed steps start the clock once forward and backward are done, so that each way is
     * timed on its own work. */
    if (o->optimizer == UMT_OFFLOAD_OPTIM_AUTO) UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->compute));
    o->update_start_s = umt_offload_seconds();
    /* What the CPU threads wait for: not the compute stream, whose GPU updates queued after this
     * (a resident parameter's state in pinned memory) run beside them. */
    UMT_TRY(umt_offload_record(o->update_ready, o->compute));
    o->update_used_gpu = o->update_used_cpu = false;
    o->cpu_job_count = 0;
    return UMT_OK;
}

/* Before the first update that rewrites offloaded weights: what the slots hold goes stale, and
 * chunks will overwrite them, not before queued compute is done reading them. */
static umt_status claim_slots(umt_offload *o) {
    if (o->slots_claimed) return UMT_OK;
    for (int s = 0; s < 2; ++s) {
        UMT_TRY(umt_offload_evict(o, s));
        UMT_TRY(umt_offload_record(o->slots[s].released, o->compute));
        UMT_TRY(umt_offload_wait(o->copy_in, o->slots[s].released));
    }
    o->slots_claimed = true;
    return UMT_OK;
}

/* A gradient that no backward wrote since umt_zero_grad is zero on the host too, from now on. */
static umt_status settle_zero_gradient(umt_offload *o, umt_tensor *p) {
    if (!p->offload.grad_zero) return UMT_OK;
    UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->copy_out));
    if (p->grad->offload.home) memset(p->grad->offload.home, 0, p->grad->bytes);
    else UMT_CUDA_TRY(cudaMemsetAsync(p->grad->data, 0, p->grad->bytes, (cudaStream_t)o->compute));
    p->offload.grad_zero = false;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* On the GPU, in chunks through the slots */

typedef struct {
    umt_tensor *tensor; /* NULL: no such array (SGD without momentum) */
    bool write_back;    /* the update changes it (everything but the gradient) */
} array_ref;

/* One chunk [offset, offset + n) of every array through slot s; a compute copy home is written in
 * the slot's fifth region (after the four arrays' chunks) and sent home beside the master. */
static umt_status gpu_chunk(umt_offload *o, int s, const array_ref arrays[4], int64_t offset, int64_t n,
                            int64_t chunk, umt_offload_update_fn fn, const void *user) {
    umt_offload_slot *slot = &o->slots[s];
    const umt_tensor *p = arrays[0].tensor;
    bool copy_home = p->lowp && p->lowp->offload.home;
    void *lowp_chunk = (float *)slot->base + 4 * chunk;
    umt_update_fusion fusion = copy_home ? umt_offload_fusion(p, lowp_chunk, 0, o->scalars)
                                         : umt_offload_fusion(p, p->lowp ? p->lowp->data : NULL, offset, o->scalars);
    float *device[4] = {0};
    UMT_TRY(umt_offload_wait(o->copy_in, slot->drained));
    for (int a = 0; a < 4; ++a) {
        const umt_tensor *t = arrays[a].tensor;
        if (!t) continue;
        if (!t->offload.home) {
            device[a] = (float *)t->data + offset;
            continue;
        }
        device[a] = (float *)slot->base + a * chunk;
        UMT_TRY(umt_offload_copy(o, device[a], (float *)t->offload.home + offset, (size_t)n * sizeof(float), true, "update in"));
    }
    UMT_TRY(umt_offload_record(slot->loaded, o->copy_in));
    UMT_TRY(umt_offload_wait(o->compute, slot->loaded));
    void *begin = umt_trace_begin(o->ctx->memory.trace, o->compute);
    UMT_TRY(fn(user, umt_kernels(o->ctx), device[0], device[1], device[2], device[3], &fusion, n));
    umt_trace_end(o->ctx->memory.trace, o->compute, begin, "update", "optimizer", UMT_TRACE_COMPUTE, 0);
    UMT_TRY(umt_offload_record(slot->released, o->compute));
    UMT_TRY(umt_offload_wait(o->copy_out, slot->released));
    for (int a = 0; a < 4; ++a) {
        const umt_tensor *t = arrays[a].tensor;
        if (t && t->offload.home && arrays[a].write_back)
            UMT_TRY(umt_offload_copy(o, (float *)t->offload.home + offset, device[a], (size_t)n * sizeof(float), false, "update out"));
    }
    if (copy_home)
        UMT_TRY(umt_offload_copy(o, (char *)p->lowp->offload.home + umt_offload_lowp_bytes(p, offset), lowp_chunk,
                                 umt_offload_lowp_bytes(p, n), false, "update out"));
    return umt_offload_record(slot->drained, o->copy_out);
}

static umt_status update_on_gpu(umt_offload *o, const array_ref arrays[4], int64_t n, umt_offload_update_fn fn,
                                const void *user) {
    UMT_TRY(claim_slots(o));
    /* A quarter of a slot per array, in whole 256-byte lines; a fifth with a compute copy, which
     * takes (half) a fifth region too. */
    const umt_tensor *p = arrays[0].tensor;
    int64_t chunk = (int64_t)(o->slot_bytes / (p->lowp ? 5 : 4) / 256 * 256 / sizeof(float));
    UMT_TRY(umt_offload_align_chunk(p, &chunk));
    for (int64_t offset = 0; offset < n; offset += chunk) {
        int s = o->last_slot = 1 - o->last_slot;
        UMT_TRY(gpu_chunk(o, s, arrays, offset, n - offset < chunk ? n - offset : chunk, chunk, fn, user));
    }
    o->update_used_gpu = true;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* On the CPU, with threads */

static umt_status queue_cpu_job(umt_offload *o, const umt_offload_cpu_job *job) {
    if (o->cpu_job_count == o->cpu_job_slots) {
        int slots = o->cpu_job_slots ? 2 * o->cpu_job_slots : 16;
        umt_offload_cpu_job *grown = realloc(o->cpu_jobs, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for CPU update jobs");
        o->cpu_jobs = grown;
        o->cpu_job_slots = slots;
    }
    UMT_TRY(claim_slots(o));
    o->cpu_jobs[o->cpu_job_count++] = *job;
    o->update_used_cpu = true;
    return UMT_OK;
}

typedef struct {
    const umt_offload_cpu_job *jobs;
    int job_count;
    int64_t chunks; /* work items over all jobs, numbered job after job */
    atomic_llong next;
    atomic_int failed;
} cpu_work;

int64_t umt_offload_cpu_items(const umt_offload_cpu_job *job) { return (job->n + job->chunk - 1) / job->chunk; }

bool umt_offload_cpu_item(const umt_offload_cpu_job *job, int64_t item) {
    int64_t offset = item * job->chunk, n = job->n - offset < job->chunk ? job->n - offset : job->chunk;
    float *s0 = job->state0 ? job->state0 + offset : NULL, *s1 = job->state1 ? job->state1 + offset : NULL;
    umt_update_fusion fusion = job->fusion;
    if (fusion.lowp) fusion.lowp = (char *)fusion.lowp + (size_t)offset * umt_dtype_size(fusion.lowp_dtype);
    if (fusion.grad_bf16) fusion.grad_bf16 += offset;
    const float *grad = job->grad ? job->grad + offset : NULL; /* NULL: read from grad_bf16 */
    return job->fn(job->user, umt_cpu_backend(), job->param + offset, grad, s0, s1, &fusion, n) == UMT_OK;
}

/* Each thread takes the next item until none is left. */
static void *cpu_worker(void *arg) {
    cpu_work *w = arg;
    for (;;) {
        long long k = atomic_fetch_add(&w->next, 1);
        if (k >= w->chunks) return NULL;
        int j = 0;
        int64_t first = 0, per;
        while (first + (per = umt_offload_cpu_items(&w->jobs[j])) <= k) first += per, j++;
        if (!umt_offload_cpu_item(&w->jobs[j], k - first)) atomic_store(&w->failed, 1);
    }
}

bool umt_offload_cpu_threads(const umt_offload_cpu_job *jobs, int count, int spare) {
    cpu_work w = {.jobs = jobs, .job_count = count};
    for (int j = 0; j < count; ++j) w.chunks += umt_offload_cpu_items(&jobs[j]);
    atomic_init(&w.next, 0);
    atomic_init(&w.failed, 0);
    int threads = umt_offload_cpu_thread_count(spare);
    pthread_t ids[UMT_OFFLOAD_MAX_THREADS];
    int started = 0;
    for (; started < threads; ++started)
        if (pthread_create(&ids[started], NULL, cpu_worker, &w) != 0) break;
    if (started == 0) cpu_worker(&w);
    for (int i = 0; i < started; ++i) pthread_join(ids[i], NULL);
    return !atomic_load(&w.failed);
}

int umt_offload_cpu_thread_count(int spare) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN) - spare;
    return cores < 1 ? 1 : cores > UMT_OFFLOAD_MAX_THREADS ? UMT_OFFLOAD_MAX_THREADS : (int)cores;
}

umt_status umt_offload_cpu_chunk(const umt_tensor *p, int64_t *chunk) {
    *chunk = UMT_OFFLOAD_CPU_CHUNK;
    return umt_offload_align_chunk(p, chunk);
}

static umt_status run_cpu_jobs(umt_offload *o) {
    if (!o->cpu_job_count) return UMT_OK;
    /* The gradients must be home (backward made compute wait for them, before update_ready) and no
     * copy may still read the parameters being rewritten. The GPU's own updates queued since
     * (parameters whose state alone is offloaded) touch none of the CPU's arrays: they run beside
     * the threads. UMT_MEM_TRACE: the host's waits, on the host's track. */
    umt_trace *trace = o->ctx->memory.trace;
    double wait_us = umt_trace_now_us(trace);
    UMT_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)o->update_ready));
    umt_trace_host_interval(trace, wait_us, umt_trace_now_us(trace), "compute", "host waits", UMT_TRACE_HOST, 0);
    wait_us = umt_trace_now_us(trace);
    UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->copy_in));
    umt_trace_host_interval(trace, wait_us, umt_trace_now_us(trace), "copy in", "host waits", UMT_TRACE_HOST, 0);
    /* The step's decision, made on the compute stream, for the jobs' fusion (scalars_host). */
    if (o->scalars)
        UMT_CUDA_TRY(cudaMemcpy(&o->scalars_host, o->scalars, sizeof o->scalars_host, cudaMemcpyDefault));
    /* UMT_MEM_TRACE: the threads' work as one bar of the CPU's track, on the trace's host clock. */
    double begin_us = umt_trace_now_us(trace);
    bool ok = umt_offload_cpu_threads(o->cpu_jobs, o->cpu_job_count, 0);
    char name[32];
    snprintf(name, sizeof name, "%d parameters", o->cpu_job_count);
    umt_trace_host_interval(trace, begin_us, umt_trace_now_us(trace), name, "cpu update", UMT_TRACE_HOST_UPDATE, 0);
    if (!ok) return umt_fail(UMT_ERR_STATE, "offload: a CPU update failed: %s", umt_last_error());
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* In backward, through the update ring */

umt_status umt_offload_make_ring(umt_offload *o) {
    char *base = NULL;
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_STREAM, o->plan.ring_bytes, (void **)&base));
    size_t chunk = o->plan.ring_chunk_bytes;
    o->ring_arrays = o->plan.ring_arrays;
    for (int e = 0; e < o->plan.ring_entries; ++e)
        for (int a = 0; a < o->ring_arrays; ++a)
            o->ring[e].arrays[a] = (float *)(base + ((size_t)e * o->ring_arrays + a) * chunk);
    return UMT_OK;
}

/* One parameter's update through the ring: its weights and gradient on the device (a slot, or
 * where a resident parameter lives; weights NULL: the master stays home, and each chunk of it comes
 * through the entry's weights array with the state), its state tensors (NULL where the rule keeps
 * fewer than two), whether the new weights go home too (streamed parameters) or stay where they
 * are, and its compute copy on the device (NULL: none), sent home too when send_lowp. */
typedef struct {
    umt_tensor *parameter;
    float *weights;
    const float *grad;
    umt_tensor *state[2];
    bool send_weights;
    void *lowp;
    bool send_lowp;
} ring_update;

/* The update kernel on the update stream (the master at weights: the slot's, or the entry's), and
 * the copy of the chunk's new weights into the entry when they go home from the slot. */
static umt_status update_and_keep(umt_offload *o, const ring_update *u, int64_t offset, float *weights,
                                  float *const state[2], float *kept, int64_t n) {
    umt_update_fusion fusion = umt_offload_fusion(u->parameter, u->lowp, offset, NULL);
    umt_device_bind(o->ctx); /* the launch stream is the context's own choice */
    cudaStream_t previous = umt_cuda_launch_on((cudaStream_t)o->update);
    umt_status st = umt_optimizer_update_range(o->attached, weights, u->grad + offset, state[0], state[1], n, &fusion);
    umt_cuda_launch_on(previous);
    UMT_TRY(st);
    if (u->send_weights && weights != kept)
        UMT_CUDA_TRY(cudaMemcpyAsync(kept, weights, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                     (cudaStream_t)o->update));
    return UMT_OK;
}

/* Elements [offset, offset + n) of the update through the next ring entry. */
static umt_status ring_chunk(umt_offload *o, const ring_update *u, int64_t offset, int64_t n, int index) {
    umt_offload_ring_entry *e = &o->ring[o->ring_next];
    o->ring_next = (o->ring_next + 1) % o->plan.ring_entries;
    umt_tensor *p = u->parameter;
    size_t bytes = (size_t)n * sizeof(float);
    float *device[2] = {0};
    UMT_TRY(umt_offload_wait(o->state_in, e->drained));
    float *weights = u->weights ? u->weights + offset : e->arrays[0];
    if (!u->weights)
        UMT_TRY(umt_offload_copy_on(o, o->state_in, UMT_TRACE_STATE_IN, weights, (float *)p->offload.home + offset,
                                    bytes, true, "master in"));
    for (int a = 0; a < 2; ++a) {
        umt_tensor *state = u->state[a];
        if (!state) continue;
        if (!state->offload.home) { /* kept on the GPU by the plan: updated where it is */
            device[a] = (float *)state->data + offset;
            continue;
        }
        device[a] = e->arrays[1 + a];
        UMT_TRY(umt_offload_copy_on(o, o->state_in, UMT_TRACE_STATE_IN, device[a], (float *)state->offload.home + offset,
                                    bytes, true, "state in"));
    }
    UMT_TRY(umt_offload_record(e->loaded, o->state_in));
    /* A piece of the next weights after each chunk's state, once the ring is full (the first
     * entries' state may come in before this slot's previous update is done; the weights not). */
    if (index + 1 >= o->plan.ring_entries)
        UMT_TRY(umt_offload_deferred_piece(o, WEIGHT_PIECES_PER_CHUNK * bytes));
    UMT_TRY(umt_offload_wait(o->update, e->loaded));
    umt_trace *trace = o->ctx->memory.trace;
    void *begin = umt_trace_begin(trace, o->update);
    UMT_TRY(update_and_keep(o, u, offset, weights, device, e->arrays[0], n));
    umt_trace_end(trace, o->update, begin, p->name ? p->name : "update", "optimizer", UMT_TRACE_UPDATE, 0);
    UMT_TRY(umt_offload_record(e->released, o->update));
    UMT_TRY(umt_offload_wait(o->copy_out, e->released));
    if (u->send_weights)
        UMT_TRY(umt_offload_copy(o, (float *)p->offload.home + offset, e->arrays[0], bytes, false, p->name ? p->name : "weights"));
    if (u->send_lowp)
        UMT_TRY(umt_offload_copy(o, (char *)p->lowp->offload.home + umt_offload_lowp_bytes(p, offset),
                                 (char *)u->lowp + umt_offload_lowp_bytes(p, offset), umt_offload_lowp_bytes(p, n),
                                 false, p->name ? p->name : "compute copy"));
    for (int a = 0; a < 2; ++a)
        if (u->state[a] && u->state[a]->offload.home)
            UMT_TRY(umt_offload_copy(o, (float *)u->state[a]->offload.home + offset, device[a], bytes, false, "state out"));
    return umt_offload_record(e->drained, o->copy_out);
}

/* Every chunk of u, once the gradient the compute stream has just queued is final (final: an event
 * to record that on; a gradient hook's work on it, data parallelism's all-reduce, is queued before:
 * offload/offload.h). */
static umt_status update_through_ring(umt_offload *o, const ring_update *u, void *final) {
    umt_tensor *p = u->parameter;
    /* The tier turned updates in backward off when the optimizer was made (offload.c): a safety net. */
    if (umt_optimizer_has_step_scalars(o->attached))
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: %s would be updated during backward, before the global gradient "
                        "norm and the inf check are known; update after backward instead (gpu or cpu)",
                        p->name ? p->name : "a parameter");
    int arrays = 1 + (u->state[0] && u->state[0]->offload.home) + (u->state[1] && u->state[1]->offload.home);
    if (arrays > o->ring_arrays)
        return umt_fail(UMT_ERR_STATE, "offload: %s needs %d arrays per update ring entry, the plan made %d",
                        p->name ? p->name : "a parameter", arrays, o->ring_arrays);
    UMT_TRY(umt_offload_record(final, o->compute));
    UMT_TRY(umt_offload_wait(o->update, final));
    /* A parameter the CPU threads updated in an earlier step (the count of CPU updates changes
     * while auto searches it) has its state rewritten by the CPU threads: the state's copies
     * in wait for that update, as the weights' loads do. The state-in stream waits for nothing of the
     * compute stream, so without this it could read the state before that update wrote it. */
    UMT_TRY(umt_offload_host_wait(o, o->state_in, p));
    int64_t chunk = (int64_t)(o->plan.ring_chunk_bytes / sizeof(float));
    UMT_TRY(umt_offload_align_chunk(p, &chunk));
    for (int64_t offset = 0; offset < p->numel; offset += chunk)
        UMT_TRY(ring_chunk(o, u, offset, p->numel - offset < chunk ? p->numel - offset : chunk, (int)(offset / chunk)));
    UMT_TRY(umt_offload_record(o->homed, o->copy_out));
    p->offload.updated_early = true;
    o->stats.updates_in_backward++;
    return UMT_OK;
}

umt_status umt_offload_update_in_slot(umt_offload *o, int s) {
    umt_offload_slot *slot = &o->slots[s];
    umt_tensor *p = slot->holder;
    /* Under bf16/fp16 the slot holds the compute copy: the master comes through the ring, and the
     * copy, rewritten in the slot, goes home from there (the slot is free once it has left). */
    bool copy = umt_offload_streamed(p) != p;
    ring_update u = {p, copy ? NULL : slot->base, slot->grads, {0}, true, copy ? slot->base : NULL, copy};
    UMT_TRY(umt_offload_state_of(o, p, u.state));
    UMT_TRY(update_through_ring(o, &u, slot->released));
    UMT_TRY(umt_offload_record(slot->drained, copy ? o->copy_out : o->update));
    slot->grads_live = false;
    p->grad->data = p->grad->offload.home;
    p->offload.grad_zero = true; /* consumed by the update */
    return UMT_OK;
}

umt_status umt_offload_update_resident(umt_offload *o, umt_tensor *p) {
    ring_update u = {p, p->data, p->grad->data, {0}, false, p->lowp ? p->lowp->data : NULL, false};
    UMT_TRY(umt_offload_state_of(o, p, u.state));
    bool offloaded = (u.state[0] && u.state[0]->offload.home) || (u.state[1] && u.state[1]->offload.home);
    /* State on the GPU too: the optimizer's step updates it with the rest. */
    return offloaded ? update_through_ring(o, &u, o->gradient_final) : UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The entry points */

umt_status umt_offload_update(umt_offload *o, umt_tensor *p, umt_tensor *state0, umt_tensor *state1,
                              umt_offload_update_fn fn, const void *user) {
    if (!o->copy_in)
        return umt_fail(UMT_ERR_STATE, "offload: %s has offloaded arrays but the tier has no streams",
                        p->name ? p->name : "a parameter");
    UMT_TRY(settle_zero_gradient(o, p));
    if (!p->offload.home && !p->grad->offload.home) {
        /* Only state is offloaded: the kernel reads and writes it where it lives (pinned memory is
         * addressable from the GPU), on the resident weights and gradient; no slot is needed. */
        float *s0 = state0 ? state0->data : NULL, *s1 = state1 ? state1->data : NULL;
        uint64_t bytes = (state0 && state0->offload.home ? state0->bytes : 0) + (state1 && state1->offload.home ? state1->bytes : 0);
        o->stats.bytes_to_device += bytes;
        o->stats.bytes_to_host += bytes;
        o->update_used_gpu = true;
        umt_update_fusion fusion = umt_offload_fusion(p, p->lowp ? p->lowp->data : NULL, 0, o->scalars);
        /* UMT_MEM_TRACE: the kernel reads the state across the link, a bar of the compute lane. */
        void *begin = umt_trace_begin(o->ctx->memory.trace, o->compute);
        UMT_TRY(fn(user, umt_kernels(o->ctx), p->data, p->grad->data, s0, s1, &fusion, p->numel));
        umt_trace_end(o->ctx->memory.trace, o->compute, begin, p->name ? p->name : "update", "optimizer",
                      UMT_TRACE_COMPUTE, 0);
        return UMT_OK;
    }
    bool all_home = p->offload.home && p->grad->offload.home && (!state0 || state0->offload.home) &&
                    (!state1 || state1->offload.home) && (!p->lowp || p->lowp->offload.home);
    if (mode_this_step(o) == UMT_OFFLOAD_OPTIM_CPU && all_home) {
        /* The CPU reads the step's decision from its copy, taken before the jobs run. */
        umt_offload_cpu_job job = {fn, user, p->offload.home, p->grad->offload.home, state0 ? state0->offload.home : NULL,
                                   state1 ? state1->offload.home : NULL, p->numel,
                                   umt_offload_fusion(p, p->lowp ? p->lowp->offload.home : NULL, 0,
                                                      o->scalars ? &o->scalars_host : NULL), 0};
        UMT_TRY(umt_offload_cpu_chunk(p, &job.chunk));
        return queue_cpu_job(o, &job);
    }
    array_ref arrays[4] = {{p, true}, {p->grad, false}, {state0, true}, {state1, true}};
    return update_on_gpu(o, arrays, p->numel, fn, user);
}

/* The optimizer's rule, with its options and this step, for the update functions above. */
typedef struct {
    umt_optimizer_options options;
    int64_t step;
} rule_call;

static umt_status run_rule(const void *user, const umt_backend *be, float *param, const float *grad, float *s0,
                           float *s1, const umt_update_fusion *fusion, int64_t n) {
    const rule_call *call = user;
    return umt_optimizer_update_with(&call->options, call->step, be, param, grad, s0, s1, n, fusion);
}

umt_status umt_offload_optimizer_step(umt_offload *o, const umt_optimizer *opt, int64_t step) {
    rule_call call = {.step = step};
    int64_t next;
    umt_optimizer_snapshot(opt, &call.options, &next);
    /* With loss scaling or clipping, umt_optimizer_step has queued the step's decision before this
     * event: every update below reads it (offload/offload.h). */
    o->scalars = umt_optimizer_scalars_on_device(opt);
    bool begun = false;
    for (int i = 0; i < umt_optimizer_parameter_count(opt); ++i) {
        umt_tensor *state[2];
        umt_tensor *p = umt_optimizer_parameter_at(opt, i, state);
        if (p->offload.updated_early) { /* done during backward (UMT_OFFLOAD_OPTIM_BACKWARD) */
            p->offload.updated_early = false;
            continue;
        }
        if (!umt_offload_involves(p, state[0], state[1])) continue;
        if (!begun) UMT_TRY(umt_offload_update_begin(o));
        begun = true;
        UMT_TRY(umt_offload_update(o, p, state[0], state[1], run_rule, &call));
    }
    /* call lives until here: the CPU updates run in umt_offload_update_end. */
    if (begun) UMT_TRY(umt_offload_update_end(o));
    return umt_offload_step_end(o);
}

/* auto: after the timed steps, keep the faster way and say so. */
static void decide(umt_offload *o, double ms) {
    if (o->optimizer != UMT_OFFLOAD_OPTIM_AUTO) return;
    if (o->stats.optimizer_gpu_ms == 0) o->stats.optimizer_gpu_ms = ms;
    else o->stats.optimizer_cpu_ms = ms;
    if (o->stats.optimizer_cpu_ms == 0) return;
    o->optimizer = o->stats.optimizer_cpu_ms < o->stats.optimizer_gpu_ms ? UMT_OFFLOAD_OPTIM_CPU : UMT_OFFLOAD_OPTIM_GPU;
    o->stats.optimizer = o->optimizer;
    fprintf(stderr, "offload: update of offloaded parameters measured on the gpu (streamed) %.1f ms, on the cpu "
            "(threads) %.1f ms: %s from now on\n", o->stats.optimizer_gpu_ms, o->stats.optimizer_cpu_ms,
            umt_offload_optimizer_name(o->optimizer));
}

umt_status umt_offload_update_end(umt_offload *o) {
    if (!o->copy_in) return UMT_OK;
    UMT_TRY(run_cpu_jobs(o));
    /* The next copies in must read the updated parameters: everything waits for the last out. */
    for (int s = 0; s < 2; ++s) {
        UMT_TRY(umt_offload_wait(o->copy_in, o->slots[s].drained));
        UMT_TRY(umt_offload_wait(o->compute, o->slots[s].drained));
    }
    bool timing = o->optimizer == UMT_OFFLOAD_OPTIM_AUTO && (o->update_used_gpu || o->update_used_cpu);
    if (timing) {
        UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->copy_out));
        UMT_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)o->compute));
        decide(o, 1e3 * (umt_offload_seconds() - o->update_start_s));
    }
    return UMT_OK;
}

umt_status umt_offload_step_end(umt_offload *o) {
    if (!o->copy_in) return UMT_OK;
    /* Weights updated in backward are still on their way home: copies in read them after, and
     * the compute stream reads the slots' weights only once their updates are done. */
    for (int s = 0; s < 2; ++s) UMT_TRY(umt_offload_wait(o->copy_in, o->slots[s].drained));
    UMT_TRY(umt_offload_wait(o->copy_in, o->homed));
    UMT_TRY(umt_offload_wait(o->state_in, o->homed));
    UMT_TRY(umt_offload_record(o->updated, o->update));
    UMT_TRY(umt_offload_wait(o->compute, o->updated));
    UMT_TRY(umt_offload_host_step_end(o));
    /* The first step has shown the order of uses: from now on each is prefetched, starting with
     * the next step's first, which can come in now. */
    o->recording = false;
    o->following = true;
    o->next_use = 0;
    if (o->use_count) {
        const umt_offload_use *first = &o->uses[0];
        UMT_TRY(umt_offload_acquire(o, first->parameter, first->for_backward));
        o->next_use = 0; /* the step will ask for it again, and find it resident */
    }
    return UMT_OK;
}
