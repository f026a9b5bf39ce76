/*
 * tests/test_optim.c — optimizers and learning-rate schedules against hand-worked numbers.
 *
 * Each update test sets a parameter and its gradient, takes one or two steps and compares with
 * values worked out from the update rule (PyTorch's torch.optim formulas), written as literals;
 * where the literal alone would hide the rule, the working is in the comment next to it.
 * Then: option validation, kind parsing, defaults, where the state lives, and clean-up; then
 * the mixed-precision step (kernels/optim_step.h): the fused low-precision copy against the plain
 * update and a convert, clipping against hand-worked numbers, and the loss scaler with injected
 * infs and NaNs.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/optim/optim.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_kernels.h"
#include "umtrain.h"

/* f32 arithmetic against double working: a few ulps of values near 1. */
#define TOLERANCE 1e-6

typedef struct {
    umt_context *ctx;
    umt_tensor *param;
} fixture;

/* A context with one parameter "w" of n elements, set to values, its gradient to grads. */
static fixture make_fixture(int64_t n, const float *values, const float *grads) {
    fixture f = {0};
    umt_context_options options = umt_context_defaults();
    assert_int_equal(umt_context_create(&options, &f.ctx), UMT_OK);
    f.param = umt_parameter_new(f.ctx, "w", 1, &n);
    assert_non_null(f.param);
    assert_int_equal(umt_tensor_copy_from_host(f.param, values, (size_t)n * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(umt_tensor_grad(f.param), grads, (size_t)n * sizeof(float)), UMT_OK);
    return f;
}

static void set_grads(fixture *f, int64_t n, const float *grads) {
    assert_int_equal(umt_tensor_copy_from_host(umt_tensor_grad(f->param), grads, (size_t)n * sizeof(float)), UMT_OK);
}

static void assert_param(const fixture *f, int64_t n, const double *expected) {
    for (int64_t i = 0; i < n; ++i) {
        float got;
        assert_int_equal(umt_tensor_get_f32(f->param, i, &got), UMT_OK);
        assert_float_equal(got, expected[i], TOLERANCE);
    }
}

static umt_optimizer *make_optimizer(umt_context *ctx, umt_optimizer_options options) {
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(ctx, &options, &opt), UMT_OK);
    assert_non_null(opt);
    return opt;
}

static size_t optim_pool_in_use(const umt_context *ctx) {
    umt_pool_stats s;
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_OPTIM, &s), UMT_OK);
    return s.in_use_bytes;
}

/* ----------------------------------------------------------------------------------------- */
/* SGD */

static void test_sgd_momentum_matches_hand_worked_first_two_steps(void **state) {
    (void)state;
    fixture f = make_fixture(2, (float[]){1.0f, -2.0f}, (float[]){0.5f, 0.25f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.1f;
    o.momentum = 0.9f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* step 1: v = g = (0.5, 0.25); p -= 0.1 v */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 2, (double[]){0.95, -2.025});
    /* step 2: v = 0.9 v + g = (0.95, 0.475); p -= 0.1 v */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 2, (double[]){0.855, -2.0725});
    assert_int_equal(umt_optimizer_steps(opt), 2);
    umt_context_destroy(f.ctx);
}

static void test_sgd_without_momentum_applies_weight_decay_and_keeps_no_state(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    size_t before = optim_pool_in_use(f.ctx);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.1f;
    o.weight_decay = 0.01f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(optim_pool_in_use(f.ctx), before);
    /* step 1: g' = 0.5 + 0.01 * 1 = 0.51; p = 1 - 0.051 */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.949});
    /* step 2: g' = 0.5 + 0.01 * 0.949 = 0.50949; p = 0.949 - 0.050949 */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.898051});
    umt_context_destroy(f.ctx);
}

static void test_sgd_weight_decay_enters_the_momentum_buffer(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.1f;
    o.momentum = 0.9f;
    o.weight_decay = 0.1f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* step 1: g' = 0.6, v = 0.6, p = 0.94 */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.94});
    /* step 2: g' = 0.5 + 0.094 = 0.594, v = 0.54 + 0.594 = 1.134, p = 0.94 - 0.1134 */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.8266});
    umt_context_destroy(f.ctx);
}

static void test_cpu_sgd_kernel_without_momentum_accepts_a_null_velocity(void **state) {
    (void)state;
    float p[2] = {1.0f, 2.0f};
    const float g[2] = {0.5f, -1.0f};
    assert_int_equal(umt_cpu_sgd_update(p, g, NULL, 2, 0.1f, 0.0f, 0.0f), UMT_OK);
    assert_float_equal(p[0], 0.95, TOLERANCE);
    assert_float_equal(p[1], 2.1, TOLERANCE);
    /* With momentum the buffer is required: refused, not dereferenced. */
    assert_int_equal(umt_cpu_sgd_update(p, g, NULL, 2, 0.1f, 0.9f, 0.0f), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "velocity"));
}

/* ----------------------------------------------------------------------------------------- */
/* Adam, AdamW */

static void test_adam_first_step_moves_each_weight_by_lr_against_its_gradient(void **state) {
    (void)state;
    fixture f = make_fixture(3, (float[]){1.0f, -1.0f, 0.5f}, (float[]){0.3f, -2.0f, 0.01f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    o.lr = 0.01f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* mhat = g and vhat = g^2 after one step, so p -= lr * g / (|g| + eps) = lr * sign(g),
     * whatever the gradient's size. */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 3, (double[]){0.99, -0.99, 0.49});
    umt_context_destroy(f.ctx);
}

static void test_adam_second_step_uses_bias_corrected_moments(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    o.lr = 0.1f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.9});
    /* step 2 with g = -0.25: m = 0.9*0.05 - 0.025 = 0.02, v = 0.999*0.00025 + 0.001*0.0625 =
     * 0.00031225; mhat = m / 0.19, vhat = v / 0.001999; p = 0.9 - 0.1 mhat / (sqrt(vhat) + 1e-8) */
    set_grads(&f, 1, (float[]){-0.25f});
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    double mhat = 0.02 / 0.19, vhat = 0.00031225 / 0.001999;
    assert_param(&f, 1, (double[]){0.9 - 0.1 * mhat / (sqrt(vhat) + 1e-8)});
    assert_param(&f, 1, (double[]){0.8733662987});
    umt_context_destroy(f.ctx);
}

/* Two steps (g = 0.5 then -0.25, lr 0.1, weight decay 0.1) from p = 1 under Adam or AdamW. */
static void run_two_decayed_steps(umt_optimizer_kind kind, float out[2]) {
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    umt_optimizer_options o = umt_optimizer_defaults(kind);
    o.lr = 0.1f;
    o.weight_decay = 0.1f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_int_equal(umt_tensor_get_f32(f.param, 0, &out[0]), UMT_OK);
    set_grads(&f, 1, (float[]){-0.25f});
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_int_equal(umt_tensor_get_f32(f.param, 0, &out[1]), UMT_OK);
    umt_context_destroy(f.ctx);
}

