/*
 * tests/test_idx.c — the IDX reader and the datasets built on it.
 *
 * Good files (raw, gzip, gzip of several members) load with the right shape and contents, and
 * batches are normalised as torchvision does. Then the battery of bad inputs: each file is
 * written here, into a fresh directory under /tmp, and must be refused with the right status
 * and a message naming the file and the problem. Also run under AddressSanitizer + UBSan
 * (bazel test --config=asan //tests:test_idx), which turns any out-of-bounds read into a failure.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "core/data/idx.h"
#include "umtrain.h"

static char dir[64];

/* ----------------------------------------------------------------------------------------- */
/* Writing test files */

typedef struct {
    uint8_t bytes[256];
    size_t size;
} file_bytes;

static const char *path_of(const char *name) {
    /* Four slots used in turn: a test holds at most four paths at once. */
    static char path[4][sizeof dir + 320];
    static int next;
    next = (next + 1) % 4;
    snprintf(path[next], sizeof path[next], "%s/%s", dir, name);
    return path[next];
}

/* An IDX image: the magic (0, 0, type, rank), big-endian dims, then data. */
static file_bytes idx_bytes(int type, int ndim, const uint32_t *dims, const uint8_t *data, size_t data_size) {
    file_bytes f = {.bytes = {0, 0, (uint8_t)type, (uint8_t)ndim}, .size = 4};
    for (int i = 0; i < ndim; ++i) {
        for (int b = 3; b >= 0; --b) f.bytes[f.size++] = (uint8_t)(dims[i] >> (8 * b));
    }
    assert_true(f.size + data_size <= sizeof f.bytes);
    if (data_size) memcpy(f.bytes + f.size, data, data_size);
    f.size += data_size;
    return f;
}

static const char *write_raw(const char *name, const void *bytes, size_t size) {
    const char *path = path_of(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* mode "wb" starts a file, "ab" appends another gzip member. */
static const char *write_gzip(const char *name, const char *mode, const void *bytes, size_t size) {
    const char *path = path_of(name);
    gzFile f = gzopen(path, mode);
    assert_non_null(f);
    assert_int_equal(gzwrite(f, bytes, (unsigned)size), (int)size);
    assert_int_equal(gzclose(f), Z_OK);
    return path;
}

/* Five 2x3 images (pixel i of sample s is 50*s + i) and their labels 0, 1, 2, 0, 1. */
static const uint32_t images_dims[3] = {5, 2, 3};
static const uint32_t labels_dims[1] = {5};
static const uint8_t labels_data[5] = {0, 1, 2, 0, 1};

static file_bytes good_images(void) {
    uint8_t data[30];
    for (int i = 0; i < 30; ++i) data[i] = (uint8_t)(50 * (i / 6) + i % 6);
    return idx_bytes(0x08, 3, images_dims, data, sizeof data);
}

static file_bytes good_labels(void) { return idx_bytes(0x08, 1, labels_dims, labels_data, sizeof labels_data); }

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_test_idx_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        const char *path = path_of(e->d_name);
        if (unlink(path) != 0) rmdir(path);
    }
    closedir(d);
    return rmdir(dir);
}

/* ----------------------------------------------------------------------------------------- */
/* Expectations */

/* umt_idx_read(path) fails with status, a message naming path and holding keyword, out zeroed. */
static void expect_read_refused(const char *path, umt_status status, const char *keyword) {
    umt_idx idx;
    memset(&idx, 0xab, sizeof idx);
    umt_status got = umt_idx_read(path, &idx);
    if (got != status || !strstr(umt_last_error(), path) || !strstr(umt_last_error(), keyword))
        fail_msg("%s: got %s '%s', expected %s with '%s'", path, umt_status_name(got), umt_last_error(),
                 umt_status_name(status), keyword);
    assert_null(idx.buffer);
    assert_int_equal(idx.ndim, 0);
}

static void expect_raw_refused(const char *name, file_bytes f, umt_status status, const char *keyword) {
    expect_read_refused(write_raw(name, f.bytes, f.size), status, keyword);
}

