/*
 * tests/test_nonfinite.c — the optimizer's non-finite check (umt_optimizer_options.on_nonfinite,
 * kernels/optim_step.h) on the CPU: a step whose loss or a gradient is NaN or infinite applies no
 * update; under stop neither does any later step, under skip the next finite ones do; the
 * doorbell says so at once on the CPU and the report names the step, the loss and the first
 * parameter whose gradient was not finite; a split step checks the micro-batches' summed loss;
 * under loss scaling a gradient's overflow stays the scaler's. With the check on, the updates of
 * finite steps are bit for bit those without it, for every optimizer, one launch or one per
 * parameter. Off, a NaN reaches the parameters as before.
 *
 * The model: a linear layer 3 -> 2 ("fc.weight", "fc.bias") under softmax cross-entropy on four
 * samples that change with the step. A NaN is put where a run's would come from: into the loss's
 * value after backward (a NaN loss whose gradients happen to be finite) or into one gradient.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "core/optim/optim.h"
#include "umtrain.h"

typedef enum { CLEAN, NAN_LOSS, INF_LOSS, NAN_WEIGHT_GRADIENT, INF_BIAS_GRADIENT } poison;

typedef struct {
    umt_context *ctx;
    umt_layer *fc;
    umt_optimizer *opt;
} model;

static model model_new(umt_optimizer_options options) {
    model m = {0};
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&o, &m.ctx), UMT_OK);
    m.fc = umt_linear_layer_new(m.ctx, "fc", 3, 2, true);
    assert_non_null(m.fc);
    if (umt_optimizer_create(m.ctx, &options, &m.opt) != UMT_OK) fail_msg("%s", umt_last_error());
    return m;
}

static umt_optimizer_options checked(umt_optimizer_kind kind, umt_nonfinite_policy policy) {
    umt_optimizer_options o = umt_optimizer_defaults(kind);
    o.on_nonfinite = policy;
    return o;
}

/* Samples [first, first + count) of step k's four: inputs that change with k, labels 0 1 0 1. */
static umt_tensor *forward(model *m, int k, int first, int count) {
    float x[12];
    int32_t labels[4];
    for (int i = 0; i < count; ++i) {
        for (int j = 0; j < 3; ++j) x[3 * i + j] = 0.25f * (float)((k + 2 * (first + i) + j) % 5) - 0.5f;
        labels[i] = (first + i) % 2;
    }
    umt_tensor *images = umt_tensor_new_2d(m->ctx, UMT_POOL_ACTIVATIONS, UMT_F32, count, 3);
    umt_tensor *y = umt_tensor_new_1d(m->ctx, UMT_POOL_ACTIVATIONS, UMT_I32, count);
    assert_int_equal(umt_tensor_copy_from_host(images, x, (size_t)count * 3 * sizeof(float)), UMT_OK);
    assert_int_equal(umt_tensor_copy_from_host(y, labels, (size_t)count * sizeof(int32_t)), UMT_OK);
    umt_tensor *loss = umt_softmax_cross_entropy(m->ctx, umt_layer_forward(m->ctx, m->fc, images), y);
    assert_non_null(loss);
    return loss;
}

/* Writes value into element 0 of t (a loss or a gradient). */
static void poke(umt_tensor *t, float value) {
    float all[6];
    int64_t n = umt_tensor_numel(t);
    assert_int_equal(umt_tensor_copy_to_host(t, all, (size_t)n * sizeof(float)), UMT_OK);
    all[0] = value;
    assert_int_equal(umt_tensor_copy_from_host(t, all, (size_t)n * sizeof(float)), UMT_OK);
}

