/*
 * offload/state.h — the offload tier's state, shared by its two files: offload/offload.c
 * (planning, slots, streaming in forward and backward) and offload/update.c (the update).
 * Nothing else includes it.
 */
#ifndef UMT_OFFLOAD_STATE_H
#define UMT_OFFLOAD_STATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/tensor.h"
#include "memory/offload_plan.h"
#include "offload/copy_ranges.h"
#include "offload/host_share.h"
#include "offload/offload.h"

/* One half of the double buffer. Its events order the three streams around it:
 *   loaded    copy-in stream: what the slot should hold is there (compute waits for it);
 *   released  compute stream: queued work that reads or writes the slot is behind this;
 *   drained   copy-out stream: the slot's gradient (or update chunk) has left for the host; with
 *             updates in backward, update stream: the slot's last chunk is updated (its weights
 *             leave from the ring). */
typedef struct {
    void *base;          /* stream pool: weights at base, gradient at grads */
    void *grads;
    umt_tensor *holder;  /* the parameter whose weights are in the slot, or NULL */
    bool grads_live;     /* the gradient part holds holder's gradient, not yet copied out */
    void *loaded, *released, *drained;
} umt_offload_slot;

/* One entry of the update ring (UMT_OFFLOAD_OPTIM_BACKWARD, offload/update.c): a chunk of
 * the weights and of each state array. Its events:
 *   loaded    state-in stream: the chunk's state is there (the update waits for it);
 *   released  update stream: the chunk is updated, its weights copied in beside (copy-out waits);
 *   drained   copy-out stream: the chunk has gone home (the next copy into the entry waits). */
typedef struct {
    float *arrays[3]; /* weights, state 0, state 1: the plan's ring_chunk_bytes each */
    void *loaded, *released, *drained;
} umt_offload_ring_entry;

typedef struct {
    umt_tensor *parameter;
    bool for_backward;
} umt_offload_use;

/* UMT_OFFLOAD_OPTIM_BACKWARD: backward's next weights, put off at their load. A copy engine
 * serves its direction copy after copy in the order they became ready, so a whole layer's weights
 * queued at once would hold back the update ring's state for milliseconds while the copies out
 * ran dry.
 * Instead a piece goes in after each update chunk's state, on the same stream: the link's
 * to-device direction carries per chunk about what its to-host direction does. */
typedef struct {
    umt_tensor *parameter; /* NULL: nothing put off */
    int slot;
    size_t done;           /* bytes queued so far */
} umt_offload_deferred;

/* Elements of one CPU work item: large enough to amortise the queue's lock, small enough to
 * balance. A quarter of a million ran faster than a million, alone and beside the link
 * (docs/PERF.md, "Figures behind the comments"). */
#define UMT_OFFLOAD_CPU_CHUNK ((int64_t)1 << 18)

/* One array update for CPU threads: fn on [0, n) of each array, in pinned memory, in work items of
 * chunk elements (a whole number of the compute copy's rows: umt_offload_cpu_chunk); fusion's
 * lowp is where element 0's compute copy goes (each item's is found from it). */
typedef struct umt_offload_cpu_job {
    umt_offload_update_fn fn;
    const void *user;
    float *param, *grad, *state0, *state1;
    int64_t n;
    umt_update_fusion fusion;
    int64_t chunk;
} umt_offload_cpu_job;

/* UMT_OFFLOAD_OPTIM_BACKWARD with options.host_updates (offload/host.c): a streamed
 * parameter updated by CPU threads during backward, by the queue's threads (offload/host_queue.c)
 * once its gradient is home. One per such parameter, reused every step; the threads read only this. */
typedef struct {
    umt_optimizer_options options; /* as at the enqueue: the threads may run it after the step */
    int64_t step;
} umt_offload_host_rule;

/* A CPU update's work items in a few pieces of consecutive items. Its gradient comes home a
 * piece at a time and the threads start on a piece as soon as it is there; the next forward copies
 * the weights in a piece at a time, each as soon as its items are done. So the link and the
 * threads overlap within one layer, not only between layers: at backward's start the threads
 * need not wait for the whole first gradient, and the forward not for the whole last update. */
#define UMT_OFFLOAD_HOST_PIECES 8

