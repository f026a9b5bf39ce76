/* tests/run_program.c — see run_program.h. */
#include "tests/run_program.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int run_program(const char *command, char *out, size_t size) {
    char joined[4096];
    snprintf(joined, sizeof joined, "%s 2>&1", command);
    FILE *p = popen(joined, "r");
    if (!p) return -1;
    size_t used = fread(out, 1, size - 1, p);
    out[used] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int run_program_signalled(const char *command, const char *const *triggers, const int *signals, int count, char *out,
                          size_t size) {
    return run_program_signalled_after(command, triggers, signals, count, 0, out, size);
}

int run_program_signalled_after(const char *command, const char *const *triggers, const int *signals, int count,
                                int delay_ms, char *out, size_t size) {
    int pipe_ends[2];
    if (pipe(pipe_ends) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(pipe_ends[1], STDOUT_FILENO);
        dup2(pipe_ends[1], STDERR_FILENO);
        close(pipe_ends[0]);
        close(pipe_ends[1]);
        /* exec: the signals go to the program itself, not to a shell waiting for it. */
        char line[4096];
        snprintf(line, sizeof line, "exec %s", command);
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        _exit(127);
    }
    close(pipe_ends[1]);
    size_t used = 0;
    out[0] = '\0';
    int sent = 0;
    char drain[4096];
    for (ssize_t n; (n = read(pipe_ends[0], used + 1 < size ? out + used : drain,
                              used + 1 < size ? size - 1 - used : sizeof drain)) > 0;) {
        if (used + 1 < size) used += (size_t)n;
        out[used] = '\0';
        while (sent < count && strstr(out, triggers[sent])) {
            if (delay_ms > 0) nanosleep(&(struct timespec){delay_ms / 1000, (long)(delay_ms % 1000) * 1000000}, NULL);
            kill(pid, signals[sent++]);
        }
    }
    close(pipe_ends[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
