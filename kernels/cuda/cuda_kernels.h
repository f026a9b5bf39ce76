/*
 * kernels/cuda/cuda_kernels.h — the CUDA backend: our kernels and cuBLAS behind the same
 * umt_backend slots as kernels/cpu/ (kernels/backend.h documents each slot).
 *
 * Each context on a GPU has its own state (backend.cu): a compute stream, a cuBLAS handle and a
 * cuDNN handle, its convolution plans and its kernels' scratch, made by umt_cuda_state_create.
 * The kernels find it through the calling thread's binding (umt_cuda_bind): every kernel runs
 * on the bound state's stream, in order; functions that return a
 * host value (download, count_correct) wait for it. Pointers handed to the slots are device or
 * managed memory, except where a slot says host.
 */
#ifndef UMT_KERNELS_CUDA_CUDA_KERNELS_H
#define UMT_KERNELS_CUDA_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One context's CUDA state (backend.cu). */
typedef struct umt_cuda_state umt_cuda_state;

/* Device bytes of scratch a state needs: its kernels' partial sums and the label report. */
size_t umt_cuda_scratch_bytes(void);
/* Selects the device, creates the compute stream and the cuBLAS and cuDNN handles, gives cuBLAS
 * the caller's workspace (from the workspace pool) so that cuBLAS allocates nothing itself, and
 * the kernels the caller's scratch (umt_cuda_scratch_bytes, from the same pool; both 256-byte
 * aligned). With side, also the side stream and its own cuBLAS handle, which gets its workspace
 * at the first branch_begin that brings one (the backend's streams group; without side its
 * slots fail). Binds the new state to the calling thread. */
umt_status umt_cuda_state_create(int device, void *cublas_workspace, size_t workspace_bytes, bool side, void *scratch,
                                 size_t scratch_bytes, umt_cuda_state **out);
/* Waits for the streams, then destroys the plans, the handles and the streams. NULL is a no-op. */
void umt_cuda_state_destroy(umt_cuda_state *state);
/* Whether the state's fp32 convolutions may use TF32 tensor cores (umt_context_options.tf32; set
 * before its first convolution: plans keep the choice they were made with); the bound state's. */
void umt_cuda_state_set_tf32(umt_cuda_state *state, bool on);
bool umt_cuda_tf32(void);
/* The most workspace one convolution algorithm or engine may take, for the plans made from now
 * on (plans keep the limit they were made with); 0 sets the default. The bound state's. */
#define UMT_CONV_WORKSPACE_DEFAULT ((size_t)256 << 20)
void umt_cuda_state_set_conv_workspace_limit(umt_cuda_state *state, size_t bytes);
size_t umt_cuda_conv_workspace_limit(void);
/* Makes state the calling thread's: the kernels called from this thread from now on run on its
 * stream, handles and scratch (and on its device). A state is used by one thread at a time. */
void umt_cuda_bind(umt_cuda_state *state);
const umt_backend *umt_cuda_backend(void);
/* The bound state's stream for our own kernels: the compute stream, or umt_cuda_launch_on's
 * (NULL when no state is bound). */
cudaStream_t umt_cuda_stream(void);
/* The bound state's compute stream, whatever umt_cuda_launch_on chose (memory/ prefetches on it,
 * so prefetch and use stay in order). */
cudaStream_t umt_cuda_compute_stream(void);
/* Our own kernels (not cuBLAS or cuDNN, which stay on the compute stream) launch on stream from
 * now on, NULL for the compute stream again; returns the previous choice. The offload tier runs
 * its updates during backward beside the compute stream this way (offload/offload.c). Per state. */
cudaStream_t umt_cuda_launch_on(cudaStream_t stream);
/* The bound state's cuBLAS handle for the stream in use (gemm.cu): the compute stream's, or on
 * the branch (umt_cuda_branch_begin) the side stream's. */
cublasHandle_t umt_cuda_cublas_handle(void);
/* Waits until all work queued on the bound state's streams has finished. */
umt_status umt_cuda_synchronize(void);
/* The streams group (kernels/backend.h): the side stream after the compute stream's work so far
 * (our kernels, cuDNN and cuBLAS all go there), back to the compute stream, and the compute
 * stream waiting for the side's work. */
