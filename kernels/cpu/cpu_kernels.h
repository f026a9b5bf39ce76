/*
 * kernels/cpu/cpu_kernels.h — the plain-C reference kernels, also the CPU backend.
 *
 * One function per slot of umt_backend (kernels/backend.h documents each); readable first,
 * fast enough to train the MNIST MLP on two cores second. The GPU tests compare every CUDA
 * kernel against these.
 */
#ifndef UMT_KERNELS_CPU_CPU_KERNELS_H
#define UMT_KERNELS_CPU_CPU_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/backend.h"
#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* memory.c */
umt_status umt_cpu_fill(float *x, int64_t n, float value);
umt_status umt_cpu_copy(void *dst, const void *src, size_t bytes);
umt_status umt_cpu_zero(void *x, size_t bytes);
umt_status umt_cpu_zero_many(int count, void *const *blocks, const size_t *bytes);
/* zero_many's argument check, which the CUDA backend makes too: every size a multiple of 4. */
umt_status umt_cpu_check_zero_many(int count, const size_t *bytes);
umt_status umt_cpu_convert(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n);
uint16_t umt_f32_to_f16(float x);
float umt_f16_to_f32(uint16_t x);

/* bf16 is f32's top 16 bits: exact. Inline, so that a loop reading bf16 gradients vectorizes. */
static inline float umt_bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* x rounded to bf16, to nearest with ties to even. bf16 is f32's top 16 bits: adding 0x7fff, plus
 * one when the kept part is odd, carries exactly when the dropped half is above one half or a tie
 * on an odd value (a carry out of the mantissa lands in the exponent: the next binade, or infinity
 * above the largest bf16). A NaN keeps its sign and top payload with the quiet bit set, so that the
 * truncated payload can never become zero (which would read as infinity). Inline and without
 * branches, so that the loops writing a compute copy (kernels/cpu/optim.c) vectorize. */
static inline uint16_t umt_f32_to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (bits >> 16) | 0x0040u;
    return (uint16_t)((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* Argument checks shared with the CUDA backend, so that both refuse alike, in the same words. */
umt_status umt_gemm_check_arguments(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda,
                                    int64_t ldb, int64_t ldc);
umt_status umt_convert_check_arguments(umt_dtype src_dtype, umt_dtype dst_dtype, int64_t n);
umt_status umt_conv_check_shape(const char *op, const umt_conv_shape *s);
umt_status umt_conv_check_channel_sizes(const char *op, int64_t n, int64_t k, int64_t hw);

/* gemm.c: the slot (on the backend's threads), and the product on the calling thread alone, for
 * kernels that split their own work (conv.c); it takes arguments umt_gemm_check_arguments passed. */
umt_status umt_cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                        int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void umt_cpu_gemm_one_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                             int64_t ldc);

/* elementwise.c */
umt_status umt_cpu_add(const float *a, const float *b, float *out, int64_t n);
umt_status umt_cpu_add_rows(const float *x, const float *bias, float *out, int64_t rows, int64_t cols);
umt_status umt_cpu_accumulate(float *dst, const float *src, float alpha, int64_t n);
umt_status umt_cpu_keep_and_add(float *last, float *sum, const float *x, int64_t n);
umt_status umt_cpu_sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols);
umt_status umt_cpu_mul(const float *a, const float *b, float *out, int64_t n);
umt_status umt_cpu_accumulate_product(float *dst, const float *a, const float *b, int64_t n);
umt_status umt_cpu_relu(const float *x, float *y, int64_t n);
umt_status umt_cpu_relu_backward(const float *y, const float *dy, float *dx, int64_t n);

/* loss.c */
umt_status umt_cpu_mean(const float *x, float *out, int64_t n);
umt_status umt_cpu_mean_backward(const float *dout, float *dx, int64_t n);
umt_status umt_cpu_log_softmax(const float *x, float *y, int64_t rows, int64_t cols);
umt_status umt_cpu_log_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols);
umt_status umt_cpu_nll_loss(const float *logp, const int32_t *labels, float *loss, int64_t rows, int64_t cols);
umt_status umt_cpu_nll_loss_backward(const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                     int64_t cols);
umt_status umt_cpu_softmax_xent(const float *logits, const int32_t *labels, float *probs, float *loss, int64_t rows,
                                int64_t cols);
umt_status umt_cpu_softmax_xent_backward(const float *probs, const int32_t *labels, const float *dloss,
                                         float *dlogits, int64_t rows, int64_t cols);
umt_status umt_cpu_count_correct(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                 int64_t *correct);

/* data.c */
umt_status umt_cpu_gather_batch(const uint8_t *samples, const uint8_t *labels, const int64_t *indices, int64_t count,
                                int64_t sample_numel, float mean, float std, float *images_out, int32_t *labels_out);