/* The queue's fields (offload/host_queue.c) are read and written under its lock. */
typedef struct umt_offload_host_queue umt_offload_host_queue;
typedef struct {
    umt_tensor *parameter;
    umt_offload_cpu_job job;
    umt_offload_host_rule rule;
    umt_offload_host_queue *queue;
    uint32_t queued;              /* updates queued so far (this step's is the count streams wait for) */
    _Atomic uint32_t *finished;   /* pinned: updates finished so far, written by the CPU threads */
    int64_t items, handed_out, items_done; /* this update's work items: in all, given to threads, done */
    /* The pieces: piece k is items [k * piece_items, (k + 1) * piece_items), the last one shorter;
     * elements [k * piece_elements, (k + 1) * piece_elements) of each array */
    int pieces;
    int64_t piece_items, piece_elements;
    _Atomic uint32_t *pieces_home;    /* pinned: gradient pieces home so far, all updates, written by the
                                       * copy-out stream */
    uint32_t pieces_sent;             /* pieces whose write of pieces_home is queued so far */
    uint32_t arrival_base;            /* pieces_home's count before this update's pieces */
    _Atomic uint32_t *piece_finished; /* pinned, a word a piece: its items finished so far, all updates */
    double begin_us;     /* UMT_MEM_TRACE: when its first item began */
    atomic_int failed;
    uint16_t *grad_bf16; /* its gradient home in bf16 (offload pool), made at the first such update */
} umt_offload_host_job;

/* Piece k of a job's n elements (n: the parameter's): its first element, and (returned) how many. */
static inline int64_t umt_offload_piece(const umt_offload_host_job *job, int k, int64_t n, int64_t *first) {
    *first = k * job->piece_elements;
    return n - *first < job->piece_elements ? n - *first : job->piece_elements;
}

/* Where a saved activation is (offload/activations.c). */
typedef enum {
    UMT_ACTIVATION_RESIDENT, /* in the arena, as any activation (kept by the plan, or the last one) */
    UMT_ACTIVATION_LEAVING,  /* its copy out is queued; the arena bytes are still its own */
    UMT_ACTIVATION_AWAY,     /* data points at its pinned copy; the arena bytes are free for reuse */
    UMT_ACTIVATION_BACK,     /* copied into an arena buffer for backward (or on its way there) */
} umt_activation_state;

/* One saved activation of this forward, by order of discovery. home, capacity and the events
 * outlive the forward: the next one's activation of the same index (the next micro-batch's, the
 * next step's) reuses them. */
typedef struct {
    umt_tensor *tensor;
    size_t bytes;             /* this forward's: the tensor's */
    size_t capacity;          /* its pinned copy's: the largest the first step sent (its first micro-batch's) */
    void *home;               /* its pinned copy (offload pool) */
    void *arena;              /* its own bytes in the arena, for the view check */
    int first_node, group;    /* the earliest tape node that reads it; the node that sent it out */
    const char *op;           /* that node's op, for the plan and the trace */
    umt_activation_state state;
    bool offload;             /* the plan's decision (the first step: every one) */
    int buffer_slot;          /* the arena plan's slot of the buffer it came back to */
    void *left, *loaded;      /* events: copy out done (copy-out stream); copy in done (copy-in stream) */
} umt_offload_activation;

struct umt_offload {
    umt_context *ctx;
    umt_offload_options options;
    bool planned;
    umt_placement_plan plan;
    size_t slot_bytes;
    void *compute, *copy_in, *copy_out; /* CUDA streams (compute is the backend's) */
    void *update;                       /* UMT_OFFLOAD_OPTIM_BACKWARD: the updates' stream */
    void *updated;                      /* its event: the updates queued so far are done */
    void *state_in;                     /* UMT_OFFLOAD_OPTIM_BACKWARD: the state's copies in */
    void *homed;                        /* copy-out event: weights updated so far are home */
    void *gradient_final;               /* compute event: a resident parameter's gradient is final */
    void *update_ready;                 /* compute event at the update's start: backward done, its gradients
                                         * home, the step's decision made (what the CPU threads wait for) */
    umt_offload_ring_entry ring[UMT_OFFLOAD_RING_MAX_ENTRIES]; /* the plan's ring_entries in use */
    int ring_arrays;                    /* the plan's ring_arrays once the ring is made (0: no ring) */
    int ring_next;                      /* the entry the next chunk takes */
    umt_offload_deferred deferred;
    umt_offload_slot slots[2];
    int last_slot; /* the slot of the most recent acquire: the prefetch goes to the other one */
    /* The order parameters were acquired in during the first step, replayed as prefetches. */
    umt_offload_use *uses;
    int use_count, use_slots;
    bool recording, following;
    int next_use;
    /* The update */
    umt_offload_optimizer optimizer; /* where it runs now: auto until both have been timed */
    double update_start_s;
    bool update_used_gpu, update_used_cpu;
    bool slots_claimed; /* this update has evicted the slots to stream chunks through them */
    umt_offload_cpu_job *cpu_jobs;
    int cpu_job_count, cpu_job_slots;
    /* Updates in backward on the CPU (offload/host.c) */
    umt_offload_host_queue *host_queue; /* the threads that run them, newest gradient first */
    umt_offload_host_job **host_jobs; /* one per parameter so updated */
    int host_job_count, host_job_slots;
    int host_updates_this_step;
    int64_t host_elements_this_step;
    int64_t host_target_elements; /* UMT_OFFLOAD_HOST_AUTO: the CPU's share of a step's streamed elements */
    /* UMT_OFFLOAD_HOST_AUTO after the first step: the count searched on whole steps */
    bool host_searching;           /* the share's first step is done: the count comes from the search */
    umt_host_count_search host_search;
    int host_streamed;             /* streamed parameters: the most the CPU can take */
    int host_steps_at_count;       /* steps since the count was set */
    double host_count_ms;          /* the count's timed steps so far, summed */
    double host_last_end_s;        /* the last step's end, the compute stream drained */
    char host_search_log[256];     /* the counts timed, printed when the search settles */
    const umt_optimizer *attached; /* UMT_OFFLOAD_OPTIM_BACKWARD: the optimizer that updates in backward */
    /* Saved activations (options.activations, offload/activations.c) */
    umt_offload_activation *activations;
    int activation_count, activation_slots, activation_events; /* this step's; allocated; with events made */
    bool activations_planned;  /* stage 3 has run on the first step's activations */
    int activation_pending;    /* the LEAVING one whose arena bytes are freed at the next send, or -1 */
    bool in_backward;
    /* Gradients final since the last node's backward began: they go home (or update) in
     * after_op_backward, once every hook table has heard of them (offload/offload.h). */
    umt_tensor **finals;
    int final_count, final_slots;
    /* This step's optimizer decision (loss scaling, clipping), or NULL; the CPU threads' copy. */
    const umt_step_scalars *scalars;
    umt_step_scalars scalars_host;
    umt_offload_stats stats;
};

