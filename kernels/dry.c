/*
 * kernels/dry.c — the dry table: every kernel a no-op, every question answered by the real table.
 *
 * A dry step (core/step/dry_step.c) runs a training step's ops on tensors whose storage is only
 * recorded, never backed (memory/dry.c hands out addresses no byte lies behind), to learn what
 * the step allocates. Its kernels must therefore touch nothing, while the slots that only
 * answer a question about a shape (how much workspace a convolution takes, whether a fused
 * path takes it) must give the real answer, or the predicted workspace would be wrong. A slot
 * the real table leaves empty stays empty, so that ops choose the same paths as in a real step.
 */
#include "kernels/backend.h"

/* Each no-op below takes its slot's whole parameter list and reads none of it: naming every
 * parameter once more only to void it would drown the table in noise. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define NOTHING \
    { return UMT_OK; }

/* ----------------------------------------------------------------------------------------- */
/* Group 1: the f32 reference */

static umt_status fill(float *x, int64_t n, float value) NOTHING
static umt_status copy(void *dst, const void *src, size_t bytes) NOTHING
static umt_status upload(void *dst, const void *host_src, size_t bytes) NOTHING
static umt_status download(void *host_dst, const void *src, size_t bytes) NOTHING
static umt_status convert(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n) NOTHING
static umt_status zero(void *x, size_t bytes) NOTHING
static umt_status zero_many(int count, void *const *blocks, const size_t *bytes) NOTHING
static umt_status gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) NOTHING
static umt_status add(const float *a, const float *b, float *out, int64_t n) NOTHING
static umt_status add_rows(const float *x, const float *bias, float *out, int64_t rows, int64_t cols) NOTHING
static umt_status accumulate(float *dst, const float *src, float alpha, int64_t n) NOTHING
static umt_status keep_and_add(float *last, float *sum, const float *x, int64_t n) NOTHING
static umt_status sum_rows(const float *dy, float *dbias, int64_t rows, int64_t cols) NOTHING
static umt_status mul(const float *a, const float *b, float *out, int64_t n) NOTHING
static umt_status accumulate_product(float *dst, const float *a, const float *b, int64_t n) NOTHING
static umt_status relu(const float *x, float *y, int64_t n) NOTHING
static umt_status relu_backward(const float *y, const float *dy, float *dx, int64_t n) NOTHING
static umt_status mean(const float *x, float *out, int64_t n) NOTHING
static umt_status mean_backward(const float *dout, float *dx, int64_t n) NOTHING
static umt_status log_softmax(const float *x, float *y, int64_t rows, int64_t cols) NOTHING
static umt_status log_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols) NOTHING
static umt_status nll_loss(const float *logp, const int32_t *labels, float *loss, int64_t rows, int64_t cols) NOTHING
static umt_status nll_loss_backward(const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                    int64_t cols) NOTHING
static umt_status softmax_xent(const float *logits, const int32_t *labels, float *probs, float *loss, int64_t rows,
                               int64_t cols) NOTHING
static umt_status softmax_xent_backward(const float *probs, const int32_t *labels, const float *dloss,
                                        float *dlogits, int64_t rows, int64_t cols) NOTHING

/* A host result: none of the rows was read, so none counts. */
static umt_status count_correct(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                int64_t *correct) {
    *correct = 0;
    return UMT_OK;
}

static umt_status gather_batch(const uint8_t *samples, const uint8_t *labels, const int64_t *indices, int64_t count,
                               int64_t sample_numel, float mean, float std, float *images_out,
                               int32_t *labels_out) NOTHING
static umt_status conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                 void *workspace, size_t workspace_bytes) NOTHING
static umt_status conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                       void *workspace, size_t workspace_bytes) NOTHING
static umt_status conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                         void *workspace, size_t workspace_bytes) NOTHING
static umt_status add_channel_bias(const float *x, const float *bias, float *y, int64_t n, int64_t k,
                                   int64_t hw) NOTHING
static umt_status sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw) NOTHING
static umt_status bias_relu(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y, int64_t n,
                            int64_t k, int64_t hw) NOTHING
static umt_status bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                     int64_t k, int64_t hw) NOTHING
static umt_status bias_relu_dropout(umt_dtype dtype, const void *x, const float *bias, void *y, int64_t rows,
                                    int64_t k, const umt_dropout_draw *drop) NOTHING
static umt_status bias_relu_dropout_backward(umt_dtype dtype, const void *y, void *dy, float *dbias, int64_t rows,
                                             int64_t k, float p) NOTHING