/* The dataset load fails with status and both keywords in the message; nothing stays in the pool. */
static void expect_load_refused(const char *images, const char *labels, int classes, umt_status status,
                                const char *keyword1, const char *keyword2) {
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_dataset *ds = (umt_dataset *)&ctx; /* any non-NULL value: the load must clear it */
    umt_status got = umt_dataset_load_idx(ctx, images, labels, classes, &ds);
    if (got != status || !strstr(umt_last_error(), keyword1) || !strstr(umt_last_error(), keyword2))
        fail_msg("got %s '%s', expected %s with '%s' and '%s'", umt_status_name(got), umt_last_error(),
                 umt_status_name(status), keyword1, keyword2);
    assert_null(ds);
    umt_pool_stats s;
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_DATASET, &s), UMT_OK);
    assert_int_equal(s.in_use_bytes, 0);
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Good files */

static void test_raw_file_reads_with_its_shape_and_contents(void **state) {
    (void)state;
    file_bytes f = good_images();
    umt_idx idx;
    assert_int_equal(umt_idx_read(write_raw("images", f.bytes, f.size), &idx), UMT_OK);
    assert_int_equal(idx.type_code, UMT_IDX_TYPE_U8);
    assert_int_equal(idx.ndim, 3);
    assert_int_equal(idx.dims[0], 5);
    assert_int_equal(idx.dims[1], 2);
    assert_int_equal(idx.dims[2], 3);
    assert_int_equal(idx.data_bytes, 30);
    assert_memory_equal(idx.data, f.bytes + 16, 30);
    umt_idx_free(&idx);
    assert_null(idx.buffer);
}

static void test_gzip_with_two_members_reads_as_their_concatenation(void **state) {
    (void)state;
    file_bytes f = good_images();
    write_gzip("two-members.gz", "wb", f.bytes, 10);
    const char *path = write_gzip("two-members.gz", "ab", f.bytes + 10, f.size - 10);
    umt_idx idx;
    assert_int_equal(umt_idx_read(path, &idx), UMT_OK);
    assert_int_equal(idx.data_bytes, 30);
    assert_memory_equal(idx.data, f.bytes + 16, 30);
    umt_idx_free(&idx);
}

/* Loads images/labels into a new context and checks size, shape, classes and the pool. */
static void check_good_pair(const char *images, const char *labels) {
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_dataset *ds = NULL;
    if (umt_dataset_load_idx(ctx, images, labels, 3, &ds) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_int_equal(umt_dataset_size(ds), 5);
    assert_int_equal(umt_dataset_num_classes(ds), 3);
    int64_t chw[3];
    umt_dataset_sample_shape(ds, chw);
    assert_int_equal(chw[0], 1);
    assert_int_equal(chw[1], 2);
    assert_int_equal(chw[2], 3);
    umt_pool_stats s;
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_DATASET, &s), UMT_OK);
    assert_true(s.in_use_bytes >= 30 + 5);
    umt_dataset_destroy(ds);
    assert_int_equal(umt_pool_stats_get(ctx, UMT_POOL_DATASET, &s), UMT_OK);
    assert_int_equal(s.in_use_bytes, 0);
    umt_context_destroy(ctx);
}

static void test_good_raw_pair_loads_with_its_size_shape_and_classes(void **state) {
    (void)state;
    file_bytes images = good_images(), labels = good_labels();
    check_good_pair(write_raw("images", images.bytes, images.size), write_raw("labels", labels.bytes, labels.size));
}

static void test_good_gzip_pair_loads_like_the_raw_one(void **state) {
    (void)state;
    file_bytes images = good_images(), labels = good_labels();
    check_good_pair(write_gzip("images.gz", "wb", images.bytes, images.size),
                    write_gzip("labels.gz", "wb", labels.bytes, labels.size));
}