/* One training step k, poisoned as asked between backward and the update. */
static void step(model *m, int k, poison p) {
    assert_int_equal(umt_step_begin(m->ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(m->ctx), UMT_OK);
    umt_tensor *loss = forward(m, k, 0, 4);
    assert_int_equal(umt_backward(m->ctx, loss), UMT_OK);
    if (p == NAN_LOSS || p == INF_LOSS) poke(loss, p == NAN_LOSS ? NAN : INFINITY);
    if (p == NAN_WEIGHT_GRADIENT) poke(umt_tensor_grad(umt_parameter_at(m->ctx, 0)), NAN);
    if (p == INF_BIAS_GRADIENT) poke(umt_tensor_grad(umt_parameter_at(m->ctx, 1)), INFINITY);
    assert_int_equal(umt_optimizer_step(m->opt), UMT_OK);
}

/* Every parameter and optimizer state of m, in order, as bytes (room for the largest model here). */
typedef struct {
    float values[64];
    size_t count;
} snapshot;

static void append(snapshot *s, const umt_tensor *t) {
    size_t n = (size_t)umt_tensor_numel(t);
    assert_true(s->count + n <= sizeof s->values / sizeof s->values[0]);
    assert_int_equal(umt_tensor_copy_to_host(t, s->values + s->count, n * sizeof(float)), UMT_OK);
    s->count += n;
}

static snapshot take(const model *m) {
    snapshot s = {.count = 0};
    for (int i = 0; i < umt_parameter_count(m->ctx); ++i) append(&s, umt_parameter_at(m->ctx, i));
    for (int i = 0; i < umt_optimizer_state_count(m->opt); ++i) {
        const char *name;
        int index;
        append(&s, umt_optimizer_state_at(m->opt, i, &name, &index));
    }
    return s;
}

static void expect_same(const snapshot *got, const snapshot *want) {
    assert_int_equal(got->count, want->count);
    assert_memory_equal(got->values, want->values, want->count * sizeof(float));
}

static umt_nonfinite_report report_of(const model *m) {
    umt_nonfinite_report r;
    assert_int_equal(umt_optimizer_nonfinite_get(m->opt, &r), UMT_OK);
    return r;
}

/* ----------------------------------------------------------------------------------------- */

static void test_stop_applies_no_update_from_the_first_nonfinite_step_on(void **state) {
    (void)state;
    model m = model_new(checked(UMT_OPT_SGD, UMT_NONFINITE_STOP));
    step(&m, 0, CLEAN);
    assert_false(umt_optimizer_nonfinite_found(m.opt));
    snapshot before = take(&m);
    step(&m, 1, NAN_WEIGHT_GRADIENT);
    /* On the CPU the decision is made in umt_optimizer_step: the doorbell has rung already. */
    assert_true(umt_optimizer_nonfinite_found(m.opt));
    snapshot after = take(&m);
    expect_same(&after, &before);
    umt_nonfinite_report r = report_of(&m);
    assert_int_equal(r.steps, 1);
    assert_int_equal(r.first_step, 2);
    assert_false(r.loss);
    assert_true(isfinite(r.loss_value) && r.loss_value > 0);
    assert_string_equal(r.parameter, "fc.weight");
    assert_true(r.stopped);
    /* A finite step after it moves nothing either: the run is to stop where it went wrong. */
    step(&m, 2, CLEAN);
    after = take(&m);
    expect_same(&after, &before);
    r = report_of(&m);
    assert_int_equal(r.steps, 1);
    assert_int_equal(r.first_step, 2);
    assert_int_equal(umt_optimizer_steps(m.opt), 3);
    assert_int_equal(umt_optimizer_skipped_steps(m.opt), 2);
    umt_context_destroy(m.ctx);
}

static void test_skip_leaves_out_the_nonfinite_steps_only_and_counts_them(void **state) {
    (void)state;
    model m = model_new(checked(UMT_OPT_ADAM, UMT_NONFINITE_SKIP));
    model reference = model_new(umt_optimizer_defaults(UMT_OPT_ADAM));
    step(&m, 0, CLEAN);
    step(&m, 1, NAN_LOSS);
    step(&m, 2, CLEAN);
    step(&m, 3, INF_BIAS_GRADIENT);
    step(&m, 4, CLEAN);
    /* The same run without the poisoned steps: Adam's bias correction counts applied steps only. */
    step(&reference, 0, CLEAN);
    step(&reference, 2, CLEAN);
    step(&reference, 4, CLEAN);
    snapshot got = take(&m), want = take(&reference);
    expect_same(&got, &want);
    umt_nonfinite_report r = report_of(&m);
    assert_int_equal(r.steps, 2);
    assert_int_equal(r.first_step, 2);
    assert_true(r.loss);
    assert_true(isnan(r.loss_value));
    assert_null(r.parameter); /* the loss alone: its gradients were finite */
    assert_false(r.stopped);
    assert_int_equal(umt_optimizer_skipped_steps(m.opt), 2);
    umt_context_destroy(m.ctx);
    umt_context_destroy(reference.ctx);
}

static void test_an_infinite_loss_counts_as_nonfinite(void **state) {
    (void)state;
    model m = model_new(checked(UMT_OPT_SGD, UMT_NONFINITE_STOP));
    step(&m, 0, INF_LOSS);
    umt_nonfinite_report r = report_of(&m);
    assert_int_equal(r.first_step, 1);
    assert_true(r.loss);
    assert_true(isinf(r.loss_value));
    umt_context_destroy(m.ctx);
}

/* The check reads the step's loss wherever the step left it: split in micro-batches, their sum. */
static void test_a_split_step_checks_the_micro_batches_summed_loss(void **state) {
    (void)state;
    model m = model_new(checked(UMT_OPT_SGD, UMT_NONFINITE_STOP));
    snapshot before = take(&m);
    assert_int_equal(umt_step_begin(m.ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(m.ctx), UMT_OK);
    for (int first = 0; first < 4; first += 2) {
        assert_int_equal(umt_micro_batch_begin(m.ctx, first, 2, 4), UMT_OK);
        umt_tensor *loss = forward(&m, 0, first, 2);
        /* The first micro-batch's loss NaN, its gradients finite: only the sum says so. */
        if (first == 0) poke(loss, NAN);
        assert_int_equal(umt_backward(m.ctx, loss), UMT_OK);
    }
    assert_int_equal(umt_optimizer_step(m.opt), UMT_OK);
    assert_true(umt_optimizer_nonfinite_found(m.opt));
    assert_true(report_of(&m).loss);
    snapshot after = take(&m);
    expect_same(&after, &before);
    umt_context_destroy(m.ctx);
}

/* The updates the check lets through are the unchecked ones, bit for bit. */
static void test_checked_finite_steps_are_bit_for_bit_the_unchecked_ones(void **state) {
    (void)state;
    const umt_optimizer_kind kinds[] = {UMT_OPT_SGD, UMT_OPT_ADAM, UMT_OPT_ADAMW, UMT_OPT_ADADELTA};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k)
        for (int multi = 0; multi < 2; ++multi) {
            umt_optimizer_options plain = umt_optimizer_defaults(kinds[k]);
            plain.momentum = kinds[k] == UMT_OPT_SGD ? 0.9f : plain.momentum;
            plain.weight_decay = 1e-2f;
            plain.multi_tensor = multi;
            umt_optimizer_options check = plain;
            check.on_nonfinite = UMT_NONFINITE_STOP;
            model a = model_new(plain), b = model_new(check);
            for (int s = 0; s < 5; ++s) {
                step(&a, s, CLEAN);
                step(&b, s, CLEAN);
            }
            snapshot got = take(&b), want = take(&a);
            expect_same(&got, &want);
            assert_false(umt_optimizer_nonfinite_found(b.opt));
            assert_int_equal(report_of(&b).first_step, 0);
            umt_context_destroy(a.ctx);
            umt_context_destroy(b.ctx);
        }
}

static void test_off_applies_a_nonfinite_update_as_before(void **state) {
    (void)state;
    model m = model_new(umt_optimizer_defaults(UMT_OPT_SGD));
    step(&m, 0, NAN_WEIGHT_GRADIENT);
    float w;
    assert_int_equal(umt_tensor_get_f32(umt_parameter_at(m.ctx, 0), 0, &w), UMT_OK);
    assert_true(isnan(w));
    assert_false(umt_optimizer_nonfinite_found(m.opt));
    umt_nonfinite_report r = report_of(&m);
    assert_int_equal(r.steps, 0);
    assert_int_equal(r.first_step, 0);
    umt_context_destroy(m.ctx);
}

/* fp16's scaler keeps an overflowing gradient (a smaller scale, the step again); a NaN loss is the run's. */
static void test_under_loss_scaling_only_the_loss_counts(void **state) {
    (void)state;
    umt_optimizer_options o = checked(UMT_OPT_SGD, UMT_NONFINITE_STOP);
    o.loss_scaling = true;
    o.loss_scale_init = 1024.0f;
    model m = model_new(o);
    step(&m, 0, INF_BIAS_GRADIENT);
    assert_false(umt_optimizer_nonfinite_found(m.opt));
    assert_float_equal(umt_optimizer_loss_scale(m.opt), 512.0, 0.0);
    snapshot before = take(&m);
    step(&m, 1, CLEAN); /* applied: the scaler's skip stopped nothing */
    snapshot moved = take(&m);
    assert_true(memcmp(moved.values, before.values, before.count * sizeof(float)) != 0);
    step(&m, 2, NAN_LOSS);
    assert_true(umt_optimizer_nonfinite_found(m.opt));
    umt_nonfinite_report r = report_of(&m);
    assert_int_equal(r.first_step, 3);
    assert_true(r.loss && r.stopped);
    umt_context_destroy(m.ctx);
}

/* After a checkpoint's load the steps are counted from its count, as umt_optimizer_steps counts. */
static void test_the_reported_step_counts_on_from_a_loaded_step_count(void **state) {
    (void)state;
    model m = model_new(checked(UMT_OPT_SGD, UMT_NONFINITE_STOP));
    assert_int_equal(umt_optimizer_set_steps(m.opt, 40), UMT_OK);
    step(&m, 0, CLEAN);
    step(&m, 1, NAN_LOSS);
    assert_int_equal(report_of(&m).first_step, 42);
    assert_int_equal(umt_optimizer_steps(m.opt), 42);
    umt_context_destroy(m.ctx);
}

static void test_policy_names_parse_and_a_bad_policy_is_refused(void **state) {
    (void)state;
    const char *names[] = {"off", "stop", "skip"};
    for (int p = 0; p < 3; ++p) {
        umt_nonfinite_policy policy;
        assert_int_equal(umt_nonfinite_policy_parse(names[p], &policy), UMT_OK);
        assert_int_equal(policy, p);
        assert_string_equal(umt_nonfinite_policy_name(policy), names[p]);
    }
    umt_nonfinite_policy policy;
    assert_int_equal(umt_nonfinite_policy_parse("ignore", &policy), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "\"ignore\""));
    assert_string_equal(umt_nonfinite_policy_name((umt_nonfinite_policy)7), "invalid-policy");
    assert_int_equal(umt_optimizer_defaults(UMT_OPT_ADAM).on_nonfinite, UMT_NONFINITE_OFF);
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *ctx;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    assert_non_null(umt_linear_layer_new(ctx, "fc", 3, 2, true));
    umt_optimizer_options bad = checked(UMT_OPT_SGD, (umt_nonfinite_policy)7);
    umt_optimizer *opt;
    assert_int_equal(umt_optimizer_create(ctx, &bad, &opt), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "on_nonfinite 7"));
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_applies_no_update_from_the_first_nonfinite_step_on),
        cmocka_unit_test(test_skip_leaves_out_the_nonfinite_steps_only_and_counts_them),
        cmocka_unit_test(test_an_infinite_loss_counts_as_nonfinite),
        cmocka_unit_test(test_a_split_step_checks_the_micro_batches_summed_loss),
        cmocka_unit_test(test_checked_finite_steps_are_bit_for_bit_the_unchecked_ones),
        cmocka_unit_test(test_off_applies_a_nonfinite_update_as_before),
        cmocka_unit_test(test_under_loss_scaling_only_the_loss_counts),
        cmocka_unit_test(test_the_reported_step_counts_on_from_a_loaded_step_count),
        cmocka_unit_test(test_policy_names_parse_and_a_bad_policy_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
