/* core/context.c — creating and destroying a context; parameters; owned objects; pool stats. */
#include "core/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/device.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "memory/ledger.h"
#include "memory/trace.h"

umt_context_options umt_context_defaults(void) {
    return (umt_context_options){.device = umt_default_device(), .seed = 1, .memory_mode = UMT_MEM_MANAGED};
}

umt_status umt_context_create(const umt_context_options *options, umt_context **out) {
    if (!out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_context_create: out is NULL");
    *out = NULL;
    umt_context_options opts = options ? *options : umt_context_defaults();
    if ((unsigned)opts.memory_mode > UMT_MEM_DEVICE)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_context_create: memory mode %d (expected 0..2)", (int)opts.memory_mode);
    /* TF32 is a way for CUDA's tensor cores to take fp32: elsewhere it would silently change nothing. */
    if (opts.tf32 && (opts.device != UMT_DEVICE_CUDA || opts.precision != UMT_PRECISION_FP32))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_context_create: tf32 with %s %s (it applies to fp32 "
                        "convolutions on CUDA)", opts.device == UMT_DEVICE_CUDA ? "cuda" : "cpu",
                        umt_precision_name(opts.precision));
    umt_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_context_create: no memory for the context");
    ctx->options = opts;
    ctx->grad_enabled = true;
    ctx->training = true;
    umt_memory_init(&ctx->memory, opts.device, opts.memory_mode, opts.cuda_device);
    umt_rng_seed(&ctx->rng, opts.seed);
    umt_status st = umt_device_start(ctx);
    if (st == UMT_OK) st = umt_precision_check(ctx);
    const char *trace = getenv("UMT_MEM_TRACE");
    if (st == UMT_OK && trace && *trace) st = umt_trace_open(trace, &ctx->memory, &ctx->memory.trace);
    if (st != UMT_OK) {
        umt_context_destroy(ctx);
        return st;
    }
    *out = ctx;
    return UMT_OK;
}

static void free_headers(umt_tensor *list) {
    while (list) {
        umt_tensor *next = list->next;
        free(list->name);
        free(list);
        list = next;
    }
}

void umt_context_destroy(umt_context *ctx) {
    if (!ctx) return;
    const char *report = getenv("UMT_MEM_REPORT");
    if (report && strcmp(report, "0") && ctx->backend) umt_memory_report(ctx);
    /* Subsystems first: work they queued may still read or write tensors about to be freed. */
    umt_hooks_destroy(ctx);
    /* Owned objects first: their destructors free tensors that still belong to the pools. */
    while (ctx->owned) {
        umt_owned *o = ctx->owned;
        ctx->owned = o->next;
        o->destroy(o->object);
        free(o);
    }
    free_headers(ctx->step_tensors);
    free_headers(ctx->run_tensors);
    free(ctx->parameters);
    free(ctx->buffers);
    umt_tape_release(&ctx->tape);
    umt_trace_close(ctx->memory.trace);
    ctx->memory.trace = NULL;
    umt_step_values_release(ctx);
    umt_micro_batch_release(ctx);
    umt_branch_release(ctx);
    /* The device's stream may still be using pool memory: stop it first. */
    umt_device_stop(ctx);
    umt_memory_release(&ctx->memory);
    free(ctx);
}

umt_status umt_context_own(umt_context *ctx, void *object, void (*destroy)(void *object)) {
    umt_owned *o = malloc(sizeof *o);
    if (!o) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_context_own: no memory");
    *o = (umt_owned){object, destroy, ctx->owned};
    ctx->owned = o;
    return UMT_OK;
}

void umt_context_disown(umt_context *ctx, void *object) {
    for (umt_owned **link = &ctx->owned; *link; link = &(*link)->next) {
        if ((*link)->object != object) continue;
        umt_owned *o = *link;
        *link = o->next;
        free(o);
        return;
    }
}

umt_status umt_pool_stats_get(const umt_context *ctx, umt_pool pool, umt_pool_stats *out) {
    if (!ctx || !out) return umt_fail_null("umt_pool_stats_get", ctx ? "out" : "ctx");
    if ((unsigned)pool >= UMT_POOL_COUNT)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_pool_stats_get: pool %d (expected 0..%d)", (int)pool,
                        UMT_POOL_COUNT - 1);
    umt_memory_stats(&ctx->memory, pool, out);
    return UMT_OK;
}

