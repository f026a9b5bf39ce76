/*
 * kernels/backend.h — the table of kernels an op calls, one table per device.
 *
 * Ops (core/ops/) check shapes, allocate outputs from the pools and record the tape; then
 * they call a kernel of the context's table on raw pointers: ctx->backend->f32.gemm(...). The
 * slots come in four groups: the f32 reference, which the CPU table (kernels/cpu/) fills and
 * which is the readable reference; low precision; fused fast paths; a second stream for weight
 * gradients (core/branch.h). The CUDA table (kernels/cuda/) fills all four. All tensors are
 * row-major and contiguous; float means f32 unless a dtype is passed.
 *
 * Naming: `x_backward` kernels ACCUMULATE into the input gradient (dx += ...), because a
 * tensor used twice receives the sum of both gradients.
 */
#ifndef UMT_KERNELS_BACKEND_H
#define UMT_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/optim_step.h"
#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shape of a 2-D convolution, dilation 1, no groups:
 * x [n,c,h,w] * w [k,c,r,s] -> y [n,k,p,q], p = (h + 2*pad - r)/stride + 1, q likewise.
 * The f32 slots take NCHW f32 (dtype and nhwc left zero); the _lp slots read dtype and nhwc. */
typedef struct {
    int64_t n, c, h, w; /* input */
    int64_t k, r, s;    /* filters: k of c x r x s */
    int64_t p, q;       /* output height and width */
    int64_t stride, pad;
    umt_dtype dtype;    /* of x, w, y and their gradients (_lp slots: bf16 or f16) */
    bool nhwc;          /* x, y stored N,H,W,C and w K,R,S,C (_lp slots) */
} umt_conv_shape;

/* The shape of a 2-D pooling window over x [n,c,h,w] -> y [n,c,p,q], no padding; dtype and
 * nhwc as in umt_conv_shape (read by the _lp slots only). */
typedef struct {
    int64_t n, c, h, w;
    int64_t p, q;
    int64_t window, stride;
    umt_dtype dtype;
    bool nhwc;
} umt_pool_shape;

/* A dropout drawn by the kernel that writes its input (bias_relu_max_pool_dropout_forward):
 * output element i is kept when umt_dropout_keep(seed, first + i, p), below, and scaled by
 * 1/(1-p), exactly as dropout_forward over the stored output computes it; p = 0: none. No mask
 * is written (the backward reads the output instead). seed_on_device as in dropout_forward. */
typedef struct {
    float p;
    uint64_t seed;
    const uint64_t *seed_on_device;
    int64_t first;
} umt_dropout_draw;

/* --- Group 1, the f32 reference: each op's f32 kernel, the fused ones included (bias + ReLU,
 *     max pool + dropout, the optimizer's fused steps). Every backend fills every slot; the CPU
 *     backend (kernels/cpu/) is exactly this group. The few slots that take a dtype compute f32
 *     on the CPU, and bf16 and f16 too where the backend has group 2. --- */
