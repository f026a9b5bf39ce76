/* examples/example_metrics.c — --metrics PATH: a run's record as JSON Lines (see the header). */
#include "examples/example_metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "examples/example_common.h"

struct example_metrics {
    FILE *file;
    const char *program, *path;
    double opened_s; /* elapsed_s counts from here */
};

/* What a file that is not regular is, for the message (as core/base/file.c says it). */
static const char *kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

/* "<program>: --metrics <path>: <why>", -1. */
static int refuse(const char *program, const char *path, const char *why, const char *detail) {
    fprintf(stderr, "%s: --metrics %s: %s%s\n", program, path, why, detail);
    return -1;
}

/* The file descriptor of path for appending, refusing anything but a regular file: core/base/file.h's
 * rule for the files a caller names, there for reading, here for writing. A path that is there is
 * looked at first, so that a FIFO is never opened (it would block, or fail without saying why); the
 * fstat after the open closes the gap between the two. O_NONBLOCK keeps that open from blocking on
 * a FIFO put there meanwhile. Nothing is truncated before the file is known to be regular. */
static int open_regular(const char *program, const char *path, bool append) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return refuse(program, path, kind_of(st.st_mode), ", not a regular file (expected a metrics file to write)");
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) return refuse(program, path, "cannot open for writing: ", strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return refuse(program, path, "not a regular file", " (expected a metrics file to write)");
    }
    if (!append && ftruncate(fd, 0) != 0) {
        int error = errno;
        close(fd);
        return refuse(program, path, "cannot start the file anew: ", strerror(error));
    }
    return fd;
}

/* Ends a line: the newline, then the bytes out of the process at once. */
static int end_line(example_metrics *m) {
    fputc('\n', m->file);
    if (fflush(m->file) == 0 && !ferror(m->file)) return 0;
    return refuse(m->program, m->path, "cannot write: ", strerror(errno));
}

int example_metrics_open(const char *program, const char *path, bool append, int64_t step, example_metrics **out) {
    *out = NULL;
    if (!path) return 0;
    int fd = open_regular(program, path, append);
    if (fd < 0) return -1;
    FILE *file = fdopen(fd, "a");
    example_metrics *m = file ? malloc(sizeof *m) : NULL;
    if (!m) {
        int error = errno;
        if (file) fclose(file);
        else close(fd);
        return refuse(program, path, "cannot open for writing: ", strerror(error));
    }
    *m = (example_metrics){.file = file, .program = program, .path = path, .opened_s = example_seconds()};
    fprintf(m->file, "{\"event\": \"start\", \"program\": \"%s\", \"resumed\": %s, \"step\": %lld, "
            "\"unix_time\": %lld}", program, append ? "true" : "false", (long long)step, (long long)time(NULL));
    if (end_line(m)) return example_metrics_close(m), -1;
    *out = m;
    return 0;
}

void example_metrics_close(example_metrics *m) {
    if (!m) return;
    fclose(m->file);
    free(m);
}

/* `, "name": value`, or null where the value is not finite (JSON has no NaN). */
static void number(FILE *f, const char *name, const char *format, double value) {
    fprintf(f, ", \"%s\": ", name);
    if (isfinite(value)) fprintf(f, format, value);
    else fputs("null", f);
}

/* `, "pools": {...}`: each pool that has held bytes, in use and peak (host counters: no device wait). */
static void pools(FILE *f, const umt_context *ctx) {
    fputs(", \"pools\": {", f);
    const char *separator = "";
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        umt_pool_stats s;
        if (umt_pool_stats_get(ctx, (umt_pool)p, &s) != UMT_OK || !s.peak_bytes) continue;
        fprintf(f, "%s\"%s\": {\"in_use_bytes\": %zu, \"peak_bytes\": %zu}", separator, umt_pool_name((umt_pool)p),
                s.in_use_bytes, s.peak_bytes);
        separator = ", ";
    }
    fputc('}', f);
}

int example_metrics_train_line(example_metrics *m, const umt_context *ctx, const example_metrics_train *row) {
    if (!m) return 0;
    fprintf(m->file, "{\"event\": \"train\", \"epoch\": %lld, \"epoch_step\": %lld, \"epoch_steps\": %lld, "
            "\"step\": %lld", (long long)row->epoch, (long long)row->epoch_step, (long long)row->epoch_steps, (long long)row->step);
    number(m->file, "loss", "%.7g", row->loss);
    number(m->file, "epoch_loss", "%.7g", row->epoch_loss);
    number(m->file, "lr", "%.6g", row->lr);
    number(m->file, "images_per_s", "%.1f", row->images_per_s);
    if (row->data_wait_ms >= 0) number(m->file, "data_wait_ms", "%.3f", row->data_wait_ms);
    number(m->file, "elapsed_s", "%.3f", example_seconds() - m->opened_s);
    pools(m->file, ctx);
    fputc('}', m->file);
    return end_line(m);
}

int example_metrics_eval_line(example_metrics *m, const umt_context *ctx, int64_t epoch, int64_t step,
                              double accuracy) {
    if (!m) return 0;
    fprintf(m->file, "{\"event\": \"eval\", \"epoch\": %lld, \"step\": %lld", (long long)epoch, (long long)step);
    number(m->file, "test_accuracy", "%.2f", accuracy);
    number(m->file, "elapsed_s", "%.3f", example_seconds() - m->opened_s);
    pools(m->file, ctx);
    fputc('}', m->file);
    return end_line(m);
}
