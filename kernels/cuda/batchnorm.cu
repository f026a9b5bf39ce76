/*
 * kernels/cuda/batchnorm.cu — spatial batch normalisation over x [n, c, hw]: training and
 * evaluation forwards on cuDNN, backward our own (kernels/cpu/batchnorm.c is the reference).
 *
 * Forwards: cudnnBatchNormalizationForwardTraining and ForwardInference in
 * CUDNN_BATCHNORM_SPATIAL mode, x seen as [n, c, hw, 1]. cuDNN's exponentialAverageFactor is
 * our momentum, its saved mean and inverse standard deviation are save_mean and save_inv_std,
 * and its running variance takes the unbiased batch variance, as the CPU and PyTorch do. With a
 * single value per channel (n*hw = 1) that variance would divide by m - 1 = 0; the CPU then uses
 * the biased variance (0), so there cuDNN is not given the running statistics and a kernel here
 * moves them instead. Descriptors are made and destroyed per call: host-only, and cheaper than a
 * cache to keep right.
 *
 * Backward is ours, for two reasons: the slot's dx, dgamma and dbeta may each be NULL (a gradient
 * nobody asked for), which cuDNN's backward cannot skip; and it needs no epsilon, which cuDNN's
 * asks for and the slot does not carry. One block per channel sums dy and dy * xhat in double,
 * in a fixed order (deterministic, like the CPU's double sums), then forms that channel's dx.
 * All three gradients accumulate.
 */
#include <limits.h>
#include <math.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_handle.h"
#include "kernels/cuda/launch.h"

/* BN_THREADS must be a power of two (block_sum halves it). */
enum { BN_THREADS = 512 };

/* ------------------------------------------------------------------------------------------ */
/* Checks (the CPU's, in its words, then cuDNN's limits)                                       */

static umt_status check_sizes(const char *op, int64_t n, int64_t c, int64_t hw) {
    if (n < 1 || c < 1 || hw < 1) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n=%lld c=%lld hw=%lld, expected all >= 1", op, (long long)n,
                        (long long)c, (long long)hw);
    }
    return UMT_OK;
}

static umt_status check_eps(const char *op, float eps) {
    if (!(eps >= 0.0f && eps < INFINITY)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: eps = %g, expected a finite eps >= 0", op, (double)eps);
    }
    return UMT_OK;
}

/* cuDNN's descriptors take int sizes and strides, and need the backend's handle. */
static umt_status check_cudnn(const char *op, int64_t n, int64_t c, int64_t hw) {
    double numel = (double)n * c * hw;
    if (numel > INT_MAX) {
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: x of %.0f elements; cuDNN takes at most INT_MAX", op, numel);
    }
    if (!umt_cuda_cudnn_handle()) return umt_fail(UMT_ERR_STATE, "%s: the cuda backend is not started", op);
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Forwards (cuDNN)                                                                            */

typedef struct {
    cudnnTensorDescriptor_t x;       /* x and y: [n, c, hw, 1] */
    cudnnTensorDescriptor_t channel; /* gamma, beta and the statistics: [1, c, 1, 1] */
} bn_descriptors;

static umt_status describe(bn_descriptors *d, int64_t n, int64_t c, int64_t hw) {
    UMT_CUDNN_TRY(cudnnCreateTensorDescriptor(&d->x));
    UMT_CUDNN_TRY(cudnnCreateTensorDescriptor(&d->channel));
    UMT_CUDNN_TRY(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)n, (int)c, (int)hw, 1));
    UMT_CUDNN_TRY(cudnnDeriveBNTensorDescriptor(d->channel, d->x, CUDNN_BATCHNORM_SPATIAL));
    return UMT_OK;
}

static void release(bn_descriptors *d) {
    if (d->x) cudnnDestroyTensorDescriptor(d->x);
    if (d->channel) cudnnDestroyTensorDescriptor(d->channel);
}

/* y = x normalised (blend factors 1 and 0: y is not read). */
static umt_status train(const bn_descriptors *d, const float *x, const float *gamma, const float *beta, float *y,
                        float *running_mean, float *running_var, float *save_mean, float *save_inv_std,
                        float momentum, float eps) {
    const float one = 1.0f, zero = 0.0f;
    UMT_CUDNN_TRY(cudnnBatchNormalizationForwardTraining(umt_cuda_cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, &one,
                                                         &zero, d->x, x, d->x, y, d->channel, gamma, beta, momentum,
                                                         running_mean, running_var, eps, save_mean, save_inv_std));
    return UMT_OK;
}

static umt_status evaluate(const bn_descriptors *d, const float *x, const float *gamma, const float *beta,
                           const float *running_mean, const float *running_var, float *y, float eps) {
    const float one = 1.0f, zero = 0.0f;
    UMT_CUDNN_TRY(cudnnBatchNormalizationForwardInference(umt_cuda_cudnn_handle(), CUDNN_BATCHNORM_SPATIAL, &one,
                                                          &zero, d->x, x, d->x, y, d->channel, gamma, beta,
                                                          running_mean, running_var, eps));
    return UMT_OK;
}

