/*
 * tests/test_mnist_cnn_minimal.c — examples/mnist_cnn_minimal stays what it promises: a file read
 * in one sitting (at most 120 lines) that includes umtrain.h and the C standard library only; a
 * bad command line gets the one-line usage and exit status 2, --help the usage on stdout and exit
 * status 0, and a failure (a data folder without MNIST) the library's message naming the file and
 * exit status 1. Nothing here trains.
 *
 * argv[1] is the binary, argv[2] its source (tests/BUILD passes their locations).
 */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/run_program.h"

static const char *binary, *source;

enum { MAX_LINES = 120 };

static const char usage[] = "usage: mnist_cnn_minimal [--data-dir DIR] [--epochs N]\n";

/* Runs the binary with args; returns its exit status, its stdout and stderr together in out. */
static int run(const char *args, char *out, size_t size) {
    char command[1024];
    snprintf(command, sizeof command, "%s %s", binary, args);
    return run_program(command, out, size);
}

static void test_the_file_is_at_most_120_lines(void **state) {
    (void)state;
    FILE *f = fopen(source, "r");
    assert_non_null(f);
    int lines = 0, c;
    while ((c = fgetc(f)) != EOF) lines += c == '\n';
    fclose(f);
    if (lines > MAX_LINES) fail_msg("%s has %d lines; the minimal trainer keeps to %d", source, lines, MAX_LINES);
    assert_true(lines > 50); /* the file read is the trainer, not an empty stand-in */
}

/* The headers of C11's standard library. */
static bool is_standard_header(const char *name) {
    static const char *const standard[] = {
        "assert.h", "complex.h", "ctype.h",    "errno.h",   "fenv.h",     "float.h",        "inttypes.h", "iso646.h",
        "limits.h", "locale.h",  "math.h",     "setjmp.h",  "signal.h",   "stdalign.h",     "stdarg.h",   "stdatomic.h",
        "stdbool.h", "stddef.h", "stdint.h",   "stdio.h",   "stdlib.h",   "stdnoreturn.h",  "string.h",   "tgmath.h",
        "threads.h", "time.h",   "uchar.h",    "wchar.h",   "wctype.h"};
    for (size_t i = 0; i < sizeof standard / sizeof *standard; ++i)
        if (!strcmp(name, standard[i])) return true;
    return false;
}

static void test_it_includes_only_umtrain_h_and_standard_headers(void **state) {
    (void)state;
    FILE *f = fopen(source, "r");
    assert_non_null(f);
    char line[512];
    int includes = 0, line_number = 0;
    bool umtrain = false;
    while (fgets(line, sizeof line, f)) {
        ++line_number;
        line[strcspn(line, "\n")] = '\0';
        const char *p = line;
        while (isspace((unsigned char)*p)) ++p;
        if (*p++ != '#') continue;
        while (isspace((unsigned char)*p)) ++p;
        if (strncmp(p, "include", 7)) continue;
        p += 7;
        while (isspace((unsigned char)*p)) ++p;
        char name[256] = "";
        size_t n = strcspn(p + 1, "\">");
        if (n < sizeof name) memcpy(name, p + 1, n), name[n] = '\0';
        bool allowed = (*p == '"' && !strcmp(name, "umtrain.h")) || (*p == '<' && is_standard_header(name));
        if (!allowed) fail_msg("%s:%d includes %s: only \"umtrain.h\" and standard headers", source, line_number, p);
        umtrain |= *p == '"';
        ++includes;
    }
    fclose(f);
    assert_true(umtrain);
    assert_true(includes >= 2);
}

static void test_a_bad_command_line_prints_the_usage_and_exits_2(void **state) {
    (void)state;
    const char *bad[] = {"--bogus 1", "--epochs", "--epochs 0", "--epochs 2x", "--epochs ''", "--epochs 1001",
                         "--data-dir", "--data-dir data --gpus 2", "extra"};
    char out[1024];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; ++i) {
        int status = run(bad[i], out, sizeof out);
        if (status != 2 || strcmp(out, usage))
            fail_msg("mnist_cnn_minimal %s: exit %d, printed \"%s\"; expected exit 2 and the usage", bad[i], status, out);
    }
}

static void test_help_prints_the_usage_on_stdout_and_exits_0(void **state) {
    (void)state;
    const char *asks[] = {"--help", "-h"};
    char out[1024], command[1024];
    for (size_t i = 0; i < sizeof asks / sizeof *asks; ++i) {
        /* stderr to /dev/null inside the braces: what is left came on stdout. */
        snprintf(command, sizeof command, "{ %s %s 2>/dev/null; }", binary, asks[i]);
        int status = run_program(command, out, sizeof out);
        if (status != 0 || strcmp(out, usage))
            fail_msg("mnist_cnn_minimal %s: exit %d, printed \"%s\" on stdout; expected exit 0 and the usage", asks[i],
                     status, out);
    }
}

static void test_a_folder_without_mnist_is_named_and_exits_1(void **state) {
    (void)state;
    char out[4096];
    int status = run("--data-dir /nonexistent/mnist --epochs 1", out, sizeof out);
    assert_int_equal(status, 1);
    /* umt_last_error() names the file it could not open; no training line was printed. */
    assert_non_null(strstr(out, "/nonexistent/mnist/train-images-idx3-ubyte"));
    assert_null(strstr(out, "epoch"));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MNIST_CNN_MINIMAL_BINARY MNIST_CNN_MINIMAL_SOURCE\n", argv[0]);
        return 2;
    }
    binary = argv[1];
    source = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_file_is_at_most_120_lines),
        cmocka_unit_test(test_it_includes_only_umtrain_h_and_standard_headers),
        cmocka_unit_test(test_a_bad_command_line_prints_the_usage_and_exits_2),
        cmocka_unit_test(test_help_prints_the_usage_on_stdout_and_exits_0),
        cmocka_unit_test(test_a_folder_without_mnist_is_named_and_exits_1),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
