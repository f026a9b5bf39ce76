/*
 * tests/test_checkpoint.c — checkpoints: a resumed run, atomic saves, and bad files.
 *
 * The model is small but has every kind of saved state: parameters (two linear layers and a
 * batch norm), buffers (the batch norm's running statistics), Adam's moments and step count,
 * and the RNG (each step draws its input and a dropout mask from it). A run interrupted by a
 * save and a load into a fresh context must continue with the same losses and weights, bit
 * for bit, as the run that was never interrupted.
 *
 * A save inside an epoch keeps the step inside it and the RNG of its start (format version 2), a
 * save at an epoch's end is version 1 as before; a model or optimizer state holding a NaN or an
 * infinity is never saved, and the file it would have replaced stays byte for byte.
 *
 * Then the battery of bad checkpoints, each made here from a good one (the byte offsets are
 * those of docs/CHECKPOINT.md) in a fresh directory under /tmp: each must be refused with the
 * right status and a message naming the file and the problem, and must leave the model, the
 * optimizer's step count and the RNG as they were. Also run under AddressSanitizer + UBSan
 * (bazel test --config=asan //tests:test_checkpoint).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "core/context.h"
#include "core/optim/optim.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* Offsets in a checkpoint file (docs/CHECKPOINT.md). */
enum { AT_VERSION = 8, AT_PARAMETER_COUNT = 80, FIRST_RECORD = 92, CRC_BYTES = 4 };

#define NO_OPTIMIZER (-1)
#define BATCH 6
#define IN_FEATURES 4
#define CLASSES 3

/* ----------------------------------------------------------------------------------------- */
/* Files and directories */

static int setup(void **state) {
    (void)state;
    return scratch_make("test_checkpoint");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

static void put_u32(uint8_t *at, uint32_t v) {
    for (int i = 0; i < 4; ++i) at[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the trailing CRC-32 so that an edit reaches the checks behind the checksum. */
static void reseal(uint8_t *bytes, size_t size) {
    put_u32(bytes + size - CRC_BYTES, (uint32_t)crc32(0L, bytes, (uInt)(size - CRC_BYTES)));
}

/* ----------------------------------------------------------------------------------------- */
/* The model */

typedef struct {
    umt_context *ctx;
    umt_optimizer *opt;
    umt_layer *fc1, *bn, *fc2;
} model;

/* fc1 [hidden,4] -> batch norm (optional) -> relu -> dropout -> fc2 [3,hidden], initialised from
 * seed; an optimizer of the given kind (lr 0.01, SGD with momentum) or NO_OPTIMIZER. */
static model model_new(uint64_t seed, int64_t hidden, bool batchnorm, int optimizer) {
    model m = {0};
    umt_context_options options = umt_context_defaults();
    options.device = UMT_DEVICE_CPU;
    options.seed = seed;
    assert_int_equal(umt_context_create(&options, &m.ctx), UMT_OK);
    m.fc1 = umt_linear_layer_new(m.ctx, "fc1", IN_FEATURES, hidden, true);
    m.bn = batchnorm ? umt_batchnorm_layer_new(m.ctx, "bn", hidden) : NULL;
    m.fc2 = umt_linear_layer_new(m.ctx, "fc2", hidden, CLASSES, true);
    assert_non_null(m.fc1);
    assert_non_null(m.fc2);
    assert_true(!batchnorm || m.bn);
    if (optimizer != NO_OPTIMIZER) {
        umt_optimizer_options o = umt_optimizer_defaults((umt_optimizer_kind)optimizer);
        o.lr = 0.01f;
        o.momentum = 0.9f;
        assert_int_equal(umt_optimizer_create(m.ctx, &o, &m.opt), UMT_OK);
    }
    return m;
}

static model adam_model(uint64_t seed) { return model_new(seed, 8, true, UMT_OPT_ADAM); }

/* One training step on a batch drawn from the context's RNG; returns the loss. */
static float train_step(model *m) {
    umt_context *ctx = m->ctx;
    assert_int_equal(umt_step_begin(ctx), UMT_OK);
    assert_int_equal(umt_zero_grad(ctx), UMT_OK);
    umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, BATCH, IN_FEATURES);
    umt_tensor *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, BATCH);
    assert_int_equal(umt_tensor_uniform(ctx, x, -1.0f, 1.0f), UMT_OK);
    const int32_t label_values[BATCH] = {0, 1, 2, 0, 1, 2};
    assert_int_equal(umt_tensor_copy_from_host(labels, label_values, sizeof label_values), UMT_OK);
    umt_tensor *h = umt_layer_forward(ctx, m->fc1, x);
    if (m->bn) h = umt_layer_forward(ctx, m->bn, h);
    h = umt_dropout(ctx, umt_relu(ctx, h), 0.25f);
    umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, m->fc2, h), labels);
    if (!loss) fail_msg("forward: %s", umt_last_error());
    assert_int_equal(umt_backward(ctx, loss), UMT_OK);
    assert_int_equal(umt_optimizer_step(m->opt), UMT_OK);
    float value;
    assert_int_equal(umt_tensor_get_f32(loss, 0, &value), UMT_OK);
    return value;
}

