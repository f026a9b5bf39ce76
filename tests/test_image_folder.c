/*
 * tests/test_image_folder.c — image folders: PNG, JPEG and BMP files the test writes itself into
 * class folders, read through the loader (decoded in its threads, resized), the two ways to
 * split train and test, and bad trees: a corrupt file, a truncated one, a colour file among grey
 * ones, an empty class folder, entries that are not regular files — each an error naming it, or
 * skipped and counted (once) with skip_bad; and an empty split named by the loader. Then
 * examples/image_folder on such trees: its count of skipped files, an empty test split.
 *
 * argv[1] is the image_folder binary (tests/BUILD passes its location).
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

#include "tests/run_program.h"
#include "umtrain.h"

static const char *image_folder_binary;
static char root[64];

static const char *path_of(const char *relative) {
    static char paths[4][256];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 256, "%s/%s", root, relative);
    return p;
}

static void make_dir(const char *relative) { assert_int_equal(mkdir(path_of(relative), 0700), 0); }

/* An 8x8 image of `channels` filled with value (the label is then readable from the pixels). */
static void write_image(const char *relative, const char *format, int channels, uint8_t value) {
    uint8_t pixels[64 * 3];
    memset(pixels, value, sizeof pixels);
    const char *path = path_of(relative);
    int ok = !strcmp(format, "png")   ? stbi_write_png(path, 8, 8, channels, pixels, 8 * channels)
             : !strcmp(format, "bmp") ? stbi_write_bmp(path, 8, 8, channels, pixels)
                                      : stbi_write_jpg(path, 8, 8, channels, pixels, 100);
    assert_true(ok);
}

static void write_bytes(const char *relative, const char *bytes, size_t n) {
    FILE *f = fopen(path_of(relative), "wb");
    assert_non_null(f);
    fwrite(bytes, 1, n, f);
    fclose(f);
}

/* root/<a|b>/ with n files each, values 40 (a) and 200 (b): colour ones PNG, JPEG and BMP in
 * turn; grey ones PNG (stb's JPEG and BMP writers always write three components). */
static void write_classes(const char *under, int n, int channels) {
    const char *formats[] = {"png", "bmp", "jpg"};
    int format_count = channels == 3 ? 3 : 1;
    for (int c = 0; c < 2; ++c) {
        char name[128];
        snprintf(name, sizeof name, "%s%s", under, c ? "b" : "a");
        make_dir(name);
        for (int i = 0; i < n; ++i) {
            const char *format = formats[i % format_count];
            snprintf(name, sizeof name, "%s%s/%02d.%s", under, c ? "b" : "a", i, format);
            write_image(name, format, channels, c ? 200 : 40);
        }
    }
}

static int fresh_root(void **state) {
    (void)state;
    snprintf(root, sizeof root, "/tmp/umt_folder_XXXXXX");
    return mkdtemp(root) ? 0 : -1;
}

static int remove_root(void **state) {
    (void)state;
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", root);
    return system(command);
}

static umt_image_folder_options folder_options(int channels) {
    return (umt_image_folder_options){.root = root, .channels = channels, .height = 4, .width = 4, .test_fraction = 0.25};
}

/* Reads every sample of samples through a loader (no shuffle) and checks that label c has
 * pixel value 40 or 200 (JPEG within a few grey levels); returns the count per class. */
