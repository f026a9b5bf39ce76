/*
 * core/data/image_format.c — reading an image file through stb_image, after the checks it must pass
 * first (the header says which, and why): the signature, a PNG's chunks, a JPEG's segments, the
 * sides.
 */
#include "core/data/image_format.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/data/stb_image.h"

static const unsigned char png_signature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
static const unsigned char jpeg_signature[] = {0xff, 0xd8, 0xff}; /* start of image, the next marker's 0xff */
static const unsigned char bmp_signature[] = {'B', 'M'};

static bool starts_with(const uint8_t *bytes, size_t size, const unsigned char *signature, size_t length) {
    return size >= length && memcmp(bytes, signature, length) == 0;
}

static umt_status unknown_signature(const char *path, const uint8_t *head, size_t bytes) {
    char shown[3 * 8 + 1] = "";
    for (size_t i = 0, used = 0; i < bytes && i < 8; ++i)
        used += (size_t)snprintf(shown + used, sizeof shown - used, "%s%02x", i ? " " : "", head[i]);
    return umt_fail(UMT_ERR_FORMAT,
                    "%s: not a PNG, JPEG or BMP image: its first bytes are %s (PNG starts 89 50 4e 47, JPEG ff d8 ff, "
                    "BMP 42 4d)",
                    path, bytes ? shown : "none: the file is empty");
}

static uint32_t big_endian_32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* ----------------------------------------------------------------------------------------- */
/* PNG: chunks */

/* A chunk's type for a message: its four letters, or its bytes in hex when they are not letters
 * (a corrupt file's bytes must not reach the terminal raw). */
static const char *chunk_type(const uint8_t *type, char shown[12]) {
    bool letters = true;
    for (int i = 0; i < 4; ++i) letters = letters && ((type[i] | 0x20) >= 'a' && (type[i] | 0x20) <= 'z');
    if (letters) snprintf(shown, 12, "%c%c%c%c", type[0], type[1], type[2], type[3]);
    else snprintf(shown, 12, "%02x%02x%02x%02x", type[0], type[1], type[2], type[3]);
    return shown;
}

/* Every chunk of a PNG (a 4-byte big-endian length, a 4-byte type, the data, a 4-byte CRC of
 * type and data) must end inside the file and match its CRC, up to IEND. stb_image reads the
 * CRCs without checking them, so a changed byte would otherwise decode to changed pixels. */
static umt_status check_png_chunks(const char *path, const uint8_t *bytes, size_t size) {
    size_t at = sizeof png_signature;
    while (at + 8 <= size) {
        const uint8_t *head = bytes + at;
        uint32_t length = big_endian_32(head);
        char type[12];
        if (size - at < 12)
            return umt_fail(UMT_ERR_FORMAT, "%s: PNG chunk '%s' at byte %zu is cut short: the file ends before its CRC",
                            path, chunk_type(head + 4, type), at);
        size_t room = size - at - 12; /* for the data, past head and CRC */
        if (length > room)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: PNG chunk '%s' at byte %zu says %u bytes of data, the file has room for %zu", path,
                            chunk_type(head + 4, type), at, length, room);
        uint32_t stored = big_endian_32(head + 8 + length);
        uint32_t computed = (uint32_t)crc32(0L, head + 4, 4 + length);
        if (stored != computed)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: PNG chunk '%s' at byte %zu: its CRC is %08x, its bytes give %08x (the file is "
                            "corrupt)",
                            path, chunk_type(head + 4, type), at, stored, computed);
        if (memcmp(head + 4, "IEND", 4) == 0) break;
        at += 12 + (size_t)length;
    }
    return UMT_OK;
}

/* Drops the PNG's empty IDAT chunks from its bytes (after check_png_chunks: every chunk before
 * IEND is whole); returns the new size. An empty IDAT chunk is valid (the image data is the IDAT
 * chunks' data end to end) and adds nothing; but when it came first, stb_image 2.27 copied its 0
 * bytes to the NULL pointer it had for the data so far, undefined behaviour that UBSan reports
 * (found by tools/fuzz.sh). */
