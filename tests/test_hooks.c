/*
 * tests/test_hooks.c — the context's hook table (core/hooks.h): a subsystem's events arrive in
 * the order of a step, each parameter's gradient once; a subsystem may place tensors, zero
 * gradients and update parameters itself; a failing event stops the call that raised it; a step
 * graph agrees with every subsystem whose steps hold collectives; and the offload tier refuses to
 * be enabled where it cannot run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/hooks.h"
#include "core/tensor.h"
#include "umtrain.h"

/* What a test subsystem saw: one letter per event, in order, and what came with them. */
typedef struct {
    char events[256];
    int count;
    const umt_tensor *ready[8];
    int ready_count;
    int64_t update_step;
    const umt_tensor *claimed; /* the parameter this subsystem updates itself (NULL: none) */
    bool zero_claimed;         /* claims every parameter's zero_grad */
    umt_status fail_step_begin;
    bool disagrees;            /* answers a step graph's graph_agree with no */
} seen;

static void note(seen *s, char event) {
    if (s->count < (int)sizeof s->events - 1) s->events[s->count++] = event;
}

static umt_status on_step_begin(umt_context *ctx, void *self) {
    (void)ctx;
    seen *s = self;
    note(s, 'S');
    return s->fail_step_begin;
}

static umt_status on_op_recorded(umt_context *ctx, void *self, int node) {
    (void)ctx, (void)node;
    note(self, 'r');
    return UMT_OK;
}

static umt_status on_parameter_read(umt_context *ctx, void *self, umt_tensor *p) {
    (void)ctx, (void)p;
    note(self, 'p');
    return UMT_OK;
}

static bool on_zero_grad(umt_context *ctx, void *self, umt_tensor *p) {
    (void)ctx, (void)p;
    seen *s = self;
    note(s, 'z');
    return s->zero_claimed;
}

static umt_status on_before_op_backward(umt_context *ctx, void *self, const umt_node *node) {
    (void)ctx, (void)node;
    note(self, 'b');
    return UMT_OK;
}

static umt_status on_after_op_backward(umt_context *ctx, void *self, int node) {
    (void)ctx, (void)node;
    note(self, 'a');
    return UMT_OK;
}

static umt_status on_gradient_ready(umt_context *ctx, void *self, umt_tensor *p) {
    (void)ctx;
    seen *s = self;
    note(s, 'g');
    if (s->ready_count < 8) s->ready[s->ready_count++] = p;
    return UMT_OK;
}

static umt_status on_after_backward(umt_context *ctx, void *self) {
    (void)ctx;
    note(self, 'B');
    return UMT_OK;
}

static void on_optimizer(umt_context *ctx, void *self, const umt_optimizer *opt, bool alive) {
    (void)ctx, (void)opt;
    note(self, alive ? 'O' : 'o');
}

static bool on_updates_parameter(const umt_context *ctx, void *self, const umt_tensor *p, const umt_tensor *s0,
                                 const umt_tensor *s1) {
    (void)ctx, (void)s0, (void)s1;
    seen *s = self;
    note(s, 'u');
    return p == s->claimed;
}

static umt_status on_after_update(umt_context *ctx, void *self, const umt_optimizer *opt, int64_t step) {
    (void)ctx, (void)opt;
    seen *s = self;
    note(s, 'U');
    s->update_step = step;
    return UMT_OK;
}

static void on_report(const umt_context *ctx, void *self, FILE *out) {
    (void)ctx, (void)out;
    note(self, 'R');
}

static void on_destroy(umt_context *ctx, void *self) {
    (void)ctx;
    note(self, 'D');
}

static umt_status on_graph_agree(umt_context *ctx, void *self, bool *all) {
    (void)ctx;
    seen *s = self;
    note(s, 'A');
    if (s->disagrees) *all = false;
    return UMT_OK;
}

static umt_status on_before_graph_launch(umt_context *ctx, void *self) {
    (void)ctx;
    note(self, 'L');
    return UMT_OK;
}

static umt_status on_after_graph_launch(umt_context *ctx, void *self) {
    (void)ctx;
    note(self, 'l');
    return UMT_OK;
}

