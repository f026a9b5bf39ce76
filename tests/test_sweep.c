/*
 * tests/test_sweep.c — the sweep trainer (examples/sweep.c) on the CPU: three configurations
 * trained at once, each on its own thread and context, end with the accuracy and the parameters
 * (their FNV-1a hash) each gives when trained alone; its table names every configuration.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/run_program.h"
#include "tests/scratch.h"
#include "tests/synthetic_mnist.h"

enum { TRAIN_N = 96, TEST_N = 40 };
/* Two short epochs (the second at gamma times the rate), 16 images a step, dropout as in training. */
#define SHORT "--device cpu --epochs 2 --train-limit 48 --batch-size 16"

static const char *sweep_binary;

static int setup(void **state) {
    (void)state;
    return scratch_make("sweep") || synthetic_mnist_write(scratch_folder(), "train", TRAIN_N, SYNTHETIC_STRIPES) ||
                   synthetic_mnist_write(scratch_folder(), "t10k", TEST_N, SYNTHETIC_STRIPES)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

static void run_sweep(const char *args, char *out, size_t size) {
    char command[1024];
    snprintf(command, sizeof command, "%s --data-dir %s " SHORT " %s", sweep_binary, scratch_folder(), args);
    int status = run_program(command, out, size);
    print_message("$ %s\n%s", command, out);
    assert_int_equal(status, 0);
}

/* The table's row of a configuration (its first words, up to the width), copied into row. */
static void row_of(const char *out, const char *configuration, char *row, size_t size) {
    const char *at = strstr(out, configuration);
    if (!at) fail_msg("no row for '%s' in the sweep's table", configuration);
    size_t length = strcspn(at, "\n");
    snprintf(row, size, "%.*s", (int)length, at);
}

static void test_configurations_trained_at_once_end_as_each_trained_alone(void **state) {
    (void)state;
    static char together[16384], alone[3][8192];
    run_sweep("--sweep-seeds 3,4,5 --sweep-optimizer sgd,adam,adadelta --sweep-lr 0.05,0.002,1 --sweep-width 16,32,24",
              together, sizeof together);
    run_sweep("--sweep-seeds 3 --sweep-optimizer sgd --sweep-lr 0.05 --sweep-width 16", alone[0], sizeof alone[0]);
    run_sweep("--sweep-seeds 4 --sweep-optimizer adam --sweep-lr 0.002 --sweep-width 32", alone[1], sizeof alone[1]);
    run_sweep("--sweep-seeds 5 --sweep-optimizer adadelta --sweep-lr 1 --sweep-width 24", alone[2], sizeof alone[2]);
    const char *rows[3] = {"seed 3 lr 0.05 sgd width 16", "seed 4 lr 0.002 adam width 32",
                           "seed 5 lr 1 adadelta width 24"};
    for (int i = 0; i < 3; ++i) {
        char a[256], b[256];
        row_of(together, rows[i], a, sizeof a);
        row_of(alone[i], rows[i], b, sizeof b);
        /* Accuracy and parameters' hash: the first, then the last column (times differ). */
        const char *accuracy_a = a + 44, *accuracy_b = b + 44;
        assert_memory_equal(accuracy_a, accuracy_b, 10);
        assert_string_equal(strrchr(a, ' '), strrchr(b, ' '));
    }
    assert_non_null(strstr(together, "3 trainings at once"));
}

static void test_lists_of_other_lengths_are_refused_naming_them(void **state) {
    (void)state;
    char command[512], out[4096];
    snprintf(command, sizeof command, "%s --data-dir %s " SHORT " --sweep-seeds 1,2,3 --sweep-lr 0.1,0.2",
             sweep_binary, scratch_folder());
    assert_int_equal(run_program(command, out, sizeof out), 2);
    assert_non_null(strstr(out, "a list of 2 values in a sweep of 3 configurations (expected 1 or 3)"));
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: test_sweep SWEEP_BINARY\n"), 2;
    sweep_binary = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_configurations_trained_at_once_end_as_each_trained_alone),
        cmocka_unit_test(test_lists_of_other_lengths_are_refused_naming_them),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
