/*
 * tests/test_checkpoint_hostile.c — checkpoints made to mislead: files whose checksum is valid
 * but whose fields are not (an epoch of -999999 or 2^62, NaN weights, names holding terminal
 * escape sequences), and calls that name no file at all.
 *
 * Each bad file is a good one edited here and resealed (its CRC-32 rewritten), so that the
 * edit reaches the checks behind the checksum. A refused load must name the file, the field or
 * tensor and the value, and leave the model, the optimizer and the RNG as they were. Also run
 * under AddressSanitizer + UBSan (bazel test --config=asan //tests:test_checkpoint_hostile).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "core/context.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* Offsets in a checkpoint file (docs/CHECKPOINT.md). */
enum { AT_EPOCH = 20, AT_STEP = 28, AT_OPTIMIZER_STEPS = 40, AT_COUNTS = 80, FIRST_RECORD = 92, CRC_BYTES = 4 };

#define TWO_TO_THE_53 ((int64_t)1 << 53)

/* ----------------------------------------------------------------------------------------- */
/* Files */

static int setup(void **state) {
    (void)state;
    return scratch_make("test_checkpoint_hostile");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

static uint32_t get_u32(const uint8_t *at) {
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

static void put_u32(uint8_t *at, uint32_t v) {
    for (int i = 0; i < 4; ++i) at[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *at, uint64_t v) {
    put_u32(at, (uint32_t)v);
    put_u32(at + 4, (uint32_t)(v >> 32));
}

/* Rewrites the trailing CRC-32 so that an edit reaches the checks behind the checksum. */
static void reseal(uint8_t *bytes, size_t size) {
    put_u32(bytes + size - CRC_BYTES, (uint32_t)crc32(0L, bytes, (uInt)(size - CRC_BYTES)));
}

/* The record named name: the offset of its name length (the record's first byte), and of its data. */
static size_t find_record(const uint8_t *bytes, const char *name, size_t *data) {
    uint32_t total = get_u32(bytes + AT_COUNTS) + get_u32(bytes + AT_COUNTS + 4) + get_u32(bytes + AT_COUNTS + 8);
    size_t at = FIRST_RECORD;
    for (uint32_t i = 0; i < total; ++i) {
        size_t start = at;
        uint32_t name_bytes = get_u32(bytes + at);
        bool found = name_bytes == strlen(name) && memcmp(bytes + at + 4, name, name_bytes) == 0;
        at += 4 + name_bytes + 4;
        uint32_t ndim = get_u32(bytes + at);
        at += 4 + 8 * (size_t)ndim;
        uint64_t data_bytes = get_u32(bytes + at) | (uint64_t)get_u32(bytes + at + 4) << 32;
        at += 8;
        if (found) {
            *data = at;
            return start;
        }
        at += data_bytes;
    }
    fail_msg("no record named %s", name);
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* The model: a linear layer and a batch norm (parameters and buffers), and Adam (state) */

typedef struct {
    umt_context *ctx;
    umt_optimizer *opt;
} model;

static model model_new(uint64_t seed) {
    model m = {0};
    umt_context_options options = umt_context_defaults();
    options.device = UMT_DEVICE_CPU;
    options.seed = seed;
    assert_int_equal(umt_context_create(&options, &m.ctx), UMT_OK);
    assert_non_null(umt_linear_layer_new(m.ctx, "fc", 4, 3, true));
    assert_non_null(umt_batchnorm_layer_new(m.ctx, "bn", 3));
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    assert_int_equal(umt_optimizer_create(m.ctx, &o, &m.opt), UMT_OK);
    return m;
}

/* A good checkpoint of model_new(7) at epoch 2, step 30, as bytes (free them). */
static uint8_t *good_checkpoint(size_t *size) {
    const char *path = scratch_path("good.ckpt");
    model m = model_new(7);
    umt_status st = umt_checkpoint_save(m.ctx, m.opt, &(umt_checkpoint_info){.epoch = 2, .step = 30}, path);
    if (st != UMT_OK) fail_msg("save: %s", umt_last_error());
    umt_context_destroy(m.ctx);
    return scratch_read(path, size);
}

/* Every parameter and buffer, one after another, as host floats (free it). */
static float *snapshot(const umt_context *ctx, size_t *count) {
    int parameters = umt_parameter_count(ctx), total = parameters + umt_buffer_count(ctx);
    float *values = NULL;
    size_t n = 0;
    for (int i = 0; i < total; ++i) {
        const umt_tensor *t = i < parameters ? umt_parameter_at(ctx, i) : umt_buffer_at(ctx, i - parameters);
        size_t numel = (size_t)umt_tensor_numel(t);
        values = realloc(values, (n + numel) * sizeof *values);
        assert_non_null(values);
        assert_int_equal(umt_tensor_copy_to_host(t, values + n, numel * sizeof *values), UMT_OK);
        n += numel;
    }
    *count = n;
    return values;
}

/* Loading path into model_new(99) fails with status, the path and both keywords in the message,
 * and the model, the optimizer's step count, the RNG and *info are as before. */
static void expect_refused(const char *path, umt_status status, const char *keyword1, const char *keyword2) {
    model m = model_new(99);
    size_t before_count, after_count;
    float *before = snapshot(m.ctx, &before_count);
    umt_rng rng = m.ctx->rng;
    umt_checkpoint_info info = {.epoch = 42, .step = 43};
    umt_status got = umt_checkpoint_load(m.ctx, m.opt, &info, path);
    const char *message = umt_last_error();
    if (got != status || !strstr(message, path) || !strstr(message, keyword1) || !strstr(message, keyword2))
        fail_msg("got %s '%s', expected %s with '%s' and '%s'", umt_status_name(got), message, umt_status_name(status),
                 keyword1, keyword2);
    float *after = snapshot(m.ctx, &after_count);
    assert_int_equal(before_count, after_count);
    assert_memory_equal(before, after, before_count * sizeof *before);
    assert_memory_equal(m.ctx->rng.s, rng.s, sizeof rng.s);
    assert_int_equal(umt_optimizer_steps(m.opt), 0);
    assert_int_equal(info.epoch, 42);
    assert_int_equal(info.step, 43);
    free(before);
    free(after);
    umt_context_destroy(m.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Header fields: each within 0..2^53 */

static void test_epoch_or_step_below_zero_or_above_2_to_the_53_is_refused_naming_field_and_value(void **state) {
    (void)state;
    const struct {
        int at;
        int64_t value;
        const char *says;
    } cases[] = {
        {AT_EPOCH, -1, "epoch -1"},
        {AT_EPOCH, -999999, "epoch -999999"},
        {AT_EPOCH, TWO_TO_THE_53 + 1, "epoch 9007199254740993"},
        {AT_EPOCH, (int64_t)1 << 62, "epoch 4611686018427387904"},
        {AT_EPOCH, INT64_MIN, "epoch -9223372036854775808"},
        {AT_STEP, -1, "step -1"},
        {AT_STEP, (int64_t)1 << 62, "step 4611686018427387904"},
        {AT_OPTIMIZER_STEPS, -5, "optimizer step count -5"},
        {AT_OPTIMIZER_STEPS, (int64_t)1 << 62, "optimizer step count 4611686018427387904"},
    };
    size_t size;
    uint8_t *good = good_checkpoint(&size);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        uint8_t *bytes = malloc(size);
        assert_non_null(bytes);
        memcpy(bytes, good, size);
        put_u64(bytes + cases[i].at, (uint64_t)cases[i].value);
        reseal(bytes, size);
        expect_refused(scratch_write("field.ckpt", bytes, size), UMT_ERR_FORMAT, cases[i].says, "0..2^53");
        free(bytes);
    }
    free(good);
}

static void test_epoch_and_step_of_exactly_2_to_the_53_load(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(&size);
    put_u64(bytes + AT_EPOCH, (uint64_t)TWO_TO_THE_53);
    put_u64(bytes + AT_STEP, (uint64_t)TWO_TO_THE_53);
    reseal(bytes, size);
    const char *path = scratch_write("limit.ckpt", bytes, size);
    model m = model_new(99);
    umt_checkpoint_info info = {0};
    if (umt_checkpoint_load(m.ctx, m.opt, &info, path) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_true(info.epoch == TWO_TO_THE_53 && info.step == TWO_TO_THE_53);
    umt_context_destroy(m.ctx);
    free(bytes);
}

static void test_save_refuses_an_epoch_or_step_out_of_range_and_writes_nothing(void **state) {
    (void)state;
    const struct {
        umt_checkpoint_info info;
        const char *says;
    } cases[] = {
        {{.epoch = -1}, "epoch -1"},
        {{.epoch = TWO_TO_THE_53 + 1}, "epoch 9007199254740993"},
        {{.step = -7}, "step -7"},
        {{.step = (int64_t)1 << 62}, "step 4611686018427387904"},
    };
    model m = model_new(7);
    int before = scratch_entries(NULL);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        const char *path = scratch_path("out-of-range.ckpt");
        umt_status got = umt_checkpoint_save(m.ctx, m.opt, &cases[i].info, path);
        const char *message = umt_last_error();
        if (got != UMT_ERR_INVALID_ARGUMENT || !strstr(message, path) || !strstr(message, cases[i].says) ||
            !strstr(message, "0..2^53"))
            fail_msg("got %s '%s', expected UMT_ERR_INVALID_ARGUMENT with '%s'", umt_status_name(got), message,
                     cases[i].says);
        assert_int_equal(scratch_entries(NULL), before);
    }
    umt_context_destroy(m.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Non-finite values */

/* A good checkpoint whose element `element` of tensor `name` is `value` (an f32 bit pattern). */
static const char *poisoned(const char *file_name, const char *name, int element, uint32_t bits) {
    size_t size, data;
    uint8_t *bytes = good_checkpoint(&size);
    find_record(bytes, name, &data);
    put_u32(bytes + data + 4 * (size_t)element, bits);
    reseal(bytes, size);
    const char *path = scratch_write(file_name, bytes, size);
    free(bytes);
    return path;
}

#define F32_NAN 0x7fc00000u
#define F32_INF 0x7f800000u
#define F32_MINUS_INF 0xff800000u

static void test_nan_or_inf_anywhere_in_the_file_is_refused_naming_tensor_and_element(void **state) {
    (void)state;
    expect_refused(poisoned("nan.ckpt", "fc.weight", 5, F32_NAN), UMT_ERR_FORMAT, "parameter fc.weight",
                   "element 5 is nan");
    expect_refused(poisoned("inf.ckpt", "fc.bias", 2, F32_INF), UMT_ERR_FORMAT, "parameter fc.bias",
                   "element 2 is inf");
    expect_refused(poisoned("minus-inf.ckpt", "bn.running_var", 0, F32_MINUS_INF), UMT_ERR_FORMAT,
                   "buffer bn.running_var", "element 0 is -inf");
    /* Adam's second moment of fc.weight: a diverged run's state is as bad as its weights. */
    expect_refused(poisoned("state.ckpt", "fc.weight/1", 11, F32_NAN | 0x1234u), UMT_ERR_FORMAT,
                   "optimizer state fc.weight/1", "element 11 is nan");
}

static void test_allow_nonfinite_loads_a_nan_for_a_look(void **state) {
    (void)state;
    const char *path = poisoned("nan-loaded.ckpt", "fc.weight", 5, F32_NAN);
    model m = model_new(99);
    /* Zeroed options and NULL are the defaults: they refuse. */
    umt_checkpoint_load_options defaults = {0};
    assert_int_equal(umt_checkpoint_load_with(m.ctx, m.opt, NULL, path, &defaults), UMT_ERR_FORMAT);
    assert_int_equal(umt_checkpoint_load_with(m.ctx, m.opt, NULL, path, NULL), UMT_ERR_FORMAT);
    umt_checkpoint_info info = {0};
    umt_checkpoint_load_options allow = {.allow_nonfinite = true};
    if (umt_checkpoint_load_with(m.ctx, m.opt, &info, path, &allow) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_int_equal(info.epoch, 2);
    assert_int_equal(info.step, 30);
    float value;
    assert_string_equal(umt_tensor_name(umt_parameter_at(m.ctx, 0)), "fc.weight");
    assert_int_equal(umt_tensor_get_f32(umt_parameter_at(m.ctx, 0), 5, &value), UMT_OK);
    assert_true(isnan(value));
    /* The rest is the file's: element 4 as model_new(7) made it. */
    model saved = model_new(7);
    float expected;
    assert_int_equal(umt_tensor_get_f32(umt_parameter_at(saved.ctx, 0), 4, &expected), UMT_OK);
    assert_int_equal(umt_tensor_get_f32(umt_parameter_at(m.ctx, 0), 4, &value), UMT_OK);
    assert_true(value == expected);
    umt_context_destroy(saved.ctx);
    umt_context_destroy(m.ctx);
}

static void test_load_with_refuses_a_null_context_or_path_naming_it(void **state) {
    (void)state;
    model m = model_new(7);
    umt_checkpoint_load_options allow = {.allow_nonfinite = true};
    assert_int_equal(umt_checkpoint_load_with(NULL, NULL, NULL, scratch_path("x.ckpt"), &allow), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "umt_checkpoint_load_with: ctx is NULL"));
    assert_int_equal(umt_checkpoint_load_with(m.ctx, m.opt, NULL, NULL, &allow), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "umt_checkpoint_load_with: path is NULL"));
    umt_context_destroy(m.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Names from the file, in messages */

/* Nine bytes, like "fc.weight": a screen clear, a bell, a backslash, a byte past ASCII, a newline. */
static const char hostile_name[9] = {'\x1b', '[', '2', 'J', '\x07', '\\', '\xff', '\n', 't'};
static const char hostile_escaped[] = "\\x1b[2J\\x07\\\\\\xff\\x0at";

/* message says keyword and escaped, and holds nothing but printable ASCII. */
static void expect_printable(const char *message, const char *keyword) {
    if (!strstr(message, keyword) || !strstr(message, hostile_escaped))
        fail_msg("'%s': expected '%s' and the name escaped as '%s'", message, keyword, hostile_escaped);
    for (const char *c = message; *c; ++c)
        if (*c < 0x20 || *c > 0x7e) fail_msg("byte 0x%02x at %zu of the message", (uint8_t)*c, (size_t)(c - message));
}

static void test_names_from_the_file_are_printed_escaped(void **state) {
    (void)state;
    size_t size, data;
    uint8_t *bytes = good_checkpoint(&size);
    size_t record = find_record(bytes, "fc.weight", &data);
    memcpy(bytes + record + 4, hostile_name, sizeof hostile_name);
    reseal(bytes, size);
    const char *path = scratch_write("escapes.ckpt", bytes, size);
    model m = model_new(99);
    /* Missing from the file, which has another that the model lacks. */
    assert_int_equal(umt_checkpoint_load(m.ctx, m.opt, NULL, path), UMT_ERR_FORMAT);
    expect_printable(umt_last_error(), "lacks");
    /* A record refused while parsed: its dtype is out of range. */
    put_u32(bytes + record + 4 + sizeof hostile_name, 99);
    reseal(bytes, size);
    path = scratch_write("escapes-dtype.ckpt", bytes, size);
    assert_int_equal(umt_checkpoint_load(m.ctx, m.opt, NULL, path), UMT_ERR_FORMAT);
    expect_printable(umt_last_error(), "dtype 99");
    umt_context_destroy(m.ctx);
    free(bytes);
}

/* ----------------------------------------------------------------------------------------- */
/* Saving: names and paths */

static void test_a_name_too_long_to_save_is_reported_with_its_true_length(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    char name[5000];
    memset(name, 'w', 4999);
    name[4999] = '\0';
    assert_non_null(umt_parameter_new(ctx, name, 1, (int64_t[]){2}));
    const char *path = scratch_path("long-name.ckpt");
    assert_int_equal(umt_checkpoint_save(ctx, NULL, NULL, path), UMT_ERR_INVALID_ARGUMENT);
    if (!strstr(umt_last_error(), "is 4999 bytes (at most 4096)")) fail_msg("%s", umt_last_error());
    umt_context_destroy(ctx);
}

/* fn's refusal of an empty or NULL path names the function and the argument. */
static void expect_path_refused(umt_status got, const char *function, const char *problem) {
    char expected[128];
    snprintf(expected, sizeof expected, "%s: path is %s", function, problem);
    if (got != UMT_ERR_INVALID_ARGUMENT || !strstr(umt_last_error(), expected))
        fail_msg("got %s '%s', expected UMT_ERR_INVALID_ARGUMENT with '%s'", umt_status_name(got), umt_last_error(),
                 expected);
}

static void test_an_empty_or_null_path_is_refused_naming_the_argument(void **state) {
    (void)state;
    model m = model_new(7);
    expect_path_refused(umt_checkpoint_save(m.ctx, m.opt, NULL, ""), "umt_checkpoint_save", "empty");
    expect_path_refused(umt_checkpoint_save(m.ctx, m.opt, NULL, NULL), "umt_checkpoint_save", "NULL");
    expect_path_refused(umt_checkpoint_check_writable(""), "umt_checkpoint_check_writable", "empty");
    expect_path_refused(umt_checkpoint_check_writable(NULL), "umt_checkpoint_check_writable", "NULL");
    expect_path_refused(umt_checkpoint_load(m.ctx, m.opt, NULL, ""), "umt_checkpoint_load", "empty");
    expect_path_refused(umt_checkpoint_load(m.ctx, m.opt, NULL, NULL), "umt_checkpoint_load", "NULL");
    umt_context_destroy(m.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_epoch_or_step_below_zero_or_above_2_to_the_53_is_refused_naming_field_and_value),
        cmocka_unit_test(test_epoch_and_step_of_exactly_2_to_the_53_load),
        cmocka_unit_test(test_save_refuses_an_epoch_or_step_out_of_range_and_writes_nothing),
        cmocka_unit_test(test_nan_or_inf_anywhere_in_the_file_is_refused_naming_tensor_and_element),
        cmocka_unit_test(test_allow_nonfinite_loads_a_nan_for_a_look),
        cmocka_unit_test(test_load_with_refuses_a_null_context_or_path_naming_it),
        cmocka_unit_test(test_names_from_the_file_are_printed_escaped),
        cmocka_unit_test(test_a_name_too_long_to_save_is_reported_with_its_true_length),
        cmocka_unit_test(test_an_empty_or_null_path_is_refused_naming_the_argument),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
