/*
 * core/checkpoint/format.h — the checkpoint file's layout (docs/CHECKPOINT.md) and the view of
 * the model that both halves share: core/checkpoint/save.c writes files, core/checkpoint/load.c
 * reads them.
 *
 * A file is a fixed header, then tensor records in three sections (parameters, buffers,
 * optimizer state), then a CRC-32 of everything before it; all fields little-endian. Version 1's
 * header is written at an epoch's end (as every build before version 2 wrote it); version 2's adds
 * the step inside the epoch and the RNG as it was at the epoch's start, for a save inside one.
 */
#ifndef UMT_CORE_CHECKPOINT_FORMAT_H
#define UMT_CORE_CHECKPOINT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

/* Tensor bytes go to the file as they lie in memory; the format says little-endian. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "umtrain checkpoints store tensor bytes as in memory, which the format defines as little-endian"
#endif

#define UMT_CKPT_MAGIC "UMTCKPT" /* with its terminating NUL: the file's first 8 bytes */
#define UMT_CKPT_MAGIC_BYTES 8
#define UMT_CKPT_VERSION_EPOCH_END 1u
#define UMT_CKPT_VERSION_MID_EPOCH 2u

/* Header field offsets; version 2 appends two fields to version 1's header. */
enum {
    UMT_CKPT_AT_MAGIC = 0,
    UMT_CKPT_AT_VERSION = 8,
    UMT_CKPT_AT_FILE_BYTES = 12,
    UMT_CKPT_AT_EPOCH = 20,
    UMT_CKPT_AT_STEP = 28,
    UMT_CKPT_AT_OPTIMIZER = 36,
    UMT_CKPT_AT_OPTIMIZER_STEPS = 40,
    UMT_CKPT_AT_RNG = 48,
    UMT_CKPT_AT_COUNTS = 80,
    UMT_CKPT_HEADER_BYTES = 92,
    UMT_CKPT_AT_EPOCH_STEP = 92,
    UMT_CKPT_AT_EPOCH_RNG = 100,
    UMT_CKPT_HEADER_V2_BYTES = 132
};
#define UMT_CKPT_CRC_BYTES 4
/* The optimizer field holds 1 + umt_optimizer_kind, or 0 for a checkpoint without one. */
#define UMT_CKPT_NO_OPTIMIZER 0u
#define UMT_CKPT_OPTIMIZER_CODES 4u

/* Loading reads the whole file into host memory: past this, something is wrong with it. */
#define UMT_CKPT_MAX_FILE_BYTES ((uint64_t)16 << 30)
#define UMT_CKPT_MAX_NAME_BYTES 4096
/* Room for a name and a state suffix, so that a longer name is seen (and refused) whole. */
#define UMT_CKPT_NAME_SIZE (UMT_CKPT_MAX_NAME_BYTES + 16)
/* A name as a message prints it: escaped (core/base/escape.h), cut with "..." past this. */
#define UMT_CKPT_NAME_TEXT_SIZE 160
/* The epoch, the step and the optimizer's step count are within 0..2^53: exact as doubles, and
 * far enough from INT64_MAX that a program counting on from them cannot overflow. */
#define UMT_CKPT_MAX_COUNT ((int64_t)1 << 53)
/* A record with an empty name, no dimensions and no bytes: name length, dtype, ndim, byte count. */
#define UMT_CKPT_MIN_RECORD_BYTES 20

/* The three runs of tensors in a file, in this order. */
enum { UMT_CKPT_PARAMETERS, UMT_CKPT_BUFFERS, UMT_CKPT_STATE, UMT_CKPT_SECTIONS };

/* "parameter", "buffer", "optimizer state". */
const char *umt_ckpt_section_name(int section);
/* How many tensors a checkpoint of (ctx, opt) holds in a section (opt may be NULL: no state). */
int umt_ckpt_model_count(const umt_context *ctx, const umt_optimizer *opt, int section);
/* Tensor i of a section; its checkpoint name goes to name[UMT_CKPT_NAME_SIZE]: a parameter's or
 * buffer's own name, "<parameter>/<state index>" for optimizer state. *name_bytes (if not NULL)
 * gets the name's whole length, which may pass what name holds. */
umt_tensor *umt_ckpt_model_tensor(const umt_context *ctx, const umt_optimizer *opt, int section, int i, char *name,
                                  size_t *name_bytes);
/* The name as a message prints it, into text[UMT_CKPT_NAME_TEXT_SIZE]. */
const char *umt_ckpt_name_text(const char *name, size_t name_bytes, char *text);
/* status naming path, field and value unless 0 <= value <= UMT_CKPT_MAX_COUNT. */
umt_status umt_ckpt_check_count(umt_status status, const char *path, const char *field, int64_t value);
/* "[8,4]", for messages. */
const char *umt_ckpt_shape_text(int ndim, const int64_t *shape, char *buf, size_t size);
/* ctx and path present, the path not empty, and opt (if any) made from ctx; what names the caller. */
umt_status umt_ckpt_check_arguments(const char *what, const umt_context *ctx, const umt_optimizer *opt,
                                    const char *path);
/* The header's length in a file of this version (1 or 2). */
size_t umt_ckpt_header_bytes(uint32_t version);
/* The first of count little-endian f32 values at bytes (any alignment) that is NaN or infinite,
 * or -1; *what gets "nan", "inf" or "-inf". What load refuses and save does not write. */
int64_t umt_ckpt_first_nonfinite(const uint8_t *bytes, uint64_t count, const char **what);
/* zlib's crc32 continued over n bytes (any n). */
uint32_t umt_ckpt_crc(uint32_t crc, const void *bytes, size_t n);

#endif /* UMT_CORE_CHECKPOINT_FORMAT_H */
