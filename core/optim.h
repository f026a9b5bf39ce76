/*
 * core/optim.h — what checkpoints (core/checkpoint.c) may see of an optimizer.
 *
 * The optimizer's struct stays private to core/optim.c; a checkpoint needs only its kind, its
 * step count and its state tensors, one after another: parameter by parameter (in the order the
 * optimizer covers them, its context's creation order), and within a parameter state 0, 1, ...
 */
#ifndef UMT_CORE_OPTIM_H
#define UMT_CORE_OPTIM_H

#include <stdint.h>

#include "umtrain.h"

umt_context *umt_optimizer_context(const umt_optimizer *opt);
umt_optimizer_kind umt_optimizer_kind_of(const umt_optimizer *opt);
/* "sgd", "adam", "adamw", "adadelta"; "invalid-optimizer" for anything else. */
const char *umt_optimizer_kind_name(umt_optimizer_kind kind);

/* Number of state tensors the optimizer holds (parameters covered x states per parameter). */
int umt_optimizer_state_count(const umt_optimizer *opt);
/* State tensor i (0 <= i < umt_optimizer_state_count); its parameter's name and the state's index
 * within that parameter go to *param_name and *state_index. NULL for an i out of range. */
umt_tensor *umt_optimizer_state_at(const umt_optimizer *opt, int i, const char **param_name, int *state_index);

/* Sets the steps taken so far (Adam's bias correction counts from it). */
void umt_optimizer_set_steps(umt_optimizer *opt, int64_t steps);

#endif /* UMT_CORE_OPTIM_H */