static void read_all(umt_samples *samples, int64_t per_class[2]) {
    umt_context *ctx;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_loader_options o = umt_loader_defaults();
    o.batch_size = 5;
    o.workers = 2;
    o.shuffle = false;
    umt_loader *loader;
    assert_int_equal(umt_loader_create(ctx, samples, &o, &loader), UMT_OK);
    assert_int_equal(umt_loader_start_epoch(loader, 0, NULL), UMT_OK);
    per_class[0] = per_class[1] = 0;
    for (;;) {
        umt_tensor *x, *y;
        assert_int_equal(umt_step_begin(ctx), UMT_OK);
        if (umt_loader_next(loader, &x, &y) != UMT_OK) fail_msg("%s", umt_last_error());
        if (!x) break;
        int64_t n = umt_tensor_dim(x, 0);
        int64_t per_sample = umt_tensor_dim(x, 1) * 16;
        float pixels[5 * 3 * 16];
        int32_t labels[5];
        assert_int_equal(umt_tensor_dim(x, 2), 4);
        assert_int_equal(umt_tensor_copy_to_host(x, pixels, (size_t)(n * per_sample) * sizeof(float)), UMT_OK);
        assert_int_equal(umt_tensor_copy_to_host(y, labels, (size_t)n * sizeof(int32_t)), UMT_OK);
        for (int64_t i = 0; i < n * per_sample; ++i)
            assert_float_equal(pixels[i] * 255.0f, labels[i / per_sample] ? 200.0f : 40.0f, 3.0f);
        for (int64_t i = 0; i < n; ++i) per_class[labels[i]]++;
    }
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* Tests */

static void test_train_and_test_folders_are_read_through_the_loader(void **state) {
    (void)state;
    make_dir("train");
    make_dir("test");
    write_classes("train/", 6, 3);
    write_classes("test/", 3, 3);
    write_bytes("train/a/notes.txt", "not an image, not a problem", 27);
    umt_samples *train, *test;
    umt_image_folder_options o = folder_options(0);
    if (umt_image_folder_open(&o, &train, &test) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_int_equal(umt_samples_size(train), 12);
    assert_int_equal(umt_samples_size(test), 6);
    assert_int_equal(umt_samples_num_classes(train), 2);
    assert_string_equal(umt_samples_class_name(train, 1), "b");
    int64_t chw[3];
    umt_samples_shape(test, chw);
    assert_true(chw[0] == 3 && chw[1] == 4 && chw[2] == 4);
    int64_t counts[2];
    read_all(train, counts);
    assert_true(counts[0] == 6 && counts[1] == 6);
    read_all(test, counts);
    assert_true(counts[0] == 3 && counts[1] == 3);
    assert_int_equal(umt_samples_skipped(train), 0);
    umt_samples_destroy(train);
    umt_samples_destroy(test);
}

static void test_without_split_folders_a_fraction_of_each_class_is_test(void **state) {
    (void)state;
    write_classes("", 8, 1);
    umt_samples *train, *test;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, &test), UMT_OK);
    int64_t counts[2];
    read_all(test, counts);
    assert_true(counts[0] == 2 && counts[1] == 2);
    read_all(train, counts);
    assert_true(counts[0] == 6 && counts[1] == 6);
    umt_samples_destroy(train);
    umt_samples_destroy(test);
}

static void test_a_corrupt_file_stops_or_is_skipped_and_counted(void **state) {
    (void)state;
    write_classes("", 3, 1);
    write_bytes("b/broken.png", "\x89PNG garbage, no header", 22);
    umt_samples *train = NULL;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), "b/broken.png"));
    assert_null(train);
    o.skip_bad = true;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_OK);
    assert_int_equal(umt_samples_skipped(train), 1);
    assert_non_null(strstr(umt_samples_first_skip(train), "b/broken.png"));
    assert_int_equal(umt_samples_size(train), 6); /* a quarter of three files rounds to no test file */
    umt_samples_destroy(train);
}

/* Opening the folder (1 channel) must fail with UMT_ERR_FORMAT, naming `words`, and give nothing. */
static void expect_open_fails_naming(const char *words) {
    umt_samples *train = NULL;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), words));
    assert_null(train);
}

/* stb_image would read this 2 x 2 TGA (which has no signature); a folder of PNG, JPEG and BMP
 * files must not take it for an image, whatever its name says. */
static void test_a_file_of_another_format_named_png_is_refused_by_its_first_bytes(void **state) {
    (void)state;
    write_classes("", 3, 1);
    static const char tga[] = {0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 8, 0, 0, (char)255, (char)128, 64};
    write_bytes("a/targa.png", tga, sizeof tga);
    expect_open_fails_naming("a/targa.png: not a PNG, JPEG or BMP image: its first bytes are 00 00 03");
}

