/* tests/gpu/kernel_twins.c — the kernel tests' shared harness (kernel_twins.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/gpu/kernel_twins.h"

enum { CUBLAS_WORKSPACE_BYTES = 32 << 20 };

const umt_backend *cpu, *gpu;
uint32_t run_seed;
bool on_device;
static uint32_t rng_state;
static void *cublas_workspace, *scratch;
static umt_cuda_state *backend_state;
static void **host_blocks, **device_blocks;
static size_t host_count, device_count;

/* ------------------------------------------------------------------------------------------ */
/* The run and each test                                                                       */

void choose_run_seed(void) {
    const char *fixed = getenv("UMT_TEST_SEED");
    run_seed = fixed ? (uint32_t)strtoul(fixed, NULL, 10) : (uint32_t)time(NULL) ^ (uint32_t)getpid();
    print_message("seed %u (UMT_TEST_SEED=%u repeats this run)\n", run_seed, run_seed);
    cpu = umt_cpu_backend();
    gpu = umt_cuda_backend();
}

int start_backends(void **state) {
    (void)state;
    choose_run_seed();
    /* Engine choices on disk (kernels/engine_cache.h) stay out of the kernel tests unless a test,
     * or the caller, names a file: each run times its own. */
    setenv("UMT_CONV_CACHE", "0", 0);
    if (cudaMalloc(&cublas_workspace, CUBLAS_WORKSPACE_BYTES) != cudaSuccess) return -1;
    if (cudaMalloc(&scratch, umt_cuda_scratch_bytes()) != cudaSuccess) return -1;
    return restart_backends();
}

int restart_backends(void) {
    umt_cuda_state_destroy(backend_state);
    backend_state = NULL;
    if (umt_cuda_state_create(0, cublas_workspace, CUBLAS_WORKSPACE_BYTES, false, scratch, umt_cuda_scratch_bytes(),
                              &backend_state) != UMT_OK) {
        print_message("umt_cuda_state_create: %s\n", umt_last_error());
        return -1;
    }
    return 0;
}

umt_cuda_state *twin_backend_state(void) { return backend_state; }

int stop_backends(void **state) {
    (void)state;
    umt_cuda_state_destroy(backend_state);
    backend_state = NULL;
    cudaFree(scratch);
    cudaFree(cublas_workspace);
    free(host_blocks);
    free(device_blocks);
    return 0;
}

int seed_next_test(void **state) {
    static uint32_t test_index;
    (void)state;
    rng_state = run_seed ^ (++test_index * 0x9e3779b9u);
    if (!rng_state) rng_state = 1u;
    return 0;
}

int release_buffers(void **state) {
    (void)state;
    for (size_t i = 0; i < host_count; i++) free(host_blocks[i]);
    for (size_t i = 0; i < device_count; i++) cudaFree(device_blocks[i]);
    host_count = device_count = 0;
    return 0;
}

uint32_t random_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(random_u32() >> 8) / (float)(1u << 24); }

/* ------------------------------------------------------------------------------------------ */
/* Buffers                                                                                     */

/* Adds p to a list of blocks for release_buffers. */
static void remember(void ***blocks, size_t *count, void *p) {
    void **grown = realloc(*blocks, (*count + 1) * sizeof *grown);
    assert_non_null(p);
    assert_non_null(grown);
    *blocks = grown;
    grown[(*count)++] = p;
}

void *host_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    remember(&host_blocks, &host_count, p);
    return p;
}

void *device_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    remember(&device_blocks, &device_count, p);
    return p;
}

void *to_device(const void *host, size_t bytes) {
    void *p = device_alloc(bytes);
    CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    /* A pageable upload may still be in flight on return; the backend's stream must not race it. */
    CUDA_OK(cudaDeviceSynchronize());
    return p;
}

void *from_device(const void *device, size_t bytes) {
    void *copy = host_alloc(bytes);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(copy, device, bytes, cudaMemcpyDeviceToHost));
    return copy;
}

float *absolute(const float *v, int64_t n) {
    float *out = host_alloc((size_t)n * sizeof *out);
    for (int64_t i = 0; i < n; i++) out[i] = fabsf(v[i]);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* Twins                                                                                       */

twin twin_of(const void *values, size_t bytes) {
    twin t = {host_alloc(bytes), NULL, bytes};
    memcpy(t.host, values, bytes);
    t.device = to_device(values, bytes);
    return t;
}

twin twin_poisoned(size_t bytes) {
    void *poison = host_alloc(bytes);
    memset(poison, 0xff, bytes);
    return twin_of(poison, bytes);
}

twin twin_random(int64_t n, float lo, float hi) {
    float *values = host_alloc((size_t)n * sizeof *values);
    for (int64_t i = 0; i < n; i++) values[i] = uniform(lo, hi);
    return twin_of(values, (size_t)n * sizeof *values);
}

void *downloaded(twin t) { return from_device(t.device, t.bytes); }
