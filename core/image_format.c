/*
 * core/image_format.c — which files are read as images: PNG, JPEG and BMP, told by their first
 * bytes (core/image_format.h says why).
 */
#include "core/image_format.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* The first bytes of a PNG file, of a JPEG file (its start-of-image marker and the next marker's
 * first byte) and of a BMP file. */
static bool known_signature(const unsigned char *head, size_t bytes) {
    static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}, jpeg[] = {0xff, 0xd8, 0xff},
                               bmp[] = {'B', 'M'};
    return (bytes >= sizeof png && memcmp(head, png, sizeof png) == 0) ||
           (bytes >= sizeof jpeg && memcmp(head, jpeg, sizeof jpeg) == 0) ||
           (bytes >= sizeof bmp && memcmp(head, bmp, sizeof bmp) == 0);
}

umt_status umt_image_check_signature(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return umt_fail(UMT_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char head[8];
    size_t bytes = fread(head, 1, sizeof head, f);
    fclose(f);
    if (known_signature(head, bytes)) return UMT_OK;
    char shown[3 * sizeof head + 1] = "";
    for (size_t i = 0, used = 0; i < bytes; ++i)
        used += (size_t)snprintf(shown + used, sizeof shown - used, "%s%02x", i ? " " : "", head[i]);
    return umt_fail(UMT_ERR_FORMAT,
                    "%s: not a PNG, JPEG or BMP image: its first bytes are %s (PNG starts 89 50 4e 47, JPEG ff d8 ff, "
                    "BMP 42 4d)",
                    path, bytes ? shown : "none: the file is empty");
}