umt_status umt_cuda_branch_begin(void *cublas_workspace, size_t bytes);
umt_status umt_cuda_branch_end(void);
umt_status umt_cuda_branch_join(void);

/* memory.cu */
umt_status umt_cuda_fill(float *x, int64_t n, float value);
umt_status umt_cuda_copy(void *dst, const void *src, size_t bytes);
umt_status umt_cuda_upload(void *dst, const void *host_src, size_t bytes);
umt_status umt_cuda_download(void *host_dst, const void *src, size_t bytes);
umt_status umt_cuda_convert(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n);

/* gemm.cu (cuBLAS, fp32 compute) */
umt_status umt_cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                         int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* elementwise.cu */
umt_status umt_cuda_add(const float *a, const float *b, float *out, int64_t n);
umt_status umt_cuda_add_rows(const float *x, const float *bias, float *out, int64_t rows, int64_t cols);
umt_status umt_cuda_accumulate(float *dst, const float *src, float alpha, int64_t n);
umt_status umt_cuda_keep_and_add(float *last, float *sum, const float *x, int64_t n);
umt_status umt_cuda_sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols);
umt_status umt_cuda_mul(const float *a, const float *b, float *out, int64_t n);
umt_status umt_cuda_accumulate_product(float *dst, const float *a, const float *b, int64_t n);
umt_status umt_cuda_relu(const float *x, float *y, int64_t n);
umt_status umt_cuda_relu_backward(const float *y, const float *dy, float *dx, int64_t n);

/* loss.cu */
umt_status umt_cuda_mean(const float *x, float *out, int64_t n);
umt_status umt_cuda_mean_backward(const float *dout, float *dx, int64_t n);
umt_status umt_cuda_log_softmax(const float *x, float *y, int64_t rows, int64_t cols);
umt_status umt_cuda_log_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols);
umt_status umt_cuda_nll_loss(const float *logp, const int32_t *labels, float *loss, int64_t rows, int64_t cols);
umt_status umt_cuda_nll_loss_backward(const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                      int64_t cols);
umt_status umt_cuda_softmax_xent(const float *logits, const int32_t *labels, float *probs, float *loss, int64_t rows,
                                 int64_t cols);
umt_status umt_cuda_softmax_xent_backward(const float *probs, const int32_t *labels, const float *dloss,
                                          float *dlogits, int64_t rows, int64_t cols);
umt_status umt_cuda_softmax_xent_lp(umt_dtype dtype, const void *logits, const int32_t *labels, float *probs,
                                    float *loss, int64_t rows, int64_t cols);
umt_status umt_cuda_softmax_xent_backward_lp(umt_dtype dtype, const float *probs, const int32_t *labels,
                                             const float *dloss, void *dlogits, int64_t rows, int64_t cols,
                                             bool fresh);
/* The head: a linear layer and the softmax cross-entropy as one op (kernels/backend.h's fused group). */
bool umt_cuda_linear_xent_supports(umt_dtype dtype, int64_t rows, int64_t in, int64_t cols);
umt_status umt_cuda_linear_xent(umt_dtype dtype, const void *x, const void *w, const float *bias, const int32_t *labels,
                                float *diff, float *loss, int64_t rows, int64_t in, int64_t cols);
umt_status umt_cuda_linear_xent_backward(umt_dtype dtype, const void *x, const void *w, const float *diff,
                                         const float *dloss, void *dx, bool dx_fresh, float *dw, float *dbias,
                                         int64_t rows, int64_t in, int64_t cols);
umt_status umt_cuda_count_correct(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                  int64_t *correct);
/* After a wait for the stream: the error of the first out-of-range label a loss or its backward
 * met since the last call (their checks do not wait), then cleared; UMT_OK when there was none. */
umt_status umt_cuda_take_label_verdict(void);

/* data.cu */
umt_status umt_cuda_gather_batch_lp(umt_dtype dtype, const uint8_t *samples, const uint8_t *labels,
                                    const int64_t *indices, int64_t count, int64_t c, int64_t hw, float mean, float std,
                                    void *images_out, int32_t *labels_out);
umt_status umt_cuda_gather_batch(const uint8_t *samples, const uint8_t *labels, const int64_t *indices,
                                 int64_t count, int64_t sample_numel, float mean, float std, float *images_out,
                                 int32_t *labels_out);

