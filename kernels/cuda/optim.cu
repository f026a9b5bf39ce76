/*
 * kernels/cuda/optim.cu — optimizer updates, in place, one thread per element, and the step
 * scalars' kernel (kernels/optim_step.h).
 *
 * The formulas, and the order of every operation, are those of kernels/cpu/optim.c (PyTorch's
 * single-tensor update rules; the formulas are written out there). Multiplies and adds go
 * through the __f*_rn intrinsics so that nvcc cannot fuse them into FMAs: each operation is
 * rounded as on the CPU, and a run on the GPU follows the CPU's bit for bit. The step-dependent
 * Adam corrections are computed on the host, in double, exactly as the CPU file does, or, with
 * step scalars, by step_decide on the device from the steps really applied.
 *
 * Each rule is one kernel in its fused form: the gradient times the step's multiplier, nothing
 * written when the step is skipped, and the low-precision copy rewritten from the new master in
 * the same pass. A zero fusion takes none of those branches, so it is the plain update.
 *
 * multi_update runs the same per-element code over up to 32 parameters per launch (a table of
 * them passed by value; each block updates one chunk of one parameter), so a model's whole
 * optimizer step is one or a few kernels instead of one per parameter.
 */
#include <math.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

/* ------------------------------------------------------------------------------------------ */
/* Per-element helpers of the fused forms                                                      */

/* The step is skipped (an inf or NaN gradient): every thread returns before writing (but the zeros
 * of a consumed gradient, skipped_here). */
static __device__ bool step_skipped(const umt_step_scalars *scalars) { return scalars && scalars->found_inf; }

/* grad[i] zeroed once read when the update consumes its gradient (umt_update_fusion.zero_grad;
 * grad is then writable). */
static __device__ void consume(const float *grad, int64_t i, const umt_update_fusion &fusion) {
    if (fusion.zero_grad) const_cast<float *>(grad)[i] = 0.0f;
}

/* grad[i], times the multiplier when there are step scalars; a plain read otherwise. */
static __device__ float gradient_at(const float *grad, int64_t i, const umt_step_scalars *scalars) {
    return scalars ? __fmul_rn(grad[i], scalars->multiplier) : grad[i];
}

static __device__ void store_lowp(const umt_update_fusion &fusion, int64_t i, float value) {
    if (fusion.lowp)
        umt_dev_store_from_f32(fusion.lowp, fusion.lowp_dtype,
                               umt_lowp_index(i, fusion.lowp_channels, fusion.lowp_pixels), value);
}

/* ------------------------------------------------------------------------------------------ */
/* The update rules, one element at a time (the one-tensor and the multi-tensor kernels share
 * them, so both compute the same bits); each returns the new parameter, for the compute copy  */

static __device__ float sgd_element(float *param, const float *grad, float *velocity, int64_t i, float lr,
                                   float momentum, float weight_decay, const umt_update_fusion &fusion) {
    float p = param[i];
    float g = __fadd_rn(gradient_at(grad, i, fusion.scalars), __fmul_rn(weight_decay, p));
    if (momentum != 0.0f) {
        velocity[i] = __fadd_rn(__fmul_rn(momentum, velocity[i]), g);
        g = velocity[i];
    }
    p = __fsub_rn(p, __fmul_rn(lr, g));
    param[i] = p;
    return p;
}

/* The step-dependent factors of one Adam step (host-computed, unless step scalars give them). */
typedef struct {
    float step_size;             /* lr / (1 - beta1^step) */
    float bias_correction2_sqrt; /* sqrt(1 - beta2^step) */
    float decay;                 /* AdamW's 1 - lr * weight_decay, or 1 */
} adam_factors;

/* The factors as the kernel uses them: the scalars' when there are any, AdamW's decay from the
 * rate read on the device when it is read there (the host's float arithmetic). */
