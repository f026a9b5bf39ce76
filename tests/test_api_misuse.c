/*
 * tests/test_api_misuse.c — the API misused as issue 23 found it: objects of two contexts mixed,
 * and messages that named the wrong thing. Each case is refused (or answered) with a message that
 * names the culprit. tests/test_api_sweep.c checks every function the same way, in bulk; these
 * are the cases the issue lists, one test each, so that each reads as its own story.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "umtrain.h"

static umt_context *cpu_context(void) {
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    return ctx;
}

static umt_tensor *filled(umt_context *ctx, int64_t rows, int64_t cols) {
    umt_tensor *t = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, rows, cols);
    assert_non_null(t);
    assert_int_equal(umt_tensor_fill(t, 0.5f), UMT_OK);
    return t;
}

/* The message of the last failure, and that it is the expected one. */
static void expect_message(const char *expected) {
    if (strcmp(umt_last_error(), expected) != 0)
        fail_msg("message \"%s\", expected \"%s\"", umt_last_error(), expected);
    assert_int_equal(umt_last_status(), UMT_ERR_INVALID_ARGUMENT);
}

/* ----------------------------------------------------------------------------------------- */
/* Tensors, layers and optimizers carry their context */

static void test_add_refuses_a_tensor_of_another_context(void **state) {
    (void)state;
    umt_context *a = cpu_context(), *b = cpu_context();
    umt_tensor *ta = filled(a, 2, 3), *tb = filled(b, 2, 3);
    assert_null(umt_add(a, ta, tb));
    expect_message("umt_add: b belongs to another context than ctx");
    assert_null(umt_add(a, tb, ta));
    expect_message("umt_add: a belongs to another context than ctx");
    assert_non_null(umt_add(a, ta, ta)); /* its own tensors still add */
    umt_context_destroy(a);
    umt_context_destroy(b);
}

/* Before: the layer ran on B's tape and got gradients there, which no optimizer of A ever saw. */
static void test_layer_forward_refuses_a_layer_of_another_context(void **state) {
    (void)state;
    umt_context *a = cpu_context(), *b = cpu_context();
    umt_layer *layer_a = umt_linear_layer_new(a, "fc", 3, 2, true);
    assert_non_null(layer_a);
    umt_tensor *xb = filled(b, 2, 3), *xa = filled(a, 2, 3);
    assert_null(umt_layer_forward(b, layer_a, xb));
    expect_message("umt_layer_forward: layer belongs to another context than ctx");
    assert_null(umt_layer_forward_relu(b, layer_a, xb));
    expect_message("umt_layer_forward_relu: layer belongs to another context than ctx");
    assert_null(umt_layer_forward(a, layer_a, xb));
    expect_message("umt_layer_forward: x belongs to another context than ctx");
    assert_non_null(umt_layer_forward(a, layer_a, xa));
    umt_context_destroy(a);
    umt_context_destroy(b);
}

