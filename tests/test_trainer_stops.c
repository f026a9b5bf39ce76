/*
 * tests/test_trainer_stops.c — how the trainers stop, run on the CPU as a user runs them:
 *   - mnist_mlp --lr 100 goes non-finite: it stops within the first non-finite step, naming the
 *     epoch, the step and what was not finite, and exits 1 (issue 26);
 *   - Ctrl-C (a real SIGINT) in the middle of an epoch of mnist_cnn --save: the step finishes, the
 *     checkpoint keeps the step inside the epoch, the exit status is 130, and --resume from it
 *     ends with the parameters, optimizer state and RNG of the run that was never stopped, byte for
 *     byte (the data resident, then through the host loader);
 *   - SIGTERM exits 143 after the step; a second Ctrl-C ends the run at once;
 *   - a --save run that goes non-finite leaves the last good checkpoint as it was, byte for byte,
 *     whether it stops (the default) or skips the steps and comes to save non-finite weights.
 *
 * The data is a tiny synthetic MNIST (tests/synthetic_mnist.h): stripes, which SGD at lr 100
 * drives to NaN within ten steps, as it does MNIST itself.
 *
 * argv[1..2] are mnist_cnn and mnist_mlp (tests/BUILD passes their locations).
 */
#include <setjmp.h>
#include <signal.h>
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

static const char *cnn_binary, *mlp_binary;
static char data[256];