static void test_a_colour_file_among_grey_ones_names_the_file(void **state) {
    (void)state;
    write_classes("", 3, 1);
    uint8_t rgb[8 * 8 * 3] = {0};
    assert_true(stbi_write_png(path_of("a/zz_colour.png"), 8, 8, 3, rgb, 8 * 3));
    umt_samples *train;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), "a/zz_colour.png"));
    assert_non_null(strstr(umt_last_error(), "colour"));
    /* With channels from the first file (grey, "a/00.png") the colour file is still wrong. */
    o.channels = 0;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    o.channels = 3;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), "a/00.png"));
}

static void test_an_empty_class_folder_is_named(void **state) {
    (void)state;
    write_classes("", 3, 1);
    make_dir("c");
    umt_samples *train;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), "/c has no readable"));
    o.skip_bad = true;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_OK);
    assert_int_equal(umt_samples_num_classes(train), 3);
    assert_int_equal(umt_samples_skipped(train), 1);
    umt_samples_destroy(train);
}

/* One batch of every sample of train through the loader: it must fail, naming `words`. Frees train. */
static void expect_first_batch_fails_naming(umt_samples *train, const char *words) {
    umt_context *ctx;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_loader_options lo = umt_loader_defaults();
    lo.batch_size = umt_samples_size(train);
    umt_loader *loader;
    umt_tensor *x, *y;
    assert_int_equal(umt_loader_create(ctx, train, &lo, &loader), UMT_OK);
    assert_int_equal(umt_loader_start_epoch(loader, 0, NULL), UMT_OK);
    assert_int_equal(umt_loader_next(loader, &x, &y), UMT_ERR_FORMAT);
    assert_non_null(strstr(umt_last_error(), words));
    umt_context_destroy(ctx);
    umt_samples_destroy(train);
}

/* A 64 x 64 grey PNG of varied pixels written at relative; its bytes into bytes[8192]. */
static size_t varied_png(const char *relative, char *bytes) {
    uint8_t pixels[64 * 64];
    for (int i = 0; i < 64 * 64; ++i) pixels[i] = (uint8_t)(i * 37);
    assert_true(stbi_write_png(path_of(relative), 64, 64, 1, pixels, 64));
    FILE *f = fopen(path_of(relative), "rb");
    assert_non_null(f);
    size_t n = fread(bytes, 1, 8192, f);
    fclose(f);
    assert_true(n > 80 && n < 8192);
    return n;
}

/* A PNG at relative whose header, chunk lengths and CRCs are intact but whose compressed pixels
 * are garbage: only the decoder can tell. */
static void write_png_that_does_not_decode(const char *relative) {
    char bytes[8192];
    size_t n = varied_png(relative, bytes);
    memset(bytes + 45, 0xff, 32); /* the zlib stream starts at byte 41: signature, IHDR, IDAT's head */
    /* The IDAT chunk's CRC (of its type and data, after them) made right again: CRC-32, bitwise. */
    uint32_t length = (uint32_t)(uint8_t)bytes[33] << 24 | (uint32_t)(uint8_t)bytes[34] << 16 |
                      (uint32_t)(uint8_t)bytes[35] << 8 | (uint8_t)bytes[36];
    uint32_t crc = 0xffffffffu;
    for (uint32_t i = 0; i < 4 + length; ++i) {
        crc ^= (uint8_t)bytes[37 + i];
        for (int bit = 0; bit < 8; ++bit) crc = crc >> 1 ^ (0xedb88320u & -(crc & 1));
    }
    crc ^= 0xffffffffu;
    for (int i = 0; i < 4; ++i) bytes[41 + length + i] = (char)(crc >> (24 - 8 * i));
    write_bytes(relative, bytes, n);
}