static void on_collectives_end(umt_context *ctx, void *self) {
    (void)ctx;
    note(self, 'E');
}

static const umt_hooks every_event = {
    .name = "test",
    .step_begin = on_step_begin,
    .op_recorded = on_op_recorded,
    .parameter_read = on_parameter_read,
    .zero_grad = on_zero_grad,
    .before_op_backward = on_before_op_backward,
    .after_op_backward = on_after_op_backward,
    .gradient_ready = on_gradient_ready,
    .after_backward = on_after_backward,
    .optimizer = on_optimizer,
    .updates_parameter = on_updates_parameter,
    .after_update = on_after_update,
    .report = on_report,
    .destroy = on_destroy,
    .graph_agree = on_graph_agree,
    .before_graph_launch = on_before_graph_launch,
    .after_graph_launch = on_after_graph_launch,
    .collectives_end = on_collectives_end,
};

/* A second subsystem whose steps hold collectives. */
static const umt_hooks agreeing = {.name = "agreeing", .graph_agree = on_graph_agree};

static umt_context *new_context(void) {
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    return ctx;
}

/* y = linear(x) with weight w [1,2] and bias b [1]; loss = mean(relu(y)) over one sample. */
typedef struct {
    umt_context *ctx;
    umt_layer *fc;
    umt_optimizer *opt;
    umt_tensor *w, *b;
} tiny;

