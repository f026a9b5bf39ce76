/* core/base/signals.c — holding off SIGINT and SIGTERM (see signals.h). */
#include "core/base/signals.h"

#include <pthread.h>

static void stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

void umt_signals_block_stop(sigset_t *previous) {
    sigset_t stop;
    stop_signals(&stop);
    /* Per thread (sigprocmask is unspecified in a process with threads). */
    pthread_sigmask(SIG_BLOCK, &stop, previous);
}

void umt_signals_restore(const sigset_t *previous) { pthread_sigmask(SIG_SETMASK, previous, NULL); }

int umt_signals_stop_pending(const sigset_t *previous) {
    sigset_t pending;
    if (sigpending(&pending) != 0) return 0;
    const int stop[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; ++i) {
        struct sigaction action;
        /* A handler or SIG_IGN means the program wants the save to go on: only the default ends it. */
        if (sigismember(&pending, stop[i]) == 1 && sigismember(previous, stop[i]) == 0 &&
            sigaction(stop[i], NULL, &action) == 0 && !(action.sa_flags & SA_SIGINFO) &&
            action.sa_handler == SIG_DFL)
            return stop[i];
    }
    return 0;
}

const char *umt_signal_name(int signal) {
    return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal";
}
