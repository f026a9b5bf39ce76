/*
 * tests/test_autograd.c — the tape: recording, reuse, no-grad, the gradient-ready hook,
 * accumulation across backward calls, errors and NULL propagation through ops.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/context.h"
#include "core/tensor.h"
#include "umtrain.h"

static umt_context *new_context(void) {
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    return ctx;
}

static umt_tensor *parameter_with(umt_context *ctx, const char *name, int64_t n, const float *values) {
    umt_tensor *p = umt_parameter_new(ctx, name, 1, (int64_t[]){n});
    assert_non_null(p);
    assert_int_equal(umt_tensor_copy_from_host(p, values, (size_t)n * sizeof(float)), UMT_OK);
    return p;
}

static float grad_at(umt_tensor *p, int64_t i) {
    float v;
    assert_int_equal(umt_tensor_get_f32(umt_tensor_grad(p), i, &v), UMT_OK);
    return v;
}

static void test_gradient_of_a_product_is_the_other_factor(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 2, (float[]){2, 3});
    umt_tensor *b = parameter_with(ctx, "b", 2, (float[]){5, 7});
    umt_step_begin(ctx);
    umt_zero_grad(ctx);
    /* L = mean(a*b) = (10 + 21) / 2 ; dL/da = b/2, dL/db = a/2 */
    umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, a, b));
    float value;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    assert_float_equal(value, 15.5f, 1e-6);
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    assert_float_equal(grad_at(a, 0), 2.5f, 1e-6);
    assert_float_equal(grad_at(a, 1), 3.5f, 1e-6);
    assert_float_equal(grad_at(b, 0), 1.0f, 1e-6);
    assert_float_equal(grad_at(b, 1), 1.5f, 1e-6);
    umt_context_destroy(ctx);
}

static void test_gradients_accumulate_until_zero_grad(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 1, (float[]){4});
    umt_zero_grad(ctx);
    for (int step = 0; step < 2; ++step) {
        umt_step_begin(ctx);
        assert_int_equal(umt_backward(ctx, umt_mean(ctx, a)), UMT_OK);
    }
    assert_float_equal(grad_at(a, 0), 2.0f, 1e-6);
    umt_zero_grad(ctx);
    assert_float_equal(grad_at(a, 0), 0.0f, 0);
    umt_context_destroy(ctx);
}

static void test_no_grad_records_nothing_and_backward_refuses(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 1, (float[]){4});
    umt_step_begin(ctx);
    bool previous = umt_set_grad_enabled(ctx, false);
    assert_true(previous);
    umt_tensor *loss = umt_mean(ctx, umt_relu(ctx, a));
    assert_non_null(loss);
    assert_int_equal(ctx->tape.count, 0);
    assert_int_equal(umt_backward(ctx, loss), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "grad disabled"));
    umt_set_grad_enabled(ctx, true);
    umt_context_destroy(ctx);
}

typedef struct {
    int calls;
    umt_tensor *order[4];
} hook_log;

static void record_ready(umt_tensor *parameter, void *user) {
    hook_log *log = user;
    if (log->calls < 4) log->order[log->calls] = parameter;
    log->calls++;
}

static void test_hook_announces_each_parameter_once_after_its_last_use(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *w1 = parameter_with(ctx, "w1", 2, (float[]){1, 2});
    umt_tensor *w2 = parameter_with(ctx, "w2", 2, (float[]){3, 4});
    hook_log log = {0};
    umt_set_grad_ready_hook(ctx, record_ready, &log);
    umt_step_begin(ctx);
    /* w1 is used by the first and the third op, w2 by the second: backward reaches w2's only
     * use before w1's first one, so w2 is final first, and w1 only after its earliest use. */
    umt_tensor *h = umt_mul(ctx, umt_relu(ctx, w1), w2);
    umt_tensor *loss = umt_mean(ctx, umt_add(ctx, h, w1));
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    assert_int_equal(log.calls, 2);
    assert_ptr_equal(log.order[0], w2);
    assert_ptr_equal(log.order[1], w1);
    umt_context_destroy(ctx);
}

static void test_backward_twice_without_forward_is_refused_cleanly(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 1, (float[]){4});
    umt_step_begin(ctx);
    umt_zero_grad(ctx);
    umt_tensor *loss = umt_mean(ctx, a);
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    /* The tape is consumed: a second call is refused and changes no gradient. */
    assert_int_equal(umt_backward(ctx, loss), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "tape is empty"));
    assert_float_equal(grad_at(a, 0), 1.0f, 1e-6);
    umt_context_destroy(ctx);
}