static size_t drop_empty_idat_chunks(uint8_t *bytes, size_t size) {
    size_t at = sizeof png_signature, kept = at;
    while (at + 12 <= size) {
        size_t chunk = 12 + (size_t)big_endian_32(bytes + at);
        bool empty_idat = chunk == 12 && memcmp(bytes + at + 4, "IDAT", 4) == 0;
        bool end = memcmp(bytes + at + 4, "IEND", 4) == 0;
        if (!empty_idat && kept != at) memmove(bytes + kept, bytes + at, chunk);
        kept += empty_idat ? 0 : chunk;
        at += chunk;
        if (end) break;
    }
    if (kept != at) memmove(bytes + kept, bytes + at, size - at); /* what follows IEND, if anything */
    return kept + (size - at);
}

/* ----------------------------------------------------------------------------------------- */
/* JPEG: segments and the tables they define */

/* The tables a JPEG's segments have defined so far, and its frame's components, as the walk
 * meets them. stb_image 2.27 decodes a scan with whatever its tables hold: one that no segment
 * defined is memory it never wrote, and a Huffman table without the end its build writes let
 * the decoder read past it (found by tools/fuzz.sh). */
typedef struct {
    bool dc[4], ac[4], quant[4]; /* Huffman tables by class, quantisation tables: defined */
    bool progressive;
    int components;              /* of the frame (SOF), as far as stb reads them */
    uint8_t id[4], quant_of[4];  /* each component's id and quantisation table */
} jpeg_tables;

/* Markers without a length after them: TEM, the restart markers RST0..7 and start of image. */
static bool standalone_marker(unsigned marker) { return marker == 0x01 || (marker >= 0xd0 && marker <= 0xd8); }

/* The tables of one DHT segment (data: what follows its length; at: where the segment starts).
 * Each is a byte of class and number, 16 counts of codes by length (1 to 16 bits), then a symbol
 * per code. A symbol is a byte, so a table holds at most 256 codes; stb_image 2.27 stores each
 * code's length in a table of 257 bytes without checking the sum. */
static umt_status check_huffman_tables(const char *path, const uint8_t *data, size_t bytes, size_t at,
                                       jpeg_tables *tables) {
    for (size_t used = 0; used < bytes;) {
        if (bytes - used < 17)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: JPEG Huffman table (DHT segment at byte %zu) runs past its segment: %zu bytes left "
                            "for a table's 17",
                            path, at, bytes - used);
        unsigned codes = 0, class = data[used] >> 4, number = data[used] & 15;
        for (int i = 1; i <= 16; ++i) codes += data[used + i];
        if (codes > 256)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: JPEG Huffman table (DHT segment at byte %zu) declares %u codes, at most 256", path, at,
                            codes);
        if (codes > bytes - used - 17)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: JPEG Huffman table (DHT segment at byte %zu) declares %u codes, its segment holds %zu "
                            "symbols",
                            path, at, codes, bytes - used - 17);
        if (class <= 1 && number < 4) (class ? tables->ac : tables->dc)[number] = true; /* stb refuses others */
        used += 17 + codes;
    }
    return UMT_OK;
}

/* The quantisation tables of a DQT segment: each a byte of precision (64 values of 8 bits, or
 * of 16) and number, then the values. One that does not fit is not noted (stb refuses it). */
static void note_quantisation_tables(const uint8_t *data, size_t bytes, jpeg_tables *tables) {
    for (size_t used = 0; used < bytes;) {
        size_t table = 1 + (data[used] >> 4 ? 128 : 64);
        if (table > bytes - used) return;
        if ((data[used] & 15) < 4) tables->quant[data[used] & 15] = true;
        used += table;
    }
}

/* A frame header (SOF0, 1 or 2, the ones stb reads): precision, height, width, then per
 * component its id, sampling and quantisation table. */
static void note_frame(unsigned marker, const uint8_t *data, size_t bytes, jpeg_tables *tables) {
    tables->progressive = marker == 0xc2;
    tables->components = 0;
    for (size_t i = 0; bytes >= 6 && i < data[5] && i < 4 && 6 + 3 * i + 3 <= bytes; ++i) {
        tables->id[i] = data[6 + 3 * i];
        tables->quant_of[i] = data[8 + 3 * i];
        tables->components = (int)i + 1;
    }
}

static umt_status undefined_table(const char *path, size_t at, const char *kind, unsigned number) {
    return umt_fail(UMT_ERR_FORMAT,
                    "%s: JPEG scan (SOS segment at byte %zu) uses %s table %u, which no segment before it defines",
                    path, at, kind, number);
}

