/*
 * core/step/step_group.c — several contexts' training steps captured as one CUDA graph.
 *
 * A sweep trains N small models on one GPU. Each one's step at batch 64 is a few dozen kernels
 * of a few blocks: the GPU could run N of them side by side, but launched as N graphs from N
 * host threads they overlap little (docs/PERF.md, the sweep). A group captures every member's
 * step into one graph with a branch per member: the capture starts on the first member's stream,
 * each other member's stream joins it through an event (fork), records its step there, and is
 * joined back (join). One launch then runs every step, and the GPU schedules the branches itself.
 *
 *     origin ──fork──┬── member 0's step ──────────────┬── end
 *                    ├── member 1's step (its stream) ──┤
 *                    └── member 2's step (its stream) ──┘
 *
 * Each branch is its member's step, kernel for kernel as the member's own graph would hold it, on
 * its own context's state: each member trains as it would alone, bit for bit.
 *
 * The rest is each member's step graph's (core/step/step_graph.c): its values are recorded at
 * the capture and remade at each replay, on its own stream, which the launch waits for; its loss
 * is kept on the device. What differs: one member whose memory moved or whose input changed
 * size makes every member's step run eagerly, and the group is captured again after the
 * warm-up; where a group cannot capture at all (the CPU, a member's graph off, collectives, a
 * failed capture) each member runs its own step graph, said once.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/step/step_graph.h"
#include "core/step_values.h"
#include "core/tape.h"

#ifdef UMT_WITH_CUDA
#include "core/base/capture_lock.h"
#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

struct umt_step_group {
    umt_step_graph **members;
    int count;
    bool capture;
    const char *off_reason; /* the group captures no more, and why (off_text): members run alone */
    char off_text[256];
    void *exec;             /* cudaGraphExec_t, NULL when none is captured */
    int warm_steps;         /* eager steps since the graph was last dropped */
    void *fork, *joined;    /* events on the first member's stream: the start, the launch's end */
    void **events;          /* per member: its stream's end of the step (the capture's join) or of
                             * its values' copy (before a launch) */
    bool told_moved;
    umt_step_graph_stats stats;
};

static umt_status eager_all(umt_step_group *g, umt_step_fn step, void *const *users, const void *const *inputs,
                            const size_t *input_bytes) {
    for (int i = 0; i < g->count; ++i)
        UMT_TRY(umt_step_graph_eager(g->members[i], step, users[i], inputs[i], input_bytes[i]));
    g->stats.eager_steps++;
    return UMT_OK;
}

static void turn_off(umt_step_group *g, const char *why) {
    snprintf(g->off_text, sizeof g->off_text, "%s", why);
    g->off_reason = g->off_text;
    fprintf(stderr, "umtrain: step group off, each member runs its own step graph: %s\n", why);
}

#ifdef UMT_WITH_CUDA
/* ----------------------------------------------------------------------------------------- */
/* Capture */

static cudaStream_t stream_of(const umt_step_graph *m) {
    umt_device_bind(m->ctx);
    return umt_cuda_stream();
}

static void drop_graph(umt_step_group *g) {
    umt_step_graph_exec_destroy(g->exec);
    g->exec = NULL;
    g->warm_steps = 0;
}

/* Member i's step on its own stream, which joins the capture at the fork and is joined back. */
static umt_status record_branch(umt_step_group *g, int i, cudaStream_t origin, umt_step_fn step, void *user,
                                const void *input, size_t input_bytes) {
    umt_step_graph *m = g->members[i];
    cudaStream_t stream = stream_of(m);
    if (i) UMT_CUDA_TRY(cudaStreamWaitEvent(stream, (cudaEvent_t)g->fork, 0));
    UMT_TRY(umt_step_graph_run_step(m, step, user, input, input_bytes));
    if (!i) return UMT_OK;
    UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)g->events[i], stream));
    UMT_CUDA_TRY(cudaStreamWaitEvent(origin, (cudaEvent_t)g->events[i], 0));
    return UMT_OK;
}

