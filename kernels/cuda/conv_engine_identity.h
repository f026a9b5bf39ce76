/*
 * kernels/cuda/conv_engine_identity.h — a cuDNN engine named by its global index and knob values
 * (umt_engine_identity, kernels/engine_cache.h), and back (CUDA sources only).
 */
#ifndef UMT_KERNELS_CUDA_CONV_ENGINE_IDENTITY_H
#define UMT_KERNELS_CUDA_CONV_ENGINE_IDENTITY_H

#include <cudnn.h>

#include "kernels/engine_cache.h"

/* The engine of an engine configuration (a heuristic's result, or one made below). */
umt_status umt_cuda_engine_identity_of(cudnnBackendDescriptor_t config, umt_engine_identity *id);

/* A finalized configuration of engine id for the operation graph, or NULL when this cuDNN will
 * not make one (an engine or a knob it does not know). The engine and knob descriptors it is
 * made of are appended to parts (room for 1 + UMT_ENGINE_MOST_KNOBS), *part_count counting them,
 * for the caller to destroy after the configuration. */
cudnnBackendDescriptor_t umt_cuda_engine_config_of(cudnnBackendDescriptor_t graph, const umt_engine_identity *id,
                                                   cudnnBackendDescriptor_t *parts, int *part_count);

/* The GPU part of a cache key into out: the current device's name, compute capability,
 * multiprocessors, the driver's version and cuDNN's; asked once a device a process. False when
 * the GPU cannot be asked or it does not fit. */
bool umt_cuda_gpu_identity(char *out, size_t bytes);

#endif /* UMT_KERNELS_CUDA_CONV_ENGINE_IDENTITY_H */
