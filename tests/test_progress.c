/*
 * tests/test_progress.c — the trainers' progress lines (examples/example_progress.h) on a clock the
 * test sets: the elapsed time and the ETA of the epoch and of the run (the epochs left at this
 * epoch's pace, each with what followed the last one's training), durations as m:ss and h:mm:ss,
 * a run of steps without epochs; in a pipe or file one plain line each, on a terminal one line
 * rewritten in place (carriage return, the line cut to the width, clear to its end), ended at the
 * epoch's last step or by a break.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "examples/example_progress.h"

static void test_durations_read_as_minutes_and_seconds_then_hours(void **state) {
    (void)state;
    char text[32];
    assert_string_equal(example_duration_text(0, text, sizeof text), "0:00");
    assert_string_equal(example_duration_text(59.6, text, sizeof text), "1:00");
    assert_string_equal(example_duration_text(754, text, sizeof text), "12:34");
    assert_string_equal(example_duration_text(3599.4, text, sizeof text), "59:59");
    assert_string_equal(example_duration_text(3600, text, sizeof text), "1:00:00");
    assert_string_equal(example_duration_text(90061, text, sizeof text), "25:01:01");
    /* A clock that went backwards, or a NaN from 0/0, shows as nothing elapsed. */
    assert_string_equal(example_duration_text(-5, text, sizeof text), "0:00");
    assert_string_equal(example_duration_text(NAN, text, sizeof text), "0:00");
}

static void test_the_eta_is_the_epochs_pace_and_then_the_epochs_left_with_their_evaluation(void **state) {
    (void)state;
    example_progress p;
    char times[128];
    /* Epochs 0, 1, 2 of 10 steps each; 2 steps took 4 s: 16 s left in this epoch, two more
     * epochs of 20 s, nothing known yet of what follows an epoch's training. */
    example_progress_start_at(&p, stdout, false, 0, 3, 100.0);
    example_progress_epoch_at(&p, 0, 10, 100.0);
    example_progress_times(&p, 2, 104.0, times, sizeof times);
    assert_string_equal(times, " | epoch 0:04 eta 0:16 | run 0:04 eta 0:56");
    /* The epoch's training ends at 120 s; evaluation and saving take 5 s before epoch 1 starts.
     * Halfway through it (10 s): 10 s left, its own 5 s after, and one epoch of 20 + 5 s. */
    FILE *sink = fopen("/dev/null", "w");
    assert_non_null(sink);
    p.out = sink;
    example_progress_line_at(&p, 10, "epoch 1 step 10/10", 120.0);
    example_progress_epoch_at(&p, 1, 10, 125.0);
    example_progress_times(&p, 5, 135.0, times, sizeof times);
    assert_string_equal(times, " | epoch 0:10 eta 0:10 | run 0:35 eta 0:40");
    /* The last epoch: what is left of it and its evaluation. */
    example_progress_line_at(&p, 10, "epoch 2 step 10/10", 145.0);
    example_progress_epoch_at(&p, 2, 10, 150.0);
    example_progress_times(&p, 5, 160.0, times, sizeof times);
    assert_string_equal(times, " | epoch 0:10 eta 0:10 | run 1:00 eta 0:15");
    /* A resumed run starts at its checkpoint's epoch: epoch 3 of 4, nothing after it. */
    example_progress_start_at(&p, sink, false, 3, 4, 0.0);
    example_progress_epoch_at(&p, 3, 4, 0.0);
    example_progress_times(&p, 1, 2.0, times, sizeof times);
    assert_string_equal(times, " | epoch 0:02 eta 0:06 | run 0:02 eta 0:06");
    fclose(sink);
}

static void test_a_run_of_steps_without_epochs_carries_the_runs_time_alone(void **state) {
    (void)state;
    example_progress p;
    char times[128];
    example_progress_start_at(&p, stdout, false, 0, 0, 0.0);
    example_progress_epoch_at(&p, 0, 10, 0.0);
    example_progress_times(&p, 4, 8.0, times, sizeof times);
    assert_string_equal(times, " | run 0:08 eta 0:12");
}

/* What the lines of steps 1..steps (each second) printed, in place or not, then a break. */
static char *print_epoch(bool in_place, int columns, int64_t steps, int64_t until) {
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    assert_non_null(out);
    example_progress p;
    example_progress_start_at(&p, out, in_place, 0, 1, 0.0);
    p.columns = columns;
    example_progress_epoch_at(&p, 0, steps, 0.0);
    for (int64_t done = 1; done <= until; ++done) {
        char line[64];
        snprintf(line, sizeof line, "step %lld/%lld", (long long)done, (long long)steps);
        example_progress_line_at(&p, done, line, (double)done);
    }
    example_progress_break(&p);
    fclose(out);
    return text;
}

static void test_in_a_pipe_every_line_is_a_plain_line(void **state) {
    (void)state;
    char *text = print_epoch(false, 0, 2, 2);
    assert_string_equal(text, "step 1/2 | epoch 0:01 eta 0:01 | run 0:01 eta 0:01\n"
                              "step 2/2 | epoch 0:02 eta 0:00 | run 0:02 eta 0:00\n");
    free(text);
}

static void test_on_a_terminal_one_line_is_rewritten_in_place_and_ended_at_the_epochs_end(void **state) {
    (void)state;
    char *text = print_epoch(true, 200, 2, 2);
    assert_string_equal(text, "\rstep 1/2 | epoch 0:01 eta 0:01 | run 0:01 eta 0:01\033[K"
                              "\rstep 2/2 | epoch 0:02 eta 0:00 | run 0:02 eta 0:00\033[K\n");
    free(text);
    /* Stopped before the epoch's end (an error, a signal): the break ends the line, once. */
    text = print_epoch(true, 200, 3, 1);
    assert_string_equal(text, "\rstep 1/3 | epoch 0:01 eta 0:02 | run 0:01 eta 0:02\033[K\n");
    free(text);
}

static void test_on_a_narrow_terminal_the_line_is_cut_to_its_width(void **state) {
    (void)state;
    /* A line that wrapped would leave its first rows behind at each rewrite. */
    char *text = print_epoch(true, 12, 2, 2);
    assert_string_equal(text, "\rstep 1/2 | \033[K\rstep 2/2 | \033[K\n");
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_durations_read_as_minutes_and_seconds_then_hours),
        cmocka_unit_test(test_the_eta_is_the_epochs_pace_and_then_the_epochs_left_with_their_evaluation),
        cmocka_unit_test(test_a_run_of_steps_without_epochs_carries_the_runs_time_alone),
        cmocka_unit_test(test_in_a_pipe_every_line_is_a_plain_line),
        cmocka_unit_test(test_on_a_terminal_one_line_is_rewritten_in_place_and_ended_at_the_epochs_end),
        cmocka_unit_test(test_on_a_narrow_terminal_the_line_is_cut_to_its_width),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