static void test_checkpoints_refuse_an_optimizer_of_another_context(void **state) {
    (void)state;
    umt_context *a = cpu_context(), *b = cpu_context();
    assert_non_null(umt_linear_layer_new(a, "fc", 3, 2, true));
    assert_non_null(umt_linear_layer_new(b, "fc", 3, 2, true));
    umt_optimizer_options sgd = umt_optimizer_defaults(UMT_OPT_SGD);
    umt_optimizer *opt_b = NULL;
    assert_int_equal(umt_optimizer_create(b, &sgd, &opt_b), UMT_OK);
    /* Refused before the path is touched: it need not exist. */
    const char *path = "/nonexistent-umt-dir/model.ckpt";
    assert_int_equal(umt_checkpoint_save(a, opt_b, NULL, path), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_checkpoint_save: /nonexistent-umt-dir/model.ckpt: opt belongs to another context than ctx");
    assert_int_equal(umt_checkpoint_load(a, opt_b, NULL, path), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_checkpoint_load: /nonexistent-umt-dir/model.ckpt: opt belongs to another context than ctx");
    umt_context_destroy(a);
    umt_context_destroy(b);
}

static void test_backward_refuses_a_loss_of_another_context(void **state) {
    (void)state;
    umt_context *a = cpu_context(), *b = cpu_context();
    umt_tensor *w = umt_parameter_new(b, "w", 1, (int64_t[]){2});
    assert_non_null(w);
    assert_int_equal(umt_tensor_fill(w, 1.0f), UMT_OK);
    umt_tensor *loss_b = umt_mean(b, w);
    assert_non_null(loss_b);
    assert_int_equal(umt_backward(a, loss_b), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_backward: loss belongs to another context than ctx");
    assert_int_equal(umt_backward(b, loss_b), UMT_OK);
    umt_context_destroy(a);
    umt_context_destroy(b);
}

/* ----------------------------------------------------------------------------------------- */
/* Messages that named the wrong thing */

/* Before: "umt_tensor_new: rank 2 (expected 1..4)", about a rank that was fine. */
static void test_tensor_new_with_a_null_shape_names_shape(void **state) {
    (void)state;
    umt_context *ctx = cpu_context();
    assert_null(umt_tensor_new(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, NULL));
    expect_message("umt_tensor_new: shape is NULL");
    assert_null(umt_parameter_new(ctx, "w", 2, NULL));
    expect_message("umt_parameter_new: shape is NULL");
    umt_context_destroy(ctx);
}

/* Before: "umt_linear_layer_new: fc: in 2, out 2 (expected > 0)", about sizes that were fine. */
static void test_layer_constructors_with_a_null_context_name_ctx(void **state) {
    (void)state;
    assert_null(umt_linear_layer_new(NULL, "fc", 2, 2, true));
    expect_message("umt_linear_layer_new: ctx is NULL");
    assert_null(umt_conv2d_layer_new(NULL, "conv", 1, 2, 3, 1, 0, true));
    expect_message("umt_conv2d_layer_new: ctx is NULL");
    assert_null(umt_batchnorm_layer_new(NULL, "bn", 2));
    expect_message("umt_batchnorm_layer_new: ctx is NULL");
}

/* Before: "umt_pool_stats_get: pool 0 (expected 0..9)", about a pool that was fine. */
static void test_pool_stats_get_with_a_null_context_names_ctx(void **state) {
    (void)state;
    umt_pool_stats stats;
    assert_int_equal(umt_pool_stats_get(NULL, UMT_POOL_WEIGHTS, &stats), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_pool_stats_get: ctx is NULL");
    umt_context *ctx = cpu_context();
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_WEIGHTS, NULL), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_pool_stats_get: out is NULL");
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_COUNT, &stats), UMT_ERR_INVALID_ARGUMENT);
    expect_message("umt_pool_stats_get: pool 10 (expected 0..9)");
    umt_context_destroy(ctx);
}

/* Before: NULL with no message at all (the previous failure's stood). */
static void test_parameter_at_past_the_end_names_the_index_and_the_count(void **state) {
    (void)state;
    umt_context *ctx = cpu_context();
    assert_non_null(umt_batchnorm_layer_new(ctx, "bn", 2)); /* 2 parameters, 2 buffers */
    assert_non_null(umt_parameter_at(ctx, 1));
    assert_null(umt_parameter_at(ctx, 99));
    expect_message("umt_parameter_at: index 99 of 2 parameters (expected 0..1)");
    assert_null(umt_parameter_at(ctx, -1));
    expect_message("umt_parameter_at: index -1 of 2 parameters (expected 0..1)");
    assert_null(umt_buffer_at(ctx, 2));
    expect_message("umt_buffer_at: index 2 of 2 buffers (expected 0..1)");
    umt_context_destroy(ctx);
}

/* Before: NULL, and the previous failure's message repeated. The running statistics are state
 * the op updates, not inputs an earlier op could have failed to make. */
static void test_batch_norm_with_null_running_statistics_names_them(void **state) {
    (void)state;
    umt_context *ctx = cpu_context();
    assert_non_null(umt_batchnorm_layer_new(ctx, "bn", 3));
    umt_tensor *gamma = umt_parameter_at(ctx, 0), *beta = umt_parameter_at(ctx, 1);
    umt_tensor *mean = umt_buffer_at(ctx, 0), *var = umt_buffer_at(ctx, 1);
    umt_tensor *x = filled(ctx, 2, 3);
    assert_null(umt_batch_norm(ctx, x, gamma, beta, NULL, var, 0.1f, 1e-5f));
    expect_message("umt_batch_norm: running_mean is NULL");
    assert_null(umt_batch_norm(ctx, x, gamma, beta, mean, NULL, 0.1f, 1e-5f));
    expect_message("umt_batch_norm: running_var is NULL");
    assert_non_null(umt_batch_norm(ctx, x, gamma, beta, mean, var, 0.1f, 1e-5f));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_refuses_a_tensor_of_another_context),
        cmocka_unit_test(test_layer_forward_refuses_a_layer_of_another_context),
        cmocka_unit_test(test_checkpoints_refuse_an_optimizer_of_another_context),
        cmocka_unit_test(test_backward_refuses_a_loss_of_another_context),
        cmocka_unit_test(test_tensor_new_with_a_null_shape_names_shape),
        cmocka_unit_test(test_layer_constructors_with_a_null_context_name_ctx),
        cmocka_unit_test(test_pool_stats_get_with_a_null_context_names_ctx),
        cmocka_unit_test(test_parameter_at_past_the_end_names_the_index_and_the_count),
        cmocka_unit_test(test_batch_norm_with_null_running_statistics_names_them),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
