/*
 * kernels/optim_step.h — the optimizer's step scalars: what a mixed-precision step decides on the
 * device, so that the host never waits for it.
 *
 * With loss scaling or gradient clipping on, one step of core/optim/optim.c is:
 *   1. grad_sumsq, once per parameter: its share of the sum of squares of every gradient;
 *   2. step_prepare, one thread: finishes the sum, then umt_step_finish below decides whether
 *      the step is skipped (an inf or NaN gradient), the factor every gradient is multiplied by
 *      (1 / loss scale, times the clipping coefficient), Adam's bias corrections for the steps
 *      really applied, and moves the loss scale (PyTorch's GradScaler rules);
 *   3. the fused updates, once per parameter, read that decision from the same memory.
 * umt_backward_scaled seeds the loss gradient from loss_scale with a device-to-device copy.
 * The block lives in the optim pool; the host reads it only when asked (a synchronising read).
 *
 * umt_step_finish is plain C that compiles for the host and the device alike, so the CPU
 * reference and the CUDA kernel make the same decision from the same sum.
 */
#ifndef UMT_KERNELS_OPTIM_STEP_H
#define UMT_KERNELS_OPTIM_STEP_H

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Partial sums each grad_sumsq call writes: a fixed split, so that the finishing sum adds the
 * same numbers in the same order on every run (a deterministic reduction, no atomics). */
#define UMT_GRAD_SUMSQ_PARTIALS 32

/* PyTorch's GradScaler factors. */
#define UMT_LOSS_SCALE_BACKOFF 0.5f
#define UMT_LOSS_SCALE_GROWTH 2.0f

typedef struct {
    float loss_scale;   /* backward's seed for the loss gradient (1 without loss scaling) */
    float multiplier;   /* this step's gradient factor: clip coefficient / loss scale */
    float grad_norm;    /* this step's global L2 norm of the unscaled gradients (inf/NaN on overflow) */
    int32_t found_inf;  /* 1: a gradient of this step is inf or NaN, and the step is skipped */
    int32_t growth_count;  /* clean steps since the loss scale last changed */
    int64_t skipped_steps; /* steps skipped for an inf or NaN gradient */
    int64_t applied_steps; /* steps applied: what Adam's bias correction counts */
    float adam_step_size;             /* lr / (1 - beta1^applied_steps) */
    float adam_bias_correction2_sqrt; /* sqrt(1 - beta2^applied_steps) */
} umt_step_scalars;

/* What step_prepare needs from the optimizer's options, by value. */
typedef struct {
    float max_grad_norm; /* 0: no clipping */
    bool loss_scaling;
    int32_t growth_interval;
    bool adam; /* compute Adam's factors from lr, beta1, beta2 */
    float lr, beta1, beta2;
    const float *lr_on_device; /* non-NULL: lr is read here instead (a CUDA graph's replays) */
} umt_step_options;

/* What a fused update adds to the plain one; all zero is exactly the plain update:
 *   scalars — the step scalars (device memory), or NULL: the gradient is used as it is and the
 *             update always happens. Otherwise g = grad * multiplier, nothing is written when
 *             found_inf is set, and Adam takes its step factors from here, not from `step`;
 *   lowp    — the parameter's bf16 or f16 copy (NULL: none), rewritten from the new fp32
 *             master (round to nearest even) in the same pass;
 *   lowp_channels, lowp_pixels — 0: lowp in the master's order. Else the master is [k,
 *             lowp_channels, lowp_pixels] (a conv weight K,C,R,S) and lowp is stored K,R,S,C,
 *             the NHWC layout of core/precision.h: element i goes to umt_lowp_index;
 *   lr_on_device — NULL, or where the kernel reads the learning rate (in stream order) instead
 *             of its lr argument: a captured step replays with each step's rate. Adam takes it
 *             only with scalars (its step size is then the scalars'), and for AdamW's decay. */
typedef struct {
    const umt_step_scalars *scalars;
    const float *lr_on_device;
    void *lowp;
    umt_dtype lowp_dtype;
    int64_t lowp_channels, lowp_pixels;
} umt_update_fusion;

