/*
 * tests/run_program.h — running a program of the tree from a test (the examples), the way a user
 * would from a shell.
 */
#ifndef UMT_TESTS_RUN_PROGRAM_H
#define UMT_TESTS_RUN_PROGRAM_H

#include <stddef.h>

/* Runs `command` through the shell with stderr joined to stdout; returns its exit status (-1
 * when a signal ended it) and what it printed, cut to size - 1 bytes, in out. */
int run_program(const char *command, char *out, size_t size);

/* run_program, sending a signal the way a terminal's Ctrl-C does: signals[i] to the program as
 * soon as what it has printed holds triggers[i], one after another (count of them). The status:
 * the program's exit status, or -1 when a signal ended it. */
int run_program_signalled(const char *command, const char *const *triggers, const int *signals, int count, char *out,
                          size_t size);
/* The same, each signal sent delay_ms after its trigger was read: a program that checks for a
 * signal right after printing a line has then passed that check, whatever the machine's load. */
int run_program_signalled_after(const char *command, const char *const *triggers, const int *signals, int count,
                                int delay_ms, char *out, size_t size);

#endif /* UMT_TESTS_RUN_PROGRAM_H */
