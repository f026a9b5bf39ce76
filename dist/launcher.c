/*
 * dist/launcher.c — the single-node launcher behind --gpus N, and umt_dist_launch, which picks
 * how this process learns its rank (launcher, MPI, Open MPI's or Slurm's environment, or alone).
 *
 * The launcher forks N children before anything touches CUDA; each child returns from
 * umt_dist_launch as one rank and selects GPU local_rank. The parent never uses CUDA: it waits,
 * and when a child ends badly (non-zero exit or a signal) it names that rank, stops the others
 * (SIGTERM, then SIGKILL after a grace period: a hung rank may not answer SIGTERM) and returns
 * that child's failure as its own exit code.
 */
#define _GNU_SOURCE /* prctl's PR_SET_PDEATHSIG */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/base/error.h"
#include "dist/bootstrap.h"
#include "dist/umt_dist.h"

enum { MAX_RANKS = 64, STOP_GRACE_SECONDS = 5 };

/* The exit code that reports a child's end: its own code, or 128 + the signal, as shells do. */
static int exit_code_of(int wait_status) {
    if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
    if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
    return 1;
}

static void describe_end(int rank, pid_t pid, int wait_status) {
    if (WIFSIGNALED(wait_status))
        fprintf(stderr, "umtrain launcher: rank %d (pid %d) was killed by signal %d (%s)\n", rank, (int)pid,
                WTERMSIG(wait_status), strsignal(WTERMSIG(wait_status)));
    else
        fprintf(stderr, "umtrain launcher: rank %d (pid %d) exited with status %d\n", rank, (int)pid,
                exit_code_of(wait_status));
}

static int rank_of(const pid_t *pids, int count, pid_t pid) {
    for (int r = 0; r < count; ++r)
        if (pids[r] == pid) return r;
    return -1;
}

/* SIGTERM to every rank still running, SIGKILL to those left after the grace period. */
static void stop_ranks(pid_t *pids, int count, int *running) {
    for (int r = 0; r < count; ++r)
        if (pids[r] > 0) kill(pids[r], SIGTERM);
    time_t deadline = time(NULL) + STOP_GRACE_SECONDS;
    while (*running > 0 && time(NULL) < deadline) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            int r = rank_of(pids, count, pid);
            if (r >= 0) pids[r] = 0, (*running)--;
        } else {
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        }
    }
    for (int r = 0; r < count; ++r)
        if (pids[r] > 0) kill(pids[r], SIGKILL), waitpid(pids[r], NULL, 0), (*running)--;
}

/* The parent: waits for every child; the first bad end stops the rest. */
static int wait_for_ranks(pid_t *pids, int count) {
    int running = count, result = 0;
    while (running > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0 && errno == EINTR) continue;
        if (pid < 0) break;
        int r = rank_of(pids, count, pid);
        if (r < 0) continue;
        pids[r] = 0;
        running--;
        if (exit_code_of(status) == 0) continue;
        describe_end(r, pid, status);
        result = exit_code_of(status);
        if (running > 0) {
            fprintf(stderr, "umtrain launcher: stopping the other %d rank(s)\n", running);
            stop_ranks(pids, count, &running);
        }
    }
    return result;
}

static umt_status fork_ranks(int gpus, umt_dist_process *out) {
    if (gpus > MAX_RANKS) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "--gpus %d: at most %d", gpus, MAX_RANKS);
    if (pipe(out->id_pipe) != 0) return umt_fail(UMT_ERR_IO, "launcher: pipe: %s", strerror(errno));
    /* Output written before the fork must not be flushed once per child. */
    fflush(stdout);
    fflush(stderr);
    pid_t pids[MAX_RANKS] = {0}, parent = getpid();
    for (int r = 0; r < gpus; ++r) {
        pid_t pid = fork();
        if (pid == 0) {
            /* A child must not outlive a launcher that was killed. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            *out = (umt_dist_process){.bootstrap = UMT_DIST_LAUNCHER, .rank = r, .size = gpus, .local_rank = r,
                                      .cuda_device = r, .id_pipe = {out->id_pipe[0], out->id_pipe[1]}};
            return UMT_OK;
        }
        if (pid < 0) {
            int running = r;
            fprintf(stderr, "umtrain launcher: fork for rank %d: %s\n", r, strerror(errno));
            stop_ranks(pids, r, &running);
            return umt_fail(UMT_ERR_STATE, "launcher: fork for rank %d failed", r);
        }
        pids[r] = pid;
    }
    /* Only the children use the pipe; with the parent's ends closed, a reader sees end-of-file
     * (not a hang) when rank 0 dies before writing. */
    close(out->id_pipe[0]);
    close(out->id_pipe[1]);
    *out = (umt_dist_process){.bootstrap = UMT_DIST_LAUNCHER, .size = gpus, .launcher = true,
                              .exit_code = wait_for_ranks(pids, gpus), .id_pipe = {-1, -1}};
    return UMT_OK;
}

umt_status umt_dist_launch(int gpus, umt_dist_process *out) {
    if (!out) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dist_launch: out is NULL");
    *out = (umt_dist_process){.bootstrap = UMT_DIST_SINGLE, .size = 1, .id_pipe = {-1, -1}};
    /* NVLink multicast stays off on shared machines unless the user asks for it. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    umt_dist_bootstrap launched = umt_bootstrap_detect();
    if (launched == UMT_DIST_SINGLE) return gpus > 1 ? fork_ranks(gpus, out) : UMT_OK;
    if (gpus > 1) {
        bool slurm = launched == UMT_DIST_SLURM;
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "--gpus %d under %s: %s starts the ranks (use %s)", gpus,
                        slurm ? "srun" : "mpirun", slurm ? "srun" : "mpirun", slurm ? "--ntasks" : "-np");
    }
    UMT_TRY(umt_bootstrap_ranks(launched, out));
    /* No fork follows under a launcher, so counting the GPUs (which starts CUDA) is safe here. */
    return umt_bootstrap_gpu(out->rank, out->local_rank, umt_cuda_device_count(), &out->cuda_device);
}
