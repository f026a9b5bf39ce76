/*
 * tests/test_example_help.c — every example program with a command line answers --help and -h
 * the same way: its usage on stdout, nothing on stderr, exit status 0 (not "unknown flag" and
 * exit 2), and without touching data, a GPU or the disk. examples/embed takes no arguments (it is
 * the README's embedding program, shown whole there) and is left out.
 *
 * argv[1..] are the binaries (tests/BUILD passes their locations); each usage starts with
 * "usage: <the binary's name>".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tests/run_program.h"

static int binary_count;
static char **binaries;

/* The last part of a path: the program's name. */
static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Runs binary with flag; its stdout alone in out (stderr goes to /dev/null), and whether stderr
 * stayed empty in *quiet. Returns the exit status. */
static int run_help(const char *binary, const char *flag, char *out, size_t size, int *quiet) {
    char command[2048], errors[256];
    /* Inside braces: run_program's own 2>&1 then applies to the group, not to the binary. */
    snprintf(command, sizeof command, "{ %s %s 2>/dev/null; }", binary, flag);
    int status = run_program(command, out, size);
    snprintf(command, sizeof command, "{ %s %s >/dev/null; }", binary, flag);
    run_program(command, errors, sizeof errors);
    *quiet = errors[0] == '\0';
    return status;
}

static void test_every_example_prints_its_usage_on_stdout_and_exits_0_on_help(void **state) {
    (void)state;
    const char *flags[] = {"--help", "-h"};
    for (int i = 0; i < binary_count; ++i)
        for (size_t f = 0; f < sizeof flags / sizeof *flags; ++f) {
            char out[4096], expected[256];
            int quiet = 0, status = run_help(binaries[i], flags[f], out, sizeof out, &quiet);
            snprintf(expected, sizeof expected, "usage: %s ", base_name(binaries[i]));
            if (status != 0 || strncmp(out, expected, strlen(expected)) || !quiet)
                fail_msg("%s %s: exit %d, stderr %s, stdout \"%s\"; expected exit 0, the usage on stdout only",
                         base_name(binaries[i]), flags[f], status, quiet ? "empty" : "not empty", out);
        }
}

/* A flag with its value that the program takes: the start of a longer command line. */
static const char *a_valid_flag(const char *name) {
    if (!strcmp(name, "predict")) return "--device cpu";
    if (!strcmp(name, "mnist_to_png")) return "--data-dir data/mnist";
    return "--seed 3";
}

/* --help anywhere on the line wins over the flags before it, as a user adding it to a long
 * command line expects. */
static void test_help_after_other_flags_still_prints_the_usage(void **state) {
    (void)state;
    for (int i = 0; i < binary_count; ++i) {
        const char *name = base_name(binaries[i]);
        if (!strcmp(name, "mnist_cnn_minimal")) continue; /* --help alone: it keeps to 120 lines */
        char flags[256], out[4096];
        snprintf(flags, sizeof flags, "%s --help", a_valid_flag(name));
        int quiet = 0, status = run_help(binaries[i], flags, out, sizeof out, &quiet);
        if (status != 0 || strncmp(out, "usage: ", 7))
            fail_msg("%s %s: exit %d, printed \"%s\"", name, flags, status, out);
    }
}

/* The limits on what a run reads are listed, so that a user finds them. */
static void test_the_trainers_usage_lists_test_limit(void **state) {
    (void)state;
    for (int i = 0; i < binary_count; ++i) {
        const char *name = base_name(binaries[i]);
        if (strcmp(name, "mnist_cnn") && strcmp(name, "mnist_mlp") && strcmp(name, "image_folder")) continue;
        char out[4096];
        int quiet = 0;
        assert_int_equal(run_help(binaries[i], "--help", out, sizeof out, &quiet), 0);
        if (!strstr(out, "[--test-limit N]")) fail_msg("%s --help lists no [--test-limit N]:\n%s", name, out);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s EXAMPLE_BINARY...\n", argv[0]);
        return 2;
    }
    binaries = argv + 1;
    binary_count = argc - 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_example_prints_its_usage_on_stdout_and_exits_0_on_help),
        cmocka_unit_test(test_help_after_other_flags_still_prints_the_usage),
        cmocka_unit_test(test_the_trainers_usage_lists_test_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
