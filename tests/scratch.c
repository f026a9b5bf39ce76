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
#include <zlib.h>

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

static uint32_t get_u32(const uint8_t *at) {
    return (uint32_t)at[0] | (uint32_t)at[1] << 8 | (uint32_t)at[2] << 16 | (uint32_t)at[3] << 24;
}

static void put_u32(uint8_t *at, uint32_t v) {
    for (int i = 0; i < 4; ++i) at[i] = (uint8_t)(v >> (8 * i));
}

/* Offsets of docs/CHECKPOINT.md: the version, the section counts, the records after the header
 * (92 bytes in version 1, 132 in version 2), the CRC-32 at the end. */
enum { AT_VERSION = 8, AT_COUNTS = 80, CRC_BYTES = 4 };

void scratch_poison_checkpoint(const char *path, const char *name) {
    size_t size;
    uint8_t *bytes = scratch_read(path, &size);
    uint32_t total = get_u32(bytes + AT_COUNTS) + get_u32(bytes + AT_COUNTS + 4) + get_u32(bytes + AT_COUNTS + 8);
    size_t at = get_u32(bytes + AT_VERSION) == 2 ? 132 : 92;
    bool found = false;
    for (uint32_t i = 0; i < total && !found; ++i) {
        uint32_t name_bytes = get_u32(bytes + at);
        found = name_bytes == strlen(name) && memcmp(bytes + at + 4, name, name_bytes) == 0;
        at += 4 + name_bytes + 4;
        at += 4 + 8 * (size_t)get_u32(bytes + at);
        uint64_t data_bytes = get_u32(bytes + at) | (uint64_t)get_u32(bytes + at + 4) << 32;
        at += 8;
        for (uint64_t b = 0; found && b < data_bytes; b += 4) put_u32(bytes + at + b, 0x7fc00000u);
        at += data_bytes;
    }
    if (!found) fail_msg("%s: no tensor named %s", path, name);
    put_u32(bytes + size - CRC_BYTES, (uint32_t)crc32(0L, bytes, (uInt)(size - CRC_BYTES)));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
    free(bytes);
}
