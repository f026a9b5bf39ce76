/*
 * kernels/cuda/backend.cu — the CUDA backend's state, one per context, and its slot table.
 *
 * Each context that runs on a GPU owns one umt_cuda_state: its compute stream with a cuBLAS
 * handle and a cuDNN handle bound to it, the stream its own kernels go to instead while the
 * offload tier asks (umt_cuda_launch_on), its convolution plans (conv.cu) and its kernels'
 * device scratch (scratch.h). Every kernel of this folder is launched on the stream of the state
 * bound to the calling thread, in call order; nothing here runs on the legacy default stream,
 * which would serialise against every other stream of the process.
 *
 * The side stream (the streams group, core/branch.c): between branch_begin and branch_end,
 * everything launched, ours, cuDNN's and cuBLAS's, goes to a second stream that first waits for
 * the compute stream's work so far (an event), so that a layer's weight gradient runs while the
 * compute stream goes on with the input gradient; branch_join makes the compute stream wait for
 * the side's work (another event). cuDNN's one handle is moved between the streams
 * (cudnnSetStream; the handle is used from one thread at a time, as cuDNN asks, and the
 * convolutions take their workspace from the caller, who gives the side its own). cuBLAS works
 * in the workspace its handle was given, which two streams at once must not share, so the side
 * has a handle of its own with a workspace of the same size (the same size: cuBLAS's choice of
 * kernel, and so its bits, depends on it), which core gives with the first branch of products
 * (a context that never sends one there holds none). Inside a CUDA graph capture the two events
 * become the graph's fork and join.
 *
 * The kernels' signatures name no context, so they find their state through a thread-local
 * pointer: core binds the context's state (umt_cuda_bind) at every call into the kernel table
 * (core/context.h: umt_kernels) and at its other uses of the stream. Two contexts on two host
 * threads therefore each see their own state, and one thread may take turns with several.
 *
 * What stays process-wide, and why that is safe without a lock of ours:
 *   - the device a host thread computes on: the CUDA runtime keeps it per thread; binding a state
 *     sets it (cudaSetDevice) when the thread was on another device;
 *   - the loaded modules (our kernels, cuBLAS's, cuDNN's): the CUDA runtime and the libraries load
 *     them lazily under their own locks, and are documented thread-safe with one handle per
 *     stream, which is what each state has;
 *   - nothing else: the per-kernel module globals that two streams would race on (the losses'
 *     partials and label report, the fused, low-precision and bias partials) are now in each
 *     state's scratch, and the convolution plans are per state, because a plan is bound to the
 *     cuDNN handle it was made with and a half-precision plan rewrites its variant pack (the
 *     call's addresses) and times its engines on its first runs (conv_engines.cu): sharing one
 *     would need a lock around every convolution.
 */
#include <stdint.h>
#include <stdlib.h>

#include <atomic>

#include "core/base/capture_lock.h"
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_handle.h"
#include "kernels/cuda/scratch.h"

/* cuBLAS needs its workspace aligned to 256 bytes, and says only "invalid value" otherwise; the
 * scratch regions keep the same alignment. */
enum { WORKSPACE_ALIGNMENT = 256 };

struct umt_cuda_state {
    uint64_t id; /* unique in the process: a state made where a freed one was is another state */
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cudnnHandle_t cudnn;
    cudaStream_t launch_override; /* umt_cuda_launch_on: where our own kernels go instead, or NULL */
    cudaStream_t side;            /* the branch's stream (NULL: none was asked for) */
    cublasHandle_t side_cublas;   /* bound to side, with a workspace of its own */
    void *side_cublas_workspace;  /* that workspace, once a branch_begin gave it */
    cudaEvent_t forked, side_done; /* the compute stream's point the side starts from; the side's end */
    bool on_side;                 /* between branch_begin and branch_end */
    umt_conv_plans *plans;        /* conv.cu's plans, made with this state's cuDNN handle */
    bool tf32;                    /* fp32 convolutions may use TF32 tensor cores (umt_context_options) */
    size_t conv_workspace_limit;  /* the most workspace a convolution's algorithm may take (0: default) */
    umt_cuda_scratch scratch;     /* the kernels' partials and the label report (scratch.h) */
};

/* The state of the context the calling thread works for now (umt_cuda_bind), and its id: a
 * thread that last worked for a state another thread destroyed keeps its address, which a new
 * state may take again (on another device); the id tells them apart. */
static thread_local umt_cuda_state *current;
static thread_local uint64_t current_id;
static std::atomic<uint64_t> states_made;

/* ------------------------------------------------------------------------------------------ */
/* The scratch: one block of the context's workspace pool, carved into regions                */

