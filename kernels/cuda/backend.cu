/*
 * kernels/cuda/backend.cu — the CUDA backend's process-wide state and its slot table.
 *
 * One process drives one GPU, so the state is one compute stream with one cuBLAS handle and one
 * cuDNN handle bound to it. Every kernel of this folder is launched on that stream, in call
 * order; nothing here runs on the legacy default stream, which would serialise against every
 * other stream of the process.
 */
#include <stdint.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_handle.h"

/* cuBLAS needs its workspace aligned to 256 bytes, and says only "invalid value" otherwise. */
enum { WORKSPACE_ALIGNMENT = 256 };

static struct {
    bool started;
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cudnnHandle_t cudnn;
    cudaStream_t launch_override; /* umt_cuda_launch_on: where our own kernels go instead, or NULL */
} state;

/* The handle for gemm.cu (declared there: cuda_kernels.h stays free of cuBLAS types). */
extern "C" cublasHandle_t umt_cuda_cublas_handle(void) { return state.cublas; }

extern "C" cudnnHandle_t umt_cuda_cudnn_handle(void) { return state.cudnn; }

/* Destroys whatever start made, in reverse order; errors are ignored because this also cleans
 * up after a failed start, whose error is the one the caller needs to see. */
static void release_state(void) {
    /* The plans hold cuDNN descriptors and algorithms chosen for this device. */
    umt_cuda_conv_forget_plans();
    if (state.cudnn) cudnnDestroy(state.cudnn);
    if (state.cublas) cublasDestroy(state.cublas);
    if (state.stream) cudaStreamDestroy(state.stream);
    state.cudnn = NULL;
    state.cublas = NULL;
    state.stream = NULL;
    state.started = false;
}

static umt_status create_state(int device, void *cublas_workspace, size_t workspace_bytes) {
    UMT_CUDA_TRY(cudaSetDevice(device));
    /* Non-blocking: the stream never waits for (or holds up) the legacy default stream. */
    UMT_CUDA_TRY(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
    UMT_CUBLAS_TRY(cublasCreate(&state.cublas));
    /* cublasSetStream resets the workspace to cuBLAS's own pool, so the workspace comes after. */
    UMT_CUBLAS_TRY(cublasSetStream(state.cublas, state.stream));
    UMT_CUBLAS_TRY(cublasSetWorkspace(state.cublas, cublas_workspace, workspace_bytes));
    /* Default math with CUBLAS_COMPUTE_32F (gemm.cu) is true fp32: TF32 tensor cores are used
     * only when asked for with CUBLAS_TF32_TENSOR_OP_MATH, and the CPU reference is fp32. */
    UMT_CUBLAS_TRY(cublasSetMathMode(state.cublas, CUBLAS_DEFAULT_MATH));
    /* cuDNN takes its workspace per call (conv.cu), from the caller's workspace pool. */
    UMT_CUDNN_TRY(cudnnCreate(&state.cudnn));
    UMT_CUDNN_TRY(cudnnSetStream(state.cudnn, state.stream));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_backend_start(int device, void *cublas_workspace, size_t workspace_bytes) {
    if (state.started) {
        return umt_fail(UMT_ERR_STATE, "cuda backend: already started on device %d, expected a stop first",
                        state.device);
    }
    if (workspace_bytes > 0 && !cublas_workspace) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "cuda backend: workspace NULL with %zu bytes, expected a buffer",
                        workspace_bytes);
    }
    if ((uintptr_t)cublas_workspace % WORKSPACE_ALIGNMENT != 0) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "cuda backend: workspace %p, expected %d-byte alignment",
                        cublas_workspace, WORKSPACE_ALIGNMENT);
    }
    umt_status status = create_state(device, cublas_workspace, workspace_bytes);
    if (status != UMT_OK) {
        release_state();
        return status;
    }
    state.started = true;
    state.device = device;
    return UMT_OK;
}

extern "C" void umt_cuda_backend_stop(void) {
    if (!state.started) return;
    /* Queued kernels may still use the handles' workspaces: let them finish first. */
    cudaStreamSynchronize(state.stream);
    release_state();
}

extern "C" cudaStream_t umt_cuda_stream(void) { return state.launch_override ? state.launch_override : state.stream; }

extern "C" cudaStream_t umt_cuda_launch_on(cudaStream_t stream) {
    cudaStream_t previous = state.launch_override;
    state.launch_override = stream;
    return previous;
}

extern "C" umt_status umt_cuda_synchronize(void) {
    if (!state.started) return umt_fail(UMT_ERR_STATE, "cuda synchronize: backend not started");
    UMT_CUDA_TRY(cudaStreamSynchronize(state.stream));
    /* A loss's label check reports here or at the next download (loss.cu). */
    return umt_cuda_take_label_verdict();
}

/* Ops see the GPU through the same slots as the CPU; upload and download differ from copy here
 * because they also wait, so the host buffer is free (or filled) when they return. nvcc takes
 * C99-style designated initializers in struct order; tests/gpu checks that no slot is NULL. */
