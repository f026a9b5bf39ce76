/*
 * dist/bootstrap.c — ranks from mpirun, and the NCCL id from rank 0 to the others:
 *   launcher children: rank 0 writes the id once per other rank into the pipe made before the
 *     fork (writes under PIPE_BUF bytes are atomic, and all copies are the same);
 *   MPI (built with --define=umt_mpi=1): MPI_Bcast;
 *   Open MPI's environment without MPI in the build: rank 0 writes the id to a file, renamed into
 *     place so that readers never see half of it; the others poll for it. The folder
 *     (UMT_DIST_ID_DIR, default /tmp) must be shared by all ranks: one node, or a shared
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

#ifdef UMT_WITH_MPI
#include <mpi.h>
#endif

bool umt_bootstrap_under_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

#ifdef UMT_WITH_MPI
static umt_status mpi_check(int code, const char *call) {
    if (code == MPI_SUCCESS) return UMT_OK;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    return umt_fail(UMT_ERR_STATE, "%s: %s", call, text);
}

umt_status umt_bootstrap_mpirun(umt_dist_process *out) {
    UMT_TRY(mpi_check(MPI_Init(NULL, NULL), "MPI_Init"));
    UMT_TRY(mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &out->rank), "MPI_Comm_rank"));
    UMT_TRY(mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &out->size), "MPI_Comm_size"));
    /* The local rank is the rank among the processes that share this node's memory. */
    MPI_Comm node;
    UMT_TRY(mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, out->rank, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type"));
    UMT_TRY(mpi_check(MPI_Comm_rank(node, &out->local_rank), "MPI_Comm_rank(node)"));
    MPI_Comm_free(&node);
    out->bootstrap = UMT_DIST_MPI;
    return UMT_OK;
}
#else
static umt_status env_int(const char *name, int *out) {
    const char *text = getenv(name);
    char *end = NULL;
    long v = text ? strtol(text, &end, 10) : -1;
    if (!text || end == text || *end || v < 0 || v > 1 << 20)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "mpirun without MPI in the build: %s = '%s', expected a number "
                        "(Open MPI sets it; build with --define=umt_mpi=1 for other MPIs)", name, text ? text : "");
    *out = (int)v;
    return UMT_OK;
}

umt_status umt_bootstrap_mpirun(umt_dist_process *out) {
    UMT_TRY(env_int("OMPI_COMM_WORLD_RANK", &out->rank));
    UMT_TRY(env_int("OMPI_COMM_WORLD_SIZE", &out->size));
    UMT_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", &out->local_rank));
    out->bootstrap = UMT_DIST_ENV;
    return UMT_OK;
}
#endif

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

static void id_file_path(char *path, size_t size) {
    const char *dir = getenv("UMT_DIST_ID_DIR"), *job = getenv("OMPI_MCA_ess_base_jobid");
    /* All ranks of one mpirun share its job id; without one, their parent (mpirun on one node). */
    if (job) snprintf(path, size, "%s/umtrain-nccl-id-%s", dir ? dir : "/tmp", job);
    else snprintf(path, size, "%s/umtrain-nccl-id-ppid%d", dir ? dir : "/tmp", (int)getppid());
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
        id_file_path(path, sizeof path);
        if (process->rank == 0) return file_write(path, id, bytes);
        return file_read(path, process->rank, id, bytes, timeout_s);
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "bootstrap %d: unknown", (int)process->bootstrap);
}

void umt_bootstrap_share_done(const umt_dist_process *process) {
    if (process->bootstrap != UMT_DIST_ENV || process->rank != 0) return;
    char path[1024];
    id_file_path(path, sizeof path);
    unlink(path);
}

void umt_dist_finish(umt_dist_process *process) {
#ifdef UMT_WITH_MPI
    if (process && process->bootstrap == UMT_DIST_MPI) MPI_Finalize();
#else
    (void)process;
#endif
}
