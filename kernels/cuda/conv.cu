/*
 * kernels/cuda/conv.cu — 2-D convolution on cuDNN, and the per-channel bias kernels
 * (kernels/cpu/conv.c is the reference).
 *
 * The first call for a convolution shape makes its plan. In f32 (NCHW), that is cuDNN's legacy
 * descriptors for x, w, y and the convolution, and one algorithm per direction, the first of
 * cuDNN's heuristic ranking (cudnnGet*Algorithm_v7) that meets three conditions:
 *   - fp32 arithmetic: the descriptor asks for CUDNN_FMA_MATH and tensor-op candidates are
 *     skipped, because cuDNN's default math lets fp32 convolutions run on TF32 tensor cores
 *     (10-bit mantissas), three orders of magnitude off the fp32 CPU reference. A context made
 *     with umt_context_options.tf32 asks for that default math instead and takes tensor-op
 *     candidates, as PyTorch does with cudnn.allow_tf32 (its default);
 *   - deterministic: the same inputs give the same bits, as every kernel of this folder does
 *     (cuDNN's atomics-based backward algorithms are skipped);
 *   - a workspace of at most the context's limit (umt_cuda_conv_workspace_limit: an eighth of its
 *     budget; cuDNN's FFT algorithms need gigabytes at large batches, and are the fastest there).
 * In bf16/f16 it is one set of engines per direction from cuDNN's graph API
 * (kernels/cuda/conv_engines.cu: the legacy calls do not reach Hopper's faster kernels), each
 * timed on its first run, within the default limit (make_plan says why). The data gradient
 * has two sets, one that overwrites dx and one that adds to it; only the first may be timed on
 * the call's dx.
 * conv2d_workspace_bytes reports the largest workspace any of them may need, so the one buffer
 * the op takes from the workspace pool serves forward and both backwards.
 *
 * Plans are kept in a table of PLAN_SLOTS per context (its CUDA state's, backend.cu says why): a
 * network has a handful of shapes (each layer, at the training and the evaluation batch size); a
 * full table gives its slots up in turn. The descriptors live as long as their plan, and the
 * state's destruction destroys every plan.
 *
 * Forward overwrites y (cuDNN beta 0: y is not read); both backwards accumulate (beta 1).
 *
 * Mixed precision (the _lp entry points, core/precision.h): x, w, y in bf16 or f16 and NHWC
 * (w as K,R,S,C), the layout in which cuDNN's tensor-core kernels read half types without
 * transposing; products on tensor cores, accumulation in f32 (CUDNN_DATA_FLOAT compute). The
 * weight gradient is an f32 master's, but cuDNN writes dw in the filter's dtype and layout, so
 * it goes to a half-precision scratch behind the algorithm's workspace (same call, beta 0) and
 * is then added to the f32 gradient in K,C,R,S order by one recast.
 *
 * Thin inputs (a one-channel image, c*r*s <= 9) go to our own direct kernels for the forward and
 * the weight gradient, in f32 and in bf16/f16 (kernels/cuda/conv_thin.cu says why); their plan's
 * workspace holds those kernels' partials too.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/chunk_sums.h"
#include "kernels/cuda/conv_engines.h"
#include "kernels/cuda/conv_thin.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cudnn_handle.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/scratch.h"

/* BIAS_THREADS must be a power of two (block_sum halves it). */
enum { PLAN_SLOTS = 32, BIAS_THREADS = 256, SCRATCH_ALIGNMENT = 256 };

/* A half-precision plan's engine sets (conv_engines.h). */
enum { FORWARD, DATA_WRITTEN, DATA_ADDED, FILTER, ENGINE_SETS };

typedef struct {
    bool used;
    umt_conv_shape shape;
    /* f32: cuDNN's legacy descriptors and an algorithm per direction */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnConvolutionFwdAlgo_t forward;
    cudnnConvolutionBwdDataAlgo_t backward_data;
    cudnnConvolutionBwdFilterAlgo_t backward_filter;
    bool tf32; /* its context allows TF32 tensor cores (umt_context_options.tf32) */
    size_t workspace_limit; /* its context's limit on one algorithm's workspace, when made */
    /* bf16/f16: cuDNN's graph API, a set of engines per direction */
    umt_conv_engines *engines[ENGINE_SETS];
    size_t algorithm_bytes; /* the largest workspace of the algorithms or engines */
    size_t workspace_bytes; /* that, and under mixed precision the dw scratch behind it */
} conv_plan;

