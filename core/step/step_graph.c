/*
 * core/step/step_graph.c — a whole training step captured once as a CUDA graph and replayed.
 *
 * A small network's step is a few dozen short kernels; launching them one by one costs the
 * host more time than the GPU spends on them. Once the tape is static and the activation arena
 * planned, every step launches the same kernels on the same addresses, so the step is captured
 * (cudaStreamBeginCapture on the compute stream, the step function run once, EndCapture) and
 * each later step is one cudaGraphLaunch.
 *
 * What a replay must see change, it reads from device memory the host fills before the launch:
 * the step's values (core/step_values.h: the batch indices, the dropout seeds, the learning
 * rate), copied in one queued copy from a pinned slot. The fp16 loss scale already lives in the
 * optimizer's step scalars on the device. The host work of a step (RNG draws, the optimizer's
 * step count) is redone from the capture's records.
 *
 * A graph bakes in addresses: it is replayed only while the activation arena, the convolution
 * workspaces (the compute stream's and the side stream's, core/branch.h) and the step values'
 * block are where they were at capture, the input has the
 * captured size, and the training mode is the same. Otherwise the step runs eagerly; after two
 * eager steps (the arena settles at the second) the graph is captured again.
 *
 * Every step, eager or replayed, also copies its loss into the graph's own tensor and adds it
 * to a sum on the device, so that the caller reads losses when it wants, not once per step. The
 * optimizer's decision does it when it reads the loss anyway (its non-finite check), else a
 * kernel after the step (umt_step_graph_run_step).
 *
 * Collectives (data parallelism: a subsystem with graph_agree on the hook table, core/hooks.h).
 * The step's all-reduces are captured with it (NCCL allows it), but NCCL requires that every
 * rank capture at the same step, and then replay or run eagerly at the same steps. What decides
 * is the same on every rank by the caller's contract (the same steps, each with an input of the
 * same size: the global batch, of which each rank takes its part) except what is local: whether
 * the capture worked, and whether memory it baked in moved. Those are agreed with the other ranks
 * (graph_agree), at the capture and at the first run after steps ran on the host (an evaluation,
 * an eager step): the only runs at which memory can have moved, reached by every rank together.
 * Around each launch the subsystems hear of it (its watchdog follows the replay's collectives).
 * A graph holding collectives keeps NCCL's communicator from being destroyed, so each graph has
 * a table of its own on the hook table and drops its capture when they end (collectives_end).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/step/step_graph.h"
#include "core/step_values.h"
#include "core/tape.h"
#include "core/tensor.h"

#ifdef UMT_WITH_CUDA
#include "core/base/capture_lock.h"
#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

/* ----------------------------------------------------------------------------------------- */
/* The loss, kept on the device */

/* The keeping alone: the loss copied into the graph's loss and added to its sum. */
static umt_status keep_loss(umt_step_graph *g, const umt_tensor *loss) {
    if (loss->numel != 1 || loss->dtype != UMT_F32)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_step_graph_run: the step returned %lld elements of %s "
                        "(expected one f32 loss)", (long long)loss->numel, umt_dtype_name(loss->dtype));
    return umt_kernels(g->ctx)->f32.keep_and_add(g->loss->data, g->loss_sum->data, loss->data, 1);
}

umt_status umt_step_graph_run_step(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                   size_t input_bytes) {
    umt_context *ctx = g->ctx;
    ctx->loss_keep.last = g->loss->data;
    ctx->loss_keep.sum = g->loss_sum->data;
    ctx->loss_keep.kept_for = NULL;
    umt_tensor *loss = step(ctx, user, input, input_bytes);
    const float *kept_for = ctx->loss_keep.kept_for;
    memset(&ctx->loss_keep, 0, sizeof ctx->loss_keep);
    if (!loss) return umt_last_status();
    if (kept_for == loss->data) return UMT_OK;
    /* The decision kept another loss than the step returns: the sum as it was before, then this
     * one kept as usual. */
    float *sum = g->loss_sum->data;
    if (kept_for) UMT_TRY(umt_kernels(ctx)->f32.copy(sum, sum + 1, sizeof *sum));
    return keep_loss(g, loss);
}

