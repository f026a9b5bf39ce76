/*
 * memory/fit.h — whether a training step fits, in how many micro-batches, and with how much of
 * the offload tier: the decision of the memory plan (include/umtrain.h, umt_memory_plan_make),
 * pure C, from sizes and the budget.
 *
 * The plan's caller measures a step at a micro-batch size (core/step/memory_plan.c does it with
 * dry steps: the bytes the step itself adds on the device, its activations, its largest tensor)
 * and says what else the device holds: the model's state (weights with their compute copies,
 * gradients, optimizer state) and the rest (a resident dataset, ...). A step is placed in one of
 * three arrangements, which count the device bytes at its peak as
 *   in memory             held + state + step
 *   tier                  held + tier   + step      the state where the offload tier puts it: the
 *                                                   least device bytes its placement planner can
 *                                                   reach (memory/offload_plan.h), whatever else fits
 *                                                   it keeps on the GPU at the first step
 *   tier and activations  held + tier   + step, the activation arena's peak replaced by a working
 *                                                   set of UMT_FIT_ACTIVATION_WORKING_SET largest
 *                                                   tensors (saved activations go to host memory,
 *                                                   a few are on the GPU at once)
 * and this file decides, in the order:
 *   1. the whole batch fits in memory: one micro-batch;
 *   2. one sample fits in memory: the smallest k whose micro-batch ceil(B/k) does. A step's need
 *      grows with its micro-batch, so k is found by bisection over 1..B (about log2 B measures;
 *      each is a dry step, cheap: no kernel runs), then lowered to the fewest micro-batches of
 *      that size;
 *   3. with the offload tier (optimizer state first, then weights and gradients: its planner's
 *      order), the whole batch or the smallest k that fits;
 *   4. with saved activations offloaded too, the same;
 *   5. otherwise nothing fits: the reason names the tier's bytes and one sample's.
 * A step fits when its device bytes and the margin are within the budget (no budget, 0, on the
 * CPU: always), its largest tensor within the element limit, and no library refused a shape.
 * With the tier, the host must hold what it keeps there (the whole state, which the tier makes in
 * pinned memory before placing it, and the saved activations): where it cannot, the plan does
 * not fit, and says so with the pools and sizes.
 * (memory/plan.c is another plan: the activation arena's offsets within one step.)
 */
#ifndef UMT_MEMORY_FIT_H
#define UMT_MEMORY_FIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

/* With saved activations in host memory, the device holds a few at once: the op's inputs and
 * output, the one leaving, and in backward the ones back and two gradients; the first step, which
 * the arena records before it can plan reuse, holds more. 8 (examples/big_mlp.c's reserve) was too
 * few for a deep CNN: its first step held 16.7 times its largest tensor (tests/gpu/
 * test_cuda_plan_offload.c, on an H100, 2026-11-24). 20 leaves room above that one measurement. */
#define UMT_FIT_ACTIVATION_WORKING_SET 20

/* A step measured at one micro-batch size. */
typedef struct {
    size_t step_bytes;             /* device bytes the step adds at its peak to the state and the rest */
    size_t activation_bytes;       /* of which the activation arena's peak */
    size_t activation_total_bytes; /* every activation of the step added up: their host copies when offloaded */
    size_t largest_bytes;          /* the largest tensor of the step */
    int64_t largest_elements;
    bool refused; /* a library refused a shape (cuDNN: a tensor over INT_MAX elements) */
} umt_fit_measure;

typedef umt_status (*umt_fit_measure_fn)(void *user, int64_t micro_batch, umt_fit_measure *out);

typedef enum { UMT_FIT_IN_MEMORY = 0, UMT_FIT_TIER, UMT_FIT_TIER_ACTIVATIONS } umt_fit_arrangement;

typedef struct {
    int64_t batch;         /* B >= 1 */
    int64_t forced_k;      /* 0: choose */
    int64_t element_limit; /* >= 1 */
    size_t budget_bytes;   /* 0: no budget */
    size_t margin_bytes;   /* kept free under the budget: what a measure cannot see */
    size_t held_bytes;     /* device bytes held besides the state and the step (a resident dataset, ...) */
    size_t state_bytes[3]; /* the model's weights (with their compute copies), grads, optim, wherever they are */
    bool tier;             /* the offload tier can be used (CUDA) */
    size_t tier_bytes;     /* the least device bytes of the state with the tier: its buffers, what it cannot stream */
    size_t host_available_bytes; /* host memory for the tier's pinned copies (0: unknown, not checked) */
} umt_fit_inputs;

typedef struct {
    umt_plan_verdict verdict;
    umt_fit_arrangement arrangement;
    bool fits;
    int64_t k, micro_batch;
    umt_fit_measure at;  /* the measure at micro_batch */
    size_t device_bytes; /* the arrangement's device bytes at micro_batch, the margin left out */
    size_t reserve_bytes; /* the step's device bytes in the arrangement, and the margin: what the tier leaves */
    size_t host_bytes;    /* what the tier keeps in host memory (0 in memory) */
    char why[384];
} umt_fit_choice;

/* Decides as above; measure is called with micro-batch sizes in 1..B. Fails only when measure
 * fails. */
umt_status umt_fit_choose(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out);

/* The device bytes of a measured step in an arrangement (the margin left out). */
size_t umt_fit_device_bytes(const umt_fit_inputs *in, umt_fit_arrangement arrangement, const umt_fit_measure *m);
/* Whether a measured step fits the inputs' budget and element limit in an arrangement. */
bool umt_fit_ok(const umt_fit_inputs *in, umt_fit_arrangement arrangement, const umt_fit_measure *m);

#endif /* UMT_MEMORY_FIT_H */
