/*
 * tests/test_trainer_runs.c — the trainers (examples/mnist_cnn, mnist_mlp, image_folder) run on
 * the CPU on a tiny synthetic MNIST, read as a user reads them: --optimizer brings that
 * optimizer's own learning rate, --test-limit evaluates on the first N test images, the banner
 * says what runs (the device, the images used, where the data is), the memory plan is printed
 * before the first step and --dry-run prints it alone, and --resume says when nothing is left to
 * train and refuses an epoch that no --epochs reaches. Watching a run: every progress line carries
 * the epoch's and the run's elapsed time and ETA, as plain lines into a pipe and rewritten in
 * place on a terminal (a pseudo-terminal here); --metrics writes a JSON line per progress line and
 * per evaluation without changing a result, is appended to by --resume, refuses a path that is not
 * a regular file, and tools/plot_metrics.py draws what it wrote.
 *
 * argv[1..5] are mnist_cnn, mnist_mlp, image_folder, mnist_to_png and tools/plot_metrics.py
 * (tests/BUILD passes their locations); mnist_to_png makes image_folder's tree from the same files.
 */
#define _XOPEN_SOURCE 700 /* posix_openpt and its kin: the pseudo-terminal */

#include <fcntl.h>
#include <math.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "examples/mnist_cnn_model.h"
#include "tests/run_program.h"
#include "tests/synthetic_mnist.h"
#include "umtrain.h"

enum { TRAIN_N = 64, TEST_N = 20 };
/* One epoch of one step: a run that trains as little as it can. */
#define ONE_STEP "--epochs 1 --train-limit 16 --batch-size 16"

static const char *cnn_binary, *mlp_binary, *folder_binary, *to_png_binary, *plot_tool;
static char dir[64], checkpoint[128], far_checkpoint[128];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_trainer_runs_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(checkpoint, sizeof checkpoint, "%s/cnn.ckpt", dir);
    snprintf(far_checkpoint, sizeof far_checkpoint, "%s/far.ckpt", dir);
    return synthetic_mnist_write(dir, "train", TRAIN_N, SYNTHETIC_NOISE) ||
                   synthetic_mnist_write(dir, "t10k", TEST_N, SYNTHETIC_NOISE)
               ? -1
               : 0;
}

static int teardown(void **state) {
    (void)state;
    char command[128], out[256];
    /* The folder holds mnist_to_png's tree too; its name is mkdtemp's, under /tmp. */
    snprintf(command, sizeof command, "rm -rf %s", dir);
    return run_program(command, out, sizeof out);
}

/* Runs binary on the CPU on the synthetic set with args; its stdout and stderr in out. */
static int run(const char *binary, const char *args, char *out, size_t size) {
    char command[2048];
    snprintf(command, sizeof command, "%s --device cpu --data-dir %s %s", binary, dir, args);
    int status = run_program(command, out, size);
    print_message("$ %s\n%s", command, out);
    return status;
}

static void expect_text(const char *out, const char *text) {
    if (!strstr(out, text)) fail_msg("expected \"%s\" in the output", text);
}

static void expect_no_text(const char *out, const char *text) {
    if (strstr(out, text)) fail_msg("expected no \"%s\" in the output", text);
}

/* The test accuracy of the run's last epoch line ("epoch N test accuracy A%"). */
static double last_accuracy(const char *out) {
    const char *line = NULL;
    for (const char *p = out; (p = strstr(p, "test accuracy ")) != NULL; p++) line = p;
    if (!line) fail_msg("no test accuracy line");
    return strtod(line + strlen("test accuracy "), NULL);
}

