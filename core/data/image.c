/*
 * core/data/image.c — image files into a normalised batch: read and resized by core/data/image_format.c
 * (stb_image, after its checks), then the same normalisation as the datasets.
 */
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/data/image_format.h"
#include "core/tensor.h"

/* Decodes path into channels-per-pixel bytes, resized to height x width: a malloc'ed buffer. */
static umt_status decode(const char *path, int channels, int height, int width, unsigned char **out) {
    unsigned char *pixels = malloc((size_t)width * (size_t)height * (size_t)channels);
    if (!pixels) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for a %dx%d image", path, width, height);
    umt_status status = umt_image_read(path, channels, height, width, pixels);
    if (status != UMT_OK) {
        free(pixels);
        return status;
    }
    *out = pixels;
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
    if (!ctx || !paths || !out) return umt_fail_null("umt_images_load", !ctx ? "ctx" : !paths ? "paths" : "out");
    if (count < 1 || (channels != 1 && channels != 3) || height < 1 || width < 1 ||
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
