/*
 * tests/test_engine_cache.c — the file of timed cuDNN engine choices (kernels/engine_cache.h) on
 * the CPU: a key's last whole line wins; lines that do not parse, a key that is only a prefix, a
 * line cut short and hostile files (a folder, a FIFO, a NUL byte) give no entry; processes
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

static void test_the_last_whole_line_of_a_key_wins_and_nothing_else_matches(void **state) {
    (void)state;
    const char *text = "v1/a/forward 3\n"
                       "v1/a/forwardx 9\n"   /* another key that starts the same */
                       "v1/a/forward 5\n"
                       "v1/a/forward x\n"    /* not a number: ignored */
                       "v1/a/forward -1\n"   /* out of range: ignored */
                       "v1/a/forward 7 8\n"  /* trailing words: ignored */
                       "v1/a/forward \n"     /* no number: ignored */
                       "v1/b/data 2\n"
                       "v1/a/forward 6";     /* no newline: a line still being written */
    assert_int_equal(umt_engine_cache_find_in(text, "v1/a/forward"), 5);
    assert_int_equal(umt_engine_cache_find_in(text, "v1/a/forwardx"), 9);
    assert_int_equal(umt_engine_cache_find_in(text, "v1/b/data"), 2);
    assert_int_equal(umt_engine_cache_find_in(text, "v1/a"), -1);
    assert_int_equal(umt_engine_cache_find_in(text, "v1/c"), -1);
    assert_int_equal(umt_engine_cache_find_in("", "v1/a/forward"), -1);
}

static void test_added_lines_are_found_and_bad_keys_are_refused(void **state) {
    (void)state;
    const char *path = scratch_path("cache");
    unlink(path);
    assert_int_equal(umt_engine_cache_find(path, "k1"), -1); /* no file yet */
    assert_int_equal(umt_engine_cache_add(path, "k1", 4), UMT_OK);
    assert_int_equal(umt_engine_cache_add(path, "k2", 0), UMT_OK);
    assert_int_equal(umt_engine_cache_add(path, "k1", 11), UMT_OK);
    assert_int_equal(umt_engine_cache_find(path, "k1"), 11);
    assert_int_equal(umt_engine_cache_find(path, "k2"), 0);
    assert_int_equal(umt_engine_cache_add(path, "a key", 1), UMT_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(umt_last_error(), "without spaces or newlines"));
    assert_int_equal(umt_engine_cache_add(path, "k\n3", 1), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_engine_cache_add(path, "k3", -2), UMT_ERR_INVALID_ARGUMENT);
    char long_key[UMT_ENGINE_KEY_BYTES + 1];
    memset(long_key, 'x', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    assert_int_equal(umt_engine_cache_add(path, long_key, 1), UMT_ERR_INVALID_ARGUMENT);
    size_t size = 0;
    free(scratch_read(path, &size));
    assert_int_equal(size, strlen("k1 4\nk2 0\nk1 11\n")); /* the refusals wrote nothing */
    assert_int_equal(umt_engine_cache_add(scratch_folder(), "k1", 1), UMT_ERR_IO); /* a folder */
    assert_non_null(strstr(umt_last_error(), scratch_folder()));
}

static void test_hostile_files_give_no_entry(void **state) {
    (void)state;
    assert_int_equal(umt_engine_cache_find(scratch_folder(), "k1"), -1);
    const uint8_t with_nul[] = "k1 4\n\0k1 5\n";
    assert_int_equal(umt_engine_cache_find(scratch_write("nul", with_nul, sizeof with_nul - 1), "k1"), -1);
    const char *fifo = scratch_path("fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(umt_engine_cache_find(fifo, "k1"), -1); /* refused, not waited on */
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
                snprintf(key, sizeof key, "v1/child%d/line%d", c, i);
                if (umt_engine_cache_add(path, key, c * 1000 + i) != UMT_OK) _exit(1);
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
            snprintf(key, sizeof key, "v1/child%d/line%d", c, i);
            assert_int_equal(umt_engine_cache_find(path, key), c * 1000 + i);
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
    assert_int_equal(umt_engine_cache_add(path, "k", 2), UMT_OK);
    assert_int_equal(umt_engine_cache_find(path, "k"), 2);
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
