/*
 * core/checkpoint/save.c — saving a whole training state in one file: parameters, buffers, optimizer
 * state and step count, the context's RNG and the caller's epoch and step. The layout is in
 * core/checkpoint/format.h and docs/CHECKPOINT.md; loading is core/checkpoint/load.c.
 *
 * Save streams the file into "<path>.tmp.<pid>", computing the CRC on the way, syncs it and
 * renames it over path, so a reader sees the old checkpoint or the new one, never half of one;
 * on any failure the temporary file is removed and path is left as it was. While the temporary
 * file exists SIGINT and SIGTERM are held off (core/base/signals.h), so that they cannot end the
 * process with the file still there: one that would end it stops the save first.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/base/error.h"
#include "core/base/escape.h"
#include "core/base/signals.h"
#include "core/checkpoint/format.h"
#include "core/context.h"
#include "core/optim/optim.h"
#include "core/tensor.h"

/* ----------------------------------------------------------------------------------------- */
/* The model's side: the tensors a checkpoint of (ctx, opt) holds, section by section */

const char *umt_ckpt_section_name(int section) {
    static const char *const names[UMT_CKPT_SECTIONS] = {"parameter", "buffer", "optimizer state"};
    return section >= 0 && section < UMT_CKPT_SECTIONS ? names[section] : "tensor";
}

int umt_ckpt_model_count(const umt_context *ctx, const umt_optimizer *opt, int section) {
    switch (section) {
    case UMT_CKPT_PARAMETERS: return umt_parameter_count(ctx);
    case UMT_CKPT_BUFFERS: return umt_buffer_count(ctx);
    default: return umt_optimizer_state_count(opt);
    }
}

umt_tensor *umt_ckpt_model_tensor(const umt_context *ctx, const umt_optimizer *opt, int section, int i, char *name,
                                  size_t *name_bytes) {
    umt_tensor *t;
    const char *base = NULL;
    int state = -1;
    switch (section) {
    case UMT_CKPT_PARAMETERS: t = umt_parameter_at(ctx, i); break;
    case UMT_CKPT_BUFFERS: t = umt_buffer_at(ctx, i); break;
    default: t = umt_optimizer_state_at(opt, i, &base, &state);
    }
    /* snprintf counts the whole name, also what does not fit. */
    int length = state < 0 ? snprintf(name, UMT_CKPT_NAME_SIZE, "%s", t->name ? t->name : "")
                           : snprintf(name, UMT_CKPT_NAME_SIZE, "%s/%d", base ? base : "", state);
    if (name_bytes) *name_bytes = (size_t)length;
    return t;
}

const char *umt_ckpt_name_text(const char *name, size_t name_bytes, char *text) {
    return umt_escape(name, name_bytes, text, UMT_CKPT_NAME_TEXT_SIZE);
}

umt_status umt_ckpt_check_count(umt_status status, const char *path, const char *field, int64_t value) {
    if (value >= 0 && value <= UMT_CKPT_MAX_COUNT) return UMT_OK;
    return umt_fail(status, "%s: %s %lld (expected 0..2^53)", path, field, (long long)value);
}

const char *umt_ckpt_shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && used < size; ++d)
        used += (size_t)snprintf(buf + used, size - used, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

umt_status umt_ckpt_check_arguments(const char *what, const umt_context *ctx, const umt_optimizer *opt,
                                    const char *path) {
    if (!ctx || !path) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", what, ctx ? "path" : "ctx");
    if (!*path)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: path is empty (expected a checkpoint's file name)", what);
    if (opt && umt_optimizer_context(opt) != ctx)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s: opt belongs to another context than ctx", what, path);
    return UMT_OK;
}

size_t umt_ckpt_header_bytes(uint32_t version) {
    return version == UMT_CKPT_VERSION_MID_EPOCH ? UMT_CKPT_HEADER_V2_BYTES : UMT_CKPT_HEADER_BYTES;
}

/* Read as bits: an exponent of all ones is NaN (mantissa not zero) or infinity. */
int64_t umt_ckpt_first_nonfinite(const uint8_t *bytes, uint64_t count, const char **what) {
    for (uint64_t i = 0; i < count; ++i) {
        const uint8_t *p = bytes + 4 * i;
        uint32_t bits = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if ((bits & 0x7f800000u) != 0x7f800000u) continue;
        *what = bits & 0x007fffffu ? "nan" : bits & 0x80000000u ? "-inf" : "inf";
        return (int64_t)i;
    }
    return -1;
}

uint32_t umt_ckpt_crc(uint32_t crc, const void *bytes, size_t n) {
    const Bytef *at = bytes;
    /* zlib takes an unsigned int length: feed it a GiB at a time. */
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, at, chunk);
        at += chunk;
        n -= chunk;
    }
    return crc;
}