static void test_adamw_decays_weights_apart_from_the_gradient_unlike_adam(void **state) {
    (void)state;
    float adam[2], adamw[2];
    run_two_decayed_steps(UMT_OPT_ADAM, adam);
    run_two_decayed_steps(UMT_OPT_ADAMW, adamw);
    /* Adam, L2 in the gradient. step 1: g' = 0.5 + 0.1 = 0.6, a sign step: p = 0.9.
     * step 2: g' = -0.25 + 0.09 = -0.16, m = 0.054 - 0.016 = 0.038,
     * v = 0.999*0.00036 + 0.001*0.0256 = 0.00038524; p = 0.9 - 0.1 (m/0.19) / sqrt(v/0.001999) */
    assert_float_equal(adam[0], 0.9, TOLERANCE);
    assert_float_equal(adam[1], 0.9 - 0.1 * (0.038 / 0.19) / (sqrt(0.00038524 / 0.001999) + 1e-8), TOLERANCE);
    assert_float_equal(adam[1], 0.8544413675, TOLERANCE);
    /* AdamW, decoupled. step 1: p = 1 * (1 - 0.01) = 0.99, then the sign step: 0.89.
     * step 2: p = 0.89 * 0.99 = 0.8811, then the plain Adam step of the previous test
     * (m = 0.02, v = 0.00031225) */
    assert_float_equal(adamw[0], 0.89, TOLERANCE);
    assert_float_equal(adamw[1], 0.8811 - 0.1 * (0.02 / 0.19) / (sqrt(0.00031225 / 0.001999) + 1e-8), TOLERANCE);
    assert_float_equal(adamw[1], 0.8544662987, TOLERANCE);
    assert_true(fabsf(adam[0] - adamw[0]) > 1e-3f);
    assert_true(fabsf(adam[1] - adamw[1]) > 1e-5f);
}

/* ----------------------------------------------------------------------------------------- */
/* Adadelta */

static void test_adadelta_first_two_steps_match_the_rule(void **state) {
    (void)state;
    /* The second element's gradient is so small that its square is below eps: there the
     * place where eps enters (inside the square root) decides the step. */
    fixture f = make_fixture(2, (float[]){1.0f, 1.0f}, (float[]){0.5f, 1e-3f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADADELTA); /* lr 1, rho 0.9, eps 1e-6 */
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* step 1: sq = 0.1 g^2; delta = sqrt(0 + 1e-6) / sqrt(sq + 1e-6) * g */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    double delta1 = sqrt(1e-6) / sqrt(0.025 + 1e-6) * 0.5;
    assert_param(&f, 2, (double[]){1.0 - delta1, 1.0 - 1e-3 / sqrt(1e-7 + 1e-6) * 1e-3});
    assert_param(&f, 2, (double[]){0.9968377856, 0.9990465374});
    /* step 2: acc = 0.1 delta1^2, sq = 0.9 sq + 0.1 g^2 (0.0475 for the first element) */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    double delta2 = sqrt(0.1 * delta1 * delta1 + 1e-6) / sqrt(0.0475 + 1e-6) * 0.5;
    assert_param(&f, 1, (double[]){1.0 - delta1 - delta2});
    assert_param(&f, 2, (double[]){0.9935934238, 0.9980890771});
    umt_context_destroy(f.ctx);
}

static void test_adadelta_weight_decay_is_added_to_the_gradient(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    o.lr = 2.0f;
    o.weight_decay = 0.5f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* g' = 0.5 + 0.5 * 1 = 1: p = 1 - 2 * sqrt(1e-6) / sqrt(0.1 + 1e-6) */
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){1.0 - 2.0 * 1e-3 / sqrt(0.1 + 1e-6)});
    assert_param(&f, 1, (double[]){0.9936754763});
    umt_context_destroy(f.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Options, kinds, learning rate */

static void test_create_rejects_bad_options_naming_the_option(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    struct {
        umt_optimizer_kind kind;
        size_t offset;
        float value;
        const char *name;
    } cases[] = {
        {UMT_OPT_SGD, offsetof(umt_optimizer_options, lr), 0.0f, "lr"},
        {UMT_OPT_ADAM, offsetof(umt_optimizer_options, lr), NAN, "lr"},
        {UMT_OPT_ADAM, offsetof(umt_optimizer_options, lr), INFINITY, "lr"},
        {UMT_OPT_SGD, offsetof(umt_optimizer_options, momentum), 1.0f, "momentum"},
        {UMT_OPT_SGD, offsetof(umt_optimizer_options, momentum), -0.1f, "momentum"},
        {UMT_OPT_ADAM, offsetof(umt_optimizer_options, beta1), 1.0f, "beta1"},
        {UMT_OPT_ADAMW, offsetof(umt_optimizer_options, beta2), -0.5f, "beta2"},
        {UMT_OPT_ADAM, offsetof(umt_optimizer_options, eps), 0.0f, "eps"},
        {UMT_OPT_ADADELTA, offsetof(umt_optimizer_options, eps), -1e-6f, "eps"},
        {UMT_OPT_ADADELTA, offsetof(umt_optimizer_options, rho), 1.0f, "rho"},
        {UMT_OPT_ADAMW, offsetof(umt_optimizer_options, weight_decay), -0.01f, "weight_decay"},
    };
    size_t before = optim_pool_in_use(f.ctx);
    static char sentinel;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        umt_optimizer_options o = umt_optimizer_defaults(cases[i].kind);
        memcpy((char *)&o + cases[i].offset, &cases[i].value, sizeof(float));
        umt_optimizer *opt = (umt_optimizer *)&sentinel; /* must come back NULL */
        assert_int_equal(umt_optimizer_create(f.ctx, &o, &opt), UMT_ERR_INVALID_ARGUMENT);
        assert_null(opt);
        assert_non_null(strstr(umt_last_error(), cases[i].name));
    }
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.kind = (umt_optimizer_kind)99;
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(f.ctx, &o, &opt), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "kind"));
    assert_int_equal(optim_pool_in_use(f.ctx), before);
    umt_context_destroy(f.ctx);
}

static void test_create_ignores_options_the_kind_does_not_read(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    /* A hand-built SGD option set: eps, betas and rho left at zero are not SGD's business. */
    umt_optimizer_options o = {.kind = UMT_OPT_SGD, .lr = 0.1f};
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(f.ctx, &o, &opt), UMT_OK);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.95});
    umt_context_destroy(f.ctx);
}

static void test_create_without_parameters_is_a_state_error(void **state) {
    (void)state;
    umt_context *ctx = NULL;
    umt_context_options options = umt_context_defaults();
    assert_int_equal(umt_context_create(&options, &ctx), UMT_OK);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(ctx, &o, &opt), UMT_ERR_STATE);
    assert_null(opt);
    assert_non_null(strstr(umt_last_error(), "no parameters"));
    umt_context_destroy(ctx);
}

static void test_step_with_a_parameter_lacking_its_gradient_names_it_and_moves_nothing(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    int64_t n = 1;
    umt_tensor *second = umt_parameter_new(f.ctx, "second.weight", 1, &n);
    assert_non_null(second);
    assert_int_equal(umt_tensor_fill(second, 3.0f), UMT_OK);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.1f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    /* White-box: no public call removes a parameter's gradient, so take it away by hand. */
    umt_tensor *grad = second->grad;
    second->grad = NULL;
    assert_int_equal(umt_optimizer_step(opt), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "second.weight"));
    assert_param(&f, 1, (double[]){1.0});
    assert_int_equal(umt_optimizer_steps(opt), 0);
    second->grad = grad;
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.95});
    umt_context_destroy(f.ctx);
}

