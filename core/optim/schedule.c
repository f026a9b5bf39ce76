/*
 * core/optim/schedule.c — learning-rate schedules, as pure functions of the step or epoch.
 *
 * A trainer asks for the rate it wants and hands it to umt_optimizer_set_lr; the schedules
 * keep no state, so resuming from a checkpoint needs only the epoch or step number.
 */
#include <math.h>

#include "umtrain.h"

/* math.h's M_PI is not part of C11. */
static const double pi = 3.14159265358979323846;

/* base_lr * gamma^floor(epoch / step_size), as torch.optim.lr_scheduler.StepLR. A step_size
 * below 1 means "never decay" and a negative epoch counts as epoch 0, rather than dividing by
 * zero or growing the rate. */
float umt_lr_step(float base_lr, float gamma, int step_size, int epoch) {
    if (step_size < 1 || epoch < 0) return base_lr;
    return (float)((double)base_lr * pow((double)gamma, (double)(epoch / step_size)));
}

/* min_lr + (base_lr - min_lr) * (1 + cos(pi * t / total)) / 2, as CosineAnnealingLR without
 * restarts; t is clamped to [0, total] so the rate stays at min_lr after the end, and
 * total <= 0 (no schedule) keeps base_lr. */
float umt_lr_cosine(float base_lr, float min_lr, int64_t t, int64_t total) {
    if (total <= 0) return base_lr;
    if (t < 0) t = 0;
    if (t > total) t = total;
    double progress = (double)t / (double)total;
    return (float)((double)min_lr + ((double)base_lr - (double)min_lr) * (1.0 + cos(pi * progress)) / 2.0);
}
