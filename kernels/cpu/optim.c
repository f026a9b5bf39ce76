/*
 * kernels/cpu/optim.c — optimizer updates, in place, element by element.
 *
 * Each kernel is PyTorch's update rule for one parameter tensor (torch.optim.SGD, Adam, AdamW,
 * Adadelta, single-tensor path), so a run here can be compared with the same run in PyTorch to
 * within float rounding. g is the gradient, p the parameter; every formula is per element.
 */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

/* SGD, dampening 0, no Nesterov:
 *   g' = g + weight_decay * p
 *   v  = momentum * v + g'      (PyTorch starts v at g'; a zeroed v gives the same value)
 *   p  = p - lr * v
 * With momentum 0 there is no velocity: p = p - lr * g', and velocity may be NULL. */
umt_status umt_cpu_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                              float weight_decay) {
    if (momentum != 0.0f && !velocity)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "sgd_update: momentum %g needs a velocity buffer (got NULL)",
                        momentum);
    for (int64_t i = 0; i < n; ++i) {
        float g = grad[i] + weight_decay * param[i];
        if (momentum != 0.0f) {
            velocity[i] = momentum * velocity[i] + g;
            g = velocity[i];
        }
        param[i] -= lr * g;
    }
    return UMT_OK;
}

/* Adam (decoupled = false) and AdamW (decoupled = true), step counting from 1:
 *   Adam:  g' = g + weight_decay * p
 *   AdamW: p  = p * (1 - lr * weight_decay), then g' = g
 *   m = beta1 * m + (1 - beta1) * g'
 *   v = beta2 * v + (1 - beta2) * g'^2
 *   p = p - lr * mhat / (sqrt(vhat) + eps),  mhat = m / (1 - beta1^step), vhat = v / (1 - beta2^step)
 * The last line is evaluated as PyTorch does, p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
 * so that eps enters at the same place and rounding follows the same path. */
umt_status umt_cpu_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, bool decoupled, int64_t step) {
    if (step < 1) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "adam_update: step %lld (expected >= 1)", (long long)step);
    /* The corrections depend on the step only: computed once, in double, as PyTorch does on the host. */
    double bias_correction1 = 1.0 - pow(beta1, (double)step);
    double bias_correction2 = 1.0 - pow(beta2, (double)step);
    float step_size = (float)(lr / bias_correction1);
    float bias_correction2_sqrt = (float)sqrt(bias_correction2);
    float decay = decoupled ? 1.0f - lr * weight_decay : 1.0f;
    for (int64_t i = 0; i < n; ++i) {
        float g = grad[i];
        if (decoupled)
            param[i] *= decay;
        else
            g += weight_decay * param[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float denom = sqrtf(v[i]) / bias_correction2_sqrt + eps;
        param[i] -= step_size * m[i] / denom;
    }
    return UMT_OK;
}

/* Adadelta:
 *   g'    = g + weight_decay * p
 *   sq    = rho * sq + (1 - rho) * g'^2
 *   delta = sqrt(acc + eps) / sqrt(sq + eps) * g'
 *   acc   = rho * acc + (1 - rho) * delta^2
 *   p     = p - lr * delta
 * (square_avg holds sq, delta_avg holds acc.) */
umt_status umt_cpu_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                   float lr, float rho, float eps, float weight_decay) {
    for (int64_t i = 0; i < n; ++i) {
        float g = grad[i] + weight_decay * param[i];
        square_avg[i] = rho * square_avg[i] + (1.0f - rho) * g * g;
        float std = sqrtf(square_avg[i] + eps);
        float delta = sqrtf(delta_avg[i] + eps) / std * g;
        delta_avg[i] = rho * delta_avg[i] + (1.0f - rho) * delta * delta;
        param[i] -= lr * delta;
    }
    return UMT_OK;
}