static void test_set_lr_changes_the_next_step_and_a_bad_rate_is_refused_there(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 0.1f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    umt_optimizer_set_lr(opt, 0.2f);
    assert_float_equal(umt_optimizer_lr(opt), 0.2, 1e-7);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 1, (double[]){0.9});
    umt_optimizer_set_lr(opt, -1.0f);
    assert_int_equal(umt_optimizer_step(opt), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "lr"));
    assert_param(&f, 1, (double[]){0.9});
    assert_int_equal(umt_optimizer_steps(opt), 1);
    umt_context_destroy(f.ctx);
}

static void test_kind_parse_accepts_the_four_names_and_refuses_others(void **state) {
    (void)state;
    umt_optimizer_kind kind = UMT_OPT_SGD;
    assert_int_equal(umt_optimizer_kind_parse("adamw", &kind), UMT_OK);
    assert_int_equal(kind, UMT_OPT_ADAMW);
    assert_int_equal(umt_optimizer_kind_parse("adam", &kind), UMT_OK);
    assert_int_equal(kind, UMT_OPT_ADAM);
    assert_int_equal(umt_optimizer_kind_parse("adadelta", &kind), UMT_OK);
    assert_int_equal(kind, UMT_OPT_ADADELTA);
    assert_int_equal(umt_optimizer_kind_parse("sgd", &kind), UMT_OK);
    assert_int_equal(kind, UMT_OPT_SGD);
    assert_int_equal(umt_optimizer_kind_parse("rmsprop", &kind), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "rmsprop"));
    assert_int_equal(kind, UMT_OPT_SGD);
    assert_int_equal(umt_optimizer_kind_parse(NULL, &kind), UMT_ERR_INVALID_ARGUMENT);
}

static void test_defaults_are_pytorchs(void **state) {
    (void)state;
    umt_optimizer_options sgd = umt_optimizer_defaults(UMT_OPT_SGD);
    assert_float_equal(sgd.lr, 0.01, 1e-9);
    assert_float_equal(sgd.momentum, 0.0, 0.0);
    umt_optimizer_options adam = umt_optimizer_defaults(UMT_OPT_ADAM);
    assert_int_equal(adam.kind, UMT_OPT_ADAM);
    assert_float_equal(adam.lr, 1e-3, 1e-9);
    assert_float_equal(adam.beta1, 0.9, 1e-7);
    assert_float_equal(adam.beta2, 0.999, 1e-7);
    assert_float_equal(adam.eps, 1e-8, 1e-12);
    assert_float_equal(adam.weight_decay, 0.0, 0.0);
    umt_optimizer_options adamw = umt_optimizer_defaults(UMT_OPT_ADAMW);
    assert_float_equal(adamw.weight_decay, 1e-2, 1e-9);
    umt_optimizer_options adadelta = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    assert_float_equal(adadelta.lr, 1.0, 0.0);
    assert_float_equal(adadelta.rho, 0.9, 1e-7);
    assert_float_equal(adadelta.eps, 1e-6, 1e-12);
}

/* ----------------------------------------------------------------------------------------- */
/* Memory */

/* Bytes the optim pool gains when an optimizer of this kind covers a 1000-element parameter. */
static size_t state_bytes_for(umt_optimizer_options o, uint64_t *allocations) {
    enum { N = 1000 };
    static float zeros[N];
    fixture f = make_fixture(N, zeros, zeros);
    umt_pool_stats before, after;
    assert_int_equal(umt_pool_stats_get(f.ctx, UMT_POOL_OPTIM, &before), UMT_OK);
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(umt_pool_stats_get(f.ctx, UMT_POOL_OPTIM, &after), UMT_OK);
    umt_optimizer_destroy(opt);
    /* Destroying the optimizer gives its state back to the pool. */
    assert_int_equal(optim_pool_in_use(f.ctx), before.in_use_bytes);
    umt_context_destroy(f.ctx);
    *allocations = after.allocations - before.allocations;
    return after.in_use_bytes - before.in_use_bytes;
}

static void test_optimizer_state_lives_in_the_optim_pool_sized_by_kind(void **state) {
    (void)state;
    const size_t numel_bytes = 1000 * sizeof(float);
    uint64_t allocations;
    assert_true(state_bytes_for(umt_optimizer_defaults(UMT_OPT_ADAM), &allocations) >= 2 * numel_bytes);
    assert_int_equal(allocations, 2);
    assert_true(state_bytes_for(umt_optimizer_defaults(UMT_OPT_ADADELTA), &allocations) >= 2 * numel_bytes);
    assert_int_equal(allocations, 2);
    umt_optimizer_options momentum = umt_optimizer_defaults(UMT_OPT_SGD);
    momentum.momentum = 0.9f;
    size_t velocity = state_bytes_for(momentum, &allocations);
    assert_true(velocity >= numel_bytes && velocity < 2 * numel_bytes);
    assert_int_equal(allocations, 1);
    assert_int_equal(state_bytes_for(umt_optimizer_defaults(UMT_OPT_SGD), &allocations), 0);
    assert_int_equal(allocations, 0);
}

