/*
 * dist/bootstrap.h — ranks from mpirun, and handing the NCCL id from rank 0 to the others.
 */
#ifndef UMT_DIST_BOOTSTRAP_H
#define UMT_DIST_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/umt_dist.h"

/* true when an MPI launcher started this process (Open MPI, or a PMI/PMIx launcher). */
bool umt_bootstrap_under_mpirun(void);
/* Rank, size and local rank from MPI (MPI build) or from OMPI_COMM_WORLD_* (otherwise). */
umt_status umt_bootstrap_mpirun(umt_dist_process *out);
/* Rank 0's `bytes` at id reach every rank's id (rank 0's is the source). */
umt_status umt_bootstrap_share_id(const umt_dist_process *process, void *id, size_t bytes, double timeout_s);
/* After every rank has joined the communicator: what the exchange left behind goes. */
void umt_bootstrap_share_done(const umt_dist_process *process);

#endif /* UMT_DIST_BOOTSTRAP_H */