static void test_null_input_propagates_and_keeps_the_first_message(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 2, (float[]){1, 2});
    umt_tensor *b = parameter_with(ctx, "b", 1, (float[]){1});
    umt_step_begin(ctx);
    umt_tensor *bad = umt_mul(ctx, a, umt_reshape(ctx, b, 2, (int64_t[]){2, 2}));
    assert_null(bad);
    assert_non_null(strstr(umt_last_error(), "umt_reshape"));
    assert_null(umt_mean(ctx, umt_relu(ctx, bad)));
    assert_non_null(strstr(umt_last_error(), "umt_reshape"));
    umt_context_destroy(ctx);
}

static void test_shape_errors_name_the_op_and_the_shapes(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_step_begin(ctx);
    umt_tensor *a = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, 3);
    umt_tensor *b = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, 5);
    assert_null(umt_matmul(ctx, a, b));
    assert_non_null(strstr(umt_last_error(), "umt_matmul"));
    assert_non_null(strstr(umt_last_error(), "[2,3]"));
    assert_non_null(strstr(umt_last_error(), "[4,5]"));
    umt_tensor *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2);
    assert_null(umt_softmax_cross_entropy(ctx, a, labels));
    assert_non_null(strstr(umt_last_error(), "i32"));
    umt_context_destroy(ctx);
}

static void test_step_begin_returns_the_activation_arena_to_empty(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_tensor *a = parameter_with(ctx, "a", 2, (float[]){1, 2});
    umt_pool_stats stats;
    for (int step = 0; step < 3; ++step) {
        umt_step_begin(ctx);
        assert_int_equal(umt_backward(ctx, umt_mean(ctx, umt_relu(ctx, a))), UMT_OK);
        assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_ACTIVATIONS, &stats), UMT_OK);
        assert_true(stats.in_use_bytes > 0);
    }
    umt_step_begin(ctx);
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_ACTIVATIONS, &stats), UMT_OK);
    assert_int_equal(stats.in_use_bytes, 0);
    assert_null(ctx->step_tensors);
    umt_context_destroy(ctx);
}

static void test_labels_out_of_range_are_reported_with_row_and_value(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_step_begin(ctx);
    umt_tensor *scores = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 2, 3);
    umt_tensor *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, 2);
    umt_tensor_fill(scores, 0.5f);
    assert_int_equal(umt_tensor_copy_from_host(labels, (int32_t[]){1, 7}, 8), UMT_OK);
    assert_null(umt_softmax_cross_entropy(ctx, scores, labels));
    assert_non_null(strstr(umt_last_error(), "7"));
    umt_context_destroy(ctx);
}

/* One step of a 3-layer MLP on a batch of `rows`; copies the first layer's weight gradient. */
static void mlp_gradient(umt_context *ctx, umt_layer **layers, int64_t rows, float *grad_out) {
    umt_step_begin(ctx);
    umt_zero_grad(ctx);
    umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, rows, 16);
    umt_tensor *y = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, rows);
    float xs[64 * 16];
    int32_t ys[64];
    for (int i = 0; i < rows * 16; ++i) xs[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    for (int i = 0; i < rows; ++i) ys[i] = i % 4;
    umt_tensor_copy_from_host(x, xs, (size_t)rows * 16 * sizeof(float));
    umt_tensor_copy_from_host(y, ys, (size_t)rows * sizeof(int32_t));
    umt_tensor *h = umt_relu(ctx, umt_layer_forward(ctx, layers[0], x));
    h = umt_relu(ctx, umt_layer_forward(ctx, layers[1], h));
    umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, layers[2], h), y);
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(umt_parameter_at(ctx, 0)), grad_out, 32 * 16 * sizeof(float)),
                     UMT_OK);
}

