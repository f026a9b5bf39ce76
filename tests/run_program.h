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

#endif /* UMT_TESTS_RUN_PROGRAM_H */
