/*
 * core/tape.h — the autograd tape: the ops of one forward pass, in order.
 *
 * Each op, after computing its output, records a node: its inputs, its output, what it saved
 * for backward, and the function that turns the output's gradient into its inputs' gradients.
 * umt_backward walks the nodes in reverse. Nothing is recorded when grad is disabled or when
 * no input takes a gradient.
 */
#ifndef UMT_CORE_TAPE_H
#define UMT_CORE_TAPE_H

#include "umtrain.h"

#define UMT_MAX_INPUTS 3

typedef struct umt_node umt_node;

/* Accumulates into the gradients of the node's inputs that require one. */
typedef umt_status (*umt_backward_fn)(umt_context *ctx, const umt_node *node);

struct umt_node {
    const char *op; /* the public op's name, for errors */
    umt_backward_fn backward;
    umt_tensor *inputs[UMT_MAX_INPUTS];
    int input_count;
    umt_tensor *output;
    umt_tensor *saved; /* an extra tensor kept for backward (e.g. softmax probabilities) */
    int64_t params[2]; /* the op's integer arguments (stride, padding, window) */
    float fparam;      /* the op's real argument (dropout's p) */
    /* Bit i of overwrites: the backward can write input i's whole gradient rather than add to
     * it. When this node is the first to produce that gradient, the tape allocates it without
     * zeroing it and sets bit i of fresh: the backward must then write every element. */
    unsigned overwrites, fresh;
};

typedef struct {
    umt_node *nodes;
    int count;
    int slots;
} umt_tape;

/* Records out = op(inputs...) if grad is enabled and an input requires grad; sets
 * out->requires_grad accordingly. Inputs after the first NULL are ignored. */
umt_status umt_tape_record(umt_context *ctx, const char *op, umt_backward_fn backward, umt_tensor *out,
                           umt_tensor *saved, umt_tensor *in0, umt_tensor *in1, umt_tensor *in2);
/* Backward from loss (umt_backward), its gradient seeded with 1, or with the f32 at
 * seed_on_device (a copy in stream order: the host never reads it; umt_backward_scaled). */
umt_status umt_tape_backward(umt_context *ctx, umt_tensor *loss, const float *seed_on_device);

/* Gradients known zero (umt_tensor.grad_zeroed), which umt_zero_grad does not fill again. A step
 * graph captured while it left out such fills (ctx->values.skipped_zero_fill; only for gradients
 * an optimizer's step consumes) replays right only while they are still zero: nothing wrote them
 * since the last step's update. A capture that failed ran none of the fills it queued: every
 * mark is dropped. */
bool umt_grads_zeroed_for_replay(const umt_context *ctx);
void umt_grads_forget_zeroed(umt_context *ctx);
void umt_tape_clear(umt_tape *tape);
/* The step's tape, activations, views and workspace released, as a step (or a micro-batch:
 * core/micro_batch.h) starts; the parameters' pending uses restart from 0. */
umt_status umt_step_release(umt_context *ctx);
/* UMT_MEM_TRACE: a forward starts here (a step's, or a micro-batch's); backward ends its bar. */
void umt_forward_trace_begin(umt_context *ctx);
void umt_tape_release(umt_tape *tape);

#endif /* UMT_CORE_TAPE_H */
