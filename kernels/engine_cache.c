/* kernels/engine_cache.c — the engine cache's file (engine_cache.h says what and why). */
#include "kernels/engine_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"

/* The file is a few lines a shape; past this it is not ours, or not worth reading. */
enum { MOST_BYTES = 4 << 20, MOST_INDEX = 1 << 20 };

/* mkdir for each folder of path's directory; an existing one is fine. */
static bool make_folders(char *path) {
    for (char *slash = strchr(path + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        bool ok = mkdir(path, 0755) == 0 || errno == EEXIST;
        *slash = '/';
        if (!ok) return false;
    }
    return true;
}

bool umt_engine_cache_path(char *buf, size_t bytes) {
    const char *chosen = getenv("UMT_CONV_CACHE");
    if (chosen) {
        if (!*chosen || !strcmp(chosen, "0")) return false;
        return (size_t)snprintf(buf, bytes, "%s", chosen) < bytes;
    }
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(buf, bytes, "%s/umtrain/conv_engines", xdg);
    else if (home && *home) n = snprintf(buf, bytes, "%s/.cache/umtrain/conv_engines", home);
    else return false;
    return n > 0 && (size_t)n < bytes && make_folders(buf);
}

int umt_engine_cache_find_in(const char *text, const char *key) {
    size_t key_bytes = strlen(key);
    int found = -1;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        if (!end) break; /* a line still being written, or cut short: not a whole entry */
        if ((size_t)(end - line) > key_bytes + 1 && !strncmp(line, key, key_bytes) && line[key_bytes] == ' ') {
            char *after;
            long index = strtol(line + key_bytes + 1, &after, 10);
            if (after == end && after != line + key_bytes + 1 && index >= 0 && index < MOST_INDEX) found = (int)index;
        }
        line = end + 1;
    }
    return found;
}

int umt_engine_cache_find(const char *path, const char *key) {
    uint8_t *bytes = NULL;
    size_t size = 0;
    /* A missing or unreadable file (or an empty one) is no entry. */
    if (umt_file_read_regular(path, "an engine cache", MOST_BYTES, &bytes, &size) != UMT_OK || !bytes) {
        free(bytes);
        return -1;
    }
    char *text = realloc(bytes, size + 1);
    if (!text) {
        free(bytes);
        return -1;
    }
    text[size] = '\0';
    int found = strlen(text) == size ? umt_engine_cache_find_in(text, key) : -1; /* no NULs in a text */
    free(text);
    return found;
}

umt_status umt_engine_cache_add(const char *path, const char *key, int index) {
    if (strpbrk(key, " \n") || strlen(key) >= UMT_ENGINE_KEY_BYTES || index < 0 || index >= MOST_INDEX)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "engine cache: key '%.80s' and index %d (expected a key of under %d "
                        "bytes without spaces or newlines, and 0 <= index < %d)", key, index, UMT_ENGINE_KEY_BYTES,
                        MOST_INDEX);
    char line[UMT_ENGINE_KEY_BYTES + 16];
    int n = snprintf(line, sizeof line, "%s %d\n", key, index);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return umt_fail(UMT_ERR_IO, "engine cache %s: %s", path, strerror(errno));
    /* One write of a whole line: O_APPEND puts it after every line other processes wrote. */
    ssize_t written = write(fd, line, (size_t)n);
    int saved = errno;
    close(fd);
    if (written != n) return umt_fail(UMT_ERR_IO, "engine cache %s: wrote %zd of %d bytes (%s)", path, written, n,
                                      written < 0 ? strerror(saved) : "short write");
    return UMT_OK;
}
