/*
 * tests/test_checkpoint_interrupted_save.c — a save interrupted by SIGINT or SIGTERM leaves no
 * temporary file behind, and the checkpoint at its path is whole: the previous one or the new one.
 *
 * A child process saves a model of one large parameter over the same path again and again, the
 * contents new each time (every element of save k is k, and its step is k); the parent sends it
 * the signal at a random moment and waits for it to end. The child must end by that signal, as
 * it would without the save, and afterwards the folder holds no "<path>.tmp.<pid>", and the file
 * at the path loads (so its CRC holds) with every element equal to its step. A child that
 * catches SIGINT finishes the save it is in, then stops. A child with loader threads running
 * beside the save ends the same way: the signal must not reach a thread that lets it end the
 * process mid-save. The random delays come from a seed the test prints, so that a failure can be
 * replayed (UMT_TEST_SEED).
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "umtrain.h"

/* 8 MiB a save: the temporary file exists for most of the child's time, so that most signals
 * land while it does. */
#define ELEMENTS ((int64_t)2 << 20)
#define TRIALS 8
/* Delays up to this many microseconds after the child's first save. */
#define MAX_DELAY_US 60000

/* The child's exit status when it stopped by itself after a caught SIGINT. */
#define STOPPED_AFTER_SAVE 3

static char dir[64], path[128], images[128], labels[128];

/* Four 2x2 images and their labels: samples for a loader whose threads run beside the saves. */
static int write_samples(void) {
    static const uint8_t image_file[] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8,
                                         9, 10, 11, 12, 13, 14, 15, 16};
    static const uint8_t label_file[] = {0, 0, 8, 1, 0, 0, 0, 4, 0, 1, 0, 1};
    FILE *f = fopen(images, "wb"), *g = fopen(labels, "wb");
    int ok = f && g && fwrite(image_file, 1, sizeof image_file, f) == sizeof image_file &&
             fwrite(label_file, 1, sizeof label_file, g) == sizeof label_file;
    if (f) ok = fclose(f) == 0 && ok;
    if (g) ok = fclose(g) == 0 && ok;
    return ok ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_test_interrupted_save_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/model.ckpt", dir);
    snprintf(images, sizeof images, "%s/images", dir);
    snprintf(labels, sizeof labels, "%s/labels", dir);
    const char *seed_text = getenv("UMT_TEST_SEED");
    unsigned seed = seed_text ? (unsigned)strtoul(seed_text, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    print_message("delays from seed %u (UMT_TEST_SEED=%u replays them)\n", seed, seed);
    srand(seed);
    return 0;
}

/* Removes every entry of dir (and dir itself when remove_dir). */
static int clear_dir(bool remove_dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        char entry[sizeof dir + 256];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(entry, sizeof entry, "%s/%s", dir, e->d_name);
        unlink(entry);
    }
    closedir(d);
    return remove_dir ? rmdir(dir) : 0;
}

static int teardown(void **state) {
    (void)state;
    return clear_dir(true);
}

/* ----------------------------------------------------------------------------------------- */
/* The child */

static volatile sig_atomic_t interrupted;

static void on_interrupt(int signal) {
    (void)signal;
    interrupted = 1;
}

static umt_tensor *big_model(umt_context **ctx) {
    umt_context_options options = umt_context_defaults();
    options.device = UMT_DEVICE_CPU;
    if (umt_context_create(&options, ctx) != UMT_OK) return NULL;
    return umt_parameter_new(*ctx, "big", 1, (int64_t[]){ELEMENTS});
}

/* A loader of two threads over the samples written by the parent; NULL on failure. */
static umt_loader *start_loader(umt_context *ctx) {
    umt_samples *samples;
    umt_loader *loader;
    umt_loader_options o = umt_loader_defaults();
    o.batch_size = 2;
    o.workers = 2;
    int64_t batches;
    if (umt_samples_load_idx(images, labels, 2, &samples) != UMT_OK ||
        umt_loader_create(ctx, samples, &o, &loader) != UMT_OK || umt_loader_start_epoch(loader, 0, &batches) != UMT_OK)
        return NULL;
    return loader;
}

/* Saves over path for ever, save k holding k in every element (with loader threads running when
 * with_loader); writes a byte to ready after the first save. Ends the process: by a signal, or
 * STOPPED_AFTER_SAVE once a caught SIGINT has come. */
static void save_for_ever(int ready, bool with_loader) {
    umt_context *ctx;
    umt_tensor *big = big_model(&ctx);
    if (big && with_loader && !start_loader(ctx)) big = NULL;
    for (int64_t k = 1; big; ++k) {
        if (umt_tensor_fill(big, (float)k) != UMT_OK ||
            umt_checkpoint_save(ctx, NULL, &(umt_checkpoint_info){.step = k}, path) != UMT_OK)
            break;
        if (k == 1 && write(ready, "r", 1) != 1) break;
        if (interrupted) _exit(STOPPED_AFTER_SAVE);
    }
    fprintf(stderr, "child: %s\n", umt_last_error());
    _exit(2);
}

