/*
 * core/data/idx.c — the IDX reader: read the file whole, gunzip it if it starts with the gzip
 * magic, then check every header field against the bytes present.
 *
 * The rules that keep untrusted input harmless:
 *   - nothing is allocated from a size written in the file: a raw file's buffer is sized from
 *     its length on disk, a gzip stream's output buffer grows geometrically with what inflate
 *     actually produces, and both stop at the cap (UMT_IDX_MAX_BYTES);
 *   - the header is parsed only after its length is known to be present, and the product of
 *     the dimensions is computed with an overflow check before it is compared with the data.
 */
#include "core/data/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/base/error.h"
#include "core/base/file.h"

#define IDX_MAGIC_BYTES 4
#define IDX_DIM_BYTES 4

/* ----------------------------------------------------------------------------------------- */
/* Reading the file */

/* ----------------------------------------------------------------------------------------- */
/* Decompressing */

/* Doubles the output buffer, never past limit bytes. */
static umt_status grow(const char *path, uint8_t **buf, size_t *capacity, size_t limit) {
    size_t next = *capacity > limit / 2 ? limit : *capacity * 2;
    uint8_t *bigger = realloc(*buf, next);
    if (!bigger) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory to decompress past %zu bytes", path, *capacity);
    *buf = bigger;
    *capacity = next;
    return UMT_OK;
}

/* Inflates the gzip stream (one or more members) in[0..in_bytes) into *out. */
static umt_status gunzip_stream(const char *path, z_stream *z, size_t in_bytes, size_t max_bytes, uint8_t **out,
                                size_t *out_bytes) {
    /* One byte past the cap, so that "exactly the cap" and "more than the cap" differ. */
    size_t limit = max_bytes + 1;
    /* Start near the size gzip usually achieves on images (4x), and let growth do the rest. */
    size_t capacity = in_bytes < limit / 4 ? in_bytes * 4 : limit;
    if (capacity < 65536) capacity = 65536;
    if (capacity > limit) capacity = limit;
    size_t produced = 0;
    *out = malloc(capacity);
    if (!*out) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory to decompress %zu bytes", path, capacity);
    for (;;) {
        if (produced == capacity) {
            if (capacity == limit)
                return umt_fail(UMT_ERR_FORMAT,
                                "%s: gzip stream decompresses to more than the IDX reader's cap of %zu bytes", path,
                                max_bytes);
            UMT_TRY(grow(path, out, &capacity, limit));
        }
        z->next_out = *out + produced;
        z->avail_out = (uInt)(capacity - produced);
        int rc = inflate(z, Z_NO_FLUSH);
        produced = capacity - z->avail_out;
        if (rc == Z_STREAM_END) {
            *out_bytes = produced;
            if (z->avail_in == 0) return UMT_OK;
            /* More input after a member's end: gzip allows concatenated members. */
            if (inflateReset(z) != Z_OK) return umt_fail(UMT_ERR_FORMAT, "%s: cannot restart inflate", path);
            continue;
        }
        /* Z_OK: keep going (even with no input left, inflate may hold output back). Z_BUF_ERROR:
         * no progress was possible with room to write, so the input ran out mid-stream. */
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: truncated gzip stream: input ended after %zu compressed bytes "
                            "(%zu decompressed) without the end of the stream",
                            path, in_bytes, produced);
        if (rc == Z_MEM_ERROR) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for inflate", path);
        return umt_fail(UMT_ERR_FORMAT, "%s: corrupt gzip data at compressed byte %zu: %s", path,
                        in_bytes - z->avail_in, z->msg ? z->msg : zError(rc));
    }
}

static umt_status gunzip(const char *path, const uint8_t *in, size_t in_bytes, size_t max_bytes, uint8_t **out,
                         size_t *out_bytes) {
    z_stream z;
    memset(&z, 0, sizeof z);
    *out = NULL;
    *out_bytes = 0;
    /* 15 + 32: the largest window, and accept the gzip header (zlib detects it). */
    int rc = inflateInit2(&z, 15 + 32);
    if (rc != Z_OK) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: cannot start inflate: %s", path, zError(rc));
    /* zlib's API is not const-correct; inflate only reads next_in. */
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)in_bytes;
    umt_status status = gunzip_stream(path, &z, in_bytes, max_bytes, out, out_bytes);
    inflateEnd(&z);
    if (status != UMT_OK) {
        free(*out);
        *out = NULL;
        *out_bytes = 0;
    }
    return status;
}

/* ----------------------------------------------------------------------------------------- */
/* Parsing the header */

static const char *type_name(int code) {
    switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return NULL;
    }
}

static uint32_t big_endian_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* "60000 x 28 x 28", from the header's dimension fields (all present). */
static const char *dims_string(const uint8_t *dims, int ndim, char *s, size_t size) {
    size_t used = 0;
    s[0] = '\0';
    for (int i = 0; i < ndim && used < size; ++i) {
        int n = snprintf(s + used, size - used, "%s%lu", i ? " x " : "",
                         (unsigned long)big_endian_u32(dims + IDX_DIM_BYTES * i));
        if (n < 0) break;
        used += (size_t)n;
    }
    return s;
}

