/*
 * kernels/cuda/scratch.h — the device scratch of one context's kernels (CUDA sources only).
 *
 * Several kernels add up in two passes: the blocks of a first kernel write partial sums, a
 * second kernel adds them in a fixed order (the same bits on every run, no float atomics). The
 * losses also keep a label report and a verdict between their kernels (loss.cu). Each context
 * has its own copy of all of them, carved by backend.cu from one block of the context's
 * workspace pool, so that two contexts running at once on two streams never write each other's
 * partials. Within a context the kernels of one call run in order on its stream, so one copy
 * per context serves every call; each kernel file keeps its own region, as each had its own
 * buffer when they were module globals (a launch moved to another stream, umt_cuda_launch_on,
 * then never shares a region with the compute stream's kernels of another file).
 */
#ifndef UMT_KERNELS_CUDA_SCRATCH_H
#define UMT_KERNELS_CUDA_SCRATCH_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "umtrain.h"

/* The regions' sizes in elements (or bytes for the label slots). */
enum {
    UMT_LOSS_PARTIALS = 1024,             /* loss.cu: doubles, one per block of a loss */
    UMT_LABEL_SLOT_BYTES = 64,            /* loss.cu: the label report, and the verdict */
    UMT_FUSED_PARTIALS = 1 << 16,         /* fused.cu: row partials (floats) and plane partials (doubles) */
    UMT_LOWP_ROW_CHUNKS = 128,            /* lowp.cu: row chunks of the chunked bias sums ... */
    UMT_LOWP_MAX_CHUNKED_COLUMNS = 1024,  /* ... of at most this many columns (floats) */
    UMT_BIAS_PARTIALS = 1 << 16           /* conv.cu: doubles, the per-channel bias sums */
};

/* Where each region of a context's scratch lies (device memory). */
typedef struct {
    double *loss_partials;
    void *label_report;
    void *label_verdict;
    float *fused_row_partials;
    double *fused_plane_partials;
    float *lowp_row_chunk_partials;
    double *bias_partials;
} umt_cuda_scratch;

#ifdef __cplusplus
extern "C" {
#endif

/* The scratch of the context bound to the calling thread (backend.cu: umt_cuda_bind); with none
 * bound, UMT_ERR_STATE naming op. */
umt_status umt_cuda_scratch_get(const char *op, const umt_cuda_scratch **out);
/* loss.cu: writes the label report's and verdict's "nothing found" values into a new scratch,
 * queued on stream. */
umt_status umt_cuda_label_scratch_clear(const umt_cuda_scratch *scratch, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CUDA_SCRATCH_H */