/* ----------------------------------------------------------------------------------------- */
/* The parent */

typedef enum { PLAIN, CATCHING_SIGINT, WITH_LOADER } child_kind;

/* Starts a child saving for ever, waits for its first save, sends it `signal` after a random
 * delay; returns its wait status. The folder starts empty but for the samples. */
static int interrupt_a_saving_child(int signal, child_kind kind) {
    assert_int_equal(clear_dir(false), 0);
    assert_int_equal(write_samples(), 0);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(ready[0]);
        interrupted = 0;
        /* Set either way: a shell may have started the test with SIGINT ignored. */
        struct sigaction on_sigint = {.sa_handler = kind == CATCHING_SIGINT ? on_interrupt : SIG_DFL};
        struct sigaction on_sigterm = {.sa_handler = SIG_DFL};
        if (sigaction(SIGINT, &on_sigint, NULL) != 0 || sigaction(SIGTERM, &on_sigterm, NULL) != 0) _exit(2);
        save_for_ever(ready[1], kind == WITH_LOADER);
    }
    close(ready[1]);
    char byte;
    assert_int_equal(read(ready[0], &byte, 1), 1);
    close(ready[0]);
    long delay_us = rand() % MAX_DELAY_US;
    struct timespec delay = {.tv_sec = 0, .tv_nsec = delay_us * 1000};
    nanosleep(&delay, NULL);
    assert_int_equal(kill(child, signal), 0);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    return status;
}

/* No temporary file in the folder; the checkpoint loads and every element equals its step. */
static void expect_no_temporary_and_a_whole_checkpoint(void) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) fail_msg("%s/%s was left behind", dir, e->d_name);
    closedir(d);
    umt_context *ctx;
    umt_tensor *big = big_model(&ctx);
    assert_non_null(big);
    umt_checkpoint_info info;
    if (umt_checkpoint_load(ctx, NULL, &info, path) != UMT_OK) fail_msg("%s", umt_last_error());
    float *values = malloc((size_t)ELEMENTS * sizeof *values);
    assert_non_null(values);
    assert_int_equal(umt_tensor_copy_to_host(big, values, (size_t)ELEMENTS * sizeof *values), UMT_OK);
    for (int64_t i = 0; i < ELEMENTS; ++i)
        if (values[i] != (float)info.step) fail_msg("element %lld is %g in the save of step %lld", (long long)i,
                                                    (double)values[i], (long long)info.step);
    free(values);
    umt_context_destroy(ctx);
}

static void expect_ended_by(int status, int signal) {
    if (!WIFSIGNALED(status) || WTERMSIG(status) != signal)
        fail_msg("the child did not end by signal %d: %s %d", signal, WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static void test_sigint_during_saves_leaves_no_temporary_file_and_a_whole_checkpoint(void **state) {
    (void)state;
    for (int trial = 0; trial < TRIALS; ++trial) {
        expect_ended_by(interrupt_a_saving_child(SIGINT, PLAIN), SIGINT);
        expect_no_temporary_and_a_whole_checkpoint();
    }
}

static void test_sigterm_during_saves_leaves_no_temporary_file_and_a_whole_checkpoint(void **state) {
    (void)state;
    for (int trial = 0; trial < TRIALS; ++trial) {
        expect_ended_by(interrupt_a_saving_child(SIGTERM, PLAIN), SIGTERM);
        expect_no_temporary_and_a_whole_checkpoint();
    }
}

static void test_sigint_during_saves_beside_loader_threads_leaves_no_temporary_file(void **state) {
    (void)state;
    for (int trial = 0; trial < TRIALS; ++trial) {
        expect_ended_by(interrupt_a_saving_child(SIGINT, WITH_LOADER), SIGINT);
        expect_no_temporary_and_a_whole_checkpoint();
    }
}

/* A program that catches SIGINT (to stop after its save, say) gets its save finished. */
static void test_a_caught_sigint_lets_the_save_finish(void **state) {
    (void)state;
    for (int trial = 0; trial < TRIALS / 2; ++trial) {
        int status = interrupt_a_saving_child(SIGINT, CATCHING_SIGINT);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != STOPPED_AFTER_SAVE)
            fail_msg("the child did not stop by itself after its save (wait status 0x%x)", (unsigned)status);
        expect_no_temporary_and_a_whole_checkpoint();
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigint_during_saves_leaves_no_temporary_file_and_a_whole_checkpoint),
        cmocka_unit_test(test_sigterm_during_saves_leaves_no_temporary_file_and_a_whole_checkpoint),
        cmocka_unit_test(test_sigint_during_saves_beside_loader_threads_leaves_no_temporary_file),
        cmocka_unit_test(test_a_caught_sigint_lets_the_save_finish),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
