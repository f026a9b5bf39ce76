/*
 * core/optim/optim.c — optimizers: SGD (momentum, weight decay), Adam, AdamW, Adadelta.
 *
 * An optimizer is a list of slots, one per parameter registered with the context when the
 * optimizer was made; each slot holds the parameter and the state tensors its kind needs, in
 * the optim pool (so the memory policy can place or offload them as a group). A step checks
 * every gradient first, then calls the backend's update kernel once per parameter: the
 * arithmetic lives in kernels/ (kernels/cpu/optim.c states each rule), and this file only
 * decides what is updated with what.
 *
 * Each update is the fused kernel: it also rewrites the parameter's low-precision copy, if the
 * context's precision gave it one. With loss scaling, clipping or the non-finite check on, the
 * optimizer also owns the step scalars (kernels/optim_step.h) in the optim pool, and a step first
 * gathers the gradients' sum of squares and lets the device decide the step: nothing waits for
 * the host. The check's doorbell, one word of host memory (the staging pool: pinned on CUDA),
 * is where the device says that a step was not finite, for the host to read without a wait.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/optim/optim.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/optim_step.h"
#include "memory/trace.h"

/* State tensors per parameter: SGD velocity | Adam m, v | Adadelta square_avg, delta_avg. */
#define UMT_OPTIM_MAX_STATE 2

typedef struct {
    umt_tensor *param;
    umt_tensor *state[UMT_OPTIM_MAX_STATE];
} umt_optim_slot;

struct umt_optimizer {
    umt_context *ctx;
    umt_optimizer_options options;
    int64_t steps; /* calls to umt_optimizer_step, skipped steps included */
    int slot_count;
    umt_optim_slot *slots;
    /* Only with loss scaling or clipping (else NULL): one umt_step_scalars, and
     * UMT_GRAD_SUMSQ_PARTIALS doubles per slot for the sum of squares. */
    umt_tensor *scalars;
    umt_tensor *partials;
    umt_tensor *doorbell;       /* the non-finite check's: one int64 in the staging pool, or NULL */
    umt_update_tensor *tensors; /* slot_count entries: the multi-tensor update's list */
};

/* ----------------------------------------------------------------------------------------- */
/* Kinds and defaults */

static const char *const kind_names[] = {
    [UMT_OPT_SGD] = "sgd", [UMT_OPT_ADAM] = "adam", [UMT_OPT_ADAMW] = "adamw", [UMT_OPT_ADADELTA] = "adadelta"};
#define KIND_COUNT ((int)(sizeof kind_names / sizeof kind_names[0]))

umt_status umt_optimizer_kind_parse(const char *name, umt_optimizer_kind *out) {
    if (!name || !out)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_kind_parse: %s is NULL", name ? "out" : "name");
    for (int k = 0; k < KIND_COUNT; ++k)
        if (strcmp(name, kind_names[k]) == 0) {
            *out = (umt_optimizer_kind)k;
            return UMT_OK;
        }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "optimizer \"%s\" is unknown (expected sgd, adam, adamw or adadelta)",
                    name);
}

static const char *const policy_names[] = {
    [UMT_NONFINITE_OFF] = "off", [UMT_NONFINITE_STOP] = "stop", [UMT_NONFINITE_SKIP] = "skip"};
#define POLICY_COUNT ((int)(sizeof policy_names / sizeof policy_names[0]))

umt_status umt_nonfinite_policy_parse(const char *name, umt_nonfinite_policy *out) {
    if (!name || !out) return umt_fail_null("umt_nonfinite_policy_parse", name ? "out" : "name");
    for (int p = 0; p < POLICY_COUNT; ++p)
        if (strcmp(name, policy_names[p]) == 0) {
            *out = (umt_nonfinite_policy)p;
            return UMT_OK;
        }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "non-finite policy \"%s\" is unknown (expected stop, skip or off)", name);
}

const char *umt_nonfinite_policy_name(umt_nonfinite_policy policy) {
    return (unsigned)policy < (unsigned)POLICY_COUNT ? policy_names[policy] : "invalid-policy";
}

