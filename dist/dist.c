/*
 * dist/dist.c — the umt_dist object: the bucket plan, the gradient-ready hook (on the context's
 * hook table, core/hooks.h) that starts buckets, and the calls around the optimizer. The NCCL
 * work is dist/engine.c's; on one rank there is none (unless options.always asks for it) and
 * every call here is a no-op, on any device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/tensor.h"
#include "dist/buckets.h"
#include "dist/umt_dist.h"
#ifdef UMT_WITH_CUDA
#include "dist/engine.h"
#endif

struct umt_dist {
    umt_context *ctx;
    int rank, size;
    umt_bucket_plan plan;
    /* A failure in the hook waits here for umt_dist_finish_gradients, rather than stopping this
     * rank's backward midway while the others go on: the first one, its message copied because
     * later calls on this thread replace umt_last_error(). */
    umt_status hook_status;
    char hook_error[512];
    size_t reduce_bytes; /* bytes of one gradient element on the wire: 4 (f32) or 2 (bf16) */
#ifdef UMT_WITH_CUDA
    umt_engine *engine;
#endif
};

umt_dist_options umt_dist_defaults(void) {
    /* Buckets sized by the model (dist/buckets.h), not a fixed 25 MB. */
    return (umt_dist_options){.bucket_bytes = 0, .reduce_bf16 = false, .timeout_s = 300, .always = false};
}

int umt_dist_rank(const umt_dist *dist) { return dist ? dist->rank : 0; }
int umt_dist_size(const umt_dist *dist) { return dist ? dist->size : 1; }

#ifdef UMT_WITH_CUDA
static int parameter_index(const umt_context *ctx, const umt_tensor *p) {
    /* Announcements come in reverse creation order, so search from the end. */
    for (int i = ctx->parameter_count - 1; i >= 0; --i)
        if (ctx->parameters[i] == p) return i;
    return -1;
}

/* A new step: nothing announced yet. (A step that failed midway, a capture refused during its
 * backward among them, leaves announcements that its eager rerun would count twice.) */
static umt_status on_step_begin(umt_context *ctx, void *self) {
    (void)ctx;
    umt_dist *dist = self;
    umt_bucket_plan_reset(&dist->plan);
    return UMT_OK;
}

/* The buckets' host work (which buckets start when) is the same at every step, so a step graph
 * captures their packs, all-reduces and unpacks, and its replays redo them: no host work is
 * left to redo (core/step/step_graph.c, "Collectives"). */
static umt_status on_gradient_ready(umt_context *ctx, void *self, umt_tensor *parameter) {
    (void)ctx;
    umt_dist *dist = self;
    if (dist->hook_status != UMT_OK) return UMT_OK;
    int first = 0;
    umt_status status = UMT_OK;
    /* A gradient the offload tier holds is reduced where it is now, before the tier moves it
     * (dist/engine.h; offload/README.md says how the two meet). */
    if (umt_engine_in_place(dist->engine)) {
        status = umt_engine_reduce_in_place(dist->engine, parameter->grad->data, parameter->grad->numel);
    } else {
        int count = umt_bucket_plan_announce(&dist->plan, parameter_index(dist->ctx, parameter), &first, &status);
        if (status == UMT_OK && count > 0) status = umt_engine_start_buckets(dist->engine, &dist->plan, first, count);
    }
    if (status != UMT_OK) {
        dist->hook_status = status;
        snprintf(dist->hook_error, sizeof dist->hook_error, "%s", umt_last_error());
    }
    return UMT_OK;
}

/* A step graph's choice, the same on every rank: yes only when every rank says yes (a host
 * reduction of one value: it waits for the GPU, but runs only at a capture and after host steps). */
static umt_status on_graph_agree(umt_context *ctx, void *self, bool *all) {
    (void)ctx;
    umt_dist *dist = self;
    double refusals = *all ? 0.0 : 1.0;
    UMT_TRY(umt_engine_reduce_host(dist->engine, &refusals, 1, false));
    *all = refusals == 0.0;
    return UMT_OK;
}

static umt_status on_before_graph_launch(umt_context *ctx, void *self) {
    (void)ctx;
    return umt_engine_before_replay(((umt_dist *)self)->engine);
}

static umt_status on_after_graph_launch(umt_context *ctx, void *self) {
    (void)ctx;
    return umt_engine_after_replay(((umt_dist *)self)->engine);
}

static const umt_hooks dist_hooks = {.name = "dist",
                                     .step_begin = on_step_begin,
                                     .gradient_ready = on_gradient_ready,
                                     .graph_agree = on_graph_agree,
                                     .before_graph_launch = on_before_graph_launch,
                                     .after_graph_launch = on_after_graph_launch};

