/*
 * dist/bootstrap.h — ranks from mpirun, and handing the NCCL id from rank 0 to the others.
 */
#ifndef UMT_DIST_BOOTSTRAP_H
#define UMT_DIST_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/umt_dist.h"

/* Which launcher started this process, read from its environment:
 *   UMT_DIST_MPI   — a build with MPI, under an MPI launcher (OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK);
 *   UMT_DIST_ENV   — a build without MPI, under Open MPI's mpirun (OMPI_COMM_WORLD_SIZE; PMIX_RANK or
 *                    PMI_RANK alone lead here too, to be refused by name: another MPI needs MPI built in);
 *   UMT_DIST_SLURM — a task of a Slurm job step started by srun (SLURM_STEP_ID and SLURM_PROCID: the
 *                    batch script itself has SLURM_PROCID 0 and the job's SLURM_NTASKS, but no step);
 *   UMT_DIST_SINGLE — none of them.
 * Open MPI's variables win over Slurm's: mpirun inside an allocation starts its daemons with srun,
 * and its ranks inherit the daemons' SLURM_PROCID (one per node). */
umt_dist_bootstrap umt_bootstrap_detect(void);
/* Rank, size and local rank as that launcher says: MPI's communicator (MPI_Init here), or the
 * launcher's variables: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, or SLURM_PROCID, SLURM_NTASKS,
 * SLURM_LOCALID. Each must be a whole decimal number (the size 1 to 2^20, the ranks below the size);
 * anything else is refused with a message naming the variable and its value. */
umt_status umt_bootstrap_ranks(umt_dist_bootstrap bootstrap, umt_dist_process *out);
/* The GPU of rank, from its local rank (its place among the ranks of its node) and the GPUs the
 * process sees (visible, 0 when there are none to count: the local rank stands, for the context to
 * check): GPU local_rank, or GPU 0 when the launcher left the process one GPU (srun
 * --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank). A local rank with no GPU of its own is
 * refused, naming the rank, the local rank and the GPUs seen. */
umt_status umt_bootstrap_gpu(int rank, int local_rank, int visible, int *gpu);
/* Rank 0's `bytes` at id reach every rank's id (rank 0's is the source). */
umt_status umt_bootstrap_share_id(const umt_dist_process *process, void *id, size_t bytes, double timeout_s);
/* After every rank has joined the communicator: what the exchange left behind goes. */
void umt_bootstrap_share_done(const umt_dist_process *process);

#endif /* UMT_DIST_BOOTSTRAP_H */