static __device__ adam_factors adam_factors_now(adam_factors f, float weight_decay, bool decoupled,
                                                const umt_update_fusion &fusion) {
    const umt_step_scalars *s = fusion.scalars;
    if (s) {
        f.step_size = s->adam_step_size;
        f.bias_correction2_sqrt = s->adam_bias_correction2_sqrt;
    }
    if (fusion.lr_on_device && decoupled) f.decay = __fsub_rn(1.0f, __fmul_rn(*fusion.lr_on_device, weight_decay));
    return f;
}

static __device__ float adam_element(float *param, const float *grad, float *m, float *v, int64_t i, float beta1,
                                    float beta2, float eps, float weight_decay, bool decoupled, const adam_factors &f,
                                    const umt_update_fusion &fusion) {
    float p = param[i];
    float g = gradient_at(grad, i, fusion.scalars);
    if (decoupled)
        p = __fmul_rn(p, f.decay);
    else
        g = __fadd_rn(g, __fmul_rn(weight_decay, p));
    float m_i = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(1.0f - beta1, g));
    float v_i = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(1.0f - beta2, g), g));
    m[i] = m_i;
    v[i] = v_i;
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_i), f.bias_correction2_sqrt), eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(f.step_size, m_i), denom));
    param[i] = p;
    return p;
}