static umt_status make_plan(umt_dist *dist, const umt_dist_options *options) {
    umt_context *ctx = dist->ctx;
    int64_t *numel = malloc((size_t)(ctx->parameter_count ? ctx->parameter_count : 1) * sizeof *numel);
    if (!numel) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "rank %d: no memory for the bucket plan", dist->rank);
    for (int i = 0; i < ctx->parameter_count; ++i) numel[i] = ctx->parameters[i]->numel;
    int64_t cap = (int64_t)(options->bucket_bytes / sizeof(float));
    size_t element = options->reduce_bf16 ? 2 : sizeof(float);
    umt_status status = options->bucket_bytes
                            ? umt_bucket_plan_make(numel, ctx->parameter_count, cap > 0 ? cap : 1, &dist->plan)
                            : umt_bucket_plan_make_auto(numel, ctx->parameter_count, element, &dist->plan);
    free(numel);
    return status;
}

static umt_status create_parallel(umt_dist *dist, const umt_dist_process *process, const umt_dist_options *options) {
    UMT_TRY(make_plan(dist, options));
    UMT_TRY(umt_engine_create(dist->ctx, process, options, &dist->plan, &dist->engine));
    return umt_hooks_register(dist->ctx, &dist_hooks, dist);
}
#else
static umt_status create_parallel(umt_dist *dist, const umt_dist_process *process, const umt_dist_options *options) {
    (void)dist;
    (void)options;
    return umt_fail(UMT_ERR_UNSUPPORTED, "rank %d of %d: this build has no NCCL (build with --config=cuda)",
                    process->rank, process->size);
}
#endif

umt_status umt_dist_create(umt_context *ctx, const umt_dist_process *process, const umt_dist_options *options,
                           umt_dist **out) {
    if (!ctx || !process || !out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dist_create: NULL argument");
    umt_dist_options o = options ? *options : umt_dist_defaults();
    if (!(o.timeout_s > 0))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dist_create: timeout %g s (expected > 0)", o.timeout_s);
    umt_dist *dist = calloc(1, sizeof *dist);
    if (!dist) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_dist_create: no memory");
    *dist = (umt_dist){.ctx = ctx, .rank = process->rank, .size = process->size, .reduce_bytes = o.reduce_bf16 ? 2 : 4};
    umt_status status = process->size > 1 || o.always ? create_parallel(dist, process, &o) : UMT_OK;
    if (status != UMT_OK) {
        umt_dist_destroy(dist);
        return status;
    }
    *out = dist;
    return UMT_OK;
}

umt_status umt_dist_finish_gradients(umt_dist *dist) {
    if (!dist) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dist_finish_gradients: dist is NULL");
#ifdef UMT_WITH_CUDA
    if (!dist->engine) return UMT_OK;
    umt_status status = dist->hook_status;
    dist->hook_status = UMT_OK;
    if (status != UMT_OK) {
        umt_bucket_plan_reset(&dist->plan);
        return umt_fail(status, "%s", dist->hook_error);
    }
    /* Buckets whose parameters got no gradient this step still take part: every rank must run
     * the same collectives. (In place there are none: each rank runs the same model, so the same
     * parameters get gradients.) */
    int first = 0, count = umt_engine_in_place(dist->engine) ? 0 : umt_bucket_plan_rest(&dist->plan, &first);
    if (count > 0) UMT_TRY(umt_engine_start_buckets(dist->engine, &dist->plan, first, count));
    umt_bucket_plan_reset(&dist->plan);
    return umt_engine_finish(dist->engine, &dist->plan);
#else
    return UMT_OK;
#endif
}

static umt_status reduce_host(umt_dist *dist, double *values, int count, bool maximum) {
    if (!dist || !values) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dist_sum/max: NULL argument");
#ifdef UMT_WITH_CUDA
    if (!dist->engine) return UMT_OK;
    return umt_engine_reduce_host(dist->engine, values, count, maximum);
#else
    (void)count;
    (void)maximum;
    return UMT_OK;
#endif
}

umt_dist_stats umt_dist_stats_get(const umt_dist *dist) {
    umt_dist_stats stats = {0};
    if (!dist) return umt_fail_null("umt_dist_stats_get", "dist"), stats;
#ifdef UMT_WITH_CUDA
    if (!dist->engine) return stats;
    bool in_place = umt_engine_in_place(dist->engine);
    stats.buckets = in_place ? 0 : dist->plan.bucket_count;
    for (int b = 0; b < stats.buckets; ++b) {
        size_t bytes = (size_t)dist->plan.elements[b] * dist->reduce_bytes;
        stats.reduce_bytes += bytes;
        if (bytes > stats.largest_bucket_bytes) stats.largest_bucket_bytes = bytes;
    }
    umt_engine_counts(dist->engine, &stats.eager_collectives, &stats.captured_collectives);
#endif
    return stats;
}

umt_status umt_dist_sum(umt_dist *dist, double *values, int count) { return reduce_host(dist, values, count, false); }
umt_status umt_dist_max(umt_dist *dist, double *values, int count) { return reduce_host(dist, values, count, true); }

void umt_dist_destroy(umt_dist *dist) {
    if (!dist) return;
#ifdef UMT_WITH_CUDA
    if (dist->engine) {
        /* Step graphs let go of the collectives they captured: NCCL's destroy waits for them. */
        umt_hooks_collectives_end(dist->ctx);
        umt_hooks_unregister(dist->ctx, &dist_hooks);
    }
    umt_engine_destroy(dist->engine);
#endif
    umt_bucket_plan_free(&dist->plan);
    free(dist);
}
