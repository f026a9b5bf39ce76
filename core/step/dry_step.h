/*
 * core/step/dry_step.h — dry steps: a step's ops run to learn what they allocate, touching no byte.
 *
 * A dry step runs the caller's forward on inputs of a given batch (and, for a training pass,
 * umt_backward on its loss) with the dry kernel table (kernels/dry.c: every kernel a no-op, the
 * shape questions answered for real) while the pools record without backing (memory/dry.h).
 * The activation arena starts empty, as before a first step, and runs its real code: so the
 * statistics after a few dry passes are what the first step and the later ones will take.
 *
 * Nothing of the context changes: no hook fires (the offload tier and data parallelism do not
 * act), and the RNG, the tape, the step's tensors, the parameters' compute copies and
 * bookkeeping, the pools' plans and statistics, the convolution workspace, the step count, the
 * step's values and the trace are as they were before. Training after a dry step gives the same
 * losses and parameters, bit for bit, as without it (tests/test_dry_step.c).
 */
#ifndef UMT_CORE_STEP_DRY_STEP_H
#define UMT_CORE_STEP_DRY_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "umtrain.h"

/* One pass of a dry step: batch samples through forward, and either training (grad on,
 * training mode, backward) or evaluation (grad off, evaluation mode, forward only). */
typedef struct {
    int64_t batch;
    bool train;
} umt_dry_pass;

typedef struct {
    umt_pool_stats pools[UMT_POOL_COUNT]; /* every pool after the passes and a last step start */
    size_t device_peak_bytes; /* the most managed + device bytes held at once (0 on the CPU) */
    int64_t largest_elements; /* the largest tensor made, in elements */
    size_t largest_bytes;     /* and the largest in bytes */
} umt_dry_result;

/* Runs passes[0..count) one after another as dry steps (each begun as umt_step_begin begins a
 * step), then begins one more so that the arena makes its plan, and fills *out; the context is
 * left as it was, also on failure. A pass that fails (forward returning NULL, a library refusing
 * a shape) returns its status after the context is restored, with out->largest_elements set. */
umt_status umt_dry_steps(umt_context *ctx, const umt_dry_pass *passes, int count, umt_plan_forward_fn forward,
                         void *user, umt_dry_result *out);

#endif /* UMT_CORE_STEP_DRY_STEP_H */
