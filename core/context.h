/*
 * core/context.h — the context: one device's pools, backend, tape, RNG and parameters.
 */
#ifndef UMT_CORE_CONTEXT_H
#define UMT_CORE_CONTEXT_H

#include <stdbool.h>

#include "core/base/rng.h"
#include "core/branch.h"
#include "core/hooks.h"
#include "core/micro_batch.h"
#include "core/step_values.h"
#include "core/tape.h"
#include "kernels/backend.h"
#include "memory/pool.h"
#include "umtrain.h"

/* Something the context frees when it is destroyed (layers, optimizers, datasets). */
typedef struct umt_owned {
    void *object;
    void (*destroy)(void *object);
    struct umt_owned *next;
} umt_owned;

struct umt_context {
    umt_context_options options;
    const umt_backend *backend; /* call it through umt_kernels(ctx), which binds the context first */
    struct umt_cuda_state *cuda; /* CUDA: the context's stream, handles and kernel scratch (kernels/cuda) */
    umt_memory memory;
    umt_rng rng;
    umt_tape tape;
    bool grad_enabled;
    umt_tensor *run_tensors;  /* headers of tensors in RUN pools */
    umt_tensor *step_tensors; /* headers of activations and views: freed by umt_step_begin */
    bool training; /* dropout active, batch norm on batch statistics */
    umt_tensor **parameters;
    int parameter_count;
    int parameter_slots;
    umt_tensor **buffers; /* named model state that is not trained (running statistics) */
    int buffer_count;
    int buffer_slots;
    void *timer_start;    /* umt_timer_start's CUDA event (CPU: unused) */
    double timer_start_s; /* umt_timer_start's clock reading (CPU) */
    void *conv_workspace; /* one growing block of the workspace pool, shared by conv calls */
    size_t conv_workspace_bytes;
    umt_branch_state branch; /* weight gradients on the side stream (core/branch.h) */
    umt_step_values values; /* the step's host values on their way to the kernels */
    size_t shared_dataset_bytes; /* datasets this context reads from another's pool (umt_dataset_share) */
    umt_owned *owned;
    umt_hook_table hooks; /* the subsystems taking part in each step (core/hooks.h) */
    int64_t steps_begun;  /* umt_step_begin calls, for the trace's step marks */
    umt_micro_batch_state micro; /* the step's micro-batches (core/micro_batch.h) */
    /* The loss of the step's last umt_backward, or the micro-batches' sum when the step is split
     * (device memory): what the optimizer's non-finite check reads. NULL once the step's
     * activations are released (umt_step_begin). */
    const float *step_loss;
    /* While a step graph runs its step (core/step/step_graph.c): where it keeps the step's loss
     * (last) and adds it to a sum (sum[0]; sum[1] gets the sum before). The optimizer's decision,
     * which reads that loss anyway, does it in its kernel and names the loss it kept (kept_for):
     * one kernel fewer a step. */
    struct {
        float *last, *sum;
        const float *kept_for;
    } loss_keep;
    void *forward_trace;         /* UMT_MEM_TRACE: where this step's forward began (memory/trace.h) */
    /* Set only while a dry step runs (core/step/dry_step.c): kernels are no-ops, the pools record
     * without backing (memory/dry.h), and the largest tensor made is measured, in elements and
     * in bytes. */
    bool dry;
    bool dry_hooked_in_backward; /* the real step's umt_hooks_in_backward, which a dry step hides */
    int64_t dry_largest_numel;
    size_t dry_largest_bytes;
};

/* Binds the context's device state to the calling thread (CUDA: its stream, handles and kernel
 * scratch, kernels/cuda/backend.cu; the CPU has none). Every call into the kernel table goes
 * through umt_kernels, which binds first, so that a context used from any thread computes on its
 * own stream; code that uses the stream otherwise binds too. */
void umt_device_bind(const umt_context *ctx);

/* The context's kernel table, with the context bound to the calling thread. */
static inline const umt_backend *umt_kernels(const umt_context *ctx) {
    umt_device_bind(ctx);
    return ctx->backend;
}

/* Scratch of at least bytes from the workspace pool, valid until the next call (ops run in
 * order on one stream, so one block serves them all; the side stream has its own,
 * umt_branch_workspace). */
umt_status umt_context_workspace(umt_context *ctx, size_t bytes, void **out);
/* The growing block behind both: *block of *have bytes, replaced by one of bytes when smaller. */
umt_status umt_context_workspace_block(umt_context *ctx, void **block, size_t *have, size_t bytes, void **out);

/* Registers object to be destroyed with the context; umt_context_disown removes it. */
umt_status umt_context_own(umt_context *ctx, void *object, void (*destroy)(void *object));
void umt_context_disown(umt_context *ctx, void *object);

#endif /* UMT_CORE_CONTEXT_H */
