/*
 * tests/fuzz/fuzz_target.h — what a fuzz target provides, and the helpers the targets share.
 *
 * A target is one reader of untrusted files (an IDX file, a checkpoint). It is built two ways:
 *   - with libFuzzer (tools/fuzz.sh, clang): LLVMFuzzerTestOneInput feeds it inputs that the
 *     fuzzer mutates towards new code;
 *   - as a cmocka test (fuzz_sweep.c, every compiler, in CI and under the sanitizers): its seeds
 *     must be accepted (its refused seeds refused), and every single-bit flip and every
 *     truncation of them keeps its rules.
 * Either way the target writes the input to a file, reads it back through the library, and
 * aborts with a message when a rule the reader promises is broken: libFuzzer and the sanitizers
 * report an abort like a crash, with the input that caused it.
 */
#ifndef UMT_TESTS_FUZZ_TARGET_H
#define UMT_TESTS_FUZZ_TARGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Runs one input through the reader and checks its rules; true when the reader accepted it. */
bool fuzz_one(const uint8_t *data, size_t size);

/* Writes the target's seeds into dir: inputs it must accept as seed-0, seed-1, ..., and inputs
 * it must refuse as refused-0, refused-1, ... (hostile files that once got past a reader, kept so
 * that the sweep checks they stay refused and flips their bits, and the fuzzer starts from them;
 * a target may have none). Returns how many seed-N files, or -1 after printing why. */
int fuzz_write_seeds(const char *dir);

/* The name of the target, for messages ("idx", "checkpoint", "image"). */
extern const char *const fuzz_target_name;

/* True when the format says how long a file is, so that every truncation of a seed must be
 * refused; false when a reader may accept a file cut short. */
extern const bool fuzz_truncations_refused;

/* Prints "fuzz_<target>: rule broken: <message>" and aborts when the condition is false. */
#define FUZZ_REQUIRE(condition, ...) \
    ((condition) ? (void)0 : fuzz_broken(__FILE__, __LINE__, #condition, __VA_ARGS__))

void fuzz_broken(const char *file, int line, const char *condition, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));

/* A file this process owns for the length of the run, under $TMPDIR or /tmp; removed at exit.
 * Each call gives a new one. */
const char *fuzz_scratch_path(void);

/* Writes size bytes to path, replacing it; aborts on an I/O error (the harness's, not the
 * reader's). */
void fuzz_write_file(const char *path, const uint8_t *data, size_t size);

/* The whole file at path, malloc'ed (free it); aborts on an I/O error. */
uint8_t *fuzz_read_file(const char *path, size_t *size);

#endif /* UMT_TESTS_FUZZ_TARGET_H */
