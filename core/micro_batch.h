/*
 * core/micro_batch.h — one optimizer step over a batch too large for one pass: the batch runs as
 * micro-batches of consecutive samples, whose gradients add up to the whole batch's.
 *
 * The loss of a micro-batch of m samples out of a batch of B is that micro-batch's mean; its
 * backward starts from m / B instead of 1 (times the fp16 loss scale), so the gradients summed
 * over the micro-batches are those of the whole batch's mean loss. Between micro-batches the
 * tape, the activations and the workspace go, as at a step's start, so a step needs the memory
 * of one micro-batch; the gradients and the parameters stay. The arena is planned from the first
 * micro-batch (memory/plan.h), which later ones follow when they are no larger: the first should
 * be the largest.
 *
 * What a caller reads must not depend on the split:
 * - Dropout: the first micro-batch draws each dropout's seed, the later ones take the same
 *   seeds in the same order, and every element draws by its index in the whole batch (the
 *   kernels' `first`): the masks are the unsplit step's.
 * - Subsystems hear that a gradient is final (gradient_ready, core/hooks.h) in the last
 *   micro-batch only: data parallelism all-reduces once per step, after the last one.
 * - The step's loss: each micro-batch adds its loss times m / B to one device scalar
 *   (umt_micro_batch_loss), the whole batch's mean once the last has run backward.
 * - Batch norm normalises each micro-batch by its own statistics, as PyTorch does under
 *   gradient accumulation: that one is not the unsplit step's.
 */
#ifndef UMT_CORE_MICRO_BATCH_H
#define UMT_CORE_MICRO_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "umtrain.h"

/* A dropout's draw in the first micro-batch, for the later ones to take again. */
typedef struct {
    uint64_t seed;
    void *seed_on_device; /* under a capture: where the replay writes it (core/step_values.h) */
} umt_micro_draw;

typedef struct {
    int index;                     /* micro-batches begun this step; 0: the step is not split */
    int64_t first, samples, batch; /* this micro-batch: samples [first, first + samples) of batch */
    umt_tensor *loss;              /* the step's loss so far (optimizer pool, one f32) */
    umt_micro_draw *draws;         /* the first micro-batch's dropout draws, in call order */
    int draw_count, draw_slots, next_draw;
} umt_micro_batch_state;

/* At umt_step_begin: the step is not split until umt_micro_batch_begin says so. */
void umt_micro_batch_reset(umt_context *ctx);
/* m / B for this micro-batch: where backward starts (1 when the step is not split). */
float umt_micro_batch_weight(const umt_context *ctx);
/* Whether gradients are final after this backward: not split, or the last micro-batch. */
bool umt_micro_batch_is_last(const umt_context *ctx);
/* After a micro-batch's backward: its loss, weighted, added to the step's. */
umt_status umt_micro_batch_after_backward(umt_context *ctx, const umt_tensor *loss);
/* For a dropout on x: *first, the index of x's element 0 in the whole batch's tensor (x's first
 * axis is the micro-batch's samples), and whether *seed and *seed_on_device were taken from the
 * first micro-batch's draws (true) or must be drawn (false, then umt_micro_batch_keep_draw). */
umt_status umt_micro_batch_dropout(umt_context *ctx, const umt_tensor *x, const char *op, int64_t *first,
                                   uint64_t *seed, void **seed_on_device, bool *repeated);
/* The first micro-batch's draw, kept for the later ones. */
umt_status umt_micro_batch_keep_draw(umt_context *ctx, uint64_t seed, void *seed_on_device);
void umt_micro_batch_release(umt_context *ctx);

#endif /* UMT_CORE_MICRO_BATCH_H */
