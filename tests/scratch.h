/*
 * tests/scratch.h — a test program's scratch folder under /tmp, and whole files in and out of it:
 * what the checkpoint tests share.
 */
#ifndef UMT_TESTS_SCRATCH_H
#define UMT_TESTS_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

/* Makes /tmp/umt_<label>_XXXXXX (a group setup's work): 0, or -1 when it cannot. */
int scratch_make(const char *label);
/* Removes the folder with everything in it (files, and folders one level deep): 0, or -1. */
int scratch_remove(void);
/* The folder itself. */
const char *scratch_folder(void);
/* The folder's path of name; four buffers used in turn, so a test holds up to four at once. */
const char *scratch_path(const char *name);
/* How many entries the folder holds; *temporary (if not NULL): how many are a save's temporary
 * files (".tmp." in the name). -1 when it cannot be read. */
int scratch_entries(int *temporary);
/* The whole file at path (asserts it is there and not empty); free it. */
uint8_t *scratch_read(const char *path, size_t *size);
/* Writes bytes as the folder's file name; returns its path. */
const char *scratch_write(const char *name, const uint8_t *bytes, size_t size);
/* Rewrites every element of the f32 tensor `name` of the checkpoint at path (any folder) as NaN and
 * reseals its CRC-32: the file a diverged run would have saved, which umt_checkpoint_save refuses
 * to write, for the tests of what loading it does. */
void scratch_poison_checkpoint(const char *path, const char *name);

#endif /* UMT_TESTS_SCRATCH_H */
