/*
 * tests/fuzz/fuzz_image.c — fuzz target: image files into a batch (umt_images_load: the checks of
 * core/data/image_format.c, then stb_image's decoders and resizer, which see every byte of a file
 * a user hands to examples/predict). stb is compiled in the build (core/data/stb_image.c), so under
 * --config=asan and tools/fuzz.sh the decoder is instrumented like umtrain's own code: a memory
 * error or undefined behaviour inside stb_image stops the run.
 *
 * The rules, from include/umtrain.h: an accepted file starts as a PNG, JPEG or BMP file does and
 * gives a [1, 1, 28, 28] batch of finite values in [0, 1] (mean 0, std 1); a refused one gives
 * UMT_ERR_FORMAT, no batch and a message that names the file.
 *
 * A PNG whose chunks' CRCs do not match is refused before stb sees it, and a fuzzer cannot forge
 * CRCs; so each PNG input is also run with its CRCs made right, which takes the changed bytes into
 * the decoder.
 *
 * Uninitialised reads are not seen (GCC has no MemorySanitizer): on some corrupt PNG and JPEG
 * files stb_image's decoders read memory they never wrote (valgrind shows them), so whether such
 * a file decodes can differ between builds. One kind is known and refused now: a JPEG scan that
 * decodes with a table no segment defined (core/data/image_format.c). The rules hold either way.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stb/stb_image_write.h>
#include <zlib.h>

#include "tests/fuzz/fuzz_target.h"
#include "umtrain.h"

const char *const fuzz_target_name = "image";
/* A BMP's pixel rows, a JPEG's scan and a PNG's chunks after the image data may be cut short
 * and still decode (stb_image fills in what is missing): truncations are not all refused. */
const bool fuzz_truncations_refused = false;

#define SIDE 28

static umt_context *context(void) {
    static umt_context *ctx;
    if (!ctx) {
        umt_context_options options = umt_context_defaults();
        options.device = UMT_DEVICE_CPU;
        FUZZ_REQUIRE(umt_context_create(&options, &ctx) == UMT_OK, "umt_context_create");
    }
    return ctx;
}

static void check_batch(umt_tensor *batch) {
    FUZZ_REQUIRE(batch != NULL, "accepted without a batch");
    FUZZ_REQUIRE(umt_tensor_numel(batch) == SIDE * SIDE && umt_tensor_dim(batch, 0) == 1 &&
                     umt_tensor_dim(batch, 1) == 1,
                 "a batch of %lld values", (long long)umt_tensor_numel(batch));
    float values[SIDE * SIDE];
    FUZZ_REQUIRE(umt_tensor_copy_to_host(batch, values, sizeof values) == UMT_OK, "reading the batch");
    for (int i = 0; i < SIDE * SIDE; ++i)
        FUZZ_REQUIRE(isfinite(values[i]) && values[i] >= 0.0f && values[i] <= 1.0f, "value %d is %g", i,
                     (double)values[i]);
}

/* One input through umt_images_load and the rules; true when it was accepted. */
static bool run_one(const uint8_t *data, size_t size) {
    static const char *path;
    if (!path) path = fuzz_scratch_path();
    fuzz_write_file(path, data, size);
    umt_context *ctx = context();
    FUZZ_REQUIRE(umt_step_begin(ctx) == UMT_OK, "umt_step_begin"); /* frees the last batch */
    umt_tensor *batch = NULL;
    const char *paths[] = {path};
    umt_status status = umt_images_load(ctx, paths, 1, 1, SIDE, SIDE, UMT_INVERT_AUTO, 0.0f, 1.0f, &batch);
    if (status == UMT_OK) {
        static const uint8_t png = 0x89, jpeg = 0xff, bmp = 'B';
        FUZZ_REQUIRE(size >= 2 && (data[0] == png || data[0] == jpeg || data[0] == bmp),
                     "accepted a file that starts with 0x%02x", size ? data[0] : 0);
        check_batch(batch);
        return true;
    }
    FUZZ_REQUIRE(status == UMT_ERR_FORMAT, "refused with %s", umt_status_name(status));
    FUZZ_REQUIRE(batch == NULL, "refused, yet a batch came out");
    FUZZ_REQUIRE(strstr(umt_last_error(), path) != NULL, "the message does not name %s", path);
    return false;
}

static const uint8_t png_signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static uint32_t big_endian_32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* The CRC of every whole chunk of a PNG (length, type, data, CRC) made right, in place; true when
 * one changed. */
static bool fix_png_crcs(uint8_t *png, size_t size) {
    bool changed = false;
    for (size_t at = sizeof png_signature; at + 12 <= size;) {
        uint32_t length = big_endian_32(png + at);
        if (length > size - at - 12) break;
        uint32_t crc = (uint32_t)crc32(0L, png + at + 4, 4 + length);
        uint8_t *stored = png + at + 8 + length;
        changed = changed || big_endian_32(stored) != crc;
        for (int i = 0; i < 4; ++i) stored[i] = (uint8_t)(crc >> (24 - 8 * i));
        at += 12 + (size_t)length;
    }
    return changed;
}

bool fuzz_one(const uint8_t *data, size_t size) {
    bool accepted = run_one(data, size);
    if (size < sizeof png_signature || memcmp(data, png_signature, sizeof png_signature) != 0) return accepted;
    uint8_t *fixed = malloc(size);
    FUZZ_REQUIRE(fixed != NULL, "no memory for a copy of %zu bytes", size);
    memcpy(fixed, data, size);
    if (fix_png_crcs(fixed, size)) (void)run_one(fixed, size);
    free(fixed);
    return accepted;
}