static __device__ float adadelta_element(float *param, const float *grad, float *square_avg, float *delta_avg,
                                        int64_t i, float lr, float rho, float eps, float weight_decay,
                                        const umt_update_fusion &fusion) {
    float one_minus_rho = 1.0f - rho;
    float p = param[i];
    float g = __fadd_rn(gradient_at(grad, i, fusion.scalars), __fmul_rn(weight_decay, p));
    float sq = __fadd_rn(__fmul_rn(rho, square_avg[i]), __fmul_rn(__fmul_rn(one_minus_rho, g), g));
    float std_dev = __fsqrt_rn(__fadd_rn(sq, eps));
    float delta = __fmul_rn(__fdiv_rn(__fsqrt_rn(__fadd_rn(delta_avg[i], eps)), std_dev), g);
    square_avg[i] = sq;
    delta_avg[i] = __fadd_rn(__fmul_rn(rho, delta_avg[i]), __fmul_rn(__fmul_rn(one_minus_rho, delta), delta));
    p = __fsub_rn(p, __fmul_rn(lr, delta));
    param[i] = p;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* One tensor per launch                                                                       */

/* A skipped step writes nothing but, when the update consumes it, a zeroed gradient. */
static __device__ bool skipped_here(const float *grad, int64_t n, const umt_update_fusion &fusion) {
    if (!step_skipped(fusion.scalars)) return false;
    FOR_EACH_INDEX(i, n) consume(grad, i, fusion);
    return true;
}

static __global__ void sgd_kernel(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                  float momentum, float weight_decay, umt_update_fusion fusion) {
    if (skipped_here(grad, n, fusion)) return;
    if (fusion.lr_on_device) lr = *fusion.lr_on_device;
    FOR_EACH_INDEX(i, n) {
        store_lowp(fusion, i, sgd_element(param, grad, velocity, i, lr, momentum, weight_decay, fusion));
        consume(grad, i, fusion);
    }
}

static __global__ void adam_kernel(float *param, const float *grad, float *m, float *v, int64_t n, float beta1,
                                   float beta2, float eps, float weight_decay, bool decoupled, adam_factors f,
                                   umt_update_fusion fusion) {
    if (skipped_here(grad, n, fusion)) return;
    f = adam_factors_now(f, weight_decay, decoupled, fusion);
    FOR_EACH_INDEX(i, n) {
        store_lowp(fusion, i, adam_element(param, grad, m, v, i, beta1, beta2, eps, weight_decay, decoupled, f, fusion));
        consume(grad, i, fusion);
    }
}

static __global__ void adadelta_kernel(float *param, const float *grad, float *square_avg, float *delta_avg,
                                       int64_t n, float lr, float rho, float eps, float weight_decay,
                                       umt_update_fusion fusion) {
    if (skipped_here(grad, n, fusion)) return;
    if (fusion.lr_on_device) lr = *fusion.lr_on_device;
    FOR_EACH_INDEX(i, n) {
        store_lowp(fusion, i, adadelta_element(param, grad, square_avg, delta_avg, i, lr, rho, eps, weight_decay, fusion));
        consume(grad, i, fusion);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Many tensors per launch: block b updates a chunk of the tensor whose blocks it falls in     */

/* Chunks of two elements per thread: enough blocks to fill the GPU for a model of ~1M weights. */
enum { MULTI_TENSORS = 32, MULTI_CHUNK = 2 * THREADS };

/* Passed by value (about 2.8 KB, inside the 4 KB every CUDA version takes). */
typedef struct {
    umt_update_tensor tensors[MULTI_TENSORS];
    int64_t first_block[MULTI_TENSORS + 1]; /* tensor t owns blocks first_block[t] .. first_block[t+1]-1 */
    int count;
} multi_table;

/* The tensor of a launch's table that this block falls in: first_block[t] <= block < first_block[t + 1]
 * (the multi-tensor update's and the step's decision's tables alike). */
static __device__ int tensor_of_block(const int64_t *first_block, int count) {
    int t = 0;
    while (t + 1 < count && (int64_t)blockIdx.x >= first_block[t + 1]) ++t;
    return t;
}

/* Element i of tensor x under the rule; returns the new parameter. */
static __device__ float multi_element(const umt_update_tensor &x, int64_t i, const umt_update_rule &rule, float lr,
                                      const adam_factors &f, const umt_update_fusion &fusion) {
    switch (rule.kind) {
    case UMT_OPT_SGD:
        return sgd_element(x.param, x.grad, x.state0, i, lr, rule.momentum, rule.weight_decay, fusion);
    case UMT_OPT_ADAM:
    case UMT_OPT_ADAMW:
        return adam_element(x.param, x.grad, x.state0, x.state1, i, rule.beta1, rule.beta2, rule.eps, rule.weight_decay,
                            rule.decoupled, f, fusion);
    default:
        return adadelta_element(x.param, x.grad, x.state0, x.state1, i, lr, rule.rho, rule.eps, rule.weight_decay,
                                fusion);
    }
}

/* A compute copy stored K,P,C against the master's K,C,P (a conv weight's, or a flattened linear
 * weight's: core/ops/flatten_linear.c), with channels and pixels both above 1: the copy's
 * elements are then in another order, written through a tile. */
static __host__ __device__ bool copy_transposed(const umt_update_tensor &x) {
    return x.lowp && x.lowp_channels > 1 && x.lowp_pixels > 1;
}

/* Such a tensor's blocks are tiles of TILE_CHANNELS channels by TILE_PIXELS pixels of one k, in
 * a launch with a tensor of TILED_LEAST elements or more in it. The tiles' kernel takes more
 * registers (41 against 32), so fewer blocks run at once: a launch of small tensors only (a
 * conv weight's copy, 18K elements in the MNIST CNN) stays on the plain kernel, where its copy
 * is written element by element as before: the tiled kernel for all was slower at batch 64
 * (docs/PERF.md, "Flattened features as they lie"). */
enum { TILE_CHANNELS = 16, TILE_PIXELS = MULTI_CHUNK / TILE_CHANNELS, TILED_LEAST = 1 << 16 };

static __host__ __device__ int64_t tiles_of(int64_t count, int64_t tile) { return (count + tile - 1) / tile; }

/* Tensor x's blocks: chunks of MULTI_CHUNK elements, or its tiles in a tiled launch. */
static int64_t multi_blocks(const umt_update_tensor &x, bool tiled) {
    if (!tiled || !copy_transposed(x)) return tiles_of(x.n, MULTI_CHUNK);
    int64_t k = x.n / (x.lowp_channels * x.lowp_pixels);
    return k * tiles_of(x.lowp_channels, TILE_CHANNELS) * tiles_of(x.lowp_pixels, TILE_PIXELS);
}

/* Block `block` of x as a tile: the master's elements read along pixels (the master's order),
 * the new values kept in shared memory, then the copy written along channels (the copy's
 * order). Element by element the copy's index was three 64-bit divisions and a scattered
 * 2-byte store each, which for the MNIST CNN's fc1 (1.2M elements, its copy H,W,C) made the
 * update several times slower per element than a plain copy's. The values are the same. The tile's place is found in 32-bit arithmetic (a
 * launch has at most INT32_MAX blocks), each element's offset from the tile's corner too (a
 * tile spans less than 2^31 elements: the launcher checks channels * pixels). */
static __device__ void multi_update_tile(const umt_update_tensor &x, int block, const umt_update_rule &rule,
                                         float lr, const adam_factors &f, const umt_update_fusion &fusion,
                                         bool skipped) {
    __shared__ float tile[TILE_CHANNELS][TILE_PIXELS + 1];
    int channels = (int)x.lowp_channels, pixels = (int)x.lowp_pixels;
    int across = (pixels + TILE_PIXELS - 1) / TILE_PIXELS;
    int per_k = (channels + TILE_CHANNELS - 1) / TILE_CHANNELS * across;
    int k = block / per_k, rest = block - k * per_k, row = rest / across;
    int c0 = row * TILE_CHANNELS, p0 = (rest - row * across) * TILE_PIXELS;
    int64_t master = ((int64_t)k * channels + c0) * pixels + p0, copy = ((int64_t)k * pixels + p0) * channels + c0;
    for (int e = threadIdx.x; e < MULTI_CHUNK; e += blockDim.x) {
        int c = e / TILE_PIXELS, p = e % TILE_PIXELS;
        if (c0 + c >= channels || p0 + p >= pixels) continue;
        int64_t i = master + c * pixels + p;
        if (!skipped) tile[c][p] = multi_element(x, i, rule, lr, f, fusion);
        consume(x.grad, i, fusion);
    }
    if (skipped) return; /* the whole block: nothing of the copy is written */
    __syncthreads();
    for (int e = threadIdx.x; e < MULTI_CHUNK; e += blockDim.x) {
        int p = e / TILE_CHANNELS, c = e % TILE_CHANNELS;
        if (c0 + c < channels && p0 + p < pixels)
            umt_dev_store_from_f32(x.lowp, fusion.lowp_dtype, copy + p * channels + c, tile[c][p]);
    }
}

static __device__ __forceinline__ void prefetch_l1(const float *p) {
    if (p) asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

/* The thread's elements of x, [begin, end), asked for before the step's decision and the rate
 * are read: each of those reads is a memory latency that every element's loads would otherwise
 * wait behind (a block's chunk is two elements a thread, so the wait was a large part of it). */
static __device__ void prefetch_chunk(const umt_update_tensor &x, int64_t begin, int64_t end) {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        prefetch_l1(x.param + i);
        prefetch_l1(x.grad + i);
        prefetch_l1(x.state0 ? x.state0 + i : NULL);
        prefetch_l1(x.state1 ? x.state1 + i : NULL);
    }
}

template <bool TILED>
static __global__ void multi_update_kernel(multi_table table, umt_update_rule rule, adam_factors f,
                                           umt_update_fusion common) {
    int t = tensor_of_block(table.first_block, table.count);
    const umt_update_tensor &x = table.tensors[t];
    int64_t block = (int64_t)blockIdx.x - table.first_block[t];
    bool tile = TILED && copy_transposed(x);
    int64_t begin = block * MULTI_CHUNK, end = begin + MULTI_CHUNK < x.n ? begin + MULTI_CHUNK : x.n;
    if (!tile) prefetch_chunk(x, begin, end);
    bool skipped = step_skipped(common.scalars);
    if (skipped && !common.zero_grad) return;
    float lr = common.lr_on_device ? *common.lr_on_device : rule.lr;
    f = adam_factors_now(f, rule.weight_decay, rule.decoupled, common);
    umt_update_fusion fusion = common;
    fusion.lowp = x.lowp;
    fusion.lowp_channels = x.lowp_channels;
    fusion.lowp_pixels = x.lowp_pixels;
    if (tile) {
        multi_update_tile(x, (int)block, rule, lr, f, fusion, skipped);
        return;
    }
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
        if (!skipped) store_lowp(fusion, i, multi_element(x, i, rule, lr, f, fusion));
        consume(x.grad, i, fusion);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Launchers: the fused forms, and the plain ones as a zero fusion                             */

/* Adam's step factors from the host's step, in double, exactly as kernels/cpu/optim.c. */
static adam_factors host_adam_factors(float lr, float beta1, float beta2, float weight_decay, bool decoupled,
                                      int64_t step) {
    double bias_correction1 = 1.0 - pow(beta1, (double)step);
    double bias_correction2 = 1.0 - pow(beta2, (double)step);
    adam_factors f;
    f.step_size = (float)(lr / bias_correction1);
    f.bias_correction2_sqrt = (float)sqrt(bias_correction2);
    f.decay = decoupled ? 1.0f - lr * weight_decay : 1.0f;
    return f;
}

/* The shared checks, and what only the CPU backend reads: gradients in bf16 (offload/host.c). */
static umt_status check_fusion(const char *op, umt_update_fusion fusion) {
    UMT_TRY(umt_update_fusion_check(op, fusion));
    if (fusion.grad_bf16)
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: grad_bf16 on the cuda backend (expected f32 gradients: only the "
                        "CPU backend reads bf16 ones)", op);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sgd_update_fused(float *param, const float *grad, float *velocity, int64_t n,
                                                float lr, float momentum, float weight_decay,
                                                umt_update_fusion fusion) {
    if (momentum != 0.0f && !velocity)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "sgd_update: momentum %g needs a velocity buffer (got NULL)",
                        momentum);
    UMT_TRY(check_fusion("sgd_update", fusion));
    if (n <= 0) return UMT_OK;
    sgd_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, velocity, n, lr, momentum,
                                                                 weight_decay, fusion);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_adam_update_fused(float *param, const float *grad, float *m, float *v, int64_t n,
                                                 float lr, float beta1, float beta2, float eps, float weight_decay,
                                                 bool decoupled, int64_t step, umt_update_fusion fusion) {
    if (step < 1) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "adam_update: step %lld (expected >= 1)", (long long)step);
    UMT_TRY(check_fusion("adam_update", fusion));
    if (n <= 0) return UMT_OK;
    adam_factors f = host_adam_factors(lr, beta1, beta2, weight_decay, decoupled, step);
    adam_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, m, v, n, beta1, beta2, eps,
                                                                  weight_decay, decoupled, f, fusion);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_adadelta_update_fused(float *param, const float *grad, float *square_avg,
                                                     float *delta_avg, int64_t n, float lr, float rho, float eps,
                                                     float weight_decay, umt_update_fusion fusion) {
    UMT_TRY(check_fusion("adadelta_update", fusion));
    if (n <= 0) return UMT_OK;
    adadelta_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, square_avg, delta_avg, n, lr, rho,
                                                                      eps, weight_decay, fusion);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                          float momentum, float weight_decay) {
    umt_update_fusion none = {};
    return umt_cuda_sgd_update_fused(param, grad, velocity, n, lr, momentum, weight_decay, none);
}

extern "C" umt_status umt_cuda_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                           float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                           int64_t step) {
    umt_update_fusion none = {};
    return umt_cuda_adam_update_fused(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, decoupled, step,
                                      none);
}

extern "C" umt_status umt_cuda_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg,
                                               int64_t n, float lr, float rho, float eps, float weight_decay) {
    umt_update_fusion none = {};
    return umt_cuda_adadelta_update_fused(param, grad, square_avg, delta_avg, n, lr, rho, eps, weight_decay, none);
}