typedef struct {
    /* --- memory --- */
    umt_status (*fill)(float *x, int64_t n, float value);
    umt_status (*copy)(void *dst, const void *src, size_t bytes);
    umt_status (*upload)(void *dst, const void *host_src, size_t bytes);
    umt_status (*download)(void *host_dst, const void *src, size_t bytes);
    /* dst[i] = (dst_dtype) src[i] between f32, bf16 and f16, round to nearest even. */
    umt_status (*convert)(const void *src, umt_dtype src_dtype, void *dst, umt_dtype dst_dtype, int64_t n);
    /* Zeroes bytes bytes at x (gradients of any dtype start from it). */
    umt_status (*zero)(void *x, size_t bytes);
    /* Zeroes count blocks, blocks[i] of bytes[i] bytes each (a multiple of 4), as zero would one
     * by one: a step's parameter gradients in one launch instead of one each. */
    umt_status (*zero_many)(int count, void *const *blocks, const size_t *bytes);

    /* --- matrix product: C = alpha * op(A) op(B) + beta * C, op(A) [m,k], op(B) [k,n] --- */
    umt_status (*gemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

    /* --- elementwise --- */
    umt_status (*add)(const float *a, const float *b, float *out, int64_t n);
    /* out[r,c] = x[r,c] + bias[c] (x may equal out) */
    umt_status (*add_rows)(const float *x, const float *bias, float *out, int64_t rows, int64_t cols);
    /* dst += alpha * src */
    umt_status (*accumulate)(float *dst, const float *src, float alpha, int64_t n);
    /* last = x and sum += x, in one pass: a running total that keeps the latest value too (the
     * step graph's loss, core/step/step_graph.c: one launch a step instead of a copy and an add) */
    umt_status (*keep_and_add)(float *last, float *sum, const float *x, int64_t n);
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

    /* --- convolution: the workspace (from the workspace pool) is at least
     *     conv2d_workspace_bytes(shape) bytes; the backend may pick and cache an algorithm per
     *     shape there. y is overwritten; dx and dw accumulate. --- */
    umt_status (*conv2d_workspace_bytes)(const umt_conv_shape *shape, size_t *bytes);
    umt_status (*conv2d_forward)(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                 void *workspace, size_t workspace_bytes);
    umt_status (*conv2d_backward_data)(const umt_conv_shape *shape, const float *w, const float *dy, float *dx,
                                       void *workspace, size_t workspace_bytes);
    umt_status (*conv2d_backward_filter)(const umt_conv_shape *shape, const float *x, const float *dy, float *dw,
                                         void *workspace, size_t workspace_bytes);
    /* y[n,k,:] = x[n,k,:] + bias[k] over n images of k channels of hw pixels (y may equal x) */
    umt_status (*add_channel_bias)(const float *x, const float *bias, float *y, int64_t n, int64_t k, int64_t hw);
    /* dbias[k] += sum over n and hw of dy[n,k,:] */
    umt_status (*sum_channel_bias)(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw);

    /* --- bias + ReLU fused (core/ops/conv.c, core/ops/matmul.c) over n images of k channels of
     *     hw pixels, x and y of dtype: f32 NCHW, or bf16/f16 NCHW or NHWC (nhwc); a linear
     *     layer's [rows, k] output is hw = 1. bias is f32, NULL for none. --- */
    /* y = max(x + bias[channel], 0) (y may equal x) */
    umt_status (*bias_relu)(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y, int64_t n,
                            int64_t k, int64_t hw);
    /* IN PLACE: dy[i] = y[i] > 0 ? dy[i] : 0, the gradient before the ReLU, which the layer's
     * own backward then reads; dbias[channel] += the channel's sum of it (dbias NULL: none) */
    umt_status (*bias_relu_backward)(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias, int64_t n,
                                     int64_t k, int64_t hw);
    /* A linear layer's bias + ReLU, then the dropout `drop` that follows it (NULL or p = 0:
     * none), over [rows, k] of dtype: y = bias_relu's value, then dropout_forward's over it, bit
     * for bit the two in turn, without a mask (the backward reads y) or a pass between them */
    umt_status (*bias_relu_dropout)(umt_dtype dtype, const void *x, const float *bias, void *y, int64_t rows,
                                    int64_t k, const umt_dropout_draw *drop);
    /* Its backward, y the dropout's output (0 wherever the ReLU or the dropout zeroed it), IN
     * PLACE: dy[i] = y[i] > 0 ? 0 + dy[i] / (1 - p) rounded to the dtype : 0 (p = 0: dy[i]), the
     * gradient before the dropout and the ReLU as the unfused backwards store it; dbias[channel]
     * += the channel's sum of it (NULL: none) */
    umt_status (*bias_relu_dropout_backward)(umt_dtype dtype, const void *y, void *dy, float *dbias, int64_t rows,
                                             int64_t k, float p);

    /* --- pooling: max keeps the index (0..h*w-1 within its channel plane) of the first
     *     maximum of each window for backward; dx accumulates --- */
    umt_status (*max_pool_forward)(const umt_pool_shape *shape, const float *x, float *y, int32_t *argmax);
    umt_status (*max_pool_backward)(const umt_pool_shape *shape, const int32_t *argmax, const float *dy, float *dx);
    /* Max pool then dropout (core/ops/pool.c), backward in one pass, windows apart (stride >=
     * window): dx[pick of output o] += dy[o] / (1 - p) where mask[o], in shape->dtype (f32, or
     * bf16/f16 in either layout), the scaled gradient rounded to the dtype first as the unfused
     * dropout backward stores it */
    umt_status (*max_pool_dropout_backward)(const umt_pool_shape *shape, const int32_t *argmax, const uint8_t *mask,
                                            const void *dy, void *dx, float p);
    /* A convolution's bias and ReLU applied on the way into a max pool (core/ops/pool.c), in
     * shape->dtype and layout as above, windows apart and at most 256 positions each: y = the
     * window's first maximum of max(x + bias[channel], 0) rounded to the dtype, bit for bit
     * bias_relu then max_pool_forward, without the full-size intermediate; pick[o] = the
     * maximum's position in its window, i * window + j (one byte, where argmax takes four);
     * then the dropout `drop` over y (NULL: none), as dropout_forward in place would leave y. */
    umt_status (*bias_relu_max_pool_dropout_forward)(const umt_pool_shape *shape, const void *x, const float *bias,
                                                     void *y, uint8_t *pick, const umt_dropout_draw *drop);
    /* Its backward, after the dropout of probability p that followed (0: none), y that
     * dropout's output (0 wherever the ReLU or the dropout zeroed it): g = y > 0 ? dy / (1 - p)
     * rounded to the dtype : 0 (the gradient before the dropout and the ReLU, as the unfused
     * backwards store it), dbias[channel] += g's sums (NULL: none), and dx[the input at pick[o]
     * in o's window] += g[o] (NULL: none); dx_fresh: dx holds no values yet (the tape's
     * unzeroed new gradient, core/tape.h) and every element is written, 0 off the picks. dy is
     * the backward's scratch: it may be left holding g (a kernel that writes g there and reads
     * it back) or as it was (one that never stores g). */
    umt_status (*bias_relu_max_pool_dropout_backward)(const umt_pool_shape *shape, const uint8_t *pick,
                                                      const void *y, void *dy, void *dx, bool dx_fresh, float *dbias,
                                                      float p);
    umt_status (*avg_pool_forward)(const umt_pool_shape *shape, const float *x, float *y);
    umt_status (*avg_pool_backward)(const umt_pool_shape *shape, const float *dy, float *dx);

    /* --- dropout: element i is kept when umt_dropout_keep(seed, first + i, p) (kernels/backend.h),
     *     the same counter-based draw on every backend; kept elements are scaled by 1/(1-p).
     *     first is element 0's index in the whole batch's tensor (0 unless the batch runs as
     *     micro-batches: core/micro_batch.c), so that a micro-batch draws the masks the whole
     *     batch would. mask[i] = 1 if kept, else 0 (mask NULL: none written); dx accumulates.
     *     A non-NULL seed_on_device is read (in stream order) instead of seed: a CUDA graph
     *     replays with a new seed there --- */
    umt_status (*dropout_forward)(const float *x, float *y, uint8_t *mask, int64_t n, int64_t first, float p,
                                  uint64_t seed, const uint64_t *seed_on_device);
    umt_status (*dropout_backward)(const uint8_t *mask, const float *dy, float *dx, int64_t n, float p);

    /* --- batch norm over channels of x [n,c,hw] (spatial): training uses the batch's mean and
     *     biased variance, saves mean and 1/sqrt(var+eps) for backward, and moves the running
     *     statistics by momentum (running_var with the unbiased variance, as PyTorch);
     *     evaluation uses the running statistics; dx, dgamma, dbeta accumulate, and a NULL
     *     one of them (an input that takes no gradient) is not computed --- */
    umt_status (*batchnorm_forward_train)(const float *x, const float *gamma, const float *beta, float *y,
                                          float *running_mean, float *running_var, float *save_mean,
                                          float *save_inv_std, int64_t n, int64_t c, int64_t hw, float momentum,
                                          float eps);
    umt_status (*batchnorm_forward_eval)(const float *x, const float *gamma, const float *beta,
                                         const float *running_mean, const float *running_var, float *y, int64_t n,
                                         int64_t c, int64_t hw, float eps);
    umt_status (*batchnorm_backward)(const float *x, const float *dy, const float *gamma, const float *save_mean,
                                     const float *save_inv_std, float *dx, float *dgamma, float *dbeta, int64_t n,
                                     int64_t c, int64_t hw);

    /* --- optimizer updates, in place over n elements (PyTorch's update rules) --- */
    umt_status (*sgd_update)(float *param, const float *grad, float *velocity, int64_t n, float lr, float momentum,
                             float weight_decay);
    /* step counts from 1; decoupled selects AdamW's weight decay */
    umt_status (*adam_update)(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, bool decoupled, int64_t step);
    umt_status (*adadelta_update)(float *param, const float *grad, float *square_avg, float *delta_avg, int64_t n,
                                  float lr, float rho, float eps, float weight_decay);

    /* --- fused optimizer steps (kernels/optim_step.h tells the story): the same rules as above,
     *     each in one pass that may also scale or clip the gradient, skip the step and write
     *     the parameter's low-precision copy; a zero fusion is the plain update, bit for bit --- */
    /* The step's decision: tensor t's sum(grad^2) into partials[t * UMT_GRAD_SUMSQ_PARTIALS ...], a
     * fixed split in double, then once all are written, every partial in a fixed order and
     * umt_step_finish(scalars) (CUDA: one launch per 32 tensors, the last one's last block decides) */
    umt_status (*step_decide)(const umt_update_tensor *tensors, int count, double *partials,
                              umt_step_scalars *scalars, umt_step_options options);
    umt_status (*sgd_update_fused)(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                   float momentum, float weight_decay, umt_update_fusion fusion);
    umt_status (*adam_update_fused)(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                    float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                    int64_t step, umt_update_fusion fusion);
    umt_status (*adadelta_update_fused)(float *param, const float *grad, float *square_avg, float *delta_avg,
                                        int64_t n, float lr, float rho, float eps, float weight_decay,
                                        umt_update_fusion fusion);
    /* The fused update of rule.kind over count tensors at once (CUDA: one launch per 32), bit
     * for bit the per-tensor slots above. common gives scalars, lr_on_device and lowp_dtype;
     * each tensor its own lowp copy and layout. */
    umt_status (*multi_update)(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                               umt_update_fusion common);
} umt_backend_f32;

/* --- Group 2, low precision (core/precision.h): activations and their gradients in bf16 or f16
 *     (dtype), 4-D ones NHWC where nhwc says so; parameters, their gradients, biases and every
 *     accumulation stay f32. The CUDA backend fills it; the CPU leaves it empty, and
 *     umt_context_create refuses a low precision there. --- */
typedef struct {
    /* dst (=, or += when accumulate) src, converting dtypes and, for n images of c channels of
     * hw pixels, the layout: one slot for casts, layout changes and their backwards. */
    umt_status (*recast)(const void *src, umt_dtype src_dtype, bool src_nhwc, void *dst, umt_dtype dst_dtype,
                         bool dst_nhwc, int64_t n, int64_t c, int64_t hw, bool accumulate);
    /* C = alpha op(A) op(B) + beta C with A, B of ab_dtype and C of c_dtype (f32 or ab_dtype),
     * products on tensor cores, accumulation in f32 */
    umt_status (*gemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                       int64_t lda, const void *b, int64_t ldb, float beta, void *c, int64_t ldc,
                       umt_dtype ab_dtype, umt_dtype c_dtype);
    umt_status (*add_rows)(umt_dtype dtype, const void *x, const float *bias, void *out, int64_t rows,
                           int64_t cols);
    umt_status (*sum_rows)(umt_dtype dtype, const void *dy, float *dbias, int64_t rows, int64_t cols);
    umt_status (*relu)(umt_dtype dtype, const void *x, void *y, int64_t n);
    umt_status (*relu_backward)(umt_dtype dtype, const void *y, const void *dy, void *dx, int64_t n);
    umt_status (*dropout_forward)(umt_dtype dtype, const void *x, void *y, uint8_t *mask, int64_t n, int64_t first,
                                  float p, uint64_t seed, const uint64_t *seed_on_device);
    umt_status (*dropout_backward)(umt_dtype dtype, const uint8_t *mask, const void *dy, void *dx, int64_t n,
                                   float p);
    /* Convolution on bf16/f16 NHWC tensors; dw is an f32 gradient (accumulated); dx accumulates,
     * or with overwrite is written whole (a fresh gradient, core/tape.h: nothing to add to) */
    umt_status (*conv2d_forward)(const umt_conv_shape *shape, const void *x, const void *w, void *y,
                                 void *workspace, size_t workspace_bytes);
    umt_status (*conv2d_backward_data)(const umt_conv_shape *shape, const void *w, const void *dy, void *dx,
                                       bool overwrite, void *workspace, size_t workspace_bytes);
    umt_status (*conv2d_backward_filter)(const umt_conv_shape *shape, const void *x, const void *dy, float *dw,
                                         void *workspace, size_t workspace_bytes);
    umt_status (*add_channel_bias)(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y,
                                   int64_t n, int64_t k, int64_t hw);
    umt_status (*sum_channel_bias)(umt_dtype dtype, bool nhwc, const void *dy, float *dbias, int64_t n,
                                   int64_t k, int64_t hw);
    /* Pooling as in group 1; argmax indexes the window's first maximum in its (h, w) plane */
    umt_status (*max_pool_forward)(const umt_pool_shape *shape, const void *x, void *y, int32_t *argmax);
    umt_status (*max_pool_backward)(const umt_pool_shape *shape, const int32_t *argmax, const void *dy,
                                    void *dx);
    umt_status (*avg_pool_forward)(const umt_pool_shape *shape, const void *x, void *y);
    umt_status (*avg_pool_backward)(const umt_pool_shape *shape, const void *dy, void *dx);
    /* Softmax cross-entropy over logits of dtype, each widened to f32 as it is read: group 1's
     * probs and loss for the widened logits, bit for bit, with no f32 copy of them made */
    umt_status (*softmax_xent)(umt_dtype dtype, const void *logits, const int32_t *labels, float *probs, float *loss,
                               int64_t rows, int64_t cols);
    /* Its backward into a dtype gradient: g = group 1's gradient into a zeroed f32 one (0 +
     * dloss[0] / rows * (probs - onehot)), then dlogits = round(g + dlogits), or round(g) when
     * fresh (dlogits holds no values yet: the tape's unzeroed new gradient, core/tape.h) */
    umt_status (*softmax_xent_backward)(umt_dtype dtype, const float *probs, const int32_t *labels,
                                        const float *dloss, void *dlogits, int64_t rows, int64_t cols, bool fresh);
    /* Group 1's gather_batch into images of dtype, NHWC (samples of c channels of hw pixels, each
     * stored C,H,W): every value group 1's f32 one rounded once, as recast would round it, so a
     * first layer that would cast the batch gets its bits without the cast's pass */
    umt_status (*gather_batch)(umt_dtype dtype, const uint8_t *samples, const uint8_t *labels, const int64_t *indices,
                               int64_t count, int64_t c, int64_t hw, float mean, float std, void *images_out,
                               int32_t *labels_out);
} umt_backend_lowp;

/* --- Group 3, fused fast paths: one kernel for what an op otherwise does with several slots of
 *     the groups above, bit for bit the same result. An op takes it where the slot is set and
 *     says yes for the shape; the CUDA backend fills it. --- */
typedef struct {
    /* Convolution, bias and ReLU in one pass, where the backend has it for the shape, in f32 or
     * a half dtype (the slot NULL or conv2d_relu_supports false: the op runs the convolution's
     * forward slot, then f32.bias_relu). The forward gives bit for bit those two ops' y (the
     * product rounded to the dtype, then the bias and the ReLU). The backward's weight side reads
     * y and dy once: the masked gradient (y > 0 ? dy : 0, written over dy when keep_dy, for the
     * data gradient to read), and from it dw += the weight gradient and dbias += its channel
     * sums (dbias may be NULL). */
    bool (*conv2d_relu_supports)(const umt_conv_shape *shape);
    umt_status (*conv2d_relu_forward)(const umt_conv_shape *shape, const void *x, const void *w, const float *bias,
                                      void *y, void *workspace, size_t workspace_bytes);
    umt_status (*conv2d_relu_backward_filter)(const umt_conv_shape *shape, const void *x, const void *y, void *dy,
                                              bool keep_dy, float *dw, float *dbias, void *workspace,
                                              size_t workspace_bytes);
    /* A linear layer and the softmax cross-entropy as one op (umt_linear_softmax_cross_entropy),
     * where the backend has it for the shape (the slots NULL or linear_xent_supports false: the
     * op runs the linear layer's slots, then softmax_xent's). x [rows, in] and w [cols, in] in a
     * half dtype, bias [cols] f32. The forward writes the mean loss of the logits x w^T + bias,
     * each rounded as the two ops store them (the products summed in another order), without
     * the logits in memory, and diff [rows, cols] f32 = softmax - onehot(labels), what
     * softmax_xent_backward reads. The backward makes the logits' gradient from diff and dloss
     * as softmax_xent_backward rounds it, then dx (written when dx_fresh, else added to) and
     * dw and dbias added to; any of the three may be NULL (a call for dw and dbias alone may go to
     * the side stream). */
    bool (*linear_xent_supports)(umt_dtype dtype, int64_t rows, int64_t in, int64_t cols);
    umt_status (*linear_xent)(umt_dtype dtype, const void *x, const void *w, const float *bias, const int32_t *labels,
                              float *diff, float *loss, int64_t rows, int64_t in, int64_t cols);
    umt_status (*linear_xent_backward)(umt_dtype dtype, const void *x, const void *w, const float *diff,
                                       const float *dloss, void *dx, bool dx_fresh, float *dw, float *dbias,
                                       int64_t rows, int64_t in, int64_t cols);
} umt_backend_fused;

/* --- Group 4, a second stream (core/branch.c): a layer's weight gradient runs on it, beside
 *     the input gradient on the compute stream. The CUDA backend fills it; the CPU, whose kernels
 *     run one after another, leaves it empty, and the ops then run everything in order. --- */
typedef struct {
    /* What is launched from here on runs on the side stream, after everything queued so far
     * on the compute stream. Only convolutions' and products' weight gradients go there: the
     * side has its own cuBLAS handle, whose workspace the caller gives when products follow
     * (cublas_workspace of bytes; NULL when none do), and the caller gives the convolutions
     * their own workspace; our kernels' scratch is not shared with it. */
    umt_status (*branch_begin)(void *cublas_workspace, size_t bytes);
    /* Back to the compute stream; the side's work so far may still be running. */
    umt_status (*branch_end)(void);
    /* The compute stream waits for everything launched on the side stream so far. */
    umt_status (*branch_join)(void);
} umt_backend_streams;

/* The table an op calls through ctx->backend: one per device, its slots in four groups. */
typedef struct umt_backend {
    const char *name;
    umt_backend_f32 f32;
    umt_backend_lowp lowp;
    umt_backend_fused fused;
    umt_backend_streams streams;
} umt_backend;

/* Dropout's draw for element i: a counter-based hash of (seed, i) -> uniform in [0, 1),
 * compared with p. The same inline code runs on the CPU and in CUDA kernels, so both backends
 * drop the same elements for the same seed. The hash is splitmix64's of the counter seed + (i +
 * 1) * the golden ratio: consecutive counters give independent-looking bits. A kernel drawing
 * several neighbours adds UMT_DROPOUT_STEP to one counter for the next (the same sum modulo
 * 2^64, with no multiplication) and calls umt_dropout_keep_counter. */
#define UMT_DROPOUT_STEP 0x9e3779b97f4a7c15ULL
#ifdef __CUDACC__
__host__ __device__
#endif
static inline bool umt_dropout_keep_counter(uint64_t z, float p) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) >= p;
}

#ifdef __CUDACC__
__host__ __device__
#endif
static inline bool umt_dropout_keep(uint64_t seed, uint64_t i, float p) {
    return umt_dropout_keep_counter(seed + (i + 1) * UMT_DROPOUT_STEP, p);
}

/* The CPU backend (kernels/cpu/cpu_backend.c). */
const umt_backend *umt_cpu_backend(void);

/* The dry table of real (kernels/dry.c): every kernel a no-op returning UMT_OK, the slots that
 * only answer a question about a shape (conv2d_workspace_bytes, conv2d_relu_supports) the real
 * ones, and a slot real leaves empty empty: what a dry step computes with. */
void umt_backend_dry(const umt_backend *real, umt_backend *out);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_BACKEND_H */