static int setup(void **state) {
    (void)state;
    if (scratch_make("trainer_stops")) return -1;
    snprintf(data, sizeof data, "%s", scratch_folder());
    return synthetic_mnist_write(data, "train", 640, SYNTHETIC_STRIPES) ||
                   synthetic_mnist_write(data, "t10k", 20, SYNTHETIC_STRIPES)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

static void expect_text(const char *out, const char *text) {
    if (!strstr(out, text)) fail_msg("expected \"%s\" in the output", text);
}

static void expect_no_text(const char *out, const char *text) {
    if (strstr(out, text)) fail_msg("expected no \"%s\" in the output", text);
}

/* binary on the CPU on the synthetic set with args, signalled as run_program_signalled_after says
 * (count 0: not at all; each signal delay_ms after its trigger); its output in out. */
static int run_after(const char *binary, const char *args, const char *const *triggers, const int *signals,
                     int count, int delay_ms, char *out, size_t size) {
    char command[2048];
    snprintf(command, sizeof command, "%s --device cpu --data-dir %s %s", binary, data, args);
    int status = run_program_signalled_after(command, triggers, signals, count, delay_ms, out, size);
    print_message("$ %s  (exit %d)\n%s", command, status, out);
    return status;
}

static int run(const char *binary, const char *args, const char *const *triggers, const int *signals, int count,
               char *out, size_t size) {
    return run_after(binary, args, triggers, signals, count, 0, out, size);
}

static void expect_same_file(const char *a, const char *b) {
    size_t size_a, size_b;
    uint8_t *bytes_a = scratch_read(a, &size_a), *bytes_b = scratch_read(b, &size_b);
    assert_int_equal(size_a, size_b);
    assert_memory_equal(bytes_a, bytes_b, size_a);
    free(bytes_a);
    free(bytes_b);
}

/* The first progress line "epoch 1 step S/..." whose mean loss is nan or inf: S, or 0. */
static int first_nonfinite_line(const char *out) {
    for (const char *p = out; (p = strstr(p, "epoch 1 step ")) != NULL; ++p) {
        int step = atoi(p + strlen("epoch 1 step "));
        const char *loss = strstr(p, " loss "), *end = strchr(p, '\n');
        if (loss && (!end || loss < end) && (strncmp(loss + 6, "nan", 3) == 0 || strncmp(loss + 6, "-nan", 4) == 0 ||
                                            strncmp(loss + 6, "inf", 3) == 0))
            return step;
    }
    return 0;
}

/* ----------------------------------------------------------------------------------------- */

static void test_mlp_at_lr_100_stops_within_the_first_nonfinite_step_naming_it(void **state) {
    (void)state;
    static char off[65536], out[65536];
    const char *args = "--lr 100 --batch-size 16 --epochs 1 --log-every 1";
    char unchecked[256];
    /* Checked (the default): the run ends naming the step, with status 1 (it used to train on). */
    assert_int_equal(run(mlp_binary, args, NULL, NULL, 0, out, sizeof out), 1);
    const char *told = strstr(out, "mnist_mlp: epoch 1 step ");
    if (!told) fail_msg("no line naming the non-finite step");
    int stopped = atoi(told + strlen("mnist_mlp: epoch 1 step "));
    expect_text(told, "/40 (optimizer step ");
    if (!strstr(told, "the loss is nan") && !strstr(told, "the gradient of fc"))
        fail_msg("the line names neither the loss nor a gradient");
    expect_text(told, "the run stops");
    /* No step after it: the last progress line is that step's. */
    char after[64];
    snprintf(after, sizeof after, "epoch 1 step %d/40", stopped + 1);
    expect_no_text(out, after);
    expect_no_text(out, "test accuracy");
    /* Unchecked, as before: it trains on through NaN to exit status 0. The checked run stopped
     * at the first step whose loss is NaN there, or before it (a gradient went first). */
    snprintf(unchecked, sizeof unchecked, "%s --on-nonfinite off", args);
    assert_int_equal(run(mlp_binary, unchecked, NULL, NULL, 0, off, sizeof off), 0);
    int first_nan = first_nonfinite_line(off);
    if (stopped < 1 || first_nan < 1 || stopped > first_nan)
        fail_msg("stopped at step %d; the unchecked loss was NaN from step %d", stopped, first_nan);
    /* skip goes on to the end and counts what it skipped. */
    snprintf(unchecked, sizeof unchecked, "%s --on-nonfinite skip", args);
    assert_int_equal(run(mlp_binary, unchecked, NULL, NULL, 0, out, sizeof out), 0);
    expect_text(out, "its update is skipped");
    expect_text(out, "epoch 1 test accuracy");
    expect_text(out, "steps skipped for a NaN or infinite loss or gradient (--on-nonfinite skip)");
}

/* One mnist_cnn run stopped by SIGINT inside epoch 1 of 2, resumed, against one never stopped. */
static void check_sigint_and_resume(const char *input) {
    static char out[65536];
    char args[1024], full[64], part[64];
    snprintf(full, sizeof full, "%s", scratch_path("full.ckpt"));
    snprintf(part, sizeof part, "%s", scratch_path("part.ckpt"));
    const char *common = "--epochs 2 --train-limit 64 --test-limit 8 --batch-size 4 --log-every 1";
    snprintf(args, sizeof args, "%s %s --save %s", common, input, full);
    assert_int_equal(run(cnn_binary, args, NULL, NULL, 0, out, sizeof out), 0);

    const char *trigger[] = {"epoch 1 step 4/16 "};
    const int sigint[] = {SIGINT};
    snprintf(args, sizeof args, "%s %s --save %s", common, input, part);
    assert_int_equal(run(cnn_binary, args, trigger, sigint, 1, out, sizeof out), 130);
    const char *stopped = strstr(out, "mnist_cnn: stopped by SIGINT after step ");
    if (!stopped) fail_msg("no line saying where SIGINT stopped the run");
    int step = atoi(stopped + strlen("mnist_cnn: stopped by SIGINT after step "));
    assert_true(step >= 4 && step < 16); /* inside the epoch */
    expect_text(stopped, "of epoch 1; saved");
    expect_no_text(out, "epoch 1 test accuracy");
    size_t size;
    uint8_t *bytes = scratch_read(part, &size);
    assert_int_equal(bytes[8], 2); /* format version 2: a step inside an epoch */
    free(bytes);

    snprintf(args, sizeof args, "%s %s --resume %s --save %s", common, input, part, part);
    assert_int_equal(run(cnn_binary, args, NULL, NULL, 0, out, sizeof out), 0);
    char resumed[128], next[64];
    snprintf(resumed, sizeof resumed, "inside epoch 1, after its step %d", step);
    expect_text(out, resumed);
    snprintf(next, sizeof next, "epoch 1 step %d/16 ", step + 1);
    expect_text(out, next);
    snprintf(next, sizeof next, "epoch 1 step %d/16 ", step);
    expect_no_text(out, next);
    /* Parameters, optimizer state, step count and RNG: the uninterrupted run's, byte for byte. */
    expect_same_file(part, full);
}

static void test_sigint_inside_an_epoch_saves_and_resume_matches_the_run_never_stopped(void **state) {
    (void)state;
    check_sigint_and_resume("");
}

static void test_the_same_through_the_host_loader(void **state) {
    (void)state;
    check_sigint_and_resume("--data-on host");
}

static void test_sigterm_stops_after_the_step_with_status_143(void **state) {
    (void)state;
    static char out[65536];
    const char *trigger[] = {"epoch 1 step 3/40 "};
    const int sigterm[] = {SIGTERM};
    assert_int_equal(run(mlp_binary, "--batch-size 16 --log-every 1", trigger, sigterm, 1, out, sizeof out), 143);
    expect_text(out, "mnist_mlp: stopping after this step");
    expect_text(out, "mnist_mlp: stopped by SIGTERM after epoch 1 step ");
    expect_no_text(out, "test accuracy");
}

/* Long steps (a wide layer, a large batch): the second Ctrl-C comes mid-step. */
static void test_a_second_ctrl_c_ends_the_run_at_once(void **state) {
    (void)state;
    static char out[65536];
    const char *triggers[] = {"epoch 1 step 1/", "stopping after this step"};
    const int sigints[] = {SIGINT, SIGINT};
    /* Each Ctrl-C 20 ms after its line: the first after the check that follows step 1's line (so
     * that it lands inside step 2, of about 170 ms on two cores with the CPU backend's threaded
     * GEMM: 16384 hidden units), the second inside that step too. */
    int status = run_after(mlp_binary, "--hidden 16384 --batch-size 320 --log-every 1", triggers, sigints, 2, 20, out,
                           sizeof out);
    assert_int_equal(status, 130);
    expect_no_text(out, "stopped by SIGINT"); /* no orderly stop after the step: the second ended it */
    expect_no_text(out, "epoch 1 step 2/");
}

/* A good checkpoint, then runs that go non-finite with --save to it: it stays byte for byte. */
static void test_a_save_run_going_nonfinite_leaves_the_last_good_checkpoint_as_it_was(void **state) {
    (void)state;
    static char out[65536];
    char args[1024], good[64], copy[64], poisoned[64];
    snprintf(good, sizeof good, "%s", scratch_path("good.ckpt"));
    snprintf(copy, sizeof copy, "%s", scratch_path("good-copy.ckpt"));
    snprintf(poisoned, sizeof poisoned, "%s", scratch_path("poisoned.ckpt"));
    const char *common = "--train-limit 32 --test-limit 8 --batch-size 8";
    snprintf(args, sizeof args, "%s --epochs 1 --save %s", common, good);
    assert_int_equal(run(cnn_binary, args, NULL, NULL, 0, out, sizeof out), 0);
    size_t size;
    uint8_t *bytes = scratch_read(good, &size);
    scratch_write("good-copy.ckpt", bytes, size);
    scratch_write("poisoned.ckpt", bytes, size);
    free(bytes);
    /* The state a diverged run reaches: NaN weights, loaded on purpose, trained on with --save. */
    scratch_poison_checkpoint(poisoned, "conv1.weight");
    snprintf(args, sizeof args, "%s --epochs 2 --resume %s --allow-nonfinite --save %s", common, poisoned, good);
    assert_int_equal(run(cnn_binary, args, NULL, NULL, 0, out, sizeof out), 1);
    expect_text(out, "mnist_cnn: epoch 2 step 1/4 (optimizer step ");
    expect_text(out, "the loss is nan");
    expect_same_file(good, copy);
    /* skip: every step is skipped, and the epoch's save finds the NaN weights and writes nothing. */
    snprintf(args, sizeof args, "%s --epochs 2 --resume %s --allow-nonfinite --on-nonfinite skip --save %s", common,
             poisoned, good);
    assert_int_equal(run(cnn_binary, args, NULL, NULL, 0, out, sizeof out), 1);
    expect_text(out, "parameter conv1.weight: element 0 is nan: a checkpoint of non-finite values is not written");
    expect_same_file(good, copy);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MNIST_CNN MNIST_MLP (the binaries)\n", argv[0]);
        return 2;
    }
    cnn_binary = argv[1];
    mlp_binary = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_at_lr_100_stops_within_the_first_nonfinite_step_naming_it),
        cmocka_unit_test(test_sigint_inside_an_epoch_saves_and_resume_matches_the_run_never_stopped),
        cmocka_unit_test(test_the_same_through_the_host_loader),
        cmocka_unit_test(test_sigterm_stops_after_the_step_with_status_143),
        cmocka_unit_test(test_a_second_ctrl_c_ends_the_run_at_once),
        cmocka_unit_test(test_a_save_run_going_nonfinite_leaves_the_last_good_checkpoint_as_it_was),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
