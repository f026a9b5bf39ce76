/* core/tensor.c — tensor headers, their storage from the pools, shapes, copies. */
#include "core/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "memory/plan.h"

/* Validates a shape and computes its element count without overflow. */
static umt_status shape_numel(const char *op, int ndim, const int64_t *shape, int64_t *numel) {
    if (!shape) return umt_fail_null(op, "shape");
    if (ndim < 1 || ndim > UMT_MAX_DIMS)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: rank %d (expected 1..%d)", op, ndim, UMT_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) {
        if (shape[i] <= 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: dimension %d is %lld (expected > 0)", op, i, (long long)shape[i]);
        if (n > INT64_MAX / 16 / shape[i]) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: shape too large (dimension %d)", op, i);
        n *= shape[i];
    }
    *numel = n;
    return UMT_OK;
}

/* A header on one of the context's lists; no storage yet. */
static umt_tensor *new_header(umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim, const int64_t *shape, int64_t numel) {
    umt_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        umt_fail(UMT_ERR_OUT_OF_MEMORY, "no memory for a tensor header");
        return NULL;
    }
    t->ctx = ctx;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->numel = numel;
    t->bytes = (size_t)numel * umt_dtype_size(dtype);
    t->pool = pool;
    t->kind_pool = pool;
    t->device = ctx->options.device;
    umt_tensor **list = umt_pool_policy_of(pool)->lifetime == UMT_LIFETIME_STEP ? &ctx->step_tensors : &ctx->run_tensors;
    t->next = *list;
    *list = t;
    return t;
}

static void unlink_header(umt_tensor *t) {
    umt_context *ctx = t->ctx;
    umt_tensor **list = umt_pool_policy_of(t->pool)->lifetime == UMT_LIFETIME_STEP ? &ctx->step_tensors : &ctx->run_tensors;
    for (umt_tensor **link = list; *link; link = &(*link)->next)
        if (*link == t) {
            *link = t->next;
            return;
        }
}

umt_tensor *umt_tensor_alloc(umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim, const int64_t *shape) {
    int64_t numel = 0;
    if (!ctx) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_new: ctx is NULL");
        return NULL;
    }
    if ((unsigned)pool >= UMT_POOL_COUNT || umt_dtype_size(dtype) == 0) {
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_new: pool %d / dtype %d out of range", (int)pool, (int)dtype);
        return NULL;
    }
    if (shape_numel("umt_tensor_new", ndim, shape, &numel) != UMT_OK) return NULL;
    /* A dry step measures what libraries will be handed: cuDNN takes at most INT_MAX elements. */
    if (ctx->dry && numel > ctx->dry_largest_numel) ctx->dry_largest_numel = numel;
    umt_tensor *t = new_header(ctx, pool, dtype, ndim, shape, numel);
    if (!t) return NULL;
    if (ctx->dry && t->bytes > ctx->dry_largest_bytes) ctx->dry_largest_bytes = t->bytes;
    if (umt_memory_alloc_slot(&ctx->memory, pool, t->bytes, &t->data, &t->arena_slot) != UMT_OK) {
        unlink_header(t);
        free(t);
        return NULL;
    }
    t->owns_storage = true;
    return t;
}

umt_tensor *umt_tensor_alloc_kind(umt_context *ctx, umt_pool kind_pool, umt_dtype dtype, int ndim, const int64_t *shape) {
    umt_tensor *t = umt_tensor_alloc(ctx, ctx ? umt_hooks_place(ctx, kind_pool) : kind_pool, dtype, ndim, shape);
    if (t) t->kind_pool = kind_pool;
    return t;
}

umt_tensor *umt_tensor_view(umt_context *ctx, umt_tensor *base, int ndim, const int64_t *shape) {
    int64_t numel = 0;
    if (shape_numel("umt_reshape", ndim, shape, &numel) != UMT_OK) return NULL;
    if (numel != base->numel) {
        char buf[64];
        umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_reshape: %lld elements into a shape of %lld (input %s)",
                 (long long)base->numel, (long long)numel, umt_shape_string(base, buf, sizeof buf));
        return NULL;
    }
    /* Views live on the step list whatever their base, so umt_step_begin frees them. */
    umt_tensor *t = new_header(ctx, UMT_POOL_ACTIVATIONS, base->dtype, ndim, shape, numel);
    if (!t) return NULL;
    t->data = base->data;
    t->arena_slot = UMT_PLAN_NO_SLOT;
    return t;
}

