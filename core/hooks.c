/* core/hooks.c — the hook table (see core/hooks.h), and the caller's gradient-ready hook on it. */
#include "core/hooks.h"

#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"

/* The subscription of hooks, or NULL. */
static umt_subscription *find(const umt_context *ctx, const umt_hooks *hooks) {
    for (int i = 0; i < ctx->hooks.count; ++i)
        if (ctx->hooks.list[i].hooks == hooks) return &ctx->hooks.list[i];
    return NULL;
}

umt_status umt_hooks_register(umt_context *ctx, const umt_hooks *hooks, void *self) {
    umt_hook_table *t = &ctx->hooks;
    if (find(ctx, hooks)) return umt_fail(UMT_ERR_STATE, "%s: already registered on this context", hooks->name);
    if (t->count == t->slots) {
        int slots = t->slots ? 2 * t->slots : 4;
        umt_subscription *grown = realloc(t->list, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory to register its hooks", hooks->name);
        t->list = grown;
        t->slots = slots;
    }
    t->list[t->count++] = (umt_subscription){hooks, self};
    return UMT_OK;
}

void umt_hooks_unregister(umt_context *ctx, const umt_hooks *hooks) {
    umt_hook_table *t = &ctx->hooks;
    umt_subscription *s = find(ctx, hooks);
    if (!s) return;
    for (umt_subscription *next = s + 1; next < t->list + t->count; ++next) next[-1] = *next;
    t->count--;
}

void *umt_hooks_self(const umt_context *ctx, const umt_hooks *hooks) {
    const umt_subscription *s = find(ctx, hooks);
    return s ? s->self : NULL;
}

int umt_hooks_gradient_subscribers(const umt_context *ctx) {
    int n = 0;
    for (int i = 0; i < ctx->hooks.count; ++i) n += ctx->hooks.list[i].hooks->gradient_ready != NULL;
    return n;
}

bool umt_hooks_update_parameters(const umt_context *ctx) {
    for (int i = 0; i < ctx->hooks.count; ++i)
        if (ctx->hooks.list[i].hooks->updates_parameter) return true;
    return false;
}

bool umt_hooks_in_backward(const umt_context *ctx) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_hooks *h = ctx->hooks.list[i].hooks;
        if (h->zero_grad || h->before_op_backward || h->after_op_backward || h->gradient_ready || h->after_backward ||
            h->updates_parameter)
            return true;
    }
    return false;
}

bool umt_hooks_collective(const umt_context *ctx) {
    for (int i = 0; i < ctx->hooks.count; ++i)
        if (ctx->hooks.list[i].hooks->graph_agree) return true;
    return false;
}

const char *umt_hooks_unreplayable(const umt_context *ctx) {
    for (int i = 0; i < ctx->hooks.count; ++i)
        if (ctx->hooks.list[i].hooks->unreplayable) return ctx->hooks.list[i].hooks->unreplayable;
    return NULL;
}

/* ----------------------------------------------------------------------------------------- */
/* The events */

/* Calls the event on every table that has it, in registration order; returns the first failure.
 * RAISE0 for the events that take nothing past self (C11 wants an argument for "..."). */
#define RAISE(ctx, event, ...)                                                                                     \
    for (int i_ = 0; i_ < (ctx)->hooks.count; ++i_) {                                                             \
        const umt_subscription *s_ = &(ctx)->hooks.list[i_];                                                      \
        if (s_->hooks->event) UMT_TRY(s_->hooks->event((ctx), s_->self, __VA_ARGS__));                            \
    }
#define RAISE0(ctx, event)                                                                                         \
    for (int i_ = 0; i_ < (ctx)->hooks.count; ++i_) {                                                             \
        const umt_subscription *s_ = &(ctx)->hooks.list[i_];                                                      \
        if (s_->hooks->event) UMT_TRY(s_->hooks->event((ctx), s_->self));                                         \
    }

umt_pool umt_hooks_place(const umt_context *ctx, umt_pool kind) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        umt_pool pool = s->hooks->place ? s->hooks->place(ctx, s->self, kind) : kind;
        if (pool != kind) return pool;
    }
    return kind;
}

umt_status umt_hooks_step_begin(umt_context *ctx) {
    RAISE0(ctx, step_begin);
    return UMT_OK;
}

umt_status umt_hooks_op_recorded(umt_context *ctx, int node) {
    RAISE(ctx, op_recorded, node);
    return UMT_OK;
}

umt_status umt_hooks_parameter_read(umt_context *ctx, umt_tensor *parameter) {
    RAISE(ctx, parameter_read, parameter);
    return UMT_OK;
}