/* conv.cu (cuDNN: algorithm chosen once per shape and cached) */
umt_status umt_cuda_conv2d_workspace_bytes(const umt_conv_shape *shape, size_t *bytes);
umt_status umt_cuda_conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                   void *workspace, size_t workspace_bytes);
umt_status umt_cuda_conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                         void *workspace, size_t workspace_bytes);
umt_status umt_cuda_conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                           void *workspace, size_t workspace_bytes);
umt_status umt_cuda_add_channel_bias(const float *x, const float *bias, float *y, int64_t n, int64_t k, int64_t hw);
umt_status umt_cuda_sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw);

/* fused.cu (bias + ReLU and its backward, any float dtype) */
umt_status umt_cuda_bias_relu(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y, int64_t n,
                              int64_t k, int64_t hw);
umt_status umt_cuda_bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                       int64_t k, int64_t hw);
umt_status umt_cuda_max_pool_dropout_backward(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                              const void *dy, void *dx, float p);
umt_status umt_cuda_bias_relu_dropout(umt_dtype dtype, const void *x, const float *bias, void *y, int64_t rows,
                                      int64_t k, const umt_dropout_draw *drop);
umt_status umt_cuda_bias_relu_dropout_backward(umt_dtype dtype, const void *y, void *dy, float *dbias, int64_t rows,
                                               int64_t k, float p);
umt_status umt_cuda_bias_relu_max_pool_dropout_forward(const umt_pool_shape *shape, const void *x, const float *bias,
                                                       void *y, uint8_t *pick, const umt_dropout_draw *drop);
umt_status umt_cuda_bias_relu_max_pool_dropout_backward(const umt_pool_shape *shape, const uint8_t *pick,
                                                        const void *y, void *dy, void *dx, bool dx_fresh, float *dbias,
                                                        float p);
/* Inside kernels/cuda (lowp.cu, for every _lp entry point): UMT_OK for bf16 or f16, else op's
 * refusal naming the dtype. */
umt_status umt_cuda_check_half(const char *op, umt_dtype dtype);
/* Inside kernels/cuda (fused.cu -> pool.cu): the pool's scatter from window positions (pick),
 * windows apart, any dtype; fresh: dx holds nothing yet and is written whole (0 off the picks). */
umt_status umt_cuda_pick_scatter(const umt_pool_shape *shape, const uint8_t *pick, const void *dy, void *dx,
                                 bool fresh);

/* pool.cu */
umt_status umt_cuda_max_pool_forward(const umt_pool_shape *shape, const float *x, float *y, int32_t *argmax);
umt_status umt_cuda_max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const float *dy, float *dx);
umt_status umt_cuda_avg_pool_forward(const umt_pool_shape *shape, const float *x, float *y);
umt_status umt_cuda_avg_pool_backward(const umt_pool_shape *shape, const float *dy, float *dx);

/* dropout.cu */
umt_status umt_cuda_dropout_forward(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first, float p,
                                    uint64_t seed, const uint64_t *seed_on_device);
umt_status umt_cuda_dropout_backward(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p);

/* Mixed precision (core/precision.h): lowp.cu, and the _lp entry points of gemm.cu, conv.cu
 * and pool.cu */
umt_status umt_cuda_zero(void *x, size_t bytes);
umt_status umt_cuda_zero_many(int count, void *const *blocks, const size_t *bytes);
umt_status umt_cuda_recast(const void *src, umt_dtype src_dtype, bool src_nhwc, void *dst, umt_dtype dst_dtype,
                           bool dst_nhwc, int64_t n, int64_t c, int64_t hw, bool accumulate);
umt_status umt_cuda_gemm_lp(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                            int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                            umt_dtype ab_dtype, umt_dtype c_dtype);
umt_status umt_cuda_add_rows_lp(umt_dtype dtype, const void *x, const float *bias, void *out, int64_t rows,
                                int64_t cols);
umt_status umt_cuda_sum_rows_lp(umt_dtype dtype, const void *dy, float *dbias, int64_t rows, int64_t cols);
umt_status umt_cuda_relu_lp(umt_dtype dtype, const void *x, void *y, int64_t n);
umt_status umt_cuda_relu_backward_lp(umt_dtype dtype, const void *y, const void *dy, void *dx, int64_t n);
umt_status umt_cuda_dropout_forward_lp(umt_dtype dtype, const void *x, void *y, uint8_t *mask, int64_t n,
                                       int64_t first, float p, uint64_t seed, const uint64_t *seed_on_device);