static size_t aligned(size_t bytes) {
    return (bytes + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT * WORKSPACE_ALIGNMENT;
}

/* The regions' sizes in bytes, in the order of umt_cuda_scratch. */
static const size_t region_bytes[] = {
    UMT_LOSS_PARTIALS * sizeof(double),
    UMT_LABEL_SLOT_BYTES,
    UMT_LABEL_SLOT_BYTES,
    UMT_FUSED_PARTIALS * sizeof(float),
    UMT_FUSED_PARTIALS * sizeof(double),
    (size_t)UMT_LOWP_ROW_CHUNKS * UMT_LOWP_MAX_CHUNKED_COLUMNS * sizeof(float),
    UMT_BIAS_PARTIALS * sizeof(double),
};
enum { REGIONS = sizeof region_bytes / sizeof region_bytes[0] };

extern "C" size_t umt_cuda_scratch_bytes(void) {
    size_t total = 0;
    for (int i = 0; i < REGIONS; i++) total += aligned(region_bytes[i]);
    return total;
}

static void carve_scratch(char *base, umt_cuda_scratch *s) {
    void *at[REGIONS];
    for (int i = 0; i < REGIONS; i++) {
        at[i] = base;
        base += aligned(region_bytes[i]);
    }
    *s = (umt_cuda_scratch){(double *)at[0], at[1], at[2], (float *)at[3], (double *)at[4], (float *)at[5],
                            (double *)at[6]};
}

/* ------------------------------------------------------------------------------------------ */
/* A context's state                                                                           */

/* Destroys whatever create made, in reverse order; errors are ignored because this also cleans
 * up after a failed create, whose error is the one the caller needs to see. */
static void release_state(umt_cuda_state *s) {
    /* The plans hold cuDNN descriptors and algorithms chosen for this device and handle. */
    umt_cuda_conv_plans_free(s->plans);
    if (s->cudnn) cudnnDestroy(s->cudnn);
    if (s->cublas) cublasDestroy(s->cublas);
    if (s->side_cublas) cublasDestroy(s->side_cublas);
    if (s->forked) cudaEventDestroy(s->forked);
    if (s->side_done) cudaEventDestroy(s->side_done);
    if (s->side) cudaStreamDestroy(s->side);
    if (s->stream) cudaStreamDestroy(s->stream);
    if (current == s) current = NULL;
    free(s);
}

/* A cuBLAS handle on stream, working in workspace (NULL: given before its first product). */
static umt_status create_cublas(cublasHandle_t *handle, cudaStream_t stream, void *workspace, size_t bytes) {
    UMT_CUBLAS_TRY(cublasCreate(handle));
    /* cublasSetStream resets the workspace to cuBLAS's own pool, so the workspace comes after. */
    UMT_CUBLAS_TRY(cublasSetStream(*handle, stream));
    if (workspace) UMT_CUBLAS_TRY(cublasSetWorkspace(*handle, workspace, bytes));
    /* Default math with CUBLAS_COMPUTE_32F (gemm.cu) is true fp32: TF32 tensor cores are used
     * only when asked for with CUBLAS_TF32_TENSOR_OP_MATH, and the CPU reference is fp32. */
    UMT_CUBLAS_TRY(cublasSetMathMode(*handle, CUBLAS_DEFAULT_MATH));
    return UMT_OK;
}

/* The side stream, its cuBLAS handle (its workspace comes with the first branch of products)
 * and the two events (timing off: they only order). */
static umt_status create_side(umt_cuda_state *s) {
    UMT_CUDA_TRY(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
    UMT_TRY(create_cublas(&s->side_cublas, s->side, NULL, 0));
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->forked, cudaEventDisableTiming));
    UMT_CUDA_TRY(cudaEventCreateWithFlags(&s->side_done, cudaEventDisableTiming));
    return UMT_OK;
}

static umt_status create_state(umt_cuda_state *s, void *cublas_workspace, size_t workspace_bytes, bool side) {
    UMT_CUDA_TRY(cudaSetDevice(s->device));
    /* Non-blocking: the stream never waits for (or holds up) the legacy default stream. With a
     * side stream, the compute stream's blocks go first: it carries the step's critical path,
     * and the side's weight gradients fill the multiprocessors it leaves. One step below the
     * highest priority, which the offload tier's updates and data parallelism's collectives
     * keep (they are short and free memory or wait on other GPUs). */
    int least, greatest;
    UMT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    int priority = side && greatest < least ? greatest + 1 : least;
    UMT_CUDA_TRY(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, priority));
    UMT_TRY(create_cublas(&s->cublas, s->stream, cublas_workspace, workspace_bytes));
    if (side) UMT_TRY(create_side(s));
    /* cuDNN takes its workspace per call (conv.cu), from the caller's workspace pool. */
    UMT_CUDNN_TRY(cudnnCreate(&s->cudnn));
    UMT_CUDNN_TRY(cudnnSetStream(s->cudnn, s->stream));
    UMT_TRY(umt_cuda_conv_plans_new(&s->plans));
    UMT_TRY(umt_cuda_label_scratch_clear(&s->scratch, s->stream));
    UMT_CUDA_TRY(cudaStreamSynchronize(s->stream));
    return UMT_OK;
}

