/*
 * tests/test_predict.c — examples/predict end to end: a checkpoint of the MNIST CNN and image
 * files written by the test, the real binary run on them, its answers compared with the same
 * model evaluated in this process; unreadable files and a wrong checkpoint give clear errors.
 * Checkpoints and images that are not regular files (a FIFO, a directory, a loop of symbolic
 * links, /dev/zero) are refused within a second, and one of NaN weights is refused unless
 * --allow-nonfinite asks for it, and then no digit is claimed for a NaN output.
 *
 * argv[1] is the predict binary (tests/BUILD passes its location).
 */
#include <math.h>
#include <setjmp.h>
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
#include <stb/stb_image_write.h>

#include "examples/example_common.h"
#include "examples/mnist_cnn_model.h"
#include "tests/run_program.h"
#include "tests/scratch.h"
#include "umtrain.h"

static const char *predict_binary;
static char dir[64], checkpoint[128], images[3][128], missing[128], garbage[128], other_checkpoint[128];
static char fifo[128], loop_a[128], loop_b[128], nan_checkpoint[128];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_predict_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(checkpoint, sizeof checkpoint, "%s/cnn.ckpt", dir);
    snprintf(other_checkpoint, sizeof other_checkpoint, "%s/other.ckpt", dir);
    snprintf(images[0], 128, "%s/stroke.png", dir);
    snprintf(images[1], 128, "%s/ring.bmp", dir);
    snprintf(images[2], 128, "%s/big_dark_on_light.jpg", dir);
    snprintf(missing, sizeof missing, "%s/missing.png", dir);
    snprintf(garbage, sizeof garbage, "%s/garbage.png", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.ckpt", dir);
    snprintf(loop_a, sizeof loop_a, "%s/loop-a.ckpt", dir);
    snprintf(loop_b, sizeof loop_b, "%s/loop-b.ckpt", dir);
    snprintf(nan_checkpoint, sizeof nan_checkpoint, "%s/nan.ckpt", dir);
    if (mkfifo(fifo, 0600) != 0 || symlink(loop_b, loop_a) != 0 || symlink(loop_a, loop_b) != 0) return -1;
    static unsigned char stroke[28 * 28], ring[28 * 28], big[64 * 64];
    for (int y = 0; y < 28; ++y)
        for (int x = 0; x < 28; ++x) {
            stroke[y * 28 + x] = (x >= 12 && x < 16 && y >= 4 && y < 24) ? 255 : 0;
            int d2 = (x - 14) * (x - 14) + (y - 14) * (y - 14);
            ring[y * 28 + x] = (d2 > 36 && d2 < 81) ? 255 : 0;
        }
    for (int i = 0; i < 64 * 64; ++i) big[i] = (i % 64 > 20 && i % 64 < 40) ? 0 : 250;
    FILE *f = fopen(garbage, "wb");
    int ok = f && stbi_write_png(images[0], 28, 28, 1, stroke, 28) && stbi_write_bmp(images[1], 28, 28, 1, ring) &&
             stbi_write_jpg(images[2], 64, 64, 1, big, 90);
    if (f) fputs("not an image", f), fclose(f);
    return ok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    const char *files[] = {checkpoint, other_checkpoint, images[0], images[1], images[2], garbage,
                           fifo,       loop_a,           loop_b,    nan_checkpoint};
    for (size_t i = 0; i < sizeof files / sizeof *files; ++i) unlink(files[i]);
    return rmdir(dir);
}

/* Runs predict with args; returns its exit status, its stdout+stderr in out. */
static int run_predict(const char *args, char *out, size_t size) {
    char command[2048];
    snprintf(command, sizeof command, "%s --device cpu %s", predict_binary, args);
    return run_program(command, out, size);
}

/* run_predict under `timeout`, so that a hang ends as exit status 124; *seconds: how long it ran. */
static int run_predict_timed(const char *args, char *out, size_t size, double *seconds) {
    char command[2048];
    snprintf(command, sizeof command, "timeout 5 %s --device cpu %s", predict_binary, args);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int status = run_program(command, out, size);
    clock_gettime(CLOCK_MONOTONIC, &end);
    *seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    return status;
}

static void test_predict_prints_what_the_model_computes_for_each_file(void **state) {
    (void)state;
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    o.seed = 5;
    umt_context *ctx;
    mnist_cnn model;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    assert_int_equal(mnist_cnn_build(ctx, &model), 0);
    assert_int_equal(umt_checkpoint_save(ctx, NULL, NULL, checkpoint), UMT_OK);
    /* The expected answers: the same files through the same model in this process. */
    umt_tensor *batch;
    const char *paths[3] = {images[0], images[1], images[2]};
    assert_int_equal(umt_images_load(ctx, paths, 3, 1, 28, 28, UMT_INVERT_AUTO, MNIST_MEAN, MNIST_STD, &batch), UMT_OK);
    umt_set_grad_enabled(ctx, false);
    umt_set_training(ctx, false);
    float log_probs[30];
    assert_int_equal(umt_tensor_copy_to_host(mnist_cnn_forward(ctx, &model, batch), log_probs, sizeof log_probs), UMT_OK);
    umt_context_destroy(ctx);

    char args[1024], out[4096];
    snprintf(args, sizeof args, "--checkpoint %s %s %s %s", checkpoint, images[0], images[1], images[2]);
    assert_int_equal(run_predict(args, out, sizeof out), 0);
    print_message("%s", out);
    for (int i = 0; i < 3; ++i) {
        int best = 0;
        for (int c = 1; c < 10; ++c)
            if (log_probs[i * 10 + c] > log_probs[i * 10 + best]) best = c;
        char expected[512];
        snprintf(expected, sizeof expected, "%s: %d (p = ", images[i], best);
        assert_non_null(strstr(out, expected));
    }
}