/* Every parameter and buffer, one after another, as host floats (free it). */
static float *snapshot(const umt_context *ctx, size_t *count) {
    int parameters = umt_parameter_count(ctx), total = parameters + umt_buffer_count(ctx);
    size_t n = 0;
    for (int i = 0; i < total; ++i)
        n += (size_t)umt_tensor_numel(i < parameters ? umt_parameter_at(ctx, i) : umt_buffer_at(ctx, i - parameters));
    float *values = malloc(n * sizeof *values);
    assert_non_null(values);
    size_t at = 0;
    for (int i = 0; i < total; ++i) {
        const umt_tensor *t = i < parameters ? umt_parameter_at(ctx, i) : umt_buffer_at(ctx, i - parameters);
        size_t numel = (size_t)umt_tensor_numel(t);
        assert_int_equal(umt_tensor_copy_to_host(t, values + at, numel * sizeof *values), UMT_OK);
        at += numel;
    }
    *count = n;
    return values;
}

static void assert_same_state(const umt_context *a, const umt_context *b) {
    size_t na, nb;
    float *va = snapshot(a, &na), *vb = snapshot(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(va, vb, na * sizeof *va);
    free(va);
    free(vb);
}

static void expect_ok(umt_status status) {
    if (status != UMT_OK) fail_msg("%s: %s", umt_status_name(status), umt_last_error());
}

/* ----------------------------------------------------------------------------------------- */
/* Round trip */

static void test_resumed_run_matches_uninterrupted_run_bit_for_bit(void **state) {
    (void)state;
    const char *path = scratch_path("resume.ckpt");
    model a = adam_model(7);
    for (int i = 0; i < 3; ++i) train_step(&a);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, &(umt_checkpoint_info){.epoch = 2, .step = 3}, path));
    umt_rng rng_at_save = a.ctx->rng;
    float uninterrupted[3];
    for (int i = 0; i < 3; ++i) uninterrupted[i] = train_step(&a);

    model b = adam_model(99);
    umt_checkpoint_info info = {0};
    expect_ok(umt_checkpoint_load(b.ctx, b.opt, &info, path));
    assert_int_equal(info.epoch, 2);
    assert_int_equal(info.step, 3);
    assert_int_equal(umt_optimizer_steps(b.opt), 3);
    assert_memory_equal(b.ctx->rng.s, rng_at_save.s, sizeof rng_at_save.s);
    float resumed[3];
    for (int i = 0; i < 3; ++i) resumed[i] = train_step(&b);
    assert_memory_equal(resumed, uninterrupted, sizeof resumed);
    assert_int_equal(umt_optimizer_steps(b.opt), 6);
    /* Parameters and the batch norm's running statistics, after three more steps each. */
    assert_same_state(a.ctx, b.ctx);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

static void test_load_replaces_a_different_initialisation(void **state) {
    (void)state;
    const char *path = scratch_path("init.ckpt");
    model a = adam_model(7), b = adam_model(99);
    size_t na, nb;
    float *va = snapshot(a.ctx, &na), *vb = snapshot(b.ctx, &nb);
    /* Different seeds: otherwise the round trip above could pass without loading anything. */
    assert_memory_not_equal(va, vb, na * sizeof *va);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, NULL, path));
    expect_ok(umt_checkpoint_load(b.ctx, b.opt, NULL, path));
    assert_same_state(a.ctx, b.ctx);
    free(va);
    free(vb);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