/* A scan's header: its components, each with its DC and AC Huffman tables, then the spectral
 * selection and the successive approximation. Every table the scan decodes with must have been
 * defined before it: both Huffman tables in a sequential JPEG; in a progressive one the DC table
 * for a first DC scan, the AC table for an AC scan (a DC refinement reads bits alone). */
static umt_status check_scan_tables(const char *path, const uint8_t *data, size_t bytes, size_t at,
                                    const jpeg_tables *tables) {
    size_t count = bytes ? data[0] : 0;
    if (bytes < 1 + 2 * count + 3)
        return umt_fail(UMT_ERR_FORMAT,
                        "%s: JPEG scan (SOS segment at byte %zu) is %zu bytes, too short for %zu components", path, at,
                        bytes + 2, count);
    unsigned first_coefficient = data[1 + 2 * count], refinement = data[3 + 2 * count] >> 4;
    bool uses_dc = !tables->progressive || (first_coefficient == 0 && refinement == 0);
    bool uses_ac = !tables->progressive || first_coefficient > 0;
    for (size_t i = 0; i < count; ++i) {
        unsigned id = data[1 + 2 * i], dc = data[2 + 2 * i] >> 4, ac = data[2 + 2 * i] & 15;
        if (uses_dc && dc < 4 && !tables->dc[dc]) return undefined_table(path, at, "DC Huffman", dc);
        if (uses_ac && ac < 4 && !tables->ac[ac]) return undefined_table(path, at, "AC Huffman", ac);
        for (int c = 0; c < tables->components; ++c)
            if (tables->id[c] == id && tables->quant_of[c] < 4 && !tables->quant[tables->quant_of[c]])
                return undefined_table(path, at, "quantisation", tables->quant_of[c]);
    }
    return UMT_OK;
}

/* The end of a scan's entropy-coded data from at: the 0xff of the next marker, or size. In the
 * data a 0xff is followed by 0x00 (a stuffed 0xff), by a restart marker, or by more 0xff (fill). */
static size_t end_of_scan(const uint8_t *bytes, size_t size, size_t at) {
    for (; at + 1 < size; ++at) {
        uint8_t next = bytes[at + 1];
        if (bytes[at] == 0xff && next != 0x00 && next != 0xff && !(next >= 0xd0 && next <= 0xd7)) return at;
    }
    return size;
}

/* One segment's content (data: what follows its length; at: where the segment starts). */
static umt_status check_segment(const char *path, unsigned marker, const uint8_t *data, size_t bytes, size_t at,
                                jpeg_tables *tables) {
    if (marker == 0xc4) return check_huffman_tables(path, data, bytes, at, tables);
    if (marker == 0xdb) note_quantisation_tables(data, bytes, tables);
    if (marker >= 0xc0 && marker <= 0xc2) note_frame(marker, data, bytes, tables);
    if (marker == 0xda) return check_scan_tables(path, data, bytes, at, tables);
    return UMT_OK;
}

/* Every segment of a JPEG, the way stb_image walks them: between segments it skips bytes up to a
 * 0xff and fill 0xffs; a segment has a 2-byte big-endian length that counts itself; a start of
 * scan (SOS) is followed by entropy-coded data up to the next marker; the walk ends at the end of
 * image (EOI). So every segment stb reads is one checked here, in the scans of progressive JPEGs
 * too. A segment that runs past the end of the file is refused (stb would read zeros there). */
static umt_status check_jpeg_segments(const char *path, const uint8_t *bytes, size_t size) {
    jpeg_tables tables = {0};
    size_t at = 2; /* past the start of image */
    for (;;) {
        while (at < size && bytes[at] != 0xff) ++at;
        while (at < size && bytes[at] == 0xff) ++at;
        if (at >= size) return UMT_OK;
        size_t start = at - 1;
        unsigned marker = bytes[at++];
        if (marker == 0xd9) return UMT_OK;
        if (standalone_marker(marker)) continue;
        if (size - at < 2)
            return umt_fail(UMT_ERR_FORMAT, "%s: JPEG segment ff %02x at byte %zu: the file ends before its length",
                            path, marker, start);
        size_t length = (size_t)bytes[at] << 8 | bytes[at + 1];
        if (length < 2 || length > size - at)
            return umt_fail(UMT_ERR_FORMAT,
                            "%s: JPEG segment ff %02x at byte %zu says %zu bytes (at least 2: its length's own), the "
                            "file has room for %zu",
                            path, marker, start, length, size - at);
        UMT_TRY(check_segment(path, marker, bytes + at + 2, length - 2, start, &tables));
        at += length;
        if (marker == 0xda) at = end_of_scan(bytes, size, at);
    }
}