static tiny make_tiny(void) {
    tiny t = {.ctx = new_context()};
    t.fc = umt_linear_layer_new(t.ctx, "fc", 2, 1, true);
    assert_non_null(t.fc);
    t.w = umt_parameter_at(t.ctx, 0);
    t.b = umt_parameter_at(t.ctx, 1);
    assert_int_equal(umt_tensor_copy_from_host(t.w, (float[]){0.5f, -0.25f}, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(t.b, (float[]){1.0f}, sizeof(float)), UMT_OK);
    return t;
}

static umt_status tiny_step(tiny *t) {
    UMT_TRY(umt_step_begin(t->ctx));
    UMT_TRY(umt_zero_grad(t->ctx));
    umt_tensor *x = umt_tensor_new_2d(t->ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 1, 2);
    assert_int_equal(umt_tensor_copy_from_host(x, (float[]){2.0f, 4.0f}, 2 * sizeof(float)), UMT_OK);
    umt_tensor *loss = umt_mean(t->ctx, umt_relu(t->ctx, umt_layer_forward(t->ctx, t->fc, x)));
    if (!loss) return umt_last_status();
    UMT_TRY(umt_backward(t->ctx, loss));
    return umt_optimizer_step(t->opt);
}

static void test_a_subsystem_sees_a_step_in_order_and_each_gradient_once(void **state) {
    (void)state;
    tiny t = make_tiny();
    seen s = {0};
    assert_int_equal(umt_hooks_register(t.ctx, &every_event, &s), UMT_OK);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    assert_int_equal(umt_optimizer_create(t.ctx, &o, &t.opt), UMT_OK);
    assert_int_equal(tiny_step(&t), UMT_OK);
    /* The optimizer made; the step begins; zero_grad asks about w and b; forward reads w, then
     * linear, relu and mean are recorded; backward runs mean, relu and linear, each between
     * before (b) and after (a), w's and b's gradients final after linear's (in the order the op
     * lists its inputs), then the end; the optimizer asks about w and b, then after_update. */
    assert_string_equal(s.events, "O" "S" "zz" "prrr" "ba" "ba" "bgga" "B" "uu" "U");
    assert_int_equal(s.ready_count, 2);
    assert_ptr_equal(s.ready[0], t.w);
    assert_ptr_equal(s.ready[1], t.b);
    assert_int_equal(s.update_step, 1);
    umt_memory_report(t.ctx);
    umt_context_destroy(t.ctx);
    /* The report, then at destroy the subsystem's destroy, before the optimizer (owned by the
     * context) goes: its departure is no longer announced. */
    assert_string_equal(s.events + strlen("OSzzprrrbababggaBuuU"), "RD");
}

static void test_a_parameter_a_subsystem_updates_is_left_to_it(void **state) {
    (void)state;
    tiny t = make_tiny();
    seen s = {0};
    assert_int_equal(umt_hooks_register(t.ctx, &every_event, &s), UMT_OK);
    s.claimed = t.w;
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.5f;
    assert_int_equal(umt_optimizer_create(t.ctx, &o, &t.opt), UMT_OK);
    assert_int_equal(tiny_step(&t), UMT_OK);
    /* w is the subsystem's (it did nothing): unchanged; b is the optimizer's: 1 - 0.5 * 1. */
    float w0, b0;
    assert_int_equal(umt_tensor_get_f32(t.w, 0, &w0), UMT_OK);
    assert_int_equal(umt_tensor_get_f32(t.b, 0, &b0), UMT_OK);
    assert_float_equal(w0, 0.5f, 0.0f);
    assert_float_equal(b0, 0.5f, 1e-7);
    umt_context_destroy(t.ctx);
}

static void test_a_gradient_a_subsystem_zeroes_is_left_to_it(void **state) {
    (void)state;
    tiny t = make_tiny();
    seen s = {.zero_claimed = true};
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    assert_int_equal(umt_optimizer_create(t.ctx, &o, &t.opt), UMT_OK);
    assert_int_equal(tiny_step(&t), UMT_OK); /* b's gradient is 1 now */
    assert_int_equal(umt_hooks_register(t.ctx, &every_event, &s), UMT_OK);
    assert_int_equal(umt_zero_grad(t.ctx), UMT_OK);
    float g;
    assert_int_equal(umt_tensor_get_f32(umt_tensor_grad(t.b), 0, &g), UMT_OK);
    assert_float_equal(g, 1.0f, 0.0f);
    umt_context_destroy(t.ctx);
}

static umt_pool host_everything(const umt_context *ctx, void *self, umt_pool kind) {
    (void)ctx, (void)self;
    return kind == UMT_POOL_OPTIM ? UMT_POOL_OFFLOAD : kind;
}

static const umt_hooks placing = {.name = "placing", .place = host_everything};

static void test_a_subsystem_places_the_tensors_of_its_kinds(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    assert_int_equal(umt_hooks_register(ctx, &placing, NULL), UMT_OK);
    /* Once only, whatever its self (NULL here). */
    assert_int_equal(umt_hooks_register(ctx, &placing, NULL), UMT_ERR_STATE);
    umt_tensor *p = umt_parameter_new(ctx, "p", 1, (int64_t[]){4});
    assert_non_null(p);
    umt_optimizer *opt;
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    assert_int_equal(umt_optimizer_create(ctx, &o, &opt), UMT_OK);
    /* The weights stay where their kind goes; Adam's two states go where the hook says. */
    assert_int_equal(umt_tensor_pool(p), UMT_POOL_WEIGHTS);
    int moved = 0;
    for (umt_tensor *t = ctx->run_tensors; t; t = t->next)
        if (t->kind_pool == UMT_POOL_OPTIM) moved += t->pool == UMT_POOL_OFFLOAD && t->owner == p;
    assert_int_equal(moved, 2);
    umt_context_destroy(ctx);
}

static void test_a_failing_event_stops_the_call_that_raised_it(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    seen s = {.fail_step_begin = UMT_ERR_DEVICE};
    assert_int_equal(umt_hooks_register(ctx, &every_event, &s), UMT_OK);
    assert_int_equal(umt_step_begin(ctx), UMT_ERR_DEVICE);
    /* Registered once only, and gone once unregistered. */
    assert_int_equal(umt_hooks_register(ctx, &every_event, &s), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "test"));
    umt_hooks_unregister(ctx, &every_event);
    assert_null(umt_hooks_self(ctx, &every_event));
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    umt_context_destroy(ctx);
}

/* Subsystems whose steps hold collectives (data parallelism) make a step graph agree with the
 * other processes: the answer is yes only when every table says yes, and every table is asked even
 * after a no (each asks its own peers, who are all waiting for it). The replay's two launch events
 * reach them in order, and so does the end of the collectives. */
