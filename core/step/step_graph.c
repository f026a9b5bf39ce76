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
 * workspace and the step values' block are where they were at capture, the input has the
 * captured size, and the training mode is the same. Otherwise the step runs eagerly; after two
 * eager steps (the arena settles at the second) the graph is captured again.
 *
 * Every step, eager or replayed, also copies its loss into the graph's own tensor and adds it
 * to a sum on the device, so that the caller reads losses when it wants, not once per step.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/step_values.h"
#include "core/tensor.h"

#ifdef UMT_WITH_CUDA
#include "core/base/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#endif

/* Eager steps after an invalidation before a capture: the first may still move the arena. */
#define WARMUP_STEPS 2

/* The addresses a captured graph depends on. */
typedef struct {
    const void *arena, *workspace, *values;
    size_t input_bytes;
    bool training;
} baked_in;

struct umt_step_graph {
    umt_context *ctx;
    bool capture;
    const char *off_reason; /* capture off for good, and why (off_text), or NULL */
    char off_text[256];
    void *exec;             /* cudaGraphExec_t, NULL when none is captured */
    baked_in baked;
    int warm_steps; /* eager steps since the graph was last dropped */
    umt_tensor *loss, *loss_sum;
    int64_t loss_count;
    bool told_batch, told_moved;
    umt_step_graph_stats stats;
};

/* ----------------------------------------------------------------------------------------- */
/* The loss, kept on the device */

/* After the step's kernels (inside the capture too): the loss copied out and summed. */
static umt_status keep_loss(umt_step_graph *g, const umt_tensor *loss) {
    if (loss->numel != 1 || loss->dtype != UMT_F32)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_step_graph_run: the step returned %lld elements of %s "
                        "(expected one f32 loss)", (long long)loss->numel, umt_dtype_name(loss->dtype));
    const umt_backend *be = g->ctx->backend;
    UMT_TRY(be->f32.copy(g->loss->data, loss->data, sizeof(float)));
    return be->f32.accumulate(g->loss_sum->data, loss->data, 1.0f, 1);
}

