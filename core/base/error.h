/*
 * core/base/error.h — how every part of umtrain reports failure.
 *
 * A failing function records a message (naming the culprit, the value and what was expected)
 * with umt_fail() and returns the status it was given, so a failure is one line:
 *     return umt_fail(UMT_ERR_FORMAT, "%s: magic 0x%08x, expected 0x00000803", path, magic);
 * The message is per thread and read back with umt_last_error().
 */
#ifndef UMT_CORE_BASE_ERROR_H
#define UMT_CORE_BASE_ERROR_H

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message for status and returns status. */
umt_status umt_fail(umt_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The refusal of a NULL argument, "<function>: <argument> is NULL": UMT_ERR_INVALID_ARGUMENT. */
umt_status umt_fail_null(const char *function, const char *argument);

/* Propagates a failure: evaluates expr once and returns its status if it is not UMT_OK. */
#define UMT_TRY(expr)                                                                              \
    do {                                                                                           \
        umt_status umt_try_status_ = (expr);                                                       \
        if (umt_try_status_ != UMT_OK) return umt_try_status_;                                     \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* UMT_CORE_BASE_ERROR_H */
