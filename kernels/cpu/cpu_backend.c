/*
 * kernels/cpu/cpu_backend.c — the CPU backend: the f32 reference group of umt_backend
 * (kernels/backend.h), every slot filled with a plain-C kernel of this folder. The low-precision
 * and fused groups stay empty: a context of bf16 or fp16 is refused on the CPU.
 *
 * Host memory is the device here, so upload and download are the same memcpy as copy.
 */
#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"

static const umt_backend cpu_backend = {
    .name = "cpu",
    .f32 = {
        .fill = umt_cpu_fill,
        .copy = umt_cpu_copy,
        .upload = umt_cpu_copy,
        .download = umt_cpu_copy,
        .convert = umt_cpu_convert,
        .zero = umt_cpu_zero,
        .zero_many = umt_cpu_zero_many,
        .gemm = umt_cpu_gemm,
        .add = umt_cpu_add,
        .add_rows = umt_cpu_add_rows,
        .accumulate = umt_cpu_accumulate,
        .keep_and_add = umt_cpu_keep_and_add,
        .sum_rows = umt_cpu_sum_rows,
        .mul = umt_cpu_mul,
        .accumulate_product = umt_cpu_accumulate_product,
        .relu = umt_cpu_relu,
        .relu_backward = umt_cpu_relu_backward,
        .mean = umt_cpu_mean,
        .mean_backward = umt_cpu_mean_backward,
        .log_softmax = umt_cpu_log_softmax,
        .log_softmax_backward = umt_cpu_log_softmax_backward,
        .nll_loss = umt_cpu_nll_loss,
        .nll_loss_backward = umt_cpu_nll_loss_backward,
        .softmax_xent = umt_cpu_softmax_xent,
        .softmax_xent_backward = umt_cpu_softmax_xent_backward,
        .count_correct = umt_cpu_count_correct,
        .gather_batch = umt_cpu_gather_batch,
        .conv2d_workspace_bytes = umt_cpu_conv2d_workspace_bytes,
        .conv2d_forward = umt_cpu_conv2d_forward,
        .conv2d_backward_data = umt_cpu_conv2d_backward_data,
        .conv2d_backward_filter = umt_cpu_conv2d_backward_filter,
        .add_channel_bias = umt_cpu_add_channel_bias,
        .sum_channel_bias = umt_cpu_sum_channel_bias,
        .bias_relu = umt_cpu_bias_relu,
        .bias_relu_backward = umt_cpu_bias_relu_backward,
        .bias_relu_dropout = umt_cpu_bias_relu_dropout,
        .bias_relu_dropout_backward = umt_cpu_bias_relu_dropout_backward,
        .max_pool_forward = umt_cpu_max_pool_forward,
        .max_pool_backward = umt_cpu_max_pool_backward,
        .max_pool_dropout_backward = umt_cpu_max_pool_dropout_backward,
        .bias_relu_max_pool_dropout_forward = umt_cpu_bias_relu_max_pool_dropout_forward,
        .bias_relu_max_pool_dropout_backward = umt_cpu_bias_relu_max_pool_dropout_backward,
        .avg_pool_forward = umt_cpu_avg_pool_forward,
        .avg_pool_backward = umt_cpu_avg_pool_backward,
        .dropout_forward = umt_cpu_dropout_forward,
        .dropout_backward = umt_cpu_dropout_backward,
        .batchnorm_forward_train = umt_cpu_batchnorm_forward_train,
        .batchnorm_forward_eval = umt_cpu_batchnorm_forward_eval,
        .batchnorm_backward = umt_cpu_batchnorm_backward,
        .sgd_update = umt_cpu_sgd_update,
        .adam_update = umt_cpu_adam_update,
        .adadelta_update = umt_cpu_adadelta_update,
        .step_decide = umt_cpu_step_decide,
        .sgd_update_fused = umt_cpu_sgd_update_fused,
        .adam_update_fused = umt_cpu_adam_update_fused,
        .adadelta_update_fused = umt_cpu_adadelta_update_fused,
        .multi_update = umt_cpu_multi_update,
    },
};

const umt_backend *umt_cpu_backend(void) { return &cpu_backend; }