static umt_status max_pool_forward(const umt_pool_shape *shape, const float *x, float *y, int32_t *argmax) NOTHING
static umt_status max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const float *dy,
                                    float *dx) NOTHING
static umt_status max_pool_dropout_backward(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                            const void *dy, void *dx, float p) NOTHING
static umt_status bias_relu_max_pool_dropout_forward(const umt_pool_shape *shape, const void *x, const float *bias,
                                                     void *y, uint8_t *pick, const umt_dropout_draw *drop) NOTHING
static umt_status bias_relu_max_pool_dropout_backward(const umt_pool_shape *shape, const uint8_t *pick,
                                                      const void *y, void *dy, void *dx, bool dx_fresh, float *dbias,
                                                      float p) NOTHING
static umt_status avg_pool_forward(const umt_pool_shape *shape, const float *x, float *y) NOTHING
static umt_status avg_pool_backward(const umt_pool_shape *shape, const float *dy, float *dx) NOTHING
static umt_status dropout_forward(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first, float p,
                                  uint64_t seed, const uint64_t *seed_on_device) NOTHING
static umt_status dropout_backward(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p) NOTHING
static umt_status batchnorm_forward_train(const float *x, const float *gamma, const float *beta, float *y,
                                          float *running_mean, float *running_var, float *save_mean,
                                          float *save_inv_std, int64_t n, int64_t c, int64_t hw, float momentum,
                                          float eps) NOTHING
static umt_status batchnorm_forward_eval(const float *x, const float *gamma, const float *beta,
                                         const float *running_mean, const float *running_var, float *y, int64_t n,
                                         int64_t c, int64_t hw, float eps) NOTHING
static umt_status batchnorm_backward(const float *x, const float *dy, const float *gamma, const float *save_mean,
                                     const float *save_inv_std, float *dx, float *dgamma, float *dbeta, int64_t n,
                                     int64_t c, int64_t hw) NOTHING
static umt_status sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                             float weight_decay) NOTHING
static umt_status adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, bool decoupled, int64_t step) NOTHING
static umt_status adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                  float lr, float rho, float eps, float weight_decay) NOTHING
static umt_status step_decide(const umt_update_tensor *tensors, int count, double *partials,
                              umt_step_scalars *scalars, umt_step_options options) NOTHING
static umt_status sgd_update_fused(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                   float momentum, float weight_decay, umt_update_fusion fusion) NOTHING
static umt_status adam_update_fused(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                    int64_t step, umt_update_fusion fusion) NOTHING
static umt_status adadelta_update_fused(float *param, const float *grad, float *square_avg, float *delta_avg,
                                        int64_t n, float lr, float rho, float eps, float weight_decay,
                                        umt_update_fusion fusion) NOTHING
static umt_status multi_update(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                               umt_update_fusion common) NOTHING

/* ----------------------------------------------------------------------------------------- */
/* Group 2: low precision */

static umt_status lp_recast(const void *src, umt_dtype src_dtype, bool src_nhwc, void *dst, umt_dtype dst_dtype,
                            bool dst_nhwc, int64_t n, int64_t c, int64_t hw, bool accumulate) NOTHING
static umt_status lp_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                          int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                          umt_dtype ab_dtype, umt_dtype c_dtype) NOTHING
static umt_status lp_add_rows(umt_dtype dtype, const void *x, const float *bias, void *out, int64_t rows,
                              int64_t cols) NOTHING
static umt_status lp_sum_rows(umt_dtype dtype, const void *dy, float *dbias, int64_t rows, int64_t cols) NOTHING
static umt_status lp_relu(umt_dtype dtype, const void *x, void *y, int64_t n) NOTHING
static umt_status lp_relu_backward(umt_dtype dtype, const void *y, const void *dy, void *dx, int64_t n) NOTHING
static umt_status lp_dropout_forward(umt_dtype dtype, const void *x, void *y, uint8_t *mask, int64_t n,
                                     int64_t first, float p, uint64_t seed, const uint64_t *seed_on_device) NOTHING
static umt_status lp_dropout_backward(umt_dtype dtype, const uint8_t *mask, const void *dy, void *dx, int64_t n,
                                      float p) NOTHING
static umt_status lp_conv2d_forward(const umt_conv_shape *shape, const void *x, const void *w, void *y,
                                    void *workspace, size_t workspace_bytes) NOTHING
static umt_status lp_conv2d_backward_data(const umt_conv_shape *shape, const void *w, const void *dy, void *dx,
                                          bool overwrite, void *workspace, size_t workspace_bytes) NOTHING