/* The public constructors: a NULL context is named with the function the caller called. */
static umt_tensor *new_tensor(const char *function, umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim,
                              const int64_t *shape) {
    if (!ctx) return umt_fail_null(function, "ctx"), NULL;
    return umt_tensor_alloc(ctx, pool, dtype, ndim, shape);
}

umt_tensor *umt_tensor_new(umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim, const int64_t *shape) {
    return new_tensor("umt_tensor_new", ctx, pool, dtype, ndim, shape);
}

umt_tensor *umt_tensor_new_1d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0) {
    return new_tensor("umt_tensor_new_1d", ctx, pool, dtype, 1, (int64_t[]){n0});
}

umt_tensor *umt_tensor_new_2d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0, int64_t n1) {
    return new_tensor("umt_tensor_new_2d", ctx, pool, dtype, 2, (int64_t[]){n0, n1});
}

umt_tensor *umt_tensor_new_4d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0, int64_t n1, int64_t n2,
                              int64_t n3) {
    return new_tensor("umt_tensor_new_4d", ctx, pool, dtype, 4, (int64_t[]){n0, n1, n2, n3});
}

/* Removes t from a list of named tensors (parameters or buffers) if it is there. */
static void forget_named(umt_tensor **list, int *count, const umt_tensor *t) {
    for (int i = 0; i < *count; ++i)
        if (list[i] == t) {
            memmove(&list[i], &list[i + 1], (size_t)(*count - i - 1) * sizeof *list);
            (*count)--;
            return;
        }
}

void umt_tensor_free(umt_tensor *t) {
    if (!t || umt_pool_policy_of(t->pool)->lifetime == UMT_LIFETIME_STEP) return;
    if (t->name) forget_named(t->ctx->buffers, &t->ctx->buffer_count, t);
    if (t->is_parameter) {
        forget_named(t->ctx->parameters, &t->ctx->parameter_count, t);
        umt_tensor_free(t->grad);
        umt_tensor_free(t->lowp);
    }
    if (t->owns_storage) umt_memory_free(&t->ctx->memory, t->pool, t->data);
    unlink_header(t);
    free(t->name);
    free(t);
}

static umt_tensor *new_grad(umt_context *ctx, umt_tensor *t, bool zeroed) {
    if (t->grad) return t->grad;
    /* An activation's gradient has its dtype and layout (bf16 NHWC under bf16, say). */
    umt_tensor *g = umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, t->dtype, t->ndim, t->shape);
    if (!g || (zeroed && umt_kernels(ctx)->f32.zero(g->data, g->bytes) != UMT_OK)) return NULL;
    g->nhwc = t->nhwc;
    t->grad = g;
    return g;
}

umt_tensor *umt_tensor_grad_or_zeros(umt_context *ctx, umt_tensor *t) { return new_grad(ctx, t, true); }
umt_tensor *umt_tensor_grad_unset(umt_context *ctx, umt_tensor *t) { return new_grad(ctx, t, false); }

/* ----------------------------------------------------------------------------------------- */
/* Accessors */

/* A NULL tensor gets the neutral value umtrain.h names, and a message. */
int umt_tensor_ndim(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_ndim", "t"), 0;
    return t->ndim;
}

int64_t umt_tensor_dim(const umt_tensor *t, int axis) {
    if (!t) return umt_fail_null("umt_tensor_dim", "t"), 0;
    return axis >= 0 && axis < t->ndim ? t->shape[axis] : 0;
}

int64_t umt_tensor_numel(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_numel", "t"), 0;
    return t->numel;
}

umt_dtype umt_tensor_dtype(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_dtype", "t"), UMT_DTYPE_COUNT;
    return t->dtype;
}

umt_pool umt_tensor_pool(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_pool", "t"), UMT_POOL_COUNT;
    return t->pool;
}

umt_device umt_tensor_device(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_device", "t"), UMT_DEVICE_CPU;
    return t->device;
}

const char *umt_tensor_name(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_name", "t"), NULL;
    return t->name;
}

umt_tensor *umt_tensor_grad(const umt_tensor *t) {
    if (!t) return umt_fail_null("umt_tensor_grad", "t"), NULL;
    return t->grad;
}

