/*
 * tests/test_mnist_cnn_resume.c — examples/mnist_cnn --resume given a checkpoint it must not
 * trust: a file that is not a regular file (a FIFO, a directory, a loop of symbolic links,
 * /dev/zero), a header whose epoch is -999999 or 2^62 (its checksum valid), weights of NaN.
 * Each is refused with exit status 1 and a message naming the file and what is wrong, within a
 * second and before any training; --allow-nonfinite loads the NaN weights anyway (forensics), and
 * training from them stops at the first step's NaN loss (--on-nonfinite off trains on).
 *
 * The data is a tiny MNIST written here (8 training and 8 test images); the checkpoints are the
 * trainer's model and optimizer saved here, then edited and resealed. Every run is under
 * `timeout`, so that a hang (or a run from epoch -999999) ends as exit status 124.
 *
 * argv[1] is the mnist_cnn binary (tests/BUILD passes its location).
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
#include <zlib.h>

#include <cmocka.h>

#include "examples/mnist_cnn_model.h"
#include "tests/run_program.h"
#include "tests/scratch.h"
#include "umtrain.h"

/* Offsets in a checkpoint file (docs/CHECKPOINT.md). */
enum { AT_EPOCH = 20, CRC_BYTES = 4 };

#define IMAGES 8

static const char *binary;
static char dir[64], data[128], fifo[128], loop_a[128], loop_b[128], checkpoint[128], edited[128];

/* ----------------------------------------------------------------------------------------- */
/* Files */

static int write_file(const char *path, const uint8_t *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(bytes, 1, size, f) == size;
    if (f) ok = fclose(f) == 0 && ok;
    return ok ? 0 : -1;
}

/* <data>/<split>-images-idx3-ubyte (IMAGES of 28x28, pixel values from the index) and labels. */
static int write_mnist(const char *split) {
    static uint8_t images[16 + IMAGES * 28 * 28], labels[8 + IMAGES];
    const uint8_t images_header[16] = {0, 0, 8, 3, 0, 0, 0, IMAGES, 0, 0, 0, 28, 0, 0, 0, 28};
    const uint8_t labels_header[8] = {0, 0, 8, 1, 0, 0, 0, IMAGES};
    memcpy(images, images_header, sizeof images_header);
    memcpy(labels, labels_header, sizeof labels_header);
    for (int i = 0; i < IMAGES * 28 * 28; ++i) images[16 + i] = (uint8_t)(i * 37 % 251);
    for (int i = 0; i < IMAGES; ++i) labels[8 + i] = (uint8_t)i;
    char path[256];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", data, split);
    if (write_file(path, images, sizeof images)) return -1;
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", data, split);
    return write_file(path, labels, sizeof labels);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_test_resume_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(data, sizeof data, "%s/mnist", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.ckpt", dir);
    snprintf(loop_a, sizeof loop_a, "%s/loop-a.ckpt", dir);
    snprintf(loop_b, sizeof loop_b, "%s/loop-b.ckpt", dir);
    snprintf(checkpoint, sizeof checkpoint, "%s/cnn.ckpt", dir);
    snprintf(edited, sizeof edited, "%s/edited.ckpt", dir);
    if (mkdir(data, 0700) || write_mnist("train") || write_mnist("t10k")) return -1;
    return mkfifo(fifo, 0600) == 0 && symlink(loop_b, loop_a) == 0 && symlink(loop_a, loop_b) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    const char *files[] = {fifo, loop_a, loop_b, checkpoint, edited};
    for (size_t i = 0; i < sizeof files / sizeof *files; ++i) unlink(files[i]);
    const char *splits[] = {"train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1"};
    for (size_t i = 0; i < sizeof splits / sizeof *splits; ++i) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s-ubyte", data, splits[i]);
        unlink(path);
    }
    rmdir(data);
    return rmdir(dir);
}

/* The trainer's model and optimizer (Adadelta), saved after epoch 1; conv1.weight all NaN when
 * nan_weights. */
static void save_checkpoint(bool nan_weights) {
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *ctx;
    mnist_cnn model;
    umt_optimizer *opt;
    assert_int_equal(umt_context_create(&o, &ctx), UMT_OK);
    assert_int_equal(mnist_cnn_build(ctx, &model), 0);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    assert_int_equal(umt_checkpoint_save(ctx, opt, &(umt_checkpoint_info){.epoch = 1, .step = 2}, checkpoint), UMT_OK);
    umt_context_destroy(ctx);
    /* Save writes no NaN: the file is edited after it. */
    if (nan_weights) scratch_poison_checkpoint(checkpoint, "conv1.weight");
}