static umt_status lp_conv2d_backward_filter(const umt_conv_shape *shape, const void *x, const void *dy, float *dw,
                                            void *workspace, size_t workspace_bytes) NOTHING
static umt_status lp_add_channel_bias(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y,
                                      int64_t n, int64_t k, int64_t hw) NOTHING
static umt_status lp_sum_channel_bias(umt_dtype dtype, bool nhwc, const void *dy, float *dbias, int64_t n,
                                      int64_t k, int64_t hw) NOTHING
static umt_status lp_max_pool_forward(const umt_pool_shape *shape, const void *x, void *y, int32_t *argmax) NOTHING
static umt_status lp_max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const void *dy,
                                       void *dx) NOTHING
static umt_status lp_avg_pool_forward(const umt_pool_shape *shape, const void *x, void *y) NOTHING
static umt_status lp_avg_pool_backward(const umt_pool_shape *shape, const void *dy, void *dx) NOTHING
static umt_status lp_softmax_xent(umt_dtype dtype, const void *logits, const int32_t *labels, float *probs,
                                  float *loss, int64_t rows, int64_t cols) NOTHING
static umt_status lp_softmax_xent_backward(umt_dtype dtype, const float *probs, const int32_t *labels,
                                           const float *dloss, void *dlogits, int64_t rows, int64_t cols,
                                           bool fresh) NOTHING
static umt_status lp_gather_batch(umt_dtype dtype, const uint8_t *samples, const uint8_t *labels,
                                  const int64_t *indices, int64_t count, int64_t c, int64_t hw, float mean, float std,
                                  void *images_out, int32_t *labels_out) NOTHING

/* ----------------------------------------------------------------------------------------- */
/* Group 3: fused fast paths */

static umt_status conv2d_relu_forward(const umt_conv_shape *shape, const void *x, const void *w, const float *bias,
                                      void *y, void *workspace, size_t workspace_bytes) NOTHING
static umt_status conv2d_relu_backward_filter(const umt_conv_shape *shape, const void *x, const void *y, void *dy,
                                              bool keep_dy, float *dw, float *dbias, void *workspace,
                                              size_t workspace_bytes) NOTHING
static umt_status linear_xent(umt_dtype dtype, const void *x, const void *w, const float *bias, const int32_t *labels,
                              float *diff, float *loss, int64_t rows, int64_t in, int64_t cols) NOTHING
static umt_status linear_xent_backward(umt_dtype dtype, const void *x, const void *w, const float *diff,
                                       const float *dloss, void *dx, bool dx_fresh, float *dw, float *dbias,
                                       int64_t rows, int64_t in, int64_t cols) NOTHING

/* ----------------------------------------------------------------------------------------- */
/* Group 4: the second stream (kept, so that a dry step takes the branch's workspace as a real
 * step does) */

static umt_status branch_begin(void *cublas_workspace, size_t bytes) NOTHING
static umt_status branch_end(void) NOTHING
static umt_status branch_join(void) NOTHING

/* ----------------------------------------------------------------------------------------- */
/* The table */

/* slot = the no-op where the real table has the slot, else NULL (the op then takes the path it
 * takes without it, as in a real step). */
#define DRY(group, slot, noop) out->group.slot = real->group.slot ? noop : NULL

