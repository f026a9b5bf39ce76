/*
 * kernels/cpu/optim.c — optimizer updates, in place, element by element.
 *
 * Each kernel is PyTorch's update rule for one parameter tensor (torch.optim.SGD, Adam, AdamW,
 * Adadelta, single-tensor path), so a run here can be compared with the same run in PyTorch to
 * within float rounding. g is the gradient, p the parameter; every formula is per element.
 *
 * Each rule is written once, in its fused form (kernels/optim_step.h): with a zero fusion that is
 * the plain update, which is all the plain slots do. Step scalars are host memory here.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* non-temporal stores: no C construct says "past the caches" */
#endif

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"

/* Shared with the CUDA backend, so that both refuse a bad copy alike, in the same words. */
umt_status umt_update_fusion_check(const char *op, umt_update_fusion fusion) {
    if (fusion.lowp && fusion.lowp_dtype != UMT_BF16 && fusion.lowp_dtype != UMT_F16)
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: low-precision copy of dtype %s (expected bf16 or f16)", op,
                        umt_dtype_name(fusion.lowp_dtype));
    if (fusion.zero_grad && fusion.grad_bf16)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: zero_grad with grad_bf16 (the update consumes an f32 gradient "
                        "only)", op);
    return UMT_OK;
}

/* After an update that ran (applied or skipped): its f32 gradient zeroed when the fusion says
 * the update consumes it. A pass of its own here, where it replaces the zero fill's. */
static umt_status consumed(umt_status status, const float *grad, int64_t n, umt_update_fusion fusion) {
    if (status == UMT_OK && fusion.zero_grad && grad && n > 0) memset((float *)grad, 0, (size_t)n * sizeof *grad);
    return status;
}

/* The gradient's element i, from grad or its bf16 copy, times the step's multiplier when there
 * are step scalars (1 / loss scale, clipping). */
static float gradient_at(const float *grad, int64_t i, umt_update_fusion fusion) {
    float g = fusion.grad_bf16 ? umt_bf16_to_f32(fusion.grad_bf16[i]) : grad[i];
    return fusion.scalars ? g * fusion.scalars->multiplier : g;
}

/* A gradient neither given nor given in bf16 is the caller's mistake, named here. */
static umt_status check_gradient(const char *op, const float *grad, umt_update_fusion fusion) {
    if (!grad && !fusion.grad_bf16) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: grad NULL and no grad_bf16", op);
    return UMT_OK;
}

/* Elements of the plain Adam update per block: the block's masters (16 KiB) are still in the
 * level-1 cache when its compute copy is written. */
#define ADAM_BLOCK 4096

/* The new masters param[first..end), rounded to nearest even into the low-precision copy: a loop
 * of its own after the update's, so that the update's loop stays free of calls (and vectorized). */
static void store_lowp_range(umt_update_fusion fusion, const float *param, int64_t first, int64_t end) {
    uint16_t *lowp = fusion.lowp;
    if (fusion.lowp_channels == 0 && fusion.lowp_dtype == UMT_BF16)
        for (int64_t i = first; i < end; ++i) lowp[i] = umt_f32_to_bf16(param[i]);
    else
        for (int64_t i = first; i < end; ++i) {
            int64_t at = umt_lowp_index(i, fusion.lowp_channels, fusion.lowp_pixels);
            lowp[at] = fusion.lowp_dtype == UMT_BF16 ? umt_f32_to_bf16(param[i]) : umt_f32_to_f16(param[i]);
        }
}

/* Elements of an update from which its bf16 compute copy is streamed past the caches: a copy this
 * long is not read again by the CPU (the offload tier's threads write it for the GPU's next copy
 * in), so an ordinary store's read of the line first is wasted memory traffic (the tier's
 * threads share the host's memory with the link; docs/PERF.md, "Figures behind the comments").
 * Shorter updates keep ordinary stores, whose lines the next reader may still find in the cache. */
#define STREAM_AT_LEAST ((int64_t)1 << 16)