static void test_a_step_graph_agrees_with_every_collective_subsystem(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    bool all = true;
    assert_false(umt_hooks_collective(ctx));
    assert_int_equal(umt_hooks_graph_agree(ctx, &all), UMT_OK); /* nobody to ask: the answer stands */
    assert_true(all);
    seen yes = {0}, no = {.disagrees = true};
    assert_int_equal(umt_hooks_register(ctx, &every_event, &yes), UMT_OK);
    assert_int_equal(umt_hooks_register(ctx, &agreeing, &no), UMT_OK);
    assert_true(umt_hooks_collective(ctx));
    assert_int_equal(umt_hooks_graph_agree(ctx, &all), UMT_OK);
    assert_false(all);
    all = false; /* this process's own no: the tables are still asked */
    assert_int_equal(umt_hooks_graph_agree(ctx, &all), UMT_OK);
    assert_false(all);
    umt_hooks_unregister(ctx, &agreeing);
    all = true;
    assert_int_equal(umt_hooks_graph_agree(ctx, &all), UMT_OK);
    assert_true(all);
    assert_int_equal(umt_hooks_before_graph_launch(ctx), UMT_OK);
    assert_int_equal(umt_hooks_after_graph_launch(ctx), UMT_OK);
    umt_hooks_collectives_end(ctx);
    assert_string_equal(yes.events, "AAALlE");
    assert_string_equal(no.events, "AA");
    umt_hooks_unregister(ctx, &every_event);
    umt_context_destroy(ctx);
}

static void ignore_ready(umt_tensor *parameter, void *user) {
    (void)parameter;
    ++*(int *)user;
}

static void test_the_callers_gradient_hook_is_one_table_and_can_be_replaced(void **state) {
    (void)state;
    tiny t = make_tiny();
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    assert_int_equal(umt_optimizer_create(t.ctx, &o, &t.opt), UMT_OK);
    int first = 0, second = 0;
    umt_set_grad_ready_hook(t.ctx, ignore_ready, &first);
    umt_set_grad_ready_hook(t.ctx, ignore_ready, &second);
    assert_int_equal(umt_hooks_gradient_subscribers(t.ctx), 1);
    assert_int_equal(tiny_step(&t), UMT_OK);
    assert_int_equal(first, 0);
    assert_int_equal(second, 2);
    umt_set_grad_ready_hook(t.ctx, NULL, NULL);
    assert_int_equal(umt_hooks_gradient_subscribers(t.ctx), 0);
    umt_context_destroy(t.ctx);
}

static void test_offloading_is_refused_where_it_cannot_run(void **state) {
    (void)state;
    umt_context *ctx = new_context(); /* a CPU context (no GPU here, or a CPU-only build) */
    umt_offload_options o = umt_offload_defaults();
    assert_int_equal(umt_offload_enable(ctx, &o), UMT_ERR_UNSUPPORTED);
    assert_non_null(strstr(umt_last_error(), "umt_offload_enable"));
    o.host_updates = -7;
    assert_int_equal(umt_offload_enable(ctx, &o), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "host_updates -7"));
    assert_int_equal(umt_offload_enable(NULL, NULL), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "ctx is NULL"));
    umt_offload_stats stats;
    assert_int_equal(umt_offload_stats_get(ctx, &stats), UMT_OK);
    assert_int_equal(stats.offloaded_tensors, 0);
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_subsystem_sees_a_step_in_order_and_each_gradient_once),
        cmocka_unit_test(test_a_parameter_a_subsystem_updates_is_left_to_it),
        cmocka_unit_test(test_a_gradient_a_subsystem_zeroes_is_left_to_it),
        cmocka_unit_test(test_a_subsystem_places_the_tensors_of_its_kinds),
        cmocka_unit_test(test_a_failing_event_stops_the_call_that_raised_it),
        cmocka_unit_test(test_the_callers_gradient_hook_is_one_table_and_can_be_replaced),
        cmocka_unit_test(test_a_step_graph_agrees_with_every_collective_subsystem),
        cmocka_unit_test(test_offloading_is_refused_where_it_cannot_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