/* Every member's step once under one capture; *graph NULL when it failed (status says why). */
static umt_status record(umt_step_group *g, umt_step_fn step, void *const *users, const void *const *inputs,
                         const size_t *input_bytes, cudaGraph_t *graph) {
    *graph = NULL;
    int begun = 0;
    umt_status status = UMT_OK;
    while (begun < g->count && status == UMT_OK)
        if ((status = umt_step_values_record_begin(g->members[begun]->ctx, inputs[begun], input_bytes[begun])) ==
            UMT_OK)
            begun++;
    cudaStream_t origin = stream_of(g->members[0]);
    /* Thread-local: a forbidden call (an allocation, a wait) in this thread ends the capture. */
    cudaError_t began = status == UMT_OK ? cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal)
                                         : cudaErrorNotReady;
    if (status == UMT_OK && began != cudaSuccess)
        status = umt_fail(UMT_ERR_DEVICE, "step group: cudaStreamBeginCapture: %s", cudaGetErrorString(began));
    if (status == UMT_OK && cudaEventRecord((cudaEvent_t)g->fork, origin) != cudaSuccess)
        status = umt_fail(UMT_ERR_DEVICE, "step group: the capture's fork could not be recorded");
    for (int i = 0; i < g->count && status == UMT_OK; ++i)
        status = record_branch(g, i, origin, step, users[i], inputs[i], input_bytes[i]);
    if (began == cudaSuccess) {
        cudaError_t ended = cudaStreamEndCapture(origin, graph);
        if (status == UMT_OK && ended != cudaSuccess)
            status = umt_fail(UMT_ERR_DEVICE, "step group: the capture failed: %s", cudaGetErrorString(ended));
    }
    for (int i = 0; i < begun; ++i) umt_step_values_record_end(g->members[i]->ctx);
    if (status != UMT_OK && *graph) cudaGraphDestroy(*graph);
    if (status != UMT_OK) *graph = NULL;
    (void)cudaGetLastError(); /* a refused call inside the capture leaves its error behind */
    return status;
}

/* The captured graph, ready to launch, or NULL (the reason in umt_last_error). Under the
 * capture lock from the capture's start to the instantiation, as a single step graph. */
static cudaGraphExec_t capture(umt_step_group *g, umt_step_fn step, void *const *users, const void *const *inputs,
                               const size_t *input_bytes) {
    cudaGraph_t graph;
    umt_capture_lock();
    umt_status status = record(g, step, users, inputs, input_bytes, &graph);
    for (int i = 0; i < g->count && status == UMT_OK; ++i)
        if (g->members[i]->ctx->values.unreplayable)
            status = umt_fail(UMT_ERR_UNSUPPORTED, "%s", g->members[i]->ctx->values.unreplayable);
    cudaGraphExec_t exec = status == UMT_OK ? umt_step_graph_instantiate(graph, "step group") : NULL;
    if (graph) cudaGraphDestroy(graph);
    umt_capture_unlock();
    return exec;
}

/* ----------------------------------------------------------------------------------------- */
/* Launch and replay */

/* One launch: after every member's values are copied (each on its own stream), and before
 * anything a member queues next on its stream. */
