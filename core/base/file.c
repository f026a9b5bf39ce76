/* core/base/file.c — reading only regular files (see file.h). */
#include "core/base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"

/* What a non-regular file is, for the message. */
static const char *kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

umt_status umt_file_open_regular(const char *path, const char *what, FILE **out, size_t *bytes) {
    *out = NULL;
    *bytes = 0;
    if (!path || !*path) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "file name is empty (expected %s)", what);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return umt_fail(UMT_ERR_IO, "%s: cannot open: %s (expected %s)", path, strerror(errno), what);
    struct stat st;
    umt_status status = UMT_OK;
    if (fstat(fd, &st) != 0)
        status = umt_fail(UMT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        status = umt_fail(UMT_ERR_IO, "%s: %s, not a regular file (expected %s)", path, kind_of(st.st_mode), what);
    FILE *f = status == UMT_OK ? fdopen(fd, "rb") : NULL;
    if (status == UMT_OK && !f) status = umt_fail(UMT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (status != UMT_OK) {
        close(fd);
        return status;
    }
    *out = f;
    *bytes = (size_t)st.st_size;
    return UMT_OK;
}

umt_status umt_file_read_regular(const char *path, const char *what, size_t max_bytes, uint8_t **out, size_t *size) {
    *out = NULL;
    *size = 0;
    FILE *f = NULL;
    size_t want = 0;
    UMT_TRY(umt_file_open_regular(path, what, &f, &want));
    umt_status status = UMT_OK;
    uint8_t *data = NULL;
    if (want > max_bytes)
        status = umt_fail(UMT_ERR_FORMAT, "%s: the file is %zu bytes, past the cap of %zu bytes for %s", path, want,
                          max_bytes, what);
    else if (want && !(data = malloc(want)))
        status = umt_fail(UMT_ERR_OUT_OF_MEMORY, "%s: no memory for the file's %zu bytes", path, want);
    size_t got = status == UMT_OK && want ? fread(data, 1, want, f) : 0;
    /* Short without an error means the file shrank between fstat and the read. */
    if (status == UMT_OK && got != want)
        status = umt_fail(UMT_ERR_IO, "%s: read %zu of %zu bytes: %s", path, got, want,
                          ferror(f) ? strerror(errno) : "the file ended early");
    fclose(f);
    if (status != UMT_OK) {
        free(data);
        return status;
    }
    *out = data;
    *size = want;
    return UMT_OK;
}