static void test_context_destroy_frees_an_optimizer_left_alive(void **state) {
    (void)state;
    fixture f = make_fixture(2, (float[]){1.0f, 2.0f}, (float[]){0.1f, 0.2f});
    umt_optimizer *opt = make_optimizer(f.ctx, umt_optimizer_defaults(UMT_OPT_ADAMW));
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_true(optim_pool_in_use(f.ctx) > 0);
    /* No umt_optimizer_destroy: the context owns the optimizer (AddressSanitizer checks the rest). */
    umt_context_destroy(f.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Mixed-precision steps: the fused low-precision copy, clipping, loss scaling */

/* A fixed pseudo-random float in [lo, hi) (a 32-bit LCG): inputs that exercise rounding. */
static float draw(uint32_t *state, float lo, float hi) {
    *state = *state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(*state >> 8) / (float)(1u << 24);
}

/* The update of one kind through the CPU kernels, plain (fused == false) or fused with a copy
 * of lowp_dtype, on n fixed inputs; the parameter and state after three steps go to out. */
enum { FUSED_N = 257 };
typedef struct {
    float param[FUSED_N], s0[FUSED_N], s1[FUSED_N];
    uint16_t lowp[FUSED_N];
} update_result;

/* How run_kernel_steps hands the kernels their gradients. */
typedef enum {
    GRADS_F32,         /* as drawn */
    GRADS_BF16_AS_F32, /* rounded to bf16, handed over in f32 */
    GRADS_BF16,        /* rounded to bf16, handed over as bf16 (umt_update_fusion.grad_bf16), grad NULL */
} grads_given;

static void run_kernel_steps_with(umt_optimizer_kind kind, umt_dtype lowp_dtype, bool fused, grads_given grads,
                                  update_result *out) {
    uint32_t seed = 12345u;
    float drawn[FUSED_N];
    uint16_t grad_bf16[FUSED_N];
    for (int i = 0; i < FUSED_N; ++i) {
        out->param[i] = draw(&seed, -3.0f, 3.0f);
        out->s0[i] = 0.0f;
        out->s1[i] = 0.0f;
        out->lowp[i] = 0xffffu;
    }
    umt_update_fusion fusion = {.lowp = fused ? out->lowp : NULL, .lowp_dtype = lowp_dtype,
                                .grad_bf16 = grads == GRADS_BF16 ? grad_bf16 : NULL};
    for (int64_t step = 1; step <= 3; ++step) {
        for (int i = 0; i < FUSED_N; ++i) drawn[i] = draw(&seed, -1.0f, 1.0f);
        if (grads != GRADS_F32) {
            assert_int_equal(umt_cpu_convert(drawn, UMT_F32, grad_bf16, UMT_BF16, FUSED_N), UMT_OK);
            assert_int_equal(umt_cpu_convert(grad_bf16, UMT_BF16, drawn, UMT_F32, FUSED_N), UMT_OK);
        }
        const float *grad = grads == GRADS_BF16 ? NULL : drawn;
        umt_status st = UMT_OK;
        switch (kind) {
        case UMT_OPT_SGD:
            st = umt_cpu_sgd_update_fused(out->param, grad, out->s0, FUSED_N, 0.1f, 0.9f, 1e-2f, fusion);
            break;
        case UMT_OPT_ADAM:
        case UMT_OPT_ADAMW:
            st = umt_cpu_adam_update_fused(out->param, grad, out->s0, out->s1, FUSED_N, 1e-2f, 0.9f, 0.999f, 1e-8f,
                                           1e-2f, kind == UMT_OPT_ADAMW, step, fusion);
            break;
        case UMT_OPT_ADADELTA:
            st = umt_cpu_adadelta_update_fused(out->param, grad, out->s0, out->s1, FUSED_N, 1.0f, 0.9f, 1e-6f, 1e-2f,
                                               fusion);
            break;
        }
        assert_int_equal(st, UMT_OK);
    }
}

static void run_kernel_steps(umt_optimizer_kind kind, umt_dtype lowp_dtype, bool fused, update_result *out) {
    run_kernel_steps_with(kind, lowp_dtype, fused, GRADS_F32, out);
}

static void test_fused_update_with_a_lowp_copy_equals_the_plain_update_then_a_convert(void **state) {
    (void)state;
    const umt_dtype dtypes[] = {UMT_BF16, UMT_F16};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; ++kind)
        for (int d = 0; d < 2; ++d) {
            update_result plain, fused;
            run_kernel_steps((umt_optimizer_kind)kind, dtypes[d], false, &plain);
            run_kernel_steps((umt_optimizer_kind)kind, dtypes[d], true, &fused);
            /* The same master and state, bit for bit (Adam's plain update is the vectorized
             * loop, its fused one the scalar loop); the copy is the master, converted. */
            assert_memory_equal(fused.param, plain.param, sizeof plain.param);
            assert_memory_equal(fused.s0, plain.s0, sizeof plain.s0);
            assert_memory_equal(fused.s1, plain.s1, sizeof plain.s1);
            assert_int_equal(umt_cpu_convert(plain.param, UMT_F32, plain.lowp, dtypes[d], FUSED_N), UMT_OK);
            assert_memory_equal(fused.lowp, plain.lowp, sizeof plain.lowp);
        }
    /* A copy must be a 16-bit float: said, not written. */
    float p = 1.0f, g = 0.5f;
    umt_update_fusion bad = {.lowp = &g, .lowp_dtype = UMT_I32};
    assert_int_equal(umt_cpu_sgd_update_fused(&p, &g, NULL, 1, 0.1f, 0.0f, 0.0f, bad), UMT_ERR_UNSUPPORTED);
    assert_non_null(strstr(umt_last_error(), "i32"));
    assert_float_equal(p, 1.0, 0.0);
}

/* A long Adam update (the offload tier's work items) streams its bf16 copy past the caches
 * (kernels/cpu/optim.c): the copy holds the same bits as the new masters converted, over blocks
 * and a tail, from a destination that starts off the 16-byte grid, with values that round up into
 * the exponent, ties, infinities and NaNs; the elements beside the copy are untouched. */
static void test_long_update_streams_its_bf16_copy_with_the_converted_bits(void **state) {
    (void)state;
    enum { N = (1 << 16) + 4099, GUARD = 3 };
    float *param = malloc(N * sizeof *param), *plain = malloc(N * sizeof *plain), *m = calloc(N, sizeof *m);
    float *v = calloc(N, sizeof *v), *grad = malloc(N * sizeof *grad);
    uint16_t *copy = malloc((N + 2 * GUARD) * sizeof *copy), *want = malloc(N * sizeof *want);
    assert_true(param && plain && m && v && grad && copy && want);
    uint32_t seed = 777u;
    const float special[] = {0x1.fffffep127f, 1.00390625f, 1.01171875f, -0.0f, INFINITY, -INFINITY, NAN, 0x1.ff8p0f};
    for (int i = 0; i < N; ++i) {
        param[i] = i < 8 ? special[i] : draw(&seed, -3.0f, 3.0f);
        grad[i] = i < 8 ? 0.0f : draw(&seed, -1.0f, 1.0f);
    }
    for (int i = 0; i < N + 2 * GUARD; ++i) copy[i] = 0xabcdu;
    memcpy(plain, param, N * sizeof *plain);
    umt_update_fusion fusion = {.lowp = copy + GUARD, .lowp_dtype = UMT_BF16}; /* 6 bytes off the grid */
    umt_status st = umt_cpu_adam_update_fused(param, grad, m, v, N, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1, fusion);
    assert_int_equal(st, UMT_OK);
    float *m2 = calloc(N, sizeof *m2), *v2 = calloc(N, sizeof *v2);
    assert_true(m2 && v2);
    assert_int_equal(umt_cpu_adam_update(plain, grad, m2, v2, N, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1), UMT_OK);
    assert_memory_equal(param, plain, N * sizeof *plain);
    assert_int_equal(umt_cpu_convert(plain, UMT_F32, want, UMT_BF16, N), UMT_OK);
    assert_memory_equal(copy + GUARD, want, N * sizeof *want);
    for (int i = 0; i < GUARD; ++i) {
        assert_int_equal(copy[i], 0xabcdu);
        assert_int_equal(copy[GUARD + N + i], 0xabcdu);
    }
    free(param), free(plain), free(m), free(v), free(m2), free(v2), free(grad), free(copy), free(want);
}

/* The offload tier's CPU threads under bf16 read gradients that came home in bf16
 * (umt_update_fusion.grad_bf16): the same bits as the same rounded gradients handed over in f32,
 * in the plain loop and in the fused one, for every kind; neither gradient given is refused. */
static void test_update_reading_bf16_gradients_equals_the_same_gradients_in_f32(void **state) {
    (void)state;
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; ++kind)
        for (int fused = 0; fused < 2; ++fused) {
            update_result as_f32, as_bf16;
            run_kernel_steps_with((umt_optimizer_kind)kind, UMT_BF16, fused, GRADS_BF16_AS_F32, &as_f32);
            run_kernel_steps_with((umt_optimizer_kind)kind, UMT_BF16, fused, GRADS_BF16, &as_bf16);
            assert_memory_equal(as_bf16.param, as_f32.param, sizeof as_f32.param);
            assert_memory_equal(as_bf16.s0, as_f32.s0, sizeof as_f32.s0);
            assert_memory_equal(as_bf16.s1, as_f32.s1, sizeof as_f32.s1);
            assert_memory_equal(as_bf16.lowp, as_f32.lowp, sizeof as_f32.lowp);
        }
    float p = 1.0f, m = 0.0f, v = 0.0f;
    assert_int_equal(umt_cpu_adam_update_fused(&p, NULL, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1,
                                               (umt_update_fusion){0}),
                     UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "grad NULL"));
    assert_float_equal(p, 1.0, 0.0);
}

