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
enum { MOST_BYTES = 4 << 20 };

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

bool umt_engine_identity_equal(const umt_engine_identity *a, const umt_engine_identity *b) {
    if (a->global_index != b->global_index || a->knob_count != b->knob_count) return false;
    for (int i = 0; i < a->knob_count; i++) {
        int j = 0;
        while (j < b->knob_count && b->knob_type[j] != a->knob_type[i]) j++;
        if (j == b->knob_count || b->knob_value[j] != a->knob_value[i]) return false;
    }
    return true;
}

/* One integer of an engine's text at *at, before end: its digits and an optional '-', nothing
 * else; *at moves past it. */
static bool parse_integer(const char **at, const char *end, int64_t *value) {
    const char *p = *at;
    if (p < end && *p == '-') p++;
    if (p == end || *p < '0' || *p > '9') return false;
    char *after;
    errno = 0;
    long long v = strtoll(*at, &after, 10);
    if (errno || after > end) return false;
    *value = v;
    *at = after;
    return true;
}

/* "index;type=value;..." from text to end, exactly: no other characters, no knob kind twice. */
static bool parse_engine(const char *text, const char *end, umt_engine_identity *engine) {
    memset(engine, 0, sizeof *engine);
    const char *at = text;
    if (!parse_integer(&at, end, &engine->global_index) || engine->global_index < 0) return false;
    while (at < end) {
        int k = engine->knob_count;
        if (*at++ != ';' || k == UMT_ENGINE_MOST_KNOBS) return false;
        if (!parse_integer(&at, end, &engine->knob_type[k]) || engine->knob_type[k] < 0) return false;
        if (at == end || *at++ != '=' || !parse_integer(&at, end, &engine->knob_value[k])) return false;
        for (int j = 0; j < k; j++)
            if (engine->knob_type[j] == engine->knob_type[k]) return false;
        engine->knob_count = k + 1;
    }
    return true;
}

bool umt_engine_cache_find_in(const char *text, const char *key, umt_engine_identity *engine) {
    size_t key_bytes = strlen(key);
    bool found = false;
    umt_engine_identity line_engine;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        if (!end) break; /* a line still being written, or cut short: not a whole entry */
        if ((size_t)(end - line) > key_bytes + 1 && !strncmp(line, key, key_bytes) && line[key_bytes] == ' ' &&
            parse_engine(line + key_bytes + 1, end, &line_engine)) {
            *engine = line_engine;
            found = true;
        }
        line = end + 1;
    }
    return found;
}

bool umt_engine_cache_find(const char *path, const char *key, umt_engine_identity *engine) {
    uint8_t *bytes = NULL;
    size_t size = 0;
    /* A missing or unreadable file (or an empty one) is no entry. */
    if (umt_file_read_regular(path, "an engine cache", MOST_BYTES, &bytes, &size) != UMT_OK || !bytes) {
        free(bytes);
        return false;
    }
    char *text = realloc(bytes, size + 1);
    if (!text) {
        free(bytes);
        return false;
    }
    text[size] = '\0';
    bool found = strlen(text) == size && umt_engine_cache_find_in(text, key, engine); /* no NULs in a text */
    free(text);
    return found;
}

/* "key engine\n" into line; false when the engine cannot be written (a negative index or knob
 * kind, too many knobs) or the line does not fit. */
static bool format_line(const char *key, const umt_engine_identity *engine, char *line, size_t bytes) {
    if (engine->global_index < 0 || engine->knob_count < 0 || engine->knob_count > UMT_ENGINE_MOST_KNOBS) return false;
    size_t n = (size_t)snprintf(line, bytes, "%s %lld", key, (long long)engine->global_index);
    for (int k = 0; k < engine->knob_count && n < bytes; k++) {
        if (engine->knob_type[k] < 0) return false;
        n += (size_t)snprintf(line + n, bytes - n, ";%lld=%lld", (long long)engine->knob_type[k],
                              (long long)engine->knob_value[k]);
    }
    if (n < bytes) n += (size_t)snprintf(line + n, bytes - n, "\n");
    return n < bytes;
}

umt_status umt_engine_cache_add(const char *path, const char *key, const umt_engine_identity *engine) {
    char line[UMT_ENGINE_KEY_BYTES + UMT_ENGINE_MOST_KNOBS * 48];
    if (strpbrk(key, " \n") || strlen(key) >= UMT_ENGINE_KEY_BYTES || !format_line(key, engine, line, sizeof line))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "engine cache: key '%.80s' and engine %lld with %d knobs (expected a "
                        "key of under %d bytes without spaces or newlines, a non-negative index, at most %d knobs and "
                        "non-negative knob kinds)", key, (long long)engine->global_index, engine->knob_count,
                        UMT_ENGINE_KEY_BYTES, UMT_ENGINE_MOST_KNOBS);
    size_t n = strlen(line);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return umt_fail(UMT_ERR_IO, "engine cache %s: %s", path, strerror(errno));
    /* One write of a whole line: O_APPEND puts it after every line other processes wrote. */
    ssize_t written = write(fd, line, n);
    int saved = errno;
    close(fd);
    if (written != (ssize_t)n) return umt_fail(UMT_ERR_IO, "engine cache %s: wrote %zd of %zu bytes (%s)", path,
                                               written, n, written < 0 ? strerror(saved) : "short write");
    return UMT_OK;
}