/* conv.c (im2col + the blocked GEMM) */
umt_status umt_cpu_conv2d_workspace_bytes(const umt_conv_shape *shape, size_t *bytes);
umt_status umt_cpu_conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                  void *workspace, size_t workspace_bytes);
umt_status umt_cpu_conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                        void *workspace, size_t workspace_bytes);
umt_status umt_cpu_conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                          void *workspace, size_t workspace_bytes);
umt_status umt_cpu_add_channel_bias(const float *x, const float *bias, float *y, int64_t n, int64_t k, int64_t hw);
umt_status umt_cpu_sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw);

/* fused.c */
umt_status umt_cpu_bias_relu(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y, int64_t n,
                             int64_t k, int64_t hw);
umt_status umt_cpu_bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                      int64_t k, int64_t hw);
umt_status umt_cpu_bias_relu_dropout(umt_dtype dtype, const void *x, const float *bias, void *y, int64_t rows,
                                     int64_t k, const umt_dropout_draw *drop);
umt_status umt_cpu_bias_relu_dropout_backward(umt_dtype dtype, const void *y, void *dy, float *dbias, int64_t rows,
                                              int64_t k, float p);
umt_status umt_cpu_max_pool_dropout_backward(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                             const void *dy, void *dx, float p);
umt_status umt_cpu_bias_relu_max_pool_dropout_forward(const umt_pool_shape *shape, const void *x, const float *bias,
                                                      void *y, uint8_t *pick, const umt_dropout_draw *drop);
umt_status umt_cpu_bias_relu_max_pool_dropout_backward(const umt_pool_shape *shape, const uint8_t *pick,
                                                       const void *y, void *dy, void *dx, bool dx_fresh, float *dbias,
                                                       float p);

/* pool.c (the shape check is shared with fused.c and the CUDA backend, the pick rule with fused.c) */
/* Whether value replaces best as a window's pick: strictly greater keeps the first of equal
 * maxima; a NaN replaces a number but not an earlier NaN. */
static inline bool umt_cpu_takes_over(float value, float best) {
    return value > best || (isnan(value) && !isnan(best));
}
umt_status umt_cpu_check_pool_shape(const char *op, const umt_pool_shape *s);
umt_status umt_cpu_max_pool_forward(const umt_pool_shape *shape, const float *x, float *y, int32_t *argmax);
umt_status umt_cpu_max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const float *dy, float *dx);
umt_status umt_cpu_avg_pool_forward(const umt_pool_shape *shape, const float *x, float *y);
umt_status umt_cpu_avg_pool_backward(const umt_pool_shape *shape, const float *dy, float *dx);

/* dropout.c */
umt_status umt_cpu_dropout_forward(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first, float p,
                                   uint64_t seed, const uint64_t *seed_on_device);
umt_status umt_cpu_dropout_backward(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p);

/* batchnorm.c */
umt_status umt_cpu_batchnorm_forward_train(const float *x, const float *gamma, const float *beta, float *y,
                                           float *running_mean, float *running_var, float *save_mean,
                                           float *save_inv_std, int64_t n, int64_t c, int64_t hw, float momentum,
                                           float eps);
umt_status umt_cpu_batchnorm_forward_eval(const float *x, const float *gamma, const float *beta,
                                          const float *running_mean, const float *running_var, float *y, int64_t n,
                                          int64_t c, int64_t hw, float eps);
umt_status umt_cpu_batchnorm_backward(const float *x, const float *dy, const float *gamma, const float *save_mean,
                                      const float *save_inv_std, float *dx, float *dgamma, float *dbeta, int64_t n,
                                      int64_t c, int64_t hw);

/* optim.c */
umt_status umt_cpu_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                              float weight_decay);
umt_status umt_cpu_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, bool decoupled, int64_t step);
umt_status umt_cpu_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                   float lr, float rho, float eps, float weight_decay);
umt_status umt_cpu_sgd_update_fused(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                    float momentum, float weight_decay, umt_update_fusion fusion);
umt_status umt_cpu_adam_update_fused(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                     float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                     int64_t step, umt_update_fusion fusion);
umt_status umt_cpu_adadelta_update_fused(float *param, const float *grad, float *square_avg, float *delta_avg,
                                         int64_t n, float lr, float rho, float eps, float weight_decay,
                                         umt_update_fusion fusion);
umt_status umt_cpu_multi_update(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                                umt_update_fusion common);
umt_status umt_cpu_step_decide(const umt_update_tensor *tensors, int count, double *partials,
                               umt_step_scalars *scalars, umt_step_options options);
/* Shared with the CUDA backend: a low-precision copy must be bf16 or f16. */
umt_status umt_update_fusion_check(const char *op, umt_update_fusion fusion);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CPU_CPU_KERNELS_H */