static void test_optimizer_step_rewrites_the_parameters_bf16_copy(void **state) {
    (void)state;
    fixture f = make_fixture(3, (float[]){1.0f, -2.0f, 0.3f}, (float[]){0.5f, 0.25f, -0.125f});
    /* White-box: a bf16 context would give the parameter its copy; here it is lent by hand. */
    umt_tensor *lowp = umt_tensor_new_1d(f.ctx, UMT_POOL_WEIGHTS, UMT_BF16, 3);
    assert_non_null(lowp);
    f.param->lowp = lowp;
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAMW);
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    float master[3];
    uint16_t copy[3], expected[3];
    assert_int_equal(umt_tensor_copy_to_host(f.param, master, sizeof master), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(lowp, copy, sizeof copy), UMT_OK);
    for (int i = 0; i < 3; ++i) expected[i] = umt_f32_to_bf16(master[i]);
    assert_memory_equal(copy, expected, sizeof copy);
    f.param->lowp = NULL;
    umt_context_destroy(f.ctx);
}

/* A context with parameters a [2] and b [1] and the given values and gradients. */
static umt_context *two_parameter_context(const float a[2], const float b[1], const float ga[2], const float gb[1],
                                          umt_tensor **pa, umt_tensor **pb) {
    umt_context *ctx = NULL;
    umt_context_options options = umt_context_defaults();
    assert_int_equal(umt_context_create(&options, &ctx), UMT_OK);
    *pa = umt_parameter_new(ctx, "a", 1, (int64_t[]){2});
    *pb = umt_parameter_new(ctx, "b", 1, (int64_t[]){1});
    assert_non_null(*pa);
    assert_non_null(*pb);
    assert_int_equal(umt_tensor_copy_from_host(*pa, a, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(*pb, b, sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host((*pa)->grad, ga, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host((*pb)->grad, gb, sizeof(float)), UMT_OK);
    return ctx;
}

static void test_clipping_scales_every_gradient_by_max_norm_over_the_global_norm(void **state) {
    (void)state;
    umt_tensor *a, *b;
    /* Gradients (3, 0) and (4): global norm 5 across both parameters. */
    umt_context *ctx = two_parameter_context((float[]){1.0f, 1.0f}, (float[]){1.0f}, (float[]){3.0f, 0.0f},
                                             (float[]){4.0f}, &a, &b);
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.lr = 1.0f;
    o.max_grad_norm = 1.0f;
    umt_optimizer *opt = make_optimizer(ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    umt_step_scalars s;
    assert_int_equal(umt_optimizer_read_scalars(opt, &s), UMT_OK);
    assert_float_equal(s.grad_norm, 5.0, 1e-6);
    /* coefficient 1 / (5 + 1e-6): p = 1 - g * coefficient */
    float got[3];
    assert_int_equal(umt_tensor_copy_to_host(a, got, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(b, got + 2, sizeof(float)), UMT_OK);
    assert_float_equal(got[0], 1.0 - 3.0 / 5.000001, 1e-7);
    assert_float_equal(got[1], 1.0, 0.0);
    assert_float_equal(got[2], 1.0 - 4.0 / 5.000001, 1e-7);
    /* Under max_grad_norm the gradients go through untouched: p -= g exactly. */
    umt_optimizer_destroy(opt);
    o.max_grad_norm = 5.5f;
    opt = make_optimizer(ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(a, got, 2 * sizeof(float)), UMT_OK);
    assert_float_equal(got[0], (1.0f - 3.0f / 5.000001f) - 3.0f, 1e-6);
    assert_int_equal(umt_optimizer_skipped_steps(opt), 0);
    assert_float_equal(umt_optimizer_loss_scale(opt), 1.0, 0.0);
    umt_context_destroy(ctx);
}

static umt_optimizer_options scaled_options(umt_optimizer_kind kind, float init, int growth_interval) {
    umt_optimizer_options o = umt_optimizer_defaults(kind);
    o.loss_scaling = true;
    o.loss_scale_init = init;
    o.loss_scale_growth_interval = growth_interval;
    return o;
}

static void test_loss_scaler_skips_a_step_with_an_inf_or_nan_gradient_and_halves_the_scale(void **state) {
    (void)state;
    /* The gradients carry the scale 1024; unscaled they are the momentum test's (0.5, 0.25). */
    fixture f = make_fixture(2, (float[]){1.0f, -2.0f}, (float[]){512.0f, 256.0f});
    umt_optimizer_options o = scaled_options(UMT_OPT_SGD, 1024.0f, 2000);
    o.lr = 0.1f;
    o.momentum = 0.9f;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 2, (double[]){0.95, -2.025});
    assert_float_equal(umt_optimizer_loss_scale(opt), 1024.0, 0.0);
    float before[2], velocity_before[2], after[2], velocity_after[2];
    const char *name;
    int index;
    umt_tensor *velocity = umt_optimizer_state_at(opt, 0, &name, &index);
    assert_int_equal(umt_tensor_copy_to_host(f.param, before, sizeof before), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(velocity, velocity_before, sizeof velocity_before), UMT_OK);
    const float poisons[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; ++k) {
        set_grads(&f, 2, (float[]){1.0f, poisons[k]});
        assert_int_equal(umt_optimizer_step(opt), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(f.param, after, sizeof after), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(velocity, velocity_after, sizeof velocity_after), UMT_OK);
        assert_memory_equal(after, before, sizeof before);
        assert_memory_equal(velocity_after, velocity_before, sizeof velocity_before);
        assert_int_equal(umt_optimizer_skipped_steps(opt), k + 1);
        assert_float_equal(umt_optimizer_loss_scale(opt), 1024.0 / (2 << k), 0.0);
    }
    assert_int_equal(umt_optimizer_steps(opt), 3);
    /* Scale 256 now: gradients (128, 64) are (0.5, 0.25) again, and the step resumes. */
    set_grads(&f, 2, (float[]){128.0f, 64.0f});
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_param(&f, 2, (double[]){0.855, -2.0725});
    umt_context_destroy(f.ctx);
}

/* Two parameters' gradients read back. */
static void read_grads(umt_tensor *a, umt_tensor *b, float out[3]) {
    assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(a), out, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(b), out + 2, sizeof(float)), UMT_OK);
}

/* zero_grads_in_step: every rule, per tensor and multi-tensor, moves the parameters as without
 * it, bit for bit, and leaves the gradients zero; umt_zero_grad then fills nothing it need not,
 * but a gradient written since (from the host) is zeroed again; a skipped step (an inf under
 * loss scaling) zeroes them too and moves nothing. */
static void test_a_step_that_consumes_its_gradients_zeroes_them_and_moves_the_same(void **state) {
    (void)state;
    const float a0[2] = {1.0f, -2.0f}, b0[1] = {0.5f};
    const float grads[3][3] = {{0.5f, 0.25f, -1.0f}, {-0.125f, 2.0f, 0.75f}, {1.5f, -0.5f, 0.25f}};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; ++kind) {
        for (int multi = 0; multi < 2; ++multi) {
            umt_tensor *pa[2], *pb[2];
            umt_context *ctx[2];
            umt_optimizer *opt[2];
            for (int side = 0; side < 2; ++side) {
                ctx[side] = two_parameter_context(a0, b0, grads[0], grads[0] + 2, &pa[side], &pb[side]);
                umt_optimizer_options o = umt_optimizer_defaults((umt_optimizer_kind)kind);
                o.momentum = kind == UMT_OPT_SGD ? 0.9f : 0.0f;
                o.multi_tensor = multi;
                o.zero_grads_in_step = side == 1;
                opt[side] = make_optimizer(ctx[side], o);
            }
            for (int step = 0; step < 3; ++step) {
                for (int side = 0; side < 2; ++side) {
                    assert_int_equal(umt_zero_grad(ctx[side]), UMT_OK);
                    /* What a backward adds: the host's write stands for it. */
                    assert_int_equal(umt_tensor_copy_from_host(umt_tensor_grad(pa[side]), grads[step], 8), UMT_OK);
                    assert_int_equal(umt_tensor_copy_from_host(umt_tensor_grad(pb[side]), grads[step] + 2, 4), UMT_OK);
                    assert_int_equal(umt_optimizer_step(opt[side]), UMT_OK);
                }
                float p[2][3], g[3];
                for (int side = 0; side < 2; ++side) {
                    assert_int_equal(umt_tensor_copy_to_host(pa[side], p[side], 2 * sizeof(float)), UMT_OK);
                    assert_int_equal(umt_tensor_copy_to_host(pb[side], p[side] + 2, sizeof(float)), UMT_OK);
                }
                assert_memory_equal(p[0], p[1], sizeof p[0]);
                read_grads(pa[1], pb[1], g);
                for (int i = 0; i < 3; ++i) assert_true(g[i] == 0.0f && !signbit(g[i]));
                read_grads(pa[0], pb[0], g); /* the plain step keeps them */
                assert_memory_equal(g, grads[step], sizeof g);
                /* What umt_zero_grad reads to skip a fill: set by the consuming step alone. */
                assert_true(pa[1]->grad_zeroed && pb[1]->grad_zeroed);
                assert_false(pa[0]->grad_zeroed || pb[0]->grad_zeroed);
            }
            /* Written from the host after the step: the next umt_zero_grad fills it again. */
            assert_int_equal(umt_tensor_fill(umt_tensor_grad(pa[1]), 7.0f), UMT_OK);
            assert_false(pa[1]->grad_zeroed);
            assert_true(pb[1]->grad_zeroed);
            assert_int_equal(umt_zero_grad(ctx[1]), UMT_OK);
            assert_true(pa[1]->grad_zeroed);
            float g[3];
            read_grads(pa[1], pb[1], g);
            for (int i = 0; i < 3; ++i) assert_true(g[i] == 0.0f);
            for (int side = 0; side < 2; ++side) umt_context_destroy(ctx[side]);
        }
    }
    /* A skipped step consumes its gradients all the same. */
    umt_tensor *a, *b;
    umt_context *ctx = two_parameter_context(a0, b0, (float[]){1.0f, INFINITY}, (float[]){2.0f}, &a, &b);
    umt_optimizer_options o = scaled_options(UMT_OPT_SGD, 1024.0f, 2000);
    o.zero_grads_in_step = true;
    umt_optimizer *opt = make_optimizer(ctx, o);
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_int_equal(umt_optimizer_skipped_steps(opt), 1);
    float p[3], g[3];
    assert_int_equal(umt_tensor_copy_to_host(a, p, 2 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(b, p + 2, sizeof(float)), UMT_OK);
    assert_memory_equal(p, ((float[]){1.0f, -2.0f, 0.5f}), sizeof p);
    read_grads(a, b, g);
    for (int i = 0; i < 3; ++i) assert_true(g[i] == 0.0f);
    /* The kernels refuse zero_grad with bf16 gradients: there is no f32 gradient to consume. */
    uint16_t g16[1] = {0};
    float param[1] = {0}, s0[1] = {0}, s1[1] = {0};
    assert_int_equal(umt_cpu_adadelta_update_fused(param, NULL, s0, s1, 1, 1.0f, 0.9f, 1e-6f, 0.0f,
                                                   (umt_update_fusion){.grad_bf16 = g16, .zero_grad = true}),
                     UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "zero_grad with grad_bf16"));
    umt_context_destroy(ctx);
}

static void test_a_skipped_step_does_not_advance_adams_bias_correction(void **state) {
    (void)state;
    const float unscaled[3] = {0.3f, -2.0f, 0.01f}, values[3] = {1.0f, -1.0f, 0.5f};
    fixture plain = make_fixture(3, values, unscaled);
    fixture scaled = make_fixture(3, values, (float[]){INFINITY, 0.0f, 0.0f});
    umt_optimizer *reference = make_optimizer(plain.ctx, umt_optimizer_defaults(UMT_OPT_ADAM));
    umt_optimizer *opt = make_optimizer(scaled.ctx, scaled_options(UMT_OPT_ADAM, 8.0f, 2000));
    assert_int_equal(umt_optimizer_step(opt), UMT_OK); /* skipped: the scale drops to 4 */
    set_grads(&scaled, 3, (float[]){4 * unscaled[0], 4 * unscaled[1], 4 * unscaled[2]});
    assert_int_equal(umt_optimizer_step(opt), UMT_OK);
    assert_int_equal(umt_optimizer_step(reference), UMT_OK);
    /* Adam's first step on both sides (a power-of-two scale divides out exactly). */
    float want[3], got[3];
    assert_int_equal(umt_tensor_copy_to_host(plain.param, want, sizeof want), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(scaled.param, got, sizeof got), UMT_OK);
    assert_memory_equal(got, want, sizeof want);
    umt_step_scalars s;
    assert_int_equal(umt_optimizer_read_scalars(opt, &s), UMT_OK);
    assert_int_equal(s.applied_steps, 1);
    assert_int_equal(s.skipped_steps, 1);
    assert_int_equal(umt_optimizer_steps(opt), 2);
    umt_context_destroy(plain.ctx);
    umt_context_destroy(scaled.ctx);
}

static void test_loss_scale_doubles_after_growth_interval_clean_steps_in_a_row(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.0f});
    umt_optimizer *opt = make_optimizer(f.ctx, scaled_options(UMT_OPT_SGD, 8.0f, 3));
    /* clean, clean, clean -> 16; inf -> 8 and the count restarts; three clean -> 16 again */
    const float grads[] = {0, 0, 0, 0, INFINITY, 0, 0, 0};
    const double scales[] = {8, 8, 16, 16, 8, 8, 8, 16};
    for (int i = 0; i < 8; ++i) {
        set_grads(&f, 1, &grads[i]);
        assert_int_equal(umt_optimizer_step(opt), UMT_OK);
        assert_float_equal(umt_optimizer_loss_scale(opt), scales[i], 0.0);
    }
    assert_int_equal(umt_optimizer_skipped_steps(opt), 1);
    umt_context_destroy(f.ctx);
}