const char *umt_shape_string(const umt_tensor *t, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < t->ndim && used < size; ++i)
        used += (size_t)snprintf(buf + used, size - used, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

umt_status umt_check_input(const umt_context *ctx, const char *op, const char *arg, const umt_tensor *t,
                           umt_dtype dtype, int ndim) {
    if (!ctx) return umt_fail_null(op, "ctx");
    if (!t) return umt_fail_null(op, arg);
    UMT_TRY(umt_check_owner(ctx, op, arg, t->ctx));
    return umt_check_tensor(op, arg, t, dtype, ndim);
}

umt_status umt_check_owner(const umt_context *ctx, const char *op, const char *arg, const umt_context *owner) {
    if (owner != ctx)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s belongs to another context than ctx", op, arg);
    return UMT_OK;
}

umt_status umt_check_tensor(const char *op, const char *arg, const umt_tensor *t, umt_dtype dtype, int ndim) {
    char buf[64];
    if (!t) return umt_fail_null(op, arg);
    if (dtype == UMT_ANY_DTYPE) {
        /* any element type */
    } else if (dtype == UMT_ANY_FLOAT) {
        if (t->dtype != UMT_F32 && t->dtype != UMT_BF16 && t->dtype != UMT_F16)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s has dtype %s (expected f32, bf16 or f16)", op, arg,
                            umt_dtype_name(t->dtype));
        /* Only the CUDA backend has kernels for half types (kernels/backend.h, mixed precision). */
        if (t->dtype != UMT_F32 && !umt_kernels(t->ctx)->lowp.gemm)
            return umt_fail(UMT_ERR_UNSUPPORTED, "%s: %s is %s, which the %s backend cannot compute on", op, arg,
                            umt_dtype_name(t->dtype), umt_kernels(t->ctx)->name);
    } else if (t->dtype != dtype)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s has dtype %s (expected %s)", op, arg, umt_dtype_name(t->dtype),
                        umt_dtype_name(dtype));
    if (ndim && t->ndim != ndim)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s has shape %s (expected rank %d)", op, arg,
                        umt_shape_string(t, buf, sizeof buf), ndim);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Copies and fills */

/* host is argument host_name of op (src or dst). */
static umt_status check_bytes(const char *op, const umt_tensor *t, const void *host, const char *host_name,
                              size_t bytes) {
    if (!t || !host) return umt_fail_null(op, t ? host_name : "t");
    if (bytes != t->bytes)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %zu bytes given, the tensor holds %zu", op, bytes, t->bytes);
    return UMT_OK;
}

void umt_tensor_written(umt_tensor *t) {
    t->lowp_stale = true; /* a parameter's compute copy no longer matches (core/precision.c) */
    if (t->owner && t->owner->grad == t) t->owner->grad_zeroed = false;
}

umt_status umt_tensor_copy_from_host(umt_tensor *t, const void *src, size_t bytes) {
    UMT_TRY(check_bytes("umt_tensor_copy_from_host", t, src, "src", bytes));
    umt_tensor_written(t);
    return umt_kernels(t->ctx)->f32.upload(t->data, src, bytes);
}

umt_status umt_tensor_copy_to_host(const umt_tensor *t, void *dst, size_t bytes) {
    UMT_TRY(check_bytes("umt_tensor_copy_to_host", t, dst, "dst", bytes));
    return umt_kernels(t->ctx)->f32.download(dst, t->data, bytes);
}

umt_status umt_tensor_fill(umt_tensor *t, float value) {
    UMT_TRY(umt_check_tensor("umt_tensor_fill", "t", t, UMT_F32, 0));
    umt_tensor_written(t);
    return umt_kernels(t->ctx)->f32.fill(t->data, t->numel, value);
}

umt_status umt_tensor_get_f32(const umt_tensor *t, int64_t i, float *out) {
    UMT_TRY(umt_check_tensor("umt_tensor_get_f32", "t", t, UMT_F32, 0));
    if (!out) return umt_fail_null("umt_tensor_get_f32", "out");
    if (i < 0 || i >= t->numel)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_get_f32: index %lld outside 0..%lld", (long long)i,
                        (long long)t->numel - 1);
    return umt_kernels(t->ctx)->f32.download(out, (const float *)t->data + i, sizeof *out);
}

umt_status umt_tensor_convert(const umt_tensor *src, umt_tensor *dst) {
    if (!src || !dst) return umt_fail_null("umt_tensor_convert", src ? "dst" : "src");
    if (dst->ctx != src->ctx)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_convert: dst belongs to another context than src");
    if (src->numel != dst->numel) {
        char a[64], b[64];
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_convert: src %s and dst %s differ in size",
                        umt_shape_string(src, a, sizeof a), umt_shape_string(dst, b, sizeof b));
    }
    umt_tensor_written(dst);
    return umt_kernels(src->ctx)->f32.convert(src->data, src->dtype, dst->data, dst->dtype, src->numel);
}