/* Checks the 4-byte magic: two zero bytes, a supported type code, a rank in 1..UMT_MAX_DIMS. */
static umt_status parse_magic(const char *path, const char *origin, const uint8_t *buf, size_t size, int *ndim) {
    if (size == 0) return umt_fail(UMT_ERR_FORMAT, "%s%s: empty file (0 bytes), expected an IDX header", path, origin);
    if (size < IDX_MAGIC_BYTES)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: file is %zu bytes, shorter than the 4-byte IDX magic", path, origin,
                        size);
    if (buf[0] != 0 || buf[1] != 0)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: magic bytes 0x%02x 0x%02x, expected 0x00 0x00 (not an IDX file)", path,
                        origin, buf[0], buf[1]);
    const char *type = type_name(buf[2]);
    if (!type)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: unknown type code 0x%02x, expected 0x08 (unsigned byte)", path, origin,
                        buf[2]);
    if (buf[2] != UMT_IDX_TYPE_U8)
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "%s%s: type code 0x%02x (%s) is not supported, expected 0x08 (unsigned byte)", path, origin,
                        buf[2], type);
    if (buf[3] < 1 || buf[3] > UMT_MAX_DIMS)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: rank %d, expected 1..%d", path, origin, buf[3], UMT_MAX_DIMS);
    *ndim = buf[3];
    return UMT_OK;
}

/* Validates buf[0..size) as an IDX file and points out into it (out->buffer is left to the caller). */
static umt_status parse(const char *path, const char *origin, const uint8_t *buf, size_t size, umt_idx *out) {
    int ndim = 0;
    UMT_TRY(parse_magic(path, origin, buf, size, &ndim));
    size_t header = IDX_MAGIC_BYTES + (size_t)ndim * IDX_DIM_BYTES;
    if (size < header)
        return umt_fail(UMT_ERR_FORMAT,
                        "%s%s: header truncated: rank %d needs %zu bytes of dimensions, the file has %zu", path, origin,
                        ndim, header - IDX_MAGIC_BYTES, size - IDX_MAGIC_BYTES);
    const uint8_t *dims = buf + IDX_MAGIC_BYTES;
    char shape[96];
    /* Tensor shapes are int64, so the element count must fit one; checked before each multiply. */
    uint64_t count = 1;
    for (int i = 0; i < ndim; ++i) {
        uint32_t d = big_endian_u32(dims + IDX_DIM_BYTES * i);
        if (d == 0) return umt_fail(UMT_ERR_FORMAT, "%s%s: dimension %d is 0, expected > 0", path, origin, i);
        if (count > (uint64_t)INT64_MAX / d)
            return umt_fail(UMT_ERR_FORMAT, "%s%s: dimensions %s overflow: the element count passes 2^63-1", path,
                            origin, dims_string(dims, ndim, shape, sizeof shape));
        count *= d;
        out->dims[i] = d;
    }
    size_t have = size - header;
    if (have < count)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: truncated: %zu bytes of data, header says %llu (%s)", path, origin, have,
                        (unsigned long long)count, dims_string(dims, ndim, shape, sizeof shape));
    if (have > count)
        return umt_fail(UMT_ERR_FORMAT, "%s%s: trailing bytes: %zu bytes of data, header says %llu (%s): %llu extra",
                        path, origin, have, (unsigned long long)count, dims_string(dims, ndim, shape, sizeof shape),
                        (unsigned long long)(have - count));
    out->type_code = buf[2];
    out->ndim = ndim;
    out->data = buf + header;
    out->data_bytes = have;
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The reader */

umt_status umt_idx_read_capped(const char *path, size_t max_bytes, umt_idx *out) {
    if (!out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_idx_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_idx_read: path is NULL");
    /* zlib counts bytes in uInt: keeping under the cap keeps every count in range. */
    if (max_bytes == 0 || max_bytes > UMT_IDX_MAX_BYTES)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_idx_read: cap of %zu bytes, expected 1..%zu", max_bytes,
                        UMT_IDX_MAX_BYTES);
    uint8_t *file = NULL;
    size_t size = 0;
    UMT_TRY(umt_file_read_regular(path, "an IDX file", max_bytes, &file, &size));
    const char *origin = "";
    if (size >= 2 && file[0] == 0x1f && file[1] == 0x8b) {
        uint8_t *plain = NULL;
        size_t plain_size = 0;
        umt_status status = gunzip(path, file, size, max_bytes, &plain, &plain_size);
        free(file);
        if (status != UMT_OK) return status;
        file = plain;
        size = plain_size;
        origin = " (after gunzip)";
    }
    umt_status status = parse(path, origin, file, size, out);
    if (status != UMT_OK) {
        free(file);
        memset(out, 0, sizeof *out);
        return status;
    }
    out->buffer = file;
    return UMT_OK;
}

umt_status umt_idx_read(const char *path, umt_idx *out) { return umt_idx_read_capped(path, UMT_IDX_MAX_BYTES, out); }

void umt_idx_free(umt_idx *idx) {
    if (!idx) return;
    free(idx->buffer);
    memset(idx, 0, sizeof *idx);
}