void umt_memory_report(const umt_context *ctx) {
    if (!ctx) {
        umt_fail_null("umt_memory_report", "ctx");
        return;
    }
    fprintf(stderr, "%-12s %-8s %14s %14s %12s\n", "pool", "place", "capacity B", "peak B", "allocations");
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        umt_pool_stats s;
        umt_memory_stats(&ctx->memory, (umt_pool)p, &s);
        fprintf(stderr, "%-12s %-8s %14zu %14zu %12llu\n", umt_pool_name((umt_pool)p),
                umt_placement_name(ctx->memory.pools[p].placement), s.capacity_bytes, s.peak_bytes,
                (unsigned long long)s.allocations);
    }
    umt_pool_stats a;
    umt_memory_stats(&ctx->memory, UMT_POOL_ACTIVATIONS, &a);
    if (a.planned_total_bytes)
        fprintf(stderr, "activations planned from the first training step: peak %zu bytes for %zu bytes of tensors (%.0f%%)\n",
                a.planned_peak_bytes, a.planned_total_bytes, 100.0 * (double)a.planned_peak_bytes / (double)a.planned_total_bytes);
    if (ctx->shared_dataset_bytes)
        fprintf(stderr, "dataset      shared   %zu bytes read from another context's dataset pool (counted there)\n",
                ctx->shared_dataset_bytes);
    if (ctx->options.device == UMT_DEVICE_CUDA)
        fprintf(stderr, "device budget %zu bytes, %zu held (%s memory)\n", ctx->memory.budget_bytes,
                ctx->memory.device_bytes, umt_memory_mode_name(ctx->options.memory_mode));
    if (ctx->memory.ledger) umt_ledger_print(ctx->memory.ledger, stderr); /* the GPU's other umtrain holders */
    umt_hooks_report(ctx, stderr);
}

umt_status umt_device_budget(const umt_context *ctx, size_t *budget_bytes, size_t *used_bytes) {
    if (!ctx || !budget_bytes || !used_bytes)
        return umt_fail_null("umt_device_budget", !ctx ? "ctx" : !budget_bytes ? "budget_bytes" : "used_bytes");
    *budget_bytes = ctx->memory.budget_bytes;
    *used_bytes = ctx->memory.device_bytes;
    return UMT_OK;
}

static const char *const memory_mode_names[] = {"managed", "managed-plain", "device"};

const char *umt_memory_mode_name(umt_memory_mode mode) {
    return (unsigned)mode <= UMT_MEM_DEVICE ? memory_mode_names[mode] : "invalid-memory-mode";
}

umt_status umt_memory_mode_parse(const char *name, umt_memory_mode *out) {
    if (!name || !out) return umt_fail_null("umt_memory_mode_parse", name ? "out" : "name");
    for (int m = 0; m <= UMT_MEM_DEVICE; ++m)
        if (!strcmp(name, memory_mode_names[m])) return *out = (umt_memory_mode)m, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "memory mode '%s': expected managed, managed-plain or device", name);
}

/* ----------------------------------------------------------------------------------------- */
/* Parameters */

/* Appends t to a growable list of named tensors (parameters or buffers). */
static umt_status register_named(umt_tensor ***list, int *count, int *slots, umt_tensor *t) {
    if (*count == *slots) {
        int grown_slots = *slots ? 2 * *slots : 16;
        umt_tensor **grown = realloc(*list, (size_t)grown_slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "no memory to register tensor %s", t->name);
        *list = grown;
        *slots = grown_slots;
    }
    (*list)[(*count)++] = t;
    return UMT_OK;
}

/* An f32 tensor of the weights pool with a copy of name; NULL (and nothing left) on failure. A
 * parameter's pool is the hooks' choice (a subsystem may hold it elsewhere, core/hooks.h); a
 * buffer's never is. */
