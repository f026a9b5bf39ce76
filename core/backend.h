/*
 * core/backend.h — the table of kernels an op calls, one table per device.
 *
 * Ops (core/ops_*.c) check shapes, allocate outputs from the pools and record the tape; then
 * they call ctx->backend->kernel(...) on raw pointers. The CPU table (kernels/cpu/) is the
 * readable reference; a CUDA table fills the same slots. All tensors are row-major and
 * contiguous; float means f32 unless a dtype is passed.
 *
 * Naming: `x_backward` kernels ACCUMULATE into the input gradient (dx += ...), because a
 * tensor used twice receives the sum of both gradients.
 */
#ifndef UMT_CORE_BACKEND_H
#define UMT_CORE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct umt_backend {
    const char *name;

    /* --- memory --- */
    umt_status (*fill)(float *x, int64_t n, float value);
    umt_status (*copy)(void *dst, const void *src, size_t bytes);
    umt_status (*upload)(void *dst, const void *host_src, size_t bytes);
    umt_status (*download)(void *host_dst, const void *src, size_t bytes);
    /* dst[i] = (dst_dtype) src[i] between f32, bf16 and f16, round to nearest even. */
    umt_status (*convert)(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n);

    /* --- matrix product: C = alpha * op(A) op(B) + beta * C, op(A) [m,k], op(B) [k,n] --- */
    umt_status (*gemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

    /* --- elementwise --- */
    umt_status (*add)(const float *a, const float *b, float *out, int64_t n);
    /* out[r,c] = x[r,c] + bias[c] (x may equal out) */
    umt_status (*add_rows)(const float *x, const float *bias, float *out, int64_t rows, int64_t cols);
    /* dst += alpha * src */
    umt_status (*accumulate)(float *dst, const float *src, float alpha, int64_t n);
    /* dbias[c] += sum over r of dy[r,c] */
    umt_status (*sum_rows)(const float *dy, float *dbias, int64_t rows, int64_t cols);
    umt_status (*mul)(const float *a, const float *b, float *out, int64_t n);
    /* dst += a * b */
    umt_status (*accumulate_product)(float *dst, const float *a, const float *b, int64_t n);
    umt_status (*relu)(const float *x, float *y, int64_t n);
    /* dx += dy where y > 0 */
    umt_status (*relu_backward)(const float *y, const float *dy, float *dx, int64_t n);

    /* --- reductions and losses; scalar results live in a 1-element tensor --- */
    umt_status (*mean)(const float *x, float *out, int64_t n);
    /* dx += dout[0] / n */
    umt_status (*mean_backward)(const float *dout, float *dx, int64_t n);
    umt_status (*log_softmax)(const float *x, float *y, int64_t rows, int64_t cols);
    /* dx += dy - exp(y) * sum_c dy  (per row) */
    umt_status (*log_softmax_backward)(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols);
    /* loss[0] = -mean_r logp[r, labels[r]] */
    umt_status (*nll_loss)(const float *logp, const int32_t *labels, float *loss, int64_t rows, int64_t cols);
    umt_status (*nll_loss_backward)(const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                    int64_t cols);
    /* probs = softmax(logits), loss[0] = -mean_r log probs[r, labels[r]] */
    umt_status (*softmax_xent)(const float *logits, const int32_t *labels, float *probs, float *loss, int64_t rows,
                               int64_t cols);
    /* dlogits += dloss[0] / rows * (probs - onehot(labels)) */
    umt_status (*softmax_xent_backward)(const float *probs, const int32_t *labels, const float *dloss,
                                        float *dlogits, int64_t rows, int64_t cols);
    /* *correct = number of rows whose arg-max equals the label (a host result) */
    umt_status (*count_correct)(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                int64_t *correct);

    /* --- data: gather rows of a u8 dataset into a normalised f32 batch and i32 labels;
     *     indices, like every other pointer here, is memory of the backend's device --- */
    umt_status (*gather_batch)(const uint8_t *samples, const uint8_t *labels, const int64_t *indices, int64_t count,
                               int64_t sample_numel, float mean, float std, float *images_out,
                               int32_t *labels_out);

    /* --- optimizer updates, in place over n elements (PyTorch's update rules) --- */
    umt_status (*sgd_update)(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                             float weight_decay);
    /* step counts from 1; decoupled selects AdamW's weight decay */
    umt_status (*adam_update)(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, bool decoupled, int64_t step);
    umt_status (*adadelta_update)(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                  float lr, float rho, float eps, float weight_decay);
} umt_backend;

/* The CPU backend (kernels/cpu/cpu_backend.c). */
const umt_backend *umt_cpu_backend(void);

#ifdef __cplusplus
}
#endif

#endif /* UMT_CORE_BACKEND_H */