struct umt_conv_plans {
    conv_plan slots[PLAN_SLOTS];
    int next_given_up; /* the slot a full table reuses next */
};

/* ------------------------------------------------------------------------------------------ */
/* Shape checks (the CPU's, kernels/cpu/conv.c, and cuDNN's limits)                           */

/* cuDNN's descriptors take int sizes and strides; every size is at most its tensor's numel. */
static umt_status check_cudnn_limits(const char *op, const umt_conv_shape *s) {
    double x = (double)s->n * s->c * s->h * s->w, w = (double)s->k * s->c * s->r * s->s;
    double y = (double)s->n * s->k * s->p * s->q;
    if (x > INT_MAX || w > INT_MAX || y > INT_MAX || s->stride > INT_MAX || s->pad > INT_MAX) {
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "%s: x of %.0f, w of %.0f, y of %.0f elements, stride %lld, pad %lld; cuDNN takes at most "
                        "INT_MAX of each",
                        op, x, w, y, (long long)s->stride, (long long)s->pad);
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Plans                                                                                       */

static void release_plan(conv_plan *plan) {
    if (plan->x) cudnnDestroyTensorDescriptor(plan->x);
    if (plan->y) cudnnDestroyTensorDescriptor(plan->y);
    if (plan->w) cudnnDestroyFilterDescriptor(plan->w);
    if (plan->conv) cudnnDestroyConvolutionDescriptor(plan->conv);
    for (int i = 0; i < ENGINE_SETS; i++) umt_cuda_conv_engines_free(plan->engines[i]);
    memset(plan, 0, sizeof *plan);
}

extern "C" umt_status umt_cuda_conv_plans_new(umt_conv_plans **out) {
    *out = (umt_conv_plans *)calloc(1, sizeof **out);
    return *out ? UMT_OK : umt_fail(UMT_ERR_OUT_OF_MEMORY, "conv2d: no host memory for a table of plans");
}

extern "C" void umt_cuda_conv_plans_free(umt_conv_plans *plans) {
    if (!plans) return;
    for (int i = 0; i < PLAN_SLOTS; i++) release_plan(&plans->slots[i]);
    free(plans);
}

static bool is_half(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }

/* The f32 path's legacy descriptors: NCHW tensors. */
static umt_status describe(conv_plan *p, const umt_conv_shape *s, bool tf32) {
    const cudnnDataType_t type = CUDNN_DATA_FLOAT;
    const cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
    UMT_CUDNN_TRY(cudnnCreateTensorDescriptor(&p->x));
    UMT_CUDNN_TRY(cudnnCreateTensorDescriptor(&p->y));
    UMT_CUDNN_TRY(cudnnCreateFilterDescriptor(&p->w));
    UMT_CUDNN_TRY(cudnnCreateConvolutionDescriptor(&p->conv));
    UMT_CUDNN_TRY(cudnnSetTensor4dDescriptor(p->x, format, type, (int)s->n, (int)s->c, (int)s->h, (int)s->w));
    UMT_CUDNN_TRY(cudnnSetTensor4dDescriptor(p->y, format, type, (int)s->n, (int)s->k, (int)s->p, (int)s->q));
    UMT_CUDNN_TRY(cudnnSetFilter4dDescriptor(p->w, type, format, (int)s->k, (int)s->c, (int)s->r, (int)s->s));
    UMT_CUDNN_TRY(cudnnSetConvolution2dDescriptor(p->conv, (int)s->pad, (int)s->pad, (int)s->stride, (int)s->stride,
                                                  1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    UMT_CUDNN_TRY(cudnnSetConvolutionMathType(p->conv, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    return UMT_OK;
}

/* Whether a heuristic's candidate meets the conditions above (its workspace is asked apart). */
static bool acceptable(const conv_plan *p, cudnnStatus_t status, cudnnDeterminism_t determinism,
                       cudnnMathType_t math) {
    bool tensor_ops = math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    return status == CUDNN_STATUS_SUCCESS && determinism == CUDNN_DETERMINISTIC && (p->tf32 || !tensor_ops);
}

static umt_status no_algorithm(const char *direction, const conv_plan *p) {
    const umt_conv_shape *s = &p->shape;
    return umt_fail(UMT_ERR_UNSUPPORTED,
                    "conv2d: cuDNN offers no deterministic %s %s algorithm within %zu MiB of workspace for "
                    "n=%lld c=%lld h=%lld w=%lld k=%lld r=%lld s=%lld stride=%lld pad=%lld",
                    umt_dtype_name(s->dtype), direction, p->workspace_limit >> 20, (long long)s->n, (long long)s->c,
                    (long long)s->h, (long long)s->w, (long long)s->k, (long long)s->r, (long long)s->s,
                    (long long)s->stride, (long long)s->pad);
}

/* The three choosers differ only in cuDNN's types and function names. The workspace size is
 * asked of cuDNN for the candidate rather than read from the heuristic's estimate. */
static umt_status choose_forward(cudnnHandle_t handle, conv_plan *p, size_t *bytes) {
    cudnnConvolutionFwdAlgoPerf_t found[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    UMT_CUDNN_TRY(cudnnGetConvolutionForwardAlgorithm_v7(handle, p->x, p->w, p->conv, p->y,
                                                         CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, found));
    for (int i = 0; i < count; i++) {
        if (!acceptable(p, found[i].status, found[i].determinism, found[i].mathType)) continue;
        if (cudnnGetConvolutionForwardWorkspaceSize(handle, p->x, p->w, p->conv, p->y, found[i].algo, bytes) !=
                CUDNN_STATUS_SUCCESS ||
            *bytes > p->workspace_limit) {
            continue;
        }
        p->forward = found[i].algo;
        return UMT_OK;
    }
    return no_algorithm("forward", p);
}

static umt_status choose_backward_data(cudnnHandle_t handle, conv_plan *p, size_t *bytes) {
    cudnnConvolutionBwdDataAlgoPerf_t found[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    UMT_CUDNN_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, p->w, p->y, p->conv, p->x,
                                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, found));
    for (int i = 0; i < count; i++) {
        if (!acceptable(p, found[i].status, found[i].determinism, found[i].mathType)) continue;
        if (cudnnGetConvolutionBackwardDataWorkspaceSize(handle, p->w, p->y, p->conv, p->x, found[i].algo, bytes) !=
                CUDNN_STATUS_SUCCESS ||
            *bytes > p->workspace_limit) {
            continue;
        }
        p->backward_data = found[i].algo;
        return UMT_OK;
    }
    return no_algorithm("backward data", p);
}

static umt_status choose_backward_filter(cudnnHandle_t handle, conv_plan *p, size_t *bytes) {
    cudnnConvolutionBwdFilterAlgoPerf_t found[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    UMT_CUDNN_TRY(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, p->x, p->y, p->conv, p->w,
                                                                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                found));
    for (int i = 0; i < count; i++) {
        if (!acceptable(p, found[i].status, found[i].determinism, found[i].mathType)) continue;
        if (cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, p->x, p->y, p->conv, p->w, found[i].algo, bytes) !=
                CUDNN_STATUS_SUCCESS ||
            *bytes > p->workspace_limit) {
            continue;
        }
        p->backward_filter = found[i].algo;
        return UMT_OK;
    }
    return no_algorithm("backward filter", p);
}

/* Mixed precision: the half-precision dw scratch sits behind the algorithms' workspace, at an
 * offset aligned as cuDNN wants its buffers. */
static size_t filter_scratch_bytes(const umt_conv_shape *s) { return (size_t)(s->k * s->c * s->r * s->s) * 2; }

static size_t filter_scratch_offset(const conv_plan *p) {
    return (p->algorithm_bytes + SCRATCH_ALIGNMENT - 1) / SCRATCH_ALIGNMENT * SCRATCH_ALIGNMENT;
}

static umt_status choose_each(cudnnHandle_t handle, conv_plan *p) {
    size_t forward_bytes = 0, data_bytes = 0, filter_bytes = 0;
    UMT_TRY(choose_forward(handle, p, &forward_bytes));
    UMT_TRY(choose_backward_data(handle, p, &data_bytes));
    UMT_TRY(choose_backward_filter(handle, p, &filter_bytes));
    p->algorithm_bytes = forward_bytes > data_bytes ? forward_bytes : data_bytes;
    if (filter_bytes > p->algorithm_bytes) p->algorithm_bytes = filter_bytes;
    return UMT_OK;
}

/* With TF32 allowed, a direction may be left without a deterministic algorithm in the workspace
 * limit (a one-channel input at batch 4096: its data gradient), where fp32 arithmetic has one:
 * the shape then stays in fp32 arithmetic, all three directions (they share the descriptor). */
static umt_status choose_algorithms(cudnnHandle_t handle, conv_plan *p) {
    p->tf32 = umt_cuda_tf32();
    UMT_TRY(describe(p, &p->shape, p->tf32));
    umt_status status = choose_each(handle, p);
    if (status == UMT_OK || !p->tf32) return status;
    p->tf32 = false;
    UMT_CUDNN_TRY(cudnnSetConvolutionMathType(p->conv, CUDNN_FMA_MATH));
    return choose_each(handle, p);
}

/* Forward and the weight gradient (into the dw scratch) overwrite what they write, so their
 * first runs may time candidates on the call's tensors; of the data gradient's two sets, only
 * the one that overwrites dx. */
static umt_status make_engines(cudnnHandle_t handle, conv_plan *p) {
    static const struct {
        umt_conv_direction direction;
        bool accumulate;
    } sets[ENGINE_SETS] = {{UMT_CONV_FORWARD, false},
                           {UMT_CONV_BACKWARD_DATA, false},
                           {UMT_CONV_BACKWARD_DATA, true},
                           {UMT_CONV_BACKWARD_FILTER, false}};
    for (int i = 0; i < ENGINE_SETS; i++) {
        size_t bytes = 0;
        UMT_TRY(umt_cuda_conv_engines_make(handle, &p->shape, sets[i].direction, sets[i].accumulate,
                                           !sets[i].accumulate, p->workspace_limit, &p->engines[i], &bytes));
        if (bytes > p->algorithm_bytes) p->algorithm_bytes = bytes;
    }
    return UMT_OK;
}

static umt_status make_plan(cudnnHandle_t handle, const umt_conv_shape *s, conv_plan *p) {
    p->shape = *s;
    /* Half-precision engines keep to the default limit even where the context allows more: with
     * more room the timed choice took engines of gigabytes for no measurable gain (docs/PERF.md,
     * "The convolutions' workspace from the budget": MNIST's conv2 in bf16 at batch 60000 took
     * 7.8 GiB for about 0.5%). */
    p->workspace_limit = umt_cuda_conv_workspace_limit();
    if (is_half(s->dtype) && p->workspace_limit > UMT_CONV_WORKSPACE_DEFAULT)
        p->workspace_limit = UMT_CONV_WORKSPACE_DEFAULT;
    if (is_half(s->dtype) && !s->nhwc)
        return umt_fail(UMT_ERR_UNSUPPORTED, "conv2d: %s NCHW tensors; half-precision convolutions take NHWC",
                        umt_dtype_name(s->dtype));
    UMT_TRY(is_half(s->dtype) ? make_engines(handle, p) : choose_algorithms(handle, p));
    bool thin = umt_cuda_conv_is_thin(s) || umt_cuda_conv_is_thin_f32(s);
    if (thin && umt_cuda_conv_thin_workspace_bytes(s) > p->algorithm_bytes)
        p->algorithm_bytes = umt_cuda_conv_thin_workspace_bytes(s);
    p->workspace_bytes = p->algorithm_bytes;
    if (is_half(s->dtype)) p->workspace_bytes = filter_scratch_offset(p) + filter_scratch_bytes(s);
    p->used = true;
    return UMT_OK;
}

/* Two shapes are the same convolution (field by field: the struct has padding bytes). */
static bool same_shape(const umt_conv_shape *a, const umt_conv_shape *b) {
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->k == b->k && a->r == b->r &&
           a->s == b->s && a->p == b->p && a->q == b->q && a->stride == b->stride && a->pad == b->pad &&
           a->dtype == b->dtype && a->nhwc == b->nhwc;
}

/* An empty slot, or else the next one in turn, given up. */
static conv_plan *free_slot(umt_conv_plans *plans) {
    for (int i = 0; i < PLAN_SLOTS; i++) {
        if (!plans->slots[i].used) return &plans->slots[i];
    }
    conv_plan *slot = &plans->slots[plans->next_given_up];
    plans->next_given_up = (plans->next_given_up + 1) % PLAN_SLOTS;
    release_plan(slot);
    return slot;
}

/* The plan for a checked shape, made on first use. */
static umt_status plan_for(const char *op, const umt_conv_shape *s, const conv_plan **out) {
    UMT_TRY(umt_conv_check_shape(op, s));
    UMT_TRY(check_cudnn_limits(op, s));
    umt_conv_plans *plans = umt_cuda_conv_plans();
    cudnnHandle_t handle = umt_cuda_cudnn_handle();
    if (!plans || !handle) return umt_fail(UMT_ERR_STATE, "%s: no CUDA context is bound to this thread", op);
    for (int i = 0; i < PLAN_SLOTS; i++) {
        if (plans->slots[i].used && same_shape(&plans->slots[i].shape, s)) {
            *out = &plans->slots[i];
            return UMT_OK;
        }
    }
    conv_plan *plan = free_slot(plans);
    umt_status status = make_plan(handle, s, plan);
    if (status != UMT_OK) {
        release_plan(plan);
        return status;
    }
    *out = plan;
    return UMT_OK;
}

/* The plan for a call, whose workspace must hold the plan's (the CPU's words). */
static umt_status plan_for_call(const char *op, const umt_conv_shape *s, const void *workspace,
                                size_t workspace_bytes, const conv_plan **out) {
    UMT_TRY(plan_for(op, s, out));
    size_t needed = (*out)->workspace_bytes;
    if (workspace_bytes < needed || (needed > 0 && workspace == NULL)) {
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: workspace %p of %zu bytes, expected at least %zu bytes", op,
                        workspace, workspace_bytes, needed);
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Convolution, forward and backward                                                           */

extern "C" umt_status umt_cuda_conv2d_workspace_bytes(const umt_conv_shape *shape, size_t *bytes) {
    const conv_plan *plan;
    UMT_TRY(plan_for("conv2d_workspace_bytes", shape, &plan));
    *bytes = plan->workspace_bytes;
    return UMT_OK;
}

extern "C" umt_status umt_cuda_conv2d_forward(const umt_conv_shape *shape, const float *x, const float *w, float *y,
                                              void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call("conv2d_forward", shape, workspace, workspace_bytes, &p));
    if (umt_cuda_conv_is_thin_f32(shape)) return umt_cuda_conv2d_forward_thin_f32(shape, x, w, NULL, false, y);
    const float one = 1.0f, zero = 0.0f;
    UMT_CUDNN_TRY(cudnnConvolutionForward(umt_cuda_cudnn_handle(), &one, p->x, x, p->w, w, p->conv, p->forward,
                                          workspace, workspace_bytes, &zero, p->y, y));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_conv2d_backward_data(const umt_conv_shape *shape, const float *w, const float *dy,
                                                    float *dx, void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call("conv2d_backward_data", shape, workspace, workspace_bytes, &p));
    const float one = 1.0f;
    UMT_CUDNN_TRY(cudnnConvolutionBackwardData(umt_cuda_cudnn_handle(), &one, p->w, w, p->y, dy, p->conv,
                                               p->backward_data, workspace, workspace_bytes, &one, p->x, dx));
    return UMT_OK;
}

extern "C" umt_status umt_cuda_conv2d_backward_filter(const umt_conv_shape *shape, const float *x, const float *dy,
                                                      float *dw, void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call("conv2d_backward_filter", shape, workspace, workspace_bytes, &p));
    if (umt_cuda_conv_is_thin_f32(shape))
        return umt_cuda_conv2d_backward_filter_thin_f32(shape, x, NULL, (float *)dy, false, dw, NULL, workspace);
    const float one = 1.0f;
    UMT_CUDNN_TRY(cudnnConvolutionBackwardFilter(umt_cuda_cudnn_handle(), &one, p->x, x, p->y, dy, p->conv,
                                                 p->backward_filter, workspace, workspace_bytes, &one, p->w, dw));
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Mixed precision                                                                             */

static umt_status plan_for_call_lp(const char *op, const umt_conv_shape *s, const void *workspace,
                                   size_t workspace_bytes, const conv_plan **out) {
    if (!is_half(s->dtype) || !s->nhwc)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: %s %s tensors (expected bf16 or f16, NHWC)", op,
                        umt_dtype_name(s->dtype), s->nhwc ? "NHWC" : "NCHW");
    return plan_for_call(op, s, workspace, workspace_bytes, out);
}

/* The forward on the call's plan p (found once by the entry point): the thin kernel where it
 * takes the shape, else the plan's engines. */
static umt_status forward_lp(const conv_plan *p, const umt_conv_shape *shape, const void *x, const void *w, void *y,
                             void *workspace) {
    if (umt_cuda_conv_thin_takes(shape, y, y)) return umt_cuda_conv2d_forward_thin(shape, x, w, NULL, false, y);
    return umt_cuda_conv_engines_run(p->engines[FORWARD], x, w, y, workspace);
}

extern "C" umt_status umt_cuda_conv2d_forward_lp(const umt_conv_shape *shape, const void *x, const void *w, void *y,
                                                 void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call_lp("conv2d_forward_lp", shape, workspace, workspace_bytes, &p));
    return forward_lp(p, shape, x, w, y, workspace);
}

/* overwrite: beta 0, so cuDNN neither reads dx nor needs it zeroed first. */
extern "C" umt_status umt_cuda_conv2d_backward_data_lp(const umt_conv_shape *shape, const void *w, const void *dy,
                                                       void *dx, bool overwrite, void *workspace,
                                                       size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call_lp("conv2d_backward_data_lp", shape, workspace, workspace_bytes, &p));
    return umt_cuda_conv_engines_run(p->engines[overwrite ? DATA_WRITTEN : DATA_ADDED], dx, w, dy, workspace);
}

/* The weight gradient on the call's plan p, as forward_lp. */
static umt_status backward_filter_lp(const conv_plan *p, const umt_conv_shape *shape, const void *x, const void *dy,
                                     float *dw, void *workspace) {
    if (umt_cuda_conv_thin_takes(shape, dy, workspace))
        return umt_cuda_conv2d_backward_filter_thin(shape, x, NULL, (void *)dy, false, dw, NULL, workspace);
    void *scratch = (char *)workspace + filter_scratch_offset(p);
    UMT_TRY(umt_cuda_conv_engines_run(p->engines[FILTER], x, scratch, dy, workspace));
    /* K,R,S,C half -> += into K,C,R,S f32: k "images" of c channels of r*s pixels. */
    const umt_conv_shape *s = shape;
    return umt_cuda_recast(scratch, s->dtype, true, dw, UMT_F32, false, s->k, s->c, s->r * s->s, true);
}

extern "C" umt_status umt_cuda_conv2d_backward_filter_lp(const umt_conv_shape *shape, const void *x, const void *dy,
                                                         float *dw, void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    UMT_TRY(plan_for_call_lp("conv2d_backward_filter_lp", shape, workspace, workspace_bytes, &p));
    return backward_filter_lp(p, shape, x, dy, dw, workspace);
}

/* Convolution + bias + ReLU fused: thin shapes only (conv_thin.cu), in f32 or a half dtype; a
 * half call whose tensors are not aligned for its vectors runs the two ops it replaces. */
extern "C" bool umt_cuda_conv2d_relu_fused(const umt_conv_shape *shape) {
    return umt_cuda_conv_is_thin(shape) || umt_cuda_conv_is_thin_f32(shape);
}

extern "C" umt_status umt_cuda_conv2d_relu_forward(const umt_conv_shape *shape, const void *x, const void *w,
                                                   const float *bias, void *y, void *workspace,
                                                   size_t workspace_bytes) {
    const conv_plan *p;
    if (shape->dtype == UMT_F32) {
        UMT_TRY(plan_for_call("conv2d_relu_forward", shape, workspace, workspace_bytes, &p));
        if (umt_cuda_conv_is_thin_f32(shape))
            return umt_cuda_conv2d_forward_thin_f32(shape, (const float *)x, (const float *)w, bias, true, (float *)y);
        UMT_TRY(umt_cuda_conv2d_forward(shape, (const float *)x, (const float *)w, (float *)y, workspace,
                                        workspace_bytes));
        return umt_cuda_bias_relu(UMT_F32, false, y, bias, y, shape->n, shape->k, shape->p * shape->q);
    }
    UMT_TRY(plan_for_call_lp("conv2d_relu_forward", shape, workspace, workspace_bytes, &p));
    if (umt_cuda_conv_thin_takes(shape, y, y)) return umt_cuda_conv2d_forward_thin(shape, x, w, bias, true, y);
    UMT_TRY(forward_lp(p, shape, x, w, y, workspace));
    return umt_cuda_bias_relu(shape->dtype, true, y, bias, y, shape->n, shape->k, shape->p * shape->q);
}

extern "C" umt_status umt_cuda_conv2d_relu_backward_filter(const umt_conv_shape *shape, const void *x,
                                                           const void *y, void *dy, bool keep_dy, float *dw,
                                                           float *dbias, void *workspace, size_t workspace_bytes) {
    const conv_plan *p;
    if (shape->dtype == UMT_F32) {
        UMT_TRY(plan_for_call("conv2d_relu_backward_filter", shape, workspace, workspace_bytes, &p));
        if (umt_cuda_conv_is_thin_f32(shape))
            return umt_cuda_conv2d_backward_filter_thin_f32(shape, (const float *)x, (const float *)y, (float *)dy,
                                                            keep_dy, dw, dbias, workspace);
        UMT_TRY(umt_cuda_bias_relu_backward(UMT_F32, false, y, dy, dbias, shape->n, shape->k, shape->p * shape->q));
        return umt_cuda_conv2d_backward_filter(shape, (const float *)x, (const float *)dy, dw, workspace,
                                               workspace_bytes);
    }
    UMT_TRY(plan_for_call_lp("conv2d_relu_backward_filter", shape, workspace, workspace_bytes, &p));
    if (umt_cuda_conv_thin_takes(shape, dy, workspace) && umt_cuda_conv_thin_takes(shape, y, y))
        return umt_cuda_conv2d_backward_filter_thin(shape, x, y, dy, keep_dy, dw, dbias, workspace);
    UMT_TRY(umt_cuda_bias_relu_backward(shape->dtype, true, y, dy, dbias, shape->n, shape->k, shape->p * shape->q));
    return backward_filter_lp(p, shape, x, dy, dw, workspace);
}

/* ------------------------------------------------------------------------------------------ */
/* Per-channel bias                                                                            */

static __global__ void add_channel_bias_kernel(const float *x, const float *bias, float *y, int64_t n, int64_t k,
                                               int64_t hw) {
    FOR_EACH_INDEX(i, n * k * hw) y[i] = x[i] + bias[(i / hw) % k];
}

/* The sum of v over the block's BIAS_THREADS threads, returned to thread 0: a fixed tree over
 * shared memory, so the result does not depend on thread timing. */
static __device__ double block_sum(double v) {
    __shared__ double partial[BIAS_THREADS];
    partial[threadIdx.x] = v;
    __syncthreads();
    for (int half = BIAS_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    return partial[0];
}

/* The channel sums' partials: block (channel, chunk) of the first stage writes
 * partials[chunk * k + channel]; the second stage (kernels/cuda/chunk_sums.h) adds each
 * channel's chunks.
 * A batch's planes of one channel lie hw apart in k-strided runs, so one block per channel
 * (k blocks: 32 or 64 here) would leave most of the GPU idle; cutting the images into chunks
 * fills it, and the fixed split keeps the result the same bits on every run (no atomics).
 * A context's stream runs its kernels in order, so one buffer of the context's scratch
 * (scratch.h, 512 KiB) serves every call; shapes with more channels than it holds take one chunk. */
enum { BIAS_PARTIALS = UMT_BIAS_PARTIALS, BIAS_TARGET_BLOCKS = 1024 };

/* Block (channel, chunk): the chunk's images of the channel, each plane read contiguously (no
 * division per element), summed in double as on the CPU. With one chunk, the block adds its
 * total to dbias itself. */
static __global__ void sum_channel_chunks_kernel(const float *dy, float *dbias, double *bias_partials, int64_t n,
                                                 int64_t k, int64_t hw, int64_t images_per_chunk) {
    int64_t channel = blockIdx.x, chunk = blockIdx.y, first = chunk * images_per_chunk;
    int64_t last = first + images_per_chunk < n ? first + images_per_chunk : n;
    double sum = 0.0;
    for (int64_t image = first; image < last; image++) {
        const float *plane = dy + (image * k + channel) * hw;
        for (int64_t i = threadIdx.x; i < hw; i += BIAS_THREADS) sum += plane[i];
    }
    sum = block_sum(sum);
    if (threadIdx.x != 0) return;
    if (gridDim.y == 1)
        dbias[channel] = (float)((double)dbias[channel] + sum);
    else
        bias_partials[chunk * k + channel] = sum;
}

static __global__ void add_channel_chunks_kernel(const double *bias_partials, float *dbias, int64_t k, int chunks) {
    umt_dev_add_chunk_partials(bias_partials, dbias, k, chunks);
}

extern "C" umt_status umt_cuda_add_channel_bias(const float *x, const float *bias, float *y, int64_t n, int64_t k,
                                                int64_t hw) {
    UMT_TRY(umt_conv_check_channel_sizes("add_channel_bias", n, k, hw));
    if (n == 0 || k == 0 || hw == 0) return UMT_OK;
    add_channel_bias_kernel<<<blocks_for(n * k * hw), THREADS, 0, umt_cuda_stream()>>>(x, bias, y, n, k, hw);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sum_channel_bias(const float *dy, float *dbias, int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(umt_conv_check_channel_sizes("sum_channel_bias", n, k, hw));
    if (k == 0) return UMT_OK;
    if (k > MAX_BLOCKS)
        return umt_fail(UMT_ERR_UNSUPPORTED, "sum_channel_bias: %lld channels (at most %d)", (long long)k, MAX_BLOCKS);
    /* Enough chunks to give the GPU about BIAS_TARGET_BLOCKS blocks, as the partials allow. */
    int64_t chunks = (BIAS_TARGET_BLOCKS + k - 1) / k;
    if (chunks > n) chunks = n;
    if (chunks * k > BIAS_PARTIALS) chunks = BIAS_PARTIALS / k;
    if (chunks < 1) chunks = 1;
    int64_t images_per_chunk = (n + chunks - 1) / chunks;
    if (images_per_chunk > 0) chunks = (n + images_per_chunk - 1) / images_per_chunk;
    if (chunks < 1) chunks = 1;
    dim3 grid((unsigned int)k, (unsigned int)chunks);
    const umt_cuda_scratch *scratch;
    UMT_TRY(umt_cuda_scratch_get("sum_channel_bias", &scratch));
    double *partials = scratch->bias_partials;
    sum_channel_chunks_kernel<<<grid, BIAS_THREADS, 0, umt_cuda_stream()>>>(dy, dbias, partials, n, k, hw,
                                                                            images_per_chunk);
    UMT_CUDA_LAUNCHED();
    if (chunks > 1) {
        add_channel_chunks_kernel<<<umt_chunk_sum_blocks(k), THREADS, 0, umt_cuda_stream()>>>(partials, dbias, k,
                                                                                              (int)chunks);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}
