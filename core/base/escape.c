/* core/base/escape.c — bytes from a file as printable text (see escape.h). */
#include "core/base/escape.h"

#include <stdio.h>
#include <string.h>

const char *umt_escape(const void *bytes, size_t n, char *out, size_t size) {
    const unsigned char *b = bytes;
    size_t used = 0;
    for (size_t i = 0; i < n; ++i) {
        char piece[5] = {(char)b[i], '\0'};
        if (b[i] == '\\')
            memcpy(piece, "\\\\", 3);
        else if (b[i] < 0x20 || b[i] > 0x7e)
            snprintf(piece, sizeof piece, "\\x%02x", b[i]);
        size_t length = strlen(piece);
        /* Each piece but the last leaves room for "..." after it, so a cut always has it. */
        size_t reserve = i + 1 < n ? 3 : 0;
        if (used + length + reserve + 1 > size) {
            memcpy(out + used, "...", 3);
            used += 3;
            break;
        }
        memcpy(out + used, piece, length);
        used += length;
    }
    out[used] = '\0';
    return out;
}