static void test_two_dimensional_images_are_samples_of_d_channels(void **state) {
    (void)state;
    uint8_t data[12] = {0};
    file_bytes images = idx_bytes(0x08, 2, (uint32_t[]){3, 4}, data, sizeof data);
    file_bytes labels = idx_bytes(0x08, 1, (uint32_t[]){3}, data, 3);
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_dataset *ds = NULL;
    assert_int_equal(umt_dataset_load_idx(ctx, write_raw("flat-images", images.bytes, images.size),
                                          write_raw("flat-labels", labels.bytes, labels.size), 1, &ds),
                     UMT_OK);
    int64_t chw[3];
    umt_dataset_sample_shape(ds, chw);
    assert_int_equal(chw[0], 4);
    assert_int_equal(chw[1], 1);
    assert_int_equal(chw[2], 1);
    /* Left to the context: umt_context_destroy frees it (the leak checker would say otherwise). */
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Batches */

/* A context with the good raw pair loaded. */
static umt_dataset *load_good(umt_context **ctx) {
    file_bytes images = good_images(), labels = good_labels();
    assert_int_equal(umt_context_create(NULL, ctx), UMT_OK);
    umt_dataset *ds = NULL;
    assert_int_equal(umt_dataset_load_idx(*ctx, write_raw("images", images.bytes, images.size),
                                          write_raw("labels", labels.bytes, labels.size), 3, &ds),
                     UMT_OK);
    return ds;
}

static void test_batch_normalises_pixels_and_widens_labels_in_index_order(void **state) {
    (void)state;
    umt_context *ctx;
    umt_dataset *ds = load_good(&ctx);
    const int64_t indices[3] = {4, 2, 4};
    umt_tensor *x, *y;
    assert_int_equal(umt_dataset_batch(ctx, ds, indices, 3, 0.5f, 0.25f, &x, &y), UMT_OK);
    assert_int_equal(umt_tensor_dtype(x), UMT_F32);
    assert_int_equal(umt_tensor_ndim(x), 4);
    int64_t want_shape[4] = {3, 1, 2, 3};
    for (int i = 0; i < 4; ++i) assert_int_equal(umt_tensor_dim(x, i), want_shape[i]);
    assert_int_equal(umt_tensor_pool(x), UMT_POOL_ACTIVATIONS);
    float pixels[18];
    int32_t labels[3];
    assert_int_equal(umt_tensor_copy_to_host(x, pixels, sizeof pixels), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(y, labels, sizeof labels), UMT_OK);
    for (int b = 0; b < 3; ++b) {
        for (int i = 0; i < 6; ++i) {
            float v = (float)(50 * indices[b] + i);
            assert_true(pixels[b * 6 + i] == (v / 255.0f - 0.5f) / 0.25f);
        }
        assert_int_equal(labels[b], labels_data[indices[b]]);
    }
    assert_true(pixels[6] < 0.0f && pixels[0] > 1.0f); /* sample 2 is dark, sample 4 bright */
    umt_context_destroy(ctx);
}

static void test_batch_rejects_an_index_out_of_range_naming_it(void **state) {
    (void)state;
    umt_context *ctx;
    umt_dataset *ds = load_good(&ctx);
    umt_tensor *x = (umt_tensor *)ds, *y = (umt_tensor *)ds; /* non-NULL: a refusal must clear them */
    assert_int_equal(umt_dataset_batch(ctx, ds, (int64_t[]){0, 5}, 2, 0.0f, 1.0f, &x, &y), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "indices[1] is 5"));
    assert_null(x);
    assert_null(y);
    assert_int_equal(umt_dataset_batch(ctx, ds, (int64_t[]){-1}, 1, 0.0f, 1.0f, &x, &y), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "indices[0] is -1"));
    assert_int_equal(umt_dataset_batch(ctx, ds, (int64_t[]){0}, 0, 0.0f, 1.0f, &x, &y), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "count 0"));
    assert_int_equal(umt_dataset_batch(ctx, ds, (int64_t[]){0}, 1, 0.0f, 0.0f, &x, &y), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "std"));
    umt_context_destroy(ctx);
}

/* a and b hold the same bytes bytes. */
static void expect_same_bytes(const umt_tensor *a, const umt_tensor *b, size_t bytes) {
    uint8_t first[128], second[128];
    assert_true(bytes <= sizeof first);
    assert_int_equal(umt_tensor_copy_to_host(a, first, bytes), UMT_OK);
    assert_int_equal(umt_tensor_copy_to_host(b, second, bytes), UMT_OK);
    assert_memory_equal(first, second, bytes);
}

/* umt_dataset_batch_as: f32 images are umt_dataset_batch's; an integer dtype is refused by name,
 * and half images on the CPU (no half kernels) with the backend named, nothing returned. */
