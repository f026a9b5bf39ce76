/*
 * kernels/optim_step.h — the optimizer's step scalars: what a step decides on the device, so that
 * the host never waits for it.
 *
 * With loss scaling, gradient clipping or the non-finite check on, one step of core/optim/optim.c is:
 *   1. step_decide: every gradient's share of the sum of squares (UMT_GRAD_SUMSQ_PARTIALS per
 *      parameter), then, once all are written, umt_step_finish below decides whether the step is
 *      skipped (an inf or NaN gradient, a non-finite loss, a run the check has stopped), the
 *      factor every gradient is multiplied by (1 / loss scale, times the clipping coefficient),
 *      Adam's bias corrections for the steps really applied, and moves the loss scale
 *      (PyTorch's GradScaler rules);
 *   2. the fused updates, once per parameter (or in one launch), read that decision from the same
 *      memory: a skipped step writes nothing (but zeros over the gradients an update consumes:
 *      umt_update_fusion.zero_grad below).
 * umt_backward_scaled seeds the loss gradient from loss_scale with a device-to-device copy.
 * The block lives in the optim pool; the host reads it only when asked (a synchronising read).
 *
 * The non-finite check (umt_optimizer_options.on_nonfinite) records the first step whose loss or
 * gradients are NaN or infinite, and writes its count once into a word of host memory (the
 * doorbell: pinned on CUDA, so a kernel's store reaches it without a copy): the host looks at that
 * word whenever it likes, without waiting for the GPU, and learns of the step a step or two
 * after it was queued. The update of that step is skipped on the device, as fp16's scaler skips
 * an overflow, so nothing non-finite reaches a parameter whenever the host looks.
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

#ifdef __CUDACC__
#define UMT_HOST_DEVICE __host__ __device__
#else
#define UMT_HOST_DEVICE
#endif

/* Partial sums per gradient: a fixed split, so that the finishing sum adds the same numbers in
 * the same order on every run (a deterministic reduction). On CUDA each is a block's, so a large
 * gradient is walked by this many blocks: 32 left the MNIST CNN's fc1 (1.2M elements) to too few
 * blocks, a visible share of a small step (docs/PERF.md, "The step's decision with 128 partials").
 * The split only orders the norm's additions: it changes the norm's last bits, and so a clipped
 * step's, never an unclipped one. */
#define UMT_GRAD_SUMSQ_PARTIALS 128

/* PyTorch's GradScaler factors. */
#define UMT_LOSS_SCALE_BACKOFF 0.5f
#define UMT_LOSS_SCALE_GROWTH 2.0f

/* What the first non-finite step held (umt_step_scalars.first_nonfinite_what): bits. */
#define UMT_NONFINITE_FOUND_LOSS 1
#define UMT_NONFINITE_FOUND_GRADIENT 2

typedef struct {
    float loss_scale;   /* backward's seed for the loss gradient (1 without loss scaling) */
    float multiplier;   /* this step's gradient factor: clip coefficient / loss scale */
    float grad_norm;    /* this step's global L2 norm of the unscaled gradients (inf/NaN on overflow) */
    int32_t found_inf;  /* 1: this step is skipped (an inf or NaN gradient, a non-finite loss, a stop) */
    int32_t growth_count;  /* clean steps since the loss scale last changed */
    int64_t skipped_steps; /* steps skipped, for any of found_inf's reasons */
    int64_t applied_steps; /* steps applied: what Adam's bias correction counts */
    float adam_step_size;             /* lr / (1 - beta1^applied_steps) */
    float adam_bias_correction2_sqrt; /* sqrt(1 - beta2^applied_steps) */
    /* The non-finite check (umt_step_options.nonfinite) */
    int64_t steps;                /* steps decided, skipped ones included: umt_optimizer_steps' count */
    int64_t nonfinite_steps;      /* steps whose loss or gradients held NaN or an infinity */
    int64_t first_nonfinite_step; /* the first of them, as `steps` counted it (0: none yet) */
    float first_nonfinite_loss;   /* its loss (0 when it had none to read) */
    int32_t first_nonfinite_what; /* UMT_NONFINITE_FOUND_* */
    int32_t first_nonfinite_tensor; /* the first gradient (the update's order) that was not finite, or -1 */
    int32_t stopped;      /* UMT_NONFINITE_STOP after a non-finite step: every later update is skipped */
    uint32_t blocks_done; /* the CUDA step_decide's count of finished blocks (0 between calls) */
} umt_step_scalars;

