/* core/tape.c — recording ops, and running the tape backwards. */
#include "core/tape.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/branch.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/micro_batch.h"
#include "core/tensor.h"
#include "memory/trace.h"

umt_status umt_tape_record(umt_context *ctx, const char *op, umt_backward_fn backward, umt_tensor *out,
                           umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2) {
    umt_tensor *inputs[UMT_MAX_INPUTS] = {in0, in1, in2};
    int count = 0;
    bool needs_grad = false;
    while (count < UMT_MAX_INPUTS && inputs[count]) needs_grad |= inputs[count++]->requires_grad;
    out->requires_grad = ctx->grad_enabled && needs_grad;
    if (!out->requires_grad) return UMT_OK;

    umt_tape *tape = &ctx->tape;
    if (tape->count == tape->slots) {
        int slots = tape->slots ? 2 * tape->slots : 64;
        umt_node *grown = realloc(tape->nodes, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory to record the op on the tape", op);
        tape->nodes = grown;
        tape->slots = slots;
    }
    umt_node *node = &tape->nodes[tape->count++];
    *node = (umt_node){.op = op, .backward = backward, .input_count = count, .output = out, .saved = saved};
    for (int i = 0; i < count; ++i) {
        node->inputs[i] = inputs[i];
        /* Counted so that backward knows when a parameter's last contribution has arrived. */
        if (inputs[i]->is_parameter) inputs[i]->pending_uses++, inputs[i]->tape_uses++;
    }
    /* A subsystem may act on what the op read now (the offload tier sends it to host memory). */
    return umt_hooks_op_recorded(ctx, tape->count - 1);
}

void umt_tape_clear(umt_tape *tape) { tape->count = 0; }

void umt_tape_release(umt_tape *tape) {
    free(tape->nodes);
    *tape = (umt_tape){0};
}

/* ----------------------------------------------------------------------------------------- */
/* The public autograd entry points */

/* UMT_MEM_TRACE: a forward's kernels, as one bar on the compute stream from its start to
 * backward's first kernel (or to the next forward, for an evaluation). */
static void forward_trace_end(umt_context *ctx) {
    umt_trace_end(ctx->memory.trace, ctx->memory.stream, ctx->forward_trace, "forward", "forward",
                  UMT_TRACE_COMPUTE, 0);
    ctx->forward_trace = NULL;
}

void umt_forward_trace_begin(umt_context *ctx) {
    forward_trace_end(ctx);
    ctx->forward_trace = umt_trace_begin(ctx->memory.trace, ctx->memory.stream);
}

umt_status umt_step_release(umt_context *ctx) {
    /* A backward that failed may have left work on the side stream (core/branch.h). */
    UMT_TRY(umt_branch_join(ctx));
    umt_tape_clear(&ctx->tape);
    ctx->step_loss = NULL;
    /* The previous step's activations, views and activation gradients all go at once. */
    while (ctx->step_tensors) {
        umt_tensor *t = ctx->step_tensors;
        ctx->step_tensors = t->next;
        free(t);
    }
    for (int i = 0; i < ctx->parameter_count; ++i) ctx->parameters[i]->pending_uses = ctx->parameters[i]->tape_uses = 0;
    UMT_TRY(umt_memory_reset(&ctx->memory, UMT_POOL_ACTIVATIONS));
    return umt_memory_reset(&ctx->memory, UMT_POOL_WORKSPACE);
}

umt_status umt_step_begin(umt_context *ctx) {
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_step_begin: ctx is NULL");
    /* A dry step (core/step/dry_step.c) begins its own steps: one begun inside it would reset
     * the real arena's step counts and queue the step's values. */
    if (ctx->dry)
        return umt_fail(UMT_ERR_STATE, "umt_step_begin: called during a dry step (a plan's forward makes its inputs "
                                       "and loss only; the dry step begins and ends the step)");
    UMT_TRY(umt_step_release(ctx));
    umt_micro_batch_reset(ctx);
    /* A subsystem that works on the host in every step takes part in nothing a replay redoes. */
    const char *unreplayable = umt_hooks_unreplayable(ctx);
    if (unreplayable && ctx->values.recording) {
        ctx->values.unreplayable = unreplayable;
        return umt_fail(UMT_ERR_UNSUPPORTED, "step graph: %s", ctx->values.unreplayable);
    }
    if (ctx->memory.trace) {
        char mark[32];
        snprintf(mark, sizeof mark, "step %lld", (long long)ctx->steps_begun);
        umt_trace_mark(ctx->memory.trace, mark);
    }
    ctx->steps_begun++;
    /* Subsystems start their step (the offload tier plans at the first). */
    UMT_TRY(umt_hooks_step_begin(ctx));
    UMT_TRY(umt_step_values_begin(ctx));
    umt_forward_trace_begin(ctx);
    return UMT_OK;
}

/* The gradients the context zeroes itself go ZERO_BATCH to a call (one launch each on a GPU,
 * where a small model's step has few kernels to spare for zero fills). */
enum { ZERO_BATCH = 32 };

/* The batch's count gradients (of parameters[which[..]]) filled in one call, and marked zero; a
 * dry step's fill fills nothing, so it marks nothing. */
static umt_status zero_batch(umt_context *ctx, int count, const int *which, void *const *blocks,
                             const size_t *bytes) {
    if (!count) return UMT_OK;
    UMT_TRY(umt_kernels(ctx)->f32.zero_many(count, blocks, bytes));
    for (int k = 0; k < count && !ctx->dry; ++k) ctx->parameters[which[k]]->grad_zeroed = true;
    return UMT_OK;
}

umt_status umt_zero_grad(umt_context *ctx) {
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_zero_grad: ctx is NULL");
    void *blocks[ZERO_BATCH];
    size_t bytes[ZERO_BATCH];
    int which[ZERO_BATCH], count = 0;
    for (int i = 0; i < ctx->parameter_count; ++i) {
        umt_tensor *p = ctx->parameters[i], *g = p->grad;
        if (umt_hooks_zero_grad(ctx, p)) continue; /* a subsystem's gradient, zeroed there */
        /* Zero already: filled since its last write, or consumed by the last step's update
         * (umt_optimizer_options.zero_grads_in_step). A step graph's capture leaves out only the
         * fills that every replay's own update makes unneeded, and says so (tape.h). */
        if (p->grad_zeroed && (!ctx->values.recording || p->grad_consumed)) {
            if (ctx->values.recording) ctx->values.skipped_zero_fill = true;
            continue;
        }
        which[count] = i, blocks[count] = g->data, bytes[count++] = (size_t)g->numel * sizeof(float);
        if (count < ZERO_BATCH) continue;
        UMT_TRY(zero_batch(ctx, count, which, blocks, bytes));
        count = 0;
    }
    return zero_batch(ctx, count, which, blocks, bytes);
}

bool umt_grads_zeroed_for_replay(const umt_context *ctx) {
    for (int i = 0; i < ctx->parameter_count; ++i)
        if (ctx->parameters[i]->grad_consumed && !ctx->parameters[i]->grad_zeroed) return false;
    return true;
}

void umt_grads_forget_zeroed(umt_context *ctx) {
    for (int i = 0; i < ctx->parameter_count; ++i) ctx->parameters[i]->grad_zeroed = false;
}

bool umt_set_grad_enabled(umt_context *ctx, bool enabled) {
    if (!ctx) return umt_fail_null("umt_set_grad_enabled", "ctx"), false;
    bool previous = ctx->grad_enabled;
    ctx->grad_enabled = enabled;
    return previous;
}

/* After a node's backward: a parameter whose every use has now been processed is final, and the
 * subsystems hear of it (data parallelism starts its all-reduce, the offload tier sends it home). */
static umt_status announce_finished_parameters(umt_context *ctx, const umt_node *node) {
    /* Before the last micro-batch a gradient has more to add (core/micro_batch.h). */
    if (!umt_micro_batch_is_last(ctx)) return UMT_OK;
    for (int i = 0; i < node->input_count; ++i) {
        umt_tensor *p = node->inputs[i];
        if (!p->is_parameter || --p->pending_uses != 0) continue;
        UMT_TRY(umt_hooks_gradient_ready(ctx, p));
    }
    return UMT_OK;
}

/* Whether input i of node is another of its inputs too (x * x): its gradient gets two writes. */
static bool repeated_input(const umt_node *node, int i) {
    for (int j = 0; j < node->input_count; ++j)
        if (j != i && node->inputs[j] == node->inputs[i]) return true;
    return false;
}

/* The gradients node's backward will write: new ones zeroed, or left unset (and marked fresh)
 * where the node writes the whole gradient (umt_node's overwrites). */
static umt_status input_grads(umt_context *ctx, umt_node *node) {
    node->fresh = 0;
    for (int i = 0; i < node->input_count; ++i) {
        umt_tensor *in = node->inputs[i];
        if (!in->requires_grad) continue;
        bool unset = !in->grad && (node->overwrites >> i & 1u) && !repeated_input(node, i);
        if (!(unset ? umt_tensor_grad_unset(ctx, in) : umt_tensor_grad_or_zeros(ctx, in)))
            return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_backward: %s: no memory for a gradient (%s)", node->op,
                            umt_last_error());
        if (unset) node->fresh |= 1u << i;
    }
    return UMT_OK;
}

