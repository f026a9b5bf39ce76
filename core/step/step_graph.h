/*
 * core/step/step_graph.h — a step graph's state and the pieces of its run, shared with the file
 * that captures several contexts' steps as one graph (core/step/step_group.c). Callers use the
 * public calls of include/umtrain.h.
 */
#ifndef UMT_CORE_STEP_STEP_GRAPH_H
#define UMT_CORE_STEP_STEP_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/hooks.h"
#include "umtrain.h"

/* Eager steps after an invalidation before a capture: the first may still move the arena. */
#define UMT_STEP_GRAPH_WARMUP_STEPS 2

/* The addresses a captured graph depends on. */
typedef struct {
    const void *arena, *workspace, *branch_workspace, *values;
    size_t input_bytes;
    bool training;
} umt_step_graph_baked;

struct umt_step_graph {
    umt_context *ctx;
    bool capture;
    const char *off_reason; /* capture off for good, and why (off_text), or NULL */
    char off_text[256];
    void *exec;             /* cudaGraphExec_t, NULL when none is captured */
    umt_step_graph_baked baked;
    int warm_steps; /* eager steps since the graph was last dropped */
    int64_t begun_at_launch; /* ctx->steps_begun at the last launch: a replay begins no step */
    umt_tensor *loss, *loss_sum;
    int64_t loss_count;
    bool told_batch, told_moved;
    /* The capture left out fills of consumed gradients (core/tape.h): replay only while they are
     * still zero (umt_grads_zeroed_for_replay), else run the step eagerly */
    bool needs_zeroed_grads;
    umt_step_graph_stats stats;
    umt_hooks hooks; /* this graph's own table: collectives_end */
};

/* One eager step, its loss kept (copied into the graph's loss, added to its sum). */
umt_status umt_step_graph_eager(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                size_t input_bytes);
/* The step run once (inside a capture too), its loss kept (copied into the graph's loss, added to
 * its sum): by the optimizer's decision when it reads that loss (ctx->loss_keep), else by a kernel
 * after the step's. */
umt_status umt_step_graph_run_step(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                   size_t input_bytes);
/* What a graph of ctx's step would bake in now; whether g's graph baked in the same. */
umt_step_graph_baked umt_step_graph_baked_now(const umt_context *ctx, size_t input_bytes);
bool umt_step_graph_same_memory(const umt_step_graph *g, size_t input_bytes);
/* Whether g's graph may replay now as far as gradients go: it filled them itself, or those it left
 * unfilled are still zero (core/tape.h). Otherwise the step runs eagerly, the graph kept. */
bool umt_step_graph_grads_ready(const umt_step_graph *g);
/* CUDA: a captured cudaGraph_t made ready to launch (cudaGraphExec_t), or NULL with the reason
 * (who names the caller); an executable graph freed under the capture lock (NULL is a no-op). */
void *umt_step_graph_instantiate(void *captured, const char *who);
void umt_step_graph_exec_destroy(void *exec);

#endif /* UMT_CORE_STEP_STEP_GRAPH_H */
