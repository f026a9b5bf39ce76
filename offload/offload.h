/*
 * offload/offload.h — the offload tier at run time: training a model larger than the device budget.
 *
 * umt_offload_enable (offload/enable.c) registers the tier on a context's hook table
 * (core/hooks.h) before the model exists. From then on parameters, gradients and optimizer state
 * are made in the offload pool (pinned host memory). At the first umt_step_begin the placement
 * planner (memory/offload_plan.h) decides what fits the budget; those tensors move to their own
 * pools on the GPU, the others stay in the offload tier for good, and the tier streams them:
 *
 *   forward   an offloaded weight is copied into one of two device slots (the stream pool) on the
 *             copy-in stream; the compute stream waits only for that copy. From the second step
 *             on, the order in which parameters were needed in the first step is known, so the
 *             next one is copied in while the current one computes: one layer ahead.
 *   backward  the same, in backward's order, with the gradient's slot zeroed (or its host copy
 *             brought in when it holds an earlier step's sum); the last forward layer is still in
 *             its slot. When the tape announces a gradient final, it is copied out on the
 *             copy-out stream, so out-copies, in-copies and compute all overlap.
 *   update    offloaded parameters are updated either on the GPU, their weights, gradients and
 *             state streamed through the same two slots in chunks (in-copy, update kernel,
 *             out-copy, pipelined), or on the CPU by threads in place in pinned memory; with
 *             UMT_OFFLOAD_OPTIM_AUTO the first two steps time both and the faster is kept.
 *             With UMT_OFFLOAD_OPTIM_BACKWARD a streamed parameter is instead updated in its slot
 *             as soon as its gradient is final, its state and new weights passing through a ring
 *             of chunk buffers (offload/update.c): only weights and state cross the link; a
 *             resident parameter with offloaded state is updated in place then too. The first
 *             streamed parameters of each backward are updated by CPU threads instead, beside the
 *             ring, as many as umt_offload_options.host_updates says (offload/host.c).
 *
 * A tensor in the offload tier keeps its host bytes in its `offload.home` (core/tensor.h); `data`
 * points there, or at the slot while the slot holds it, so ops and kernels need not know. Scope: parameters read through
 * umt_weight_for_compute (linear, matmul, conv2d weights) are streamed, one per op;
 * parameters smaller than UMT_OFFLOAD_MIN_STREAM_BYTES (memory/offload_plan.h) stay on the GPU;
 * saved activations stay in the arena (reserve_bytes holds them) unless the option activations
 * sends them out too (offload/activations.c).
 *
 * bf16 and fp16 (offload/compute_copy.c): the fp32 master and the optimizer state stay home; an
 * offloaded weight's compute copy (tensor->lowp, half its bytes) is made home too, at the plan,
 * and only it crosses into the slot for forward and backward. Gradients are fp32 on the GPU
 * (umtrain keeps parameter gradients in f32 under every precision) and cross at 4 bytes an
 * element; under bf16 with umt_offload_options.bf16_gradients_home, the CPU threads' updates in
 * backward take theirs rounded to bf16 in the slot, 2 bytes (offload/README.md). Every
 * update of a master rewrites the copy where it lives, with the same rounding (to nearest even)
 * and layout (NHWC for conv weights) as the in-memory fused update: the GPU's chunks write it
 * beside the master, the ring writes it in the slot and sends it home, the CPU threads write it
 * in pinned memory.
 *
 * Loss scaling and clipping by global norm: umt_optimizer_step decides the step on the device
 * (kernels/optim_step.h) from every gradient, the offloaded ones read where they are (home),
 * before it raises after_update; every offloaded update then reads that decision (the GPU's from
 * device memory, the CPU threads' from a copy taken once the decision is made). Updates in
 * backward cannot wait for the whole gradient set: with such an optimizer the tier says so once
 * and updates after backward on the GPU instead.
 *
 * Data parallelism (dist/): the tier moves a final gradient home (or updates with it) only in
 * after_op_backward, once every table has heard gradient_ready; dist all-reduces a gradient the
 * tier holds in place, on the GPU, and makes the compute stream wait for it, so the tier's copy
 * home and its updates read the average (offload/README.md).
 */
#ifndef UMT_OFFLOAD_OFFLOAD_H
#define UMT_OFFLOAD_OFFLOAD_H

