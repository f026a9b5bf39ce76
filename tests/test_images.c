/*
 * tests/test_images.c — image files into batches: PNG, BMP and JPEG written by the test with
 * stb's writer, grey and colour, resizing, inversion, and clear errors for bad files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <stb/stb_image_write.h>

#include "umtrain.h"

static char dir[64];
static umt_context *ctx;

static const char *path_of(const char *name) {
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

/* A side x side grey image: a bright square in the middle of a dark field. */
static void square(unsigned char *pixels, int side) {
    for (int y = 0; y < side; ++y)
        for (int x = 0; x < side; ++x)
            pixels[y * side + x] = (x >= side / 4 && x < 3 * side / 4 && y >= side / 4 && y < 3 * side / 4) ? 200 : 10;
}

/* 0 when path_of(name) now holds the bytes. */
static int write_file(const char *name, const void *bytes, size_t size) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f) return -1;
    size_t written = fwrite(bytes, 1, size, f);
    return fclose(f) != 0 || written != size ? -1 : 0;
}

/* 0 when the bytes at offset of path_of(name) were overwritten. */
static int patch_file(const char *name, long offset, const void *bytes, size_t size) {
    FILE *f = fopen(path_of(name), "r+b");
    if (!f) return -1;
    int ok = fseek(f, offset, SEEK_SET) == 0 && fwrite(bytes, 1, size, f) == size;
    return fclose(f) != 0 || !ok ? -1 : 0;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_images_XXXXXX");
    if (!mkdtemp(dir) || umt_context_create(NULL, &ctx) != UMT_OK) return -1;
    static unsigned char grey[28 * 28], big[56 * 56], rgb[28 * 28 * 3], wide[20000];
    square(grey, 28);
    square(big, 56);
    for (int i = 0; i < 28 * 28; ++i) rgb[3 * i] = grey[i], rgb[3 * i + 1] = 0, rgb[3 * i + 2] = 255;
    int ok = stbi_write_png(path_of("grey.png"), 28, 28, 1, grey, 28) &&
             stbi_write_bmp(path_of("grey.bmp"), 28, 28, 1, grey) &&
             stbi_write_jpg(path_of("grey.jpg"), 28, 28, 1, grey, 95) &&
             stbi_write_png(path_of("big.png"), 56, 56, 1, big, 56) &&
             stbi_write_png(path_of("rgb.png"), 28, 28, 3, rgb, 28 * 3) &&
             stbi_write_png(path_of("huge.png"), 20000, 1, 1, wide, 20000) &&
             stbi_write_bmp(path_of("zero-width.bmp"), 28, 28, 1, grey) &&
             stbi_write_png(path_of("long-chunk.png"), 28, 28, 1, grey, 28) &&
             stbi_write_bmp(path_of("sparse.bmp"), 28, 28, 1, grey);
    /* The BMP header's width (a little-endian int32 at byte 18) made 0: stb_image still reads it. */
    static const unsigned char zero[4] = {0};
    ok = ok && patch_file("zero-width.bmp", 18, zero, sizeof zero) == 0;
    /* The IDAT chunk's length (big-endian, at byte 33) made 2^31 - 1: stb_image would allocate it. */
    static const unsigned char huge_length[4] = {0x7f, 0xff, 0xff, 0xff};
    ok = ok && patch_file("long-chunk.png", 33, huge_length, sizeof huge_length) == 0;
    /* 16384 x 16384 pixels declared in 2.4 kB: width and height (int32 at bytes 18 and 22). */
    static const unsigned char side_16384[8] = {0x00, 0x40, 0, 0, 0x00, 0x40, 0, 0};
    ok = ok && patch_file("sparse.bmp", 18, side_16384, sizeof side_16384) == 0;
    /* A 2 x 2 grey TGA and PGM: stb_image reads both, umtrain must not (its formats are three). */
    static const unsigned char tga[] = {0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 8, 0, 0, 255, 128, 64};
    static const unsigned char pgm[] = {'P', '5', '\n', '2', ' ', '2', '\n', '2', '5', '5', '\n', 0, 255, 128, 64};
    static const unsigned char truncated_png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0};
    return write_file("garbage.png", "this is not an image at all", 27) || write_file("grey.tga", tga, sizeof tga) ||
           write_file("grey.pgm", pgm, sizeof pgm) || write_file("empty.png", "", 0) ||
           write_file("truncated.png", truncated_png, sizeof truncated_png) || !ok;
}

static int teardown(void **state) {
    (void)state;
    const char *names[] = {"grey.png", "grey.bmp", "grey.jpg", "big.png",  "rgb.png",      "huge.png",
                           "garbage.png", "grey.tga", "grey.pgm", "empty.png", "truncated.png", "zero-width.bmp", "long-chunk.png", "sparse.bmp"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) unlink(path_of(names[i]));
    umt_context_destroy(ctx);
    return rmdir(dir);
}