/* store_lowp_range for a plain bf16 copy, a block of at most ADAM_BLOCK elements: the values
 * rounded into a buffer in the level-1 cache (the same loop, vectorized), then written out with
 * non-temporal stores where the destination is 16-byte aligned. The same bits as the loop; off
 * x86, the loop itself. */
static void stream_bf16_block(umt_update_fusion fusion, const float *param, int64_t first, int64_t end) {
#if defined(__SSE2__)
    _Alignas(16) uint16_t staged[ADAM_BLOCK];
    int64_t n = end - first, i = 0;
    for (int64_t k = 0; k < n; ++k) staged[k] = umt_f32_to_bf16(param[first + k]);
    uint16_t *out = (uint16_t *)fusion.lowp + first;
    for (; i < n && ((uintptr_t)(out + i) & 15); ++i) out[i] = staged[i];
    for (; i + 8 <= n; i += 8) _mm_stream_si128((__m128i *)(out + i), _mm_loadu_si128((const __m128i *)(staged + i)));
    for (; i < n; ++i) out[i] = staged[i];
#else
    store_lowp_range(fusion, param, first, end);
#endif
}

/* Non-temporal stores are ordered with nothing after them: they are made visible before the
 * caller learns the update is done (the tier's threads then publish it with an atomic store). */
static void stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* The new master, rounded to nearest even into the low-precision copy, when there is one. */
static void store_lowp(umt_update_fusion fusion, int64_t i, float value) {
    if (!fusion.lowp) return;
    uint16_t *lowp = fusion.lowp;
    int64_t at = umt_lowp_index(i, fusion.lowp_channels, fusion.lowp_pixels);
    lowp[at] = fusion.lowp_dtype == UMT_BF16 ? umt_f32_to_bf16(value) : umt_f32_to_f16(value);
}

/* SGD, dampening 0, no Nesterov:
 *   g' = g + weight_decay * p
 *   v  = momentum * v + g'      (PyTorch starts v at g'; a zeroed v gives the same value)
 *   p  = p - lr * v
 * With momentum 0 there is no velocity: p = p - lr * g', and velocity may be NULL. */
static umt_status sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                             float weight_decay, umt_update_fusion fusion) {
    if (momentum != 0.0f && !velocity)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "sgd_update: momentum %g needs a velocity buffer (got NULL)",
                        momentum);
    UMT_TRY(umt_update_fusion_check("sgd_update", fusion));
    UMT_TRY(check_gradient("sgd_update", grad, fusion));
    if (fusion.scalars && fusion.scalars->found_inf) return UMT_OK;
    if (fusion.lr_on_device) lr = *fusion.lr_on_device;
    for (int64_t i = 0; i < n; ++i) {
        float g = gradient_at(grad, i, fusion);
        g += weight_decay * param[i];
        if (momentum != 0.0f) {
            velocity[i] = momentum * velocity[i] + g;
            g = velocity[i];
        }
        param[i] -= lr * g;
        store_lowp(fusion, i, param[i]);
    }
    return UMT_OK;
}

umt_status umt_cpu_sgd_update_fused(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                    float momentum, float weight_decay, umt_update_fusion fusion) {
    return consumed(sgd_update(param, grad, velocity, n, lr, momentum, weight_decay, fusion), grad, n, fusion);
}

umt_status umt_cpu_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                              float weight_decay) {
    return umt_cpu_sgd_update_fused(param, grad, velocity, n, lr, momentum, weight_decay, (umt_update_fusion){0});
}

/* What one Adam step of one tensor holds constant over its elements. */
typedef struct {
    float beta1, beta2, eps, weight_decay, step_size, bias_correction2_sqrt, decay;
    bool decoupled;
} adam_constants;

