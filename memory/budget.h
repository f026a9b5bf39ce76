/*
 * memory/budget.h — how much GPU memory a context may take.
 *
 * The budget is measured once, at context creation: the GPU's free memory less a headroom
 * (for the CUDA context, libraries and other processes' growth), lowered further by
 * UMT_DEVICE_BUDGET if that is set, and by what other umtrain processes on the same GPU hold of
 * its capacity (memory/ledger.h), so that a second process plans against what is left. memory/
 * pool.c refuses any request past it, and any the GPU's ledger refuses. The host's available
 * memory, read when a plan is made, bounds what the offload tier may pin.
 */
#ifndef UMT_MEMORY_BUDGET_H
#define UMT_MEMORY_BUDGET_H

#include <stddef.h>

#include "umtrain.h"

/* The headroom left free on a GPU with total_bytes: 5% of it, at least 512 MiB. */
size_t umt_budget_headroom(size_t total_bytes);

/* The most workspace one fp32 convolution's algorithm may take (kernels/cuda/conv.cu; half
 * precision keeps 256 MiB, conv.cu says why) under a budget: an eighth of it, at least 256 MiB
 * (what every budget had before) and at most 8 GiB. cuDNN's FFT algorithms need gigabytes at
 * large batches (MNIST's second convolution at batch 4096 in fp32: 3.8 GiB), and run its data
 * gradient in half the time of those within 256 MiB. The algorithms, and so an fp32 run's last
 * bits, may therefore differ between budgets; a run at a fixed UMT_DEVICE_BUDGET has fixed ones.
 * The memory plan counts the workspace but does not lower the limit before it splits a batch. */
size_t umt_budget_conv_workspace_limit(size_t budget_bytes);

/* The budget from the measured free and total bytes and the UMT_DEVICE_BUDGET text (NULL when
 * unset): min(free - headroom, UMT_DEVICE_BUDGET). A malformed variable is an error. */
umt_status umt_budget_compute(size_t free_bytes, size_t total_bytes, const char *env_value, size_t *budget);

/* The host's available memory in the text of /proc/meminfo (its MemAvailable line), 0 when the
 * text has none. */
size_t umt_meminfo_available_bytes(const char *meminfo);
/* The host's available memory now (Linux: /proc/meminfo), 0 when it cannot be read: what the
 * memory plan holds the offload tier's pinned copies against (memory/fit.h). */
size_t umt_host_available_bytes(void);

/* What the ledger's rule (c) keeps free of the GPU's free memory measured at each new block: a
 * quarter of the headroom. Not the whole headroom: the headroom is there for this process's own
 * libraries (cuBLAS, cuDNN, CUDA graphs), whose memory the free memory measured now already
 * leaves out; counted again, a run that fits its budget today would be refused. */
size_t umt_budget_guard(size_t total_bytes);

/* The budget lowered to what other live holders leave of the GPU's capacity for umtrain
 * (memory/ledger.h: its view's capacity_bytes and others_bytes). */
size_t umt_budget_shared(size_t budget, size_t capacity_bytes, size_t others_bytes);

#ifdef UMT_WITH_CUDA
struct umt_memory;
/* Measures cuda_device's free memory now, joins its ledger (the file named by the GPU's UUID in
 * umt_ledger_dir()) and sets mem's budget from both, and what the pools need for the ledger's
 * rule (c): the measure of free memory and its guard. */
umt_status umt_budget_measure(int cuda_device, struct umt_memory *mem);
#endif

#endif /* UMT_MEMORY_BUDGET_H */