static void test_checkpoint_with_optimizer_state_loads_into_model_alone(void **state) {
    (void)state;
    const char *path = scratch_path("with-state.ckpt");
    model a = adam_model(7);
    train_step(&a);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, &(umt_checkpoint_info){.epoch = 1, .step = 1}, path));
    model b = model_new(99, 8, true, NO_OPTIMIZER);
    umt_checkpoint_info info = {0};
    expect_ok(umt_checkpoint_load(b.ctx, NULL, &info, path));
    assert_int_equal(info.epoch, 1);
    assert_same_state(a.ctx, b.ctx);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

static void test_model_only_checkpoint_round_trips(void **state) {
    (void)state;
    const char *path = scratch_path("model-only.ckpt");
    model a = model_new(7, 8, true, NO_OPTIMIZER), b = model_new(99, 8, true, NO_OPTIMIZER);
    expect_ok(umt_checkpoint_save(a.ctx, NULL, NULL, path));
    umt_checkpoint_info info = {.epoch = -1, .step = -1};
    expect_ok(umt_checkpoint_load(b.ctx, NULL, &info, path));
    assert_int_equal(info.epoch, 0);
    assert_int_equal(info.step, 0);
    assert_same_state(a.ctx, b.ctx);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Inside an epoch: the step and the RNG the epoch's shuffle was drawn from */

static void test_a_save_inside_an_epoch_keeps_its_step_and_rng_and_an_epoch_end_is_version_1(void **state) {
    (void)state;
    const char *inside = scratch_path("inside.ckpt"), *end = scratch_path("end.ckpt");
    model a = adam_model(7);
    umt_rng_state epoch_rng;
    expect_ok(umt_rng_state_get(a.ctx, &epoch_rng));
    int64_t order[16];
    expect_ok(umt_permutation(a.ctx, 16, order)); /* the epoch's shuffle */
    for (int i = 0; i < 3; ++i) train_step(&a);
    umt_checkpoint_info info = {.epoch = 4, .step = 40, .epoch_step = 3, .epoch_rng = epoch_rng};
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, &info, inside));
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, &(umt_checkpoint_info){.epoch = 5, .step = 40}, end));
    size_t size;
    uint8_t *bytes = scratch_read(inside, &size);
    assert_int_equal(bytes[AT_VERSION], 2);
    free(bytes);
    bytes = scratch_read(end, &size);
    assert_int_equal(bytes[AT_VERSION], 1);
    free(bytes);

    model b = adam_model(99);
    umt_checkpoint_info loaded;
    expect_ok(umt_checkpoint_load(b.ctx, b.opt, &loaded, inside));
    assert_int_equal(loaded.epoch, 4);
    assert_int_equal(loaded.epoch_step, 3);
    assert_memory_equal(loaded.epoch_rng.s, epoch_rng.s, sizeof epoch_rng.s);
    assert_same_state(a.ctx, b.ctx);
    /* The epoch's order drawn again from its RNG, then the saved RNG goes on as a's does. */
    umt_rng_state now;
    int64_t again[16];
    expect_ok(umt_rng_state_get(b.ctx, &now));
    expect_ok(umt_rng_state_set(b.ctx, &loaded.epoch_rng));
    expect_ok(umt_permutation(b.ctx, 16, again));
    expect_ok(umt_rng_state_set(b.ctx, &now));
    assert_memory_equal(again, order, sizeof order);
    assert_float_equal(train_step(&b), train_step(&a), 0.0);
    /* An epoch's end loads with no step inside it. */
    expect_ok(umt_checkpoint_load(b.ctx, b.opt, &loaded, end));
    assert_int_equal(loaded.epoch_step, 0);
    umt_rng_state zeros = {{0}};
    assert_memory_equal(loaded.epoch_rng.s, zeros.s, sizeof zeros.s);
    /* A step inside an epoch without the RNG of its start could not be resumed: refused. */
    info.epoch_rng = zeros;
    assert_int_equal(umt_checkpoint_save(a.ctx, a.opt, &info, inside), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "epoch_rng all zeros"));
    assert_int_equal(umt_rng_state_set(a.ctx, &zeros), UMT_ERR_INVALID_ARGUMENT);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Never a checkpoint of non-finite values */

/* Writes value at element 1 of t. */
static void poison(umt_tensor *t, float value) {
    int64_t n = umt_tensor_numel(t);
    float *all = malloc((size_t)n * sizeof *all);
    assert_non_null(all);
    assert_int_equal(umt_tensor_copy_to_host(t, all, (size_t)n * sizeof *all), UMT_OK);
    all[1] = value;
    assert_int_equal(umt_tensor_copy_from_host(t, all, (size_t)n * sizeof *all), UMT_OK);
    free(all);
}

