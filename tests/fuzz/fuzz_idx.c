/*
 * tests/fuzz/fuzz_idx.c — fuzz target: the IDX reader (core/data/idx.h) on any bytes, raw or gzip.
 *
 * The rules it checks, from core/data/idx.h: a read either succeeds with a header that agrees with
 * the data (type 0x08, rank 1..UMT_MAX_DIMS, no zero dimension, data bytes = the product of the
 * dimensions, data right after the header) or fails with UMT_ERR_FORMAT or UMT_ERR_UNSUPPORTED, a
 * message naming the file, and the output zeroed. Every data byte is read, so that a data size
 * larger than the buffer shows up under AddressSanitizer. The cap is 1 MiB here, so that a gzip
 * bomb reaches the cap in a millisecond instead of a second.
 */
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "core/data/idx.h"
#include "tests/fuzz/fuzz_target.h"

const char *const fuzz_target_name = "idx";
const bool fuzz_truncations_refused = true; /* the header gives the size of the data */

#define FUZZ_IDX_CAP ((size_t)1 << 20)

static void check_accepted(const umt_idx *idx) {
    FUZZ_REQUIRE(idx->type_code == UMT_IDX_TYPE_U8, "type code 0x%02x accepted", idx->type_code);
    FUZZ_REQUIRE(idx->ndim >= 1 && idx->ndim <= UMT_MAX_DIMS, "rank %d accepted", idx->ndim);
    uint64_t count = 1;
    for (int i = 0; i < idx->ndim; ++i) {
        FUZZ_REQUIRE(idx->dims[i] > 0, "dimension %d is %lld", i, (long long)idx->dims[i]);
        count *= (uint64_t)idx->dims[i];
    }
    FUZZ_REQUIRE(count == idx->data_bytes, "%zu data bytes for %llu elements", idx->data_bytes,
                 (unsigned long long)count);
    FUZZ_REQUIRE(idx->data_bytes <= FUZZ_IDX_CAP, "%zu data bytes past the cap", idx->data_bytes);
    FUZZ_REQUIRE(idx->data == idx->buffer + 4 + 4 * (size_t)idx->ndim, "the data does not follow the header");
    unsigned sum = 0;
    for (size_t i = 0; i < idx->data_bytes; ++i) sum += idx->data[i];
    /* The sum is printed nowhere; reading each byte is the point (the compiler must not drop it). */
    volatile unsigned sink = sum;
    (void)sink;
}

static void check_refused(const umt_idx *idx, umt_status status, const char *path) {
    FUZZ_REQUIRE(status == UMT_ERR_FORMAT || status == UMT_ERR_UNSUPPORTED, "refused with %s",
                 umt_status_name(status));
    FUZZ_REQUIRE(strstr(umt_last_error(), path) != NULL, "the message does not name %s", path);
    static const umt_idx zero;
    FUZZ_REQUIRE(memcmp(idx, &zero, sizeof zero) == 0, "the output is not zeroed after a refusal");
}

bool fuzz_one(const uint8_t *data, size_t size) {
    static const char *path;
    if (!path) path = fuzz_scratch_path();
    fuzz_write_file(path, data, size);
    umt_idx idx;
    umt_status status = umt_idx_read_capped(path, FUZZ_IDX_CAP, &idx);
    if (status == UMT_OK)
        check_accepted(&idx);
    else
        check_refused(&idx, status, path);
    umt_idx_free(&idx);
    return status == UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Seeds: small images and labels files, raw and gzip-compressed */

static int write_seed(const char *dir, int index, const uint8_t *bytes, size_t size, bool gzip) {
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%d", dir, index);
    if (!gzip) {
        fuzz_write_file(path, bytes, size);
        return 0;
    }
    gzFile z = gzopen(path, "wb9");
    int ok = z && gzwrite(z, bytes, (unsigned)size) == (int)size;
    if (z && gzclose(z) != Z_OK) ok = 0;
    if (!ok) fprintf(stderr, "fuzz_idx: cannot write the gzip seed %s\n", path);
    return ok ? 0 : -1;
}

int fuzz_write_seeds(const char *dir) {
    /* 2 images of 3 x 2 pixels (rank 3, as MNIST's images), and 4 labels (rank 1). */
    static const uint8_t images[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2,
                                     0, 64, 128, 255, 1, 2, 3, 4, 5, 6, 7, 8};
    static const uint8_t labels[] = {0, 0, 8, 1, 0, 0, 0, 4, 7, 0, 9, 3};
    int index = 0;
    for (int gzip = 0; gzip <= 1; ++gzip) {
        if (write_seed(dir, index++, images, sizeof images, gzip) != 0) return -1;
        if (write_seed(dir, index++, labels, sizeof labels, gzip) != 0) return -1;
    }
    return index;
}