umt_status umt_step_graph_eager(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                size_t input_bytes) {
    UMT_TRY(umt_step_graph_run_step(g, step, user, input, input_bytes));
    g->stats.eager_steps++;
    g->loss_count++;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Capture and replay */

#ifdef UMT_WITH_CUDA
umt_step_graph_baked umt_step_graph_baked_now(const umt_context *ctx, size_t input_bytes) {
    const umt_pool_state *arena = &ctx->memory.pools[UMT_POOL_ACTIVATIONS];
    return (umt_step_graph_baked){
        .arena = arena->block_count ? arena->blocks[0].ptr : NULL,
        .workspace = ctx->conv_workspace,
        .branch_workspace = ctx->branch.workspace,
        .values = umt_step_values_device_block(ctx),
        .input_bytes = input_bytes,
        .training = ctx->training,
    };
}

static void turn_off(umt_step_graph *g, const char *why) {
    snprintf(g->off_text, sizeof g->off_text, "%s", why);
    g->off_reason = g->off_text;
    fprintf(stderr, "umtrain: step graph off, every step runs eagerly: %s\n", why);
}

void umt_step_graph_exec_destroy(void *exec) {
    umt_capture_lock(); /* it frees the graph's device memory (core/base/capture_lock.h) */
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
    umt_capture_unlock();
}

void *umt_step_graph_instantiate(void *captured, const char *who) {
    cudaGraphExec_t exec = NULL;
    /* Each kernel keeps the priority of the stream it was captured from (the compute stream's
     * above the side stream's: kernels/cuda/backend.cu). */
    cudaError_t made = cudaGraphInstantiate(&exec, (cudaGraph_t)captured, cudaGraphInstantiateFlagUseNodePriority);
    if (made != cudaSuccess) {
        exec = NULL;
        umt_fail(UMT_ERR_DEVICE, "%s: cudaGraphInstantiate: %s", who, cudaGetErrorString(made));
    }
    return exec;
}

static void drop_graph(umt_step_graph *g) {
    umt_step_graph_exec_destroy(g->exec);
    g->exec = NULL;
    g->warm_steps = 0;
}

/* The step run once under capture; *graph is NULL when the capture failed (status says why
 * when the step itself failed). */
static umt_status record(umt_step_graph *g, umt_step_fn step, void *user, const void *input, size_t input_bytes,
                         cudaGraph_t *graph) {
    umt_context *ctx = g->ctx;
    umt_device_bind(ctx);
    cudaStream_t stream = umt_cuda_stream();
    *graph = NULL;
    UMT_TRY(umt_step_values_record_begin(ctx, input, input_bytes));
    /* Thread-local: a forbidden call (an allocation, a wait) in this thread ends the capture. */
    cudaError_t began = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (began != cudaSuccess) umt_step_values_record_end(ctx);
    UMT_CUDA_TRY(began);
    umt_status status = umt_step_graph_run_step(g, step, user, input, input_bytes);
    cudaError_t ended = cudaStreamEndCapture(stream, graph);
    umt_step_values_record_end(ctx);
    if (status == UMT_OK && ended != cudaSuccess) {
        *graph = NULL;
        status = umt_fail(UMT_ERR_DEVICE, "step graph: the capture failed: %s", cudaGetErrorString(ended));
    }
    if (status != UMT_OK && *graph) {
        cudaGraphDestroy(*graph);
        *graph = NULL;
    }
    /* A refused call inside the capture leaves its error for the next check: clear it. */
    (void)cudaGetLastError();
    return status;
}

/* The captured graph, ready to launch; NULL (and the reason recorded) when it is not. From the
 * capture's start to the graph's instantiation, no other thread's allocation, free or new handle
 * may act on the device: the capture lock (core/base/capture_lock.h). */
static cudaGraphExec_t capture(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                               size_t input_bytes) {
    cudaGraph_t graph;
    umt_capture_lock();
    umt_status status = record(g, step, user, input, input_bytes, &graph);
    if (status == UMT_OK && g->ctx->values.unreplayable)
        status = umt_fail(UMT_ERR_UNSUPPORTED, "%s", g->ctx->values.unreplayable);
    cudaGraphExec_t exec = status == UMT_OK ? umt_step_graph_instantiate(graph, "step graph") : NULL;
    if (graph) cudaGraphDestroy(graph);
    umt_capture_unlock();
    return exec;
}

/* One launch of the captured step, between the subsystems' two launch events. */
static umt_status launch(umt_step_graph *g) {
    UMT_TRY(umt_hooks_before_graph_launch(g->ctx));
    umt_device_bind(g->ctx);
    UMT_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, umt_cuda_stream()));
    g->begun_at_launch = g->ctx->steps_begun;
    g->stats.replayed_steps++;
    g->loss_count++;
    return umt_hooks_after_graph_launch(g->ctx);
}

/* With collectives in the step, every rank must have its capture: *exec stays only when all do.
 * The reason of a failure here is kept in reason (the agreement may write messages of its own). */