/* ----------------------------------------------------------------------------------------- */
/* Compute copies under bf16/fp16 (offload/compute_copy.c; their ranges: offload/copy_ranges.h) */

/* What crosses into a slot for p's forward and backward: its compute copy when that lives in the
 * offload tier (the master then stays home), else p itself. */
static inline umt_tensor *umt_offload_streamed(umt_tensor *p) {
    return p->lowp && p->lowp->offload.home ? p->lowp : p;
}
/* At the plan: p, offloaded, gets its compute copy home, converted from its master now. */
umt_status umt_offload_make_compute_copy(umt_offload *o, umt_tensor *p);
/* Before p's weights stream: a copy whose master was written from the host since
 * (tensor->lowp_stale) is converted again, and any slot holding the old one gives it up. */
umt_status umt_offload_refresh_compute_copy(umt_offload *o, umt_tensor *p);

/* Slot bookkeeping used by both files. */
umt_status umt_offload_evict(umt_offload *o, int s);
umt_status umt_offload_wait(void *stream, void *event);
umt_status umt_offload_record(void *event, void *stream);
/* A host <-> device copy on the copy-in or copy-out stream, counted in the stats and traced; the
 * same on a stream and track of the caller's choice. */
umt_status umt_offload_copy(umt_offload *o, void *dst, const void *src, size_t bytes, bool to_device, const char *what);
umt_status umt_offload_copy_on(umt_offload *o, void *stream, int track, void *dst, const void *src, size_t bytes,
                               bool to_device, const char *what);

/* p's optimizer state (the attached optimizer's). */
umt_status umt_offload_state_of(const umt_offload *o, const umt_tensor *p, umt_tensor *state[2]);

/* UMT_OFFLOAD_OPTIM_BACKWARD (offload/update.c): slot s's parameter, its gradient final, is
 * updated through the ring; the ring's entries are carved from one stream-pool buffer. */
umt_status umt_offload_update_in_slot(umt_offload *o, int s);
/* The same for p, resident on the GPU with state in the offload tier: updated in place, its state
 * through the ring (a no-op when its state is on the GPU too: the optimizer's step updates it). */
umt_status umt_offload_update_resident(umt_offload *o, umt_tensor *p);
/* Up to bytes more of the put-off weight load (SIZE_MAX: the rest); a no-op when none is. */
umt_status umt_offload_deferred_piece(umt_offload *o, size_t bytes);
umt_status umt_offload_make_ring(umt_offload *o);
double umt_offload_seconds(void);
/* A core is left to the thread that queues the GPU's work, which runs beside the CPU's updates. */
#define UMT_OFFLOAD_SPARE_CORES 1
/* offload/host.c: the optimizer's rule with the options and step of a job's umt_offload_host_rule (its `user`). */
umt_status umt_offload_host_rule_run(const void *user, const umt_backend *be, float *param, const float *grad,
                                     float *s0, float *s1, const umt_update_fusion *fusion, int64_t n);