static void test_a_corrupt_pixel_stream_fails_the_batch_that_decodes_it(void **state) {
    (void)state;
    write_classes("", 3, 1);
    write_png_that_does_not_decode("a/01_bad.png");
    umt_image_folder_options o = folder_options(1);
    o.test_fraction = 0;
    umt_samples *train;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_OK);
    expect_first_batch_fails_naming(train, "a/01_bad.png: cannot decode");
}

/* Cut short, its last chunk runs past the end of the file: refused at the scan, before stb_image
 * would allocate what the chunk says. */
static void test_a_truncated_png_is_refused_at_the_scan(void **state) {
    (void)state;
    write_classes("", 3, 1);
    char bytes[8192];
    varied_png("a/01_cut.png", bytes);
    write_bytes("a/01_cut.png", bytes, 80);
    expect_open_fails_naming("a/01_cut.png: PNG chunk 'IDAT' at byte 33 says");
}

/* A file replaced after the scan by a BMP whose header says width 0 (stb_image decodes it; its
 * resizer would then fail an assert and end the process): an error naming it instead. */
static void test_a_file_decoded_with_no_width_fails_the_batch_naming_it(void **state) {
    (void)state;
    write_classes("", 3, 1);
    umt_image_folder_options o = folder_options(1);
    o.test_fraction = 0;
    umt_samples *train;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_OK);
    write_image("a/00.png", "bmp", 1, 40);
    FILE *f = fopen(path_of("a/00.png"), "r+b");
    assert_non_null(f);
    static const char zero_width[4] = {0}; /* the BMP header's width: an int32 at byte 18 */
    assert_int_equal(fseek(f, 18, SEEK_SET), 0);
    assert_int_equal(fwrite(zero_width, 1, sizeof zero_width, f), sizeof zero_width);
    assert_int_equal(fclose(f), 0);
    expect_first_batch_fails_naming(train, "a/00.png: image is 0x8, expected 1..16384 pixels on a side");
}