/* One parameter of a multi-tensor update: its buffers (state1 NULL for SGD, both state buffers
 * NULL for SGD without momentum) and its low-precision copy as in umt_update_fusion. */
typedef struct {
    float *param;
    const float *grad;
    float *state0, *state1;
    void *lowp;
    int64_t n;
    int64_t lowp_channels, lowp_pixels;
} umt_update_tensor;

/* The rule and hyper-parameters every tensor of a multi-tensor update shares (PyTorch's names;
 * the fields a kind does not use are ignored). */
typedef struct {
    umt_optimizer_kind kind;
    float lr, momentum, weight_decay, beta1, beta2, eps, rho;
    bool decoupled; /* AdamW */
    int64_t step;   /* Adam without step scalars: the step counting from 1 */
} umt_update_rule;

/* Where master element i lands in the compute copy (see umt_update_fusion). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t umt_lowp_index(int64_t i, int64_t channels, int64_t pixels) {
    if (channels == 0) return i;
    int64_t k = i / (channels * pixels), c = i / pixels % channels, pixel = i % pixels;
    return (k * pixels + pixel) * channels + c;
}

/* The scalars at the start of training. */
static inline umt_step_scalars umt_step_scalars_initial(bool loss_scaling, float loss_scale_init) {
    umt_step_scalars s;
    memset(&s, 0, sizeof s); /* padding included: the block's bytes are all defined */
    s.loss_scale = loss_scaling ? loss_scale_init : 1.0f;
    s.multiplier = 1.0f;
    return s;
}

#ifdef __CUDACC__
__host__ __device__
#endif
static inline void umt_step_finish(umt_step_scalars *s, double sumsq, umt_step_options o) {
    /* Each square of a finite float is exact in double and at most ~1.2e77, and no realistic
     * count of them overflows a double: the sum is inf or NaN exactly when a gradient is. (The
     * comparison is false for NaN.) */
    bool found_inf = !(sumsq <= DBL_MAX);
    double scale = o.loss_scaling ? s->loss_scale : 1.0;
    /* The gradients hold loss_scale times the true ones; PyTorch's clip_grad_norm_ (after
     * GradScaler.unscale_): coefficient max_norm / (norm + 1e-6), clamped to 1. */
    double norm = sqrt(sumsq) / scale;
    double coefficient = 1.0;
    if (o.max_grad_norm > 0.0f) {
        coefficient = o.max_grad_norm / (norm + 1e-6);
        if (coefficient > 1.0) coefficient = 1.0;
    }
    s->grad_norm = (float)norm;
    s->found_inf = found_inf;
    /* One rounding for both factors (exact for a power-of-two scale and no clipping). */
    s->multiplier = (float)(coefficient / scale);
    if (found_inf) {
        s->skipped_steps++;
    } else {
        s->applied_steps++;
        if (o.adam) {
            /* As kernels/cpu/optim.c computes them from a host step, in double. */
            double bias_correction1 = 1.0 - pow(o.beta1, (double)s->applied_steps);
            double bias_correction2 = 1.0 - pow(o.beta2, (double)s->applied_steps);
            double lr = o.lr_on_device ? *o.lr_on_device : o.lr;
            s->adam_step_size = (float)(lr / bias_correction1);
            s->adam_bias_correction2_sqrt = (float)sqrt(bias_correction2);
        }
    }
    if (!o.loss_scaling) return;
    /* GradScaler: back off at once on overflow; grow after growth_interval clean steps in a
     * row, unless growing would overflow the scale itself. */
    if (found_inf) {
        s->loss_scale *= UMT_LOSS_SCALE_BACKOFF;
        s->growth_count = 0;
    } else if (++s->growth_count >= o.growth_interval) {
        float grown = s->loss_scale * UMT_LOSS_SCALE_GROWTH;
        if (grown <= FLT_MAX) s->loss_scale = grown;
        s->growth_count = 0;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_OPTIM_STEP_H */