/* Gradients of mean(w * x) for w = (1,1,1,1), x = (1,2,3,4): x / 4, from umt_backward or from
 * umt_backward_scaled with opt. */
static void gradients_of_mean_product(umt_context *ctx, umt_tensor *w, const umt_optimizer *opt, float out[4]) {
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(ctx), UMT_OK);
    umt_tensor *x = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4);
    assert_non_null(x);
    assert_int_equal(umt_tensor_copy_from_host(x, (float[]){1, 2, 3, 4}, 4 * sizeof(float)), UMT_OK);
    umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, w, x));
    assert_non_null(loss);
    assert_int_equal(opt ? umt_backward_scaled(ctx, loss, opt) : umt_backward(ctx, loss), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(w), out, 4 * sizeof(float)), UMT_OK);
}

/* Training steps with zero_grads_in_step: backward adds to a gradient the last step consumed (so
 * it is no longer known zero), the step consumes it again, and every step's gradient is that
 * step's alone (nothing left over from the one before: mean(w * x) has dw = x / 4). */
static void test_consumed_gradients_start_each_backward_from_zero(void **state) {
    (void)state;
    fixture f = make_fixture(4, (float[]){1, 1, 1, 1}, (float[]){0, 0, 0, 0});
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_SGD);
    o.zero_grads_in_step = true;
    umt_optimizer *opt = make_optimizer(f.ctx, o);
    for (int step = 0; step < 3; ++step) {
        float g[4];
        gradients_of_mean_product(f.ctx, f.param, NULL, g);
        assert_false(f.param->grad_zeroed);
        for (int i = 0; i < 4; ++i) assert_float_equal(g[i], (i + 1) / 4.0, 0.0);
        assert_int_equal(umt_optimizer_step(opt), UMT_OK);
        assert_true(f.param->grad_zeroed);
    }
    umt_context_destroy(f.ctx);
}