umt_status umt_cuda_dropout_backward_lp(umt_dtype dtype, const uint8_t *mask, const void *dy, void *dx, int64_t n,
                                        float p);
umt_status umt_cuda_conv2d_forward_lp(const umt_conv_shape *shape, const void *x, const void *w, void *y,
                                      void *workspace, size_t workspace_bytes);
umt_status umt_cuda_conv2d_backward_data_lp(const umt_conv_shape *shape, const void *w, const void *dy, void *dx,
                                            bool overwrite, void *workspace, size_t workspace_bytes);
umt_status umt_cuda_conv2d_backward_filter_lp(const umt_conv_shape *shape, const void *x, const void *dy, float *dw,
                                              void *workspace, size_t workspace_bytes);
bool umt_cuda_conv2d_relu_fused(const umt_conv_shape *shape);
umt_status umt_cuda_conv2d_relu_forward(const umt_conv_shape *shape, const void *x, const void *w, const float *bias,
                                        void *y, void *workspace, size_t workspace_bytes);
umt_status umt_cuda_conv2d_relu_backward_filter(const umt_conv_shape *shape, const void *x, const void *y, void *dy,
                                                bool keep_dy, float *dw, float *dbias, void *workspace,
                                                size_t workspace_bytes);
umt_status umt_cuda_add_channel_bias_lp(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y,
                                        int64_t n, int64_t k, int64_t hw);
umt_status umt_cuda_sum_channel_bias_lp(umt_dtype dtype, bool nhwc, const void *dy, float *dbias, int64_t n,
                                        int64_t k, int64_t hw);
umt_status umt_cuda_max_pool_forward_lp(const umt_pool_shape *shape, const void *x, void *y, int32_t *argmax);
umt_status umt_cuda_max_pool_backward_lp(const umt_pool_shape *shape, const int32_t *argmax, const void *dy,
                                         void *dx);
umt_status umt_cuda_avg_pool_forward_lp(const umt_pool_shape *shape, const void *x, void *y);
umt_status umt_cuda_avg_pool_backward_lp(const umt_pool_shape *shape, const void *dy, void *dx);

/* batchnorm.cu (cuDNN spatial batch norm) */
umt_status umt_cuda_batchnorm_forward_train(const float *x, const float *gamma, const float *beta, float *y,
                                            float *running_mean, float *running_var, float *save_mean,
                                            float *save_inv_std, int64_t n, int64_t c, int64_t hw, float momentum,
                                            float eps);
umt_status umt_cuda_batchnorm_forward_eval(const float *x, const float *gamma, const float *beta,
                                           const float *running_mean, const float *running_var, float *y, int64_t n,
                                           int64_t c, int64_t hw, float eps);
umt_status umt_cuda_batchnorm_backward(const float *x, const float *dy, const float *gamma, const float *save_mean,
                                       const float *save_inv_std, float *dx, float *dgamma, float *dbeta, int64_t n,
                                       int64_t c, int64_t hw);

/* optim.cu */
umt_status umt_cuda_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                               float weight_decay);
umt_status umt_cuda_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                float beta1, float beta2, float eps, float weight_decay, bool decoupled, int64_t step);
umt_status umt_cuda_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                    float lr, float rho, float eps, float weight_decay);
umt_status umt_cuda_sgd_update_fused(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                     float momentum, float weight_decay, umt_update_fusion fusion);
umt_status umt_cuda_adam_update_fused(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                      float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                      int64_t step, umt_update_fusion fusion);
umt_status umt_cuda_adadelta_update_fused(float *param, const float *grad, float *square_avg, float *delta_avg,
                                          int64_t n, float lr, float rho, float eps, float weight_decay,
                                          umt_update_fusion fusion);
umt_status umt_cuda_multi_update(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                                 umt_update_fusion common);
umt_status umt_cuda_step_decide(const umt_update_tensor *tensors, int count, double *partials,
                                umt_step_scalars *scalars, umt_step_options options);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CUDA_CUDA_KERNELS_H */
