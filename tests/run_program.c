/* tests/run_program.c — see run_program.h. */
#include "tests/run_program.h"

#include <stdio.h>
#include <sys/wait.h>

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