static void test_backward_scaled_multiplies_every_gradient_by_the_loss_scale(void **state) {
    (void)state;
    fixture f = make_fixture(4, (float[]){1, 1, 1, 1}, (float[]){0, 0, 0, 0});
    umt_optimizer *scaler = make_optimizer(f.ctx, scaled_options(UMT_OPT_SGD, 1024.0f, 2000));
    umt_optimizer_options clip_only = umt_optimizer_defaults(UMT_OPT_SGD);
    clip_only.max_grad_norm = 1.0f;
    umt_optimizer *clipper = make_optimizer(f.ctx, clip_only);
    float plain[4], scaled[4], unscaled[4];
    gradients_of_mean_product(f.ctx, f.param, NULL, plain);
    gradients_of_mean_product(f.ctx, f.param, scaler, scaled);
    gradients_of_mean_product(f.ctx, f.param, clipper, unscaled);
    for (int i = 0; i < 4; ++i) {
        assert_float_equal(plain[i], (i + 1) / 4.0, 0.0);
        assert_float_equal(scaled[i], 1024.0 * plain[i], 0.0);
    }
    /* Without loss scaling it is umt_backward. */
    assert_memory_equal(unscaled, plain, sizeof plain);
    /* An optimizer of another context is refused. */
    fixture other = make_fixture(1, (float[]){1}, (float[]){0});
    umt_optimizer *foreign = make_optimizer(other.ctx, scaled_options(UMT_OPT_SGD, 2.0f, 1));
    assert_int_equal(umt_step_begin(f.ctx), UMT_OK);
    umt_tensor *loss = umt_mean(f.ctx, f.param);
    assert_int_equal(umt_backward_scaled(f.ctx, loss, foreign), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "another context"));
    umt_context_destroy(other.ctx);
    umt_context_destroy(f.ctx);
}

static void test_step_options_are_checked_naming_the_option(void **state) {
    (void)state;
    fixture f = make_fixture(1, (float[]){1.0f}, (float[]){0.5f});
    struct {
        float max_grad_norm, init;
        int interval;
        const char *name;
    } cases[] = {
        {-1.0f, 65536.0f, 2000, "max_grad_norm"}, {NAN, 65536.0f, 2000, "max_grad_norm"},
        {INFINITY, 65536.0f, 2000, "max_grad_norm"}, {0.0f, 0.0f, 2000, "loss_scale_init"},
        {0.0f, INFINITY, 2000, "loss_scale_init"}, {0.0f, 65536.0f, 0, "loss_scale_growth_interval"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        umt_optimizer_options o = scaled_options(UMT_OPT_SGD, cases[i].init, cases[i].interval);
        o.max_grad_norm = cases[i].max_grad_norm;
        umt_optimizer *opt = NULL;
        assert_int_equal(umt_optimizer_create(f.ctx, &o, &opt), UMT_ERR_INVALID_ARGUMENT);
        assert_null(opt);
        assert_non_null(strstr(umt_last_error(), cases[i].name));
    }
    /* The scaler's fields are not read while it is off. */
    umt_optimizer_options off = umt_optimizer_defaults(UMT_OPT_SGD);
    off.loss_scale_init = 0.0f;
    off.loss_scale_growth_interval = 0;
    umt_optimizer *opt = make_optimizer(f.ctx, off);
    assert_int_equal(umt_optimizer_skipped_steps(opt), 0);
    assert_float_equal(umt_optimizer_loss_scale(opt), 1.0, 0.0);
    umt_context_destroy(f.ctx);
}

static void test_defaults_turn_clipping_and_scaling_off_with_gradscalers_values_ready(void **state) {
    (void)state;
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; ++kind) {
        umt_optimizer_options o = umt_optimizer_defaults((umt_optimizer_kind)kind);
        assert_float_equal(o.max_grad_norm, 0.0, 0.0);
        assert_false(o.loss_scaling);
        assert_float_equal(o.loss_scale_init, 65536.0, 0.0);
        assert_int_equal(o.loss_scale_growth_interval, 2000);
    }
}

/* ----------------------------------------------------------------------------------------- */
/* Schedules */

static void test_lr_step_multiplies_by_gamma_every_step_size_epochs(void **state) {
    (void)state;
    const double expected[4] = {1.0, 0.7, 0.49, 0.343};
    for (int epoch = 0; epoch < 4; ++epoch) assert_float_equal(umt_lr_step(1.0f, 0.7f, 1, epoch), expected[epoch], 1e-6);
    assert_float_equal(umt_lr_step(0.1f, 0.7f, 2, 1), 0.1, 1e-7);
    assert_float_equal(umt_lr_step(0.1f, 0.7f, 2, 2), 0.07, 1e-7);
    assert_float_equal(umt_lr_step(0.1f, 0.7f, 2, 5), 0.049, 1e-7);
    assert_float_equal(umt_lr_step(0.1f, 0.7f, 0, 5), 0.1, 0.0);
}

