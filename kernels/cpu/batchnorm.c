/*
 * kernels/cpu/batchnorm.c — spatial batch normalisation (PyTorch's BatchNorm2d, also its
 * BatchNorm1d with hw = 1): training forward, evaluation forward and backward.
 *
 * x is [n, c, hw]: channel ch has m = n*hw values, at x[(img*c + ch)*hw + i]. Training
 * normalises each channel with its batch mean and biased variance (divided by m):
 *
 *     inv_std = 1 / sqrt(var + eps)            saved for backward, with the mean
 *     y       = (x - mean) * inv_std * gamma + beta
 *     running_mean = (1 - momentum) * running_mean + momentum * mean
 *     running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
 *
 * The running variance takes the unbiased estimate, as PyTorch does. With m = 1 it is
 * undefined (PyTorch refuses to train on it); here the biased var (0) is used instead, so one
 * value per channel trains without a division by zero. Evaluation normalises with the running
 * statistics. Sums are taken in double (two passes for the variance, so that a large mean
 * does not cancel its digits away); y is formed in float from the float mean and inv_std that
 * backward will read, so forward and backward see the same normalisation.
 */
#include <math.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

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

/* y[ch] = (x[ch] - mean) * inv_std * gamma + beta over one channel's n planes of hw values. */
static void normalise_channel(const float *x, float *y, int64_t n, int64_t c, int64_t hw, int64_t ch, float mean,
                              float inv_std, float gamma, float beta) {
    for (int64_t img = 0; img < n; img++) {
        const float *x_plane = x + (img * c + ch) * hw;
        float *y_plane = y + (img * c + ch) * hw;
        for (int64_t i = 0; i < hw; i++) y_plane[i] = (x_plane[i] - mean) * inv_std * gamma + beta;
    }
}

/* One channel's mean and biased variance, in double. */
static void channel_moments(const float *x, int64_t n, int64_t c, int64_t hw, int64_t ch, double *mean,
                            double *var) {
    double m = (double)(n * hw), sum = 0.0, squares = 0.0;
    for (int64_t img = 0; img < n; img++) {
        const float *plane = x + (img * c + ch) * hw;
        for (int64_t i = 0; i < hw; i++) sum += plane[i];
    }
    *mean = sum / m;
    for (int64_t img = 0; img < n; img++) {
        const float *plane = x + (img * c + ch) * hw;
        for (int64_t i = 0; i < hw; i++) squares += ((double)plane[i] - *mean) * ((double)plane[i] - *mean);
    }
    *var = squares / m;
}

umt_status umt_cpu_batchnorm_forward_train(const float *x, const float *gamma, const float *beta, float *y,
                                           float *running_mean, float *running_var, float *save_mean,
                                           float *save_inv_std, int64_t n, int64_t c, int64_t hw, float momentum,
                                           float eps) {
    UMT_TRY(check_sizes("batchnorm_forward_train", n, c, hw));
    UMT_TRY(check_eps("batchnorm_forward_train", eps));
    if (!(momentum >= 0.0f && momentum <= 1.0f)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "batchnorm_forward_train: momentum = %g, expected 0 <= momentum <= 1",
                        (double)momentum);
    }
    int64_t m = n * hw;
    for (int64_t ch = 0; ch < c; ch++) {
        double mean, var;
        channel_moments(x, n, c, hw, ch, &mean, &var);
        save_mean[ch] = (float)mean;
        save_inv_std[ch] = (float)(1.0 / sqrt(var + (double)eps));
        normalise_channel(x, y, n, c, hw, ch, save_mean[ch], save_inv_std[ch], gamma[ch], beta[ch]);

        double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
        running_mean[ch] = (float)((1.0 - momentum) * running_mean[ch] + momentum * mean);
        running_var[ch] = (float)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
    return UMT_OK;
}

umt_status umt_cpu_batchnorm_forward_eval(const float *x, const float *gamma, const float *beta,
                                          const float *running_mean, const float *running_var, float *y, int64_t n,
                                          int64_t c, int64_t hw, float eps) {
    UMT_TRY(check_sizes("batchnorm_forward_eval", n, c, hw));
    UMT_TRY(check_eps("batchnorm_forward_eval", eps));
    for (int64_t ch = 0; ch < c; ch++) {
        float inv_std = (float)(1.0 / sqrt((double)running_var[ch] + (double)eps));
        normalise_channel(x, y, n, c, hw, ch, running_mean[ch], inv_std, gamma[ch], beta[ch]);
    }
    return UMT_OK;
}

/*
 * With xhat = (x - mean) * inv_std, the gradient through the batch statistics is
 *     dx = gamma * inv_std / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
 * summed per channel; dgamma = sum(dy * xhat), dbeta = sum(dy). A NULL dx, dgamma or dbeta is
 * a gradient nobody asked for (the ops pass NULL for an input that needs none): skipped.
 */
umt_status umt_cpu_batchnorm_backward(const float *x, const float *dy, const float *gamma, const float *save_mean,
                                      const float *save_inv_std, float *dx, float *dgamma, float *dbeta, int64_t n,
                                      int64_t c, int64_t hw) {
    UMT_TRY(check_sizes("batchnorm_backward", n, c, hw));
    double m = (double)(n * hw);
    for (int64_t ch = 0; ch < c; ch++) {
        double mean = save_mean[ch], inv_std = save_inv_std[ch], sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t img = 0; img < n; img++) {
            const float *x_plane = x + (img * c + ch) * hw, *dy_plane = dy + (img * c + ch) * hw;
            for (int64_t i = 0; i < hw; i++) {
                sum_dy += dy_plane[i];
                sum_dy_xhat += dy_plane[i] * ((x_plane[i] - mean) * inv_std);
            }
        }
        if (dbeta) dbeta[ch] = (float)(dbeta[ch] + sum_dy);
        if (dgamma) dgamma[ch] = (float)(dgamma[ch] + sum_dy_xhat);
        if (!dx) continue;
        double scale = gamma[ch] * inv_std / m;
        for (int64_t img = 0; img < n; img++) {
            const float *x_plane = x + (img * c + ch) * hw, *dy_plane = dy + (img * c + ch) * hw;
            float *dx_plane = dx + (img * c + ch) * hw;
            for (int64_t i = 0; i < hw; i++) {
                double xhat = (x_plane[i] - mean) * inv_std;
                dx_plane[i] = (float)(dx_plane[i] + scale * (m * dy_plane[i] - sum_dy - xhat * sum_dy_xhat));
            }
        }
    }
    return UMT_OK;
}