/* ----------------------------------------------------------------------------------------- */
/* Checks, header and decode */

/* The signature, then the checks of its format. */
static umt_status check_bytes(const char *path, const uint8_t *bytes, size_t size) {
    if (starts_with(bytes, size, png_signature, sizeof png_signature)) return check_png_chunks(path, bytes, size);
    if (starts_with(bytes, size, jpeg_signature, sizeof jpeg_signature)) return check_jpeg_segments(path, bytes, size);
    if (starts_with(bytes, size, bmp_signature, sizeof bmp_signature)) return UMT_OK;
    return unknown_signature(path, bytes, size);
}

static umt_status check_sides(const char *path, int width, int height, size_t file_bytes) {
    if (width < 1 || height < 1 || width > UMT_IMAGE_MAX_SIDE || height > UMT_IMAGE_MAX_SIDE)
        return umt_fail(UMT_ERR_FORMAT, "%s: image is %dx%d, expected 1..%d pixels on a side", path, width, height,
                        UMT_IMAGE_MAX_SIDE);
    uint64_t pixels = (uint64_t)width * (uint64_t)height, room = (uint64_t)UMT_IMAGE_PIXELS_PER_BYTE * file_bytes;
    if (pixels > room && pixels > (1u << 16))
        return umt_fail(UMT_ERR_FORMAT, "%s: image is %dx%d, more pixels than its %zu bytes can hold", path, width,
                        height, file_bytes);
    return UMT_OK;
}

umt_status umt_image_open(const char *path, umt_image_file *out) {
    *out = (umt_image_file){0};
    uint8_t *bytes = NULL;
    size_t size = 0;
    /* The cap also keeps the size within the int that stb takes for a length. */
    UMT_TRY(umt_file_read_regular(path, "an image", UMT_IMAGE_MAX_BYTES, &bytes, &size));
    int width = 0, height = 0, channels = 0;
    umt_status status = check_bytes(path, bytes, size);
    if (status == UMT_OK && starts_with(bytes, size, png_signature, sizeof png_signature))
        size = drop_empty_idat_chunks(bytes, size);
    if (status == UMT_OK && !umt_stb_info(bytes, (int)size, &width, &height, &channels))
        status =
            umt_fail(UMT_ERR_FORMAT, "%s: not a readable PNG, JPEG or BMP image (%s)", path, umt_stb_failure());
    /* A BMP stored top row first says so with a negative height, which stb's header reader hands
     * on as it is (its decoder turns the rows the right way up). */
    if (status == UMT_OK && bytes[0] == 'B' && height < 0 && height != INT_MIN) height = -height;
    if (status == UMT_OK) status = check_sides(path, width, height, size);
    if (status != UMT_OK) {
        free(bytes);
        return status;
    }
    *out = (umt_image_file){.bytes = bytes, .size = size, .width = width, .height = height, .channels = channels};
    return UMT_OK;
}

void umt_image_close(umt_image_file *file) {
    free(file->bytes);
    *file = (umt_image_file){0};
}

umt_status umt_image_decode(const char *path, const umt_image_file *file, int channels, int height, int width,
                            unsigned char *out) {
    int w = 0, h = 0, file_channels = 0;
    unsigned char *pixels = umt_stb_load(file->bytes, (int)file->size, &w, &h, &file_channels, channels);
    if (!pixels) return umt_fail(UMT_ERR_FORMAT, "%s: cannot decode (%s)", path, umt_stb_failure());
    /* Again as decoded: the header said one thing to stbi_info; the decoder's word is final. */
    umt_status status = check_sides(path, w, h, file->size);
    if (status == UMT_OK && w == width && h == height)
        memcpy(out, pixels, (size_t)width * (size_t)height * (size_t)channels);
    else if (status == UMT_OK && !umt_stb_resize(pixels, w, h, out, width, height, channels))
        status = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: cannot resize %dx%d to %dx%d", path, w, h, width, height);
    umt_stb_free(pixels);
    return status;
}

umt_status umt_image_read(const char *path, int channels, int height, int width, unsigned char *out) {
    umt_image_file file;
    UMT_TRY(umt_image_open(path, &file));
    umt_status status = umt_image_decode(path, &file, channels, height, width, out);
    umt_image_close(&file);
    return status;
}
