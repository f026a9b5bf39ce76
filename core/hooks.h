/*
 * core/hooks.h — the hook table: how a subsystem takes part in a training step without the core
 * knowing it.
 *
 * The core (tensors, the tape, the optimizer) knows nothing of the subsystems built on it: the
 * offload tier (offload/), data parallelism (dist/), a caller's gradient hook. Each fills one
 * umt_hooks table with the events it cares about, leaves the others NULL, and registers it on the
 * context with its own state (`self`). At each event the core calls, in registration order,
 * every table that has that event:
 *
 *   event                  when                                            offload   dist
 *   place                  a weights, grads or optim tensor is made          yes
 *   step_begin             umt_step_begin, the last step's tensors freed     yes      yes
 *   op_recorded            an op is recorded on the tape                     yes
 *   parameter_read         a matrix op reads a parameter in forward          yes
 *   zero_grad              umt_zero_grad, for each parameter                 yes
 *   before_op_backward     before a tape node's backward                     yes
 *   after_op_backward      after it (and after a node on no path to loss)    yes
 *   gradient_ready         a parameter's gradient is final for the step      yes      yes
 *   after_backward         the end of umt_backward                           yes
 *   optimizer              an optimizer is made or destroyed                 yes
 *   updates_parameter      umt_optimizer_step asks who updates a parameter   yes
 *   after_update           umt_optimizer_step, after its own updates         yes
 *   report                 umt_memory_report                                 yes
 *   destroy                umt_context_destroy, before anything is freed     yes
 *   graph_agree            a step graph's choice, made with the other ranks           yes
 *   before_graph_launch    a step graph is about to launch its captured step          yes
 *   after_graph_launch     that launch is queued on the compute stream                yes
 *   collectives_end        umt_dist_destroy: captured collectives go   (step graphs subscribe)
 *
 * A step graph (core/step/step_graph.c) registers a table of its own for collectives_end.
 *
 * A table with `unreplayable` set takes part in every step in a way a CUDA graph's replay would
 * not redo: a step graph refuses to capture its steps, with that reason.
 */
#ifndef UMT_CORE_HOOKS_H
#define UMT_CORE_HOOKS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/tape.h"
#include "umtrain.h"

typedef struct umt_hooks {
    const char *name; /* "offload", "dist": for messages */
    const char *unreplayable;
    umt_pool (*place)(const umt_context *ctx, void *self, umt_pool kind);
    umt_status (*step_begin)(umt_context *ctx, void *self);
    umt_status (*op_recorded)(umt_context *ctx, void *self, int node);
    umt_status (*parameter_read)(umt_context *ctx, void *self, umt_tensor *parameter);
    /* true when the subsystem zeroed (or marked zero) the parameter's gradient itself */
    bool (*zero_grad)(umt_context *ctx, void *self, umt_tensor *parameter);
    umt_status (*before_op_backward)(umt_context *ctx, void *self, const umt_node *node);
    umt_status (*after_op_backward)(umt_context *ctx, void *self, int node);
    umt_status (*gradient_ready)(umt_context *ctx, void *self, umt_tensor *parameter);
    umt_status (*after_backward)(umt_context *ctx, void *self);
    void (*optimizer)(umt_context *ctx, void *self, const umt_optimizer *opt, bool alive);
    /* true when the subsystem updates parameter (its state tensors state0, state1 may be NULL)
     * in after_update, so that the optimizer leaves it alone */
    bool (*updates_parameter)(const umt_context *ctx, void *self, const umt_tensor *parameter,
                              const umt_tensor *state0, const umt_tensor *state1);
    /* step: the step the optimizer is taking (Adam's bias correction counts it) */
    umt_status (*after_update)(umt_context *ctx, void *self, const umt_optimizer *opt, int64_t step);
    void (*report)(const umt_context *ctx, void *self, FILE *out);
    void (*destroy)(umt_context *ctx, void *self);
    /* A subsystem whose steps hold collectives across processes (NCCL) has this: a step graph then
     * makes every choice that could differ between processes (capture, replay, eager) the same
     * on all of them, as NCCL requires of captured collectives. *all comes in as this process's
     * answer and leaves true only when every process's was; every process calls it at the same
     * point of its run (a collective itself). */
    umt_status (*graph_agree)(umt_context *ctx, void *self, bool *all);
    /* Around each launch of a captured step (a replay, or the capture's own run): before may
     * refuse it (a peer known dead), after sees it queued. */
    umt_status (*before_graph_launch)(umt_context *ctx, void *self);
    umt_status (*after_graph_launch)(umt_context *ctx, void *self);
    /* The collectives a step graph captured are about to go (umt_dist_destroy): a graph that holds
     * some drops it (NCCL's communicator waits for every graph holding its collectives to die). */
    void (*collectives_end)(umt_context *ctx, void *self);
} umt_hooks;

