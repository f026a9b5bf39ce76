/*
 * kernels/cpu/loss.c — mean, log-softmax, negative log-likelihood, softmax cross-entropy and
 * accuracy counting, each next to its backward.
 *
 * Scores are [rows, cols] row-major, one row per sample; labels are class indices in
 * [0, cols). Softmaxes subtract the row maximum before exp, so logits of any size stay finite.
 * Sums are accumulated in double: it costs nothing at these sizes and keeps the loss of a
 * large batch accurate to float precision.
 */
#include <math.h>

#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

/* Every label must name a column: anything else would read outside the row. */
static umt_status check_labels(const char *op, const int32_t *labels, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        if (labels[r] < 0 || labels[r] >= cols) {
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: row %lld has label %d, expected 0 <= label < %lld", op,
                            (long long)r, (int)labels[r], (long long)cols);
        }
    }
    return UMT_OK;
}

static float row_max(const float *x, int64_t cols) {
    float max = -INFINITY;
    for (int64_t c = 0; c < cols; c++) {
        if (x[c] > max) max = x[c];
    }
    return max;
}

/* log(sum_c exp(x[c] - max)): the row's log-sum-exp less its maximum, never overflowing. */
static double shifted_log_sum_exp(const float *x, int64_t cols, float max) {
    double sum = 0.0;
    for (int64_t c = 0; c < cols; c++) sum += exp((double)x[c] - max);
    return log(sum);
}

umt_status umt_cpu_mean(const float *x, float *out, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    out[0] = (float)(sum / (double)n);
    return UMT_OK;
}

umt_status umt_cpu_mean_backward(const float *dout, float *dx, int64_t n) {
    float share = (float)((double)dout[0] / (double)n);
    for (int64_t i = 0; i < n; i++) dx[i] += share;
    return UMT_OK;
}

umt_status umt_cpu_log_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x_row = x + r * cols;
        float *y_row = y + r * cols;
        float max = row_max(x_row, cols);
        double log_sum = shifted_log_sum_exp(x_row, cols, max);
        for (int64_t c = 0; c < cols; c++) y_row[c] = (float)((double)x_row[c] - max - log_sum);
    }
    return UMT_OK;
}

umt_status umt_cpu_log_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *y_row = y + r * cols, *dy_row = dy + r * cols;
        float *dx_row = dx + r * cols;
        double dy_sum = 0.0;
        for (int64_t c = 0; c < cols; c++) dy_sum += dy_row[c];
        /* exp(y) is the softmax: the saved output is all the backward needs. */
        for (int64_t c = 0; c < cols; c++) dx_row[c] += (float)(dy_row[c] - exp((double)y_row[c]) * dy_sum);
    }
    return UMT_OK;
}

umt_status umt_cpu_nll_loss(const float *logp, const int32_t *labels, float *loss, int64_t rows, int64_t cols) {
    UMT_TRY(check_labels("nll_loss", labels, rows, cols));
    double sum = 0.0;
    for (int64_t r = 0; r < rows; r++) sum += logp[r * cols + labels[r]];
    loss[0] = (float)(-sum / (double)rows);
    return UMT_OK;
}

umt_status umt_cpu_nll_loss_backward(const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                     int64_t cols) {
    UMT_TRY(check_labels("nll_loss_backward", labels, rows, cols));
    float share = (float)(-(double)dloss[0] / (double)rows);
    for (int64_t r = 0; r < rows; r++) dlogp[r * cols + labels[r]] += share;
    return UMT_OK;
}

umt_status umt_cpu_softmax_xent(const float *logits, const int32_t *labels, float *probs, float *loss, int64_t rows,
                                int64_t cols) {
    UMT_TRY(check_labels("softmax_xent", labels, rows, cols));
    double loss_sum = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x_row = logits + r * cols;
        float *p_row = probs + r * cols;
        float max = row_max(x_row, cols);
        double log_sum = shifted_log_sum_exp(x_row, cols, max);
        for (int64_t c = 0; c < cols; c++) p_row[c] = (float)exp((double)x_row[c] - max - log_sum);
        /* -log p[label] from the logits, not from probs: a probability that underflowed to 0
         * would give an infinite loss where the true one is merely large. */
        loss_sum += log_sum - ((double)x_row[labels[r]] - max);
    }
    loss[0] = (float)(loss_sum / (double)rows);
    return UMT_OK;
}

umt_status umt_cpu_softmax_xent_backward(const float *probs, const int32_t *labels, const float *dloss,
                                         float *dlogits, int64_t rows, int64_t cols) {
    UMT_TRY(check_labels("softmax_xent_backward", labels, rows, cols));
    float scale = (float)((double)dloss[0] / (double)rows);
    for (int64_t r = 0; r < rows; r++) {
        const float *p_row = probs + r * cols;
        float *d_row = dlogits + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            float onehot = c == labels[r] ? 1.0f : 0.0f;
            d_row[c] += scale * (p_row[c] - onehot);
        }
    }
    return UMT_OK;
}

umt_status umt_cpu_count_correct(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                 int64_t *correct) {
    UMT_TRY(check_labels("count_correct", labels, rows, cols));
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = scores + r * cols;
        /* Strictly greater: on a tie the lowest index wins, as in PyTorch's argmax. */
        int64_t best = 0;
        for (int64_t c = 1; c < cols; c++) {
            if (row[c] > row[best]) best = c;
        }
        if (best == labels[r]) count++;
    }
    *correct = count;
    return UMT_OK;
}