#include <stdbool.h>

#include "core/tape.h"
#include "kernels/backend.h"
#include "kernels/optim_step.h"
#include "umtrain.h"

typedef struct umt_offload umt_offload;

/* The tier's state for ctx (CUDA): streams and events, nothing planned yet. */
umt_status umt_offload_create(umt_context *ctx, const umt_offload_options *options, umt_offload **out);
/* Frees the slots, streams and events (the pools free the tensors). */
void umt_offload_destroy(umt_offload *o);

/* Where a new tensor of kind pool (weights, grads, optim) is made: the offload pool while the
 * tier has not planned yet, else pool itself. */
umt_pool umt_offload_place(const umt_offload *o, umt_pool pool);
/* At umt_step_begin: plans (once, the first time), then starts the step's prefetch order. */
umt_status umt_offload_step_begin(umt_offload *o);

/* Makes an offloaded parameter's weights (and, for backward, its gradient) readable on the GPU
 * by work queued after this call, and prefetches the next in the recorded order. A no-op for
 * anything not offloaded. */
umt_status umt_offload_acquire(umt_offload *o, umt_tensor *p, bool for_backward);
/* Before a tape node's backward: acquires its offloaded parameter inputs with their gradients. */
umt_status umt_offload_before_backward(umt_offload *o, const umt_node *node);
/* The tape says p's gradient is final for this step: noted; after the node's backward (when every
 * hook table has heard of it: data parallelism's all-reduce is queued), it is copied out to the
 * offload tier, or p is updated with it (updates in backward). */
umt_status umt_offload_gradient_ready(umt_offload *o, umt_tensor *p);
umt_status umt_offload_after_op_backward(umt_offload *o, int node);
/* Saved activations (the option activations, offload/activations.c): the tape has recorded node
 * n (its kernels are queued): what it read goes out; before node n's backward: its activations
 * come back, the next node's start to; after it: buffers no longer read go. */
umt_status umt_offload_activations_recorded(umt_offload *o, int n);
umt_status umt_offload_activations_before_backward(umt_offload *o, int n);
umt_status umt_offload_activations_after_backward(umt_offload *o, int n);
/* End of backward: work queued after this sees every offloaded gradient in the offload tier. */
umt_status umt_offload_backward_done(umt_offload *o);
/* umt_zero_grad for an offloaded gradient: marked zero, nothing copied (true if it handled g). */
bool umt_offload_zero_grad(umt_offload *o, umt_tensor *parameter);

/* The optimizer whose rule UMT_OFFLOAD_OPTIM_BACKWARD runs during backward (attach true at its
 * creation, false at its destruction). */
void umt_offload_attach_optimizer(umt_offload *o, const umt_optimizer *opt, bool attach);

/* One update of n elements of a parameter: the optimizer's rule on the given pointers, with the
 * given backend's kernel (the CUDA one on device chunks, the CPU one on host memory); fusion: the
 * step scalars and where the range's compute copy is rewritten (kernels/optim_step.h). */
typedef umt_status (*umt_offload_update_fn)(const void *user, const umt_backend *backend, float *param,
                                            const float *grad, float *state0, float *state1,
                                            const umt_update_fusion *fusion, int64_t n);

/* The optimizer's step for parameters of which some array is in the offload tier: begin, then
 * one call per such parameter (state may be NULL), then end (which runs CPU updates and decides
 * auto mode). Then, in every step, step_end: the first step's order of uses is final, and the
 * next step's first weights start coming in. */
bool umt_offload_involves(const umt_tensor *p, const umt_tensor *state0, const umt_tensor *state1);
umt_status umt_offload_update_begin(umt_offload *o);
umt_status umt_offload_update(umt_offload *o, umt_tensor *p, umt_tensor *state0, umt_tensor *state1,
                              umt_offload_update_fn fn, const void *user);
umt_status umt_offload_update_end(umt_offload *o);
umt_status umt_offload_step_end(umt_offload *o);
/* All of the above for one umt_optimizer_step of opt (its step-th), after the optimizer has
 * updated every parameter the tier does not hold. */
umt_status umt_offload_optimizer_step(umt_offload *o, const umt_optimizer *opt, int64_t step);

#endif /* UMT_OFFLOAD_OFFLOAD_H */