static umt_status launch(umt_step_group *g) {
    cudaStream_t origin = stream_of(g->members[0]);
    for (int i = 1; i < g->count; ++i) {
        UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)g->events[i], stream_of(g->members[i])));
        UMT_CUDA_TRY(cudaStreamWaitEvent(origin, (cudaEvent_t)g->events[i], 0));
    }
    for (int i = 0; i < g->count; ++i) UMT_TRY(umt_hooks_before_graph_launch(g->members[i]->ctx));
    umt_device_bind(g->members[0]->ctx);
    UMT_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, origin));
    UMT_CUDA_TRY(cudaEventRecord((cudaEvent_t)g->joined, origin));
    for (int i = 1; i < g->count; ++i)
        UMT_CUDA_TRY(cudaStreamWaitEvent(stream_of(g->members[i]), (cudaEvent_t)g->joined, 0));
    g->stats.replayed_steps++;
    for (int i = 0; i < g->count; ++i) {
        umt_step_graph *m = g->members[i];
        m->begun_at_launch = m->ctx->steps_begun;
        m->stats.replayed_steps++;
        m->loss_count++;
        UMT_TRY(umt_hooks_after_graph_launch(m->ctx));
    }
    return UMT_OK;
}

/* Captures every member's step and runs it. UMT_OK with g->exec NULL: the capture failed, nothing
 * ran (the members' host effects are taken back), the group is off, and the caller runs the
 * step eagerly. */
static umt_status capture_and_launch(umt_step_group *g, umt_step_fn step, void *const *users,
                                     const void *const *inputs, const size_t *input_bytes) {
    umt_rng *rngs = malloc((size_t)g->count * sizeof *rngs); /* each member's, to take the capture back */
    if (!rngs) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "step group: no memory for %d generators' states", g->count);
    for (int i = 0; i < g->count; ++i) rngs[i] = g->members[i]->ctx->rng;
    cudaGraphExec_t exec = capture(g, step, users, inputs, input_bytes);
    if (!exec) {
        for (int i = 0; i < g->count; ++i) {
            g->members[i]->ctx->rng = rngs[i];
            umt_step_values_undo(g->members[i]->ctx);
            umt_grads_forget_zeroed(g->members[i]->ctx); /* the fills it queued never ran */
        }
        turn_off(g, umt_last_error());
    }
    free(rngs);
    if (!exec) return UMT_OK;
    g->exec = exec;
    g->stats.captures++;
    for (int i = 0; i < g->count; ++i) {
        umt_step_graph *m = g->members[i];
        m->baked = umt_step_graph_baked_now(m->ctx, input_bytes[i]);
        m->needs_zeroed_grads = m->ctx->values.skipped_zero_fill;
        UMT_TRY(umt_step_values_flush(m->ctx));
    }
    return launch(g);
}

static umt_status replay(umt_step_group *g, const void *const *inputs) {
    for (int i = 0; i < g->count; ++i) UMT_TRY(umt_step_values_replay(g->members[i]->ctx, inputs[i]));
    return launch(g);
}

/* Whether the graph still fits every member's step; says once why it does not. */
static bool still_fits(umt_step_group *g, const size_t *input_bytes) {
    for (int i = 0; i < g->count; ++i) {
        const umt_step_graph *m = g->members[i];
        if (input_bytes[i] != m->baked.input_bytes) return false; /* an epoch's last batch: eager, kept */
        if (!umt_step_graph_grads_ready(m)) return false; /* eager, kept */
        if (umt_step_graph_same_memory(m, input_bytes[i])) continue;
        if (!g->told_moved)
            fprintf(stderr, "umtrain: step group: memory member %d's step baked in moved (an evaluation ran "
                    "since?): capturing again\n", i);
        g->told_moved = true;
        drop_graph(g);
        return false;
    }
    return true;
}
#endif

/* ----------------------------------------------------------------------------------------- */
/* The calls */

umt_status umt_step_group_run(umt_step_group *g, umt_step_fn step, void *const *users, const void *const *inputs,
                              const size_t *input_bytes) {
    if (!g || !step || !users || !inputs || !input_bytes)
        return umt_fail_null("umt_step_group_run", !g ? "group" : !step ? "step" : !users ? "users"
                                                   : !inputs ? "inputs" : "input_bytes");
    if (!g->capture || g->off_reason) {
        for (int i = 0; i < g->count; ++i)
            UMT_TRY(umt_step_graph_run(g->members[i], step, users[i], inputs[i], input_bytes[i]));
        return UMT_OK;
    }
#ifdef UMT_WITH_CUDA
    if (g->exec && still_fits(g, input_bytes)) return replay(g, inputs);
    if (!g->exec && g->warm_steps >= UMT_STEP_GRAPH_WARMUP_STEPS) {
        UMT_TRY(capture_and_launch(g, step, users, inputs, input_bytes));
        if (g->exec) return UMT_OK;
    }
    if (!g->exec) g->warm_steps++;
#endif
    return eager_all(g, step, users, inputs, input_bytes);
}