static const umt_backend cuda_backend = {
    .name = "cuda",
    .f32 = {
        .fill = umt_cuda_fill,
        .copy = umt_cuda_copy,
        .upload = umt_cuda_upload,
        .download = umt_cuda_download,
        .convert = umt_cuda_convert,
        .zero = umt_cuda_zero,
        .gemm = umt_cuda_gemm,
        .add = umt_cuda_add,
        .add_rows = umt_cuda_add_rows,
        .accumulate = umt_cuda_accumulate,
        .sum_rows = umt_cuda_sum_rows,
        .mul = umt_cuda_mul,
        .accumulate_product = umt_cuda_accumulate_product,
        .relu = umt_cuda_relu,
        .relu_backward = umt_cuda_relu_backward,
        .mean = umt_cuda_mean,
        .mean_backward = umt_cuda_mean_backward,
        .log_softmax = umt_cuda_log_softmax,
        .log_softmax_backward = umt_cuda_log_softmax_backward,
        .nll_loss = umt_cuda_nll_loss,
        .nll_loss_backward = umt_cuda_nll_loss_backward,
        .softmax_xent = umt_cuda_softmax_xent,
        .softmax_xent_backward = umt_cuda_softmax_xent_backward,
        .count_correct = umt_cuda_count_correct,
        .gather_batch = umt_cuda_gather_batch,
        .conv2d_workspace_bytes = umt_cuda_conv2d_workspace_bytes,
        .conv2d_forward = umt_cuda_conv2d_forward,
        .conv2d_backward_data = umt_cuda_conv2d_backward_data,
        .conv2d_backward_filter = umt_cuda_conv2d_backward_filter,
        .add_channel_bias = umt_cuda_add_channel_bias,
        .sum_channel_bias = umt_cuda_sum_channel_bias,
        .bias_relu = umt_cuda_bias_relu,
        .bias_relu_backward = umt_cuda_bias_relu_backward,
        .max_pool_forward = umt_cuda_max_pool_forward,
        .max_pool_backward = umt_cuda_max_pool_backward,
        .max_pool_dropout_backward = umt_cuda_max_pool_dropout_backward,
        .bias_relu_max_pool_forward = umt_cuda_bias_relu_max_pool_forward,
        .bias_relu_max_pool_dropout_backward = umt_cuda_bias_relu_max_pool_dropout_backward,
        .avg_pool_forward = umt_cuda_avg_pool_forward,
        .avg_pool_backward = umt_cuda_avg_pool_backward,
        .dropout_forward = umt_cuda_dropout_forward,
        .dropout_backward = umt_cuda_dropout_backward,
        .batchnorm_forward_train = umt_cuda_batchnorm_forward_train,
        .batchnorm_forward_eval = umt_cuda_batchnorm_forward_eval,
        .batchnorm_backward = umt_cuda_batchnorm_backward,
        .sgd_update = umt_cuda_sgd_update,
        .adam_update = umt_cuda_adam_update,
        .adadelta_update = umt_cuda_adadelta_update,
        .step_decide = umt_cuda_step_decide,
        .sgd_update_fused = umt_cuda_sgd_update_fused,
        .adam_update_fused = umt_cuda_adam_update_fused,
        .adadelta_update_fused = umt_cuda_adadelta_update_fused,
        .multi_update = umt_cuda_multi_update,
    },
    .lowp = {
        .recast = umt_cuda_recast,
        .gemm = umt_cuda_gemm_lp,
        .add_rows = umt_cuda_add_rows_lp,
        .sum_rows = umt_cuda_sum_rows_lp,
        .relu = umt_cuda_relu_lp,
        .relu_backward = umt_cuda_relu_backward_lp,
        .dropout_forward = umt_cuda_dropout_forward_lp,
        .dropout_backward = umt_cuda_dropout_backward_lp,
        .conv2d_forward = umt_cuda_conv2d_forward_lp,
        .conv2d_backward_data = umt_cuda_conv2d_backward_data_lp,
        .conv2d_backward_filter = umt_cuda_conv2d_backward_filter_lp,
        .add_channel_bias = umt_cuda_add_channel_bias_lp,
        .sum_channel_bias = umt_cuda_sum_channel_bias_lp,
        .max_pool_forward = umt_cuda_max_pool_forward_lp,
        .max_pool_backward = umt_cuda_max_pool_backward_lp,
        .avg_pool_forward = umt_cuda_avg_pool_forward_lp,
        .avg_pool_backward = umt_cuda_avg_pool_backward_lp,
    },
    .fused = {
        .conv2d_relu_supports = umt_cuda_conv2d_relu_fused_lp,
        .conv2d_relu_forward = umt_cuda_conv2d_relu_forward_lp,
        .conv2d_relu_backward_filter = umt_cuda_conv2d_relu_backward_filter_lp,
    },
};

extern "C" const umt_backend *umt_cuda_backend(void) { return &cuda_backend; }