static umt_status agree_on_capture(umt_step_graph *g, cudaGraphExec_t *exec, char *reason, size_t size) {
    if (!umt_hooks_collective(g->ctx)) return UMT_OK;
    bool all = *exec != NULL;
    if (!all) snprintf(reason, size, "%s", umt_last_error());
    umt_status agreed = umt_hooks_graph_agree(g->ctx, &all);
    if (agreed == UMT_OK && all) return UMT_OK;
    if (*exec) {
        cudaGraphExecDestroy(*exec);
        *exec = NULL;
        snprintf(reason, size, "another rank could not capture its step (it says why)");
    }
    return agreed;
}

/* Captures the step and runs it (its values are in the slot already). UMT_OK with g->exec NULL:
 * the capture failed (here, or with collectives on another rank), nothing ran, and the caller
 * runs the step eagerly. */
static umt_status capture_and_launch(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                     size_t input_bytes) {
    umt_context *ctx = g->ctx;
    umt_rng rng = ctx->rng;
    cudaGraphExec_t exec = capture(g, step, user, input, input_bytes);
    char reason[256] = "";
    UMT_TRY(agree_on_capture(g, &exec, reason, sizeof reason));
    if (!exec) {
        /* Nothing of the step ran: its host effects are taken back (the zero fills it queued
         * never ran), and it runs eagerly. */
        ctx->rng = rng;
        umt_step_values_undo(ctx);
        umt_grads_forget_zeroed(ctx);
        turn_off(g, reason[0] ? reason : umt_last_error());
        return UMT_OK;
    }
    g->exec = exec;
    g->needs_zeroed_grads = ctx->values.skipped_zero_fill;
    g->baked = umt_step_graph_baked_now(ctx, input_bytes);
    g->stats.captures++;
    UMT_TRY(umt_step_values_flush(ctx));
    return launch(g);
}

static umt_status replay(umt_step_graph *g, const void *input) {
    UMT_TRY(umt_step_values_replay(g->ctx, input));
    return launch(g);
}

bool umt_step_graph_grads_ready(const umt_step_graph *g) {
    return !g->needs_zeroed_grads || umt_grads_zeroed_for_replay(g->ctx);
}

/* Whether the memory the graph baked in is where it was, and the training mode the same. */
bool umt_step_graph_same_memory(const umt_step_graph *g, size_t input_bytes) {
    umt_step_graph_baked now = umt_step_graph_baked_now(g->ctx, input_bytes);
    return now.arena == g->baked.arena && now.workspace == g->baked.workspace &&
           now.branch_workspace == g->baked.branch_workspace && now.values == g->baked.values &&
           now.training == g->baked.training;
}

/* Whether the graph still fits this step (*fits); says once why it does not. With collectives the
 * ranks agree where memory can have moved (the file's comment), and only there. */
static umt_status still_fits(umt_step_graph *g, size_t input_bytes, bool *fits) {
    *fits = false;
    if (input_bytes != g->baked.input_bytes) {
        if (!g->told_batch)
            fprintf(stderr, "umtrain: step graph: a step of %zu input bytes (captured: %zu) runs eagerly\n",
                    input_bytes, g->baked.input_bytes);
        g->told_batch = true;
        return UMT_OK;
    }
    bool here = umt_step_graph_same_memory(g, input_bytes), collective = umt_hooks_collective(g->ctx);
    if (collective && g->ctx->steps_begun != g->begun_at_launch) {
        UMT_TRY(umt_hooks_graph_agree(g->ctx, &here));
    } else if (collective && !here) {
        /* Moved with no step run since the last launch: the other ranks cannot know, and a rank
         * that ran its step eagerly while they replay would break NCCL's rule. */
        return umt_fail(UMT_ERR_STATE, "step graph: memory it baked in moved with no step run since its last replay "
                        "(a tensor of the activations pool made between steps?): with collectives in the graph every "
                        "rank must capture again at the same step");
    }
    *fits = here;
    if (here) return UMT_OK;
    if (!g->told_moved)
        fprintf(stderr, "umtrain: step graph: memory it baked in moved%s (an evaluation ran since?): capturing again\n",
                collective ? " on some rank" : "");
    g->told_moved = true;
    drop_graph(g);
    return UMT_OK;
}
#endif

