/*
 * tests/gpu/kernel_twins.h — what the kernel tests share (test_cuda_kernels, test_cuda_cnn_kernels,
 * test_cuda_lowp): both backend tables started once per run; a seeded random stream that each test
 * restarts from its own position, so that UMT_TEST_SEED=<seed> repeats a run and a test's numbers
 * do not depend on the tests before it; buffers on the host and the device, freed after each test;
 * and twins, one buffer with the same bytes on both sides, run through both tables by BOTH.
 *
 * A test file includes cmocka first (this header uses its fail_msg and asserts), then this.
 */
#ifndef UMT_TESTS_GPU_KERNEL_TWINS_H
#define UMT_TESTS_GPU_KERNEL_TWINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "umtrain.h"

#define CUDA_OK(call)                                                                                              \
    do {                                                                                                           \
        cudaError_t error_ = (call);                                                                               \
        if (error_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(error_));                          \
    } while (0)

#define EXPECT_OK(call)                                                                                            \
    do {                                                                                                           \
        if ((call) != UMT_OK) fail_msg("%s failed: %s", #call, umt_last_error());                                  \
    } while (0)

extern const umt_backend *cpu, *gpu;
extern uint32_t run_seed;

/* The run's seed (printed) and both tables, not started: a test that starts CUDA through a
 * context calls this once, then seed_next_test and release_buffers around each test. */
void choose_run_seed(void);
/* The group's setup (choose_run_seed, the CUDA table started with cuBLAS's workspace, the
 * engine cache off unless UMT_CONV_CACHE names a file) and teardown. */
int start_backends(void **state);
int stop_backends(void **state);
/* The CUDA state made again (fresh convolution plans, a clear label report); 0 or -1. */
int restart_backends(void);
/* The state start_backends made (the tests' kernels run on it). */
umt_cuda_state *twin_backend_state(void);
/* Each test's setup (its place in the random stream) and teardown (its buffers freed). */
int seed_next_test(void **state);
int release_buffers(void **state);
#define TEST(f) cmocka_unit_test_setup_teardown(f, seed_next_test, release_buffers)

uint32_t random_u32(void); /* xorshift32 */
float uniform(float lo, float hi);

/* Buffers freed by release_buffers. */
void *host_alloc(size_t bytes);
void *device_alloc(size_t bytes);
/* A device copy of bytes at host, uploaded before it returns. */
void *to_device(const void *host, size_t bytes);
/* A host copy of bytes at device, once all queued work (on any stream) has finished. */
void *from_device(const void *device, size_t bytes);
/* A host copy of the n floats at v, made positive: the scales of error bounds are built from these. */
float *absolute(const float *v, int64_t n);

/* One buffer with the same bytes on the host (the CPU's run) and the device (CUDA's). */
typedef struct {
    void *host, *device;
    size_t bytes;
} twin;

twin twin_of(const void *values, size_t bytes);
twin twin_poisoned(size_t bytes); /* 0xFF bytes: NaN for floats, -1 for integers */
twin twin_random(int64_t n, float lo, float hi);
void *downloaded(twin t); /* from_device of the device side */

/* BOTH(slot(args)) runs the f32 reference slot (kernels/backend.h: the group both tables fill)
 * through the CPU table with every P(twin) in args naming the host side, then through the CUDA
 * table with P naming the device side; both must succeed.
 * F and L name the host side as float and int32 (the CPU's inputs and results). */
extern bool on_device;
#define P(t) ((void *)(on_device ? (t).device : (t).host))
#define F(t) ((float *)(t).host)
#define L(t) ((int32_t *)(t).host)
#define BOTH(call)                                                                                                 \
    do {                                                                                                           \
        on_device = false;                                                                                         \
        EXPECT_OK(cpu->f32.call);                                                                                  \
        on_device = true;                                                                                          \
        EXPECT_OK(gpu->f32.call);                                                                                  \
    } while (0)

/* Runs call through both tables (P picking the side): both must fail with status and the same
 * message. Deferred: the losses, whose device check is deferred; the GPU call queues without
 * waiting, and the CPU's failure comes from the next host wait instead, reported once. */
#define SAME_FAILURE_OF(deferred, status, call)                                                                    \
    do {                                                                                                           \
        char cpu_message_[512];                                                                                    \
        on_device = false;                                                                                         \
        assert_int_equal(cpu->f32.call, status);                                                                   \
        snprintf(cpu_message_, sizeof cpu_message_, "%s", umt_last_error());                                       \
        on_device = true;                                                                                          \
        assert_int_equal(gpu->f32.call, (deferred) ? UMT_OK : (status));                                           \
        if (deferred) assert_int_equal(umt_cuda_synchronize(), status);                                            \
        assert_string_equal(umt_last_error(), cpu_message_);                                                       \
        if (deferred) assert_int_equal(umt_cuda_synchronize(), UMT_OK);                                            \
    } while (0)
#define SAME_FAILURE(status, call) SAME_FAILURE_OF(false, status, call)
#define SAME_DEFERRED_FAILURE(status, call) SAME_FAILURE_OF(true, status, call)

#endif /* UMT_TESTS_GPU_KERNEL_TWINS_H */