/* ----------------------------------------------------------------------------------------- */
/* Seeds: small PNG, BMP and JPEG files written by stb_image_write, and hostile ones made of them */

/* seed-4: seed-1 (a BMP of 8 x 8 pixels, 24 bits each, from byte 54) stored top row first, as a
 * negative height (an int32 at byte 22) says. */
static void write_top_down_bmp(const char *dir) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/seed-1", dir);
    snprintf(to, sizeof to, "%s/seed-4", dir);
    size_t size = 0, row = 8 * 3;
    uint8_t *bmp = fuzz_read_file(from, &size), flipped[54 + 8 * 8 * 3];
    FUZZ_REQUIRE(size == sizeof flipped, "seed-1 is %zu bytes", size);
    memcpy(flipped, bmp, 54);
    for (size_t y = 0; y < 8; ++y) memcpy(flipped + 54 + y * row, bmp + 54 + (7 - y) * row, row);
    static const uint8_t minus_8[4] = {0xf8, 0xff, 0xff, 0xff};
    memcpy(flipped + 22, minus_8, sizeof minus_8);
    fuzz_write_file(to, flipped, size);
    free(bmp);
}

/* refused-2: seed-2 (a JPEG) with its AC Huffman table 0 defined as table 2 (stb writes one DHT
 * segment of four tables: DC 0, AC 0, DC 1, AC 1), so that its scan uses a table no segment
 * defines. */
static void write_undefined_huffman_jpeg(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-2", dir);
    size_t size = 0, at = 2;
    uint8_t *jpeg = fuzz_read_file(path, &size);
    while (at + 4 < size && !(jpeg[at] == 0xff && jpeg[at + 1] == 0xc4)) at++;
    size_t second = at + 4 + 17;
    for (int i = 1; i <= 16 && second < size; ++i) second += jpeg[at + 4 + i];
    FUZZ_REQUIRE(second < size && jpeg[second] == 0x10, "seed-2 has no AC table 0 where expected");
    jpeg[second] = 0x12;
    snprintf(path, sizeof path, "%s/refused-2", dir);
    fuzz_write_file(path, jpeg, size);
    free(jpeg);
}

/* refused-0: seed-2 (a JPEG) with a Huffman table of 257 codes after its start of image, one
 * more than a table can hold (stb_image 2.27 wrote past its tables on it); refused-1: seed-0 (a
 * PNG) with a bit of its IDAT chunk's data flipped, so that the chunk's CRC no longer holds. */
static void write_refused(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-2", dir);
    size_t size = 0;
    uint8_t *jpeg = fuzz_read_file(path, &size), *out = malloc(size + 4 + 17 + 257);
    FUZZ_REQUIRE(out != NULL && size > 2, "seed-2 is %zu bytes", size);
    size_t at = 0;
    out[at++] = 0xff, out[at++] = 0xd8, out[at++] = 0xff, out[at++] = 0xc4; /* start of image, DHT */
    out[at++] = (2 + 17 + 257) >> 8, out[at++] = (2 + 17 + 257) & 0xff, out[at++] = 0x00;
    for (int i = 0; i < 16; ++i) out[at++] = i == 14 ? 2 : i == 15 ? 255 : 0; /* 2 codes of 15 bits, 255 of 16 */
    for (int i = 0; i < 257; ++i) out[at++] = (uint8_t)i;
    memcpy(out + at, jpeg + 2, size - 2);
    snprintf(path, sizeof path, "%s/refused-0", dir);
    fuzz_write_file(path, out, at + size - 2);
    free(out);
    free(jpeg);
    snprintf(path, sizeof path, "%s/seed-0", dir);
    uint8_t *png = fuzz_read_file(path, &size);
    FUZZ_REQUIRE(size > 50, "seed-0 is %zu bytes", size);
    png[45] ^= 0x10; /* the IDAT chunk starts at byte 33; its data at 41 */
    snprintf(path, sizeof path, "%s/refused-1", dir);
    fuzz_write_file(path, png, size);
    free(png);
}

int fuzz_write_seeds(const char *dir) {
    unsigned char small[8 * 8], full[SIDE * SIDE];
    for (int i = 0; i < 8 * 8; ++i) small[i] = (unsigned char)(i * 4);
    for (int i = 0; i < SIDE * SIDE; ++i) full[i] = (unsigned char)(i % SIDE < SIDE / 2 ? 20 : 230);
    char path[4][4096];
    for (int i = 0; i < 4; ++i) snprintf(path[i], sizeof path[i], "%s/seed-%d", dir, i);
    /* 8 x 8 ones are resized; the 28 x 28 PNG is not (a light right half: inverted). */
    int ok = stbi_write_png(path[0], 8, 8, 1, small, 8) && stbi_write_bmp(path[1], 8, 8, 1, small) &&
             stbi_write_jpg(path[2], 8, 8, 1, small, 90) && stbi_write_png(path[3], SIDE, SIDE, 1, full, SIDE);
    if (!ok) {
        fprintf(stderr, "fuzz_image: cannot write the seeds into %s\n", dir);
        return -1;
    }
    write_top_down_bmp(dir);
    write_refused(dir);
    write_undefined_huffman_jpeg(dir);
    return 5;
}
