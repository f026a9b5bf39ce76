/*
 * kernels/cuda/conv_engines.h — one direction of a half-precision convolution through cuDNN's
 * graph API, its engine timed on first use (conv_engines.cu says why); conv.cu's plans hold
 * one set per direction (CUDA sources only).
 */
#ifndef UMT_KERNELS_CUDA_CONV_ENGINES_H
#define UMT_KERNELS_CUDA_CONV_ENGINES_H

#include <cudnn.h>
#include <stddef.h>

#include "kernels/backend.h"

typedef enum { UMT_CONV_FORWARD, UMT_CONV_BACKWARD_DATA, UMT_CONV_BACKWARD_FILTER } umt_conv_direction;

typedef struct umt_conv_engines umt_conv_engines;

/* The engines that can run shape s (bf16/f16, NHWC, w as K,R,S,C) in one direction, writing
 * its output (y, dx or dw) with beta 0, or adding to it when accumulate. Candidates are
 * deterministic, compiled ahead of time and need at most max_workspace bytes; *workspace_bytes
 * is the largest of theirs (a timed first run may add mode B's candidates, within it). timed:
 * the first run may time the candidates on the call's own tensors, so it must be free to
 * overwrite the output, and an engine the cache remembers for the shape is the only candidate;
 * otherwise the heuristics' first runs. */
umt_status umt_cuda_conv_engines_make(cudnnHandle_t handle, const umt_conv_shape *s, umt_conv_direction direction,
                                      bool accumulate, bool timed, size_t max_workspace, umt_conv_engines **out,
                                      size_t *workspace_bytes);
/* Runs the direction on x, w, y (backward data: dx, w, dy; backward filter: x, dw, dy; each
 * 16-byte aligned) with a workspace of at least *workspace_bytes. The first run picks the
 * engine that every later run uses. */
umt_status umt_cuda_conv_engines_run(umt_conv_engines *e, const void *x, const void *w, const void *y,
                                     void *workspace);
/* Destroys the set and its cuDNN descriptors (NULL is allowed). */
void umt_cuda_conv_engines_free(umt_conv_engines *e);

#endif /* UMT_KERNELS_CUDA_CONV_ENGINES_H */