static void test_optimizer_brings_its_own_default_learning_rate(void **state) {
    (void)state;
    char out[8192];
    /* mnist_cnn kept Adadelta's lr 1.0 for Adam, which then diverged. */
    assert_int_equal(run(cnn_binary, ONE_STEP " --optimizer adam", out, sizeof out), 0);
    expect_text(out, "adam lr 0.001,");
    expect_text(out, "epoch 1 step 1/1 loss");
    expect_text(out, " lr 0.001 images/s");
    assert_int_equal(run(cnn_binary, ONE_STEP " --optimizer sgd", out, sizeof out), 0);
    expect_text(out, "sgd lr 0.01,");
    /* The example's recipe is unchanged, and --lr still wins. */
    assert_int_equal(run(cnn_binary, ONE_STEP, out, sizeof out), 0);
    expect_text(out, "adadelta lr 1,");
    assert_int_equal(run(cnn_binary, ONE_STEP " --optimizer adam --lr 0.25", out, sizeof out), 0);
    expect_text(out, "adam lr 0.25,");
    /* mnist_mlp: its own SGD rate (0.05), PyTorch's default for the others. */
    assert_int_equal(run(mlp_binary, ONE_STEP " --optimizer adamw", out, sizeof out), 0);
    expect_text(out, " lr 0.001 images/s");
    assert_int_equal(run(mlp_binary, ONE_STEP, out, sizeof out), 0);
    expect_text(out, " lr 0.05 images/s");
    /* A name no optimizer has is a bad command line, told before any data is read. */
    assert_int_equal(run(cnn_binary, "--optimizer adagrad", out, sizeof out), 2);
    expect_text(out, "adagrad");
    expect_no_text(out, "training");
}

static void test_test_limit_evaluates_the_first_n_test_images(void **state) {
    (void)state;
    char out[8192];
    const char *runs[] = {"", "--data-on host"}; /* the resident dataset, then the loader */
    for (size_t i = 0; i < sizeof runs / sizeof *runs; ++i) {
        char args[256];
        snprintf(args, sizeof args, ONE_STEP " --test-limit 3 %s", runs[i]);
        assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
        expect_text(out, "3 of 20 test images");
        double right = last_accuracy(out) * 3 / 100; /* a whole number of the 3 images, printed to 0.01% */
        assert_true(right >= 0 && right <= 3 && fabs(right - round(right)) < 1e-3);
    }
    assert_int_equal(run(mlp_binary, ONE_STEP " --test-limit 7", out, sizeof out), 0);
    expect_text(out, "7 of 20 test images");
    /* A limit past the set is the whole set. */
    assert_int_equal(run(cnn_binary, ONE_STEP " --test-limit 1000", out, sizeof out), 0);
    expect_text(out, "and 20 test images");
    assert_int_equal(run(cnn_binary, "--test-limit 0", out, sizeof out), 2);
    expect_text(out, "--test-limit '0'");
}

