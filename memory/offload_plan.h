/*
 * memory/offload_plan.h — the placement planner: what stays on the GPU, what goes to the
 * offload tier (pinned host memory), decided once from the tensors' sizes and the budget.
 *
 * The planner sees the model as a list of items: one per tensor of the weights, grads, optim
 * and activations pools, each tagged with the parameter (or layer) it belongs to. If the items
 * and the fixed bytes (workspace, inputs) fit the budget, everything stays on the GPU.
 * Otherwise items move to the offload tier in this order, each stage only as far as needed:
 *
 *   1. optimizer state, largest first: it is touched once per step, by the update, so streaming
 *      it costs one pass over the link and nothing waits for it during forward and backward;
 *   2. weights and gradients of a parameter, together, largest parameter first (none smaller
 *      than UMT_OFFLOAD_MIN_STREAM_BYTES): the layer in
 *      use is copied into a device double buffer one layer ahead of use, so only two layers'
 *      weights and gradients are on the GPU at once;
 *   3. activations saved for backward, largest first: out after their forward, back one layer
 *      ahead in backward, through a second double buffer (at run time, offload/activations.c:
 *      buffers in the activation arena, which its plan places with the rest; the planner counts
 *      two of the largest layer's as that buffer).
 *
 * Among items of equal size, stages 1 and 2 take the latest parameter first (parameters are
 * registered in forward order): its update comes first in backward and its weights are needed
 * last in forward, so its copies hide under the rest of the step. The first layer is the worst
 * to stream: its update ends backward and its weights start the next forward, so with it
 * offloaded the step ends waiting on the link. Stage 3 takes the earliest layer first: its
 * activations go out first and come back last.
 *
 * One exception, with updates in backward: when stage 2 is needed, the first parameter that has
 * optimizer state stays on the GPU whole (weights, gradients and state) if streaming other
 * parameters makes room for it. With its state offloaded, the step ends with that state's round
 * trip over the link, after backward; one more streamed layer instead costs fewer bytes (its
 * weights in twice and out once, against a resident layer's state in and out) and hides under
 * backward (docs/PERF.md, "Offload tier", has the step times before and after this rule). Where
 * there is no such room, the order above stands.
 *
 * Streaming has a price in device memory: the double buffers. Offloading the first item of a
 * stage can therefore raise the total before later items lower it; the planner keeps going and
 * judges only the end result. When even everything offloaded does not fit, the plan fails with
 * UMT_ERR_BUDGET naming what the double buffers and the fixed bytes need.
 *
 * Pure C, no CUDA: tests/test_offload_plan.c checks its decisions on the CPU.
 */
#ifndef UMT_MEMORY_OFFLOAD_PLAN_H
#define UMT_MEMORY_OFFLOAD_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "umtrain.h"

/* The smallest streaming buffer: the optimizer streams its chunks through the same double
 * buffer, and chunks much smaller than this make the copies' fixed cost show. */
#define UMT_OFFLOAD_MIN_SLOT_BYTES ((size_t)64 << 20)

/* Parameters whose weights and gradient are smaller than this stay on the GPU (a bias): streaming
 * them would cost a copy's fixed overhead for next to no bytes. */
#define UMT_OFFLOAD_MIN_STREAM_BYTES ((size_t)1 << 20)

/* Updates in backward (UMT_OFFLOAD_OPTIM_BACKWARD) stream each offloaded parameter's update through
 * a ring of device buffers, each holding one chunk of the weights and of every state array: while
 * one chunk's state comes in, another is updated and a third goes home, and the weight slot is
 * free for the next layer as soon as its last chunk is updated (offload/update.c). A
 * parameter that stays resident with its state offloaded is updated in place through the ring's
 * state arrays. */
#define UMT_OFFLOAD_RING_ENTRIES 4
/* What the budget leaves after the plan deepens the ring, up to this many entries: the state of
 * more chunks comes in ahead, which carries the link over the pauses between layers (6 was as
 * fast as 8 and faster than 4: docs/PERF.md, "Offload tier"). Resident parameters come first:
 * where two more entries would cost a resident layer, the step was slower, so the ring takes
 * only what is left. */