/* Adam (decoupled = false) and AdamW (decoupled = true), step counting from 1:
 *   Adam:  g' = g + weight_decay * p
 *   AdamW: p  = p * (1 - lr * weight_decay), then g' = g
 *   m = beta1 * m + (1 - beta1) * g'
 *   v = beta2 * v + (1 - beta2) * g'^2
 *   p = p - lr * mhat / (sqrt(vhat) + eps),  mhat = m / (1 - beta1^step), vhat = v / (1 - beta2^step)
 * The last line is evaluated as PyTorch does, p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),
 * so that eps enters at the same place and rounding follows the same path. Here: element i, its
 * gradient g already scaled; the new parameter is left in param[i]. */
static inline void adam_element(float *param, float g, float *m, float *v, int64_t i, const adam_constants *k) {
    if (k->decoupled)
        param[i] *= k->decay;
    else
        g += k->weight_decay * param[i];
    m[i] = k->beta1 * m[i] + (1.0f - k->beta1) * g;
    v[i] = k->beta2 * v[i] + (1.0f - k->beta2) * g * g;
    float denom = sqrtf(v[i]) / k->bias_correction2_sqrt + k->eps;
    param[i] -= k->step_size * m[i] / denom;
}

static umt_status adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, bool decoupled, int64_t step,
                              umt_update_fusion fusion) {
    if (step < 1) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "adam_update: step %lld (expected >= 1)", (long long)step);
    UMT_TRY(umt_update_fusion_check("adam_update", fusion));
    UMT_TRY(check_gradient("adam_update", grad, fusion));
    const umt_step_scalars *s = fusion.scalars;
    if (s && s->found_inf) return UMT_OK;
    if (fusion.lr_on_device) lr = *fusion.lr_on_device;
    /* The corrections depend on the step only: computed once, in double, as PyTorch does on the
     * host; with step scalars, from the steps really applied (kernels/optim_step.h, same formula). */
    double bias_correction1 = 1.0 - pow(beta1, (double)step);
    double bias_correction2 = 1.0 - pow(beta2, (double)step);
    adam_constants k = {
        .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay, .decoupled = decoupled,
        .step_size = s ? s->adam_step_size : (float)(lr / bias_correction1),
        .bias_correction2_sqrt = s ? s->adam_bias_correction2_sqrt : (float)sqrt(bias_correction2),
        .decay = decoupled ? 1.0f - lr * weight_decay : 1.0f,
    };
    /* The plain update (the offload tier's CPU threads run it on whole layers) gets a loop with
     * no call in it, which the compiler vectorizes (.bazelrc): sqrt and division are exact in
     * every lane, so each element gets the same bits as in the general loop. A compute copy (bf16
     * or fp16 offloaded) is written by a loop of its own from the same new masters (one loop doing
     * both does not vectorize), a block at a time, so that it reads the masters from the cache the
     * update left them in rather than from memory. */
    if (!s) {
        const uint16_t *g16 = fusion.grad_bf16;
        bool stream = fusion.lowp && fusion.lowp_channels == 0 && fusion.lowp_dtype == UMT_BF16 && n >= STREAM_AT_LEAST;
        for (int64_t first = 0; first < n; first += ADAM_BLOCK) {
            int64_t end = n - first < ADAM_BLOCK ? n : first + ADAM_BLOCK;
            if (g16)
                for (int64_t i = first; i < end; ++i) adam_element(param, umt_bf16_to_f32(g16[i]), m, v, i, &k);
            else
                for (int64_t i = first; i < end; ++i) adam_element(param, grad[i], m, v, i, &k);
            if (stream) stream_bf16_block(fusion, param, first, end);
            else if (fusion.lowp) store_lowp_range(fusion, param, first, end);
        }
        if (stream) stream_fence();
        return UMT_OK;
    }
    for (int64_t i = 0; i < n; ++i) {
        adam_element(param, gradient_at(grad, i, fusion), m, v, i, &k);
        store_lowp(fusion, i, param[i]);
    }
    return UMT_OK;
}

umt_status umt_cpu_adam_update_fused(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                     float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                     int64_t step, umt_update_fusion fusion) {
    return consumed(adam_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, decoupled, step, fusion),
                    grad, n, fusion);
}

