/*
 * dist/bootstrap.c — ranks from the launcher that started the process (MPI, or Open MPI's or
 * Slurm's environment), the GPU of a rank, and the NCCL id from rank 0 to the others:
 *   launcher children: rank 0 writes the id once per other rank into the pipe made before the
 *     fork (writes under PIPE_BUF bytes are atomic, and all copies are the same);
 *   MPI (built with --define=umt_mpi=1): MPI_Bcast;
 *   Open MPI's or Slurm's environment without MPI in the build: rank 0 writes the id to a file,
 *     renamed into place so that readers never see half of it; the others poll for it. The
 *     folder (UMT_DIST_ID_DIR, default /tmp) must be shared by all ranks: one node, or a shared
 *     filesystem.
 */
#include "dist/bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/escape.h"

#ifdef UMT_WITH_MPI
#include <mpi.h>
#endif

/* ----------------------------------------------------------------------------------------- */
/* Which launcher, and the ranks it gives */

static bool has(const char *name) { return getenv(name) != NULL; }

umt_dist_bootstrap umt_bootstrap_detect(void) {
    bool mpi_launcher = has("OMPI_COMM_WORLD_SIZE") || has("PMIX_RANK") || has("PMI_RANK");
    bool srun_task = has("SLURM_STEP_ID") && has("SLURM_PROCID");
#ifdef UMT_WITH_MPI
    if (mpi_launcher) return UMT_DIST_MPI;
#endif
    if (has("OMPI_COMM_WORLD_SIZE")) return UMT_DIST_ENV;
    if (srun_task) return UMT_DIST_SLURM;
    return mpi_launcher ? UMT_DIST_ENV : UMT_DIST_SINGLE;
}

#ifdef UMT_WITH_MPI
static umt_status mpi_check(int code, const char *call) {
    if (code == MPI_SUCCESS) return UMT_OK;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    return umt_fail(UMT_ERR_STATE, "%s: %s", call, text);
}

static umt_status mpi_ranks(umt_dist_process *out) {
    UMT_TRY(mpi_check(MPI_Init(NULL, NULL), "MPI_Init"));
    UMT_TRY(mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &out->rank), "MPI_Comm_rank"));
    UMT_TRY(mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &out->size), "MPI_Comm_size"));
    /* The local rank is the rank among the processes that share this node's memory. */
    MPI_Comm node;
    UMT_TRY(mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, out->rank, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type"));
    UMT_TRY(mpi_check(MPI_Comm_rank(node, &out->local_rank), "MPI_Comm_rank(node)"));
    MPI_Comm_free(&node);
    return UMT_OK;
}
#endif

/* One launcher's variables for the rank, the number of ranks and the rank within the node. */
typedef struct {
    const char *rank, *size, *local_rank;
    const char *setter; /* who sets them, for the messages */
} rank_variables;

static const rank_variables open_mpi = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "Open MPI's mpirun sets it; other MPIs need --define=umt_mpi=1 in the build"};
static const rank_variables slurm = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun sets it in each task"};

enum { MOST_RANKS = 1 << 20 };

/* The variable as a whole decimal number from least to MOST_RANKS: digits only (no sign, space or
 * other base), so that a value a launcher did not mean is refused rather than read as another. */
static umt_status env_number(const char *name, int least, const char *setter, int *out) {
    const char *text = getenv(name);
    if (!text) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s is not set (%s)", name, setter);
    size_t length = strlen(text);
    bool digits = length > 0 && length <= 9 && strspn(text, "0123456789") == length;
    long value = digits ? strtol(text, NULL, 10) : -1;
    if (digits && value >= least && value <= MOST_RANKS) {
        *out = (int)value;
        return UMT_OK;
    }
    char shown[96];
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s = '%s': expected a whole number from %d to %d (%s)", name,
                    umt_escape(text, length, shown, sizeof shown), least, MOST_RANKS, setter);
}

static umt_status below_size(const char *name, int value, const rank_variables *v, int size) {
    if (value < size) return UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s = %d: expected below %s = %d (%s)", name, value, v->size, size,
                    v->setter);
}

static umt_status environment_ranks(const rank_variables *v, umt_dist_process *out) {
    UMT_TRY(env_number(v->size, 1, v->setter, &out->size));
    UMT_TRY(env_number(v->rank, 0, v->setter, &out->rank));
    UMT_TRY(env_number(v->local_rank, 0, v->setter, &out->local_rank));
    UMT_TRY(below_size(v->rank, out->rank, v, out->size));
    return below_size(v->local_rank, out->local_rank, v, out->size);
}

umt_status umt_bootstrap_ranks(umt_dist_bootstrap bootstrap, umt_dist_process *out) {
    out->bootstrap = bootstrap;
    switch (bootstrap) {
    case UMT_DIST_ENV: return environment_ranks(&open_mpi, out);
    case UMT_DIST_SLURM: return environment_ranks(&slurm, out);
#ifdef UMT_WITH_MPI
    case UMT_DIST_MPI: return mpi_ranks(out);
#endif
    default: return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bootstrap %d: no launcher's ranks to read", (int)bootstrap);
    }
}

