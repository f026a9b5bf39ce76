/*
 * tests/test_engine_cache.c — the file of timed cuDNN engine choices (kernels/engine_cache.h) on
 * the CPU: a key's last whole line wins; an engine (its index and knobs) comes back as written;
 * lines that do not parse, a key that is only a prefix, a line cut short and hostile files (a
 * folder, a FIFO, a NUL byte) give no entry; processes
 * appending at once leave every line whole; the path follows UMT_CONV_CACHE, XDG_CACHE_HOME and
 * HOME, and "0" turns the cache off. (The GPU test, test_cuda_lowp, checks that a second run
 * takes the remembered engines.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/engine_cache.h"
#include "tests/scratch.h"
#include "umtrain.h"

static int setup(void **state) {
    (void)state;
    return scratch_make("engine_cache");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

/* The index of the engine of key in text, or -1 when there is none. */
static int64_t index_in(const char *text, const char *key) {
    umt_engine_identity e;
    return umt_engine_cache_find_in(text, key, &e) ? e.global_index : -1;
}

static void test_the_last_whole_line_of_a_key_wins_and_nothing_else_matches(void **state) {
    (void)state;
    const char *text = "v2/a/forward 3\n"
                       "v2/a/forwardx 9\n"    /* another key that starts the same */
                       "v2/a/forward 5;2=1\n"
                       "v2/a/forward x\n"     /* not a number: ignored */
                       "v2/a/forward -1\n"    /* a negative index: ignored */
                       "v2/a/forward 7 8\n"   /* trailing words: ignored */
                       "v2/a/forward \n"      /* no number: ignored */
                       "v2/a/forward 7;2\n"   /* a knob without a value: ignored */
                       "v2/a/forward 7;2=1;2=3\n" /* a knob twice: ignored */
                       "v2/a/forward 7;-2=1\n" /* a negative knob kind: ignored */
                       "v2/a/forward 7;2=+1\n" /* a sign that is not '-': ignored */
                       "v2/a/forward 7;;\n"   /* empty knobs: ignored */
                       "v2/a/forward 99999999999999999999\n" /* out of range: ignored */
                       "v2/b/data 2;10=-4;3=0\n"
                       "v2/a/forward 6";      /* no newline: a line still being written */
    assert_int_equal(index_in(text, "v2/a/forward"), 5);
    assert_int_equal(index_in(text, "v2/a/forwardx"), 9);
    assert_int_equal(index_in(text, "v2/b/data"), 2);
    assert_int_equal(index_in(text, "v2/a"), -1);
    assert_int_equal(index_in(text, "v2/c"), -1);
    assert_int_equal(index_in("", "v2/a/forward"), -1);
    umt_engine_identity e, want = {.global_index = 2, .knob_count = 2, .knob_type = {3, 10}, .knob_value = {0, -4}};
    assert_true(umt_engine_cache_find_in(text, "v2/b/data", &e));
    assert_true(umt_engine_identity_equal(&e, &want)); /* knobs in another order: the same engine */
    want.knob_value[1] = 4;
    assert_false(umt_engine_identity_equal(&e, &want));
    want.knob_value[1] = -4, want.knob_type[1] = 11;
    assert_false(umt_engine_identity_equal(&e, &want));
    want.knob_type[1] = 10, want.knob_count = 1;
    assert_false(umt_engine_identity_equal(&e, &want));
}

static void test_added_lines_are_found_and_bad_keys_are_refused(void **state) {
    (void)state;
    const char *path = scratch_path("cache");
    unlink(path);
    umt_engine_identity e, four = {.global_index = 4, .knob_count = 3, .knob_type = {1, 7, 40},
                                   .knob_value = {-1, 0, 123456789012LL}};
    umt_engine_identity zero = {0}, eleven = {.global_index = 11};
    assert_false(umt_engine_cache_find(path, "k1", &e)); /* no file yet */
    assert_int_equal(umt_engine_cache_add(path, "k1", &four), UMT_OK);
    assert_int_equal(umt_engine_cache_add(path, "k2", &zero), UMT_OK);
    assert_true(umt_engine_cache_find(path, "k1", &e));
    assert_true(umt_engine_identity_equal(&e, &four));
    assert_int_equal(umt_engine_cache_add(path, "k1", &eleven), UMT_OK);
    assert_true(umt_engine_cache_find(path, "k1", &e));
    assert_true(umt_engine_identity_equal(&e, &eleven));
    assert_true(umt_engine_cache_find(path, "k2", &e));
    assert_true(umt_engine_identity_equal(&e, &zero));
    assert_int_equal(umt_engine_cache_add(path, "a key", &four), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "without spaces or newlines"));
    assert_int_equal(umt_engine_cache_add(path, "k\n3", &four), UMT_ERR_INVALID_ARGUMENT);
    umt_engine_identity bad = {.global_index = -2};
    assert_int_equal(umt_engine_cache_add(path, "k3", &bad), UMT_ERR_INVALID_ARGUMENT);
    bad = (umt_engine_identity){.global_index = 1, .knob_count = 1, .knob_type = {-3}};
    assert_int_equal(umt_engine_cache_add(path, "k3", &bad), UMT_ERR_INVALID_ARGUMENT);
    bad.knob_count = UMT_ENGINE_MOST_KNOBS + 1;
    assert_int_equal(umt_engine_cache_add(path, "k3", &bad), UMT_ERR_INVALID_ARGUMENT);
    char long_key[UMT_ENGINE_KEY_BYTES + 1];
    memset(long_key, 'x', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    assert_int_equal(umt_engine_cache_add(path, long_key, &four), UMT_ERR_INVALID_ARGUMENT);
    size_t size = 0;
    free(scratch_read(path, &size));
    assert_int_equal(size, strlen("k1 4;1=-1;7=0;40=123456789012\nk2 0\nk1 11\n")); /* the refusals wrote nothing */
    /* Every knob an engine may have, each of the widest values, fits a line. */
    umt_engine_identity most = {.global_index = INT64_MAX, .knob_count = UMT_ENGINE_MOST_KNOBS};
    for (int k = 0; k < UMT_ENGINE_MOST_KNOBS; k++) most.knob_type[k] = INT64_MAX - k, most.knob_value[k] = INT64_MIN;
    assert_int_equal(umt_engine_cache_add(path, "k4", &most), UMT_OK);
    assert_true(umt_engine_cache_find(path, "k4", &e));
    assert_true(umt_engine_identity_equal(&e, &most));
    assert_int_equal(umt_engine_cache_add(scratch_folder(), "k1", &four), UMT_ERR_IO); /* a folder */
    assert_non_null(strstr(umt_last_error(), scratch_folder()));
}

