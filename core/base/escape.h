/*
 * core/base/escape.h — bytes from a file, made safe to print in a message.
 *
 * A name read from a file (a tensor's in a checkpoint) is the file's to choose: printed raw, an
 * ESC byte would start a terminal escape sequence (clear the screen, retitle the window, ...),
 * and a newline would forge a line of output. So every byte outside printable ASCII is written
 * as \xNN, and a backslash as \\, which keeps the text unambiguous.
 */
#ifndef UMT_CORE_BASE_ESCAPE_H
#define UMT_CORE_BASE_ESCAPE_H

#include <stddef.h>

/* bytes[0..n) into out[size] (size >= 4), NUL-terminated: printable ASCII as it is, a backslash
 * as \\, any other byte as \xNN; cut with "..." where the rest does not fit. Returns out. */
const char *umt_escape(const void *bytes, size_t n, char *out, size_t size);

#endif /* UMT_CORE_BASE_ESCAPE_H */
