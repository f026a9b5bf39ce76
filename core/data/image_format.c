/*
 * core/data/image_format.c — reading an image file through stb_image, after the checks it must pass
 * first (the header says which, and why).
 */
#include "core/data/image_format.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include "core/base/error.h"

static const unsigned char png_signature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* The first bytes of a PNG file, of a JPEG file (its start-of-image marker and the next marker's
 * first byte) and of a BMP file. */
static bool known_signature(const unsigned char *head, size_t bytes) {
    static const unsigned char jpeg[] = {0xff, 0xd8, 0xff}, bmp[] = {'B', 'M'};
    return (bytes >= sizeof png_signature && memcmp(head, png_signature, sizeof png_signature) == 0) ||
           (bytes >= sizeof jpeg && memcmp(head, jpeg, sizeof jpeg) == 0) ||
           (bytes >= sizeof bmp && memcmp(head, bmp, sizeof bmp) == 0);
}

static umt_status unknown_signature(const char *path, const unsigned char *head, size_t bytes) {
    char shown[3 * 8 + 1] = "";
    for (size_t i = 0, used = 0; i < bytes && i < 8; ++i)
        used += (size_t)snprintf(shown + used, sizeof shown - used, "%s%02x", i ? " " : "", head[i]);
    return umt_fail(UMT_ERR_FORMAT,
                    "%s: not a PNG, JPEG or BMP image: its first bytes are %s (PNG starts 89 50 4e 47, JPEG ff d8 ff, "
                    "BMP 42 4d)",
                    path, bytes ? shown : "none: the file is empty");
}

/* Every chunk of a PNG (a 4-byte big-endian length, a 4-byte type, the data, a 4-byte CRC) must
 * end inside the file, up to IEND. Each chunk takes 12 bytes at least, so the walk is short. */
static umt_status check_png_chunks(const char *path, FILE *f, size_t file_bytes) {
    size_t at = sizeof png_signature;
    while (at + 8 <= file_bytes) {
        unsigned char head[8];
        if (fseek(f, (long)at, SEEK_SET) != 0 || fread(head, 1, sizeof head, f) != sizeof head)
            return umt_fail(UMT_ERR_IO, "%s: cannot read the PNG chunk at byte %zu", path, at);
        uint32_t length = (uint32_t)head[0] << 24 | (uint32_t)head[1] << 16 | (uint32_t)head[2] << 8 | head[3];
        size_t room = file_bytes - at >= 12 ? file_bytes - at - 12 : 0; /* for the data, past head and CRC */
        if (length > room)
            return umt_fail(UMT_ERR_FORMAT, "%s: PNG chunk '%.4s' at byte %zu says %u bytes of data, the file has room for %zu",
                            path, (const char *)head + 4, at, length, room);
        if (memcmp(head + 4, "IEND", 4) == 0) break;
        at += 12 + (size_t)length;
    }
    return UMT_OK;
}

umt_status umt_image_check_file(const char *path, size_t *file_bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return umt_fail(UMT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    unsigned char head[8];
    size_t bytes = 0;
    umt_status status = fstat(fileno(f), &st) == 0 ? UMT_OK : umt_fail(UMT_ERR_IO, "%s: %s", path, strerror(errno));
    if (status == UMT_OK) {
        *file_bytes = (size_t)st.st_size;
        bytes = fread(head, 1, sizeof head, f);
        if (!known_signature(head, bytes)) status = unknown_signature(path, head, bytes);
    }
    if (status == UMT_OK && bytes == sizeof png_signature && memcmp(head, png_signature, bytes) == 0)
        status = check_png_chunks(path, f, *file_bytes);
    fclose(f);
    return status;
}

umt_status umt_image_check_sides(const char *path, int width, int height, size_t file_bytes) {
    if (width < 1 || height < 1 || width > UMT_IMAGE_MAX_SIDE || height > UMT_IMAGE_MAX_SIDE)
        return umt_fail(UMT_ERR_FORMAT, "%s: image is %dx%d, expected 1..%d pixels on a side", path, width, height,
                        UMT_IMAGE_MAX_SIDE);
    uint64_t pixels = (uint64_t)width * (uint64_t)height, room = (uint64_t)UMT_IMAGE_PIXELS_PER_BYTE * file_bytes;
    if (pixels > room && pixels > (1u << 16))
        return umt_fail(UMT_ERR_FORMAT, "%s: image is %dx%d, more pixels than its %zu bytes can hold", path, width,
                        height, file_bytes);
    return UMT_OK;
}

umt_status umt_image_check_header(const char *path, int *width, int *height, int *file_channels,
                                  size_t *file_bytes) {
    UMT_TRY(umt_image_check_file(path, file_bytes));
    if (!stbi_info(path, width, height, file_channels))
        return umt_fail(UMT_ERR_FORMAT, "%s: not a readable PNG, JPEG or BMP image (%s)", path, stbi_failure_reason());
    return umt_image_check_sides(path, *width, *height, *file_bytes);
}

umt_status umt_image_read(const char *path, int channels, int height, int width, unsigned char *out) {
    int w = 0, h = 0, file_channels = 0;
    size_t file_bytes = 0;
    UMT_TRY(umt_image_check_header(path, &w, &h, &file_channels, &file_bytes));
    unsigned char *pixels = stbi_load(path, &w, &h, &file_channels, channels);
    if (!pixels) return umt_fail(UMT_ERR_FORMAT, "%s: cannot decode (%s)", path, stbi_failure_reason());
    /* Again as decoded: the header said one thing to stbi_info; the decoder's word is final. */
    umt_status status = umt_image_check_sides(path, w, h, file_bytes);
    if (status == UMT_OK && w == width && h == height)
        memcpy(out, pixels, (size_t)width * (size_t)height * (size_t)channels);
    else if (status == UMT_OK && !stbir_resize_uint8(pixels, w, h, 0, out, width, height, 0, channels))
        status = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: cannot resize %dx%d to %dx%d", path, w, h, width, height);
    stbi_image_free(pixels);
    return status;
}
