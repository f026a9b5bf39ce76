/*
 * core/base/file.h — reading files a caller names: only regular files, checked before they are
 * opened for reading.
 *
 * fopen on a FIFO blocks until a writer comes, and /dev/zero never ends: a file a user mistypes
 * or an attacker places must not hang a run. So a path is opened with O_NONBLOCK (which a FIFO's
 * open honours and a regular file's reads ignore), fstat'ed, and refused unless it is a regular
 * file, before any byte is read. A symbolic link is followed; a loop of them is refused by the
 * open itself. Every message names the path and what was expected there.
 */
#ifndef UMT_CORE_BASE_FILE_H
#define UMT_CORE_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "umtrain.h"

/* Opens path for reading if it is a regular file; *bytes gets its size. what names the content
 * expected there, for messages ("a checkpoint", "an IDX file"). */
umt_status umt_file_open_regular(const char *path, const char *what, FILE **out, size_t *bytes);

/* Reads the whole regular file at path into *out (malloc'd; NULL for an empty file), refusing one
 * past max_bytes before allocating. */
umt_status umt_file_read_regular(const char *path, const char *what, size_t max_bytes, uint8_t **out, size_t *size);

#endif /* UMT_CORE_BASE_FILE_H */