/* Why the group cannot capture (NULL: it can): every member's graph must be able to. */
static const char *why_not(umt_step_graph *const *graphs, int count) {
    for (int i = 0; i < count; ++i) {
        if (!graphs[i]->capture) return "a member's step graph was made without capture (or on the CPU)";
        if (graphs[i]->off_reason) return graphs[i]->off_reason;
        if (umt_hooks_collective(graphs[i]->ctx)) return "a member's steps hold collectives (data parallelism)";
        for (int j = 0; j < i; ++j)
            if (graphs[j]->ctx == graphs[i]->ctx) return "two members share one context";
    }
    return NULL;
}

static umt_status make_events(umt_step_group *g) {
#ifdef UMT_WITH_CUDA
    umt_device_bind(g->members[0]->ctx);
    unsigned flags = cudaEventDisableTiming;
    UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&g->fork, flags));
    UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&g->joined, flags));
    for (int i = 1; i < g->count; ++i) UMT_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&g->events[i], flags));
#else
    (void)g;
#endif
    return UMT_OK;
}

umt_status umt_step_group_create(umt_step_graph *const *graphs, int count, umt_step_group **out) {
    if (!graphs || !out) return umt_fail_null("umt_step_group_create", graphs ? "out" : "graphs");
    *out = NULL;
    if (count < 1) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_step_group_create: count %d (expected 1 or more)",
                                   count);
    for (int i = 0; i < count; ++i)
        if (!graphs[i]) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_step_group_create: graphs[%d] is NULL", i);
    umt_step_group *g = calloc(1, sizeof *g);
    if (g) g->members = malloc((size_t)count * sizeof *g->members);
    if (g && g->members) g->events = calloc((size_t)count, sizeof *g->events);
    if (!g || !g->members || !g->events) {
        umt_step_group_destroy(g);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_step_group_create: no memory for a group of %d", count);
    }
    for (int i = 0; i < count; ++i) g->members[i] = graphs[i];
    g->count = count;
    const char *why = why_not(graphs, count);
    g->capture = why == NULL;
    /* No capture at all is the members' own choice (eager, or the CPU): said only where it is not. */
    if (why && graphs[0]->capture) turn_off(g, why);
    umt_status st = g->capture ? make_events(g) : UMT_OK;
    if (st != UMT_OK) {
        umt_step_group_destroy(g);
        return st;
    }
    *out = g;
    return UMT_OK;
}

umt_step_graph_stats umt_step_group_stats_get(const umt_step_group *g) {
    if (!g) return umt_fail_null("umt_step_group_stats_get", "group"), (umt_step_graph_stats){0};
    return g->stats;
}

const char *umt_step_group_off_reason(const umt_step_group *g) {
    if (!g) return umt_fail_null("umt_step_group_off_reason", "group"), NULL;
    return g->off_reason;
}

void umt_step_group_destroy(umt_step_group *g) {
    if (!g) return;
#ifdef UMT_WITH_CUDA
    drop_graph(g);
    if (g->fork) cudaEventDestroy((cudaEvent_t)g->fork);
    if (g->joined) cudaEventDestroy((cudaEvent_t)g->joined);
    for (int i = 1; g->events && i < g->count; ++i)
        if (g->events[i]) cudaEventDestroy((cudaEvent_t)g->events[i]);
#endif
    free(g->events);
    free(g->members);
    free(g);
}
