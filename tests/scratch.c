/* tests/scratch.c — see scratch.h. */
#include "tests/scratch.h"

#include <dirent.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static char dir[64];

int scratch_make(const char *label) {
    snprintf(dir, sizeof dir, "/tmp/umt_%s_XXXXXX", label);
    return mkdtemp(dir) ? 0 : -1;
}

const char *scratch_folder(void) { return dir; }

const char *scratch_path(const char *name) {
    static char path[4][sizeof dir + 320];
    static int next;
    next = (next + 1) % 4;
    snprintf(path[next], sizeof path[next], "%s/%s", dir, name);
    return path[next];
}

static bool is_entry(const struct dirent *e) { return strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0; }

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_entry(e)) continue;
        char child[sizeof dir + 512];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        if (unlink(child) != 0) remove_tree(child);
    }
    closedir(d);
    return rmdir(path);
}

int scratch_remove(void) { return remove_tree(dir); }

int scratch_entries(int *temporary) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int count = 0, temporaries = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_entry(e)) continue;
        ++count;
        if (strstr(e->d_name, ".tmp.")) ++temporaries;
    }
    if (temporary) *temporary = temporaries;
    closedir(d);
    return count;
}

uint8_t *scratch_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long length = ftell(f);
    assert_true(length > 0);
    rewind(f);
    uint8_t *bytes = malloc((size_t)length);
    assert_non_null(bytes);
    assert_int_equal(fread(bytes, 1, (size_t)length, f), (size_t)length);
    fclose(f);
    *size = (size_t)length;
    return bytes;
}

const char *scratch_write(const char *name, const uint8_t *bytes, size_t size) {
    const char *path = scratch_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    return path;
}
