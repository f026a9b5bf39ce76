/* core/base/error.c — the per-thread last-error message and status names. */
#include "core/base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One message per thread, so that loader threads and the training thread do not clobber
 * each other's errors. */
static _Thread_local char last_error[1024];
static _Thread_local umt_status last_status = UMT_OK;

umt_status umt_fail(umt_status status, const char *fmt, ...) {
    /* Formatted aside first: callers may prefix the previous message, passing last_error itself. */
    char message[sizeof last_error];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    memcpy(last_error, message, sizeof last_error);
    last_status = status;
    return status;
}

umt_status umt_fail_null(const char *function, const char *argument) {
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s is NULL", function, argument);
}

const char *umt_last_error(void) { return last_error; }

umt_status umt_last_status(void) { return last_status; }

const char *umt_status_name(umt_status status) {
    switch (status) {
    case UMT_OK: return "UMT_OK";
    case UMT_ERR_INVALID_ARGUMENT: return "UMT_ERR_INVALID_ARGUMENT";
    case UMT_ERR_OUT_OF_MEMORY: return "UMT_ERR_OUT_OF_MEMORY";
    case UMT_ERR_BUDGET: return "UMT_ERR_BUDGET";
    case UMT_ERR_IO: return "UMT_ERR_IO";
    case UMT_ERR_FORMAT: return "UMT_ERR_FORMAT";
    case UMT_ERR_UNSUPPORTED: return "UMT_ERR_UNSUPPORTED";
    case UMT_ERR_STATE: return "UMT_ERR_STATE";
    case UMT_ERR_DEVICE: return "UMT_ERR_DEVICE";
    }
    return "UMT_ERR_UNKNOWN";
}