/* The checkpoint with its epoch set to epoch and its CRC-32 rewritten, as `edited`. */
static void write_with_epoch(int64_t epoch) {
    save_checkpoint(false);
    FILE *f = fopen(checkpoint, "rb");
    assert_non_null(f);
    static uint8_t bytes[32 << 20];
    size_t size = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    assert_true(size > AT_EPOCH + 8 && size < sizeof bytes);
    for (int i = 0; i < 8; ++i) bytes[AT_EPOCH + i] = (uint8_t)((uint64_t)epoch >> (8 * i));
    uint32_t crc = (uint32_t)crc32(0L, bytes, (uInt)(size - CRC_BYTES));
    for (int i = 0; i < 4; ++i) bytes[size - CRC_BYTES + i] = (uint8_t)(crc >> (8 * i));
    assert_int_equal(write_file(edited, bytes, size), 0);
}

/* Runs mnist_cnn --resume path (and extra flags) on the tiny data under `timeout`; returns its
 * exit status (124: it hung), its output in out, how long it ran in *seconds. */
static int resume(const char *path, const char *extra, char *out, size_t size, double *seconds) {
    char command[2048];
    snprintf(command, sizeof command,
             "timeout 5 %s --device cpu --data-dir %s --batch-size 4 --test-batch-size 4 --epochs 2 --resume %s %s",
             binary, data, path, extra);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int status = run_program(command, out, size);
    clock_gettime(CLOCK_MONOTONIC, &end);
    *seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    return status;
}

/* resume(path) ends with exit status 1 within a second, its message naming path and saying
 * keyword, and no epoch trained. */
static void expect_refused(const char *path, const char *keyword) {
    char out[8192];
    double seconds;
    int status = resume(path, "", out, sizeof out, &seconds);
    if (status != 1 || !strstr(out, path) || !strstr(out, keyword) || strstr(out, "test accuracy") || seconds >= 1.0)
        fail_msg("--resume %s: exit status %d after %.2f s (124: hung), expected 1 within 1 s, naming the file "
                 "and saying '%s', before any training: %s",
                 path, status, seconds, keyword, out);
}

/* ----------------------------------------------------------------------------------------- */
/* The cases */

static void test_resume_from_a_file_that_is_not_regular_is_refused_within_a_second_naming_it(void **state) {
    (void)state;
    expect_refused(fifo, "FIFO");
    expect_refused(dir, "directory");
    expect_refused(loop_a, "symbolic links");
    expect_refused("/dev/zero", "character device");
}

static void test_resume_with_an_epoch_out_of_range_is_refused_naming_it(void **state) {
    (void)state;
    write_with_epoch(-999999);
    expect_refused(edited, "epoch -999999");
    write_with_epoch((int64_t)1 << 62);
    expect_refused(edited, "epoch 4611686018427387904");
}

static void test_resume_from_nan_weights_is_refused_naming_the_tensor(void **state) {
    (void)state;
    save_checkpoint(true);
    expect_refused(checkpoint, "conv1.weight");
}

/* Loaded for a look; trained on, the NaN weights make a NaN loss at the first step, which stops
 * the run (--on-nonfinite stop, the default) naming it, unless the check is off. */
static void test_allow_nonfinite_resumes_from_nan_weights(void **state) {
    (void)state;
    save_checkpoint(true);
    char out[8192], expected[256];
    double seconds;
    snprintf(expected, sizeof expected, "resumed from %s after epoch 1", checkpoint);
    int status = resume(checkpoint, "--allow-nonfinite", out, sizeof out, &seconds);
    if (status != 1 || !strstr(out, expected) || !strstr(out, "epoch 2 step 1/2") || !strstr(out, "the loss is nan"))
        fail_msg("exit status %d, expected 1, '%s' and the NaN loss of epoch 2 step 1: %s", status, expected, out);
    status = resume(checkpoint, "--allow-nonfinite --on-nonfinite off", out, sizeof out, &seconds);
    if (status != 0 || !strstr(out, expected))
        fail_msg("exit status %d, expected 0 and '%s': %s", status, expected, out);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_mnist_cnn_resume PATH_TO_MNIST_CNN\n");
        return 2;
    }
    binary = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_from_a_file_that_is_not_regular_is_refused_within_a_second_naming_it),
        cmocka_unit_test(test_resume_with_an_epoch_out_of_range_is_refused_naming_it),
        cmocka_unit_test(test_resume_from_nan_weights_is_refused_naming_the_tensor),
        cmocka_unit_test(test_allow_nonfinite_resumes_from_nan_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