/* ----------------------------------------------------------------------------------------- */
/* Saving */

typedef struct {
    FILE *file;
    uint32_t crc;
    int error;                  /* errno of the first failed write; later writes are skipped */
    const sigset_t *saved_mask; /* the signal mask the save restores when done */
    int signal;                 /* the SIGINT or SIGTERM that stopped the save, or 0 */
} writer;

/* Tensor data is written in pieces of this size, asking between them whether to stop: a save of
 * gigabytes still answers Ctrl-C within a piece. */
#define WRITE_PIECE_BYTES ((size_t)16 << 20)

static void put(writer *w, const void *bytes, size_t n) {
    if (w->error || n == 0) return;
    errno = 0;
    if (fwrite(bytes, 1, n, w->file) != n) {
        w->error = errno ? errno : EIO;
        return;
    }
    w->crc = umt_ckpt_crc(w->crc, bytes, n);
}

/* A pending SIGINT or SIGTERM that would end the process stops the save (see umt_checkpoint_save). */
static bool stop_requested(writer *w) {
    if (!w->error && (w->signal = umt_signals_stop_pending(w->saved_mask)) != 0) w->error = EINTR;
    return w->error != 0;
}

static void put_data(writer *w, const uint8_t *bytes, size_t n) {
    for (size_t done = 0, piece; done < n && !stop_requested(w); done += piece) {
        piece = n - done < WRITE_PIECE_BYTES ? n - done : WRITE_PIECE_BYTES;
        put(w, bytes + done, piece);
    }
}

static void put_u32(writer *w, uint32_t v) {
    uint8_t b[4];
    for (int i = 0; i < 4; ++i) b[i] = (uint8_t)(v >> (8 * i));
    put(w, b, sizeof b);
}

static void put_u64(writer *w, uint64_t v) {
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

typedef struct {
    uint32_t version; /* 1 at an epoch's end, 2 inside one */
    uint32_t count[UMT_CKPT_SECTIONS];
    uint64_t file_bytes;
    size_t max_tensor_bytes; /* the host bounce buffer tensors are read through */
} save_plan;

/* Two parameters (or buffers) of one name could not be told apart on load: refuse them now. */
static umt_status check_unique(const umt_context *ctx, int section, int i, const char *path) {
    char name[UMT_CKPT_NAME_SIZE], other[UMT_CKPT_NAME_SIZE], text[UMT_CKPT_NAME_TEXT_SIZE];
    umt_ckpt_model_tensor(ctx, NULL, section, i, name, NULL);
    for (int j = 0; j < i; ++j)
        if (strcmp(name, (umt_ckpt_model_tensor(ctx, NULL, section, j, other, NULL), other)) == 0)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: two %ss are named \"%s\" (checkpoints need unique names)",
                            path, umt_ckpt_section_name(section), umt_ckpt_name_text(name, strlen(name), text));
    return UMT_OK;
}

/* Counts, the file's length and the largest tensor, checking every name on the way. */
static umt_status plan_save(const umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                            const char *path, save_plan *plan) {
    uint32_t version = info && info->epoch_step ? UMT_CKPT_VERSION_MID_EPOCH : UMT_CKPT_VERSION_EPOCH_END;
    *plan = (save_plan){.version = version, .file_bytes = umt_ckpt_header_bytes(version) + UMT_CKPT_CRC_BYTES};
    char name[UMT_CKPT_NAME_SIZE], text[UMT_CKPT_NAME_TEXT_SIZE];
    for (int s = 0; s < UMT_CKPT_SECTIONS; ++s) {
        int count = umt_ckpt_model_count(ctx, opt, s);
        plan->count[s] = (uint32_t)count;
        for (int i = 0; i < count; ++i) {
            size_t name_bytes;
            const umt_tensor *t = umt_ckpt_model_tensor(ctx, opt, s, i, name, &name_bytes);
            /* name holds the first UMT_CKPT_NAME_SIZE - 1 bytes; name_bytes is the whole length. */
            if (name_bytes > UMT_CKPT_MAX_NAME_BYTES)
                return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s name \"%s\" is %zu bytes (at most %d)", path,
                                umt_ckpt_section_name(s), umt_escape(name, strlen(name), text, 48), name_bytes,
                                UMT_CKPT_MAX_NAME_BYTES);
            if (s != UMT_CKPT_STATE) UMT_TRY(check_unique(ctx, s, i, path));
            plan->file_bytes += UMT_CKPT_MIN_RECORD_BYTES + name_bytes + 8 * (uint64_t)t->ndim + t->bytes;
            if (t->bytes > plan->max_tensor_bytes) plan->max_tensor_bytes = t->bytes;
        }
    }
    if (plan->file_bytes > UMT_CKPT_MAX_FILE_BYTES)
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: the checkpoint would be %llu bytes, past the cap of %llu bytes", path,
                        (unsigned long long)plan->file_bytes, (unsigned long long)UMT_CKPT_MAX_FILE_BYTES);
    return UMT_OK;
}

