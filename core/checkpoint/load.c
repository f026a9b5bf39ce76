/*
 * core/checkpoint/load.c — loading a checkpoint (format: core/checkpoint/format.h,
 * docs/CHECKPOINT.md).
 *
 * The file is read whole and nothing in it is trusted: magic, version, length and checksum
 * first, then every tensor record is parsed with bounds checks (nothing is allocated from a
 * count before it is checked against the bytes present), then matched by name against the
 * model, and only when everything agrees is anything copied in. A bad checkpoint therefore
 * leaves the model, the optimizer and the RNG as they were. A file of NaN or infinite values
 * (the last save of a diverged run) counts as bad unless the caller asks for it (forensics), and
 * the names it holds reach messages only escaped (core/base/escape.h).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/escape.h"
#include "core/base/file.h"
#include "core/checkpoint/format.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/tensor.h"

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Magic, version, length and checksum: what must hold before any other field is believed. */
static umt_status check_envelope(const char *path, const uint8_t *file, size_t size) {
    if (size >= UMT_CKPT_MAGIC_BYTES && memcmp(file + UMT_CKPT_AT_MAGIC, UMT_CKPT_MAGIC, UMT_CKPT_MAGIC_BYTES) != 0)
        return umt_fail(UMT_ERR_FORMAT, "%s: not an umtrain checkpoint (bad magic: expected \"UMTCKPT\\0\")", path);
    uint32_t version = size >= UMT_CKPT_AT_VERSION + 4 ? le32(file + UMT_CKPT_AT_VERSION) : UMT_CKPT_VERSION_EPOCH_END;
    if (version != UMT_CKPT_VERSION_EPOCH_END && version != UMT_CKPT_VERSION_MID_EPOCH)
        return umt_fail(UMT_ERR_FORMAT, "%s: checkpoint format version %u; this build reads versions %u and %u", path,
                        version, UMT_CKPT_VERSION_EPOCH_END, UMT_CKPT_VERSION_MID_EPOCH);
    size_t header = umt_ckpt_header_bytes(version);
    if (size < header + UMT_CKPT_CRC_BYTES)
        return umt_fail(UMT_ERR_FORMAT,
                        "%s: truncated: the file is %zu bytes, less than the %zu-byte header and %d-byte checksum",
                        path, size, header, UMT_CKPT_CRC_BYTES);
    uint64_t declared = le64(file + UMT_CKPT_AT_FILE_BYTES);
    if (declared != size)
        return umt_fail(UMT_ERR_FORMAT, "%s: %s: the file is %zu bytes, its header says %llu", path,
                        declared > size ? "truncated" : "trailing bytes", size, (unsigned long long)declared);
    uint32_t stored = le32(file + size - UMT_CKPT_CRC_BYTES);
    uint32_t computed = umt_ckpt_crc(0, file, size - UMT_CKPT_CRC_BYTES);
    if (stored != computed)
        return umt_fail(UMT_ERR_FORMAT, "%s: checksum mismatch: file says 0x%08x, contents give 0x%08x", path, stored,
                        computed);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Loading: the tensor records */

typedef struct {
    const char *name; /* in the file's buffer, not NUL-terminated */
    uint32_t name_bytes;
    umt_dtype dtype;
    int ndim;
    int64_t shape[UMT_MAX_DIMS];
    const uint8_t *data;
    uint64_t bytes;
    bool used; /* matched to a tensor of the model */
} record;

typedef struct {
    uint32_t version;
    umt_checkpoint_info info;
    uint32_t optimizer; /* UMT_CKPT_NO_OPTIMIZER or 1 + umt_optimizer_kind */
    int64_t optimizer_steps;
    uint64_t rng[4];
    uint32_t count[UMT_CKPT_SECTIONS];
    record *records; /* the sections one after another, as in the file */
} checkpoint;

typedef struct {
    const char *path;
    const uint8_t *file;
    size_t end;     /* where the records must stop: the checksum */
    size_t offset;  /* the next byte to parse */
    uint64_t index; /* the record being parsed and its first byte, for messages */
    size_t start;
} reader;

/* The next n bytes, or NULL if they run past the records' end. */
static const uint8_t *take(reader *r, uint64_t n) {
    if (n > r->end - r->offset) return NULL;
    const uint8_t *p = r->file + r->offset;
    r->offset += (size_t)n;
    return p;
}

static umt_status record_error(const reader *r, const record *rec, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A problem of the record being parsed; rec (NULL before its name is read) puts its name first. */
static umt_status record_error(const reader *r, const record *rec, const char *fmt, ...) {
    char problem[512], name[UMT_CKPT_NAME_TEXT_SIZE + 2] = "";
    va_list args;
    va_start(args, fmt);
    vsnprintf(problem, sizeof problem, fmt, args);
    va_end(args);
    if (rec) {
        umt_ckpt_name_text(rec->name, rec->name_bytes, name);
        strcat(name, ": ");
    }
    return umt_fail(UMT_ERR_FORMAT, "%s: tensor record %llu at byte %zu: %s%s", r->path, (unsigned long long)r->index,
                    r->start, name, problem);
}

/* Dimensions from p; their product is kept at most the file's length, which no real tensor
 * passes (each element takes at least a byte), so it cannot overflow. */
static umt_status parse_shape(reader *r, record *rec, const uint8_t *p, int64_t *numel) {
    *numel = 1;
    for (int d = 0; d < rec->ndim; ++d) {
        int64_t dim = (int64_t)le64(p + 8 * d);
        if (dim < 0) return record_error(r, rec, "dimension %d is %lld", d, (long long)dim);
        if (dim && *numel > (int64_t)r->end / dim) return record_error(r, rec, "more elements than the file has bytes");
        rec->shape[d] = dim;
        *numel *= dim;
    }
    return UMT_OK;
}

static umt_status parse_record(reader *r, record *rec) {
    const uint8_t *p = take(r, 4);
    if (p && (rec->name_bytes = le32(p)) > UMT_CKPT_MAX_NAME_BYTES)
        return record_error(r, NULL, "a name of %u bytes (at most %d)", rec->name_bytes, UMT_CKPT_MAX_NAME_BYTES);
    if (!p || !(rec->name = (const char *)take(r, rec->name_bytes)) || !(p = take(r, 8)))
        return record_error(r, NULL, "the name, dtype or rank runs past the end of the tensor data");
    uint32_t dtype = le32(p), ndim = le32(p + 4);
    if (dtype >= UMT_DTYPE_COUNT || ndim > UMT_MAX_DIMS)
        return record_error(r, rec, "dtype %u and rank %u (expected dtype < %d, rank <= %d)", dtype, ndim,
                            UMT_DTYPE_COUNT, UMT_MAX_DIMS);
    rec->dtype = (umt_dtype)dtype;
    rec->ndim = (int)ndim;
    if (!(p = take(r, 8 * (uint64_t)ndim + 8)))
        return record_error(r, rec, "the shape runs past the end of the tensor data");
    int64_t numel;
    UMT_TRY(parse_shape(r, rec, p, &numel));
    rec->bytes = le64(p + 8 * ndim);
    uint64_t expected = (uint64_t)numel * umt_dtype_size(rec->dtype);
    if (rec->bytes != expected) {
        char shape[96];
        return record_error(r, rec, "%llu bytes, but %s %s takes %llu", (unsigned long long)rec->bytes,
                            umt_dtype_name(rec->dtype), umt_ckpt_shape_text(rec->ndim, rec->shape, shape, sizeof shape),
                            (unsigned long long)expected);
    }
    if (!(rec->data = take(r, rec->bytes)))
        return record_error(r, rec, "its %llu bytes run past the end of the tensor data",
                            (unsigned long long)rec->bytes);
    return UMT_OK;
}

/* Version 2's fields: the step inside the epoch, and the RNG at the epoch's start (not zeros when
 * the step is not 0: a generator from zeros draws only zeros). */
static umt_status parse_mid_epoch(const char *path, const uint8_t *file, checkpoint *ck) {
    ck->info.epoch_step = (int64_t)le64(file + UMT_CKPT_AT_EPOCH_STEP);
    uint64_t rng_bits = 0;
    for (int i = 0; i < 4; ++i) rng_bits |= ck->info.epoch_rng.s[i] = le64(file + UMT_CKPT_AT_EPOCH_RNG + 8 * i);
    UMT_TRY(umt_ckpt_check_count(UMT_ERR_FORMAT, path, "step inside the epoch", ck->info.epoch_step));
    if (ck->info.epoch_step && rng_bits == 0)
        return umt_fail(UMT_ERR_FORMAT, "%s: the RNG state at the epoch's start is all zeros", path);
    return UMT_OK;
}

/* The header's fields, each checked for what it may hold. */
static umt_status parse_header(const char *path, const uint8_t *file, checkpoint *ck) {
    ck->info = (umt_checkpoint_info){.epoch = (int64_t)le64(file + UMT_CKPT_AT_EPOCH),
                                     .step = (int64_t)le64(file + UMT_CKPT_AT_STEP)};
    ck->optimizer = le32(file + UMT_CKPT_AT_OPTIMIZER);
    ck->optimizer_steps = (int64_t)le64(file + UMT_CKPT_AT_OPTIMIZER_STEPS);
    uint64_t rng_bits = 0;
    for (int i = 0; i < 4; ++i) rng_bits |= ck->rng[i] = le64(file + UMT_CKPT_AT_RNG + 8 * i);
    for (int s = 0; s < UMT_CKPT_SECTIONS; ++s) ck->count[s] = le32(file + UMT_CKPT_AT_COUNTS + 4 * s);
    if (ck->optimizer > UMT_CKPT_OPTIMIZER_CODES)
        return umt_fail(UMT_ERR_FORMAT, "%s: optimizer code %u (expected 0 for none or 1..%u)", path, ck->optimizer,
                        UMT_CKPT_OPTIMIZER_CODES);
    UMT_TRY(umt_ckpt_check_count(UMT_ERR_FORMAT, path, "epoch", ck->info.epoch));
    UMT_TRY(umt_ckpt_check_count(UMT_ERR_FORMAT, path, "step", ck->info.step));
    UMT_TRY(umt_ckpt_check_count(UMT_ERR_FORMAT, path, "optimizer step count", ck->optimizer_steps));
    if (ck->optimizer == UMT_CKPT_NO_OPTIMIZER && ck->count[UMT_CKPT_STATE] != 0)
        return umt_fail(UMT_ERR_FORMAT, "%s: %u optimizer state tensors but no optimizer", path,
                        ck->count[UMT_CKPT_STATE]);
    /* xoshiro's one forbidden state: it would draw zeros for ever. */
    if (rng_bits == 0) return umt_fail(UMT_ERR_FORMAT, "%s: the RNG state is all zeros", path);
    return ck->version == UMT_CKPT_VERSION_MID_EPOCH ? parse_mid_epoch(path, file, ck) : UMT_OK;
}

static umt_status parse(const char *path, const uint8_t *file, size_t size, checkpoint *ck) {
    ck->version = le32(file + UMT_CKPT_AT_VERSION);
    UMT_TRY(parse_header(path, file, ck));
    reader r = {.path = path, .file = file, .end = size - UMT_CKPT_CRC_BYTES,
                .offset = umt_ckpt_header_bytes(ck->version)};
    uint64_t total = (uint64_t)ck->count[0] + ck->count[1] + ck->count[2];
    /* Checked against the bytes present before anything is allocated from it. */
    if (total > (r.end - r.offset) / UMT_CKPT_MIN_RECORD_BYTES)
        return umt_fail(UMT_ERR_FORMAT, "%s: the header lists %llu tensors; %zu bytes of tensor data hold at most %zu",
                        path, (unsigned long long)total, r.end - r.offset,
                        (r.end - r.offset) / UMT_CKPT_MIN_RECORD_BYTES);
    ck->records = calloc(total ? (size_t)total : 1, sizeof *ck->records);
    if (!ck->records)
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for %llu tensor records", path,
                        (unsigned long long)total);
    for (r.index = 0; r.index < total; ++r.index) {
        r.start = r.offset;
        UMT_TRY(parse_record(&r, &ck->records[r.index]));
    }
    if (r.offset != r.end)
        return umt_fail(UMT_ERR_FORMAT, "%s: %zu unexplained bytes between the last tensor and the checksum", path,
                        r.end - r.offset);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Loading: matching the file to the model, then copying it in */

static bool same_name(const record *rec, const char *name) {
    return strlen(name) == rec->name_bytes && memcmp(rec->name, name, rec->name_bytes) == 0;
}

static umt_status check_layout(const char *path, int section, const char *name, const record *rec,
                               const umt_tensor *t) {
    if (rec->dtype == t->dtype && rec->ndim == t->ndim &&
        memcmp(rec->shape, t->shape, (size_t)t->ndim * sizeof *t->shape) == 0)
        return UMT_OK;
    char in_file[96], in_model[96], text[UMT_CKPT_NAME_TEXT_SIZE];
    return umt_fail(UMT_ERR_FORMAT, "%s: %s %s is %s %s in the file but %s %s in the model", path,
                    umt_ckpt_section_name(section), umt_ckpt_name_text(name, strlen(name), text),
                    umt_dtype_name(rec->dtype), umt_ckpt_shape_text(rec->ndim, rec->shape, in_file, sizeof in_file),
                    umt_dtype_name(t->dtype), umt_ckpt_shape_text(t->ndim, t->shape, in_model, sizeof in_model));
}

/* A section's tensor the model has and the file lacks, one the file has and the model lacks. */
static umt_status mismatch_error(const char *path, int section, const char *missing, const record *extra) {
    const char *kind = umt_ckpt_section_name(section);
    char missing_text[UMT_CKPT_NAME_TEXT_SIZE], extra_text[UMT_CKPT_NAME_TEXT_SIZE];
    if (missing) umt_ckpt_name_text(missing, strlen(missing), missing_text);
    if (extra) umt_ckpt_name_text(extra->name, extra->name_bytes, extra_text);
    if (missing && extra)
        return umt_fail(UMT_ERR_FORMAT, "%s: %s %s is missing from the file, which has %s %s that the model lacks",
                        path, kind, missing_text, kind, extra_text);
    if (missing) return umt_fail(UMT_ERR_FORMAT, "%s: %s %s is missing from the file", path, kind, missing_text);
    return umt_fail(UMT_ERR_FORMAT, "%s: the file has %s %s, which the model lacks (extra tensor)", path, kind,
                    extra_text);
}

/* The record of each model tensor of a section into match[]: every one present exactly once
 * with its dtype and shape, and no record left over. */
static umt_status match_section(const umt_context *ctx, const umt_optimizer *opt, const char *path, int section,
                                record *records, uint32_t record_count, const record **match) {
    char name[UMT_CKPT_NAME_SIZE], missing[UMT_CKPT_NAME_SIZE], text[UMT_CKPT_NAME_TEXT_SIZE];
    bool any_missing = false;
    int count = umt_ckpt_model_count(ctx, opt, section);
    for (int i = 0; i < count; ++i) {
        const umt_tensor *t = umt_ckpt_model_tensor(ctx, opt, section, i, name, NULL);
        record *found = NULL;
        for (uint32_t j = 0; j < record_count; ++j) {
            if (!same_name(&records[j], name)) continue;
            if (found || records[j].used)
                return umt_fail(UMT_ERR_FORMAT, "%s: %s %s appears twice in the %s", path,
                                umt_ckpt_section_name(section), umt_ckpt_name_text(name, strlen(name), text),
                                found ? "file" : "model");
            found = &records[j];
        }
        if (!found && !any_missing) memcpy(missing, name, sizeof missing);
        any_missing = any_missing || !found;
        if (!found) continue;
        UMT_TRY(check_layout(path, section, name, found, t));
        found->used = true;
        match[i] = found;
    }
    const record *extra = NULL;
    for (uint32_t j = 0; j < record_count && !extra; ++j)
        if (!records[j].used) extra = &records[j];
    return any_missing || extra ? mismatch_error(path, section, any_missing ? missing : NULL, extra) : UMT_OK;
}

static umt_status check_optimizer(const char *path, const umt_optimizer *opt, const checkpoint *ck) {
    const char *given = umt_optimizer_kind_name(umt_optimizer_kind_of(opt));
    if (ck->optimizer == UMT_CKPT_NO_OPTIMIZER)
        return umt_fail(UMT_ERR_FORMAT,
                        "%s: the file holds no optimizer state (saved without an optimizer), "
                        "but an optimizer (%s) was given to load it into",
                        path, given);
    umt_optimizer_kind saved = (umt_optimizer_kind)(ck->optimizer - 1);
    if (saved != umt_optimizer_kind_of(opt))
        return umt_fail(UMT_ERR_FORMAT, "%s: the file holds %s optimizer state, the optimizer given is %s", path,
                        umt_optimizer_kind_name(saved), given);
    return UMT_OK;
}

/* Without an optimizer the file's optimizer section is skipped: a model-only load. */
static umt_status match_model(const umt_context *ctx, const umt_optimizer *opt, const char *path, checkpoint *ck,
                              const record **match) {
    if (opt) UMT_TRY(check_optimizer(path, opt, ck));
    record *records = ck->records;
    for (int s = 0; s < UMT_CKPT_SECTIONS && (opt || s != UMT_CKPT_STATE); ++s) {
        UMT_TRY(match_section(ctx, opt, path, s, records, ck->count[s], match));
        records += ck->count[s];
        match += umt_ckpt_model_count(ctx, opt, s);
    }
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Loading: non-finite values */

/* The record's first element that is NaN or infinite, or -1; *what gets "nan", "inf" or "-inf".
 * Records matched to the model are f32, as every parameter, buffer and optimizer state is (the
 * data is not aligned for floats in the file: umt_ckpt_first_nonfinite reads bytes). */
static int64_t first_nonfinite(const record *rec, const char **what) {
    return rec->dtype == UMT_F32 ? umt_ckpt_first_nonfinite(rec->data, rec->bytes / 4, what) : -1;
}

/* Every tensor to be loaded holds finite values only: a NaN weight would make every output NaN
 * and still print as an answer. */
static umt_status check_finite(const umt_context *ctx, const umt_optimizer *opt, const char *path,
                               const record *const *match) {
    char name[UMT_CKPT_NAME_SIZE], text[UMT_CKPT_NAME_TEXT_SIZE];
    for (int s = 0; s < UMT_CKPT_SECTIONS && (opt || s != UMT_CKPT_STATE); ++s)
        for (int i = 0, count = umt_ckpt_model_count(ctx, opt, s); i < count; ++i, ++match) {
            const char *what;
            int64_t at = first_nonfinite(*match, &what);
            if (at < 0) continue;
            umt_ckpt_model_tensor(ctx, opt, s, i, name, NULL);
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: %s %s: element %lld is %s (expected finite values; to look into a diverged "
                            "run's file anyway, load it with allow_nonfinite)",
                            path, umt_ckpt_section_name(s), umt_ckpt_name_text(name, strlen(name), text),
                            (long long)at, what);
        }
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Loading: copying in */

static umt_status apply(umt_context *ctx, umt_optimizer *opt, const char *path, const checkpoint *ck,
                        const record *const *match) {
    char name[UMT_CKPT_NAME_SIZE], text[UMT_CKPT_NAME_TEXT_SIZE];
    for (int s = 0; s < UMT_CKPT_SECTIONS && (opt || s != UMT_CKPT_STATE); ++s)
        for (int i = 0, count = umt_ckpt_model_count(ctx, opt, s); i < count; ++i, ++match) {
            umt_tensor *t = umt_ckpt_model_tensor(ctx, opt, s, i, name, NULL);
            if (umt_tensor_copy_from_host(t, (*match)->data, (*match)->bytes) != UMT_OK)
                return umt_fail(umt_last_status(), "%s: writing %s %s: %s", path, umt_ckpt_section_name(s),
                                umt_ckpt_name_text(name, strlen(name), text), umt_last_error());
        }
    memcpy(ctx->rng.s, ck->rng, sizeof ck->rng);
    if (opt) UMT_TRY(umt_optimizer_set_steps(opt, ck->optimizer_steps));
    return UMT_OK;
}

static umt_status load(const char *function, umt_context *ctx, umt_optimizer *opt, umt_checkpoint_info *info,
                       const char *path, const umt_checkpoint_load_options *options) {
    UMT_TRY(umt_ckpt_check_arguments(function, ctx, opt, path));
    uint8_t *file;
    size_t size;
    UMT_TRY(umt_file_read_regular(path, "a checkpoint", UMT_CKPT_MAX_FILE_BYTES, &file, &size));
    size_t expected = 0;
    for (int s = 0; s < UMT_CKPT_SECTIONS; ++s) expected += (size_t)umt_ckpt_model_count(ctx, opt, s);
    const record **match = calloc(expected ? expected : 1, sizeof *match);
    checkpoint ck = {.records = NULL};
    umt_status st = match ? check_envelope(path, file, size)
                          : umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory to match %zu tensors", path, expected);
    if (st == UMT_OK) st = parse(path, file, size, &ck);
    if (st == UMT_OK) st = match_model(ctx, opt, path, &ck, match);
    if (st == UMT_OK && !(options && options->allow_nonfinite)) st = check_finite(ctx, opt, path, match);
    if (st == UMT_OK) st = apply(ctx, opt, path, &ck, match);
    if (st == UMT_OK && info) *info = ck.info;
    free(ck.records);
    free(match);
    free(file);
    return st;
}

umt_status umt_checkpoint_load(umt_context *ctx, umt_optimizer *opt, umt_checkpoint_info *info, const char *path) {
    return load("umt_checkpoint_load", ctx, opt, info, path, NULL);
}

umt_status umt_checkpoint_load_with(umt_context *ctx, umt_optimizer *opt, umt_checkpoint_info *info, const char *path,
                                    const umt_checkpoint_load_options *options) {
    return load("umt_checkpoint_load_with", ctx, opt, info, path, options);
}
