/*
 * core/device.h — starting and stopping a context's device: on CUDA, the budget, the cuBLAS
 * workspace and the backend's stream; on the CPU, nothing.
 */
#ifndef UMT_CORE_DEVICE_H
#define UMT_CORE_DEVICE_H

#include "umtrain.h"

/* cuBLAS wants 32 MiB of workspace on Hopper for its fastest kernels: the compute stream's
 * handle's, and the side stream's (core/branch.c). */
#define UMT_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* Called by umt_context_create once the pools are initialised; sets ctx->backend. */
umt_status umt_device_start(umt_context *ctx);
/* Called by umt_context_destroy before the pools are released. */
void umt_device_stop(umt_context *ctx);

#endif /* UMT_CORE_DEVICE_H */
