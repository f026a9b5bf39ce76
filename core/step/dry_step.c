/* core/step/dry_step.c — dry steps: enter, run the passes, leave the context as it was. */
#include "core/step/dry_step.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tape.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "memory/dry.h"

/* What a dry step changes on the context, kept aside to be put back. */
typedef struct {
    const umt_backend *backend;
    umt_backend dry_backend;
    umt_memory_dry memory;
    umt_hook_table hooks;
    umt_rng rng;
    umt_tape tape;
    umt_tensor *step_tensors, *run_tensors;
    bool grad_enabled, training;
    void *conv_workspace, *branch_workspace, *branch_cublas_workspace;
    size_t conv_workspace_bytes, branch_workspace_bytes;
    /* per parameter: its gradient (a subsystem may leave it to backward to make), the compute
     * copy, its staleness and the tape's count of pending uses */
    struct parameter_state {
        umt_tensor *grad, *lowp;
        bool lowp_stale;
        int pending_uses, tape_uses;
    } *parameters;
} saved_context;

static umt_status enter(umt_context *ctx, saved_context *saved) {
    *saved = (saved_context){.backend = ctx->backend, .hooks = ctx->hooks, .rng = ctx->rng, .tape = ctx->tape,
                             .step_tensors = ctx->step_tensors, .run_tensors = ctx->run_tensors,
                             .grad_enabled = ctx->grad_enabled, .training = ctx->training,
                             .conv_workspace = ctx->conv_workspace, .conv_workspace_bytes = ctx->conv_workspace_bytes,
                             .branch_workspace = ctx->branch.workspace,
                             .branch_workspace_bytes = ctx->branch.workspace_bytes,
                             .branch_cublas_workspace = ctx->branch.cublas_workspace};
    saved->parameters = calloc((size_t)ctx->parameter_count + 1, sizeof *saved->parameters);
    if (!saved->parameters) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "dry step: no memory to keep the parameters aside");
    for (int i = 0; i < ctx->parameter_count; ++i) {
        const umt_tensor *p = ctx->parameters[i];
        saved->parameters[i] = (struct parameter_state){p->grad, p->lowp, p->lowp_stale, p->pending_uses, p->tape_uses};
    }
    umt_status st = umt_memory_dry_begin(&ctx->memory, &saved->memory);
    if (st != UMT_OK) {
        free(saved->parameters);
        return st;
    }
    umt_backend_dry(ctx->backend, &saved->dry_backend);
    ctx->backend = &saved->dry_backend;
    /* No subsystem hears of a dry step; the weight gradients' stream still follows them (core/branch.h). */
    ctx->dry_hooked_in_backward = umt_hooks_in_backward(ctx);
    ctx->hooks = (umt_hook_table){0};
    ctx->tape = (umt_tape){0};
    ctx->step_tensors = NULL;
    ctx->dry = true;
    ctx->dry_largest_numel = 0;
    ctx->dry_largest_bytes = 0;
    return UMT_OK;
}

/* Frees the headers of a list down to (not including) stop: the dry step's own tensors. */
static void free_headers_until(umt_tensor *list, const umt_tensor *stop) {
    while (list && list != stop) {
        umt_tensor *next = list->next;
        free(list->name);
        free(list);
        list = next;
    }
}

static void leave(umt_context *ctx, saved_context *saved, umt_dry_result *out) {
    umt_memory_dry_end(&ctx->memory, &saved->memory, out->pools);
    out->device_peak_bytes = saved->memory.device_peak_bytes;
    out->largest_elements = ctx->dry_largest_numel;
    out->largest_bytes = ctx->dry_largest_bytes;
    umt_tape_release(&ctx->tape);
    free_headers_until(ctx->step_tensors, NULL);
    /* RUN tensors a dry step made (compute copies of weights) went to the front of the list. */
    free_headers_until(ctx->run_tensors, saved->run_tensors);
    for (int i = 0; i < ctx->parameter_count; ++i) {
        umt_tensor *p = ctx->parameters[i];
        p->grad = saved->parameters[i].grad;
        p->lowp = saved->parameters[i].lowp;
        p->lowp_stale = saved->parameters[i].lowp_stale;
        p->pending_uses = saved->parameters[i].pending_uses;
        p->tape_uses = saved->parameters[i].tape_uses;
    }
    free(saved->parameters);
    ctx->backend = saved->backend;
    ctx->hooks = saved->hooks;
    ctx->rng = saved->rng;
    ctx->tape = saved->tape;
    ctx->step_tensors = saved->step_tensors;
    ctx->run_tensors = saved->run_tensors;
    ctx->grad_enabled = saved->grad_enabled;
    ctx->training = saved->training;
    ctx->conv_workspace = saved->conv_workspace;
    ctx->conv_workspace_bytes = saved->conv_workspace_bytes;
    ctx->branch.workspace = saved->branch_workspace;
    ctx->branch.workspace_bytes = saved->branch_workspace_bytes;
    ctx->branch.cublas_workspace = saved->branch_cublas_workspace;
    ctx->branch.open = ctx->branch.in_node = false;
    ctx->branch.deferred_count = 0;
    ctx->dry = false;
    ctx->dry_largest_numel = 0;
    ctx->dry_largest_bytes = 0;
}

/* The start of a dry step: what umt_step_begin does to the tape, the step's tensors and the arena. */
static umt_status begin(umt_context *ctx) {
    umt_tape_clear(&ctx->tape);
    free_headers_until(ctx->step_tensors, NULL);
    ctx->step_tensors = NULL;
    for (int i = 0; i < ctx->parameter_count; ++i) ctx->parameters[i]->pending_uses = ctx->parameters[i]->tape_uses = 0;
    return umt_memory_reset(&ctx->memory, UMT_POOL_ACTIVATIONS);
}

static umt_status run_pass(umt_context *ctx, const umt_dry_pass *pass, umt_plan_forward_fn forward, void *user) {
    UMT_TRY(begin(ctx));
    ctx->grad_enabled = pass->train;
    ctx->training = pass->train;
    umt_tensor *loss = forward(ctx, user, pass->batch);
    if (!loss) {
        umt_status st = umt_last_status();
        return umt_fail(st == UMT_OK ? UMT_ERR_STATE : st, "dry step: the forward on %lld samples failed: %s",
                        (long long)pass->batch, umt_last_error());
    }
    return pass->train ? umt_backward(ctx, loss) : UMT_OK;
}

umt_status umt_dry_steps(umt_context *ctx, const umt_dry_pass *passes, int count, umt_plan_forward_fn forward,
                         void *user, umt_dry_result *out) {
    *out = (umt_dry_result){0};
    if (ctx->values.recording)
        return umt_fail(UMT_ERR_STATE, "dry step: a step graph is being captured (plan before the first step)");
    if (ctx->dry) return umt_fail(UMT_ERR_STATE, "dry step: one is already running on this context");
    saved_context saved;
    UMT_TRY(enter(ctx, &saved));
    umt_status st = UMT_OK;
    for (int i = 0; i < count && st == UMT_OK; ++i) st = run_pass(ctx, &passes[i], forward, user);
    /* One more step start: the arena makes its plan from the recorded pass and shrinks to it. */
    if (st == UMT_OK) st = begin(ctx);
    leave(ctx, &saved, out);
    return st;
}
