/*
 * kernels/engine_cache.h — a small text file that remembers which of cuDNN's candidate engines a
 * timed first run chose, so that the next process takes the same one without timing them again
 * (kernels/cuda/conv_engines.cu). Pure C: the CPU tests check it.
 *
 * A line is "<key> <engine>\n": the key names everything that decides which engines can run (the
 * GPU, its driver, cuDNN's version, the dtype, the direction, the shape and the workspace limit);
 * the engine is the chosen one's identity in cuDNN, its global index and the value of each of its
 * knobs ("37;2=1;10=0"), so that a later run rebuilds that engine without asking cuDNN's
 * heuristics for their candidates at all. A line is appended with one write to a file opened
 * O_APPEND, so processes that time at once add whole lines; the last line of a key wins. Why it
 * is safe: a remembered engine is built only if cuDNN builds it for the shape, and it is checked
 * as every candidate is (deterministic, compiled ahead of time, within the workspace limit), so an
 * entry can only choose which correct engine runs. An engine that does not parse or build, a line
 * that does not parse, or a file that cannot be read is ignored (the engines are timed as without
 * a cache). And a run that finds its entries runs the same engines as the run that timed them,
 * so its bits repeat; timing alone may pick another of two close engines.
 *
 * Where: UMT_CONV_CACHE names the file ("0" turns the cache off); else
 * $XDG_CACHE_HOME/umtrain/conv_engines, else $HOME/.cache/umtrain/conv_engines (the folders are
 * made when missing). Delete the file to time everything again.
 */
#ifndef UMT_KERNELS_ENGINE_CACHE_H
#define UMT_KERNELS_ENGINE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A key's most bytes (its terminating NUL included); a longer line is ignored. An engine's most
 * knobs (cuDNN 9 has 44 kinds). */
enum { UMT_ENGINE_KEY_BYTES = 384, UMT_ENGINE_MOST_KNOBS = 64 };

/* An engine as cuDNN names it: its global index and its knobs' values (knob kinds in any order). */
typedef struct {
    int64_t global_index;
    int knob_count;
    int64_t knob_type[UMT_ENGINE_MOST_KNOBS];
    int64_t knob_value[UMT_ENGINE_MOST_KNOBS];
} umt_engine_identity;

/* Whether a and b name the same engine: the same index and the same value for each kind of knob. */
bool umt_engine_identity_equal(const umt_engine_identity *a, const umt_engine_identity *b);

/* The cache file's path into buf (made from the environment as above), or false when the cache is
 * off or no path fits. Makes the folders of the default path. */
bool umt_engine_cache_path(char *buf, size_t bytes);

/* The engine of key's last whole line in the file at path into *engine: false when there is none
 * (no such line, no file, one that cannot be read, or an engine that does not parse: a cache is
 * advice). */
bool umt_engine_cache_find(const char *path, const char *key, umt_engine_identity *engine);
/* The same in a text already read (NUL-terminated): what umt_engine_cache_find parses. */
bool umt_engine_cache_find_in(const char *text, const char *key, umt_engine_identity *engine);

/* Appends "key engine\n" to the file at path, made if missing. A key with a space or a newline,
 * one past UMT_ENGINE_KEY_BYTES, or an engine with a negative index or knob kind, or more than
 * UMT_ENGINE_MOST_KNOBS knobs, is refused. */
umt_status umt_engine_cache_add(const char *path, const char *key, const umt_engine_identity *engine);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_ENGINE_CACHE_H */
