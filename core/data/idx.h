/*
 * core/data/idx.h — reading IDX files (the format of MNIST), raw or gzip-compressed.
 *
 * An IDX file is a 4-byte magic (two zero bytes, a type code, the rank), then one big-endian
 * uint32 per dimension, then the elements in row-major order. Files come from outside, so
 * every field is checked against the bytes actually present before anything is sized from it,
 * and no buffer grows past a hard cap (UMT_IDX_MAX_BYTES), raw or decompressed.
 * Only type 0x08 (unsigned byte) is supported: it is what image and label datasets use.
 */
#ifndef UMT_CORE_DATA_IDX_H
#define UMT_CORE_DATA_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

/* The most bytes a file may hold, raw or after decompression: 1 GiB, ample for MNIST-sized
 * datasets (47 MB) while a malicious gzip stream cannot make the reader exhaust memory. */
#define UMT_IDX_MAX_BYTES ((size_t)1 << 30)

#define UMT_IDX_TYPE_U8 0x08

typedef struct {
    int type_code; /* UMT_IDX_TYPE_U8 */
    int ndim;      /* 1..UMT_MAX_DIMS */
    int64_t dims[UMT_MAX_DIMS];
    const uint8_t *data; /* the elements, inside buffer */
    size_t data_bytes;   /* the product of dims (times the element size, 1) */
    uint8_t *buffer;     /* the whole file, decompressed: owned, freed by umt_idx_free */
} umt_idx;

/* Reads and validates the IDX file at path into out (zeroed on failure). UMT_ERR_IO when the
 * file cannot be opened or read, UMT_ERR_UNSUPPORTED for a valid type code other than 0x08,
 * UMT_ERR_FORMAT for anything else wrong with its contents; the message names the file. */
umt_status umt_idx_read(const char *path, umt_idx *out);
/* The same with another cap than UMT_IDX_MAX_BYTES (for tests of the cap). */
umt_status umt_idx_read_capped(const char *path, size_t max_bytes, umt_idx *out);
/* The checks that involve an images file and its labels file (core/data/dataset.c): ranks ([N,H,W] or
 * [N,D] and [N]), equal sample counts, every label < num_classes. */
umt_status umt_idx_check_pair(const char *images_path, const umt_idx *images, const char *labels_path,
                              const umt_idx *labels, int num_classes);
/* Frees what out owns and zeroes it. NULL is ok. */
void umt_idx_free(umt_idx *idx);

#endif /* UMT_CORE_DATA_IDX_H */