static void write_header(writer *w, const umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                         const save_plan *plan) {
    put(w, UMT_CKPT_MAGIC, UMT_CKPT_MAGIC_BYTES);
    put_u32(w, plan->version);
    put_u64(w, plan->file_bytes);
    put_u64(w, (uint64_t)(info ? info->epoch : 0));
    put_u64(w, (uint64_t)(info ? info->step : 0));
    put_u32(w, opt ? 1u + (uint32_t)umt_optimizer_kind_of(opt) : UMT_CKPT_NO_OPTIMIZER);
    put_u64(w, (uint64_t)(opt ? umt_optimizer_steps(opt) : 0));
    for (int i = 0; i < 4; ++i) put_u64(w, ctx->rng.s[i]);
    for (int s = 0; s < UMT_CKPT_SECTIONS; ++s) put_u32(w, plan->count[s]);
    if (plan->version == UMT_CKPT_VERSION_EPOCH_END) return;
    put_u64(w, (uint64_t)info->epoch_step);
    for (int i = 0; i < 4; ++i) put_u64(w, info->epoch_rng.s[i]);
}

/* One record; the bytes come through scratch because the tensor may live on the GPU. A value load
 * would refuse (NaN or infinite) stops the save: the caller removes the temporary file, and the
 * checkpoint at path stays the last good one. */
static umt_status write_tensor(writer *w, int section, const umt_tensor *t, const char *name, void *scratch,
                               const char *path) {
    size_t name_bytes = strlen(name);
    char text[UMT_CKPT_NAME_TEXT_SIZE];
    if (umt_tensor_copy_to_host(t, scratch, t->bytes) != UMT_OK)
        return umt_fail(umt_last_status(), "%s: reading tensor %s: %s", path,
                        umt_ckpt_name_text(name, name_bytes, text), umt_last_error());
    const char *what;
    int64_t at = t->dtype == UMT_F32 ? umt_ckpt_first_nonfinite(scratch, t->bytes / 4, &what) : -1;
    if (at >= 0)
        return umt_fail(UMT_ERR_STATE, "%s: %s %s: element %lld is %s: a checkpoint of non-finite values is not "
                        "written (the file at %s is left as it was)", path, umt_ckpt_section_name(section),
                        umt_ckpt_name_text(name, name_bytes, text), (long long)at, what, path);
    put_u32(w, (uint32_t)name_bytes);
    put(w, name, name_bytes);
    put_u32(w, (uint32_t)t->dtype);
    put_u32(w, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; ++d) put_u64(w, (uint64_t)t->shape[d]);
    put_u64(w, t->bytes);
    put_data(w, scratch, t->bytes);
    return UMT_OK;
}

/* The whole checkpoint into tmp, synced to disk; the caller removes tmp on failure, and restores
 * saved_mask, the signal mask from before the save. */
static umt_status write_temp(const umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                             const save_plan *plan, void *scratch, const char *path, const char *tmp,
                             const sigset_t *saved_mask) {
    FILE *f = fopen(tmp, "wb");
    if (!f) return umt_fail(UMT_ERR_IO, "%s: cannot create the temporary file %s: %s", path, tmp, strerror(errno));
    writer w = {.file = f, .crc = 0, .saved_mask = saved_mask};
    write_header(&w, ctx, opt, info, plan);
    umt_status st = UMT_OK;
    char name[UMT_CKPT_NAME_SIZE];
    for (int s = 0; s < UMT_CKPT_SECTIONS && st == UMT_OK; ++s)
        for (uint32_t i = 0; i < plan->count[s] && st == UMT_OK; ++i)
            st = write_tensor(&w, s, umt_ckpt_model_tensor(ctx, opt, s, (int)i, name, NULL), name, scratch, path);
    if (st == UMT_OK) put_u32(&w, w.crc);
    /* Asked once more before the sync, which may take long on a slow disk. */
    if (st == UMT_OK && !stop_requested(&w) && (fflush(f) != 0 || fsync(fileno(f)) != 0)) w.error = errno;
    if (fclose(f) != 0 && !w.error) w.error = errno;
    if (st == UMT_OK && w.signal)
        st = umt_fail(UMT_ERR_IO, "%s: save stopped by %s; the temporary file %s is removed, %s is as it was", path,
                      umt_signal_name(w.signal), tmp, path);
    else if (st == UMT_OK && w.error)
        st = umt_fail(UMT_ERR_IO, "%s: cannot write the temporary file %s: %s", path, tmp, strerror(w.error));
    return st;
}