static umt_status check_buffer(const char *what, const void *buffer, size_t bytes, size_t least) {
    if (bytes < least || (bytes > 0 && !buffer)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "cuda backend: %s %p of %zu bytes, expected a buffer of at least %zu",
                        what, buffer, bytes, least);
    }
    if ((uintptr_t)buffer % WORKSPACE_ALIGNMENT != 0) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "cuda backend: %s %p, expected %d-byte alignment", what, buffer,
                        WORKSPACE_ALIGNMENT);
    }
    return UMT_OK;
}

extern "C" void umt_cuda_state_set_tf32(umt_cuda_state *s, bool on) { s->tf32 = on; }

extern "C" bool umt_cuda_tf32(void) { return current && current->tf32; }

extern "C" void umt_cuda_state_set_conv_workspace_limit(umt_cuda_state *s, size_t bytes) {
    s->conv_workspace_limit = bytes;
}

extern "C" size_t umt_cuda_conv_workspace_limit(void) {
    return current && current->conv_workspace_limit ? current->conv_workspace_limit : UMT_CONV_WORKSPACE_DEFAULT;
}

extern "C" umt_status umt_cuda_state_create(int device, void *cublas_workspace, size_t workspace_bytes, bool side,
                                            void *scratch, size_t scratch_bytes, umt_cuda_state **out) {
    *out = NULL;
    UMT_TRY(check_buffer("workspace", cublas_workspace, workspace_bytes, 0));
    UMT_TRY(check_buffer("scratch", scratch, scratch_bytes, umt_cuda_scratch_bytes()));
    umt_cuda_state *s = (umt_cuda_state *)calloc(1, sizeof *s);
    if (!s) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "cuda backend: no host memory for a context's state");
    s->id = ++states_made;
    s->device = device;
    carve_scratch((char *)scratch, &s->scratch);
    /* Streams and library handles are made and destroyed under the capture lock: another thread's
     * stream capture would not survive what they do to the device (core/base/capture_lock.h). */
    umt_capture_lock();
    umt_status status = create_state(s, cublas_workspace, workspace_bytes, side);
    if (status != UMT_OK) release_state(s);
    umt_capture_unlock();
    if (status != UMT_OK) return status;
    current = s;
    current_id = s->id;
    *out = s;
    return UMT_OK;
}

extern "C" void umt_cuda_state_destroy(umt_cuda_state *s) {
    if (!s) return;
    /* Queued kernels may still use the handles' workspaces: let them finish first. */
    cudaStreamSynchronize(s->stream);
    if (s->side) cudaStreamSynchronize(s->side);
    umt_capture_lock();
    release_state(s);
    umt_capture_unlock();
}

extern "C" void umt_cuda_bind(umt_cuda_state *s) {
    if (s == current && (!s || s->id == current_id)) return;
    current = s;
    current_id = s ? s->id : 0;
    int device = -1;
    /* A failure here shows at the first call on the device, with that call's name. */
    if (s && (cudaGetDevice(&device) != cudaSuccess || device != s->device)) cudaSetDevice(s->device);
}

extern "C" cublasHandle_t umt_cuda_cublas_handle(void) {
    if (!current) return NULL;
    return current->on_side ? current->side_cublas : current->cublas;
}

extern "C" cudnnHandle_t umt_cuda_cudnn_handle(void) { return current ? current->cudnn : NULL; }

extern "C" umt_conv_plans *umt_cuda_conv_plans(void) { return current ? current->plans : NULL; }

extern "C" umt_status umt_cuda_scratch_get(const char *op, const umt_cuda_scratch **out) {
    if (!current) return umt_fail(UMT_ERR_STATE, "%s: no CUDA context is bound to this thread", op);
    *out = &current->scratch;
    return UMT_OK;
}

extern "C" cudaStream_t umt_cuda_stream(void) {
    if (!current) return NULL;
    return current->launch_override ? current->launch_override : current->stream;
}

extern "C" cudaStream_t umt_cuda_compute_stream(void) { return current ? current->stream : NULL; }

extern "C" cudaStream_t umt_cuda_launch_on(cudaStream_t stream) {
    if (!current) return NULL;
    cudaStream_t previous = current->launch_override;
    current->launch_override = stream;
    return previous;
}