umt_status umt_cpu_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, bool decoupled, int64_t step) {
    return umt_cpu_adam_update_fused(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, decoupled, step,
                                     (umt_update_fusion){0});
}

/* Adadelta:
 *   g'    = g + weight_decay * p
 *   sq    = rho * sq + (1 - rho) * g'^2
 *   delta = sqrt(acc + eps) / sqrt(sq + eps) * g'
 *   acc   = rho * acc + (1 - rho) * delta^2
 *   p     = p - lr * delta
 * (square_avg holds sq, delta_avg holds acc.) */
typedef struct {
    float lr, rho, eps, weight_decay;
} adadelta_constants;

/* Element i, its gradient g already scaled; the new parameter is left in param[i]. */
static inline void adadelta_element(float *param, float g, float *square_avg, float *delta_avg, int64_t i,
                                    const adadelta_constants *k) {
    g += k->weight_decay * param[i];
    square_avg[i] = k->rho * square_avg[i] + (1.0f - k->rho) * g * g;
    float std = sqrtf(square_avg[i] + k->eps);
    float delta = sqrtf(delta_avg[i] + k->eps) / std * g;
    delta_avg[i] = k->rho * delta_avg[i] + (1.0f - k->rho) * delta * delta;
    param[i] -= k->lr * delta;
}

static umt_status adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                  float lr, float rho, float eps, float weight_decay, umt_update_fusion fusion) {
    UMT_TRY(umt_update_fusion_check("adadelta_update", fusion));
    UMT_TRY(check_gradient("adadelta_update", grad, fusion));
    if (fusion.scalars && fusion.scalars->found_inf) return UMT_OK;
    if (fusion.lr_on_device) lr = *fusion.lr_on_device;
    adadelta_constants k = {lr, rho, eps, weight_decay};
    /* As Adam's: the update with f32 gradients and no compute copy (the CPU context's) gets loops
     * with no call in them, which the compiler vectorizes, each element's bits unchanged. */
    if (!fusion.lowp && !fusion.grad_bf16) {
        if (fusion.scalars) {
            float multiplier = fusion.scalars->multiplier; /* gradient_at's */
            for (int64_t i = 0; i < n; ++i) adadelta_element(param, grad[i] * multiplier, square_avg, delta_avg, i, &k);
        } else {
            for (int64_t i = 0; i < n; ++i) adadelta_element(param, grad[i], square_avg, delta_avg, i, &k);
        }
        return UMT_OK;
    }
    for (int64_t i = 0; i < n; ++i) {
        adadelta_element(param, gradient_at(grad, i, fusion), square_avg, delta_avg, i, &k);
        store_lowp(fusion, i, param[i]);
    }
    return UMT_OK;
}

umt_status umt_cpu_adadelta_update_fused(float *param, const float *grad, float *square_avg, float *delta_avg,
                                         int64_t n, float lr, float rho, float eps, float weight_decay,
                                         umt_update_fusion fusion) {
    return consumed(adadelta_update(param, grad, square_avg, delta_avg, n, lr, rho, eps, weight_decay, fusion), grad,
                    n, fusion);
}

umt_status umt_cpu_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                   float lr, float rho, float eps, float weight_decay) {
    return umt_cpu_adadelta_update_fused(param, grad, square_avg, delta_avg, n, lr, rho, eps, weight_decay,
                                         (umt_update_fusion){0});
}