/* The rename is an entry of path's directory: syncing the directory makes it survive a crash. */
static umt_status sync_directory(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for the directory's name", path);
    int fd = open(dir, O_RDONLY);
    int err = fd < 0 || fsync(fd) != 0 ? errno : 0;
    if (fd >= 0) close(fd);
    umt_status st = UMT_OK;
    /* EINVAL: the file system cannot sync a directory; its renames are as durable as it gets. */
    if (err && err != EINVAL)
        st = umt_fail(UMT_ERR_IO, "%s: written, but syncing its directory %s failed: %s", path, dir, strerror(err));
    free(dir);
    return st;
}

/* "<path>.tmp.<pid>", malloc'ed (NULL without memory): the file a save writes before the rename. */
static char *temporary_name(const char *path) {
    size_t size = strlen(path) + 32;
    char *tmp = malloc(size);
    if (tmp) snprintf(tmp, size, "%s.tmp.%ld", path, (long)getpid());
    return tmp;
}

umt_status umt_checkpoint_check_writable(const char *path) {
    if (!path || !*path)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_checkpoint_check_writable: path is %s",
                        path ? "empty (expected a checkpoint's file name)" : "NULL");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return umt_fail(UMT_ERR_IO, "%s: is a folder, expected the path of a checkpoint file", path);
    char *tmp = temporary_name(path);
    if (!tmp) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for the temporary file's name", path);
    /* Exclusive: a file of that name (another save by this pid) is left alone. */
    sigset_t previous;
    umt_signals_block_stop(&previous);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    umt_status status = fd >= 0 ? UMT_OK
                                : umt_fail(UMT_ERR_IO, "%s: cannot create the temporary file %s that a save writes first: %s",
                                           path, tmp, strerror(errno));
    if (fd >= 0) {
        close(fd);
        remove(tmp);
    }
    umt_signals_restore(&previous);
    free(tmp);
    return status;
}

/* What the header's counts will hold, within what load accepts (format.h). */
static umt_status check_counts(const umt_optimizer *opt, const umt_checkpoint_info *info, const char *path) {
    if (info) {
        UMT_TRY(umt_ckpt_check_count(UMT_ERR_INVALID_ARGUMENT, path, "info->epoch", info->epoch));
        UMT_TRY(umt_ckpt_check_count(UMT_ERR_INVALID_ARGUMENT, path, "info->step", info->step));
        UMT_TRY(umt_ckpt_check_count(UMT_ERR_INVALID_ARGUMENT, path, "info->epoch_step", info->epoch_step));
        const uint64_t *rng = info->epoch_rng.s;
        if (info->epoch_step && !(rng[0] | rng[1] | rng[2] | rng[3]))
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: info->epoch_step %lld with info->epoch_rng all zeros "
                            "(expected the RNG state umt_rng_state_get gave at the epoch's start)", path,
                            (long long)info->epoch_step);
    }
    return umt_ckpt_check_count(UMT_ERR_INVALID_ARGUMENT, path, "the optimizer's step count",
                                opt ? umt_optimizer_steps(opt) : 0);
}

/* Writes tmp and renames it over path, with SIGINT and SIGTERM held off while tmp exists: one
 * that would end the process stops the writing, and is delivered once tmp is removed. */
static umt_status write_and_rename(const umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                                   const save_plan *plan, void *scratch, const char *path, const char *tmp) {
    sigset_t previous;
    umt_signals_block_stop(&previous);
    umt_status st = write_temp(ctx, opt, info, plan, scratch, path, tmp, &previous);
    if (st == UMT_OK && rename(tmp, path) != 0)
        st = umt_fail(UMT_ERR_IO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    if (st != UMT_OK) remove(tmp);
    umt_signals_restore(&previous);
    return st;
}

umt_status umt_checkpoint_save(umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                               const char *path) {
    UMT_TRY(umt_ckpt_check_arguments("umt_checkpoint_save", ctx, opt, path));
    UMT_TRY(check_counts(opt, info, path));
    save_plan plan;
    UMT_TRY(plan_save(ctx, opt, info, path, &plan));
    char *tmp = temporary_name(path);
    void *scratch = malloc(plan.max_tensor_bytes ? plan.max_tensor_bytes : 1);
    umt_status st = UMT_OK;
    if (!tmp || !scratch)
        st = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for a %zu-byte tensor buffer", path, plan.max_tensor_bytes);
    else if ((st = write_and_rename(ctx, opt, info, &plan, scratch, path, tmp)) == UMT_OK)
        st = sync_directory(path);
    free(scratch);
    free(tmp);
    return st;
}