static void test_image_folder_test_limit_evaluates_the_first_n_test_images(void **state) {
    (void)state;
    char command[1024], out[8192];
    snprintf(command, sizeof command, "%s --data-dir %s --out %s/digits --train 16 --test 20", to_png_binary, dir, dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    snprintf(command, sizeof command, "%s --device cpu --root %s/digits --epochs 1 --test-limit 3", folder_binary, dir);
    int status = run_program(command, out, sizeof out);
    print_message("$ %s\n%s", command, out);
    assert_int_equal(status, 0);
    expect_text(out, "16 training and 20 test images");
    expect_text(out, "% (3 images)");
}

static void test_the_banner_says_what_runs_on_the_cpu(void **state) {
    (void)state;
    char out[8192];
    assert_int_equal(run(cnn_binary, ONE_STEP, out, sizeof out), 0);
    expect_text(out, "mnist_cnn: 16 of 64 training and 20 test images");
    expect_text(out, ", cpu, fp32,");
    expect_text(out, "data resident in host memory");
    expect_no_text(out, "GPU");
    expect_no_text(out, "on the device");
    assert_int_equal(run(cnn_binary, ONE_STEP " --data-on host", out, sizeof out), 0);
    expect_text(out, "batches from the host loader");
    assert_int_equal(run(mlp_binary, ONE_STEP, out, sizeof out), 0);
    expect_text(out, "mnist_mlp: 16 of 64 training and 20 test images");
    expect_text(out, ", cpu, fp32, data resident in host memory\n");
    expect_no_text(out, "GPU");
}

static void test_the_plan_comes_before_step_one_and_dry_run_trains_nothing(void **state) {
    (void)state;
    char out[8192], command[1024];
    assert_int_equal(run(cnn_binary, ONE_STEP, out, sizeof out), 0);
    const char *plan = strstr(out, "memory plan: batch 16 as 1 micro-batch of 16 (fits)");
    const char *step = strstr(out, "epoch 1 step 1/1");
    assert_non_null(plan);
    assert_non_null(step);
    assert_true(plan < step);
    expect_text(out, "  activations  host");
    assert_int_equal(run(cnn_binary, "--dry-run --batch-size 32", out, sizeof out), 0);
    expect_text(out, "memory plan: batch 32 as 1 micro-batch of 32 (fits)");
    expect_text(out, "  dataset      host");
    expect_no_text(out, "epoch 1");
    snprintf(command, sizeof command, "%s --data-dir %s --out %s/plan_digits --train 16 --test 20", to_png_binary, dir,
             dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    snprintf(command, sizeof command, "%s --device cpu --root %s/plan_digits --batch-size 8 --dry-run", folder_binary,
             dir);
    int status = run_program(command, out, sizeof out);
    print_message("$ %s\n%s", command, out);
    assert_int_equal(status, 0);
    expect_text(out, "memory plan: batch 8 as 1 micro-batch of 8 (fits)");
    expect_no_text(out, "epoch 1");
}

static void test_resume_with_nothing_left_to_train_says_so(void **state) {
    (void)state;
    char args[512], out[8192], expected[512];
    snprintf(args, sizeof args, ONE_STEP " --save %s", checkpoint);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    snprintf(args, sizeof args, ONE_STEP " --resume %s", checkpoint);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    snprintf(expected, sizeof expected,
             "mnist_cnn: checkpoint %s is after epoch 1 of 1: nothing left to train (give --epochs more than 1)\n",
             checkpoint);
    expect_text(out, expected);
    expect_no_text(out, "step 1/1");
    /* With an epoch left, that epoch alone is trained. */
    snprintf(args, sizeof args, "--epochs 2 --train-limit 16 --batch-size 16 --resume %s", checkpoint);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    expect_text(out, "resumed from");
    expect_text(out, "epoch 2 step 1/1");
    expect_no_text(out, "epoch 1 step");
}

/* A checkpoint of mnist_cnn's model and Adadelta state, saved through the API with this epoch. */
static void save_cnn_checkpoint(const char *path, int64_t epoch) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *ctx;
    mnist_cnn model;
    umt_optimizer *opt;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    assert_int_equal(mnist_cnn_build(ctx, &model), 0);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    umt_checkpoint_info info = {.epoch = epoch, .step = 0};
    assert_int_equal(umt_checkpoint_save(ctx, opt, &info, path), UMT_OK);
    umt_context_destroy(ctx);
}

static void test_resume_refuses_an_epoch_that_no_epochs_flag_reaches(void **state) {
    (void)state;
    char args[512], out[8192];
    /* 2^40: cut to an int it was 0, and epoch 1 was trained again after "resumed after epoch 1099511627776". */
    save_cnn_checkpoint(far_checkpoint, (int64_t)1 << 40);
    snprintf(args, sizeof args, "--epochs 2 --train-limit 16 --batch-size 16 --resume %s", far_checkpoint);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 1);
    expect_text(out, far_checkpoint);
    expect_text(out, "after epoch 1099511627776");
    expect_text(out, "--epochs");
    expect_no_text(out, "step 1/1");
    expect_no_text(out, "resumed");
}

/* ----------------------------------------------------------------------------------------- */
/* Watching a run: progress lines with the time, --metrics */

/* Whether text holds the times of a progress line, " | epoch M:SS eta M:SS | run M:SS eta M:SS"
 * (what they are depends on the machine's speed: under the sanitizers a step takes a second), and
 * then `end` ("\n": a plain line). */