umt_status umt_step_graph_run(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                              size_t input_bytes) {
    if (!g || !step || (!input && input_bytes))
        return umt_fail_null("umt_step_graph_run", !g ? "graph" : !step ? "step" : "input");
#ifdef UMT_WITH_CUDA
    if (g->capture && !g->off_reason) {
        bool fits = false;
        if (g->exec) UMT_TRY(still_fits(g, input_bytes, &fits));
        /* A gradient written since the last update (an eager backward, a host write): this step
         * fills it, eagerly; the graph stays for the next. */
        if (fits && !umt_step_graph_grads_ready(g)) return umt_step_graph_eager(g, step, user, input, input_bytes);
        if (fits) return replay(g, input);
        if (!g->exec && g->warm_steps >= UMT_STEP_GRAPH_WARMUP_STEPS) {
            UMT_TRY(capture_and_launch(g, step, user, input, input_bytes));
            if (g->exec) return UMT_OK;
        }
        if (!g->exec) g->warm_steps++;
    }
#endif
    return umt_step_graph_eager(g, step, user, input, input_bytes);
}

/* ----------------------------------------------------------------------------------------- */
/* Creation, reading, destruction */

#ifdef UMT_WITH_CUDA
/* The communicator whose collectives the graph may hold is about to go: the next capture (after
 * the warm-up) holds none of them. */
static void on_collectives_end(umt_context *ctx, void *self) {
    (void)ctx;
    drop_graph(self);
}
#endif

static void release(void *object) {
    umt_step_graph *g = object;
    umt_hooks_unregister(g->ctx, &g->hooks);
#ifdef UMT_WITH_CUDA
    drop_graph(g);
#endif
    umt_tensor_free(g->loss);
    umt_tensor_free(g->loss_sum);
    free(g);
}

umt_status umt_step_graph_create(umt_context *ctx, bool capture, umt_step_graph **out) {
    if (!ctx || !out)
        return umt_fail_null("umt_step_graph_create", ctx ? "out" : "ctx");
    *out = NULL;
    umt_step_graph *g = calloc(1, sizeof *g);
    if (!g) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_step_graph_create: no memory for the graph");
    g->ctx = ctx;
    /* CUDA graphs exist on CUDA only; elsewhere the same calls run every step eagerly. */
    g->capture = capture && ctx->options.device == UMT_DEVICE_CUDA;
    int64_t one[1] = {1};
    /* Next to the optimizer's step scalars: small state the step leaves for the host. */
    g->loss = umt_tensor_alloc(ctx, UMT_POOL_OPTIM, UMT_F32, 1, one);
    /* The sum, then the sum before the last step's loss was added (ctx->loss_keep). */
    g->loss_sum = g->loss ? umt_tensor_alloc(ctx, UMT_POOL_OPTIM, UMT_F32, 1, (int64_t[]){2}) : NULL;
    umt_status st = g->loss_sum ? umt_kernels(ctx)->f32.fill(g->loss_sum->data, 1, 0.0f) : umt_last_status();
    if (st == UMT_OK) st = umt_kernels(ctx)->f32.fill(g->loss->data, 1, 0.0f);
#ifdef UMT_WITH_CUDA
    g->hooks = (umt_hooks){.name = "step graph", .collectives_end = on_collectives_end};
    if (st == UMT_OK && g->capture) st = umt_hooks_register(ctx, &g->hooks, g);
#endif
    if (st == UMT_OK) st = umt_context_own(ctx, g, release);
    if (st != UMT_OK) {
        release(g);
        return st;
    }
    *out = g;
    return UMT_OK;
}

const umt_tensor *umt_step_graph_loss(const umt_step_graph *g) {
    if (!g) return umt_fail_null("umt_step_graph_loss", "graph"), NULL;
    return g->loss;
}

umt_status umt_step_graph_take_mean_loss(umt_step_graph *g, double *mean, int64_t *steps) {
    if (!g || !mean || !steps)
        return umt_fail_null("umt_step_graph_take_mean_loss", !g ? "graph" : !mean ? "mean" : "steps");
    float sum = 0;
    UMT_TRY(umt_tensor_get_f32(g->loss_sum, 0, &sum));
    *steps = g->loss_count;
    *mean = g->loss_count ? (double)sum / (double)g->loss_count : 0.0;
    g->loss_count = 0;
    return umt_kernels(g->ctx)->f32.fill(g->loss_sum->data, 1, 0.0f);
}

umt_step_graph_stats umt_step_graph_stats_get(const umt_step_graph *g) {
    if (!g) return umt_fail_null("umt_step_graph_stats_get", "graph"), (umt_step_graph_stats){0};
    return g->stats;
}

const char *umt_step_graph_off_reason(const umt_step_graph *g) {
    if (!g) return umt_fail_null("umt_step_graph_off_reason", "graph"), NULL;
    return g->off_reason;
}

void umt_step_graph_destroy(umt_step_graph *g) {
    if (!g) return;
    umt_context_disown(g->ctx, g);
    release(g);
}