static void test_nonfinite_values_are_never_saved_and_the_last_good_checkpoint_stays(void **state) {
    (void)state;
    const char *path = scratch_path("good.ckpt");
    model a = adam_model(7);
    train_step(&a);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, &(umt_checkpoint_info){.epoch = 1, .step = 1}, path));
    size_t good_size, size;
    uint8_t *good = scratch_read(path, &good_size);
    int before = scratch_entries(NULL), temporary;
    const char *name;
    int index;
    /* A weight, a running statistic, an optimizer state: each refused by name, nothing written. */
    struct {
        umt_tensor *tensor;
        float value;
        const char *expected;
    } cases[] = {
        {umt_parameter_at(a.ctx, 2), NAN, "parameter bn.weight: element 1 is nan"},
        {umt_buffer_at(a.ctx, 1), INFINITY, "buffer bn.running_var: element 1 is inf"},
        {umt_optimizer_state_at(a.opt, 1, &name, &index), -INFINITY, "optimizer state fc1.weight/1: element 1 is -inf"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        float saved;
        assert_int_equal(umt_tensor_get_f32(cases[c].tensor, 1, &saved), UMT_OK);
        poison(cases[c].tensor, cases[c].value);
        assert_int_equal(umt_checkpoint_save(a.ctx, a.opt, &(umt_checkpoint_info){.epoch = 2, .step = 2}, path),
                         UMT_ERR_STATE);
        if (!strstr(umt_last_error(), path) || !strstr(umt_last_error(), cases[c].expected))
            fail_msg("expected \"%s\" naming %s: %s", cases[c].expected, path, umt_last_error());
        uint8_t *now = scratch_read(path, &size);
        assert_int_equal(size, good_size);
        assert_memory_equal(now, good, size);
        free(now);
        assert_int_equal(scratch_entries(&temporary), before);
        assert_int_equal(temporary, 0);
        poison(cases[c].tensor, saved);
    }
    free(good);
    umt_context_destroy(a.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Atomic saves */

static void test_saving_over_a_checkpoint_replaces_it_and_leaves_no_temporary_file(void **state) {
    (void)state;
    const char *path = scratch_path("over.ckpt");
    model a = adam_model(7), b = adam_model(99);
    int after_temporary, before = scratch_entries(NULL);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, NULL, path));
    train_step(&a);
    expect_ok(umt_checkpoint_save(a.ctx, a.opt, NULL, path));
    assert_int_equal(scratch_entries(&after_temporary), before + 1);
    assert_int_equal(after_temporary, 0);
    expect_ok(umt_checkpoint_load(b.ctx, b.opt, NULL, path));
    assert_same_state(a.ctx, b.ctx);
    assert_int_equal(umt_optimizer_steps(b.opt), 1);
    umt_context_destroy(a.ctx);
    umt_context_destroy(b.ctx);
}

static void test_save_into_missing_directory_fails_naming_path_and_creates_nothing(void **state) {
    (void)state;
    const char *path = scratch_path("no-such-directory/model.ckpt");
    model a = adam_model(7);
    int temporary, before = scratch_entries(NULL);
    assert_int_equal(umt_checkpoint_save(a.ctx, a.opt, NULL, path), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), path));
    assert_non_null(strstr(umt_last_error(), strerror(ENOENT)));
    struct stat st;
    assert_int_not_equal(stat(scratch_path("no-such-directory"), &st), 0);
    assert_int_equal(scratch_entries(&temporary), before);
    assert_int_equal(temporary, 0);
    umt_context_destroy(a.ctx);
}

static void test_check_writable_refuses_a_missing_folder_and_a_folder_and_leaves_nothing(void **state) {
    (void)state;
    int before = scratch_entries(NULL);
    const char *missing = scratch_path("no-such-directory/model.ckpt");
    assert_int_equal(umt_checkpoint_check_writable(missing), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), missing));
    assert_non_null(strstr(umt_last_error(), strerror(ENOENT)));
    assert_int_equal(umt_checkpoint_check_writable(scratch_folder()), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), "is a folder"));
    const char *fine = scratch_path("fine.ckpt");
    expect_ok(umt_checkpoint_check_writable(fine));
    /* Nothing created: not the checkpoint, not the temporary file. */
    assert_int_equal(scratch_entries(NULL), before);
}

