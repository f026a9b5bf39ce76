/*
 * tests/fuzz/fuzz_checkpoint.c — fuzz target: loading a checkpoint (core/checkpoint/load.c).
 *
 * The model is small and holds every kind of state a checkpoint does: parameters (two linear
 * layers and a batch norm), buffers (the batch norm's running statistics), Adam's two moments
 * (set to random values, so that a stray write would show) and the RNG. Its checkpoint, saved
 * once at the start, is the "pristine" file.
 *
 * An input is one flag byte, then the file. When the flag's low bit is set, the file's length
 * field and trailing CRC-32 are rewritten to fit the bytes (when there is room for them), so that
 * mutations reach the record parser and the model matching behind the checksum; when it is
 * clear, the file goes as it is, and the envelope checks are what is tested.
 *
 * The rules, from include/umtrain.h and core/checkpoint/load.c: a refused file leaves the model,
 * the optimizer and the RNG as they were (every byte of them compared with a snapshot taken at
 * the start; saving them again instead would cost a file sync per input), with a message that
 * names the file. An accepted file is followed by loading the pristine one, which must succeed
 * and give back the snapshot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/context.h"
#include "core/optim/optim.h"
#include "core/tensor.h"
#include "tests/fuzz/fuzz_target.h"
#include "umtrain.h"

const char *const fuzz_target_name = "checkpoint";
const bool fuzz_truncations_refused = true; /* the header gives the file's length */

/* Offsets of docs/CHECKPOINT.md: the header's file length, the header's size, the checksum. */
enum { AT_FILE_BYTES = 12, HEADER_BYTES = 92, CRC_BYTES = 4 };
enum { RESEAL = 1 };

typedef struct {
    umt_context *ctx;
    umt_optimizer *opt;
    const char *input_path, *pristine_path;
    uint8_t *pristine; /* the pristine checkpoint file */
    size_t pristine_bytes;
    uint8_t *snapshot, *now; /* every byte a checkpoint restores: at the start, and now */
    size_t snapshot_bytes;
} harness;

static const umt_checkpoint_info saved_info = {.epoch = 3, .step = 5};

static void require_ok(umt_status status, const char *what) {
    FUZZ_REQUIRE(status == UMT_OK, "%s: %s", what, umt_status_name(status));
}

/* The tensors a checkpoint restores, in one order: parameters, buffers, optimizer state. */
static int tensor_count(const harness *h) {
    return umt_parameter_count(h->ctx) + umt_buffer_count(h->ctx) + umt_optimizer_state_count(h->opt);
}

static const umt_tensor *tensor_at(const harness *h, int i) {
    int parameters = umt_parameter_count(h->ctx), buffers = umt_buffer_count(h->ctx);
    if (i < parameters) return umt_parameter_at(h->ctx, i);
    if (i < parameters + buffers) return umt_buffer_at(h->ctx, i - parameters);
    const char *param_name;
    int state_index;
    return umt_optimizer_state_at(h->opt, i - parameters - buffers, &param_name, &state_index);
}

/* Those tensors' bytes, the RNG and the optimizer's step count, one after another, into out. */
static size_t take_snapshot(const harness *h, uint8_t *out) {
    size_t at = 0;
    for (int i = 0; i < tensor_count(h); ++i) {
        const umt_tensor *t = tensor_at(h, i);
        if (out) require_ok(umt_tensor_copy_to_host(t, out + at, t->bytes), "umt_tensor_copy_to_host");
        at += t->bytes;
    }
    int64_t steps = umt_optimizer_steps(h->opt);
    if (out) memcpy(out + at, h->ctx->rng.s, sizeof h->ctx->rng.s);
    if (out) memcpy(out + at + sizeof h->ctx->rng.s, &steps, sizeof steps);
    return at + sizeof h->ctx->rng.s + sizeof steps;
}