/* What step_decide needs from the optimizer's options, by value. */
typedef struct {
    float max_grad_norm; /* 0: no clipping */
    bool loss_scaling;
    int32_t growth_interval;
    bool adam; /* compute Adam's factors from lr, beta1, beta2 */
    float lr, beta1, beta2;
    const float *lr_on_device; /* non-NULL: lr is read here instead (a CUDA graph's replays) */
    umt_nonfinite_policy nonfinite; /* UMT_NONFINITE_OFF: only the scaler's and clipping's decision */
    const float *loss;     /* the step's loss (device memory; NULL: none to check) */
    int64_t *doorbell;     /* host memory the decision may store into (pinned on CUDA), or NULL: the
                            * first non-finite step's count, written once */
    /* NULL, or (with loss) where the decision also copies the loss and adds it to a sum, loss_sum[0]
     * (loss_sum[1] gets the sum before the addition): a step graph's keeping (core/step/step_graph.c) */
    float *keep_loss, *loss_sum;
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
 *             only with scalars (its step size is then the scalars'), and for AdamW's decay;
 *   grad_bf16 — NULL, or the gradient rounded to bf16, read instead of grad (which may then be
 *             NULL): the offload tier's CPU threads under bf16 get gradients home at half the
 *             bytes (offload/host.c). The CPU backend only; the CUDA one refuses it;
 *   zero_grad — the update consumes the (f32) gradient: each element is set to 0 once read, and
 *             the whole gradient when the step is skipped, so that it is zero after the update
 *             as after a zero fill, without the fill's pass (core/optim/optim.c). grad must be
 *             writable then; not with grad_bf16. */
typedef struct {
    const umt_step_scalars *scalars;
    const float *lr_on_device;
    void *lowp;
    umt_dtype lowp_dtype;
    int64_t lowp_channels, lowp_pixels;
    const uint16_t *grad_bf16;
    bool zero_grad;
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
UMT_HOST_DEVICE static inline int64_t umt_lowp_index(int64_t i, int64_t channels, int64_t pixels) {
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
    s.first_nonfinite_tensor = -1;
    return s;
}

/* The tensor whose gradient made the sum of squares non-finite: the first partial that is NaN or
 * infinite names it (each tensor has UMT_GRAD_SUMSQ_PARTIALS, in the update's order); -1 if none. */
UMT_HOST_DEVICE static inline int32_t umt_step_first_nonfinite_tensor(const double *partials, int32_t tensors) {
    for (int64_t i = 0; i < (int64_t)tensors * UMT_GRAD_SUMSQ_PARTIALS; ++i)
        if (!(partials[i] <= DBL_MAX)) return (int32_t)(i / UMT_GRAD_SUMSQ_PARTIALS);
    return -1;
}

/* A step whose loss or gradients are not finite: counted; the first one's culprits recorded and
 * its count stored into the doorbell (the only store into host memory, once per run); under
 * UMT_NONFINITE_STOP every later update is skipped too. */
UMT_HOST_DEVICE static inline void umt_step_note_nonfinite(umt_step_scalars *s, bool loss_bad, bool gradient_bad,
                                                           const double *partials, int32_t tensors,
                                                           umt_step_options o) {
    s->nonfinite_steps++;
    if (o.nonfinite == UMT_NONFINITE_STOP) s->stopped = 1;
    if (s->first_nonfinite_step) return;
    s->first_nonfinite_step = s->steps;
    s->first_nonfinite_loss = o.loss ? *o.loss : 0.0f;
    s->first_nonfinite_what =
        (loss_bad ? UMT_NONFINITE_FOUND_LOSS : 0) | (gradient_bad ? UMT_NONFINITE_FOUND_GRADIENT : 0);
    s->first_nonfinite_tensor = gradient_bad ? umt_step_first_nonfinite_tensor(partials, tensors) : -1;
    if (o.doorbell) *(volatile int64_t *)o.doorbell = s->steps;
}

/* The step's decision from sumsq, the sum of partials (tensors gradients' worth of them). */
UMT_HOST_DEVICE static inline void umt_step_finish(umt_step_scalars *s, double sumsq, const double *partials,
                                                   int32_t tensors, umt_step_options o) {
    /* Each square of a finite float is exact in double and at most ~1.2e77, and no realistic
     * count of them overflows a double: the sum is inf or NaN exactly when a gradient is. (The
     * comparisons are false for NaN.) */
    bool gradient_bad = !(sumsq <= DBL_MAX);
    bool loss_bad = o.loss && !(fabsf(*o.loss) <= FLT_MAX);
    if (o.loss && o.keep_loss) {
        float loss = *o.loss, before = o.loss_sum[0]; /* as f32.keep_and_add keeps it, whatever it holds */
        *o.keep_loss = loss;
        o.loss_sum[1] = before;
        o.loss_sum[0] = before + loss;
    }
    /* Under loss scaling a gradient's overflow is the scaler's to handle (a smaller scale, and the
     * step skipped); a non-finite loss is the run's. */
    bool nonfinite = o.nonfinite != UMT_NONFINITE_OFF && (loss_bad || (gradient_bad && !o.loss_scaling));
    s->steps++;
    if (nonfinite) umt_step_note_nonfinite(s, loss_bad, gradient_bad, partials, tensors, o);
    bool found_inf = gradient_bad || nonfinite || s->stopped;
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
     * row, unless growing would overflow the scale itself. A step skipped for another reason
     * (its loss, a stopped run) leaves the scale alone. */
    if (gradient_bad) {
        s->loss_scale *= UMT_LOSS_SCALE_BACKOFF;
        s->growth_count = 0;
    } else if (!found_inf && ++s->growth_count >= o.growth_interval) {
        float grown = s->loss_scale * UMT_LOSS_SCALE_GROWTH;
        if (grown <= FLT_MAX) s->loss_scale = grown;
        s->growth_count = 0;
    }
}

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_OPTIM_STEP_H */