/* One registered table and its subsystem's state; the context keeps them in order. */
typedef struct {
    const umt_hooks *hooks;
    void *self;
} umt_subscription;

typedef struct {
    umt_subscription *list;
    int count, slots;
} umt_hook_table;

/* Adds a subscription (a table may be registered once per context; UMT_ERR_STATE after). */
umt_status umt_hooks_register(umt_context *ctx, const umt_hooks *hooks, void *self);
/* Removes it (its destroy is not called: self is the registrant's); a no-op if it is not
 * registered. */
void umt_hooks_unregister(umt_context *ctx, const umt_hooks *hooks);
/* The self that hooks was registered with, or NULL. */
void *umt_hooks_self(const umt_context *ctx, const umt_hooks *hooks);
/* How many registered tables subscribe to gradient_ready. */
int umt_hooks_gradient_subscribers(const umt_context *ctx);
/* Whether any registered table updates parameters (updates_parameter). */
bool umt_hooks_update_parameters(const umt_context *ctx);
/* Whether any registered table takes part in backward or in the gradients (zero_grad, the op
 * backward events, gradient_ready, after_backward, updates_parameter): core/branch.h keeps every
 * kernel on the compute stream then. */
bool umt_hooks_in_backward(const umt_context *ctx);

/* The events, as the core raises them: each calls every subscribed table in registration order
 * and stops at the first failure. */
umt_pool umt_hooks_place(const umt_context *ctx, umt_pool kind);
umt_status umt_hooks_step_begin(umt_context *ctx);
umt_status umt_hooks_op_recorded(umt_context *ctx, int node);
umt_status umt_hooks_parameter_read(umt_context *ctx, umt_tensor *parameter);
bool umt_hooks_zero_grad(umt_context *ctx, umt_tensor *parameter);
umt_status umt_hooks_before_op_backward(umt_context *ctx, const umt_node *node);
umt_status umt_hooks_after_op_backward(umt_context *ctx, int node);
umt_status umt_hooks_gradient_ready(umt_context *ctx, umt_tensor *parameter);
umt_status umt_hooks_after_backward(umt_context *ctx);
void umt_hooks_optimizer(umt_context *ctx, const umt_optimizer *opt, bool alive);
bool umt_hooks_updates_parameter(const umt_context *ctx, const umt_tensor *parameter, const umt_tensor *state0,
                                 const umt_tensor *state1);
umt_status umt_hooks_after_update(umt_context *ctx, const umt_optimizer *opt, int64_t step);
void umt_hooks_report(const umt_context *ctx, FILE *out);
/* The first unreplayable reason of a registered table, or NULL. */
const char *umt_hooks_unreplayable(const umt_context *ctx);
/* Whether a registered table has graph_agree: a step graph of this context replays collectives. */
bool umt_hooks_collective(const umt_context *ctx);
/* *all: this process's answer in, every table's agreement out (each table is asked, whatever the
 * answer so far); unchanged when no table has graph_agree. */
umt_status umt_hooks_graph_agree(umt_context *ctx, bool *all);
umt_status umt_hooks_before_graph_launch(umt_context *ctx);
umt_status umt_hooks_after_graph_launch(umt_context *ctx);
void umt_hooks_collectives_end(umt_context *ctx);
/* Calls every destroy, last registered first, and empties the table. */
void umt_hooks_destroy(umt_context *ctx);

#endif /* UMT_CORE_HOOKS_H */
