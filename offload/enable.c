/*
 * offload/enable.c — how the offload tier plugs into a context: umt_offload_enable registers the
 * tier's hook table (core/hooks.h), whose every event is handed to the tier's own function
 * (offload/offload.h); the tier's options (and what a memory plan sets of them before the first
 * step: umt_offload_adopt_plan), its statistics and its line in the memory report.
 */
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "offload/offload.h"
#include "offload/state.h"

umt_offload_options umt_offload_defaults(void) {
    return (umt_offload_options){.optimizer = UMT_OFFLOAD_OPTIM_AUTO, .host_updates = UMT_OFFLOAD_HOST_AUTO};
}

static const char *const optimizer_names[] = {"auto", "gpu", "cpu", "backward"};

const char *umt_offload_optimizer_name(umt_offload_optimizer where) {
    return (unsigned)where <= UMT_OFFLOAD_OPTIM_BACKWARD ? optimizer_names[where] : "invalid-offload-optimizer";
}

umt_status umt_offload_optimizer_parse(const char *name, umt_offload_optimizer *out) {
    if (!name || !out) return umt_fail_null("umt_offload_optimizer_parse", name ? "out" : "name");
    for (int i = 0; i <= UMT_OFFLOAD_OPTIM_BACKWARD; ++i)
        if (!strcmp(name, optimizer_names[i])) return *out = (umt_offload_optimizer)i, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "offload optimizer '%s': expected auto, gpu, cpu or backward", name);
}

static umt_status check_options(const umt_offload_options *o) {
    if ((unsigned)o->optimizer > UMT_OFFLOAD_OPTIM_BACKWARD)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_enable: optimizer %d (expected 0..%d)", (int)o->optimizer,
                        (int)UMT_OFFLOAD_OPTIM_BACKWARD);
    if (o->host_updates < UMT_OFFLOAD_HOST_AUTO)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_enable: host_updates %d (expected a count, or "
                        "UMT_OFFLOAD_HOST_AUTO)", o->host_updates);
    return UMT_OK;
}

#ifdef UMT_WITH_CUDA

/* ----------------------------------------------------------------------------------------- */
/* The hook table: each event to the tier's function (self is the tier) */

static umt_pool place(const umt_context *ctx, void *self, umt_pool kind) {
    (void)ctx;
    return umt_offload_place(self, kind);
}

static umt_status step_begin(umt_context *ctx, void *self) {
    (void)ctx;
    return umt_offload_step_begin(self);
}

static umt_status op_recorded(umt_context *ctx, void *self, int node) {
    (void)ctx;
    return umt_offload_activations_recorded(self, node);
}

static umt_status parameter_read(umt_context *ctx, void *self, umt_tensor *parameter) {
    (void)ctx;
    return umt_offload_acquire(self, parameter, false);
}

static bool zero_grad(umt_context *ctx, void *self, umt_tensor *parameter) {
    (void)ctx;
    return umt_offload_zero_grad(self, parameter);
}

static umt_status before_op_backward(umt_context *ctx, void *self, const umt_node *node) {
    (void)ctx;
    return umt_offload_before_backward(self, node);
}

static umt_status after_op_backward(umt_context *ctx, void *self, int node) {
    (void)ctx;
    return umt_offload_after_op_backward(self, node);
}

static umt_status gradient_ready(umt_context *ctx, void *self, umt_tensor *parameter) {
    (void)ctx;
    return umt_offload_gradient_ready(self, parameter);
}

static umt_status after_backward(umt_context *ctx, void *self) {
    (void)ctx;
    return umt_offload_backward_done(self);
}

static void optimizer(umt_context *ctx, void *self, const umt_optimizer *opt, bool alive) {
    (void)ctx;
    umt_offload_attach_optimizer(self, opt, alive);
}

static bool updates_parameter(const umt_context *ctx, void *self, const umt_tensor *parameter,
                              const umt_tensor *state0, const umt_tensor *state1) {
    (void)ctx, (void)self;
    return umt_offload_involves(parameter, state0, state1);
}

static umt_status after_update(umt_context *ctx, void *self, const umt_optimizer *opt, int64_t step) {
    (void)ctx;
    return umt_offload_optimizer_step(self, opt, step);
}

static void report(const umt_context *ctx, void *self, FILE *out) {
    (void)ctx;
    const umt_offload_stats *s = &((const umt_offload *)self)->stats;
    if (!s->offloaded_tensors) return;
    fprintf(out, "offload tier: %d tensors, %zu bytes; %llu bytes copied to the device, %llu to the host; updates on "
            "the %s\n", s->offloaded_tensors, s->offloaded_bytes, (unsigned long long)s->bytes_to_device,
            (unsigned long long)s->bytes_to_host, umt_offload_optimizer_name(s->optimizer));
}

static void destroy(umt_context *ctx, void *self) {
    (void)ctx;
    umt_offload_destroy(self);
}