static void test_unreadable_files_and_wrong_checkpoints_fail_naming_them(void **state) {
    (void)state;
    char args[1024], out[4096];
    snprintf(args, sizeof args, "--checkpoint %s %s %s", checkpoint, images[0], missing);
    assert_int_equal(run_predict(args, out, sizeof out), 1);
    assert_non_null(strstr(out, missing));
    snprintf(args, sizeof args, "--checkpoint %s %s", checkpoint, garbage);
    assert_int_equal(run_predict(args, out, sizeof out), 1);
    assert_non_null(strstr(out, garbage));
    /* A checkpoint of another model: its tensors do not match the CNN's. */
    umt_context *ctx;
    assert_int_equal(umt_context_create(NULL, &ctx), UMT_OK);
    assert_non_null(umt_linear_layer_new(ctx, "fc1", 4, 3, true));
    assert_int_equal(umt_checkpoint_save(ctx, NULL, NULL, other_checkpoint), UMT_OK);
    umt_context_destroy(ctx);
    snprintf(args, sizeof args, "--checkpoint %s %s", other_checkpoint, images[0]);
    assert_int_equal(run_predict(args, out, sizeof out), 1);
    assert_non_null(strstr(out, other_checkpoint));
    assert_int_equal(run_predict("", out, sizeof out), 2);
    assert_non_null(strstr(out, "usage"));
}

static void test_checkpoint_that_is_not_a_regular_file_is_refused_within_a_second_naming_it(void **state) {
    (void)state;
    const char *paths[] = {fifo, dir, loop_a, "/dev/zero"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; ++i) {
        char args[1024], out[4096];
        double seconds;
        snprintf(args, sizeof args, "--checkpoint %s %s", paths[i], images[0]);
        int status = run_predict_timed(args, out, sizeof out, &seconds);
        if (status != 1 || !strstr(out, paths[i]) || seconds >= 1.0)
            fail_msg("--checkpoint %s: exit status %d after %.2f s (124: hung), expected 1 within 1 s naming it: %s",
                     paths[i], status, seconds, out);
    }
}

/* The same paths given as images (after a good checkpoint): the FIFO's open waited for a writer. */
static void test_image_that_is_not_a_regular_file_is_refused_within_a_second_naming_it(void **state) {
    (void)state;
    const char *paths[] = {fifo, dir, loop_a, "/dev/zero"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; ++i) {
        char args[1024], out[4096];
        double seconds;
        snprintf(args, sizeof args, "--checkpoint %s %s", checkpoint, paths[i]);
        int status = run_predict_timed(args, out, sizeof out, &seconds);
        if (status != 1 || !strstr(out, paths[i]) || !strstr(out, "(expected an image)") || seconds >= 1.0)
            fail_msg("image %s: exit status %d after %.2f s (124: hung), expected 1 within 1 s naming it: %s",
                     paths[i], status, seconds, out);
    }
}

/* A checkpoint of the CNN whose conv1.weight is all NaN. */
static void save_nan_checkpoint(void) {
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *ctx;
    mnist_cnn model;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    assert_int_equal(mnist_cnn_build(ctx, &model), 0);
    assert_string_equal(umt_tensor_name(umt_parameter_at(ctx, 0)), "conv1.weight");
    assert_int_equal(umt_checkpoint_save(ctx, NULL, NULL, nan_checkpoint), UMT_OK);
    umt_context_destroy(ctx);
    /* Save writes no NaN: the file is edited after it. */
    scratch_poison_checkpoint(nan_checkpoint, "conv1.weight");
}

static void test_checkpoint_of_nan_weights_is_refused_naming_the_tensor(void **state) {
    (void)state;
    save_nan_checkpoint();
    char args[1024], out[4096];
    snprintf(args, sizeof args, "--checkpoint %s %s", nan_checkpoint, images[0]);
    int status = run_predict(args, out, sizeof out);
    if (status != 1 || !strstr(out, nan_checkpoint) || !strstr(out, "conv1.weight") || !strstr(out, "nan"))
        fail_msg("exit status %d, expected 1 and a message naming the file and conv1.weight: %s", status, out);
}

static void test_allow_nonfinite_loads_nan_weights_and_claims_no_digit(void **state) {
    (void)state;
    save_nan_checkpoint();
    char args[1024], out[4096];
    snprintf(args, sizeof args, "--allow-nonfinite --checkpoint %s %s %s", nan_checkpoint, images[0], images[1]);
    int status = run_predict(args, out, sizeof out);
    print_message("%s", out);
    for (int i = 0; i < 2; ++i) {
        char expected[512];
        snprintf(expected, sizeof expected, "%s: not a number", images[i]);
        if (!strstr(out, expected)) fail_msg("expected '%s' in: %s", expected, out);
    }
    assert_null(strstr(out, "p = nan"));
    assert_int_equal(status, 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_predict PATH_TO_PREDICT\n");
        return 2;
    }
    predict_binary = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predict_prints_what_the_model_computes_for_each_file),
        cmocka_unit_test(test_unreadable_files_and_wrong_checkpoints_fail_naming_them),
        cmocka_unit_test(test_checkpoint_that_is_not_a_regular_file_is_refused_within_a_second_naming_it),
        cmocka_unit_test(test_image_that_is_not_a_regular_file_is_refused_within_a_second_naming_it),
        cmocka_unit_test(test_checkpoint_of_nan_weights_is_refused_naming_the_tensor),
        cmocka_unit_test(test_allow_nonfinite_loads_nan_weights_and_claims_no_digit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
