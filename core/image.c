/*
 * core/image.c — image files into a normalised batch: decoding and resizing by stb (Debian's
 * libstb), then the same normalisation as the datasets.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include "core/context.h"
#include "core/error.h"
#include "core/image_format.h"
#include "core/tensor.h"

/* Decodes path into channels-per-pixel bytes, resized to height x width: a malloc'ed buffer. */
static umt_status decode(const char *path, int channels, int height, int width, unsigned char **out) {
    int w = 0, h = 0, file_channels = 0;
    size_t file_bytes = 0;
    UMT_TRY(umt_image_check_file(path, &file_bytes));
    if (!stbi_info(path, &w, &h, &file_channels))
        return umt_fail(UMT_ERR_FORMAT, "%s: not a readable PNG, JPEG or BMP image (%s)", path, stbi_failure_reason());
    UMT_TRY(umt_image_check_sides(path, w, h, file_bytes));
    unsigned char *pixels = stbi_load(path, &w, &h, &file_channels, channels);
    if (!pixels) return umt_fail(UMT_ERR_FORMAT, "%s: cannot decode (%s)", path, stbi_failure_reason());
    /* Again as decoded: the header said one thing to stbi_info; the decoder's word is final. */
    umt_status sides = umt_image_check_sides(path, w, h, file_bytes);
    if (sides != UMT_OK) {
        stbi_image_free(pixels);
        return sides;
    }
    /* Always into our own buffer, so the caller frees one kind of memory. */
    unsigned char *resized = malloc((size_t)width * (size_t)height * (size_t)channels);
    int ok = resized != NULL;
    if (ok && w == width && h == height) memcpy(resized, pixels, (size_t)width * (size_t)height * (size_t)channels);
    else if (ok) ok = stbir_resize_uint8(pixels, w, h, 0, resized, width, height, 0, channels);
    stbi_image_free(pixels);
    if (!ok) {
        free(resized);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: cannot resize %dx%d to %dx%d", path, w, h, width, height);
    }
    *out = resized;
    return UMT_OK;
}

/* One image's bytes (height*width pixels of `channels` interleaved) into CHW floats. */
static void normalise(const unsigned char *pixels, int64_t channels, int64_t hw, umt_invert invert, float mean,
                      float std, float *out) {
    double total = 0;
    for (int64_t i = 0; i < hw * channels; ++i) total += pixels[i];
    bool flip = invert == UMT_INVERT_YES || (invert == UMT_INVERT_AUTO && total / (double)(hw * channels) > 127.5);
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t i = 0; i < hw; ++i) {
            int v = pixels[i * channels + c];
            out[c * hw + i] = ((float)(flip ? 255 - v : v) / 255.0f - mean) / std;
        }
}

umt_status umt_images_load(umt_context *ctx, const char *const *paths, int64_t count, int64_t channels, int64_t height,
                           int64_t width, umt_invert invert, float mean, float std, umt_tensor **out) {
    if (!ctx || !paths || !out || count < 1 || (channels != 1 && channels != 3) || height < 1 || width < 1 ||
        height > UMT_IMAGE_MAX_SIDE || width > UMT_IMAGE_MAX_SIDE || !(std > 0))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "umt_images_load: %lld images of %lldx%lldx%lld, std %g (expected 1 or 3 channels, std > 0)",
                        (long long)count, (long long)channels, (long long)height, (long long)width, std);
    *out = NULL;
    int64_t per_image = channels * height * width;
    float *host = malloc((size_t)(count * per_image) * sizeof *host);
    if (!host) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_images_load: no memory for %lld images", (long long)count);
    umt_status st = UMT_OK;
    for (int64_t i = 0; i < count && st == UMT_OK; ++i) {
        unsigned char *pixels = NULL;
        st = decode(paths[i], (int)channels, (int)height, (int)width, &pixels);
        if (st == UMT_OK) normalise(pixels, channels, height * width, invert, mean, std, host + i * per_image);
        free(pixels);
    }
    umt_tensor *batch = st == UMT_OK ? umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4,
                                                        (int64_t[]){count, channels, height, width})
                                     : NULL;
    if (st == UMT_OK && !batch) st = umt_last_status();
    if (st == UMT_OK) st = umt_tensor_copy_from_host(batch, host, batch->bytes);
    free(host);
    if (st == UMT_OK) *out = batch;
    return st;
}
