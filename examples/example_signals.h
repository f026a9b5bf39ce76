/*
 * examples/example_signals.h — what Ctrl-C (SIGINT) and SIGTERM mean to a trainer: the first asks
 * the run to stop once the step it is in is done; the trainer then saves its checkpoint if it was
 * given one (with the step inside the epoch, so that --resume goes on from there), says so, and
 * exits with 128 + the signal: 130 for SIGINT, 143 for SIGTERM, as a shell reports a process the
 * signal ended. A second one ends the process at once, with the same status.
 *
 * The library installs no handler of its own (a program decides what a signal means); while a
 * checkpoint is being written it holds both signals off, so a second Ctrl-C waits for the file to
 * be whole (include/umtrain.h, umt_checkpoint_save).
 */
#ifndef UMT_EXAMPLE_SIGNALS_H
#define UMT_EXAMPLE_SIGNALS_H

/* Catches SIGINT and SIGTERM from now on; -1 (message printed, naming program) if it cannot. */
int example_signals_catch(const char *program);
/* The signal that asked the run to stop (SIGINT or SIGTERM), or 0: read it after each step. */
int example_signals_stop_requested(void);
/* "SIGINT", "SIGTERM", or "a signal". */
const char *example_signal_name(int signal);
/* 128 + signal: the exit status of a run a signal stopped. */
int example_signal_exit_status(int signal);

#endif /* UMT_EXAMPLE_SIGNALS_H */