extern "C" umt_status umt_cuda_synchronize(void) {
    if (!current) return umt_fail(UMT_ERR_STATE, "cuda synchronize: no context bound to this thread");
    UMT_CUDA_TRY(cudaStreamSynchronize(current->stream));
    if (current->side) UMT_CUDA_TRY(cudaStreamSynchronize(current->side));
    /* A loss's label check reports here or at the next download (loss.cu). */
    return umt_cuda_take_label_verdict();
}

/* ------------------------------------------------------------------------------------------ */
/* The side stream                                                                             */

static umt_status side_state(const char *call, umt_cuda_state **out) {
    if (!current) return umt_fail(UMT_ERR_STATE, "%s: no CUDA context is bound to this thread", call);
    if (!current->side) return umt_fail(UMT_ERR_STATE, "%s: this context was made without a side stream", call);
    *out = current;
    return UMT_OK;
}

extern "C" umt_status umt_cuda_branch_begin(void *cublas_workspace, size_t bytes) {
    umt_cuda_state *s = NULL;
    UMT_TRY(side_state("branch_begin", &s));
    if (s->on_side || s->launch_override)
        return umt_fail(UMT_ERR_STATE, "branch_begin: the kernels already go to another stream");
    if (cublas_workspace && cublas_workspace != s->side_cublas_workspace) {
        UMT_TRY(check_buffer("side workspace", cublas_workspace, bytes, 0));
        UMT_CUBLAS_TRY(cublasSetWorkspace(s->side_cublas, cublas_workspace, bytes));
        s->side_cublas_workspace = cublas_workspace;
    }
    UMT_CUDA_TRY(cudaEventRecord(s->forked, s->stream));
    UMT_CUDA_TRY(cudaStreamWaitEvent(s->side, s->forked, 0));
    UMT_CUDNN_TRY(cudnnSetStream(s->cudnn, s->side));
    s->launch_override = s->side;
    s->on_side = true;
    return UMT_OK;
}

extern "C" umt_status umt_cuda_branch_end(void) {
    umt_cuda_state *s = NULL;
    UMT_TRY(side_state("branch_end", &s));
    if (!s->on_side) return umt_fail(UMT_ERR_STATE, "branch_end: no branch_begin before it");
    s->on_side = false;
    s->launch_override = NULL;
    UMT_CUDNN_TRY(cudnnSetStream(s->cudnn, s->stream));
    UMT_CUDA_TRY(cudaEventRecord(s->side_done, s->side));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_branch_join(void) {
    umt_cuda_state *s = NULL;
    UMT_TRY(side_state("branch_join", &s));
    if (s->on_side) return umt_fail(UMT_ERR_STATE, "branch_join: inside a branch (branch_end first)");
    UMT_CUDA_TRY(cudaStreamWaitEvent(s->stream, s->side_done, 0));
    return UMT_OK;
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
        .zero_many = umt_cuda_zero_many,
        .gemm = umt_cuda_gemm,
        .add = umt_cuda_add,
        .add_rows = umt_cuda_add_rows,
        .accumulate = umt_cuda_accumulate,
        .keep_and_add = umt_cuda_keep_and_add,
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
        .bias_relu_dropout = umt_cuda_bias_relu_dropout,
        .bias_relu_dropout_backward = umt_cuda_bias_relu_dropout_backward,
        .max_pool_forward = umt_cuda_max_pool_forward,
        .max_pool_backward = umt_cuda_max_pool_backward,
        .max_pool_dropout_backward = umt_cuda_max_pool_dropout_backward,
        .bias_relu_max_pool_dropout_forward = umt_cuda_bias_relu_max_pool_dropout_forward,
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
        .softmax_xent = umt_cuda_softmax_xent_lp,
        .softmax_xent_backward = umt_cuda_softmax_xent_backward_lp,
        .gather_batch = umt_cuda_gather_batch_lp,
    },
    .fused = {
        .conv2d_relu_supports = umt_cuda_conv2d_relu_fused,
        .conv2d_relu_forward = umt_cuda_conv2d_relu_forward,
        .conv2d_relu_backward_filter = umt_cuda_conv2d_relu_backward_filter,
        .linear_xent_supports = umt_cuda_linear_xent_supports,
        .linear_xent = umt_cuda_linear_xent,
        .linear_xent_backward = umt_cuda_linear_xent_backward,
    },
    .streams = {
        .branch_begin = umt_cuda_branch_begin,
        .branch_end = umt_cuda_branch_end,
        .branch_join = umt_cuda_branch_join,
    },
};

extern "C" const umt_backend *umt_cuda_backend(void) { return &cuda_backend; }