static void test_planned_arena_reuses_gradient_memory_and_keeps_every_gradient(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    umt_layer *layers[3] = {umt_linear_layer_new(ctx, "l1", 16, 32, true), umt_linear_layer_new(ctx, "l2", 32, 32, true),
                            umt_linear_layer_new(ctx, "l3", 32, 4, true)};
    static float recorded[32 * 16], planned[32 * 16], departed[32 * 16], fresh[32 * 16];
    mlp_gradient(ctx, layers, 64, recorded); /* step 1: recorded, bump allocation */
    mlp_gradient(ctx, layers, 64, planned);  /* step 2: follows the plan */
    assert_memory_equal(recorded, planned, sizeof recorded);
    umt_pool_stats stats;
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_ACTIVATIONS, &stats), UMT_OK);
    assert_true(stats.planned_peak_bytes > 0);
    assert_true(stats.planned_peak_bytes < stats.planned_total_bytes);
    assert_true(stats.in_use_bytes <= stats.planned_peak_bytes);
    /* A smaller batch departs from the plan; its gradient must match a fresh context's. */
    mlp_gradient(ctx, layers, 48, departed);
    umt_context *other = new_context();
    umt_layer *same[3] = {umt_linear_layer_new(other, "l1", 16, 32, true), umt_linear_layer_new(other, "l2", 32, 32, true),
                          umt_linear_layer_new(other, "l3", 32, 4, true)};
    mlp_gradient(other, same, 48, fresh);
    assert_memory_equal(departed, fresh, sizeof fresh);
    mlp_gradient(ctx, layers, 64, planned); /* and back on the plan */
    assert_memory_equal(recorded, planned, sizeof recorded);
    umt_context_destroy(other);
    umt_context_destroy(ctx);
}

/* One pass of L = sum(out * r), out = umt_dropout(umt_linear_relu(x, w, b), 0.5) or the one op,
 * from the same RNG state: the output and the gradients of x, w and b into out and grads. */
static void linear_relu_dropout_pass(umt_context *ctx, umt_tensor *const in[3], umt_tensor *r, umt_rng rng, bool one_op,
                                     float *out, float *grads[3], const int64_t n[4]) {
    ctx->rng = rng;
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(ctx), UMT_OK);
    umt_tensor *y = one_op ? umt_linear_relu_dropout(ctx, in[0], in[1], in[2], 0.5f)
                           : umt_dropout(ctx, umt_linear_relu(ctx, in[0], in[1], in[2]), 0.5f);
    assert_non_null(y);
    assert_int_equal(umt_tensor_copy_to_host(y, out, (size_t)n[3] * sizeof *out), UMT_OK);
    assert_int_equal(umt_backward(ctx, umt_mean(ctx, umt_mul(ctx, y, r))), UMT_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(in[i]), grads[i], (size_t)n[i] * sizeof(float)),
                         UMT_OK);
}

/* The one op draws the dropout umt_dropout draws after umt_linear_relu (the same RNG draw, the
 * same kept elements and values) and gives the same gradients, bit for bit; in evaluation it is
 * umt_linear_relu, and a p outside [0, 1) is refused by name. */