/* One tensor's update over its elements [first, end): the fused kernel on that stretch. */
static umt_status update_stretch(const umt_update_tensor *x, umt_update_rule rule, umt_update_fusion fusion,
                                 int64_t first, int64_t end) {
    const float *grad = x->grad ? x->grad + first : NULL;
    float *param = x->param + first, *s0 = x->state0 ? x->state0 + first : NULL;
    float *s1 = x->state1 ? x->state1 + first : NULL;
    switch (rule.kind) {
    case UMT_OPT_SGD:
        return umt_cpu_sgd_update_fused(param, grad, s0, end - first, rule.lr, rule.momentum, rule.weight_decay,
                                        fusion);
    case UMT_OPT_ADAM:
    case UMT_OPT_ADAMW:
        return umt_cpu_adam_update_fused(param, grad, s0, s1, end - first, rule.lr, rule.beta1, rule.beta2, rule.eps,
                                         rule.weight_decay, rule.decoupled, rule.step, fusion);
    case UMT_OPT_ADADELTA:
        return umt_cpu_adadelta_update_fused(param, grad, s0, s1, end - first, rule.lr, rule.rho, rule.eps,
                                             rule.weight_decay, fusion);
    default: return umt_fail(UMT_ERR_INVALID_ARGUMENT, "multi_update: kind %d", (int)rule.kind);
    }
}

typedef struct {
    const umt_update_tensor *tensors;
    int count;
    umt_update_rule rule;
    umt_update_fusion common;
} multi_update_job;

/* Part `part` of every tensor: each element's update is its own, so the split changes no bit. */
static void multi_update_part(void *arg, int part, int parts) {
    const multi_update_job *job = arg;
    for (int i = 0; i < job->count; ++i) {
        int64_t first, end;
        umt_cpu_part_range(job->tensors[i].n, 16, part, parts, &first, &end);
        /* Cannot fail: umt_cpu_multi_update made each call with these arguments first. */
        if (first < end) (void)update_stretch(&job->tensors[i], job->rule, job->common, first, end);
    }
}

/* The multi-tensor update is, by definition, the per-tensor updates one after another. On the CPU
 * backend's threads when no tensor has a low-precision copy (whose layout may reorder elements:
 * the CPU context has none): each part takes a stretch of every tensor. */
umt_status umt_cpu_multi_update(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                                umt_update_fusion common) {
    bool copies = common.lowp || common.grad_bf16;
    int64_t elements = 0;
    for (int i = 0; i < count; ++i) copies = copies || tensors[i].lowp, elements += tensors[i].n;
    if (copies) {
        for (int i = 0; i < count; ++i) {
            umt_update_fusion fusion = common;
            fusion.lowp = tensors[i].lowp;
            fusion.lowp_channels = tensors[i].lowp_channels;
            fusion.lowp_pixels = tensors[i].lowp_pixels;
            UMT_TRY(update_stretch(&tensors[i], rule, fusion, 0, tensors[i].n));
        }
        return UMT_OK;
    }
    /* Each call's checks first, on no elements: a refusal comes before any update, as one thread's would. */
    for (int i = 0; i < count; ++i) UMT_TRY(update_stretch(&tensors[i], rule, common, 0, 0));
    multi_update_job job = {tensors, count, rule, common};
    umt_cpu_parallel(umt_cpu_parts(elements, 1 << 15), multi_update_part, &job);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The step scalars (kernels/optim_step.h) */

/* One sequential sum, in double, in partials[0]; the other partials are zero. */
static void grad_sumsq(const float *grad, int64_t n, double *partials) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += (double)grad[i] * grad[i];
    partials[0] = sum;
    for (int k = 1; k < UMT_GRAD_SUMSQ_PARTIALS; ++k) partials[k] = 0.0;
}

umt_status umt_cpu_step_decide(const umt_update_tensor *tensors, int count, double *partials,
                               umt_step_scalars *scalars, umt_step_options options) {
    for (int t = 0; t < count; ++t)
        grad_sumsq(tensors[t].grad, tensors[t].n, partials + (size_t)t * UMT_GRAD_SUMSQ_PARTIALS);
    double sumsq = 0.0;
    for (int64_t i = 0; i < (int64_t)count * UMT_GRAD_SUMSQ_PARTIALS; ++i) sumsq += partials[i];
    umt_step_finish(scalars, sumsq, partials, count, options);
    return UMT_OK;
}
