/*
 * tests/test_plot_metrics.c — tools/plot_metrics.py, which draws a trainer's --metrics file
 * (examples/example_metrics.h) as one SVG, on small hand-written files:
 *   - a resumed file: the lines the first run wrote past the checkpoint the second resumed from
 *     are left out (they were trained again), the resume is drawn; lines missing a field are drawn
 *     where they have it, a loss that was not finite (null) is counted, not drawn; the picture
 *     holds the three panels and each evaluation's point;
 *   - malformed files are refused with the line's number and no picture: a line cut short, a JSON
 *     value that is not an object, bytes that are not UTF-8, a file with nothing to draw.
 *
 * argv[1] is tools/plot_metrics.py (tests/BUILD passes its location); python3 runs it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/run_program.h"
#include "tests/scratch.h"

static const char *tool;

/* Runs the tool on the file holding text; its output in out, its exit status returned. */
static int plot(const char *text, char *out, size_t size) {
    char metrics[512], command[2048];
    snprintf(metrics, sizeof metrics, "%s", scratch_write("m.jsonl", (const uint8_t *)text, strlen(text)));
    unlink(scratch_path("curves.svg"));
    snprintf(command, sizeof command, "python3 %s %s -o %s", tool, metrics, scratch_path("curves.svg"));
    int status = run_program(command, out, size);
    print_message("$ %s\n%s", command, out);
    return status;
}

static void expect_text(const char *out, const char *text) {
    if (!strstr(out, text)) fail_msg("expected \"%s\" in:\n%s", text, out);
}

/* The picture the last run drew, as a string. */
static char *picture(void) {
    size_t size = 0;
    uint8_t *bytes = scratch_read(scratch_path("curves.svg"), &size);
    char *text = calloc(size + 1, 1); /* scratch_read's bytes end without a NUL */
    assert_non_null(text);
    memcpy(text, bytes, size);
    free(bytes);
    return text;
}

/* A run to step 6, its checkpoint at step 4; resumed from it to step 8. */
static const char resumed[] =
    "{\"event\": \"start\", \"program\": \"mnist_cnn\", \"resumed\": false, \"step\": 0, \"unix_time\": 1}\n"
    "{\"event\": \"train\", \"epoch\": 1, \"epoch_step\": 2, \"step\": 2, \"loss\": 2.0, \"lr\": 1, "
    "\"images_per_s\": 100}\n"
    "{\"event\": \"train\", \"epoch\": 1, \"epoch_step\": 4, \"step\": 4, \"loss\": 1.5, \"images_per_s\": 120}\n"
    "{\"event\": \"eval\", \"epoch\": 1, \"step\": 4, \"test_accuracy\": 60.25}\n"
    "{\"event\": \"train\", \"epoch\": 2, \"epoch_step\": 2, \"step\": 6, \"loss\": 1.25, \"images_per_s\": 110}\n"
    "\n"
    "{\"event\": \"start\", \"program\": \"mnist_cnn\", \"resumed\": true, \"step\": 4, \"unix_time\": 2}\n"
    "{\"event\": \"train\", \"epoch\": 2, \"epoch_step\": 2, \"step\": 6, \"loss\": null, \"images_per_s\": 90}\n"
    "{\"event\": \"train\", \"epoch\": 2, \"epoch_step\": 4, \"step\": 8, \"loss\": 0.875}\n"
    "{\"event\": \"eval\", \"epoch\": 2, \"step\": 8}\n"
    "{\"event\": \"eval\", \"epoch\": 2, \"step\": 8, \"test_accuracy\": 75.5, \"pools\": {}}\n";

static void test_a_resumed_file_drops_what_was_trained_again_and_draws_what_each_line_has(void **state) {
    (void)state;
    char out[4096];
    assert_int_equal(plot(resumed, out, sizeof out), 0);
    /* The first run's step 6 is gone: 2 + 2 training lines, the evaluation without an accuracy
     * not drawn, the null loss counted. */
    expect_text(out, "4 training lines, 2 evaluations, 1 resume, 1 losses not finite, loss 2 to 0.875, "
                     "test accuracy 75.50% at the end (best 75.50%)");
    char *svg = picture();
    expect_text(svg, "training loss");
    expect_text(svg, "test accuracy (%)");
    expect_text(svg, "throughput (images/s)");
    expect_text(svg, "<title>step 4: 60.25%</title>");
    expect_text(svg, "<title>step 8: 75.50%</title>");
    expect_text(svg, "class=\"resume\"");
    expect_text(svg, ">resumed</text>");
    free(svg);
}

static void test_malformed_lines_are_refused_with_their_number_and_no_picture(void **state) {
    (void)state;
    static const struct {
        const char *text, *expected;
    } cases[] = {
        {"{\"event\": \"start\"}\n{\"event\": \"train\", \"step\": 1, \"loss\": 2}\n\n"
         "{\"event\": \"train\", \"step\": 2, \"lo",
         "m.jsonl:4: not a JSON line"},
        {"{\"event\": \"train\", \"step\": 1, \"loss\": 2}\n[1, 2]\n", "m.jsonl:2: a JSON list, expected an object"},
        {"{\"event\": \"train\", \"step\": 1, \"loss\": 2}\n{\"event\": \"\xff\"}\n", "m.jsonl:2: not UTF-8 text"},
        {"{\"event\": \"start\", \"program\": \"mnist_mlp\"}\n", "no train or eval line with a step: nothing to draw"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char out[4096];
        assert_int_equal(plot(cases[i].text, out, sizeof out), 1);
        expect_text(out, cases[i].expected);
        assert_int_equal(access(scratch_path("curves.svg"), F_OK), -1);
    }
}

static int setup(void **state) {
    (void)state;
    return scratch_make("plot_metrics");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s tools/plot_metrics.py\n", argv[0]);
        return 2;
    }
    tool = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_resumed_file_drops_what_was_trained_again_and_draws_what_each_line_has),
        cmocka_unit_test(test_malformed_lines_are_refused_with_their_number_and_no_picture),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