static void test_hostile_files_give_no_entry(void **state) {
    (void)state;
    umt_engine_identity e;
    assert_false(umt_engine_cache_find(scratch_folder(), "k1", &e));
    const uint8_t with_nul[] = "k1 4\n\0k1 5\n";
    assert_false(umt_engine_cache_find(scratch_write("nul", with_nul, sizeof with_nul - 1), "k1", &e));
    const char *fifo = scratch_path("fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_false(umt_engine_cache_find(fifo, "k1", &e)); /* refused, not waited on */
    unlink(fifo);
}

/* Forked children each append their own keys at once: every line is whole afterwards. */
static void test_processes_appending_at_once_leave_every_line_whole(void **state) {
    (void)state;
    enum { CHILDREN = 4, LINES = 200 };
    const char *path = scratch_path("shared");
    unlink(path);
    pid_t children[CHILDREN];
    for (int c = 0; c < CHILDREN; c++) {
        children[c] = fork();
        assert_true(children[c] >= 0);
        if (children[c] == 0) {
            char key[64];
            for (int i = 0; i < LINES; i++) {
                snprintf(key, sizeof key, "v2/child%d/line%d", c, i);
                umt_engine_identity e = {.global_index = c * 1000 + i, .knob_count = 1, .knob_type = {c},
                                         .knob_value = {i}};
                if (umt_engine_cache_add(path, key, &e) != UMT_OK) _exit(1);
            }
            _exit(0);
        }
    }
    for (int c = 0; c < CHILDREN; c++) {
        int status = 0;
        assert_int_equal(waitpid(children[c], &status, 0), children[c]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    char key[64];
    for (int c = 0; c < CHILDREN; c++) {
        for (int i = 0; i < LINES; i++) {
            snprintf(key, sizeof key, "v2/child%d/line%d", c, i);
            umt_engine_identity e, want = {.global_index = c * 1000 + i, .knob_count = 1, .knob_type = {c},
                                           .knob_value = {i}};
            assert_true(umt_engine_cache_find(path, key, &e));
            assert_true(umt_engine_identity_equal(&e, &want));
        }
    }
}

static void test_the_path_follows_the_environment(void **state) {
    (void)state;
    char path[512];
    setenv("UMT_CONV_CACHE", "0", 1);
    assert_false(umt_engine_cache_path(path, sizeof path));
    setenv("UMT_CONV_CACHE", "", 1);
    assert_false(umt_engine_cache_path(path, sizeof path));
    setenv("UMT_CONV_CACHE", "/somewhere/choices", 1);
    assert_true(umt_engine_cache_path(path, sizeof path));
    assert_string_equal(path, "/somewhere/choices");
    assert_false(umt_engine_cache_path(path, 8)); /* does not fit */
    unsetenv("UMT_CONV_CACHE");
    setenv("XDG_CACHE_HOME", scratch_path("xdg"), 1);
    assert_true(umt_engine_cache_path(path, sizeof path));
    char want[512];
    snprintf(want, sizeof want, "%s/umtrain/conv_engines", scratch_path("xdg"));
    assert_string_equal(path, want);
    struct stat st;
    snprintf(want, sizeof want, "%s/umtrain", scratch_path("xdg"));
    assert_int_equal(stat(want, &st), 0); /* its folders were made */
    assert_true(S_ISDIR(st.st_mode));
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", scratch_path("home"), 1);
    assert_true(umt_engine_cache_path(path, sizeof path));
    snprintf(want, sizeof want, "%s/.cache/umtrain/conv_engines", scratch_path("home"));
    assert_string_equal(path, want);
    umt_engine_identity two = {.global_index = 2}, e;
    assert_int_equal(umt_engine_cache_add(path, "k", &two), UMT_OK);
    assert_true(umt_engine_cache_find(path, "k", &e));
    assert_int_equal(e.global_index, 2);
    unsetenv("HOME");
    assert_false(umt_engine_cache_path(path, sizeof path)); /* nowhere to put it */
    /* The scratch folder's removal goes one level down: these go first. */
    unlink(want);
    const char *folders[] = {"home/.cache/umtrain", "home/.cache", "home", "xdg/umtrain", "xdg"};
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++)
        assert_int_equal(rmdir(scratch_path(folders[i])), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_last_whole_line_of_a_key_wins_and_nothing_else_matches),
        cmocka_unit_test(test_added_lines_are_found_and_bad_keys_are_refused),
        cmocka_unit_test(test_hostile_files_give_no_entry),
        cmocka_unit_test(test_processes_appending_at_once_leave_every_line_whole),
        cmocka_unit_test(test_the_path_follows_the_environment),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
