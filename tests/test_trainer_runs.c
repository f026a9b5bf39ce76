/*
 * tests/test_trainer_runs.c — the trainers (examples/mnist_cnn, mnist_mlp, image_folder) run on
 * the CPU on a tiny synthetic MNIST, read as a user reads them: --optimizer brings that
 * optimizer's own learning rate, --test-limit evaluates on the first N test images, the banner
 * says what runs (the device, the images used, where the data is), the memory plan is printed
 * before the first step and --dry-run prints it alone, and --resume says when nothing is left to
 * train and refuses an epoch that no --epochs reaches.
 *
 * argv[1..4] are mnist_cnn, mnist_mlp, image_folder and mnist_to_png (tests/BUILD passes their
 * locations); mnist_to_png makes image_folder's tree from the same files.
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

#include "examples/mnist_cnn_model.h"
#include "tests/run_program.h"
#include "tests/synthetic_mnist.h"
#include "umtrain.h"

enum { TRAIN_N = 64, TEST_N = 20 };
/* One epoch of one step: a run that trains as little as it can. */
#define ONE_STEP "--epochs 1 --train-limit 16 --batch-size 16"

static const char *cnn_binary, *mlp_binary, *folder_binary, *to_png_binary;
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
    expect_text(out, ", cpu, fp32");
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

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MNIST_CNN MNIST_MLP IMAGE_FOLDER MNIST_TO_PNG (the binaries)\n", argv[0]);
        return 2;
    }
    cnn_binary = argv[1];
    mlp_binary = argv[2];
    folder_binary = argv[3];
    to_png_binary = argv[4];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_brings_its_own_default_learning_rate),
        cmocka_unit_test(test_test_limit_evaluates_the_first_n_test_images),
        cmocka_unit_test(test_image_folder_test_limit_evaluates_the_first_n_test_images),
        cmocka_unit_test(test_the_banner_says_what_runs_on_the_cpu),
        cmocka_unit_test(test_the_plan_comes_before_step_one_and_dry_run_trains_nothing),
        cmocka_unit_test(test_resume_with_nothing_left_to_train_says_so),
        cmocka_unit_test(test_resume_refuses_an_epoch_that_no_epochs_flag_reaches),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