static void expect_times(const char *text, const char *end) {
    char pattern[256];
    snprintf(pattern, sizeof pattern, " \\| epoch [0-9]+:[0-5][0-9] eta [0-9]+:[0-5][0-9] \\| run [0-9]+:[0-5][0-9] "
             "eta [0-9]+:[0-5][0-9]%s", end);
    regex_t times;
    assert_int_equal(regcomp(&times, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int found = regexec(&times, text, 0, NULL, 0);
    regfree(&times);
    if (found != 0) fail_msg("expected the progress line's times (%s) in the output", pattern);
}

static void test_progress_lines_carry_the_epochs_and_the_runs_time_as_plain_lines_in_a_pipe(void **state) {
    (void)state;
    char out[8192], command[1024];
    const char *trainers[] = {cnn_binary, mlp_binary};
    for (int i = 0; i < 2; ++i) {
        const char *args = "--epochs 2 --train-limit 16 --batch-size 8 --log-every 1";
        assert_int_equal(run(trainers[i], args, out, sizeof out), 0);
        /* The line as before, then the times: scripts that cut at " images/s" see what they saw. */
        const char *line = strstr(out, "epoch 2 step 1/2 loss ");
        assert_non_null(line);
        const char *times = strstr(line, " images/s ");
        assert_non_null(times);
        expect_times(times, "\n");
        expect_no_text(out, "\r");
        expect_no_text(out, "\033[K");
    }
    /* image_folder prints a line per epoch: the epoch's, with the run's time. */
    snprintf(command, sizeof command, "%s --data-dir %s --out %s/watch_digits --train 16 --test 20", to_png_binary, dir,
             dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    snprintf(command, sizeof command, "%s --device cpu --root %s/watch_digits --epochs 2 --batch-size 8", folder_binary,
             dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    print_message("$ %s\n%s", command, out);
    expect_text(out, "epoch 2 loss ");
    expect_times(strstr(out, "epoch 2 loss "), "\n");
}

/* Runs command on a pseudo-terminal of `columns` columns (its stdout and stderr, as in a user's
 * shell); what it printed in out, its exit status returned. */
static int run_on_terminal(const char *command, int columns, char *out, size_t size) {
    int terminal = posix_openpt(O_RDWR | O_NOCTTY);
    assert_true(terminal >= 0);
    assert_int_equal(grantpt(terminal), 0);
    assert_int_equal(unlockpt(terminal), 0);
    struct winsize window = {.ws_row = 24, .ws_col = (unsigned short)columns};
    assert_int_equal(ioctl(terminal, TIOCSWINSZ, &window), 0);
    const char *name = ptsname(terminal);
    assert_non_null(name);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        int side = setsid() < 0 ? -1 : open(name, O_RDWR);
        if (side < 0 || dup2(side, STDOUT_FILENO) < 0 || dup2(side, STDERR_FILENO) < 0) _exit(126);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    /* Read until the child's side closes (EIO on Linux). */
    size_t used = 0;
    for (ssize_t got; used + 1 < size && (got = read(terminal, out + used, size - 1 - used)) > 0;) used += (size_t)got;
    out[used] = '\0';
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    close(terminal);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_on_a_terminal_the_epochs_progress_line_is_rewritten_in_place(void **state) {
    (void)state;
    char command[1024], out[16384];
    snprintf(command, sizeof command, "%s --device cpu --data-dir %s --epochs 2 --train-limit 32 --batch-size 8 "
             "--log-every 1", mlp_binary, dir);
    assert_int_equal(run_on_terminal(command, 200, out, sizeof out), 0);
    print_message("$ %s (on a terminal)\n%s", command, out);
    /* Each line goes back to the line's start and clears what a longer one left; no newline
     * until the epoch's last step. */
    const char *first = strstr(out, "\repoch 1 step 1/4 loss "), *last = strstr(out, "\repoch 1 step 4/4 loss ");
    assert_non_null(first);
    assert_non_null(last);
    assert_null(memchr(first, '\n', (size_t)(last - first)));
    expect_times(first, "\033\\[K\repoch 1 step 2/4 loss ");
    expect_text(first, "\033[K\repoch 1 step 2/4 loss ");
    /* The last step's line stays, ended (the terminal shows "\n" as "\r\n"), before what follows. */
    const char *end = strstr(last, "\033[K\r\n");
    assert_non_null(end);
    assert_true(end < strstr(last, "epoch 1 trained in"));
    expect_text(out, "\repoch 2 step 4/4 loss ");
}

/* The file at path, as a string (NULL when it cannot be read); free it. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *text = calloc(1, 65536);
    size_t used = text ? fread(text, 1, 65535, f) : 0;
    fclose(f);
    if (text) text[used] = '\0';
    return text;
}

static int count_text(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
    return n;
}

/* What a run's output says of its results: each progress line up to " images/s", each accuracy line. */
static void results_of(const char *out, char *results, size_t size) {
    size_t used = 0;
    results[0] = '\0';
    for (const char *line = out; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
        const char *end = strchr(line, '\n'), *speed = strstr(line, " images/s");
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (speed && (!end || speed < end)) n = (size_t)(speed - line);
        else if (!strstr(line, "test accuracy") || (end && strstr(line, "test accuracy") > end)) continue;
        used += (size_t)snprintf(results + used, size - used, "%.*s\n", (int)n, line);
        if (used >= size) fail_msg("results_of: more than %zu bytes", size);
    }
}

static void test_metrics_record_each_progress_line_and_evaluation_and_change_no_result(void **state) {
    (void)state;
    char args[512], out[8192], plain[4096], with[4096], metrics[128], command[1024];
    snprintf(metrics, sizeof metrics, "%s/mlp.jsonl", dir);
    const char *recipe = "--epochs 2 --train-limit 32 --batch-size 8 --log-every 2";
    assert_int_equal(run(mlp_binary, recipe, out, sizeof out), 0);
    results_of(out, plain, sizeof plain);
    snprintf(args, sizeof args, "%s --metrics %s", recipe, metrics);
    assert_int_equal(run(mlp_binary, args, out, sizeof out), 0);
    results_of(out, with, sizeof with);
    assert_string_equal(plain, with);
    assert_int_equal(count_text(with, "\n"), 6); /* 2 progress lines and an accuracy line an epoch */
    char *text = read_text(metrics);
    assert_non_null(text);
    print_message("%s", text);
    /* A start line, 2 train lines and an eval line per epoch; each line one object. */
    assert_int_equal(count_text(text, "\n"), 7);
    assert_int_equal(count_text(text, "}\n"), 7);
    expect_text(text, "{\"event\": \"start\", \"program\": \"mnist_mlp\", \"resumed\": false, \"step\": 0");
    assert_int_equal(count_text(text, "{\"event\": \"start\""), 1);
    assert_int_equal(count_text(text, "{\"event\": \"train\", \"epoch\": "), 4);
    assert_int_equal(count_text(text, "{\"event\": \"eval\", \"epoch\": "), 2);
    expect_text(text, "{\"event\": \"train\", \"epoch\": 2, \"epoch_step\": 4, \"epoch_steps\": 4, \"step\": 8, "
                      "\"loss\": ");
    expect_text(text, "\"lr\": 0.01, \"images_per_s\": ");
    expect_text(text, "{\"event\": \"eval\", \"epoch\": 2, \"step\": 8, \"test_accuracy\": ");
    expect_text(text, "\"pools\": {\"weights\": {\"in_use_bytes\": ");
    expect_text(text, "\"activations\": {\"in_use_bytes\": ");
    expect_no_text(text, "data_wait_ms"); /* the data is resident: no loader to wait for */
    free(text);
    snprintf(command, sizeof command, "python3 %s %s -o %s/mlp.svg", plot_tool, metrics, dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    print_message("$ %s\n%s", command, out);
    expect_text(out, "plot_metrics: 4 training lines, 2 evaluations, 0 resumes");
}

static void test_metrics_are_appended_to_when_resuming_and_started_anew_otherwise(void **state) {
    (void)state;
    char args[512], out[8192], metrics[128], saved[128], command[1024];
    snprintf(metrics, sizeof metrics, "%s/cnn.jsonl", dir);
    snprintf(saved, sizeof saved, "%s/watch.ckpt", dir);
    snprintf(args, sizeof args, "--epochs 1 --train-limit 16 --batch-size 8 --log-every 1 --save %s --metrics %s",
             saved, metrics);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    /* Resumed from step 2 with the data on the host: its loader's wait is recorded too. */
    snprintf(args, sizeof args, "--epochs 2 --train-limit 16 --batch-size 8 --log-every 1 --resume %s --metrics %s "
             "--data-on host", saved, metrics);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    char *text = read_text(metrics);
    assert_non_null(text);
    print_message("%s", text);
    const char *start = "{\"event\": \"start\", \"program\": \"mnist_cnn\", \"resumed\": ";
    const char *first = strstr(text, start), *second = first ? strstr(first + 1, start) : NULL;
    assert_non_null(second);
    assert_int_equal(strncmp(first + strlen(start), "false, \"step\": 0,", 17), 0);
    assert_int_equal(strncmp(second + strlen(start), "true, \"step\": 2,", 16), 0);
    assert_true(first == text);
    assert_non_null(strstr(first, "{\"event\": \"eval\", \"epoch\": 1, \"step\": 2, "));
    assert_true(strstr(first, "{\"event\": \"eval\", \"epoch\": 1, \"step\": 2, ") < second);
    expect_text(second, "{\"event\": \"train\", \"epoch\": 2, \"epoch_step\": 2, \"epoch_steps\": 2, \"step\": 4, ");
    expect_text(second, "\"data_wait_ms\": ");
    expect_text(second, "{\"event\": \"eval\", \"epoch\": 2, \"step\": 4, ");
    free(text);
    snprintf(command, sizeof command, "python3 %s %s -o %s/cnn.svg", plot_tool, metrics, dir);
    assert_int_equal(run_program(command, out, sizeof out), 0);
    print_message("$ %s\n%s", command, out);
    expect_text(out, "plot_metrics: 4 training lines, 2 evaluations, 1 resume");
    /* A run that does not resume starts the record anew. */
    snprintf(args, sizeof args, ONE_STEP " --metrics %s", metrics);
    assert_int_equal(run(cnn_binary, args, out, sizeof out), 0);
    text = read_text(metrics);
    assert_non_null(text);
    assert_int_equal(count_text(text, "\"event\": \"start\""), 1);
    assert_int_equal(count_text(text, "\n"), 3);
    free(text);
}

static void test_metrics_refuse_a_path_that_is_not_a_regular_file(void **state) {
    (void)state;
    char fifo[128], args[512], out[8192], expected[256];
    snprintf(fifo, sizeof fifo, "%s/metrics.fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const struct {
        const char *path, *kind;
    } cases[] = {{fifo, "a FIFO"}, {dir, "a directory"}, {"/dev/null", "a character device"}};
    const char *trainers[] = {mlp_binary, cnn_binary};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        for (int t = 0; t < 2; ++t) {
            /* timeout: a FIFO opened for writing would wait for a reader; that hang fails the test (124). */
            char command[1024];
            snprintf(args, sizeof args, ONE_STEP " --metrics %s", cases[i].path);
            snprintf(command, sizeof command, "timeout 20 %s --device cpu --data-dir %s %s", trainers[t], dir, args);
            int status = run_program(command, out, sizeof out);
            print_message("$ %s\n%s", command, out);
            assert_int_equal(status, 1);
            snprintf(expected, sizeof expected, "--metrics %s: %s, not a regular file", cases[i].path, cases[i].kind);
            expect_text(out, expected);
            expect_no_text(out, "step 1/1");
        }
    }
    unlink(fifo);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MNIST_CNN MNIST_MLP IMAGE_FOLDER MNIST_TO_PNG (the binaries) PLOT_METRICS\n",
                argv[0]);
        return 2;
    }
    cnn_binary = argv[1];
    mlp_binary = argv[2];
    folder_binary = argv[3];
    to_png_binary = argv[4];
    plot_tool = argv[5];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_brings_its_own_default_learning_rate),
        cmocka_unit_test(test_test_limit_evaluates_the_first_n_test_images),
        cmocka_unit_test(test_image_folder_test_limit_evaluates_the_first_n_test_images),
        cmocka_unit_test(test_the_banner_says_what_runs_on_the_cpu),
        cmocka_unit_test(test_the_plan_comes_before_step_one_and_dry_run_trains_nothing),
        cmocka_unit_test(test_resume_with_nothing_left_to_train_says_so),
        cmocka_unit_test(test_resume_refuses_an_epoch_that_no_epochs_flag_reaches),
        cmocka_unit_test(test_progress_lines_carry_the_epochs_and_the_runs_time_as_plain_lines_in_a_pipe),
        cmocka_unit_test(test_on_a_terminal_the_epochs_progress_line_is_rewritten_in_place),
        cmocka_unit_test(test_metrics_record_each_progress_line_and_evaluation_and_change_no_result),
        cmocka_unit_test(test_metrics_are_appended_to_when_resuming_and_started_anew_otherwise),
        cmocka_unit_test(test_metrics_refuse_a_path_that_is_not_a_regular_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
