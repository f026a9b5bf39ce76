/*
 * memory/budget.h — how much GPU memory a context may take.
 *
 * The budget is measured once, at context creation: the GPU's free memory less a headroom
 * (for the CUDA context, libraries and other processes' growth), lowered further by
 * UMT_DEVICE_BUDGET if that is set. memory/pool.c refuses any request past it.
 */
#ifndef UMT_MEMORY_BUDGET_H
#define UMT_MEMORY_BUDGET_H

#include <stddef.h>

#include "umtrain.h"

/* The headroom left free on a GPU with total_bytes: 5% of it, at least 512 MiB. */
size_t umt_budget_headroom(size_t total_bytes);

/* The budget from the measured free and total bytes and the UMT_DEVICE_BUDGET text (NULL when
 * unset): min(free - headroom, UMT_DEVICE_BUDGET). A malformed variable is an error. */
umt_status umt_budget_compute(size_t free_bytes, size_t total_bytes, const char *env_value, size_t *budget);

#ifdef UMT_WITH_CUDA
/* Measures cuda_device's free memory now and computes its budget. */
umt_status umt_budget_measure(int cuda_device, size_t *budget);
#endif

#endif /* UMT_MEMORY_BUDGET_H */
