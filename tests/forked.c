/* tests/forked.c — see forked.h. */
#include "tests/forked.h"

#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_CHILDREN 32

static pid_t living[MAX_CHILDREN];
static int living_count;

void forked_track(pid_t pid) {
    assert_true(living_count < MAX_CHILDREN);
    living[living_count++] = pid;
}

static void untrack(pid_t pid) {
    for (int i = 0; i < living_count; ++i)
        if (living[i] == pid) living[i] = living[--living_count];
}

int forked_kill_all(void **state) {
    (void)state;
    for (int i = 0; i < living_count; ++i) {
        kill(living[i], SIGKILL);
        waitpid(living[i], NULL, 0);
    }
    living_count = 0;
    return 0;
}

/* In the child: its work, its report in one write (under PIPE_BUF: read whole), then its life. */
static void run_child(void (*work)(const void *, void *), const void *arg, size_t report_bytes, int report_fd,
                      int hold_fd) {
    void *report = calloc(1, report_bytes);
    if (!report) _exit(2);
    work(arg, report);
    if (write(report_fd, report, report_bytes) != (ssize_t)report_bytes) _exit(3);
    char byte;
    while (read(hold_fd, &byte, 1) > 0) continue;
    _exit(0);
}

forked_child forked_spawn(void (*work)(const void *arg, void *report), const void *arg, size_t report_bytes,
                          int keep_fd) {
    int reports[2], holds[2];
    assert_true(report_bytes <= PIPE_BUF);
    assert_int_equal(pipe(reports), 0);
    assert_int_equal(pipe(holds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Only its own ends: a copy of another child's hold pipe, or of a start line's writing
         * end, would keep that pipe from ever ending. */
        for (int fd = 3; fd < 1024; ++fd)
            if (fd != reports[1] && fd != holds[0] && fd != keep_fd) close(fd);
        run_child(work, arg, report_bytes, reports[1], holds[0]);
    }
    forked_track(pid);
    close(reports[1]);
    close(holds[0]);
    return (forked_child){pid, reports[0], holds[1]};
}

void forked_report(forked_child *child, void *report, size_t report_bytes) {
    size_t got = 0;
    while (got < report_bytes) {
        ssize_t n = read(child->report_fd, (char *)report + got, report_bytes - got);
        if (n <= 0) fail_msg("child %d sent no report", (int)child->pid);
        got += (size_t)n;
    }
}

void forked_finish(forked_child *child, bool kill_it) {
    if (kill_it) kill(child->pid, SIGKILL);
    close(child->hold_fd);
    close(child->report_fd);
    int status = 0;
    assert_int_equal(waitpid(child->pid, &status, 0), child->pid);
    untrack(child->pid);
    if (!kill_it) assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}