/* A directory in the way makes the final rename fail, after the temporary file is written. */
static void test_failed_rename_removes_temporary_file_and_keeps_target(void **state) {
    (void)state;
    const char *target = scratch_path("occupied");
    assert_int_equal(mkdir(target, 0700), 0);
    char inside[512];
    snprintf(inside, sizeof inside, "%s/keep", target);
    FILE *keep = fopen(inside, "wb");
    assert_non_null(keep);
    fclose(keep);
    model a = adam_model(7);
    int temporary, before = scratch_entries(NULL);
    assert_int_equal(umt_checkpoint_save(a.ctx, a.opt, NULL, target), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), target));
    assert_non_null(strstr(umt_last_error(), "rename"));
    assert_int_equal(scratch_entries(&temporary), before);
    assert_int_equal(temporary, 0);
    struct stat st;
    assert_int_equal(stat(inside, &st), 0);
    umt_context_destroy(a.ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Bad checkpoints */

/* A good checkpoint of adam_model(7) after two steps, as bytes (free them), or model-only. */
static uint8_t *good_checkpoint(bool with_optimizer, size_t *size) {
    const char *path = scratch_path("good.ckpt");
    model a = adam_model(7);
    train_step(&a);
    train_step(&a);
    expect_ok(umt_checkpoint_save(a.ctx, with_optimizer ? a.opt : NULL, NULL, path));
    umt_context_destroy(a.ctx);
    return scratch_read(path, size);
}

/* Loading path into a model(99, hidden, batchnorm, optimizer) fails with status and both
 * keywords and the path in the message, and the model, step count and RNG are as before. */
static void expect_refused_by(const char *path, int64_t hidden, bool batchnorm, int optimizer, umt_status status,
                              const char *keyword1, const char *keyword2) {
    model m = model_new(99, hidden, batchnorm, optimizer);
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
    free(before);
    free(after);
    umt_context_destroy(m.ctx);
}

static void expect_refused(const char *path, umt_status status, const char *keyword1, const char *keyword2) {
    expect_refused_by(path, 8, true, UMT_OPT_ADAM, status, keyword1, keyword2);
}

static void test_truncated_checkpoint_is_refused_at_every_cut(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    /* Empty, inside the magic, inside the header, inside the tensors, the last byte missing. */
    const size_t cuts[] = {0, 4, 50, size / 2, size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; ++i)
        expect_refused(scratch_write("truncated.ckpt", bytes, cuts[i]), UMT_ERR_FORMAT, "truncated", "bytes");
    free(bytes);
}

static void test_flipped_byte_is_a_checksum_mismatch(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    bytes[size - CRC_BYTES - 7] ^= 0x10; /* inside the last tensor's data */
    expect_refused(scratch_write("flipped.ckpt", bytes, size), UMT_ERR_FORMAT, "checksum mismatch", "contents give");
    free(bytes);
}

static void test_wrong_magic_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    bytes[0] = 'X';
    expect_refused(scratch_write("magic.ckpt", bytes, size), UMT_ERR_FORMAT, "not an umtrain checkpoint", "magic");
    free(bytes);
}

static void test_future_version_is_refused_naming_both_versions(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    put_u32(bytes + AT_VERSION, 3);
    reseal(bytes, size);
    expect_refused(scratch_write("version.ckpt", bytes, size), UMT_ERR_FORMAT, "version 3", "reads versions 1 and 2");
    free(bytes);
}

static void test_renamed_tensor_is_reported_missing_and_extra(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    /* The first record is fc1.weight: its name starts after the 4-byte length. */
    assert_memory_equal(bytes + FIRST_RECORD + 4, "fc1.weight", 10);
    bytes[FIRST_RECORD + 4 + 2] = '9';
    reseal(bytes, size);
    const char *path = scratch_write("renamed.ckpt", bytes, size);
    expect_refused(path, UMT_ERR_FORMAT, "fc1.weight is missing", "fc9.weight");
    free(bytes);
}

static void test_extra_tensor_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    const char *path = scratch_write("extra.ckpt", bytes, size);
    /* The file has the batch norm, the model does not. */
    expect_refused_by(path, 8, false, UMT_OPT_ADAM, UMT_ERR_FORMAT, "bn.weight", "model lacks");
    free(bytes);
}

