/*
 * core/base/signals.h — holding off SIGINT and SIGTERM while a file is half written.
 *
 * A checkpoint is written to a temporary file and renamed over its path. Ctrl-C (SIGINT) or a
 * scheduler's SIGTERM in between would end the process by default and leave the temporary file
 * behind. So a save blocks both signals in its thread from the temporary file's creation to its
 * rename or removal, and asks between writes whether one is pending that would end the process;
 * if so it stops and removes the file, and unblocking then delivers the signal. A signal the
 * program catches or ignores waits for the save to finish.
 *
 * A process-directed signal goes to any thread that does not block it, so this holds only when
 * the program's other threads block the two signals too: threads umtrain starts (the loader's)
 * do, by being started with them blocked.
 */
#ifndef UMT_CORE_BASE_SIGNALS_H
#define UMT_CORE_BASE_SIGNALS_H

#include <signal.h>

/* Blocks SIGINT and SIGTERM in the calling thread; *previous gets the mask to restore. */
void umt_signals_block_stop(sigset_t *previous);
/* Restores the mask; a signal pending and no longer blocked is delivered now. */
void umt_signals_restore(const sigset_t *previous);
/* SIGINT or SIGTERM if one is pending that the mask `previous` lets through and whose action is
 * the default (ending the process), else 0: the signal restoring previous would end the process
 * with. One previous blocks too is the program's to take when it wants (sigwait, say). */
int umt_signals_stop_pending(const sigset_t *previous);
/* "SIGINT", "SIGTERM", or "a signal". */
const char *umt_signal_name(int signal);

#endif /* UMT_CORE_BASE_SIGNALS_H */
