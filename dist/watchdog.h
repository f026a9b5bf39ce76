/*
 * dist/watchdog.h — a thread that keeps a rank from waiting forever on a dead or hung peer.
 *
 * Every collective is marked in flight with the event recorded after it. Every 100 ms the
 * thread asks NCCL for an asynchronous error and queries the events in flight; an error, or a
 * collective unfinished after the timeout, makes it print why (naming this rank), abort the
 * communicator (the NCCL kernels then return, so the rank's own waits end) and, if the rank has
 * not ended within a grace period, end the process with exit code 3 (SIGALRM, should the abort
 * itself block).
 */
#ifndef UMT_DIST_WATCHDOG_H
#define UMT_DIST_WATCHDOG_H

#include <stdbool.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "umtrain.h"

typedef struct umt_watchdog umt_watchdog;

umt_status umt_watchdog_start(ncclComm_t comm, int device, int rank, double timeout_s, int slots,
                              umt_watchdog **out);
/* What slot watches, for the message when it times out ("bucket 1's all-reduce"); name is copied. */
void umt_watchdog_name(umt_watchdog *watchdog, int slot, const char *name);
/* Slot's collective is in flight from now until `done` (recorded after it) completes. */
void umt_watchdog_mark(umt_watchdog *watchdog, int slot, cudaEvent_t done);
/* UMT_OK, or the failure that made the watchdog abort the communicator. */
umt_status umt_watchdog_check(umt_watchdog *watchdog);
bool umt_watchdog_aborted(umt_watchdog *watchdog);
void umt_watchdog_stop(umt_watchdog *watchdog);

#endif /* UMT_DIST_WATCHDOG_H */