bool umt_hooks_zero_grad(umt_context *ctx, umt_tensor *parameter) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        if (s->hooks->zero_grad && s->hooks->zero_grad(ctx, s->self, parameter)) return true;
    }
    return false;
}

umt_status umt_hooks_before_op_backward(umt_context *ctx, const umt_node *node) {
    RAISE(ctx, before_op_backward, node);
    return UMT_OK;
}

umt_status umt_hooks_after_op_backward(umt_context *ctx, int node) {
    RAISE(ctx, after_op_backward, node);
    return UMT_OK;
}

umt_status umt_hooks_gradient_ready(umt_context *ctx, umt_tensor *parameter) {
    RAISE(ctx, gradient_ready, parameter);
    return UMT_OK;
}

umt_status umt_hooks_after_backward(umt_context *ctx) {
    RAISE0(ctx, after_backward);
    return UMT_OK;
}

void umt_hooks_optimizer(umt_context *ctx, const umt_optimizer *opt, bool alive) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        if (s->hooks->optimizer) s->hooks->optimizer(ctx, s->self, opt, alive);
    }
}

bool umt_hooks_updates_parameter(const umt_context *ctx, const umt_tensor *parameter, const umt_tensor *state0,
                                 const umt_tensor *state1) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        if (s->hooks->updates_parameter && s->hooks->updates_parameter(ctx, s->self, parameter, state0, state1))
            return true;
    }
    return false;
}

umt_status umt_hooks_after_update(umt_context *ctx, const umt_optimizer *opt, int64_t step) {
    RAISE(ctx, after_update, opt, step);
    return UMT_OK;
}

void umt_hooks_report(const umt_context *ctx, FILE *out) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        if (s->hooks->report) s->hooks->report(ctx, s->self, out);
    }
}

umt_status umt_hooks_graph_agree(umt_context *ctx, bool *all) {
    /* Every table, whatever the answer so far: each asks its own peers, who all wait for it. */
    bool answer = *all;
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        bool mine = *all;
        if (s->hooks->graph_agree) UMT_TRY(s->hooks->graph_agree(ctx, s->self, &mine));
        answer = answer && mine;
    }
    *all = answer;
    return UMT_OK;
}

umt_status umt_hooks_before_graph_launch(umt_context *ctx) {
    RAISE0(ctx, before_graph_launch);
    return UMT_OK;
}

umt_status umt_hooks_after_graph_launch(umt_context *ctx) {
    RAISE0(ctx, after_graph_launch);
    return UMT_OK;
}

void umt_hooks_collectives_end(umt_context *ctx) {
    for (int i = 0; i < ctx->hooks.count; ++i) {
        const umt_subscription *s = &ctx->hooks.list[i];
        if (s->hooks->collectives_end) s->hooks->collectives_end(ctx, s->self);
    }
}

void umt_hooks_destroy(umt_context *ctx) {
    umt_hook_table *t = &ctx->hooks;
    /* Each destroy may still raise events (freeing tensors): the table empties as it goes. */
    while (t->count > 0) {
        umt_subscription s = t->list[--t->count];
        if (s.hooks->destroy) s.hooks->destroy(ctx, s.self);
    }
    free(t->list);
    *t = (umt_hook_table){0};
}

/* ----------------------------------------------------------------------------------------- */
/* The caller's gradient-ready hook (umt_set_grad_ready_hook): one more table */

typedef struct {
    umt_grad_ready_fn fn;
    void *user;
} caller_hook;

static umt_status call_caller(umt_context *ctx, void *self, umt_tensor *parameter) {
    const caller_hook *h = self;
    /* The caller's host work would not run in a replay. */
    umt_step_values_unreplayable(ctx, "the caller's grad-ready hook (umt_set_grad_ready_hook) works on the host "
                                      "during backward");
    h->fn(parameter, h->user);
    return UMT_OK;
}

static void free_caller(umt_context *ctx, void *self) {
    (void)ctx;
    free(self);
}

static const umt_hooks caller_hooks = {.name = "grad-ready hook", .gradient_ready = call_caller, .destroy = free_caller};

void umt_set_grad_ready_hook(umt_context *ctx, umt_grad_ready_fn fn, void *user) {
    if (!ctx) {
        umt_fail_null("umt_set_grad_ready_hook", "ctx");
        return;
    }
    caller_hook *old = umt_hooks_self(ctx, &caller_hooks);
    umt_hooks_unregister(ctx, &caller_hooks);
    free(old);
    if (!fn) return;
    caller_hook *h = malloc(sizeof *h);
    if (!h) {
        umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_set_grad_ready_hook: no memory for the hook");
        return;
    }
    *h = (caller_hook){fn, user};
    if (umt_hooks_register(ctx, &caller_hooks, h) != UMT_OK) free(h);
}
