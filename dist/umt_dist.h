/*
 * dist/umt_dist.h — data parallelism: one process per GPU, gradients averaged by NCCL.
 *
 * The model of use (examples/mnist_cnn.c does exactly this):
 *
 *   umt_dist_process process;
 *   umt_dist_launch(gpus, &process);          // FIRST, before anything touches CUDA
 *   if (process.launcher) return process.exit_code;   // the --gpus parent only waits
 *   options.cuda_device = process.cuda_device;
 *   ... umt_context_create, build the model ...
 *   umt_dist_create(ctx, &process, &dist_options, &dist);  // broadcasts rank 0's parameters
 *   each step: forward on this rank's shard (umt_dist_shard), umt_backward (buckets of
 *   gradients are all-reduced while backward still runs), umt_dist_finish_gradients,
 *   umt_optimizer_step; or that step as umt_step_graph_run's step function, captured with its
 *   all-reduces and replayed (its input the global batch, the same on every rank: the step
 *   takes its shard, dist/README.md "The whole step as one CUDA graph")
 *   umt_dist_destroy(dist); umt_context_destroy(ctx); umt_dist_finish(&process);
 *
 * Four ways to get ranks (umt_dist_launch picks):
 *   - one process: gpus <= 1 and not under mpirun or srun; everything here is then a no-op;
 *   - the single-node launcher: gpus > 1 forks one child per GPU; rank 0 makes the NCCL id and
 *     hands it to the others through a pipe made before the fork; the parent waits and, when one
 *     rank fails, stops the others and reports which one it was;
 *   - mpirun (Open MPI): ranks from MPI when built with --define=umt_mpi=1 (the id goes out by
 *     MPI_Bcast); without MPI in the build, from Open MPI's OMPI_COMM_WORLD_* variables, the id
 *     then going through a file in UMT_DIST_ID_DIR (default /tmp: one node or a shared folder);
 *   - srun (Slurm), a task of a job step: ranks from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
 *     (an MPI build under srun --mpi=pmix takes them from MPI), the id through the same file.
 * A rank's GPU is its local rank, or GPU 0 when the launcher left it one (cuda_device).
 *
 * Batches: --batch-size is per GPU (as torchrun/DDP); the global batch is that times the number
 * of ranks, and each rank takes a disjoint slice of every global batch of the epoch's permutation
 * (the permutation is the same on every rank: same seed, same draws). Gradients are averaged
 * (ncclAvg), so N ranks at per-GPU batch b step exactly as one rank at batch N*b.
 */
#ifndef UMT_DIST_H
#define UMT_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    UMT_DIST_SINGLE = 0, /* one process, no communication */
    UMT_DIST_LAUNCHER,   /* a child of the --gpus launcher */
    UMT_DIST_MPI,        /* under mpirun, ranks from MPI */
    UMT_DIST_ENV,        /* under Open MPI's mpirun, ranks from its environment, id through a file */
    UMT_DIST_SLURM       /* under Slurm's srun, ranks from its environment, id through a file */
} umt_dist_bootstrap;

/* Who this process is. Filled by umt_dist_launch. */
typedef struct {
    umt_dist_bootstrap bootstrap;
    int rank, size, local_rank;
    int cuda_device; /* the GPU this rank uses: local_rank, or 0 when the launcher left each rank one */
    bool launcher;  /* true in the --gpus parent, after all its children have ended */
    int exit_code;  /* launcher: 0 when every rank exited 0, else the first failure's code */
    int id_pipe[2]; /* launcher children: the pipe rank 0 writes the NCCL id into */
} umt_dist_process;

/* Call first, before any CUDA call (a forked child cannot use a CUDA already started in its
 * parent). Sets NCCL_NVLS_ENABLE=0 unless the user set it. With gpus > 1 under mpirun or srun it
 * fails (they start the ranks). A launcher's variable that is not a whole number, or a rank not
 * below the size, is refused naming the variable and its value. In the parent of the launcher it
 * returns once the children have ended, with launcher = true. */
umt_status umt_dist_launch(int gpus, umt_dist_process *out);
/* MPI_Finalize under MPI; nothing otherwise. */
void umt_dist_finish(umt_dist_process *process);

/* The part of a global batch of `count` samples that `rank` of `size` takes: [*offset,
 * *offset + *shard_count). Parts differ by at most one sample; every rank gets at least one
 * when count >= size (a shorter last batch is for the caller to skip: umt_dist_batch_usable). */
void umt_dist_shard(int64_t count, int rank, int size, int64_t *offset, int64_t *shard_count);
/* false when a global batch of count samples would leave some rank with none. */
bool umt_dist_batch_usable(int64_t count, int size);

typedef struct {
    size_t bucket_bytes; /* gradients per all-reduce, at most, in f32 bytes; 0 (the default): sized by
                          * the model (dist/buckets.h: one or two buckets for a small model) */
    bool reduce_bf16;    /* reduce in bf16 (half the traffic; gradients rounded to bf16: dist/README.md,
                          * "Numerics of --reduce bf16") */
    double timeout_s;    /* a collective unfinished for this long aborts the run; default 300 */
    /* Run the NCCL path on one rank too (the gradient hook, the buckets, a one-rank all-reduce):
     * a check that data parallelism leaves a step as it was. Default false: one rank skips it. */
    bool always;
} umt_dist_options;

umt_dist_options umt_dist_defaults(void);

typedef struct umt_dist umt_dist;

/* After every parameter exists, on a context whose GPU is process->cuda_device: the NCCL
 * communicator, rank 0's parameters and buffers broadcast to all, the bucket plan, the hooks
 * (gradient ready; a step graph's agreement and launches) and the watchdog. On one rank: a no-op
 * object (any device), unless options->always. */
umt_status umt_dist_create(umt_context *ctx, const umt_dist_process *process, const umt_dist_options *options,
                           umt_dist **out);
/* Between umt_backward and umt_optimizer_step: starts any bucket not started yet, makes the
 * compute stream wait for every all-reduce, and writes the averaged gradients back. Reports a
 * failure of the hook (which cannot return one) or of a collective. */
umt_status umt_dist_finish_gradients(umt_dist *dist);
/* Sums (or takes the maximum of) count host values over the ranks, in place; count <= 64. */
umt_status umt_dist_sum(umt_dist *dist, double *values, int count);
umt_status umt_dist_max(umt_dist *dist, double *values, int count);
/* What the gradients' all-reduces are: the bucket plan, and how many ran so far. */
typedef struct {
    int buckets;                 /* all-reduces per step (0: none, on one rank without options.always,
                                  * or with gradients the offload tier holds, reduced one by one) */
    size_t reduce_bytes;         /* bytes all-reduced per step, every bucket together */
    size_t largest_bucket_bytes;
    int64_t eager_collectives;    /* bucket all-reduces issued op by op */
    int64_t captured_collectives; /* bucket all-reduces captured into a step graph (each replay runs them again) */
} umt_dist_stats;

/* All 0 for a NULL dist (with the message of a NULL argument). */
umt_dist_stats umt_dist_stats_get(const umt_dist *dist);
int umt_dist_rank(const umt_dist *dist);
int umt_dist_size(const umt_dist *dist);
/* Stops the watchdog, destroys the communicator; step graphs drop what they captured of its
 * collectives first (NCCL's destroy waits for them), and capture again without them. NULL is ok. */
void umt_dist_destroy(umt_dist *dist);

#ifdef __cplusplus
}
#endif

#endif /* UMT_DIST_H */
