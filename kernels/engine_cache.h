/*
 * kernels/engine_cache.h — a small text file that remembers which of cuDNN's candidate engines a
 * timed first run chose, so that the next process takes the same one without timing them again
 * (kernels/cuda/conv_engines.cu). Pure C: the CPU tests check it.
 *
 * A line is "<key> <index>\n": the key names everything that decides the candidate list (the
 * GPU, its driver, cuDNN's version, the dtype, the direction, the shape and the workspace limit);
 * the index is the chosen candidate's place in that list. A line is appended with one write to a
 * file opened O_APPEND, so processes that time at once add whole lines; the last line of a key
 * wins. Why it is safe: every candidate is a deterministic engine that computes the convolution
 * correctly, so an entry can only choose which correct engine runs. An index the list does not
 * have, a line that does not parse, or a file that cannot be read is ignored (the engines are
 * timed as without a cache). And a run that finds its entries picks the same engines as the run
 * that timed them, so its bits repeat; timing alone may pick another of two close engines.
 *
 * Where: UMT_CONV_CACHE names the file ("0" turns the cache off); else
 * $XDG_CACHE_HOME/umtrain/conv_engines, else $HOME/.cache/umtrain/conv_engines (the folders are
 * made when missing). Delete the file to time everything again.
 */
#ifndef UMT_KERNELS_ENGINE_CACHE_H
#define UMT_KERNELS_ENGINE_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A key's most bytes (its terminating NUL included); a longer line is ignored. */
enum { UMT_ENGINE_KEY_BYTES = 384 };

/* The cache file's path into buf (made from the environment as above), or false when the cache is
 * off or no path fits. Makes the folders of the default path. */
bool umt_engine_cache_path(char *buf, size_t bytes);

/* The index of key's last line in the file at path, or -1 (no such line, no file, or one that
 * cannot be read: a cache is advice). */
int umt_engine_cache_find(const char *path, const char *key);
/* The same in a text already read (NUL-terminated): what umt_engine_cache_find parses. */
int umt_engine_cache_find_in(const char *text, const char *key);

/* Appends "key index\n" to the file at path, made if missing. A key with a space or a newline,
 * or one past UMT_ENGINE_KEY_BYTES, is refused. */
umt_status umt_engine_cache_add(const char *path, const char *key, int index);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_ENGINE_CACHE_H */
