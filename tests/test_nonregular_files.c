/*
 * tests/test_nonregular_files.c — files that are not regular files, given where the library
 * reads one: a FIFO, a directory, a loop of symbolic links and /dev/zero, as a checkpoint
 * (umt_checkpoint_load) and as an IDX file (umt_dataset_load_idx, umt_samples_load_idx).
 *
 * Each must be refused within a second with a message naming the path. The danger is a hang:
 * opening a FIFO for reading blocks until a writer comes, and /dev/zero never ends. So every
 * case runs under an alarm that ends the whole test binary, saying which path hung, instead of
 * leaving it blocked. Public header only, so that the same file can be built against an older
 * library to see it hang there. Also run under AddressSanitizer + UBSan.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "umtrain.h"

/* Past this a call counts as hung: the alarm ends the binary. */
#define HANG_SECONDS 5

static char dir[64], fifo[128], loop_a[128], loop_b[128], labels[128];
static const char *const dev_zero = "/dev/zero";
static const char *current_path; /* what the running case reads, for the alarm's message */

/* ----------------------------------------------------------------------------------------- */
/* The files, and the alarm */

static void on_alarm(int signal) {
    (void)signal;
    static const char message[] = "test_nonregular_files: HUNG reading a file that is not regular: ";
    /* Only async-signal-safe calls here. A failed write has nowhere to be told: the status says it. */
    ssize_t written = write(STDERR_FILENO, message, sizeof message - 1);
    written += write(STDERR_FILENO, current_path, strlen(current_path));
    written += write(STDERR_FILENO, "\n", 1);
    (void)written;
    _exit(3);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_test_nonregular_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(loop_a, sizeof loop_a, "%s/loop-a", dir);
    snprintf(loop_b, sizeof loop_b, "%s/loop-b", dir);
    snprintf(labels, sizeof labels, "%s/labels", dir);
    /* Five labels of a good IDX file: the images path is the one under test. */
    static const uint8_t label_file[] = {0, 0, 8, 1, 0, 0, 0, 5, 0, 1, 2, 0, 1};
    FILE *f = fopen(labels, "wb");
    int ok = f && fwrite(label_file, 1, sizeof label_file, f) == sizeof label_file;
    if (f) ok = fclose(f) == 0 && ok;
    struct sigaction alarm_action = {.sa_handler = on_alarm};
    return ok && mkfifo(fifo, 0600) == 0 && symlink(loop_b, loop_a) == 0 && symlink(loop_a, loop_b) == 0 &&
                   sigaction(SIGALRM, &alarm_action, NULL) == 0
               ? 0
               : -1;
}

static int teardown(void **state) {
    (void)state;
    unlink(fifo);
    unlink(loop_a);
    unlink(loop_b);
    unlink(labels);
    return rmdir(dir);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One of the four paths, and a word its refusal should say. */
typedef struct {
    const char *path, *keyword;
} case_;

static const case_ *cases(int *count) {
    static case_ all[4];
    all[0] = (case_){fifo, "FIFO"};
    all[1] = (case_){dir, "directory"};
    all[2] = (case_){loop_a, NULL}; /* strerror(ELOOP), filled in below */
    all[3] = (case_){dev_zero, "character device"};
    all[2].keyword = strerror(ELOOP);
    *count = 4;
    return all;
}

/* The last call (which took started..now) failed with status, naming c's path and keyword. */
static void expect_refused_quickly(const case_ *c, umt_status got, umt_status status, double started) {
    double took = seconds() - started;
    alarm(0);
    const char *message = umt_last_error();
    if (got != status || !strstr(message, c->path) || !strstr(message, c->keyword))
        fail_msg("%s: got %s '%s', expected %s naming the path and saying '%s'", c->path, umt_status_name(got),
                 message, umt_status_name(status), c->keyword);
    if (took >= 1.0) fail_msg("%s: refused after %.2f s (expected within 1 s)", c->path, took);
}

static double arm(const char *path) {
    current_path = path;
    alarm(HANG_SECONDS);
    return seconds();
}

/* ----------------------------------------------------------------------------------------- */
/* Checkpoints */

static void test_checkpoint_that_is_not_a_regular_file_is_refused_within_a_second_naming_it(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    umt_layer *fc = umt_linear_layer_new(ctx, "fc", 4, 3, true);
    assert_non_null(fc);
    int count;
    const case_ *c = cases(&count);
    for (int i = 0; i < count; ++i) {
        umt_checkpoint_info info = {.epoch = 42, .step = 43};
        double started = arm(c[i].path);
        umt_status got = umt_checkpoint_load(ctx, NULL, &info, c[i].path);
        expect_refused_quickly(&c[i], got, UMT_ERR_IO, started);
        assert_int_equal(info.epoch, 42);
    }
    umt_context_destroy(ctx);
}

/* ----------------------------------------------------------------------------------------- */
/* IDX files */

static void test_idx_file_that_is_not_a_regular_file_is_refused_within_a_second_naming_it(void **state) {
    (void)state;
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    int count;
    const case_ *c = cases(&count);
    for (int i = 0; i < count; ++i) {
        umt_dataset *dataset = (umt_dataset *)&ctx; /* any non-NULL value: the load must clear it */
        double started = arm(c[i].path);
        umt_status got = umt_dataset_load_idx(ctx, c[i].path, labels, 3, &dataset);
        expect_refused_quickly(&c[i], got, UMT_ERR_IO, started);
        assert_null(dataset);

        umt_samples *samples = (umt_samples *)&ctx;
        started = arm(c[i].path);
        got = umt_samples_load_idx(c[i].path, labels, 3, &samples);
        expect_refused_quickly(&c[i], got, UMT_ERR_IO, started);
        assert_null(samples);
    }
    umt_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_that_is_not_a_regular_file_is_refused_within_a_second_naming_it),
        cmocka_unit_test(test_idx_file_that_is_not_a_regular_file_is_refused_within_a_second_naming_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
