/*
 * tests/forked.h — children a test forks as separate processes (the GPU ledger's holders): each
 * runs a function that fills a report of fixed size, sends it back through a pipe, and then lives,
 * holding what it made, until the test lets it go or kills it. A test's teardown kills the
 * children a failure left alive, so that none outlives its test.
 */
#ifndef UMT_TESTS_FORKED_H
#define UMT_TESTS_FORKED_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int report_fd; /* the child's report comes through it */
    int hold_fd;   /* the child lives until this is closed */
} forked_child;

/* Runs work(arg, report) in a child, report being report_bytes (at most PIPE_BUF) of zeros; the
 * child keeps no descriptor of the parent's but keep_fd (-1: none), so that a pipe another child
 * or the test holds open can end. No cmocka call may be made in work. */
forked_child forked_spawn(void (*work)(const void *arg, void *report), const void *arg, size_t report_bytes,
                          int keep_fd);
/* The child's report (the calling test fails when the child sent none). */
void forked_report(forked_child *child, void *report, size_t report_bytes);
/* Lets the child exit and reaps it (asserting it exited 0), or kills it with SIGKILL first. */
void forked_finish(forked_child *child, bool kill_it);
/* Tracks a child forked by other means, for forked_kill_all. */
void forked_track(pid_t pid);
/* A teardown: SIGKILL to every child still alive, and reaped. */
int forked_kill_all(void **state);

#endif /* UMT_TESTS_FORKED_H */