/* fc1 [8,4] -> batch norm [8] -> fc2 [3,8], Adam with random moments, and its checkpoint. */
static void build(harness *h) {
    umt_context_options options = umt_context_defaults();
    options.device = UMT_DEVICE_CPU;
    options.seed = 11;
    require_ok(umt_context_create(&options, &h->ctx), "umt_context_create");
    FUZZ_REQUIRE(umt_linear_layer_new(h->ctx, "fc1", 4, 8, true) != NULL, "fc1");
    FUZZ_REQUIRE(umt_batchnorm_layer_new(h->ctx, "bn", 8) != NULL, "bn");
    FUZZ_REQUIRE(umt_linear_layer_new(h->ctx, "fc2", 8, 3, true) != NULL, "fc2");
    umt_optimizer_options o = umt_optimizer_defaults(UMT_OPT_ADAM);
    require_ok(umt_optimizer_create(h->ctx, &o, &h->opt), "umt_optimizer_create");
    for (int i = 0, state_index; i < umt_optimizer_state_count(h->opt); ++i) {
        const char *param_name;
        umt_tensor *state = umt_optimizer_state_at(h->opt, i, &param_name, &state_index);
        require_ok(umt_tensor_uniform(h->ctx, state, 0.0f, 1.0f), param_name);
    }
    h->input_path = fuzz_scratch_path();
    h->pristine_path = fuzz_scratch_path();
    require_ok(umt_checkpoint_save(h->ctx, h->opt, &saved_info, h->pristine_path), "saving the pristine checkpoint");
    h->pristine = fuzz_read_file(h->pristine_path, &h->pristine_bytes);
    h->snapshot_bytes = take_snapshot(h, NULL);
    h->snapshot = malloc(h->snapshot_bytes);
    h->now = malloc(h->snapshot_bytes);
    FUZZ_REQUIRE(h->snapshot && h->now, "no memory for two snapshots of %zu bytes", h->snapshot_bytes);
    take_snapshot(h, h->snapshot);
}

static harness *the_harness(void) {
    static harness h;
    if (!h.ctx) build(&h);
    return &h;
}

static void put_le(uint8_t *at, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) at[i] = (uint8_t)(value >> (8 * i));
}

static void require_pristine_state(harness *h, const char *after) {
    take_snapshot(h, h->now);
    FUZZ_REQUIRE(memcmp(h->now, h->snapshot, h->snapshot_bytes) == 0, "the model, optimizer or RNG changed after %s",
                 after);
}

bool fuzz_one(const uint8_t *data, size_t size) {
    harness *h = the_harness();
    bool reseal = size > 0 && (data[0] & RESEAL);
    size_t file_bytes = size > 0 ? size - 1 : 0;
    uint8_t *file = malloc(file_bytes ? file_bytes : 1);
    FUZZ_REQUIRE(file != NULL, "no memory for %zu bytes", file_bytes);
    if (file_bytes) memcpy(file, data + 1, file_bytes);
    if (reseal && file_bytes >= HEADER_BYTES + CRC_BYTES) {
        put_le(file + AT_FILE_BYTES, file_bytes, 8);
        put_le(file + file_bytes - CRC_BYTES, crc32(0L, file, (uInt)(file_bytes - CRC_BYTES)), CRC_BYTES);
    }
    fuzz_write_file(h->input_path, file, file_bytes);
    free(file);

    umt_checkpoint_info info;
    umt_status status = umt_checkpoint_load(h->ctx, h->opt, &info, h->input_path);
    if (status != UMT_OK) {
        FUZZ_REQUIRE(strstr(umt_last_error(), h->input_path) != NULL, "the message does not name the file");
        require_pristine_state(h, "a refused load");
        return false;
    }
    require_ok(umt_checkpoint_load(h->ctx, h->opt, &info, h->pristine_path), "loading the pristine checkpoint back");
    require_pristine_state(h, "loading the pristine checkpoint back");
    return true;
}

/* ----------------------------------------------------------------------------------------- */
/* Seeds: the pristine checkpoint, with the flag byte clear and set */

int fuzz_write_seeds(const char *dir) {
    harness *h = the_harness();
    uint8_t *seed = malloc(h->pristine_bytes + 1);
    FUZZ_REQUIRE(seed != NULL, "no memory for the seed");
    memcpy(seed + 1, h->pristine, h->pristine_bytes);
    char path[4096];
    for (int flag = 0; flag <= RESEAL; ++flag) {
        seed[0] = (uint8_t)flag;
        snprintf(path, sizeof path, "%s/seed-%d", dir, flag);
        fuzz_write_file(path, seed, h->pristine_bytes + 1);
    }
    free(seed);
    return RESEAL + 1;
}
