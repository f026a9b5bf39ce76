/*
 * kernels/cpu/elementwise.c — elementwise arithmetic, bias rows and ReLU, with their backwards.
 *
 * Semantics are those of kernels/backend.h: plain loops over contiguous f32. The kernels named
 * accumulate* and *_backward ADD into their output (a tensor used twice gets both gradients).
 * Outputs may alias inputs of the same shape (y = x in place), so no pointer is restrict.
 */
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

umt_status umt_cpu_add(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    return UMT_OK;
}

umt_status umt_cpu_add_rows(const float *x, const float *bias, float *out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x_row = x + r * cols;
        float *out_row = out + r * cols;
        for (int64_t c = 0; c < cols; c++) out_row[c] = x_row[c] + bias[c];
    }
    return UMT_OK;
}

umt_status umt_cpu_accumulate(float *dst, const float *src, float alpha, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += alpha * src[i];
    return UMT_OK;
}

umt_status umt_cpu_keep_and_add(float *last, float *sum, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i]; /* x may be last or sum */
        last[i] = v;
        sum[i] += v;
    }
    return UMT_OK;
}

umt_status umt_cpu_sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols) {
    /* Row by row, so dy is read contiguously; dbias (one row) stays in cache. */
    for (int64_t r = 0; r < rows; r++) {
        const float *dy_row = dy + r * cols;
        for (int64_t c = 0; c < cols; c++) dbias[c] += dy_row[c];
    }
    return UMT_OK;
}

umt_status umt_cpu_mul(const float *a, const float *b, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
    return UMT_OK;
}

umt_status umt_cpu_accumulate_product(float *dst, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += a[i] * b[i];
    return UMT_OK;
}

umt_status umt_cpu_relu(const float *x, float *y, int64_t n) {
    /* Written as "x < 0 ? 0 : x" so that a NaN passes through (as in PyTorch) and a diverging
     * run shows up in the loss instead of being hidden as zeros. */
    for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i];
    return UMT_OK;
}

umt_status umt_cpu_relu_backward(const float *y, const float *dy, float *dx, int64_t n) {
    /* y > 0 exactly where x > 0, so the saved output is enough; the gradient at 0 is 0. */
    for (int64_t i = 0; i < n; i++) {
        if (y[i] > 0.0f) dx[i] += dy[i];
    }
    return UMT_OK;
}