umt_status umt_bootstrap_gpu(int rank, int local_rank, int visible, int *gpu) {
    *gpu = visible == 1 ? 0 : local_rank;
    if (visible <= 1 || local_rank < visible) return UMT_OK;
    const char *devices = getenv("CUDA_VISIBLE_DEVICES");
    char shown[96];
    return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                    "rank %d: local rank %d, but this process sees %d GPUs (CUDA_VISIBLE_DEVICES %s%s%s): start at "
                    "most %d ranks per node, or give each rank a GPU of its own (srun --gpus-per-task=1)",
                    rank, local_rank, visible, devices ? "= '" : "not set",
                    devices ? umt_escape(devices, strlen(devices), shown, sizeof shown) : "", devices ? "'" : "",
                    visible);
}

/* ----------------------------------------------------------------------------------------- */
/* The pipe of the launcher */

static umt_status pipe_share(const umt_dist_process *p, void *id, size_t bytes) {
    if (p->rank == 0) {
        close(p->id_pipe[0]);
        for (int r = 1; r < p->size; ++r)
            if (write(p->id_pipe[1], id, bytes) != (ssize_t)bytes)
                return umt_fail(UMT_ERR_IO, "rank 0: writing the NCCL id to the launcher's pipe: %s", strerror(errno));
        close(p->id_pipe[1]);
        return UMT_OK;
    }
    close(p->id_pipe[1]);
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = read(p->id_pipe[0], (char *)id + got, bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return umt_fail(UMT_ERR_IO, "rank %d: the NCCL id from rank 0: %s", p->rank,
                            n == 0 ? "rank 0 closed the pipe before sending it (did rank 0 fail?)" : strerror(errno));
        got += (size_t)n;
    }
    close(p->id_pipe[0]);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* The file of the environment bootstrap */

static void id_file_path(const umt_dist_process *process, char *path, size_t size) {
    const char *dir = getenv("UMT_DIST_ID_DIR"), *job = getenv("OMPI_MCA_ess_base_jobid");
    const char *slurm_job = getenv("SLURM_JOB_ID"), *slurm_step = getenv("SLURM_STEP_ID");
    if (!dir) dir = "/tmp";
    /* All tasks of one srun share its job step; all ranks of one mpirun its job id; without one,
     * their parent (mpirun on one node). */
    if (process->bootstrap == UMT_DIST_SLURM)
        snprintf(path, size, "%s/umtrain-nccl-id-slurm-%s.%s", dir, slurm_job ? slurm_job : "0",
                 slurm_step ? slurm_step : "0");
    else if (job)
        snprintf(path, size, "%s/umtrain-nccl-id-%s", dir, job);
    else
        snprintf(path, size, "%s/umtrain-nccl-id-ppid%d", dir, (int)getppid());
}

static umt_status file_write(const char *path, const void *id, size_t bytes) {
    char temporary[1100];
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    FILE *f = fopen(temporary, "wb");
    if (!f) return umt_fail(UMT_ERR_IO, "rank 0: %s: %s (UMT_DIST_ID_DIR sets the folder)", temporary, strerror(errno));
    bool ok = fwrite(id, 1, bytes, f) == bytes;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(temporary, path) != 0)
        return umt_fail(UMT_ERR_IO, "rank 0: writing the NCCL id to %s: %s", path, strerror(errno));
    return UMT_OK;
}

static umt_status file_read(const char *path, int rank, void *id, size_t bytes, double timeout_s) {
    for (double waited = 0; waited < timeout_s; waited += 0.05) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, 1, bytes, f);
            fclose(f);
            if (got == bytes) return UMT_OK;
        }
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    return umt_fail(UMT_ERR_IO, "rank %d: no NCCL id in %s after %.0f s (is rank 0 running, and is the folder shared?)",
                    rank, path, timeout_s);
}

umt_status umt_bootstrap_share_id(const umt_dist_process *process, void *id, size_t bytes, double timeout_s) {
    char path[1024];
    switch (process->bootstrap) {
    case UMT_DIST_SINGLE: return UMT_OK;
    case UMT_DIST_LAUNCHER: return pipe_share(process, id, bytes);
    case UMT_DIST_MPI:
#ifdef UMT_WITH_MPI
        return mpi_check(MPI_Bcast(id, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast(NCCL id)");
#else
        return umt_fail(UMT_ERR_UNSUPPORTED, "bootstrap MPI: this build has no MPI (--define=umt_mpi=1)");
#endif
    case UMT_DIST_ENV:
    case UMT_DIST_SLURM:
        id_file_path(process, path, sizeof path);
        if (process->rank == 0) return file_write(path, id, bytes);
        return file_read(path, process->rank, id, bytes, timeout_s);
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bootstrap %d: unknown", (int)process->bootstrap);
}

void umt_bootstrap_share_done(const umt_dist_process *process) {
    if ((process->bootstrap != UMT_DIST_ENV && process->bootstrap != UMT_DIST_SLURM) || process->rank != 0) return;
    char path[1024];
    id_file_path(process, path, sizeof path);
    unlink(path);
}

void umt_dist_finish(umt_dist_process *process) {
#ifdef UMT_WITH_MPI
    if (process && process->bootstrap == UMT_DIST_MPI) MPI_Finalize();
#else
    (void)process;
#endif
}
