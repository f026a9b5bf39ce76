/*
 * tests/fuzz/fuzz_image.c — fuzz target: image files into a batch (umt_images_load: the format
 * check of core/data/image_format.c, then stb_image's decoders and resizer, which Debian's libstb
 * provides and which see every byte of a file a user hands to examples/predict).
 *
 * The rules, from include/umtrain.h: an accepted file starts as a PNG, JPEG or BMP file does and
 * gives a [1, 1, 28, 28] batch of finite values in [0, 1] (mean 0, std 1); a refused one gives
 * UMT_ERR_FORMAT, no batch and a message that names the file. Memory errors inside stb_image
 * show up under AddressSanitizer like ours.
 *
 * Uninitialised reads do not: on some corrupt PNG and JPEG files stb_image's decoders read memory
 * they never wrote (valgrind shows them inside libstb), so whether such a file decodes can differ
 * between builds (the bit-flip sweep accepts a few more of them at -O2 than under the sanitizers).
 * The rules hold either way; it is a limit of Debian's libstb, not something umtrain can mend.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <stb/stb_image_write.h>

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

bool fuzz_one(const uint8_t *data, size_t size) {
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

/* ----------------------------------------------------------------------------------------- */
/* Seeds: small PNG, BMP and JPEG files written by stb_image_write */

int fuzz_write_seeds(const char *dir) {
    unsigned char small[8 * 8], full[SIDE * SIDE];
    for (int i = 0; i < 8 * 8; ++i) small[i] = (unsigned char)(i * 4);
    for (int i = 0; i < SIDE * SIDE; ++i) full[i] = (unsigned char)(i % SIDE < SIDE / 2 ? 20 : 230);
    char path[4][4096];
    for (int i = 0; i < 4; ++i) snprintf(path[i], sizeof path[i], "%s/seed-%d", dir, i);
    /* 8 x 8 ones are resized; the 28 x 28 PNG is not (a light right half: inverted). */
    int ok = stbi_write_png(path[0], 8, 8, 1, small, 8) && stbi_write_bmp(path[1], 8, 8, 1, small) &&
             stbi_write_jpg(path[2], 8, 8, 1, small, 90) && stbi_write_png(path[3], SIDE, SIDE, 1, full, SIDE);
    if (!ok) fprintf(stderr, "fuzz_image: cannot write the seeds into %s\n", dir);
    return ok ? 4 : -1;
}