umt_status umt_tape_backward(umt_context *ctx, umt_tensor *loss, const float *seed_on_device) {
    if (loss->numel != 1 || loss->dtype != UMT_F32)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_backward: loss has %lld elements of %s (expected one f32)",
                        (long long)loss->numel, umt_dtype_name(loss->dtype));
    if (!loss->requires_grad)
        return umt_fail(UMT_ERR_STATE, "umt_backward: the loss was computed with grad disabled or from no parameter");
    if (ctx->tape.count == 0)
        return umt_fail(UMT_ERR_STATE, "umt_backward: the tape is empty (backward already ran since the forward pass)");
    forward_trace_end(ctx);
    /* Every parameter's gradient may be added to from here on (a dry backward adds nothing). */
    if (!ctx->dry) umt_grads_forget_zeroed(ctx);
    /* A micro-batch's mean loss counts samples / batch of the step's (core/micro_batch.h). The
     * seed is zeroed only where it is added to; a copy or a fill writes it whole. */
    float weight = umt_micro_batch_weight(ctx);
    bool adds = seed_on_device && weight != 1.0f;
    umt_tensor *seed = adds ? umt_tensor_grad_or_zeros(ctx, loss) : umt_tensor_grad_unset(ctx, loss);
    if (!seed) return UMT_ERR_OUT_OF_MEMORY;
    if (adds)
        UMT_TRY(umt_kernels(ctx)->f32.accumulate(seed->data, seed_on_device, weight, 1)); /* seed is zeroed */
    else if (seed_on_device)
        UMT_TRY(umt_kernels(ctx)->f32.copy(seed->data, seed_on_device, sizeof(float)));
    else
        UMT_TRY(umt_kernels(ctx)->f32.fill(seed->data, 1, weight));

    for (int n = ctx->tape.count - 1; n >= 0; --n) {
        umt_node *node = &ctx->tape.nodes[n];
        /* A node whose output received no gradient lies on no path to the loss. */
        if (node->output->grad) {
            UMT_TRY(input_grads(ctx, node));
            umt_status st = umt_hooks_before_op_backward(ctx, node);
            /* UMT_MEM_TRACE: the node's kernels, timed on the compute stream after the waits for
             * what subsystems bring in (the offload tier), so a bar that starts late shows the wait. */
            void *begin = umt_trace_begin(ctx->memory.trace, ctx->memory.stream);
            if (st == UMT_OK) st = node->backward(ctx, node);
            umt_trace_end(ctx->memory.trace, ctx->memory.stream, begin, node->op, "backward", UMT_TRACE_COMPUTE, 0);
            if (st != UMT_OK) return umt_fail(st, "umt_backward: %s: %s", node->op, umt_last_error());
            /* Every consumer of this output ran before its producer: its gradient is done (once
             * the side stream, if the node sent work there, has read it: core/branch.h). */
            umt_branch_end_of_life(ctx, node->output->grad->arena_slot);
        }
        UMT_TRY(announce_finished_parameters(ctx, node));
        UMT_TRY(umt_hooks_after_op_backward(ctx, n));
    }
    /* The weight gradients made beside are done before anything reads them. */
    UMT_TRY(umt_branch_join(ctx));
    for (int i = 0; i < ctx->parameter_count; ++i) ctx->parameters[i]->tape_uses = 0;
    /* The tape has been consumed: a second backward needs a new forward. */
    umt_tape_clear(&ctx->tape);
    UMT_TRY(umt_micro_batch_after_backward(ctx, loss));
    /* What the optimizer's non-finite check reads: the step's loss so far (a dry step's is only
     * recorded, never backed). */
    if (!ctx->dry) ctx->step_loss = ctx->micro.index ? ctx->micro.loss->data : loss->data;
    return umt_hooks_after_backward(ctx);
}

umt_status umt_backward(umt_context *ctx, umt_tensor *loss) {
    UMT_TRY(umt_check_input(ctx, "umt_backward", "loss", loss, UMT_ANY_DTYPE, 0));
    return umt_tape_backward(ctx, loss, NULL);
}
