/*
 * core/optim/optim.h — what the rest of umtrain may see of an optimizer: checkpoints
 * (core/checkpoint/) and subsystems that update parameters themselves (the offload tier).
 *
 * The optimizer's struct stays private to core/optim/optim.c; a checkpoint needs only its kind, its
 * step count and its state tensors, one after another: parameter by parameter (in the order the
 * optimizer covers them, its context's creation order), and within a parameter state 0, 1, ...
 */
#ifndef UMT_CORE_OPTIM_OPTIM_H
#define UMT_CORE_OPTIM_OPTIM_H

#include <stdint.h>

#include "kernels/optim_step.h"
#include "umtrain.h"

typedef struct umt_backend umt_backend; /* kernels/backend.h */

umt_context *umt_optimizer_context(const umt_optimizer *opt);
umt_optimizer_kind umt_optimizer_kind_of(const umt_optimizer *opt);
/* "sgd", "adam", "adamw", "adadelta"; "invalid-optimizer" for anything else. */
const char *umt_optimizer_kind_name(umt_optimizer_kind kind);

/* Number of state tensors the optimizer holds (parameters covered x states per parameter). */
int umt_optimizer_state_count(const umt_optimizer *opt);
/* State tensor i (0 <= i < umt_optimizer_state_count); its parameter's name and the state's index
 * within that parameter go to *param_name and *state_index. NULL for an i out of range. */
umt_tensor *umt_optimizer_state_at(const umt_optimizer *opt, int i, const char **param_name, int *state_index);

/* Sets the steps taken so far (Adam's bias correction counts from it; with step scalars, the
 * device's count of applied steps is set to it too: an upload). */
umt_status umt_optimizer_set_steps(umt_optimizer *opt, int64_t steps);

/* --- For a subsystem that updates parameters itself (core/hooks.h: the offload tier streams them
 *     through in chunks, during backward or after umt_optimizer_step's own updates) --- */

/* The parameters the optimizer covers (its context's creation order), and parameter i with its
 * state tensors (NULL where the rule keeps fewer than two). */
int umt_optimizer_parameter_count(const umt_optimizer *opt);
umt_tensor *umt_optimizer_parameter_at(const umt_optimizer *opt, int i, umt_tensor *state[2]);
/* Whether the optimizer keeps step scalars on the device (clipping or loss scaling is on), and
 * where (NULL without): umt_optimizer_step has queued this step's decision there before any
 * subsystem's update (the after_update event), so an update that reads it honours it. */
bool umt_optimizer_has_step_scalars(const umt_optimizer *opt);
const umt_step_scalars *umt_optimizer_scalars_on_device(const umt_optimizer *opt);
/* p's state tensors, as umt_optimizer_parameter_at; then one update of n elements at device
 * pointers, with the step umt_optimizer_step will count next. fusion (NULL: none) adds the step
 * scalars and the compute copy's range to rewrite (kernels/optim_step.h). */
umt_status umt_optimizer_state_of(const umt_optimizer *opt, const umt_tensor *p, umt_tensor *state[2]);
umt_status umt_optimizer_update_range(const umt_optimizer *opt, float *param, const float *grad, float *s0, float *s1,
                                      int64_t n, const umt_update_fusion *fusion);
/* The same rule run later, elsewhere (offload/host.c: CPU threads, after the step has moved
 * on): the options and the step umt_optimizer_step will count next, as they are now; then one
 * update of n elements with them, on backend be (fusion as above; its scalars where be reads). */
void umt_optimizer_snapshot(const umt_optimizer *opt, umt_optimizer_options *options, int64_t *step);
umt_status umt_optimizer_update_with(const umt_optimizer_options *options, int64_t step, const umt_backend *be,
                                     float *param, const float *grad, float *s0, float *s1, int64_t n,
                                     const umt_update_fusion *fusion);

/* --- The step scalars (kernels/optim_step.h), for umt_backward_scaled and for tests --- */

/* A copy of the step scalars (a synchronising download). Without loss scaling or clipping the
 * optimizer has none: *out is then the initial block (scale 1) with applied_steps = steps. */
umt_status umt_optimizer_read_scalars(const umt_optimizer *opt, umt_step_scalars *out);
/* Device address of the current loss scale (one f32), or NULL without loss scaling. */
const float *umt_optimizer_loss_scale_on_device(const umt_optimizer *opt);

#endif /* UMT_CORE_OPTIM_OPTIM_H */