static const umt_hooks offload_hooks = {
    .name = "offload",
    /* A replay would redo none of the tier's host work: which weights go to which slot, the
     * prefetch order it follows, the CPU threads' updates, the events between its streams. */
    .unreplayable = "the context offloads to host memory (offload/: the tier decides on the host, every step, "
                    "what crosses the link and when)",
    .place = place,
    .step_begin = step_begin,
    .op_recorded = op_recorded,
    .parameter_read = parameter_read,
    .zero_grad = zero_grad,
    .before_op_backward = before_op_backward,
    .after_op_backward = after_op_backward,
    .gradient_ready = gradient_ready,
    .after_backward = after_backward,
    .optimizer = optimizer,
    .updates_parameter = updates_parameter,
    .after_update = after_update,
    .report = report,
    .destroy = destroy,
};

/* ----------------------------------------------------------------------------------------- */
/* The public entry points */

umt_status umt_offload_enable(umt_context *ctx, const umt_offload_options *options) {
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_enable: ctx is NULL");
    umt_offload_options o = options ? *options : umt_offload_defaults();
    UMT_TRY(check_options(&o));
    if (ctx->options.device != UMT_DEVICE_CUDA)
        return umt_fail(UMT_ERR_UNSUPPORTED, "umt_offload_enable: the context runs on the CPU (the offload tier "
                        "moves tensors between host memory and a GPU)");
    if (umt_hooks_self(ctx, &offload_hooks))
        return umt_fail(UMT_ERR_STATE, "umt_offload_enable: the context offloads already");
    /* The tier places the model's tensors as they are made: after, they would already hold GPU memory. */
    if (ctx->parameter_count > 0)
        return umt_fail(UMT_ERR_STATE, "umt_offload_enable: the context has %d parameters already (expected none: "
                        "enable the tier before creating the model)", ctx->parameter_count);
    umt_offload *tier = NULL;
    umt_status st = umt_offload_create(ctx, &o, &tier);
    if (st == UMT_OK) st = umt_hooks_register(ctx, &offload_hooks, tier);
    if (st != UMT_OK) umt_offload_destroy(tier);
    return st;
}

umt_status umt_offload_adopt_plan(umt_context *ctx, const umt_memory_plan *plan) {
    if (!ctx || !plan) return umt_fail_null("umt_offload_adopt_plan", ctx ? "plan" : "ctx");
    umt_offload *tier = umt_hooks_self(ctx, &offload_hooks);
    if (!tier)
        return umt_fail(UMT_ERR_STATE, "umt_offload_adopt_plan: the context has no offload tier (umt_offload_enable, "
                        "before the model)");
    /* The reserve is read once, when the tier places the model at the first step. */
    if (tier->planned)
        return umt_fail(UMT_ERR_STATE, "umt_offload_adopt_plan: the tier placed the model at the first step already "
                        "(adopt the plan before it)");
    tier->options.reserve_bytes = plan->offload.reserve_bytes;
    tier->options.activations = plan->offload.activations;
    return UMT_OK;
}

umt_status umt_offload_stats_get(const umt_context *ctx, umt_offload_stats *out) {
    if (!ctx || !out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_stats_get: %s is NULL", ctx ? "out" : "ctx");
    const umt_offload *tier = umt_hooks_self(ctx, &offload_hooks);
    *out = tier ? tier->stats : (umt_offload_stats){0};
    if (tier) umt_offload_queue_usage(tier, &out->host_threads, &out->host_busy_seconds);
    return UMT_OK;
}

umt_status umt_offload_host_memory_measure(umt_context *ctx, umt_host_memory_speed *out) {
    if (!ctx || !out) return umt_fail_null("umt_offload_host_memory_measure", ctx ? "out" : "ctx");
    umt_offload *tier = umt_hooks_self(ctx, &offload_hooks);
    if (!tier)
        return umt_fail(UMT_ERR_STATE, "umt_offload_host_memory_measure: the context has no offload tier (call "
                        "umt_offload_enable first)");
    return umt_offload_host_memory(tier, out);
}

#else /* no CUDA: there is no tier to enable, and nothing is ever offloaded */

umt_status umt_offload_enable(umt_context *ctx, const umt_offload_options *options) {
    umt_offload_options o = options ? *options : umt_offload_defaults();
    if (!ctx) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_enable: ctx is NULL");
    UMT_TRY(check_options(&o));
    return umt_fail(UMT_ERR_UNSUPPORTED, "umt_offload_enable: this build has no CUDA (the offload tier moves tensors "
                    "between host memory and a GPU)");
}

umt_status umt_offload_adopt_plan(umt_context *ctx, const umt_memory_plan *plan) {
    if (!ctx || !plan) return umt_fail_null("umt_offload_adopt_plan", ctx ? "plan" : "ctx");
    return umt_fail(UMT_ERR_UNSUPPORTED, "umt_offload_adopt_plan: this build has no CUDA (no offload tier to give the "
                    "plan to)");
}

umt_status umt_offload_stats_get(const umt_context *ctx, umt_offload_stats *out) {
    if (!ctx || !out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_offload_stats_get: %s is NULL", ctx ? "out" : "ctx");
    *out = (umt_offload_stats){0};
    return UMT_OK;
}

umt_status umt_offload_host_memory_measure(umt_context *ctx, umt_host_memory_speed *out) {
    if (!ctx || !out) return umt_fail_null("umt_offload_host_memory_measure", ctx ? "out" : "ctx");
    return umt_fail(UMT_ERR_UNSUPPORTED, "umt_offload_host_memory_measure: this build has no CUDA (no link to share "
                    "the host's memory with)");
}

#endif
