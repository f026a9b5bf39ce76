/*
 * core/data/image_format.h — reading image files: which files umtrain hands to stb_image, and what it
 * checks first.
 *
 * stb_image decodes the images (compiled in the build from Debian's headers, version 2.27:
 * core/data/stb_image.c), and it trusts what a file says: it allocates a PNG chunk's declared
 * length before reading it (a 138-byte file made it ask for 2 GiB: found by
 * tests/fuzz/fuzz_image.c); it allocates an image's declared size whatever the file holds; and
 * it writes past its table of code sizes when a JPEG's Huffman table declares more than 256 codes
 * (stbi__build_huffman; already when reading the header). So a file is read whole, only when it
 * is a regular file (core/base/file.h: a FIFO, a directory or /dev/zero is refused before a byte
 * is read), its bytes are checked here, and stb decodes those very bytes from memory: nothing can
 * change between the check and the decode. It is refused with a message naming it when:
 *   - it does not start as a PNG, JPEG or BMP file does (its first bytes are shown: stb would
 *     read other formats too, and TGA has no signature, so any file may pass for one);
 *   - a PNG chunk runs past the end of the file, or its CRC does not match its bytes;
 *   - a JPEG segment runs past the end of the file, a Huffman table (DHT segment) declares more
 *     than 256 codes or runs past its segment, or a scan uses a Huffman or quantisation table
 *     that no segment before it defines (stb would decode with memory it never wrote, and read
 *     past a Huffman table that has no end: found by tools/fuzz.sh). This walk over the segments
 *     is umtrain's own rather than a newer stb_image (later releases refuse an over-full table
 *     themselves): the build takes stb from the distribution's package (Debian 12 has 2.27), and
 *     the walk covers the undefined tables too, whichever stb is built;
 *   - a side is outside 1..UMT_IMAGE_MAX_SIDE (stb_image reads a BMP of width 0, and then
 *     stb_image_resize fails an assert, ending the process);
 *   - it declares more pixels than its bytes can hold: UMT_IMAGE_PIXELS_PER_BYTE per byte.
 * A BMP stored top row first (a negative height in its header) is read the right way up, and a
 * PNG's empty IDAT chunks are dropped before stb sees the bytes (the first one, if empty, made
 * stb_image 2.27 copy to a NULL pointer: image_format.c).
 */
#ifndef UMT_CORE_DATA_IMAGE_FORMAT_H
#define UMT_CORE_DATA_IMAGE_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

/* The most pixels on a side. */
#define UMT_IMAGE_MAX_SIDE 16384

/* The most pixels a file may declare per byte it holds, with 64 Ki pixels allowed to any file.
 * The densest real case is a PNG of 1-bit pixels: deflate gives at most 1032 bytes per byte it
 * reads, 8 pixels each (a JPEG needs a bit per 8 x 8 block, 512 pixels per byte; a BMP's pixels
 * are stored whole). */
#define UMT_IMAGE_PIXELS_PER_BYTE 8256

/* The most bytes an image file may have: a BMP of UMT_IMAGE_MAX_SIDE pixels a side, 4 bytes a
 * pixel, is 1 GiB. A larger file is refused before it is read. */
#define UMT_IMAGE_MAX_BYTES ((size_t)1 << 30)

/* An image file read whole and checked, and what its header declares. */
typedef struct {
    uint8_t *bytes;
    size_t size;
    int width, height; /* within 1..UMT_IMAGE_MAX_SIDE */
    int channels;      /* as the file stores them: 1 grey, 2 grey and alpha, 3 RGB, 4 RGBA */
} umt_image_file;

/* Reads path (a regular file, at most UMT_IMAGE_MAX_BYTES) into out, checks its bytes and reads
 * its header (stb_image's stbi_info_from_memory), with the checks above. UMT_ERR_IO when it
 * cannot be read or is not a regular file, UMT_ERR_FORMAT for what it holds. */
umt_status umt_image_open(const char *path, umt_image_file *out);

/* Decodes an opened file: `channels` (1 grey, 3 RGB) interleaved bytes per pixel, resized to
 * height x width when the file's size differs, into out (height * width * channels bytes).
 * UMT_ERR_FORMAT naming path for a file that does not decode. */
umt_status umt_image_decode(const char *path, const umt_image_file *file, int channels, int height, int width,
                            unsigned char *out);

/* Frees what umt_image_open read; a zeroed file is fine. */
void umt_image_close(umt_image_file *file);

/* umt_image_open, umt_image_decode and umt_image_close in one call. */
umt_status umt_image_read(const char *path, int channels, int height, int width, unsigned char *out);

#endif /* UMT_CORE_DATA_IMAGE_FORMAT_H */
