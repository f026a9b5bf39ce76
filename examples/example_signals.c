/*
 * examples/example_signals.c — SIGINT and SIGTERM as "stop after this step" (example_signals.h).
 *
 * The handler only sets a flag and writes one line with write(2), both safe inside a handler; the
 * trainer reads the flag between steps and does the rest (the save, the message) in its own
 * thread. umtrain's loader threads block both signals, so they never run the handler.
 */
#include "examples/example_signals.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t requested;
/* The line the first signal prints, made before any signal can come (the handler may not format). */
static char notice[160];
static size_t notice_bytes;

static void on_stop(int signal) {
    /* The second one: the user means it. */
    if (requested) _exit(example_signal_exit_status(signal));
    requested = signal;
    ssize_t written = write(STDERR_FILENO, notice, notice_bytes);
    (void)written; /* nothing to do in a handler if stderr is gone */
}

int example_signals_catch(const char *program) {
    int length = snprintf(notice, sizeof notice,
                          "\n%s: stopping after this step (its checkpoint saved where the program saves one); "
                          "again to end at once\n", program);
    notice_bytes = length > 0 && (size_t)length < sizeof notice ? (size_t)length : 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_stop;
    /* A system call the signal interrupts (a read of the data, a wait) resumes: the step goes on. */
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGINT, &action, NULL) == 0 && sigaction(SIGTERM, &action, NULL) == 0) return 0;
    perror(program);
    return -1;
}

int example_signals_stop_requested(void) { return requested; }

const char *example_signal_name(int signal) {
    return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal";
}

int example_signal_exit_status(int signal) { return 128 + signal; }