/* With train/ and test/ folders, a bad file in train/ is one skipped file between the two splits. */
static void test_a_skipped_file_is_counted_once(void **state) {
    (void)state;
    make_dir("train");
    make_dir("test");
    write_classes("train/", 3, 1);
    write_classes("test/", 2, 1);
    write_bytes("train/b/broken.png", "\x89PNG garbage, no header", 22);
    umt_samples *train, *test;
    umt_image_folder_options o = folder_options(1);
    o.skip_bad = true;
    if (umt_image_folder_open(&o, &train, &test) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_int_equal(umt_samples_skipped(train) + umt_samples_skipped(test), 1);
    assert_int_equal(umt_samples_skipped(train), 1);
    assert_non_null(strstr(umt_samples_first_skip(train), "train/b/broken.png"));
    assert_null(umt_samples_first_skip(test));
    umt_samples_destroy(train);
    umt_samples_destroy(test);
}

/* A header that reads well and pixels that do not decode: with skip_bad the scan decodes every
 * file, so the file is skipped there and never stops an epoch. */
static void test_with_skip_bad_a_file_that_does_not_decode_is_skipped(void **state) {
    (void)state;
    write_classes("", 3, 1);
    write_png_that_does_not_decode("a/01_bad.png");
    umt_image_folder_options o = folder_options(1);
    o.test_fraction = 0;
    o.skip_bad = true;
    umt_samples *train;
    if (umt_image_folder_open(&o, &train, NULL) != UMT_OK) fail_msg("%s", umt_last_error());
    assert_int_equal(umt_samples_skipped(train), 1);
    assert_non_null(strstr(umt_samples_first_skip(train), "a/01_bad.png: cannot decode"));
    assert_int_equal(umt_samples_size(train), 6);
    int64_t counts[2];
    read_all(train, counts);
    assert_true(counts[0] == 3 && counts[1] == 3);
    umt_samples_destroy(train);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A FIFO (whose open would wait for a writer), a folder named like an image, a loop of links
 * and a link to /dev/zero, each in a class folder: an error naming it within a second (the
 * alarm fails the test after 5 s instead of waiting forever), or skipped and counted. */
static void test_entries_that_are_not_regular_files_are_refused_or_skipped(void **state) {
    (void)state;
    write_classes("", 3, 1);
    assert_int_equal(mkfifo(path_of("a/fifo.png"), 0600), 0);
    make_dir("a/folder.png");
    assert_int_equal(symlink("loop-b.png", path_of("b/loop-a.png")), 0);
    assert_int_equal(symlink("loop-a.png", path_of("b/loop-b.png")), 0);
    assert_int_equal(symlink("/dev/zero", path_of("b/zero.png")), 0);
    const char *entries[] = {"a/fifo.png", "a/folder.png", "b/loop-a.png", "b/zero.png"};
    const char *words[] = {"a FIFO, not a regular file", "a directory, not a regular file",
                           "Too many levels of symbolic links", "a character device, not a regular file"};
    alarm(5);
    double start = seconds();
    for (int i = 0; i < 4; ++i) {
        umt_samples *train = NULL;
        umt_image_folder_options o = folder_options(1);
        assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_IO);
        assert_null(train);
        assert_non_null(strstr(umt_last_error(), entries[i]));
        assert_non_null(strstr(umt_last_error(), words[i]));
        /* The next run meets the next entry: this one goes (a link is removed, not its target). */
        assert_int_equal(remove(path_of(entries[i])), 0);
        if (i == 2) assert_int_equal(unlink(path_of("b/loop-b.png")), 0);
    }
    alarm(0);
    assert_true(seconds() - start < 1.0);
}

static void test_with_skip_bad_entries_that_are_not_regular_files_are_skipped(void **state) {
    (void)state;
    write_classes("", 3, 1);
    assert_int_equal(mkfifo(path_of("a/fifo.png"), 0600), 0);
    make_dir("a/folder.png");
    assert_int_equal(symlink("loop-b.png", path_of("b/loop-a.png")), 0);
    assert_int_equal(symlink("loop-a.png", path_of("b/loop-b.png")), 0);
    assert_int_equal(symlink("/dev/zero", path_of("b/zero.png")), 0);
    umt_samples *train = NULL;
    umt_image_folder_options o = folder_options(1);
    o.skip_bad = true;
    o.test_fraction = 0;
    alarm(5);
    if (umt_image_folder_open(&o, &train, NULL) != UMT_OK) fail_msg("%s", umt_last_error());
    alarm(0);
    assert_int_equal(umt_samples_skipped(train), 5);
    assert_non_null(strstr(umt_samples_first_skip(train), "a/fifo.png: a FIFO"));
    assert_int_equal(umt_samples_size(train), 6);
    umt_samples_destroy(train);
}

/* Three files a class and a test fraction of a quarter give no test file: a loader over the
 * empty split says which split of which folder is empty. */
static void test_a_loader_over_an_empty_split_names_it(void **state) {
    (void)state;
    write_classes("", 3, 1);
    umt_samples *train, *test;
    umt_image_folder_options o = folder_options(1);
    assert_int_equal(umt_image_folder_open(&o, &train, &test), UMT_OK);
    assert_int_equal(umt_samples_size(test), 0);
    umt_context *ctx;
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_loader_options lo = umt_loader_defaults();
    umt_loader *loader;
    assert_int_equal(umt_loader_create(ctx, test, &lo, &loader), UMT_ERR_INVALID_ARGUMENT);
    char expected[256];
    snprintf(expected, sizeof expected, "umt_loader_create: the test split of image folder %s is empty (0 samples",
             root);
    if (!strstr(umt_last_error(), expected)) fail_msg("%s", umt_last_error());
    umt_context_destroy(ctx);
    umt_samples_destroy(train);
    umt_samples_destroy(test);
}

static void test_a_missing_root_and_bad_options_are_refused(void **state) {
    (void)state;
    umt_samples *train;
    umt_image_folder_options o = folder_options(1);
    o.root = "/nonexistent/umt_folder";
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_IO);
    assert_non_null(strstr(umt_last_error(), "/nonexistent/umt_folder"));
    o = folder_options(1);
    o.channels = 2;
    assert_int_equal(umt_image_folder_open(&o, &train, NULL), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "channels 2"));
}