/* offload/host_rate.c: the CPU threads' rate (elements/s) of the tier's update, timed alone on
 * pinned scratch arrays as long as `streamed` elements (bounded both ways); and the rates of the
 * CPU's update and the link alone and both at once (umt_offload_host_memory_measure). */
umt_status umt_offload_cpu_rate(umt_dtype copy, bool grad_bf16, int64_t streamed, double *rate);
umt_status umt_offload_host_memory(umt_offload *o, umt_host_memory_speed *out);
/* offload/link.c: the link copying `bytes` both ways, again and again, until *stop (*started once
 * its buffers are made); the GB/s it moved. */
umt_status umt_link_copy_until(umt_context *ctx, size_t bytes, atomic_int *started, const atomic_int *stop,
                               double *gbps);
/* CPU threads (one per core, less spare) run the jobs; false when one failed. No CUDA calls:
 * any thread may run it. A job's work items, and one of them run by the caller (false: failed);
 * the number of threads for all cores but spare. */
#define UMT_OFFLOAD_MAX_THREADS 64
bool umt_offload_cpu_threads(const umt_offload_cpu_job *jobs, int count, int spare);
int64_t umt_offload_cpu_items(const umt_offload_cpu_job *job);
bool umt_offload_cpu_item(const umt_offload_cpu_job *job, int64_t item);
int umt_offload_cpu_thread_count(int spare);
/* The CPU threads' work item for p's update (umt_offload_cpu_job.chunk). */
umt_status umt_offload_cpu_chunk(const umt_tensor *p, int64_t *chunk);
/* Slot s's gradient, final, goes home on the copy-out stream (its drained event after). The same
 * for a CPU update's job, in the job's pieces, its count of pieces home written after each
 * (umt_offload_queue_piece_home); with bf16, rounded to bf16 on the compute stream first, into
 * job->grad_bf16 (pinned). */
umt_status umt_offload_gradient_out(umt_offload *o, int s);
umt_status umt_offload_gradient_out_pieces(umt_offload *o, int s, umt_offload_host_job *job, bool bf16);

/* Updates in backward on the CPU (offload/host.c): at the plan, with UMT_OFFLOAD_HOST_AUTO,
 * the CPU's share from its measured rate and the link's (printed); slot s's parameter, its
 * gradient final, queued for CPU threads when it is one of them (the first such parameters of
 * each backward, as many as options.host_updates or the share says: *taken); a stream's
 * wait for p's last one (before a copy reads its weights); the step's end (a failed update is
 * reported); freeing the jobs, after umt_offload_queue_stop. */
umt_status umt_offload_host_plan(umt_offload *o, const umt_plan_item *items, umt_tensor *const *tensors, int count);
umt_status umt_offload_update_on_host(umt_offload *o, int s, bool *taken);
umt_status umt_offload_host_wait(umt_offload *o, void *stream, const umt_tensor *p);
/* p's streamed weights (umt_offload_streamed) from home to dst on the copy-in stream: a piece at a
 * time, each once the CPU's last update of it is done, where p has a CPU update; whole otherwise. */
umt_status umt_offload_host_copy_in(umt_offload *o, umt_tensor *p, void *dst);
umt_status umt_offload_host_step_end(umt_offload *o);
void umt_offload_host_destroy(umt_offload *o);

/* The CPU threads' queue of updates in backward (offload/host_queue.c): started at the first
 * (its threads, and a check that a stream can write a word of pinned memory and wait on one:
 * false, with the reason, where it cannot); on the copy-out stream after a gradient piece's copy,
 * the job's count of pieces home written; a job queued, its items run as their pieces come home;
 * a stream's wait for the job's last update; the host's; stopping (every queued job run first). */
umt_status umt_offload_queue_start(umt_offload *o, int spare);
umt_status umt_offload_queue_piece_home(umt_offload *o, umt_offload_host_job *job);
umt_status umt_offload_queue_job(umt_offload *o, umt_offload_host_job *job);
umt_status umt_offload_queue_stream_wait(umt_offload *o, void *stream, const umt_offload_host_job *job);
/* A stream's wait for the job's last update of piece k. */
umt_status umt_offload_queue_piece_wait(umt_offload *o, void *stream, const umt_offload_host_job *job, int k);
umt_status umt_offload_queue_host_wait(umt_offload *o, const umt_offload_host_job *job);
/* The queue's threads, and the thread-seconds they spent in work items so far (0, 0: no queue). */
void umt_offload_queue_usage(const umt_offload *o, int *threads, double *busy_s);
void umt_offload_queue_stop(umt_offload *o);

/* Saved activations (offload/activations.c): the step's start (after the first step: the
 * plan's stage 3), and freeing the events and pinned copies. */
umt_status umt_offload_activations_step_begin(umt_offload *o);
void umt_offload_activations_destroy(umt_offload *o);

#endif /* UMT_OFFLOAD_STATE_H */