static float *load_host(const char *const *paths, int count, int channels, umt_invert invert) {
    umt_tensor *batch = NULL;
    umt_step_begin(ctx);
    if (umt_images_load(ctx, paths, count, channels, 28, 28, invert, 0.0f, 1.0f, &batch) != UMT_OK)
        fail_msg("%s", umt_last_error());
    assert_int_equal(umt_tensor_dim(batch, 0), count);
    assert_int_equal(umt_tensor_dim(batch, 1), channels);
    float *host = malloc((size_t)umt_tensor_numel(batch) * sizeof *host);
    assert_int_equal(umt_tensor_copy_to_host(batch, host, (size_t)umt_tensor_numel(batch) * sizeof *host), UMT_OK);
    return host;
}

static void test_png_and_bmp_load_exactly_and_jpeg_closely(void **state) {
    (void)state;
    const char *paths[] = {path_of("grey.png"), path_of("grey.bmp"), path_of("grey.jpg")};
    float *x = load_host(paths, 3, 1, UMT_INVERT_NO);
    assert_float_equal(x[0], 10.0f / 255.0f, 1e-7);             /* a corner */
    assert_float_equal(x[14 * 28 + 14], 200.0f / 255.0f, 1e-7);  /* the middle */
    assert_memory_equal(x, x + 784, 784 * sizeof(float));        /* BMP == PNG */
    for (int i = 0; i < 784; ++i) assert_float_equal(x[1568 + i], x[i], 12.0f / 255.0f); /* JPEG is lossy */
    free(x);
}

static void test_larger_images_are_resized_and_colour_is_split_into_channels(void **state) {
    (void)state;
    const char *big[] = {path_of("big.png")};
    float *x = load_host(big, 1, 1, UMT_INVERT_NO);
    assert_float_equal(x[14 * 28 + 14], 200.0f / 255.0f, 2.0f / 255.0f);
    assert_float_equal(x[0], 10.0f / 255.0f, 2.0f / 255.0f);
    free(x);
    const char *rgb[] = {path_of("rgb.png")};
    x = load_host(rgb, 1, 3, UMT_INVERT_NO);
    assert_float_equal(x[14 * 28 + 14], 200.0f / 255.0f, 1e-7); /* red plane */
    assert_float_equal(x[784 + 14 * 28 + 14], 0.0f, 1e-7);      /* green */
    assert_float_equal(x[1568 + 5], 1.0f, 1e-7);                 /* blue */
    free(x);
}

static void test_invert_auto_flips_only_light_backgrounds(void **state) {
    (void)state;
    const char *paths[] = {path_of("grey.png")};
    float *kept = load_host(paths, 1, 1, UMT_INVERT_AUTO); /* mean grey < 128: dark background, kept */
    assert_float_equal(kept[0], 10.0f / 255.0f, 1e-7);
    float *flipped = load_host(paths, 1, 1, UMT_INVERT_YES);
    assert_float_equal(flipped[0], 245.0f / 255.0f, 1e-7);
    free(kept);
    free(flipped);
}

static void expect_error(const char *name, umt_status status, const char *words) {
    const char *paths[] = {path_of("grey.png"), path_of(name)};
    umt_tensor *batch = (umt_tensor *)1;
    assert_int_equal(umt_images_load(ctx, paths, 2, 1, 28, 28, UMT_INVERT_NO, 0.0f, 1.0f, &batch), status);
    assert_null(batch);
    assert_non_null(strstr(umt_last_error(), name));
    assert_non_null(strstr(umt_last_error(), words));
}

static void test_bad_files_are_refused_naming_the_file(void **state) {
    (void)state;
    expect_error("missing.png", UMT_ERR_IO, "No such file");
    expect_error("garbage.png", UMT_ERR_FORMAT, "its first bytes are 74 68 69 73 20 69 73 20 (PNG starts");
    expect_error("empty.png", UMT_ERR_FORMAT, "none: the file is empty");
    expect_error("truncated.png", UMT_ERR_FORMAT, "not a readable PNG, JPEG or BMP image");
    expect_error("huge.png", UMT_ERR_FORMAT, "20000x1");
    /* Found by tests/fuzz: resizing it failed an assert in stb_image_resize, ending the process. */
    expect_error("zero-width.bmp", UMT_ERR_FORMAT, "image is 0x28, expected 1..16384 pixels on a side");
    /* Found by tests/fuzz too: a 138-byte PNG made stb_image ask for 2 GiB. */
    expect_error("long-chunk.png", UMT_ERR_FORMAT, "PNG chunk 'IDAT' at byte 33 says 2147483647 bytes of data");
    expect_error("sparse.bmp", UMT_ERR_FORMAT, "image is 16384x16384, more pixels than its 2406 bytes can hold");
}

static void test_formats_other_than_png_jpeg_and_bmp_are_refused(void **state) {
    (void)state;
    expect_error("grey.tga", UMT_ERR_FORMAT, "not a PNG, JPEG or BMP image: its first bytes are 00 00 03 00");
    expect_error("grey.pgm", UMT_ERR_FORMAT, "its first bytes are 50 35 0a 32 20 32 0a 32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_png_and_bmp_load_exactly_and_jpeg_closely),
        cmocka_unit_test(test_larger_images_are_resized_and_colour_is_split_into_channels),
        cmocka_unit_test(test_invert_auto_flips_only_light_backgrounds),
        cmocka_unit_test(test_bad_files_are_refused_naming_the_file),
        cmocka_unit_test(test_formats_other_than_png_jpeg_and_bmp_are_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