/* The per-tensor launchers' checks, once for the whole list. */
static umt_status check_multi(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                              umt_update_fusion common) {
    bool adam = rule.kind == UMT_OPT_ADAM || rule.kind == UMT_OPT_ADAMW;
    if (adam && rule.step < 1)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "multi_update: step %lld (expected >= 1)", (long long)rule.step);
    for (int i = 0; i < count; ++i) {
        const umt_update_tensor *x = &tensors[i];
        bool needs_state0 = rule.kind != UMT_OPT_SGD || rule.momentum != 0.0f, needs_state1 = rule.kind != UMT_OPT_SGD;
        if ((needs_state0 && !x->state0) || (needs_state1 && !x->state1) || !x->param || !x->grad)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "multi_update: tensor %d of %d lacks a buffer its rule needs", i,
                            count);
        umt_update_fusion each = common;
        each.lowp = x->lowp;
        UMT_TRY(check_fusion("multi_update", each));
        /* A copy in another order covers whole [k, channels, pixels] blocks (its tiles do). */
        int64_t block = x->lowp_channels * x->lowp_pixels;
        if (x->lowp && (x->lowp_channels || x->lowp_pixels) &&
            (x->lowp_channels <= 0 || x->lowp_pixels <= 0 || block > INT32_MAX || x->n % block != 0))
            return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                            "multi_update: tensor %d of %d: %lld elements, its copy in %lld channels x %lld pixels "
                            "(expected both above 0, their product below 2^31, dividing the elements)",
                            i, count, (long long)x->n, (long long)x->lowp_channels, (long long)x->lowp_pixels);
    }
    return UMT_OK;
}