static void test_lr_cosine_runs_from_base_to_min_through_the_midpoint(void **state) {
    (void)state;
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, 0, 100), 0.1, 1e-7);
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, 50, 100), 0.0505, 1e-7);
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, 100, 100), 0.001, 1e-7);
    /* a quarter of the way: min + (base - min) * (1 + cos(pi/4)) / 2 */
    assert_float_equal(umt_lr_cosine(0.1f, 0.0f, 25, 100), 0.1 * (1.0 + sqrt(0.5)) / 2.0, 1e-7);
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, 150, 100), 0.001, 1e-7);
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, -5, 100), 0.1, 1e-7);
    assert_float_equal(umt_lr_cosine(0.1f, 0.001f, 10, 0), 0.1, 0.0);
}

/* ----------------------------------------------------------------------------------------- */
/* A step graph's loss, kept by the optimizer's decision (core/step/step_graph.c)               */

typedef struct {
    umt_tensor *w;
    umt_optimizer *opt;
    bool other_loss; /* return a loss the backward did not take */
} keep_case;

/* loss = mean(w * w): backward, a step; returns that loss, or mean(w) made before the update. */
static umt_tensor *keep_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    (void)input, (void)input_bytes;
    keep_case *k = user;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx)) return NULL;
    umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, k->w, k->w));
    umt_tensor *other = k->other_loss ? umt_mean(ctx, k->w) : loss;
    if (!loss || !other || umt_backward(ctx, loss) || umt_optimizer_step(k->opt)) return NULL;
    return other;
}

/* Five eager steps (the CPU's graph): each kept loss is the returned one, and the mean is their
 * f32 sum over five, whether the decision kept them (the check on, the backward's loss returned),
 * the decision kept another loss than the one returned (its sum then restored before the keeping
 * after the step), or no decision ran (the check off). */
static void test_a_step_graph_keeps_the_returned_loss_by_the_decision_or_after_it(void **state) {
    (void)state;
    for (int variant = 0; variant < 3; variant++) {
        umt_context *ctx = NULL;
        assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
        keep_case k = {.w = umt_parameter_new(ctx, "w", 1, (int64_t[]){3}), .other_loss = variant == 1};
        assert_non_null(k.w);
        assert_int_equal(umt_tensor_copy_from_host(k.w, (float[]){0.5f, -1.25f, 2.0f}, 3 * sizeof(float)), UMT_OK);
        umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
        oo.lr = 0.1f;
        oo.on_nonfinite = variant == 2 ? UMT_NONFINITE_OFF : UMT_NONFINITE_SKIP;
        assert_int_equal(umt_optimizer_create(ctx, &oo, &k.opt), UMT_OK);
        umt_step_graph *graph = NULL;
        assert_int_equal(umt_step_graph_create(ctx, true, &graph), UMT_OK);
        float sum = 0.0f;
        for (int step = 0; step < 5; step++) {
            float w[3], want, kept;
            assert_int_equal(umt_tensor_copy_to_host(k.w, w, sizeof w), UMT_OK);
            want = k.other_loss ? (w[0] + w[1] + w[2]) / 3.0f : (w[0] * w[0] + w[1] * w[1] + w[2] * w[2]) / 3.0f;
            assert_int_equal(umt_step_graph_run(graph, keep_step, &k, NULL, 0), UMT_OK);
            assert_int_equal(umt_tensor_get_f32(umt_step_graph_loss(graph), 0, &kept), UMT_OK);
            assert_float_equal(kept, want, 1e-6);
            sum += kept;
        }
        double mean;
        int64_t steps;
        assert_int_equal(umt_step_graph_take_mean_loss(graph, &mean, &steps), UMT_OK);
        assert_int_equal(steps, 5);
        if (!(mean == (double)sum / 5.0)) fail_msg("variant %d: mean %.9g, expected %.9g", variant, mean, sum / 5.0);
        umt_step_graph_destroy(graph);
        umt_optimizer_destroy(k.opt);
        umt_context_destroy(ctx);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_momentum_matches_hand_worked_first_two_steps),
        cmocka_unit_test(test_sgd_without_momentum_applies_weight_decay_and_keeps_no_state),
        cmocka_unit_test(test_sgd_weight_decay_enters_the_momentum_buffer),
        cmocka_unit_test(test_cpu_sgd_kernel_without_momentum_accepts_a_null_velocity),
        cmocka_unit_test(test_adam_first_step_moves_each_weight_by_lr_against_its_gradient),
        cmocka_unit_test(test_adam_second_step_uses_bias_corrected_moments),
        cmocka_unit_test(test_adamw_decays_weights_apart_from_the_gradient_unlike_adam),
        cmocka_unit_test(test_adadelta_first_two_steps_match_the_rule),
        cmocka_unit_test(test_adadelta_weight_decay_is_added_to_the_gradient),
        cmocka_unit_test(test_create_rejects_bad_options_naming_the_option),
        cmocka_unit_test(test_create_ignores_options_the_kind_does_not_read),
        cmocka_unit_test(test_create_without_parameters_is_a_state_error),
        cmocka_unit_test(test_step_with_a_parameter_lacking_its_gradient_names_it_and_moves_nothing),
        cmocka_unit_test(test_set_lr_changes_the_next_step_and_a_bad_rate_is_refused_there),
        cmocka_unit_test(test_kind_parse_accepts_the_four_names_and_refuses_others),
        cmocka_unit_test(test_defaults_are_pytorchs),
        cmocka_unit_test(test_optimizer_state_lives_in_the_optim_pool_sized_by_kind),
        cmocka_unit_test(test_context_destroy_frees_an_optimizer_left_alive),
        cmocka_unit_test(test_fused_update_with_a_lowp_copy_equals_the_plain_update_then_a_convert),
        cmocka_unit_test(test_long_update_streams_its_bf16_copy_with_the_converted_bits),
        cmocka_unit_test(test_update_reading_bf16_gradients_equals_the_same_gradients_in_f32),
        cmocka_unit_test(test_optimizer_step_rewrites_the_parameters_bf16_copy),
        cmocka_unit_test(test_clipping_scales_every_gradient_by_max_norm_over_the_global_norm),
        cmocka_unit_test(test_loss_scaler_skips_a_step_with_an_inf_or_nan_gradient_and_halves_the_scale),
        cmocka_unit_test(test_a_skipped_step_does_not_advance_adams_bias_correction),
        cmocka_unit_test(test_a_step_that_consumes_its_gradients_zeroes_them_and_moves_the_same),
        cmocka_unit_test(test_loss_scale_doubles_after_growth_interval_clean_steps_in_a_row),
        cmocka_unit_test(test_consumed_gradients_start_each_backward_from_zero),
        cmocka_unit_test(test_backward_scaled_multiplies_every_gradient_by_the_loss_scale),
        cmocka_unit_test(test_step_options_are_checked_naming_the_option),
        cmocka_unit_test(test_defaults_turn_clipping_and_scaling_off_with_gradscalers_values_ready),
        cmocka_unit_test(test_lr_step_multiplies_by_gamma_every_step_size_epochs),
        cmocka_unit_test(test_lr_cosine_runs_from_base_to_min_through_the_midpoint),
        cmocka_unit_test(test_a_step_graph_keeps_the_returned_loss_by_the_decision_or_after_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
