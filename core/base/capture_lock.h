/*
 * core/base/capture_lock.h — one lock per process between stream captures and the CUDA calls that
 * a capture in another thread cannot survive.
 *
 * Several contexts may train at once on threads of their own (include/umtrain.h), and each may
 * capture its step into a CUDA graph (core/step/step_graph.c). A capture in thread-local mode is
 * safe from another thread's kernel launches and copies on its own stream, but not from calls
 * that act on the whole device: cudaFree and cudaFreeHost synchronize it, and allocating,
 * advising or creating a stream or a library handle may too. One of those in any thread while a
 * capture runs ends that capture with an error. So the capture (begin to instantiation) and
 * those calls (memory/placement.c, the CUDA backend's state, kernels/cuda/backend.cu) take this
 * lock: a capture waits for an allocation, an allocation for a capture, each a few milliseconds.
 * It is recursive: a capture that allocates (it should not) takes it again instead of waiting
 * for itself, and fails as it would alone.
 */
#ifndef UMT_CORE_BASE_CAPTURE_LOCK_H
#define UMT_CORE_BASE_CAPTURE_LOCK_H

#ifdef __cplusplus
extern "C" {
#endif

void umt_capture_lock(void);
void umt_capture_unlock(void);

#ifdef __cplusplus
}
#endif

#endif /* UMT_CORE_BASE_CAPTURE_LOCK_H */
