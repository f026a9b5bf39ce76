/*
 * kernels/cpu/dropout.c — inverted dropout, forward and backward.
 *
 * Element i is kept when umt_dropout_keep(seed, first + i, p) (kernels/backend.h): a hash of the seed
 * and the element's index in the whole batch (first: where a micro-batch starts in it),
 * not a stream of random numbers, so the CUDA kernels keep exactly the same elements whatever
 * order their threads run in. Kept elements are scaled by 1/(1-p), so the expected output
 * equals the input and evaluation needs no rescaling. The scale is computed once as
 * 1.0f / (1.0f - p) in float, as the CUDA kernels do, so both backends round alike.
 * A dropped element is written as 0, not as x * 0: a NaN or infinite input that is dropped
 * does not reach the output (PyTorch, multiplying by the mask, would give NaN there).
 */
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"

/* p in [0, 1) (a NaN fails too: p = 1 would divide by zero, and drop everything anyway). */
static umt_status check_dropout(const char *op, int64_t n, float p) {
    if (!(p >= 0.0f && p < 1.0f)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g, expected 0 <= p < 1", op, (double)p);
    }
    if (n < 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n = %lld, expected n >= 0", op, (long long)n);
    return UMT_OK;
}

typedef struct {
    const float *x;
    float *y;
    uint8_t *mask;
    int64_t first;
    float p, scale;
    uint64_t seed;
} dropout_job;

/* Elements [begin, end): each one's draw depends on its index alone, so any thread may do it. */
static void dropout_elements(void *arg, int64_t begin, int64_t end) {
    const dropout_job *job = arg;
    for (int64_t i = begin; i < end; i++) {
        bool keep = umt_dropout_keep(job->seed, (uint64_t)(job->first + i), job->p);
        if (job->mask) job->mask[i] = keep ? 1 : 0;
        job->y[i] = keep ? job->x[i] * job->scale : 0.0f;
    }
}

umt_status umt_cpu_dropout_forward(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first, float p,
                                   uint64_t seed, const uint64_t *seed_on_device) {
    UMT_TRY(check_dropout("dropout_forward", n, p));
    if (first < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "dropout_forward: first = %lld, expected >= 0", (long long)first);
    if (seed_on_device) seed = *seed_on_device;
    /* p = 0 gives scale 1 and keeps every element: y = x exactly. */
    dropout_job job = {x, y, mask, first, p, 1.0f / (1.0f - p), seed};
    umt_cpu_parallel_range(n, 1 << 14, dropout_elements, &job);
    return UMT_OK;
}

umt_status umt_cpu_dropout_backward(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p) {
    UMT_TRY(check_dropout("dropout_backward", n, p));
    float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++) {
        if (mask[i]) dx[i] += dy[i] * scale;
    }
    return UMT_OK;
}
