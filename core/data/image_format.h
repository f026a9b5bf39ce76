/*
 * core/data/image_format.h — reading image files: which files umtrain hands to stb_image, and what it
 * checks first.
 *
 * stb_image (Debian's libstb) decodes the images, and it trusts what a file says: it reads GIF,
 * PSD, HDR, PIC, PNM and TGA besides the three formats umtrain promises, and TGA has no
 * signature, so any other file may pass for one; it allocates a PNG chunk's declared length
 * before reading it (a 138-byte file made it ask for 2 GiB: found by tests/fuzz/fuzz_image.c);
 * and it allocates an image's declared size whatever the file holds. So every image file is
 * checked here first (umt_image_read before decoding: core/data/image.c and the image folder's
 * loader; umt_image_check_header when the folder is scanned), and refused with a message naming
 * it when:
 *   - it does not start as a PNG, JPEG or BMP file does (its first bytes are shown);
 *   - a PNG chunk runs past the end of the file;
 *   - a side is outside 1..UMT_IMAGE_MAX_SIDE (stb_image reads a BMP of width 0, and then
 *     stb_image_resize fails an assert, ending the process);
 *   - it declares more pixels than its bytes can hold: UMT_IMAGE_PIXELS_PER_BYTE per byte.
 */
#ifndef UMT_CORE_DATA_IMAGE_FORMAT_H
#define UMT_CORE_DATA_IMAGE_FORMAT_H

#include <stddef.h>

#include "umtrain.h"

/* The most pixels on a side. */
#define UMT_IMAGE_MAX_SIDE 16384

/* The most pixels a file may declare per byte it holds, with 64 Ki pixels allowed to any file.
 * The densest real case is a PNG of 1-bit pixels: deflate gives at most 1032 bytes per byte it
 * reads, 8 pixels each (a JPEG needs a bit per 8 x 8 block, 512 pixels per byte; a BMP's pixels
 * are stored whole). */
#define UMT_IMAGE_PIXELS_PER_BYTE 8256

/* The file's signature, and for a PNG its chunks; its size in bytes goes to *file_bytes.
 * UMT_ERR_IO when it cannot be opened or read, UMT_ERR_FORMAT for what it holds. */
umt_status umt_image_check_file(const char *path, size_t *file_bytes);

/* Sides as a header declares them (or as a decode gave them) against UMT_IMAGE_MAX_SIDE and
 * UMT_IMAGE_PIXELS_PER_BYTE; UMT_ERR_FORMAT naming the file and the sides. */
umt_status umt_image_check_sides(const char *path, int width, int height, size_t file_bytes);

/* The checks of umt_image_check_file, then the header (stb_image's stbi_info: the sides and the
 * file's channels) and the checks of umt_image_check_sides. */
umt_status umt_image_check_header(const char *path, int *width, int *height, int *file_channels,
                                  size_t *file_bytes);

/* Every check above, then the decode: `channels` (1 grey, 3 RGB) interleaved bytes per pixel,
 * resized to height x width when the file's size differs, into out (height * width * channels
 * bytes). UMT_ERR_FORMAT for a file that fails a check or does not decode. */
umt_status umt_image_read(const char *path, int channels, int height, int width, unsigned char *out);

#endif /* UMT_CORE_DATA_IMAGE_FORMAT_H */