extern "C" umt_status umt_cuda_multi_update(const umt_update_tensor *tensors, int count, umt_update_rule rule,
                                            umt_update_fusion common) {
    UMT_TRY(check_multi(tensors, count, rule, common));
    bool adam = rule.kind == UMT_OPT_ADAM || rule.kind == UMT_OPT_ADAMW;
    adam_factors f = {1.0f, 1.0f, 1.0f};
    if (adam) f = host_adam_factors(rule.lr, rule.beta1, rule.beta2, rule.weight_decay, rule.decoupled, rule.step);
    for (int first = 0; first < count; first += MULTI_TENSORS) {
        multi_table table;
        table.count = count - first < MULTI_TENSORS ? count - first : MULTI_TENSORS;
        table.first_block[0] = 0;
        bool tiled = false;
        for (int t = 0; t < table.count; ++t) {
            const umt_update_tensor &x = tensors[first + t];
            tiled = tiled || (copy_transposed(x) && x.n >= TILED_LEAST);
        }
        for (int t = 0; t < table.count; ++t) {
            table.tensors[t] = tensors[first + t];
            table.first_block[t + 1] = table.first_block[t] + multi_blocks(tensors[first + t], tiled);
        }
        int64_t blocks = table.first_block[table.count];
        if (blocks == 0) continue;
        if (blocks > INT32_MAX)
            return umt_fail(UMT_ERR_UNSUPPORTED, "multi_update: %lld blocks of %d elements in one launch",
                            (long long)blocks, (int)MULTI_CHUNK);
        if (tiled)
            multi_update_kernel<true><<<(unsigned int)blocks, THREADS, 0, umt_cuda_stream()>>>(table, rule, f, common);
        else
            multi_update_kernel<false><<<(unsigned int)blocks, THREADS, 0, umt_cuda_stream()>>>(table, rule, f, common);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The step scalars: a deterministic sum of squares, then one thread's decision               */

/* Adds the block's values in shared memory as a fixed binary tree; thread 0 returns the sum.
 * The same n always adds the same numbers in the same order: the sum is reproducible. */
static __device__ double block_sum(double value) {
    __shared__ double shared[THREADS];
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    return shared[0];
}

/* The tensors of one step_decide launch, by value. Tensor t's share j is summed by block
 * first_block[t] + j, for its shares that hold elements only (a bias of 32 has one): the first of
 * them also writes the zeros of the rest. So a step of the MNIST CNN's 8 tensors runs 211 blocks,
 * not 1024, each one counted on the same word at its end. */
typedef struct {
    const float *grad[MULTI_TENSORS];
    int64_t n[MULTI_TENSORS];
    int64_t first_block[MULTI_TENSORS + 1];
    int count;
    int first; /* the launch's first tensor among all of them: where its partials go */
} decide_table;

/* The shares of n elements that hold any: share j holds element j * THREADS first. */
static int shares_holding(int64_t n) {
    int64_t shares = (n + THREADS - 1) / THREADS;
    return shares < 1 ? 1 : shares > UMT_GRAD_SUMSQ_PARTIALS ? UMT_GRAD_SUMSQ_PARTIALS : (int)shares;
}

/* Each block: its share of one gradient, a grid-stride walk of UMT_GRAD_SUMSQ_PARTIALS blocks'
 * width, squared and summed in double (each square of a float is exact there), into its partial.
 * In the last launch (decide), the last block to finish, which the counter names once every
 * other block's partial is written, sums all of them and makes the step's decision (one thread).
 * The partials and their sum are the same numbers in the same order whatever the timing. */
static __global__ void step_decide_kernel(decide_table table, double *partials, int tensors, bool decide,
                                          umt_step_scalars *scalars, umt_step_options options) {
    int t = tensor_of_block(table.first_block, table.count);
    int share = (int)(blockIdx.x - table.first_block[t]);
    int holding = (int)(table.first_block[t + 1] - table.first_block[t]);
    const float *grad = table.grad[t];
    double *own = partials + (int64_t)(table.first + t) * UMT_GRAD_SUMSQ_PARTIALS;
    double sum = 0.0;
    const int64_t stride = (int64_t)UMT_GRAD_SUMSQ_PARTIALS * THREADS;
    for (int64_t i = (int64_t)share * THREADS + threadIdx.x; i < table.n[t]; i += stride)
        sum += (double)grad[i] * (double)grad[i];
    sum = block_sum(sum);
    if (share == 0) {
        for (int empty = holding + (int)threadIdx.x; empty < UMT_GRAD_SUMSQ_PARTIALS; empty += THREADS)
            own[empty] = 0.0;
        __threadfence(); /* each writer's zeros visible before thread 0 counts the block */
    }
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        own[share] = sum;
        /* The block's partials are visible to every block before the count says so. */
        __threadfence();
        last = decide && atomicAdd(&scalars->blocks_done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    double total = 0.0;
    int64_t count = (int64_t)tensors * UMT_GRAD_SUMSQ_PARTIALS;
    /* Read past this SM's L1: other blocks wrote them. */
    for (int64_t i = threadIdx.x; i < count; i += THREADS) total += __ldcg(&partials[i]);
    total = block_sum(total);
    if (threadIdx.x == 0) {
        scalars->blocks_done = 0; /* ready for the next step (a replayed graph's too) */
        umt_step_finish(scalars, total, partials, tensors, options);
    }
}

extern "C" umt_status umt_cuda_step_decide(const umt_update_tensor *tensors, int count, double *partials,
                                           umt_step_scalars *scalars, umt_step_options options) {
    for (int first = 0; first < count; first += MULTI_TENSORS) {
        decide_table table;
        table.count = count - first < MULTI_TENSORS ? count - first : MULTI_TENSORS;
        table.first = first;
        table.first_block[0] = 0;
        for (int t = 0; t < table.count; ++t) {
            table.grad[t] = tensors[first + t].grad;
            table.n[t] = tensors[first + t].n;
            /* A tensor of no elements still has a block: it writes its partials' zeros, so the
             * sum never reads stale ones. */
            table.first_block[t + 1] = table.first_block[t] + shares_holding(tensors[first + t].n);
        }
        bool decide = first + table.count == count;
        step_decide_kernel<<<(unsigned int)table.first_block[table.count], THREADS, 0, umt_cuda_stream()>>>(
            table, partials, count, decide, scalars, options);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}
