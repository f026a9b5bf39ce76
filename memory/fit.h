/*
 * memory/fit.h — whether a training step fits, and in how many micro-batches: the decision of
 * the memory plan (include/umtrain.h, umt_memory_plan_make), pure C, from sizes and the budget.
 *
 * The plan's caller measures a step at a micro-batch size (core/step/memory_plan.c does it with
 * dry steps: the most device bytes held at once, the largest tensor); this file decides, in the
 * issue's order:
 *   1. the state (weights, gradients, optimizer state on the device) alone passes the budget:
 *      the offload tier is needed for it, nothing else helps;
 *   2. the whole batch fits: one micro-batch;
 *   3. one sample does not fit: the offload tier is needed for the saved activations;
 *   4. otherwise the smallest k whose micro-batch ceil(B/k) fits. A step's need grows with its
 *      micro-batch, so k is found by bisection over 1..B (about log2 B measures; each is a dry
 *      step, cheap: no kernel runs), then lowered to the fewest micro-batches of that size.
 * A step fits when its device peak and the margin are within the budget (no budget, 0, on the
 * CPU: always) and
 * its largest tensor within the element limit, and no library refused a shape.
 * (memory/plan.c is another plan: the activation arena's offsets within one step.)
 */
#ifndef UMT_MEMORY_FIT_H
#define UMT_MEMORY_FIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

/* A step measured at one micro-batch size. */
typedef struct {
    size_t device_peak_bytes;
    int64_t largest_elements;
    bool refused; /* a library refused a shape (cuDNN: a tensor over INT_MAX elements) */
} umt_fit_measure;

typedef umt_status (*umt_fit_measure_fn)(void *user, int64_t micro_batch, umt_fit_measure *out);

typedef struct {
    int64_t batch;         /* B >= 1 */
    int64_t forced_k;      /* 0: choose */
    int64_t element_limit; /* >= 1 */
    size_t budget_bytes;   /* 0: no budget */
    size_t margin_bytes;   /* kept free under the budget: what a measure cannot see */
    size_t state_bytes[3]; /* weights, grads, optim held on the device now */
} umt_fit_inputs;

typedef struct {
    umt_plan_verdict verdict;
    bool fits;
    int64_t k, micro_batch;
    umt_fit_measure at; /* the measure at micro_batch */
    char why[384];
} umt_fit_choice;

/* Decides as above; measure is called with micro-batch sizes in 1..B. Fails only when measure
 * fails. */
umt_status umt_fit_choose(const umt_fit_inputs *in, umt_fit_measure_fn measure, void *user, umt_fit_choice *out);

/* Whether a measured step fits the inputs' budget and element limit. */
bool umt_fit_ok(const umt_fit_inputs *in, const umt_fit_measure *m);

#endif /* UMT_MEMORY_FIT_H */
