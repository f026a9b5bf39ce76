/*
 * tests/test_images.c — image files into batches: PNG, BMP and JPEG written by the test with
 * stb's writer, grey and colour, resizing, inversion, a top-down BMP, and clear errors for bad
 * files: corrupt ones (a JPEG whose Huffman table is over-full, a PNG chunk with a bad CRC) and
 * paths that are not regular files (a FIFO, a directory, a loop of links, /dev/zero).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

/* The whole of path_of(name) into bytes (at most max); its size, or 0 when it cannot be read. */
static size_t read_file(const char *name, unsigned char *bytes, size_t max) {
    FILE *f = fopen(path_of(name), "rb");
    if (!f) return 0;
    size_t n = fread(bytes, 1, max, f);
    fclose(f);
    return n < max ? n : 0;
}

/* grey.jpg with a Huffman table (DHT segment) right after its start-of-image marker whose 16 code
 * counts sum to 510: a table holds at most 256 codes, and stb_image 2.27 writes every one of them
 * into its 257-byte table of code sizes. */
static int write_overfull_huffman_jpeg(void) {
    static unsigned char jpeg[16384], out[16384 + 4 + 17 + 510];
    size_t n = read_file("grey.jpg", jpeg, sizeof jpeg), at = 0;
    if (n < 2) return -1;
    out[at++] = 0xff, out[at++] = 0xd8;                            /* start of image */
    out[at++] = 0xff, out[at++] = 0xc4;                            /* DHT */
    out[at++] = (2 + 17 + 510) >> 8, out[at++] = (2 + 17 + 510) & 0xff; /* its length, itself included */
    out[at++] = 0x00;                                              /* a DC table, number 0 */
    for (int i = 0; i < 16; ++i) out[at++] = i < 14 ? 0 : 255;     /* 255 codes of 15 bits, 255 of 16 */
    for (int i = 0; i < 510; ++i) out[at++] = (unsigned char)i;    /* the symbols */
    memcpy(out + at, jpeg + 2, n - 2);
    return write_file("overfull-huffman.jpg", out, at + n - 2);
}

/* grey.jpg with its AC Huffman table 0 defined as table 2 instead: its scan then uses a table
 * that no segment defines (stb_image 2.27 decoded with memory it never wrote, and read past the
 * table). stb writes one DHT segment of four tables: DC 0, AC 0, DC 1, AC 1. */
static int write_undefined_huffman_jpeg(void) {
    static unsigned char jpeg[16384];
    size_t n = read_file("grey.jpg", jpeg, sizeof jpeg), at = 2;
    while (at + 4 < n && !(jpeg[at] == 0xff && jpeg[at + 1] == 0xc4)) at++;
    size_t second = at + 4 + 17; /* past the marker, the length and DC table 0's head */
    for (int i = 1; i <= 16 && second < n; ++i) second += jpeg[at + 4 + i];
    if (second >= n || jpeg[second] != 0x10) return -1;
    jpeg[second] = 0x12;
    return write_file("undefined-huffman.jpg", jpeg, n);
}

/* grey.png with an empty IDAT chunk (its CRC, of "IDAT" alone, is 35 af 06 1e) before its IDAT
 * chunk, which starts at byte 33 after the signature and IHDR. */
static int write_empty_idat_png(void) {
    static unsigned char png[4096], out[4096 + 12];
    static const unsigned char empty_idat[12] = {0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xaf, 0x06, 0x1e};
    size_t n = read_file("grey.png", png, sizeof png);
    if (n < 33) return -1;
    memcpy(out, png, 33);
    memcpy(out + 33, empty_idat, sizeof empty_idat);
    memcpy(out + 33 + sizeof empty_idat, png + 33, n - 33);
    return write_file("empty-idat.png", out, n + sizeof empty_idat);
}

/* grey.bmp (stb writes 24-bit rows, bottom row first) turned top-down: the height in the header
 * (an int32 at byte 22) negated and the rows stored top row first. */