static void test_batch_as_f32_is_the_batch_and_half_images_need_half_kernels(void **state) {
    (void)state;
    umt_context *ctx;
    umt_dataset *ds = load_good(&ctx);
    const int64_t indices[3] = {4, 2, 4};
    umt_tensor *x, *y, *x_as, *y_as;
    assert_int_equal(umt_dataset_batch(ctx, ds, indices, 3, 0.5f, 0.25f, &x, &y), UMT_OK);
    assert_int_equal(umt_dataset_batch_as(ctx, ds, indices, 3, 0.5f, 0.25f, UMT_F32, &x_as, &y_as), UMT_OK);
    assert_int_equal(umt_tensor_dtype(x_as), UMT_F32);
    expect_same_bytes(x, x_as, 18 * sizeof(float));
    expect_same_bytes(y, y_as, 3 * sizeof(int32_t));
    umt_tensor *kept = x;
    assert_int_equal(umt_dataset_batch_as(ctx, ds, indices, 3, 0.5f, 0.25f, UMT_I32, &x, &y), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "images of i32"));
    assert_null(x);
    x = kept;
    assert_int_equal(umt_dataset_batch_as(ctx, ds, indices, 3, 0.5f, 0.25f, UMT_BF16, &x, &y), UMT_ERR_UNSUPPORTED);
    assert_non_null(strstr(umt_last_error(), "bf16 images: the cpu backend"));
    assert_null(x);
    assert_null(y);
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Bad files: the reader */

static void test_missing_file_is_an_io_error_with_the_system_reason(void **state) {
    (void)state;
    expect_read_refused(path_of("no-such-file"), UMT_ERR_IO, "No such file");
}

static void test_directory_is_an_io_error(void **state) {
    (void)state;
    expect_read_refused(dir, UMT_ERR_IO, "not a regular file");
}

static void test_empty_file_is_refused(void **state) {
    (void)state;
    expect_read_refused(write_raw("empty", "", 0), UMT_ERR_FORMAT, "empty");
}

static void test_file_shorter_than_the_magic_is_refused(void **state) {
    (void)state;
    expect_read_refused(write_raw("three-bytes", "\0\0\x08", 3), UMT_ERR_FORMAT, "shorter than the 4-byte");
}

static void test_wrong_magic_is_refused(void **state) {
    (void)state;
    file_bytes f = good_labels();
    f.bytes[1] = 0x01;
    expect_raw_refused("wrong-magic", f, UMT_ERR_FORMAT, "magic bytes 0x00 0x01");
}

static void test_other_idx_type_codes_are_unsupported_by_name(void **state) {
    (void)state;
    float data[2] = {1.0f, 2.0f};
    file_bytes f = idx_bytes(0x0D, 1, (uint32_t[]){2}, (const uint8_t *)data, sizeof data);
    expect_raw_refused("float-labels", f, UMT_ERR_UNSUPPORTED, "0x0d (float32)");
}

static void test_unknown_type_code_is_refused(void **state) {
    (void)state;
    file_bytes f = good_labels();
    f.bytes[2] = 0x07;
    expect_raw_refused("type-07", f, UMT_ERR_FORMAT, "unknown type code 0x07");
}

static void test_rank_zero_and_rank_five_are_refused(void **state) {
    (void)state;
    expect_raw_refused("rank-0", idx_bytes(0x08, 0, NULL, NULL, 0), UMT_ERR_FORMAT, "rank 0");
    uint8_t one = 1;
    file_bytes f = idx_bytes(0x08, 5, (uint32_t[]){1, 1, 1, 1, 1}, &one, 1);
    expect_raw_refused("rank-5", f, UMT_ERR_FORMAT, "rank 5");
}

static void test_truncated_header_is_refused(void **state) {
    (void)state;
    file_bytes f = good_images();
    f.size = 4 + 5; /* rank 3 needs 12 bytes of dimensions */
    expect_raw_refused("short-header", f, UMT_ERR_FORMAT, "header truncated");
}

static void test_zero_dimension_is_refused(void **state) {
    (void)state;
    expect_raw_refused("zero-dim", idx_bytes(0x08, 3, (uint32_t[]){5, 0, 3}, NULL, 0), UMT_ERR_FORMAT,
                       "dimension 1 is 0");
}

static void test_huge_dimensions_are_refused_before_any_allocation(void **state) {
    (void)state;
    uint32_t huge[3] = {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu};
    expect_raw_refused("huge-3", idx_bytes(0x08, 3, huge, NULL, 0), UMT_ERR_FORMAT, "overflow");
    expect_raw_refused("huge-2", idx_bytes(0x08, 2, huge, NULL, 0), UMT_ERR_FORMAT, "overflow");
    /* Large but representable: still refused by the file's length, not by a failed malloc. */
    uint8_t few[4] = {0};
    expect_raw_refused("huge-1", idx_bytes(0x08, 2, (uint32_t[]){0xFFFFFFFFu, 0xFFFFu}, few, 4), UMT_ERR_FORMAT,
                       "header says 281470681677825");
}