/* ----------------------------------------------------------------------------------------- */
/* examples/image_folder */

/* Runs image_folder on root, one epoch of 8 x 8 images on the CPU, with more flags; its exit
 * status, and what it printed in out. */
static int run_example(const char *flags, char *out, size_t size) {
    char command[1024];
    snprintf(command, sizeof command, "timeout 60 %s --root %s --size 8 --epochs 1 --batch-size 4 --device cpu %s",
             image_folder_binary, root, flags);
    int status = run_program(command, out, size);
    print_message("%s", out);
    return status;
}

static void test_the_example_counts_a_skipped_file_once(void **state) {
    (void)state;
    make_dir("train");
    make_dir("test");
    write_classes("train/", 4, 1);
    write_classes("test/", 2, 1);
    write_bytes("train/b/broken.png", "\x89PNG garbage, no header", 22);
    char out[8192];
    assert_int_equal(run_example("--skip-bad", out, sizeof out), 0);
    assert_non_null(strstr(out, "8 training and 4 test images of 1x8x8, 1 skipped"));
    assert_non_null(strstr(out, "first skipped: "));
    assert_non_null(strstr(out, "train/b/broken.png"));
}

/* Three files a class and the default test fraction of 0.2 leave no test file: the example says
 * which split of which folder is empty, and trains without a test. */
static void test_the_example_names_an_empty_test_split(void **state) {
    (void)state;
    write_classes("", 3, 1);
    char out[8192], expected[256];
    assert_int_equal(run_example("", out, sizeof out), 0);
    snprintf(expected, sizeof expected, "the test split of %s has no images (expected image files in %s/test/<class>/",
             root, root);
    assert_non_null(strstr(out, expected));
    assert_non_null(strstr(out, "epoch 1 loss"));
    assert_null(strstr(out, "epoch 1 test accuracy"));
}

#define FOLDER_TEST(name) cmocka_unit_test_setup_teardown(name, fresh_root, remove_root)

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_image_folder PATH_TO_IMAGE_FOLDER\n");
        return 2;
    }
    image_folder_binary = argv[1];
    const struct CMUnitTest tests[] = {
        FOLDER_TEST(test_train_and_test_folders_are_read_through_the_loader),
        FOLDER_TEST(test_without_split_folders_a_fraction_of_each_class_is_test),
        FOLDER_TEST(test_a_corrupt_file_stops_or_is_skipped_and_counted),
        FOLDER_TEST(test_a_file_of_another_format_named_png_is_refused_by_its_first_bytes),
        FOLDER_TEST(test_a_colour_file_among_grey_ones_names_the_file),
        FOLDER_TEST(test_an_empty_class_folder_is_named),
        FOLDER_TEST(test_a_corrupt_pixel_stream_fails_the_batch_that_decodes_it),
        FOLDER_TEST(test_a_truncated_png_is_refused_at_the_scan),
        FOLDER_TEST(test_a_file_decoded_with_no_width_fails_the_batch_naming_it),
        FOLDER_TEST(test_a_missing_root_and_bad_options_are_refused),
        FOLDER_TEST(test_a_skipped_file_is_counted_once),
        FOLDER_TEST(test_with_skip_bad_a_file_that_does_not_decode_is_skipped),
        FOLDER_TEST(test_a_loader_over_an_empty_split_names_it),
        FOLDER_TEST(test_entries_that_are_not_regular_files_are_refused_or_skipped),
        FOLDER_TEST(test_with_skip_bad_entries_that_are_not_regular_files_are_skipped),
        FOLDER_TEST(test_the_example_counts_a_skipped_file_once),
        FOLDER_TEST(test_the_example_names_an_empty_test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
