/* memory/placement.c — the system and CUDA allocators behind each placement, and advice. */
#include "memory/placement.h"

#include <stdlib.h>

#include "core/base/error.h"

#ifdef UMT_WITH_CUDA
#include "core/base/capture_lock.h"
#include "core/base/cuda_check.h"
#endif

static umt_status host_alloc(size_t bytes, size_t align, void **out) {
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t rounded = (bytes + align - 1) / align * align;
    *out = aligned_alloc(align, rounded);
    return *out ? UMT_OK : umt_fail(UMT_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
}

#ifdef UMT_WITH_CUDA

/* CUDA's allocators align to at least 256 bytes (UMT_POOL_ALIGN), so align needs no work. Under the
 * capture lock: another thread's stream capture would not survive them (core/base/capture_lock.h). */
static umt_status cuda_alloc_unlocked(umt_placement placement, size_t bytes, void **out) {
    switch (placement) {
    case UMT_PLACE_MANAGED: UMT_CUDA_TRY(cudaMallocManaged(out, bytes, cudaMemAttachGlobal)); return UMT_OK;
    case UMT_PLACE_DEVICE: UMT_CUDA_TRY(cudaMalloc(out, bytes)); return UMT_OK;
    case UMT_PLACE_PINNED: UMT_CUDA_TRY(cudaHostAlloc(out, bytes, cudaHostAllocDefault)); return UMT_OK;
    case UMT_PLACE_HOST: break;
    }
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "placement %s is not a CUDA placement", umt_placement_name(placement));
}

static umt_status cuda_alloc(umt_placement placement, size_t bytes, void **out) {
    umt_capture_lock();
    umt_status st = cuda_alloc_unlocked(placement, bytes, out);
    umt_capture_unlock();
    return st;
}

static umt_status advise_unlocked(void *ptr, size_t bytes, unsigned advice, bool prefetch, int cuda_device,
                                  void *stream) {
    struct cudaMemLocation gpu = {.type = cudaMemLocationTypeDevice, .id = cuda_device};
    struct cudaMemLocation cpu = {.type = cudaMemLocationTypeHost, .id = 0};
    if (advice & UMT_ADVISE_PREFER_GPU) UMT_CUDA_TRY(cudaMemAdvise(ptr, bytes, cudaMemAdviseSetPreferredLocation, gpu));
    if (advice & UMT_ADVISE_CPU_READS) UMT_CUDA_TRY(cudaMemAdvise(ptr, bytes, cudaMemAdviseSetAccessedBy, cpu));
    if (advice & UMT_ADVISE_READ_MOSTLY) UMT_CUDA_TRY(cudaMemAdvise(ptr, bytes, cudaMemAdviseSetReadMostly, gpu));
    if (prefetch) UMT_CUDA_TRY(cudaMemPrefetchAsync(ptr, bytes, gpu, 0, (cudaStream_t)stream));
    return UMT_OK;
}

umt_status umt_placement_advise(void *ptr, size_t bytes, unsigned advice, bool prefetch, int cuda_device,
                                void *stream) {
    umt_capture_lock();
    umt_status st = advise_unlocked(ptr, bytes, advice, prefetch, cuda_device, stream);
    umt_capture_unlock();
    return st;
}

#else

static umt_status cuda_alloc(umt_placement placement, size_t bytes, void **out) {
    (void)out;
    return umt_fail(UMT_ERR_UNSUPPORTED, "%zu bytes of %s memory: this build has no CUDA (build with --config=cuda)",
                    bytes, umt_placement_name(placement));
}

umt_status umt_placement_advise(void *ptr, size_t bytes, unsigned advice, bool prefetch, int cuda_device,
                                void *stream) {
    (void)ptr, (void)advice, (void)prefetch, (void)cuda_device, (void)stream;
    return umt_fail(UMT_ERR_UNSUPPORTED, "advice for %zu bytes: this build has no CUDA", bytes);
}

#endif

umt_status umt_placement_alloc(umt_placement placement, size_t bytes, size_t align, void **out) {
    *out = NULL;
    return placement == UMT_PLACE_HOST ? host_alloc(bytes, align, out) : cuda_alloc(placement, bytes, out);
}

void umt_placement_free(umt_placement placement, void *ptr) {
    if (!ptr) return;
#ifdef UMT_WITH_CUDA
    /* Errors on free are not recoverable and leave nothing to undo: they are ignored. Both
     * synchronize the device: not while another thread captures (core/base/capture_lock.h). */
    umt_capture_lock();
    if (placement == UMT_PLACE_MANAGED || placement == UMT_PLACE_DEVICE) cudaFree(ptr);
    if (placement == UMT_PLACE_PINNED) cudaFreeHost(ptr);
    umt_capture_unlock();
#endif
    if (placement == UMT_PLACE_HOST) free(ptr);
}
