/*
 * core/tensor.h — what a tensor is inside umtrain.
 *
 * A tensor is a small header (this struct, on the C heap) over storage that always comes from
 * one pool of memory/ (`pool` says which; `data` points into it). Views (reshape) share their
 * base's storage and own none.
 */
#ifndef UMT_CORE_TENSOR_H
#define UMT_CORE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

struct umt_tensor {
    umt_context *ctx;
    umt_dtype dtype;
    int ndim;
    int64_t shape[UMT_MAX_DIMS];
    int64_t numel;
    size_t bytes;
    void *data;
    umt_pool pool;
    umt_device device;  /* where the storage is used: the context's device */
    bool owns_storage;  /* false for views */
    bool requires_grad; /* a gradient flows into this tensor in backward */
    bool is_parameter;
    bool nhwc;          /* 4-D activations under bf16/fp16: stored N,H,W,C (shape still reads N,C,H,W) */
    bool lowp_stale;    /* parameters: the master was written from the host since lowp was made */
    bool grad_zeroed;   /* parameters: the gradient is zero (a zero fill, or an update that consumed it,
                         * queued since it was last written): umt_zero_grad has nothing to fill */
    bool grad_consumed; /* parameters: an optimizer's step consumes the gradient (zero_grads_in_step) */
    char *name;         /* parameters only */
    umt_tensor *grad;   /* parameters: in the grads pool; others: activations, made in backward */
    umt_tensor *lowp;   /* parameters under bf16/fp16 precision: the compute copy (weights pool), which
                         * the optimizer's update kernel rewrites from the fp32 master; else NULL */
    int pending_uses;   /* parameters: tape uses whose backward has not run yet this step */
    int tape_uses;      /* parameters: uses on the tape since the last backward (core/branch.h) */
    int arena_slot;     /* activations: the allocation's slot in the arena plan (memory/plan.h) */
    umt_pool kind_pool; /* the pool its kind belongs to; pool differs where a subsystem holds it (core/hooks.h) */
    umt_tensor *owner;  /* gradients and optimizer state: their parameter */
    /* The offload tier's own state (offload/offload.h): only offload/ reads or writes it. */
    struct {
        void *home;         /* offloaded: its bytes in the tier; data points there or at a streaming buffer */
        bool grad_zero;     /* parameters: the gradient is zero, its host copy not rewritten yet */
        bool updated_early; /* parameters: updated during this step's backward */
    } offload;
    umt_tensor *next;   /* the context's list this header is on */
};

/* t was written from the host: a parameter's compute copy, or its parameter's knowledge of a zero
 * gradient when t is a gradient, no longer holds. */
void umt_tensor_written(umt_tensor *t);

/* A header over new storage of pool (the public umt_tensor_new). */
umt_tensor *umt_tensor_alloc(umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim, const int64_t *shape);
/* The same for a tensor of kind pool (weights, grads, optim), whose storage comes from the pool
 * the hooks choose (core/hooks.h: a subsystem may hold it elsewhere), kind_pool itself if none. */
umt_tensor *umt_tensor_alloc_kind(umt_context *ctx, umt_pool kind_pool, umt_dtype dtype, int ndim, const int64_t *shape);
/* A view of base's storage with another shape (same numel), in the activations list. */
umt_tensor *umt_tensor_view(umt_context *ctx, umt_tensor *base, int ndim, const int64_t *shape);
/* t->grad, made (zero-filled, in the activations pool) if t has none yet. */
umt_tensor *umt_tensor_grad_or_zeros(umt_context *ctx, umt_tensor *t);
/* The same, a new gradient left unzeroed (for a backward that writes all of it). */
umt_tensor *umt_tensor_grad_unset(umt_context *ctx, umt_tensor *t);

/* Writes "[2,3,4]" into buf, for error messages. */
const char *umt_shape_string(const umt_tensor *t, char *buf, size_t size);

/* Shape/dtype checks that name the op and the argument on failure: t is not NULL, then its dtype
 * (UMT_ANY_FLOAT accepts f32, and bf16/f16 where the backend computes on them; UMT_ANY_DTYPE any)
 * and its rank (ndim 0 accepts any). */
#define UMT_ANY_FLOAT UMT_DTYPE_COUNT
#define UMT_ANY_DTYPE ((umt_dtype)(UMT_DTYPE_COUNT + 1))
umt_status umt_check_tensor(const char *op, const char *arg, const umt_tensor *t, umt_dtype dtype, int ndim);

/* An op's input, checked before anything reads it: ctx and t are not NULL, t belongs to ctx
 * ("<op>: <arg> belongs to another context than ctx"), then umt_check_tensor. Every public
 * function that takes a context and a tensor checks each tensor through here. */
umt_status umt_check_input(const umt_context *ctx, const char *op, const char *arg, const umt_tensor *t,
                           umt_dtype dtype, int ndim);
/* The last step of umt_check_input, for objects other than tensors (layers, optimizers, datasets):
 * owner, the context argument arg was made by, is ctx. */
umt_status umt_check_owner(const umt_context *ctx, const char *op, const char *arg, const umt_context *owner);

#endif /* UMT_CORE_TENSOR_H */