umt_optimizer_options umt_optimizer_defaults(umt_optimizer_kind kind) {
    /* Fields a kind does not use still get PyTorch's values for the kind that does, so that
     * switching .kind on a set of defaults never leaves a zero eps or beta behind. */
    umt_optimizer_options o = {
        .kind = kind, .lr = 1e-3f, .weight_decay = 0.0f, .momentum = 0.0f,
        .beta1 = 0.9f, .beta2 = 0.999f, .rho = 0.9f, .eps = 1e-8f,
        /* PyTorch's GradScaler: init_scale 2^16, growth_interval 2000; clipping off. */
        .max_grad_norm = 0.0f, .loss_scaling = false, .loss_scale_init = 65536.0f,
        .loss_scale_growth_interval = 2000, .multi_tensor = true, .on_nonfinite = UMT_NONFINITE_OFF,
    };
    switch (kind) {
    case UMT_OPT_SGD: o.lr = 1e-2f; break;
    case UMT_OPT_ADAM: break;
    case UMT_OPT_ADAMW: o.weight_decay = 1e-2f; break;
    case UMT_OPT_ADADELTA:
        o.lr = 1.0f;
        o.eps = 1e-6f;
        break;
    }
    return o;
}

/* How many state tensors each parameter needs under these options. */
static int state_count(const umt_optimizer_options *o) {
    switch (o->kind) {
    case UMT_OPT_SGD: return o->momentum != 0.0f ? 1 : 0;
    case UMT_OPT_ADAM:
    case UMT_OPT_ADAMW:
    case UMT_OPT_ADADELTA: return 2;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* Validation: only the options the kind reads are checked, so a hand-built SGD option set
 * with eps and betas left at 0 is fine. Comparisons are written so that NaN fails them. */

static umt_status check_unit_interval(const char *name, float value) {
    if (!(value >= 0.0f && value < 1.0f))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: %s %g (expected 0 <= %s < 1)", name, value,
                        name);
    return UMT_OK;
}

/* Clipping and loss scaling; the scaler's fields are read only when it is on. */
static umt_status check_step_options(const umt_optimizer_options *o) {
    if (!(o->max_grad_norm >= 0.0f && isfinite(o->max_grad_norm)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "umt_optimizer_create: max_grad_norm %g (expected finite >= 0; 0 turns clipping off)",
                        o->max_grad_norm);
    if (!o->loss_scaling) return UMT_OK;
    if (!(o->loss_scale_init > 0.0f && isfinite(o->loss_scale_init)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: loss_scale_init %g (expected finite > 0)",
                        o->loss_scale_init);
    if (o->loss_scale_growth_interval < 1)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: loss_scale_growth_interval %d (expected >= 1)",
                        o->loss_scale_growth_interval);
    return UMT_OK;
}

static umt_status check_options(const umt_optimizer_options *o) {
    if ((unsigned)o->kind >= (unsigned)KIND_COUNT)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: kind %d (expected 0..%d)", (int)o->kind,
                        KIND_COUNT - 1);
    if (!(o->lr > 0.0f && isfinite(o->lr)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: lr %g (expected finite > 0)", o->lr);
    if (!(o->weight_decay >= 0.0f && isfinite(o->weight_decay)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: weight_decay %g (expected finite >= 0)",
                        o->weight_decay);
    if ((unsigned)o->on_nonfinite >= (unsigned)POLICY_COUNT)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: on_nonfinite %d (expected 0..%d: off, stop, "
                        "skip)", (int)o->on_nonfinite, POLICY_COUNT - 1);
    UMT_TRY(check_step_options(o));
    if (o->kind == UMT_OPT_SGD) return check_unit_interval("momentum", o->momentum);
    if (o->kind == UMT_OPT_ADADELTA) {
        UMT_TRY(check_unit_interval("rho", o->rho));
    } else {
        UMT_TRY(check_unit_interval("beta1", o->beta1));
        UMT_TRY(check_unit_interval("beta2", o->beta2));
    }
    if (!(o->eps > 0.0f && isfinite(o->eps)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: eps %g (expected finite > 0)", o->eps);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Creation and destruction */

/* Frees the state tensors and the optimizer; the context's list is the caller's business. */
static void release(void *object) {
    umt_optimizer *opt = object;
    umt_hooks_optimizer(opt->ctx, opt, false);
    for (int i = 0; i < opt->slot_count; ++i)
        for (int s = 0; s < UMT_OPTIM_MAX_STATE; ++s) umt_tensor_free(opt->slots[i].state[s]);
    umt_tensor_free(opt->scalars);
    umt_tensor_free(opt->partials);
    umt_tensor_free(opt->doorbell);
    free(opt->tensors);
    free(opt->slots);
    free(opt);
}

/* Zeroed state tensors shaped like each parameter, in the optim pool. */
static umt_status alloc_state(umt_optimizer *opt) {
    umt_context *ctx = opt->ctx;
    int count = state_count(&opt->options);
    for (int i = 0; i < opt->slot_count; ++i) {
        umt_tensor *p = opt->slots[i].param;
        for (int s = 0; s < count; ++s) {
            umt_tensor *t = umt_tensor_alloc_kind(ctx, UMT_POOL_OPTIM, UMT_F32, p->ndim, p->shape);
            /* umt_tensor_alloc has recorded which pool refused, why, and with which status. */
            if (!t) return umt_last_status();
            t->owner = p;
            opt->slots[i].state[s] = t;
            UMT_TRY(umt_kernels(ctx)->f32.fill(t->data, t->numel, 0.0f));
        }
    }
    return UMT_OK;
}

/* A byte tensor in a pool (the scalars block, the partial sums and the doorbell have no dtype). */
static umt_tensor *alloc_bytes(umt_context *ctx, umt_pool pool, size_t bytes) {
    int64_t shape[1] = {(int64_t)bytes};
    return umt_tensor_alloc(ctx, pool, UMT_U8, 1, shape);
}

/* The non-finite check's doorbell: host memory the device stores into, 0 until a step is not finite. */
static umt_status alloc_doorbell(umt_optimizer *opt) {
    opt->doorbell = alloc_bytes(opt->ctx, UMT_POOL_STAGING, sizeof(int64_t));
    if (!opt->doorbell) return umt_last_status();
    *(volatile int64_t *)opt->doorbell->data = 0;
    return UMT_OK;
}

/* The step scalars and the partial sums, when loss scaling, clipping or the non-finite check is on. */
static umt_status alloc_step_scalars(umt_optimizer *opt) {
    const umt_optimizer_options *o = &opt->options;
    if (!o->loss_scaling && o->max_grad_norm == 0.0f && o->on_nonfinite == UMT_NONFINITE_OFF) return UMT_OK;
    opt->scalars = alloc_bytes(opt->ctx, UMT_POOL_OPTIM, sizeof(umt_step_scalars));
    if (!opt->scalars) return umt_last_status();
    size_t partial_bytes = (size_t)opt->slot_count * UMT_GRAD_SUMSQ_PARTIALS * sizeof(double);
    opt->partials = alloc_bytes(opt->ctx, UMT_POOL_OPTIM, partial_bytes);
    if (!opt->partials) return umt_last_status();
    if (o->on_nonfinite != UMT_NONFINITE_OFF) UMT_TRY(alloc_doorbell(opt));
    umt_step_scalars initial = umt_step_scalars_initial(o->loss_scaling, o->loss_scale_init);
    return umt_kernels(opt->ctx)->f32.upload(opt->scalars->data, &initial, sizeof initial);
}

umt_status umt_optimizer_create(umt_context *ctx, const umt_optimizer_options *options, umt_optimizer **out) {
    if (!ctx || !options || !out)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_create: %s is NULL",
                        !ctx ? "ctx" : !options ? "options" : "out");
    *out = NULL;
    UMT_TRY(check_options(options));
    int count = umt_parameter_count(ctx);
    /* Parameters made later are not covered, so an empty list is almost surely a mistake. */
    if (count == 0)
        return umt_fail(UMT_ERR_STATE, "umt_optimizer_create: the context has no parameters (create the model first)");
    umt_optimizer *opt = calloc(1, sizeof *opt);
    umt_optim_slot *slots = opt ? calloc((size_t)count, sizeof *slots) : NULL;
    umt_update_tensor *tensors = slots ? calloc((size_t)count, sizeof *tensors) : NULL;
    if (!tensors) {
        free(slots);
        free(opt);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_optimizer_create: no memory for %d parameter slots", count);
    }
    *opt = (umt_optimizer){.ctx = ctx, .options = *options, .slot_count = count, .slots = slots, .tensors = tensors};
    for (int i = 0; i < count; ++i) slots[i].param = umt_parameter_at(ctx, i);
    umt_status st = alloc_state(opt);
    if (st == UMT_OK) st = alloc_step_scalars(opt);
    if (st == UMT_OK) st = umt_context_own(ctx, opt, release);
    if (st == UMT_OK) umt_hooks_optimizer(ctx, opt, true);
    if (st != UMT_OK) {
        release(opt);
        return st;
    }
    *out = opt;
    return UMT_OK;
}

void umt_optimizer_destroy(umt_optimizer *opt) {
    if (!opt) return;
    /* No step consumes its parameters' gradients any more (a context's end frees them all). */
    for (int i = 0; i < opt->slot_count && opt->options.zero_grads_in_step; ++i)
        opt->slots[i].param->grad_consumed = false;
    umt_context_disown(opt->ctx, opt);
    release(opt);
}

/* ----------------------------------------------------------------------------------------- */
/* Stepping */

/* One update of n elements: the optimizer's rule on raw pointers, with the backend's kernel. */
static umt_status update_arrays(const umt_optimizer_options *o, const umt_backend *be, float *p, const float *g,
                                float *s0, float *s1, int64_t n, int64_t step, umt_update_fusion fusion) {
    switch (o->kind) {
    case UMT_OPT_SGD: return be->f32.sgd_update_fused(p, g, s0, n, o->lr, o->momentum, o->weight_decay, fusion);
    case UMT_OPT_ADAM:
    case UMT_OPT_ADAMW:
        return be->f32.adam_update_fused(p, g, s0, s1, n, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay,
                                     o->kind == UMT_OPT_ADAMW, step, fusion);
    case UMT_OPT_ADADELTA:
        return be->f32.adadelta_update_fused(p, g, s0, s1, n, o->lr, o->rho, o->eps, o->weight_decay, fusion);
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_step: kind %d", (int)o->kind);
}

/* After p's update is queued: its gradient is zero once it runs when the update consumes it (a
 * dry step's update runs nothing), and will be after every step's (core/tape.h). */
static void consumed(const umt_optimizer *opt, umt_tensor *p) {
    if (!opt->options.zero_grads_in_step || opt->ctx->dry) return;
    p->grad_zeroed = p->grad_consumed = true;
}

static umt_status update_slot(const umt_optimizer *opt, const umt_optim_slot *slot, int64_t step,
                              const float *lr_on_device) {
    float *s0 = slot->state[0] ? slot->state[0]->data : NULL;
    float *s1 = slot->state[1] ? slot->state[1]->data : NULL;
    const umt_tensor *lowp = slot->param->lowp;
    umt_update_fusion fusion = {
        .scalars = opt->scalars ? opt->scalars->data : NULL,
        .lr_on_device = lr_on_device,
        .lowp = lowp ? lowp->data : NULL,
        .lowp_dtype = lowp ? lowp->dtype : UMT_F32,
        .zero_grad = opt->options.zero_grads_in_step,
    };
    if (lowp && lowp->nhwc) { /* a conv weight's copy is K,R,S,C (core/precision.c) */
        fusion.lowp_channels = lowp->shape[1];
        fusion.lowp_pixels = lowp->shape[2] * lowp->shape[3];
    }
    UMT_TRY(update_arrays(&opt->options, umt_kernels(opt->ctx), slot->param->data, slot->param->grad->data, s0, s1,
                          slot->param->numel, step, fusion));
    consumed(opt, slot->param);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* What subsystems that update parameters themselves see (core/optim/optim.h) */

umt_status umt_optimizer_state_of(const umt_optimizer *opt, const umt_tensor *p, umt_tensor *state[2]) {
    for (int i = 0; i < opt->slot_count; ++i) {
        if (opt->slots[i].param != p) continue;
        state[0] = opt->slots[i].state[0];
        state[1] = opt->slots[i].state[1];
        return UMT_OK;
    }
    return umt_fail(UMT_ERR_STATE, "umt_optimizer_state_of: %s is not covered by the optimizer",
                    p->name ? p->name : "a parameter");
}

umt_status umt_optimizer_update_range(const umt_optimizer *opt, float *param, const float *grad, float *s0, float *s1,
                                      int64_t n, const umt_update_fusion *fusion) {
    return update_arrays(&opt->options, umt_kernels(opt->ctx), param, grad, s0, s1, n, opt->steps + 1,
                         fusion ? *fusion : (umt_update_fusion){0});
}

int umt_optimizer_parameter_count(const umt_optimizer *opt) { return opt->slot_count; }

umt_tensor *umt_optimizer_parameter_at(const umt_optimizer *opt, int i, umt_tensor *state[2]) {
    state[0] = opt->slots[i].state[0];
    state[1] = opt->slots[i].state[1];
    return opt->slots[i].param;
}

bool umt_optimizer_has_step_scalars(const umt_optimizer *opt) { return opt->scalars != NULL; }

const umt_step_scalars *umt_optimizer_scalars_on_device(const umt_optimizer *opt) {
    return opt->scalars ? opt->scalars->data : NULL;
}

void umt_optimizer_snapshot(const umt_optimizer *opt, umt_optimizer_options *options, int64_t *step) {
    *options = opt->options;
    *step = opt->steps + 1;
}

umt_status umt_optimizer_update_with(const umt_optimizer_options *options, int64_t step, const umt_backend *be,
                                     float *param, const float *grad, float *s0, float *s1, int64_t n,
                                     const umt_update_fusion *fusion) {
    return update_arrays(options, be, param, grad, s0, s1, n, step, fusion ? *fusion : (umt_update_fusion){0});
}

/* opt->tensors: every parameter's buffers, as the multi-tensor kernels take them. */
static void list_tensors(const umt_optimizer *opt) {
    for (int i = 0; i < opt->slot_count; ++i) {
        const umt_optim_slot *slot = &opt->slots[i];
        const umt_tensor *lowp = slot->param->lowp;
        bool nhwc = lowp && lowp->nhwc; /* a conv weight's copy is K,R,S,C (core/precision.c) */
        opt->tensors[i] = (umt_update_tensor){
            .param = slot->param->data, .grad = slot->param->grad->data,
            .state0 = slot->state[0] ? slot->state[0]->data : NULL,
            .state1 = slot->state[1] ? slot->state[1]->data : NULL,
            .lowp = lowp ? lowp->data : NULL, .n = slot->param->numel,
            .lowp_channels = nhwc ? lowp->shape[1] : 0, .lowp_pixels = nhwc ? lowp->shape[2] * lowp->shape[3] : 0,
        };
    }
}

/* Every parameter's update in one backend call (one launch per 32 parameters on CUDA), the
 * same arithmetic as update_slot's per-parameter calls. */
static umt_status update_all(const umt_optimizer *opt, int64_t step, const float *lr_on_device) {
    const umt_optimizer_options *o = &opt->options;
    list_tensors(opt);
    /* Every copy has the context's compute dtype. */
    umt_update_fusion common = {
        .scalars = opt->scalars ? opt->scalars->data : NULL,
        .lr_on_device = lr_on_device,
        .lowp_dtype = UMT_F32,
        .zero_grad = o->zero_grads_in_step,
    };
    for (int i = 0; i < opt->slot_count; ++i)
        if (opt->slots[i].param->lowp) common.lowp_dtype = opt->slots[i].param->lowp->dtype;
    umt_update_rule rule = {
        .kind = o->kind, .lr = o->lr, .momentum = o->momentum, .weight_decay = o->weight_decay,
        .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .rho = o->rho,
        .decoupled = o->kind == UMT_OPT_ADAMW, .step = step,
    };
    UMT_TRY(umt_kernels(opt->ctx)->f32.multi_update(opt->tensors, opt->slot_count, rule, common));
    for (int i = 0; i < opt->slot_count; ++i) consumed(opt, opt->slots[i].param);
    return UMT_OK;
}

/* On the device, in stream order: every gradient's share of the sum of squares, then the one
 * thread that decides the step (skip, multiplier, Adam's factors, the loss scale, the non-finite
 * check on the sum and on the step's loss). */
static umt_status decide_step(const umt_optimizer *opt, const float *lr_on_device) {
    const umt_optimizer_options *o = &opt->options;
    umt_step_options options = {
        .max_grad_norm = o->max_grad_norm,
        .loss_scaling = o->loss_scaling,
        .growth_interval = o->loss_scale_growth_interval,
        .adam = o->kind == UMT_OPT_ADAM || o->kind == UMT_OPT_ADAMW,
        .lr = o->lr, .beta1 = o->beta1, .beta2 = o->beta2, .lr_on_device = lr_on_device,
        .nonfinite = o->on_nonfinite,
        .loss = o->on_nonfinite != UMT_NONFINITE_OFF ? opt->ctx->step_loss : NULL,
        .doorbell = opt->doorbell ? opt->doorbell->data : NULL,
    };
    /* A step graph's keeping of the loss, done here once (by the step's first decision) when the
     * decision reads the loss anyway. */
    umt_context *ctx = opt->ctx;
    if (options.loss && ctx->loss_keep.last && !ctx->loss_keep.kept_for) {
        options.keep_loss = ctx->loss_keep.last;
        options.loss_sum = ctx->loss_keep.sum;
        ctx->loss_keep.kept_for = options.loss;
    }
    list_tensors(opt);
    return umt_kernels(opt->ctx)->f32.step_decide(opt->tensors, opt->slot_count, opt->partials->data, opt->scalars->data,
                                              options);
}

/* What a replay of a captured step (core/step/step_graph.c) redoes for the optimizer: the rate of
 * the step, written where the kernels read it, and the host's count of steps. */
static void write_lr(void *object, void *dst, size_t bytes) {
    memcpy(dst, &((umt_optimizer *)object)->options.lr, bytes);
}

static void count_step(void *object, void *dst, size_t bytes) {
    (void)dst;
    (void)bytes;
    ((umt_optimizer *)object)->steps++;
}

static void uncount_step(void *object, void *dst, size_t bytes) {
    (void)dst;
    (void)bytes;
    ((umt_optimizer *)object)->steps--;
}

static umt_status record_for_replay(umt_optimizer *opt, const float **lr_on_device) {
    umt_context *ctx = opt->ctx;
    bool adam = opt->options.kind == UMT_OPT_ADAM || opt->options.kind == UMT_OPT_ADAMW;
    /* Without step scalars Adam's bias correction comes from the host's step count, by value. */
    if (adam && !opt->scalars)
        ctx->values.unreplayable = "Adam without step scalars (clipping or loss scaling) counts its steps on the host";
    void *lr = NULL;
    UMT_TRY(umt_step_values_remade(ctx, sizeof(float), write_lr, opt, &lr));
    *lr_on_device = lr;
    return UMT_OK;
}

umt_status umt_optimizer_step(umt_optimizer *opt) {
    if (!opt) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_step: opt is NULL");
    /* umt_optimizer_set_lr cannot report, so a bad rate is refused here; 0 is allowed because
     * a schedule may anneal to it. */
    if (!(opt->options.lr >= 0.0f && isfinite(opt->options.lr)))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_step: lr %g (expected finite >= 0)", opt->options.lr);
    /* Every gradient is checked before any parameter moves, so a failure leaves the model whole. */
    for (int i = 0; i < opt->slot_count; ++i) {
        const umt_tensor *p = opt->slots[i].param;
        if (!p->grad || p->grad->numel != p->numel)
            return umt_fail(UMT_ERR_STATE, "umt_optimizer_step: parameter %s has no gradient of its shape",
                            p->name ? p->name : "(unnamed)");
        if (p->lowp && p->lowp->numel != p->numel)
            return umt_fail(UMT_ERR_STATE, "umt_optimizer_step: parameter %s has a low-precision copy of %lld "
                            "elements (expected %lld)", p->name ? p->name : "(unnamed)", (long long)p->lowp->numel,
                            (long long)p->numel);
    }
    const float *lr_on_device = NULL;
    if (opt->ctx->values.recording) UMT_TRY(record_for_replay(opt, &lr_on_device));
    if (opt->scalars) UMT_TRY(decide_step(opt, lr_on_device));
    int64_t step = opt->steps + 1;
    /* One launch for every parameter, unless a subsystem updates some (the offload tier): the
     * others one by one, then the subsystems theirs (core/hooks.h). */
    if (umt_kernels(opt->ctx)->f32.multi_update && opt->options.multi_tensor && !umt_hooks_update_parameters(opt->ctx)) {
        UMT_TRY(update_all(opt, step, lr_on_device));
    } else {
        /* UMT_MEM_TRACE: the updates queued here (the host's, and the device's on the compute
         * stream), before the subsystems finish theirs. */
        umt_trace *trace = opt->ctx->memory.trace;
        double host_begin = umt_trace_now_us(trace);
        void *begin = umt_trace_begin(trace, opt->ctx->memory.stream);
        for (int i = 0; i < opt->slot_count; ++i) {
            const umt_optim_slot *slot = &opt->slots[i];
            if (!umt_hooks_updates_parameter(opt->ctx, slot->param, slot->state[0], slot->state[1]))
                UMT_TRY(update_slot(opt, slot, step, lr_on_device));
        }
        umt_trace_end(trace, opt->ctx->memory.stream, begin, "resident parameters", "optimizer", UMT_TRACE_COMPUTE, 0);
        umt_trace_host_interval(trace, host_begin, umt_trace_now_us(trace), "optimizer step", "optimizer (host)",
                                UMT_TRACE_HOST, 0);
        UMT_TRY(umt_hooks_after_update(opt->ctx, opt, step));
    }
    opt->steps = step;
    if (opt->ctx->values.recording) return umt_step_values_host_effect(opt->ctx, count_step, uncount_step, opt);
    return UMT_OK;
}

void umt_optimizer_set_lr(umt_optimizer *opt, float lr) {
    if (!opt) {
        umt_fail_null("umt_optimizer_set_lr", "opt");
        return;
    }
    opt->options.lr = lr;
}

float umt_optimizer_lr(const umt_optimizer *opt) {
    if (!opt) return umt_fail_null("umt_optimizer_lr", "opt"), 0.0f;
    return opt->options.lr;
}

int64_t umt_optimizer_steps(const umt_optimizer *opt) {
    if (!opt) return umt_fail_null("umt_optimizer_steps", "opt"), 0;
    return opt->steps;
}

umt_status umt_optimizer_read_scalars(const umt_optimizer *opt, umt_step_scalars *out) {
    if (!opt || !out)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_read_scalars: %s is NULL", opt ? "out" : "opt");
    if (!opt->scalars) {
        *out = umt_step_scalars_initial(false, 1.0f);
        out->applied_steps = opt->steps;
        return UMT_OK;
    }
    return umt_kernels(opt->ctx)->f32.download(out, opt->scalars->data, sizeof *out);
}

int64_t umt_optimizer_skipped_steps(const umt_optimizer *opt) {
    if (!opt) return umt_fail_null("umt_optimizer_skipped_steps", "opt"), -1;
    umt_step_scalars s;
    return umt_optimizer_read_scalars(opt, &s) == UMT_OK ? s.skipped_steps : -1;
}

float umt_optimizer_loss_scale(const umt_optimizer *opt) {
    if (!opt) return umt_fail_null("umt_optimizer_loss_scale", "opt"), NAN;
    umt_step_scalars s;
    return umt_optimizer_read_scalars(opt, &s) == UMT_OK ? s.loss_scale : NAN;
}

bool umt_optimizer_nonfinite_found(const umt_optimizer *opt) {
    if (!opt) return umt_fail_null("umt_optimizer_nonfinite_found", "opt"), false;
    /* Host memory the device stores into at most once: a plain read, no wait. */
    return opt->doorbell && *(const volatile int64_t *)opt->doorbell->data != 0;
}

umt_status umt_optimizer_nonfinite_get(const umt_optimizer *opt, umt_nonfinite_report *out) {
    if (!opt || !out) return umt_fail_null("umt_optimizer_nonfinite_get", opt ? "out" : "opt");
    *out = (umt_nonfinite_report){0};
    if (!opt->doorbell) return UMT_OK;
    umt_step_scalars s;
    UMT_TRY(umt_optimizer_read_scalars(opt, &s));
    out->steps = s.nonfinite_steps;
    out->first_step = s.first_nonfinite_step;
    out->loss = (s.first_nonfinite_what & UMT_NONFINITE_FOUND_LOSS) != 0;
    out->loss_value = s.first_nonfinite_loss;
    int t = s.first_nonfinite_tensor;
    out->parameter = t >= 0 && t < opt->slot_count ? opt->slots[t].param->name : NULL;
    out->stopped = s.stopped != 0;
    return UMT_OK;
}

const float *umt_optimizer_loss_scale_on_device(const umt_optimizer *opt) {
    if (!opt || !opt->scalars || !opt->options.loss_scaling) return NULL;
    return &((const umt_step_scalars *)opt->scalars->data)->loss_scale;
}

/* The loss gradient seeded with the current loss scale: a read on the device, no wait. */
umt_status umt_backward_scaled(umt_context *ctx, umt_tensor *loss, const umt_optimizer *opt) {
    UMT_TRY(umt_check_input(ctx, "umt_backward_scaled", "loss", loss, UMT_ANY_DTYPE, 0));
    if (!opt) return umt_fail_null("umt_backward_scaled", "opt");
    UMT_TRY(umt_check_owner(ctx, "umt_backward_scaled", "opt", opt->ctx));
    return umt_tape_backward(ctx, loss, umt_optimizer_loss_scale_on_device(opt));
}

/* ----------------------------------------------------------------------------------------- */
/* What checkpoints see (core/optim/optim.h) */

umt_context *umt_optimizer_context(const umt_optimizer *opt) { return opt ? opt->ctx : NULL; }

umt_optimizer_kind umt_optimizer_kind_of(const umt_optimizer *opt) { return opt->options.kind; }

const char *umt_optimizer_kind_name(umt_optimizer_kind kind) {
    return (unsigned)kind < (unsigned)KIND_COUNT ? kind_names[kind] : "invalid-optimizer";
}

int umt_optimizer_state_count(const umt_optimizer *opt) {
    return opt ? opt->slot_count * state_count(&opt->options) : 0;
}

umt_tensor *umt_optimizer_state_at(const umt_optimizer *opt, int i, const char **param_name, int *state_index) {
    int per_slot = opt ? state_count(&opt->options) : 0;
    if (i < 0 || i >= umt_optimizer_state_count(opt)) return NULL;
    const umt_optim_slot *slot = &opt->slots[i / per_slot];
    *param_name = slot->param->name;
    *state_index = i % per_slot;
    return slot->state[i % per_slot];
}

umt_status umt_optimizer_set_steps(umt_optimizer *opt, int64_t steps) {
    if (!opt) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_optimizer_set_steps: opt is NULL");
    opt->steps = steps;
    if (!opt->scalars) return UMT_OK;
    /* Adam's bias correction counts the device's applied steps, and the non-finite check names a
     * step by the device's count of steps: both restart from here. */
    umt_step_scalars *device = opt->scalars->data;
    UMT_TRY(umt_kernels(opt->ctx)->f32.upload(&device->applied_steps, &steps, sizeof steps));
    return umt_kernels(opt->ctx)->f32.upload(&device->steps, &steps, sizeof steps);
}