#define UMT_OFFLOAD_RING_MAX_ENTRIES 6
/* A chunk of one array: this, or a sixteenth of a weight slot for small models. */
#define UMT_OFFLOAD_RING_CHUNK_BYTES ((size_t)16 << 20)

typedef struct {
    const char *name; /* for the printed plan */
    umt_pool pool;    /* UMT_POOL_WEIGHTS, _GRADS, _OPTIM or _ACTIVATIONS */
    int group;        /* the parameter (weights, grads, optim) or layer (activations) it belongs to */
    size_t bytes;
    bool offloaded;   /* the planner's decision */
    size_t stream_bytes; /* what a streaming buffer holds of it when offloaded, where that is less
                          * than bytes (0: bytes): under bf16/fp16 a weight counts its master and
                          * its compute copy (a resident one holds both), but only the copy streams */
} umt_plan_item;

typedef struct {
    size_t budget_bytes;
    size_t fixed_bytes;          /* device bytes held whatever the plan (workspace, inputs, ...) */
    size_t weight_slot_bytes;    /* one of the two weight+grad streaming buffers (0: none) */
    size_t activation_slot_bytes; /* one of the two activation streaming buffers (0: none) */
    size_t ring_bytes;           /* the update ring, all entries (0: none) */
    int ring_entries;            /* its entries: UMT_OFFLOAD_RING_ENTRIES, more where the budget leaves room */
    int ring_arrays;             /* per entry: the weights and each state array (0: no ring) */
    size_t ring_chunk_bytes;     /* one array's chunk in an entry */
    size_t device_bytes;         /* everything on the GPU: fixed + resident items + buffers */
    size_t offloaded_bytes;      /* everything in the offload tier */
    int stage;                   /* 0: all fits; 1..3: the last stage the planner needed */
} umt_placement_plan;

/* Decides items[i].offloaded for count items; update_in_backward: streamed parameters will need
 * the update ring. UMT_ERR_BUDGET (plan still filled in, with every item offloaded) when nothing
 * fits. */
umt_status umt_plan_placement(umt_plan_item *items, int count, size_t budget_bytes, size_t fixed_bytes,
                              bool update_in_backward, umt_placement_plan *plan);

/* Adds entries to a fitting plan's update ring, up to UMT_OFFLOAD_RING_MAX_ENTRIES, from what the
 * budget leaves (a no-op without a ring, or once deepened). */
void umt_plan_deepen_ring(umt_placement_plan *plan);

/* The device bytes a plan needs for the items as they are marked now: fixed, resident items, and
 * the buffers (both slots of both double buffers, the ring), which go to *buffers. */
size_t umt_plan_device_bytes(const umt_plan_item *items, int count, size_t fixed_bytes, bool update_in_backward,
                             umt_placement_plan *buffers);

/* The least device bytes the planner can reach for these items with nothing else on the GPU: the
 * smallest total over the arrangements its stages pass through when nothing fits (all on the GPU;
 * optimizer state out one item at a time; then parameters, largest first, down to
 * UMT_OFFLOAD_MIN_STREAM_BYTES), buffers included. Streaming buys nothing for a model whose largest
 * layer dominates: two of its buffers may cost more than its optimizer state saves. What the
 * memory plan (core/step/memory_plan.c) counts for the state when the tier takes it. The items'
 * marks are left as the last stage leaves them. */
size_t umt_plan_least_device_bytes(umt_plan_item *items, int count, bool update_in_backward);

/* One line per pool that has items (on GPU: count and bytes; offloaded: count and bytes), then the buffers and
 * the budget. */
void umt_plan_print(FILE *out, const umt_plan_item *items, int count, const umt_placement_plan *plan);

#endif /* UMT_MEMORY_OFFLOAD_PLAN_H */