static umt_status eager_step(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                             size_t input_bytes) {
    umt_tensor *loss = step(g->ctx, user, input, input_bytes);
    if (!loss) return umt_last_status();
    UMT_TRY(keep_loss(g, loss));
    g->stats.eager_steps++;
    g->loss_count++;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Capture and replay */

#ifdef UMT_WITH_CUDA
static baked_in current(const umt_context *ctx, size_t input_bytes) {
    const umt_pool_state *arena = &ctx->memory.pools[UMT_POOL_ACTIVATIONS];
    return (baked_in){
        .arena = arena->block_count ? arena->blocks[0].ptr : NULL,
        .workspace = ctx->conv_workspace,
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

static void drop_graph(umt_step_graph *g) {
    if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
    g->exec = NULL;
    g->warm_steps = 0;
}

/* The step run once under capture; *graph is NULL when the capture failed (status says why
 * when the step itself failed). */
static umt_status record(umt_step_graph *g, umt_step_fn step, void *user, const void *input, size_t input_bytes,
                         cudaGraph_t *graph) {
    umt_context *ctx = g->ctx;
    cudaStream_t stream = umt_cuda_stream();
    *graph = NULL;
    UMT_TRY(umt_step_values_record_begin(ctx, input, input_bytes));
    /* Thread-local: a forbidden call (an allocation, a wait) in this thread ends the capture. */
    cudaError_t began = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (began != cudaSuccess) umt_step_values_record_end(ctx);
    UMT_CUDA_TRY(began);
    umt_tensor *loss = step(ctx, user, input, input_bytes);
    umt_status status = loss ? keep_loss(g, loss) : umt_last_status();
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

/* The captured graph, ready to launch; NULL (and the reason recorded) when it is not. */
static cudaGraphExec_t capture(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                               size_t input_bytes) {
    cudaGraph_t graph;
    umt_status status = record(g, step, user, input, input_bytes, &graph);
    if (status == UMT_OK && g->ctx->values.unreplayable)
        status = umt_fail(UMT_ERR_UNSUPPORTED, "%s", g->ctx->values.unreplayable);
    cudaGraphExec_t exec = NULL;
    if (status == UMT_OK) {
        cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
        if (made != cudaSuccess) {
            exec = NULL;
            umt_fail(UMT_ERR_DEVICE, "step graph: cudaGraphInstantiate: %s", cudaGetErrorString(made));
        }
    }
    if (graph) cudaGraphDestroy(graph);
    return exec;
}

/* Captures the step and runs it (its values are in the slot already). UMT_OK with g->exec NULL:
 * the capture failed, nothing ran, and the caller runs the step eagerly. */
static umt_status capture_and_launch(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                                     size_t input_bytes) {
    umt_context *ctx = g->ctx;
    umt_rng rng = ctx->rng;
    cudaGraphExec_t exec = capture(g, step, user, input, input_bytes);
    if (!exec) {
        /* Nothing of the step ran: its host effects are taken back, and it runs eagerly. */
        ctx->rng = rng;
        umt_step_values_undo(ctx);
        turn_off(g, umt_last_error());
        return UMT_OK;
    }
    g->exec = exec;
    g->baked = current(ctx, input_bytes);
    g->stats.captures++;
    UMT_TRY(umt_step_values_flush(ctx));
    UMT_CUDA_TRY(cudaGraphLaunch(exec, umt_cuda_stream()));
    g->stats.replayed_steps++;
    g->loss_count++;
    return UMT_OK;
}

static umt_status replay(umt_step_graph *g, const void *input) {
    UMT_TRY(umt_step_values_replay(g->ctx, input));
    UMT_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, umt_cuda_stream()));
    g->stats.replayed_steps++;
    g->loss_count++;
    return UMT_OK;
}

/* Whether the graph still fits this step; says once why it does not. */
static bool still_fits(umt_step_graph *g, size_t input_bytes) {
    baked_in now = current(g->ctx, input_bytes);
    if (now.input_bytes != g->baked.input_bytes) {
        if (!g->told_batch)
            fprintf(stderr, "umtrain: step graph: a step of %zu input bytes (captured: %zu) runs eagerly\n",
                    input_bytes, g->baked.input_bytes);
        g->told_batch = true;
        return false;
    }
    if (now.arena == g->baked.arena && now.workspace == g->baked.workspace && now.values == g->baked.values &&
        now.training == g->baked.training)
        return true;
    if (!g->told_moved)
        fprintf(stderr, "umtrain: step graph: memory it baked in moved (an evaluation ran since?): capturing again\n");
    g->told_moved = true;
    drop_graph(g);
    return false;
}
#endif

umt_status umt_step_graph_run(umt_step_graph *g, umt_step_fn step, void *user, const void *input,
                              size_t input_bytes) {
    if (!g || !step || (!input && input_bytes))
        return umt_fail_null("umt_step_graph_run", !g ? "graph" : !step ? "step" : "input");
#ifdef UMT_WITH_CUDA
    if (g->capture && !g->off_reason) {
        if (g->exec && still_fits(g, input_bytes)) return replay(g, input);
        if (!g->exec && g->warm_steps >= WARMUP_STEPS) {
            UMT_TRY(capture_and_launch(g, step, user, input, input_bytes));
            if (g->exec) return UMT_OK;
        }
        if (!g->exec) g->warm_steps++;
    }
#endif
    return eager_step(g, step, user, input, input_bytes);
}

/* ----------------------------------------------------------------------------------------- */
/* Creation, reading, destruction */

static void release(void *object) {
    umt_step_graph *g = object;
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
    g->loss_sum = g->loss ? umt_tensor_alloc(ctx, UMT_POOL_OPTIM, UMT_F32, 1, one) : NULL;
    umt_status st = g->loss_sum ? ctx->backend->f32.fill(g->loss_sum->data, 1, 0.0f) : umt_last_status();
    if (st == UMT_OK) st = ctx->backend->f32.fill(g->loss->data, 1, 0.0f);
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
    return g->ctx->backend->f32.fill(g->loss_sum->data, 1, 0.0f);
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