static void test_truncated_data_is_refused_with_both_sizes(void **state) {
    (void)state;
    file_bytes f = good_labels();
    f.size -= 1;
    expect_raw_refused("short-data", f, UMT_ERR_FORMAT, "truncated: 4 bytes of data, header says 5");
}

static void test_trailing_data_is_refused(void **state) {
    (void)state;
    file_bytes f = good_labels();
    f.bytes[f.size++] = 0;
    expect_raw_refused("long-data", f, UMT_ERR_FORMAT, "trailing bytes");
}

static void test_raw_file_past_the_cap_is_refused(void **state) {
    (void)state;
    file_bytes f = good_images();
    const char *path = write_raw("big-raw", f.bytes, f.size);
    umt_idx idx;
    assert_int_equal(umt_idx_read_capped(path, 40, &idx), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), path));
    assert_non_null(strstr(umt_last_error(), "cap of 40 bytes"));
    assert_int_equal(umt_idx_read_capped(path, f.size, &idx), UMT_OK);
    umt_idx_free(&idx);
}

/* ----------------------------------------------------------------------------------------- */
/* Bad files: gzip */

static const uint8_t gzip_header[10] = {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03};

static void test_corrupt_gzip_is_refused(void **state) {
    (void)state;
    uint8_t f[26];
    memcpy(f, gzip_header, sizeof gzip_header);
    memset(f + sizeof gzip_header, 0xff, sizeof f - sizeof gzip_header); /* a reserved block type */
    expect_read_refused(write_raw("corrupt.gz", f, sizeof f), UMT_ERR_FORMAT, "corrupt gzip");
}

static void test_truncated_gzip_is_refused(void **state) {
    (void)state;
    file_bytes f = good_images();
    uint8_t whole[512];
    const char *path = write_gzip("whole.gz", "wb", f.bytes, f.size);
    FILE *in = fopen(path, "rb");
    assert_non_null(in);
    size_t size = fread(whole, 1, sizeof whole, in);
    fclose(in);
    assert_true(size > 20 && size < sizeof whole);
    expect_read_refused(write_raw("truncated.gz", whole, size - 12), UMT_ERR_FORMAT, "truncated gzip");
    /* Cut inside the 8-byte trailer too: the stream is still incomplete. */
    expect_read_refused(write_raw("no-trailer.gz", whole, size - 3), UMT_ERR_FORMAT, "truncated gzip");
}

static void test_gzip_of_a_bad_idx_is_refused_like_the_raw_file(void **state) {
    (void)state;
    file_bytes f = good_images();
    f.bytes[0] = 0x42;
    const char *path = write_gzip("bad-magic.gz", "wb", f.bytes, f.size);
    expect_read_refused(path, UMT_ERR_FORMAT, "magic bytes 0x42 0x00");
    assert_non_null(strstr(umt_last_error(), "after gunzip"));
    f = good_labels();
    f.bytes[f.size++] = 7;
    expect_read_refused(write_gzip("long-data.gz", "wb", f.bytes, f.size), UMT_ERR_FORMAT, "trailing bytes");
}

static void test_gzip_decompressing_past_the_cap_is_refused(void **state) {
    (void)state;
    /* A valid IDX of 1 MiB of zeros: a few KiB compressed, refused at a 64 KiB cap. */
    size_t n = (size_t)1 << 20;
    uint8_t *big = calloc(1, n + 8);
    assert_non_null(big);
    memcpy(big, (uint8_t[]){0, 0, 0x08, 1, 0, 0x10, 0, 0}, 8);
    const char *path = write_gzip("bomb.gz", "wb", big, n + 8);
    free(big);
    umt_idx idx;
    assert_int_equal(umt_idx_read_capped(path, 65536, &idx), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), path));
    assert_non_null(strstr(umt_last_error(), "more than the IDX reader's cap of 65536 bytes"));
    assert_null(idx.buffer);
    assert_int_equal(umt_idx_read_capped(path, n + 8, &idx), UMT_OK);
    assert_int_equal(idx.data_bytes, n);
    umt_idx_free(&idx);
}

/* ----------------------------------------------------------------------------------------- */
/* Bad pairs: the dataset */

static void test_images_and_labels_count_mismatch_names_both_files(void **state) {
    (void)state;
    file_bytes images = good_images();
    file_bytes labels = idx_bytes(0x08, 1, (uint32_t[]){4}, labels_data, 4);
    const char *images_path = write_raw("images", images.bytes, images.size);
    const char *labels_path = write_raw("four-labels", labels.bytes, labels.size);
    expect_load_refused(images_path, labels_path, 3, UMT_ERR_FORMAT, "holds 5 samples", "four-labels holds 4");
}

