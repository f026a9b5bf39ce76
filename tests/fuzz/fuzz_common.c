/*
 * tests/fuzz/fuzz_common.c — the libFuzzer entry points and the file helpers every target
 * shares (tests/fuzz/fuzz_target.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_target.h"
#include "umtrain.h"

/* libFuzzer's two hooks: it calls the first once at start, the second for every input. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* UMT_FUZZ_WRITE_SEEDS=DIR: write the seeds into DIR and exit, so that tools/fuzz.sh makes its
 * starting corpus with the very binary it then fuzzes. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("UMT_FUZZ_WRITE_SEEDS");
    if (!dir) return 0;
    int count = fuzz_write_seeds(dir);
    if (count < 0) exit(1);
    printf("fuzz_%s: %d seeds written to %s\n", fuzz_target_name, count, dir);
    exit(0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fuzz_one(data, size);
    return 0;
}

void fuzz_broken(const char *file, int line, const char *condition, const char *fmt, ...) {
    fprintf(stderr, "fuzz_%s: rule broken at %s:%d (%s): ", fuzz_target_name, file, line, condition);
    va_list args;
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n(last library error: %s)\n", umt_last_error());
    abort();
}

/* ----------------------------------------------------------------------------------------- */
/* Files */

#define MAX_SCRATCH 4

static char scratch[MAX_SCRATCH][512];
static int scratch_count;

static void remove_scratch(void) {
    for (int i = 0; i < scratch_count; ++i) unlink(scratch[i]);
}

const char *fuzz_scratch_path(void) {
    if (scratch_count == MAX_SCRATCH) fuzz_broken(__FILE__, __LINE__, "scratch_count < MAX_SCRATCH", "too many scratch files");
    const char *tmp = getenv("TMPDIR");
    char *path = scratch[scratch_count];
    snprintf(path, sizeof scratch[0], "%s/umt_fuzz_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", fuzz_target_name);
    int fd = mkstemp(path);
    if (fd < 0) fuzz_broken(__FILE__, __LINE__, "mkstemp", "cannot create %s: %s", path, strerror(errno));
    close(fd);
    if (scratch_count++ == 0) atexit(remove_scratch);
    return path;
}

/* Overwritten in place and then cut to size, not truncated first: ext4 flushes a file to disk
 * when one truncated to zero is closed, which made every input cost a disk write. */
void fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    if (fd < 0) fuzz_broken(__FILE__, __LINE__, "open", "cannot write %s: %s", path, strerror(errno));
    size_t written = 0;
    while (written < size) {
        ssize_t n = write(fd, data + written, size - written);
        if (n <= 0) break;
        written += (size_t)n;
    }
    if (written != size || ftruncate(fd, (off_t)size) != 0 || close(fd) != 0)
        fuzz_broken(__FILE__, __LINE__, "write", "writing %zu bytes to %s failed: %s", size, path, strerror(errno));
}

uint8_t *fuzz_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) fuzz_broken(__FILE__, __LINE__, "fopen", "cannot read %s: %s", path, strerror(errno));
    size_t capacity = 4096, used = 0;
    uint8_t *data = malloc(capacity);
    for (size_t got; data && (got = fread(data + used, 1, capacity - used, f)) > 0;) {
        used += got;
        if (used == capacity) data = realloc(data, capacity *= 2);
    }
    bool failed = !data || ferror(f);
    fclose(f);
    if (failed) fuzz_broken(__FILE__, __LINE__, "fread", "reading %s failed", path);
    *size = used;
    return data;
}