static void test_linear_relu_dropout_is_dropout_of_linear_relu_bit_for_bit(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    const int64_t n[4] = {6 * 5, 4 * 5, 4, 6 * 4}; /* x [6,5], w [4,5], b [4], out [6,4] */
    float values[64];
    for (int i = 0; i < 64; i++) values[i] = (float)((i * 37) % 23 - 11) / 8.0f;
    umt_tensor *in[3] = {umt_parameter_new(ctx, "x", 2, (int64_t[]){6, 5}), umt_parameter_new(ctx, "w", 2, (int64_t[]){4, 5}),
                         parameter_with(ctx, "b", 4, values + 40)};
    umt_tensor *r = umt_tensor_new(ctx, UMT_POOL_WEIGHTS, UMT_F32, 2, (int64_t[]){6, 4});
    assert_non_null(in[0]), assert_non_null(in[1]), assert_non_null(r);
    assert_int_equal(umt_tensor_copy_from_host(in[0], values, 30 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(in[1], values + 7, 20 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(r, values + 3, 24 * sizeof(float)), UMT_OK);
    float out[2][24], grad_x[2][30], grad_w[2][20], grad_b[2][4];
    umt_rng rng = ctx->rng;
    for (int one_op = 0; one_op < 2; one_op++)
        linear_relu_dropout_pass(ctx, in, r, rng, one_op, out[one_op],
                                 (float *[3]){grad_x[one_op], grad_w[one_op], grad_b[one_op]}, n);
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    assert_memory_equal(grad_x[0], grad_x[1], sizeof grad_x[0]);
    assert_memory_equal(grad_w[0], grad_w[1], sizeof grad_w[0]);
    assert_memory_equal(grad_b[0], grad_b[1], sizeof grad_b[0]);
    int zeros = 0, kept = 0;
    for (int i = 0; i < 24; i++) zeros += out[1][i] == 0.0f, kept += out[1][i] > 0.0f;
    assert_true(zeros > 0 && kept > 0); /* the ReLU and the dropout both had something to do */

    umt_set_training(ctx, false);
    umt_step_begin(ctx);
    float plain[24], evaluated[24];
    umt_tensor *a = umt_linear_relu(ctx, in[0], in[1], in[2]), *b = umt_linear_relu_dropout(ctx, in[0], in[1], in[2], 0.5f);
    assert_int_equal(umt_tensor_copy_to_host(a, plain, sizeof plain), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(b, evaluated, sizeof evaluated), UMT_OK);
    assert_memory_equal(plain, evaluated, sizeof plain);
    assert_null(umt_linear_relu_dropout(ctx, in[0], in[1], in[2], 1.0f));
    assert_non_null(strstr(umt_last_error(), "umt_linear_relu_dropout: p = 1"));
    umt_context_destroy(ctx);
}

/* On the CPU umt_linear_softmax_cross_entropy is umt_linear then umt_softmax_cross_entropy: the
 * same loss and gradients, bit for bit; a bad label is refused as the loss refuses it. */
static void test_linear_softmax_cross_entropy_is_the_two_ops_on_the_cpu(void **state) {
    (void)state;
    umt_context *ctx = new_context();
    float values[64];
    for (int i = 0; i < 64; i++) values[i] = (float)((i * 29) % 19 - 9) / 6.0f;
    umt_tensor *x = umt_parameter_new(ctx, "x", 2, (int64_t[]){5, 4});
    umt_tensor *w = umt_parameter_new(ctx, "w", 2, (int64_t[]){3, 4});
    umt_tensor *b = parameter_with(ctx, "b", 3, values + 40);
    umt_tensor *labels = umt_tensor_new(ctx, UMT_POOL_WEIGHTS, UMT_I32, 1, (int64_t[]){5});
    assert_non_null(x), assert_non_null(w), assert_non_null(labels);
    assert_int_equal(umt_tensor_copy_from_host(x, values, 20 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(w, values + 20, 12 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(labels, (int32_t[]){2, 0, 1, 1, 2}, 5 * sizeof(int32_t)), UMT_OK);
    float loss[2], grad_x[2][20], grad_w[2][12], grad_b[2][3];
    for (int one_op = 0; one_op < 2; one_op++) {
        assert_int_equal(umt_step_begin(ctx), UMT_OK);
        assert_int_equal(umt_zero_grad(ctx), UMT_OK);
        umt_tensor *l = one_op ? umt_linear_softmax_cross_entropy(ctx, x, w, b, labels)
                               : umt_softmax_cross_entropy(ctx, umt_linear(ctx, x, w, b), labels);
        assert_non_null(l);
        assert_int_equal(umt_backward(ctx, l), UMT_OK);
        assert_int_equal(umt_tensor_get_f32(l, 0, &loss[one_op]), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(x), grad_x[one_op], sizeof grad_x[0]), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(w), grad_w[one_op], sizeof grad_w[0]), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(umt_tensor_grad(b), grad_b[one_op], sizeof grad_b[0]), UMT_OK);
    }
    assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
    assert_memory_equal(grad_x[0], grad_x[1], sizeof grad_x[0]);
    assert_memory_equal(grad_w[0], grad_w[1], sizeof grad_w[0]);
    assert_memory_equal(grad_b[0], grad_b[1], sizeof grad_b[0]);
    assert_true(loss[0] > 0.0f);
    assert_int_equal(umt_tensor_copy_from_host(labels, (int32_t[]){2, 0, 3, 1, 2}, 5 * sizeof(int32_t)), UMT_OK);
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_null(umt_linear_softmax_cross_entropy(ctx, x, w, b, labels));
    assert_non_null(strstr(umt_last_error(), "softmax_xent"));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradient_of_a_product_is_the_other_factor),
        cmocka_unit_test(test_gradients_accumulate_until_zero_grad),
        cmocka_unit_test(test_no_grad_records_nothing_and_backward_refuses),
        cmocka_unit_test(test_hook_announces_each_parameter_once_after_its_last_use),
        cmocka_unit_test(test_backward_twice_without_forward_is_refused_cleanly),
        cmocka_unit_test(test_null_input_propagates_and_keeps_the_first_message),
        cmocka_unit_test(test_shape_errors_name_the_op_and_the_shapes),
        cmocka_unit_test(test_step_begin_returns_the_activation_arena_to_empty),
        cmocka_unit_test(test_labels_out_of_range_are_reported_with_row_and_value),
        cmocka_unit_test(test_linear_softmax_cross_entropy_is_the_two_ops_on_the_cpu),
        cmocka_unit_test(test_planned_arena_reuses_gradient_memory_and_keeps_every_gradient),
        cmocka_unit_test(test_linear_relu_dropout_is_dropout_of_linear_relu_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