void umt_backend_dry(const umt_backend *real, umt_backend *out) {
    *out = (umt_backend){.name = "dry"};
    DRY(f32, fill, fill);
    DRY(f32, copy, copy);
    DRY(f32, upload, upload);
    DRY(f32, download, download);
    DRY(f32, convert, convert);
    DRY(f32, zero, zero);
    DRY(f32, zero_many, zero_many);
    DRY(f32, gemm, gemm);
    DRY(f32, add, add);
    DRY(f32, add_rows, add_rows);
    DRY(f32, accumulate, accumulate);
    DRY(f32, keep_and_add, keep_and_add);
    DRY(f32, sum_rows, sum_rows);
    DRY(f32, mul, mul);
    DRY(f32, accumulate_product, accumulate_product);
    DRY(f32, relu, relu);
    DRY(f32, relu_backward, relu_backward);
    DRY(f32, mean, mean);
    DRY(f32, mean_backward, mean_backward);
    DRY(f32, log_softmax, log_softmax);
    DRY(f32, log_softmax_backward, log_softmax_backward);
    DRY(f32, nll_loss, nll_loss);
    DRY(f32, nll_loss_backward, nll_loss_backward);
    DRY(f32, softmax_xent, softmax_xent);
    DRY(f32, softmax_xent_backward, softmax_xent_backward);
    DRY(f32, count_correct, count_correct);
    DRY(f32, gather_batch, gather_batch);
    /* A question about a shape, not a kernel: the real answer (cuDNN's refusal of a tensor over
     * INT_MAX elements included). */
    out->f32.conv2d_workspace_bytes = real->f32.conv2d_workspace_bytes;
    DRY(f32, conv2d_forward, conv2d_forward);
    DRY(f32, conv2d_backward_data, conv2d_backward_data);
    DRY(f32, conv2d_backward_filter, conv2d_backward_filter);
    DRY(f32, add_channel_bias, add_channel_bias);
    DRY(f32, sum_channel_bias, sum_channel_bias);
    DRY(f32, bias_relu, bias_relu);
    DRY(f32, bias_relu_backward, bias_relu_backward);
    DRY(f32, bias_relu_dropout, bias_relu_dropout);
    DRY(f32, bias_relu_dropout_backward, bias_relu_dropout_backward);
    DRY(f32, max_pool_forward, max_pool_forward);
    DRY(f32, max_pool_backward, max_pool_backward);
    DRY(f32, max_pool_dropout_backward, max_pool_dropout_backward);
    DRY(f32, bias_relu_max_pool_dropout_forward, bias_relu_max_pool_dropout_forward);
    DRY(f32, bias_relu_max_pool_dropout_backward, bias_relu_max_pool_dropout_backward);
    DRY(f32, avg_pool_forward, avg_pool_forward);
    DRY(f32, avg_pool_backward, avg_pool_backward);
    DRY(f32, dropout_forward, dropout_forward);
    DRY(f32, dropout_backward, dropout_backward);
    DRY(f32, batchnorm_forward_train, batchnorm_forward_train);
    DRY(f32, batchnorm_forward_eval, batchnorm_forward_eval);
    DRY(f32, batchnorm_backward, batchnorm_backward);
    DRY(f32, sgd_update, sgd_update);
    DRY(f32, adam_update, adam_update);
    DRY(f32, adadelta_update, adadelta_update);
    DRY(f32, step_decide, step_decide);
    DRY(f32, sgd_update_fused, sgd_update_fused);
    DRY(f32, adam_update_fused, adam_update_fused);
    DRY(f32, adadelta_update_fused, adadelta_update_fused);
    DRY(f32, multi_update, multi_update);

    DRY(lowp, recast, lp_recast);
    DRY(lowp, gemm, lp_gemm);
    DRY(lowp, add_rows, lp_add_rows);
    DRY(lowp, sum_rows, lp_sum_rows);
    DRY(lowp, relu, lp_relu);
    DRY(lowp, relu_backward, lp_relu_backward);
    DRY(lowp, dropout_forward, lp_dropout_forward);
    DRY(lowp, dropout_backward, lp_dropout_backward);
    DRY(lowp, conv2d_forward, lp_conv2d_forward);
    DRY(lowp, conv2d_backward_data, lp_conv2d_backward_data);
    DRY(lowp, conv2d_backward_filter, lp_conv2d_backward_filter);
    DRY(lowp, add_channel_bias, lp_add_channel_bias);
    DRY(lowp, sum_channel_bias, lp_sum_channel_bias);
    DRY(lowp, max_pool_forward, lp_max_pool_forward);
    DRY(lowp, max_pool_backward, lp_max_pool_backward);
    DRY(lowp, avg_pool_forward, lp_avg_pool_forward);
    DRY(lowp, avg_pool_backward, lp_avg_pool_backward);
    DRY(lowp, softmax_xent, lp_softmax_xent);
    DRY(lowp, softmax_xent_backward, lp_softmax_xent_backward);
    DRY(lowp, gather_batch, lp_gather_batch);

    /* A question again: whether the fused path takes the shape. */
    out->fused.conv2d_relu_supports = real->fused.conv2d_relu_supports;
    DRY(fused, conv2d_relu_forward, conv2d_relu_forward);
    DRY(fused, conv2d_relu_backward_filter, conv2d_relu_backward_filter);
    out->fused.linear_xent_supports = real->fused.linear_xent_supports;
    DRY(fused, linear_xent, linear_xent);
    DRY(fused, linear_xent_backward, linear_xent_backward);

    DRY(streams, branch_begin, branch_begin);
    DRY(streams, branch_end, branch_end);
    DRY(streams, branch_join, branch_join);
}
