/*
 * core/branch.h — a layer's weight gradient on a second stream, beside its input gradient.
 *
 * In backward a layer makes two independent things from its output's gradient dy: the input's
 * gradient dx, which every layer below waits for, and the weight's gradient dw, which only the
 * optimizer reads. On one stream the GPU runs them one after the other, and at small batches
 * neither fills it (the MNIST CNN's second convolution's weight gradient at batch 64 is 40
 * blocks on an H100's 132 multiprocessors), so the step is their sum. With the backend's
 * streams group (kernels/backend.h), an op runs dw on a side stream that starts where the
 * compute stream is, while the compute stream goes on with dx and the layers below;
 * umt_backward ends by making the compute stream wait for the side (umt_branch_join).
 *
 * The same kernels run on the same inputs, so the results are those of one stream, bit for bit
 * (umt_context_options.one_stream turns the branch off, to compare). What keeps it safe:
 *   - the side writes only dw, and nothing on the compute stream touches dw before the join: a
 *     parameter takes the branch only when the tape used it once since the last backward (a
 *     second use would add to the same dw from the compute stream);
 *   - the side reads x, a forward activation (nothing in backward writes one), and dy, whose
 *     arena slot the tape recycles after the op: that slot's end of life waits for the join
 *     (umt_branch_end_of_life);
 *   - the side's convolutions work in a workspace of their own (umt_branch_workspace), its
 *     products in the side's own cuBLAS handle and workspace (kernels/cuda/backend.cu);
 *   - no subsystem that acts in backward is registered (the offload tier, data parallelism, a
 *     gradient hook): they take gradients as the compute stream finishes them, so with any of
 *     them everything stays on the compute stream.
 * A CPU context has no streams group: its ops run everything in order.
 */
#ifndef UMT_CORE_BRANCH_H
#define UMT_CORE_BRANCH_H

#include <stdbool.h>
#include <stddef.h>

#include "umtrain.h"

typedef struct {
    void *workspace; /* the side's convolutions' workspace: one growing block of the workspace pool */
    size_t workspace_bytes;
    void *cublas_workspace; /* the side's cuBLAS handle's, from the first product sent there on */
    bool open;    /* work went to the side since the last join */
    bool in_node; /* the tape node running now sent work there (its dy must outlive it) */
    int *deferred; /* arena slots whose end of life waits for the join */
    int deferred_count, deferred_slots;
} umt_branch_state;

/* The most work (multiply-adds times two) a weight gradient sent to the side may take. A larger
 * one fills the GPU by itself: beside the input gradient the two then compete for the
 * multiprocessors, and cuDNN's Hopper kernels, sized for the whole GPU, ran slower than one
 * after the other (docs/PERF.md, "Weight gradients beside input gradients"). */
#define UMT_BRANCH_MOST_FLOPS 2e9

/* Whether an op's weight gradient for parameter weight, of flops work, may run on the side
 * stream: the context has one, the op makes an input gradient too (dx not NULL: something to
 * run beside), the work is at most UMT_BRANCH_MOST_FLOPS, and the conditions above hold. */
bool umt_branch_takes(const umt_context *ctx, const umt_tensor *weight, const void *dx, double flops);
/* What the op launches from here to umt_branch_end runs on the side stream; products (cuBLAS)
 * among it: the side's cuBLAS workspace is made at the first (so a context whose products all
 * stay on the compute stream never holds one). */
umt_status umt_branch_begin(umt_context *ctx, bool products);
/* Back to the compute stream, whatever the side's work returned (made): made's failure first,
 * else the switch's. */
umt_status umt_branch_end(umt_context *ctx, umt_status made);
/* A workspace of at least bytes for the side's convolutions (as umt_context_workspace's). */
umt_status umt_branch_workspace(umt_context *ctx, size_t bytes, void **out);
/* The tape, after a node: its output gradient's slot ends now, or at the join if the node sent
 * work to the side. */
void umt_branch_end_of_life(umt_context *ctx, int slot);
/* The compute stream waits for the side's work; the deferred slots end. A no-op when nothing
 * went to the side since the last join. */
umt_status umt_branch_join(umt_context *ctx);
/* Frees the deferred list (umt_context_destroy; the workspace goes with its pool). */
void umt_branch_release(umt_context *ctx);

#endif /* UMT_CORE_BRANCH_H */