static void test_shape_mismatch_names_tensor_and_both_shapes(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    const char *path = scratch_write("shape.ckpt", bytes, size);
    expect_refused_by(path, 6, true, UMT_OPT_ADAM, UMT_ERR_FORMAT, "fc1.weight is f32 [8,4] in the file",
                      "f32 [6,4] in the model");
    free(bytes);
}

static void test_dtype_mismatch_names_tensor_and_both_dtypes(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    /* fc1.weight's dtype follows its 10-byte name; i32 has f32's size, so only the dtype differs. */
    put_u32(bytes + FIRST_RECORD + 4 + 10, UMT_I32);
    reseal(bytes, size);
    expect_refused(scratch_write("dtype.ckpt", bytes, size), UMT_ERR_FORMAT, "fc1.weight is i32",
                   "f32 [8,4] in the model");
    free(bytes);
}

static void test_optimizer_given_but_absent_from_file_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(false, &size);
    expect_refused(scratch_write("no-state.ckpt", bytes, size), UMT_ERR_FORMAT, "no optimizer state",
                   "optimizer (adam) was given");
    free(bytes);
}

static void test_optimizer_of_another_kind_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    const char *path = scratch_write("other-kind.ckpt", bytes, size);
    expect_refused_by(path, 8, true, UMT_OPT_SGD, UMT_ERR_FORMAT, "holds adam optimizer state", "given is sgd");
    free(bytes);
}

static void test_tensor_count_past_the_file_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    put_u32(bytes + AT_PARAMETER_COUNT, 0xffffffffu);
    reseal(bytes, size);
    expect_refused(scratch_write("count.ckpt", bytes, size), UMT_ERR_FORMAT, "lists", "tensors");
    free(bytes);
}

static void test_name_running_past_the_data_is_refused(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_checkpoint(true, &size);
    put_u32(bytes + FIRST_RECORD, 4000);
    reseal(bytes, size);
    expect_refused(scratch_write("long-name.ckpt", bytes, size), UMT_ERR_FORMAT, "tensor record 0", "runs past");
    free(bytes);
}

static void test_missing_file_is_an_io_error_naming_it(void **state) {
    (void)state;
    expect_refused(scratch_path("absent.ckpt"), UMT_ERR_IO, "cannot open", strerror(ENOENT));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resumed_run_matches_uninterrupted_run_bit_for_bit),
        cmocka_unit_test(test_load_replaces_a_different_initialisation),
        cmocka_unit_test(test_checkpoint_with_optimizer_state_loads_into_model_alone),
        cmocka_unit_test(test_model_only_checkpoint_round_trips),
        cmocka_unit_test(test_a_save_inside_an_epoch_keeps_its_step_and_rng_and_an_epoch_end_is_version_1),
        cmocka_unit_test(test_nonfinite_values_are_never_saved_and_the_last_good_checkpoint_stays),
        cmocka_unit_test(test_saving_over_a_checkpoint_replaces_it_and_leaves_no_temporary_file),
        cmocka_unit_test(test_save_into_missing_directory_fails_naming_path_and_creates_nothing),
        cmocka_unit_test(test_check_writable_refuses_a_missing_folder_and_a_folder_and_leaves_nothing),
        cmocka_unit_test(test_failed_rename_removes_temporary_file_and_keeps_target),
        cmocka_unit_test(test_truncated_checkpoint_is_refused_at_every_cut),
        cmocka_unit_test(test_flipped_byte_is_a_checksum_mismatch),
        cmocka_unit_test(test_wrong_magic_is_refused),
        cmocka_unit_test(test_future_version_is_refused_naming_both_versions),
        cmocka_unit_test(test_renamed_tensor_is_reported_missing_and_extra),
        cmocka_unit_test(test_extra_tensor_is_refused),
        cmocka_unit_test(test_shape_mismatch_names_tensor_and_both_shapes),
        cmocka_unit_test(test_dtype_mismatch_names_tensor_and_both_dtypes),
        cmocka_unit_test(test_optimizer_given_but_absent_from_file_is_refused),
        cmocka_unit_test(test_optimizer_of_another_kind_is_refused),
        cmocka_unit_test(test_tensor_count_past_the_file_is_refused),
        cmocka_unit_test(test_name_running_past_the_data_is_refused),
        cmocka_unit_test(test_missing_file_is_an_io_error_naming_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