static void test_label_out_of_range_names_the_file_index_and_value(void **state) {
    (void)state;
    file_bytes images = good_images(), labels = good_labels();
    labels.bytes[labels.size - 2] = 10;
    const char *images_path = write_raw("images", images.bytes, images.size);
    const char *labels_path = write_raw("label-10", labels.bytes, labels.size);
    expect_load_refused(images_path, labels_path, 3, UMT_ERR_FORMAT, labels_path, "label 3 is 10, expected < 3");
}

static void test_wrong_ranks_for_images_or_labels_are_refused(void **state) {
    (void)state;
    file_bytes images = good_images(), labels = good_labels();
    const char *images_path = write_raw("images", images.bytes, images.size);
    const char *labels_path = write_raw("labels", labels.bytes, labels.size);
    expect_load_refused(labels_path, labels_path, 3, UMT_ERR_FORMAT, "images file has rank 1", "labels");
    expect_load_refused(images_path, images_path, 3, UMT_ERR_FORMAT, "labels file has rank 3", "images");
}

static void test_bad_num_classes_and_bad_files_fail_the_load(void **state) {
    (void)state;
    file_bytes images = good_images(), labels = good_labels();
    const char *images_path = write_raw("images", images.bytes, images.size);
    const char *labels_path = write_raw("labels", labels.bytes, labels.size);
    expect_load_refused(images_path, labels_path, 0, UMT_ERR_INVALID_ARGUMENT, "num_classes 0", "1..256");
    expect_load_refused(images_path, labels_path, 257, UMT_ERR_INVALID_ARGUMENT, "num_classes 257", "1..256");
    labels.bytes[2] = 0x0C;
    labels_path = write_raw("int32-labels", labels.bytes, labels.size);
    expect_load_refused(images_path, labels_path, 3, UMT_ERR_UNSUPPORTED, labels_path, "int32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raw_file_reads_with_its_shape_and_contents),
        cmocka_unit_test(test_gzip_with_two_members_reads_as_their_concatenation),
        cmocka_unit_test(test_good_raw_pair_loads_with_its_size_shape_and_classes),
        cmocka_unit_test(test_good_gzip_pair_loads_like_the_raw_one),
        cmocka_unit_test(test_two_dimensional_images_are_samples_of_d_channels),
        cmocka_unit_test(test_batch_normalises_pixels_and_widens_labels_in_index_order),
        cmocka_unit_test(test_batch_rejects_an_index_out_of_range_naming_it),
        cmocka_unit_test(test_batch_as_f32_is_the_batch_and_half_images_need_half_kernels),
        cmocka_unit_test(test_missing_file_is_an_io_error_with_the_system_reason),
        cmocka_unit_test(test_directory_is_an_io_error),
        cmocka_unit_test(test_empty_file_is_refused),
        cmocka_unit_test(test_file_shorter_than_the_magic_is_refused),
        cmocka_unit_test(test_wrong_magic_is_refused),
        cmocka_unit_test(test_other_idx_type_codes_are_unsupported_by_name),
        cmocka_unit_test(test_unknown_type_code_is_refused),
        cmocka_unit_test(test_rank_zero_and_rank_five_are_refused),
        cmocka_unit_test(test_truncated_header_is_refused),
        cmocka_unit_test(test_zero_dimension_is_refused),
        cmocka_unit_test(test_huge_dimensions_are_refused_before_any_allocation),
        cmocka_unit_test(test_truncated_data_is_refused_with_both_sizes),
        cmocka_unit_test(test_trailing_data_is_refused),
        cmocka_unit_test(test_raw_file_past_the_cap_is_refused),
        cmocka_unit_test(test_corrupt_gzip_is_refused),
        cmocka_unit_test(test_truncated_gzip_is_refused),
        cmocka_unit_test(test_gzip_of_a_bad_idx_is_refused_like_the_raw_file),
        cmocka_unit_test(test_gzip_decompressing_past_the_cap_is_refused),
        cmocka_unit_test(test_images_and_labels_count_mismatch_names_both_files),
        cmocka_unit_test(test_label_out_of_range_names_the_file_index_and_value),
        cmocka_unit_test(test_wrong_ranks_for_images_or_labels_are_refused),
        cmocka_unit_test(test_bad_num_classes_and_bad_files_fail_the_load),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