/* One value per channel: the batch mean is that value and the variance 0 (the CPU's rule). */
static __global__ void move_running_single_kernel(const float *save_mean, float *running_mean, float *running_var,
                                                  int64_t c, float momentum) {
    FOR_EACH_INDEX(ch, c) {
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * (double)save_mean[ch]);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch]);
    }
}

extern "C" umt_status umt_cuda_batchnorm_forward_train(const float *x, const float *gamma, const float *beta,
                                                       float *y, float *running_mean, float *running_var,
                                                       float *save_mean, float *save_inv_std, int64_t n, int64_t c,
                                                       int64_t hw, float momentum, float eps) {
    const char *op = "batchnorm_forward_train";
    UMT_TRY(check_sizes(op, n, c, hw));
    UMT_TRY(check_eps(op, eps));
    if (!(momentum >= 0.0f && momentum <= 1.0f)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: momentum = %g, expected 0 <= momentum <= 1", op,
                        (double)momentum);
    }
    UMT_TRY(check_cudnn(op, n, c, hw));
    bool single = n * hw == 1;
    bn_descriptors d = {NULL, NULL};
    umt_status status = describe(&d, n, c, hw);
    /* cuDNN takes both running pointers or neither. */
    if (status == UMT_OK) {
        status = train(&d, x, gamma, beta, y, single ? NULL : running_mean, single ? NULL : running_var, save_mean,
                       save_inv_std, momentum, eps);
    }
    release(&d);
    UMT_TRY(status);
    if (single) {
        move_running_single_kernel<<<blocks_for(c), THREADS, 0, umt_cuda_stream()>>>(save_mean, running_mean,
                                                                                     running_var, c, momentum);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

extern "C" umt_status umt_cuda_batchnorm_forward_eval(const float *x, const float *gamma, const float *beta,
                                                      const float *running_mean, const float *running_var, float *y,
                                                      int64_t n, int64_t c, int64_t hw, float eps) {
    const char *op = "batchnorm_forward_eval";
    UMT_TRY(check_sizes(op, n, c, hw));
    UMT_TRY(check_eps(op, eps));
    UMT_TRY(check_cudnn(op, n, c, hw));
    bn_descriptors d = {NULL, NULL};
    umt_status status = describe(&d, n, c, hw);
    if (status == UMT_OK) status = evaluate(&d, x, gamma, beta, running_mean, running_var, y, eps);
    release(&d);
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Backward (ours)                                                                             */

/* The sum of v over the block's BN_THREADS threads, returned to every thread: a fixed tree over
 * shared memory, so the result does not depend on thread timing. */
static __device__ double block_sum(double v) {
    __shared__ double partial[BN_THREADS];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (int half = BN_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    double total = partial[0];
    /* The next call overwrites partial. */
    __syncthreads();
    return total;
}

/*
 * With xhat = (x - mean) * inv_std and m = n*hw values per channel:
 *     dx += gamma * inv_std / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
 *     dgamma += sum(dy * xhat), dbeta += sum(dy)
 * in double, as on the CPU. Element e of a channel is image e / hw, pixel e % hw.
 */
static __global__ void batchnorm_backward_kernel(const float *x, const float *dy, const float *gamma,
                                                 const float *save_mean, const float *save_inv_std, float *dx,
                                                 float *dgamma, float *dbeta, int64_t n, int64_t c, int64_t hw) {
    int64_t m = n * hw;
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double mean = save_mean[ch], inv_std = save_inv_std[ch], sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += BN_THREADS) {
            int64_t at = ((e / hw) * c + ch) * hw + e % hw;
            sum_dy += dy[at];
            sum_dy_xhat += dy[at] * ((x[at] - mean) * inv_std);
        }
        sum_dy = block_sum(sum_dy);
        sum_dy_xhat = block_sum(sum_dy_xhat);
        if (threadIdx.x == 0 && dbeta) dbeta[ch] = (float)(dbeta[ch] + sum_dy);
        if (threadIdx.x == 0 && dgamma) dgamma[ch] = (float)(dgamma[ch] + sum_dy_xhat);
        if (!dx) continue;
        double scale = gamma[ch] * inv_std / (double)m;
        for (int64_t e = threadIdx.x; e < m; e += BN_THREADS) {
            int64_t at = ((e / hw) * c + ch) * hw + e % hw;
            double xhat = (x[at] - mean) * inv_std;
            dx[at] = (float)(dx[at] + scale * ((double)m * dy[at] - sum_dy - xhat * sum_dy_xhat));
        }
    }
}

extern "C" umt_status umt_cuda_batchnorm_backward(const float *x, const float *dy, const float *gamma,
                                                  const float *save_mean, const float *save_inv_std, float *dx,
                                                  float *dgamma, float *dbeta, int64_t n, int64_t c, int64_t hw) {
    UMT_TRY(check_sizes("batchnorm_backward", n, c, hw));
    if (!dx && !dgamma && !dbeta) return UMT_OK;
    unsigned int blocks = c < MAX_BLOCKS ? (unsigned int)c : (unsigned int)MAX_BLOCKS;
    batchnorm_backward_kernel<<<blocks, BN_THREADS, 0, umt_cuda_stream()>>>(x, dy, gamma, save_mean, save_inv_std,
                                                                            dx, dgamma, dbeta, n, c, hw);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}