static umt_tensor *named_weights(umt_context *ctx, const char *what, const char *name, int ndim, const int64_t *shape,
                                 bool parameter) {
    if (!ctx || !name || !shape) {
        umt_fail_null(what, !ctx ? "ctx" : !name ? "name" : "shape");
        return NULL;
    }
    umt_tensor *t = parameter ? umt_tensor_alloc_kind(ctx, UMT_POOL_WEIGHTS, UMT_F32, ndim, shape)
                              : umt_tensor_alloc(ctx, UMT_POOL_WEIGHTS, UMT_F32, ndim, shape);
    if (t && !(t->name = strdup(name))) {
        umt_tensor_free(t);
        umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: %s", what, name);
        return NULL;
    }
    return t;
}

umt_tensor *umt_parameter_new(umt_context *ctx, const char *name, int ndim, const int64_t *shape) {
    umt_tensor *p = named_weights(ctx, "umt_parameter_new", name, ndim, shape, true);
    umt_tensor *g = p ? umt_tensor_alloc_kind(ctx, UMT_POOL_GRADS, UMT_F32, ndim, shape) : NULL;
    if (g) g->owner = p;
    if (!g || umt_kernels(ctx)->f32.fill(g->data, g->numel, 0.0f) != UMT_OK ||
        register_named(&ctx->parameters, &ctx->parameter_count, &ctx->parameter_slots, p) != UMT_OK) {
        umt_tensor_free(g);
        umt_tensor_free(p);
        return NULL;
    }
    p->is_parameter = true;
    p->requires_grad = true;
    p->grad = g;
    return p;
}

/* The i-th of count named tensors (what: "parameters" or "buffers"), or NULL with a message. */
static umt_tensor *named_at(const char *function, umt_tensor *const *list, int count, const char *what, int i) {
    if (i >= 0 && i < count) return list[i];
    umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: index %d of %d %s (expected 0..%d)", function, i, count, what, count - 1);
    return NULL;
}

int umt_parameter_count(const umt_context *ctx) {
    if (!ctx) return umt_fail_null("umt_parameter_count", "ctx"), 0;
    return ctx->parameter_count;
}

umt_tensor *umt_parameter_at(const umt_context *ctx, int i) {
    if (!ctx) return umt_fail_null("umt_parameter_at", "ctx"), NULL;
    return named_at("umt_parameter_at", ctx->parameters, ctx->parameter_count, "parameters", i);
}

umt_tensor *umt_buffer_new(umt_context *ctx, const char *name, int ndim, const int64_t *shape) {
    umt_tensor *b = named_weights(ctx, "umt_buffer_new", name, ndim, shape, false);
    if (b && register_named(&ctx->buffers, &ctx->buffer_count, &ctx->buffer_slots, b) != UMT_OK) {
        umt_tensor_free(b);
        return NULL;
    }
    return b;
}

int umt_buffer_count(const umt_context *ctx) {
    if (!ctx) return umt_fail_null("umt_buffer_count", "ctx"), 0;
    return ctx->buffer_count;
}

umt_tensor *umt_buffer_at(const umt_context *ctx, int i) {
    if (!ctx) return umt_fail_null("umt_buffer_at", "ctx"), NULL;
    return named_at("umt_buffer_at", ctx->buffers, ctx->buffer_count, "buffers", i);
}

bool umt_set_training(umt_context *ctx, bool training) {
    if (!ctx) return umt_fail_null("umt_set_training", "ctx"), false;
    bool previous = ctx->training;
    ctx->training = training;
    return previous;
}

umt_status umt_context_workspace_block(umt_context *ctx, void **block, size_t *have, size_t bytes, void **out) {
    if (bytes > *have) {
        /* Freeing device memory waits for the device, so no queued kernel still uses the old block. */
        umt_memory_free(&ctx->memory, UMT_POOL_WORKSPACE, *block);
        *block = NULL;
        *have = 0;
        UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_WORKSPACE, bytes, block));
        *have = bytes;
    }
    *out = *block;
    return UMT_OK;
}

umt_status umt_context_workspace(umt_context *ctx, size_t bytes, void **out) {
    return umt_context_workspace_block(ctx, &ctx->conv_workspace, &ctx->conv_workspace_bytes, bytes, out);
}