static int write_top_down_bmp(void) {
    static unsigned char bmp[8192], flipped[8192];
    size_t n = read_file("grey.bmp", bmp, sizeof bmp), data = 54, row = 28 * 3;
    if (n != data + 28 * row) return -1;
    memcpy(flipped, bmp, data);
    for (size_t y = 0; y < 28; ++y) memcpy(flipped + data + y * row, bmp + data + (27 - y) * row, row);
    static const unsigned char minus_28[4] = {0xe4, 0xff, 0xff, 0xff};
    memcpy(flipped + 22, minus_28, sizeof minus_28);
    return write_file("top-down.bmp", flipped, n);
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
             stbi_write_bmp(path_of("sparse.bmp"), 28, 28, 1, grey) &&
             stbi_write_png(path_of("bad-crc.png"), 28, 28, 1, grey, 28);
    /* The BMP header's width (a little-endian int32 at byte 18) made 0: stb_image still reads it. */
    static const unsigned char zero[4] = {0};
    ok = ok && patch_file("zero-width.bmp", 18, zero, sizeof zero) == 0;
    /* The IDAT chunk's length (big-endian, at byte 33) made 2^31 - 1: stb_image would allocate it. */
    static const unsigned char huge_length[4] = {0x7f, 0xff, 0xff, 0xff};
    ok = ok && patch_file("long-chunk.png", 33, huge_length, sizeof huge_length) == 0;
    /* 16384 x 16384 pixels declared in 2.4 kB: width and height (int32 at bytes 18 and 22). */
    static const unsigned char side_16384[8] = {0x00, 0x40, 0, 0, 0x00, 0x40, 0, 0};
    ok = ok && patch_file("sparse.bmp", 18, side_16384, sizeof side_16384) == 0;
    /* A byte of the IDAT chunk's data (which starts at byte 41) changed: its CRC no longer holds. */
    static const unsigned char changed[1] = {0x55};
    ok = ok && patch_file("bad-crc.png", 50, changed, sizeof changed) == 0;
    ok = ok && write_overfull_huffman_jpeg() == 0 && write_top_down_bmp() == 0 && write_empty_idat_png() == 0 &&
         write_undefined_huffman_jpeg() == 0;
    /* Paths that are not regular files: a FIFO (whose open would wait for a writer), a folder
     * named like an image, two links to each other, and a link to /dev/zero (which never ends). */
    ok = ok && mkfifo(path_of("fifo.png"), 0600) == 0 && mkdir(path_of("folder.png"), 0700) == 0 &&
         symlink("loop-b.png", path_of("loop-a.png")) == 0 && symlink("loop-a.png", path_of("loop-b.png")) == 0 &&
         symlink("/dev/zero", path_of("zero.png")) == 0;
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
    const char *names[] = {"grey.png",       "grey.bmp",       "grey.jpg",   "big.png",      "rgb.png",
                           "huge.png",       "garbage.png",    "grey.tga",   "grey.pgm",     "empty.png",
                           "truncated.png",  "zero-width.bmp", "long-chunk.png", "sparse.bmp", "bad-crc.png",
                           "overfull-huffman.jpg", "top-down.bmp", "fifo.png", "loop-a.png", "loop-b.png",
                           "zero.png", "empty-idat.png", "undefined-huffman.jpg"};
    for (size_t i = 0; i < sizeof names / sizeof *names; ++i) unlink(path_of(names[i]));
    rmdir(path_of("folder.png"));
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

/* stb_image 2.27 wrote past its table of code sizes (stbi__build_huffman) on this file, already
 * when reading the header; umtrain's own walk of the JPEG's segments refuses it first. */
static void test_a_jpeg_whose_huffman_table_is_over_full_is_refused(void **state) {
    (void)state;
    expect_error("overfull-huffman.jpg", UMT_ERR_FORMAT,
                 "JPEG Huffman table (DHT segment at byte 2) declares 510 codes, at most 256");
}

/* Found by tools/fuzz.sh once stb_image was instrumented (UBSan: "index 18 out of bounds for type
 * 'unsigned int[18]'" in stbi__jpeg_huff_decode, on memory the decoder never wrote). */
static void test_a_jpeg_scan_whose_huffman_table_is_undefined_is_refused(void **state) {
    (void)state;
    expect_error("undefined-huffman.jpg", UMT_ERR_FORMAT,
                 "uses AC Huffman table 0, which no segment before it defines");
}

static void test_a_png_chunk_with_a_bad_crc_is_refused_naming_the_chunk(void **state) {
    (void)state;
    expect_error("bad-crc.png", UMT_ERR_FORMAT, "PNG chunk 'IDAT' at byte 33: its CRC is");
}

static void test_a_top_down_bmp_loads_as_the_bottom_up_one(void **state) {
    (void)state;
    const char *paths[] = {path_of("grey.bmp"), path_of("top-down.bmp")};
    float *x = load_host(paths, 2, 1, UMT_INVERT_NO);
    assert_memory_equal(x, x + 784, 784 * sizeof(float));
    free(x);
}

/* Found by tools/fuzz.sh once stb_image was instrumented: an empty first IDAT chunk made it copy
 * 0 bytes to a NULL pointer (UBSan: "null pointer passed as argument 1"). It is a valid file. */
static void test_a_png_whose_first_idat_chunk_is_empty_loads_as_without_it(void **state) {
    (void)state;
    const char *paths[] = {path_of("grey.png"), path_of("empty-idat.png")};
    float *x = load_host(paths, 2, 1, UMT_INVERT_NO);
    assert_memory_equal(x, x + 784, 784 * sizeof(float));
    free(x);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Each is refused at once, naming the path and what is there. A FIFO's open would wait for a
 * writer forever: the alarm ends the test (as a failure) after 5 s instead. */
static void test_paths_that_are_not_regular_files_are_refused_within_a_second(void **state) {
    (void)state;
    alarm(5);
    double start = seconds();
    expect_error("fifo.png", UMT_ERR_IO, "a FIFO, not a regular file (expected an image)");
    expect_error("folder.png", UMT_ERR_IO, "a directory, not a regular file (expected an image)");
    expect_error("loop-a.png", UMT_ERR_IO, "Too many levels of symbolic links");
    expect_error("zero.png", UMT_ERR_IO, "a character device, not a regular file (expected an image)");
    alarm(0);
    assert_true(seconds() - start < 1.0);
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
        cmocka_unit_test(test_a_jpeg_whose_huffman_table_is_over_full_is_refused),
        cmocka_unit_test(test_a_jpeg_scan_whose_huffman_table_is_undefined_is_refused),
        cmocka_unit_test(test_a_png_chunk_with_a_bad_crc_is_refused_naming_the_chunk),
        cmocka_unit_test(test_a_top_down_bmp_loads_as_the_bottom_up_one),
        cmocka_unit_test(test_a_png_whose_first_idat_chunk_is_empty_loads_as_without_it),
        cmocka_unit_test(test_paths_that_are_not_regular_files_are_refused_within_a_second),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
