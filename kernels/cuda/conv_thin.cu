/*
 * kernels/cuda/conv_thin.cu — direct convolution for thin inputs (c*r*s <= 9: a one-channel
 * image under a 3x3 filter), forward and weight gradient, bf16/f16 NHWC (kernels/cpu/conv.c is
 * the reference; conv.cu sends these shapes here and the rest to cuDNN).
 *
 * Why not cuDNN: each output pixel of such a layer is a dot product of only c*r*s <= 9 terms,
 * too short for tensor cores, so the work is moving the output (the MNIST CNN's first layer
 * writes 43 kB per image in bf16, its input is 1.5 kB). cuDNN's kernels for one input channel
 * are generic ones (a layout change, and a split-K GEMM millions deep for the weight gradient)
 * that took several times what reading or writing the output once takes (docs/PERF.md,
 * tools/kernel_profile.sh).
 *
 * Forward: a thread computes one output pixel: its c*r*s inputs read once into registers, then
 * its channels eight at a time (one 16-byte store each) from weights in shared memory that all
 * threads read alike; f32 sums in (r, s, c) order, one rounding to the dtype.
 *
 * Weight gradient dw[k,c,r,s] += sum over pixels of dy[pixel,k] * x[window(pixel), c, r, s]:
 * THIN_BLOCKS blocks each take a run of pixels; a thread keeps the 8 x c*r*s sums of its eight
 * channels in registers over its pixels, the block adds its threads' sums in a fixed order
 * (butterfly shuffles in the warp, then warps in order) and writes one partial per block into
 * the workspace; kernels/cuda/chunk_sums.h adds the blocks' partials in a fixed order. No
 * atomics: the same bits on every run, as every kernel of this folder.
 *
 * Fused with the bias and the ReLU that follow (umt_conv2d_relu): the forward adds the bias and
 * clamps before its one store; the weight gradient masks the gradient by y > 0 as it reads it
 * (writing the mask back only when the input's gradient needs it) and sums the bias gradient
 * on the way. The first layer's activation is then written once and read once in backward.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/chunk_sums.h"
#include "kernels/cuda/conv_thin.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

/* THIN_TERMS: the most c*r*s taken; THIN_BLOCKS: the weight gradient's blocks (about two waves
 * of two blocks on each of a Hopper GPU's 132 multiprocessors); GROUP: channels per vector. A
 * warp's 32 lanes must hold whole pixels' channel groups, so k / 8 is a power of two, and at
 * most MAX_GROUPS so that the weight gradient's per-warp sums (8 warps of k * THIN_TERMS
 * floats) fit the 48 KiB of shared memory a launch gets without asking. */
enum { THIN_TERMS = 9, THIN_BLOCKS = 512, MAX_GROUPS = 16, GROUP = UMT_HALVES_PER_VECTOR };

static bool is_half(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }

bool umt_cuda_conv_is_thin(const umt_conv_shape *s) {
    int64_t groups = s->k / GROUP;
    bool groups_fit_a_warp = s->k % GROUP == 0 && groups <= MAX_GROUPS && (groups & (groups - 1)) == 0;
    /* 32-bit index math in the kernels: every tensor under 2^31 elements */
    bool int32_sizes = s->n * s->c * s->h * s->w < INT32_MAX && s->n * s->k * s->p * s->q < INT32_MAX;
    return is_half(s->dtype) && s->nhwc && s->c * s->r * s->s <= THIN_TERMS && groups_fit_a_warp && int32_sizes;
}

bool umt_cuda_conv_thin_takes(const umt_conv_shape *s, const void *vectors_a, const void *vectors_b) {
    return umt_cuda_conv_is_thin(s) && ((uintptr_t)vectors_a | (uintptr_t)vectors_b) % sizeof(uint4) == 0;
}

/* The shape in 32-bit ints (umt_cuda_conv_is_thin checked that they fit): 64-bit divisions
 * cost a GPU about a hundred instructions each, and a pixel's coordinates need three. */
typedef struct {
    int n, c, h, w, k, r, s, p, q, stride, pad, terms, groups;
} thin_shape;

static thin_shape thin(const umt_conv_shape *s) {
    return {(int)s->n,        (int)s->c,      (int)s->h,   (int)s->w,
            (int)s->k,        (int)s->r,      (int)s->s,   (int)s->p,
            (int)s->q,        (int)s->stride, (int)s->pad, (int)(s->c * s->r * s->s),
            (int)(s->k / GROUP)};
}

/* Term t of a window, in (r, s, c) order (the weights' K,R,S,C order): its row and column
 * within the window, and its offset in x from the window's top-left pixel. Made once per block. */
typedef struct {
    int row[THIN_TERMS], col[THIN_TERMS], offset[THIN_TERMS];
} window_table;

static __device__ void make_window_table(const thin_shape &s, window_table *table) {
    for (int t = threadIdx.x; t < s.terms; t += blockDim.x) {
        int c = t % s.c, col = t / s.c % s.s, row = t / (s.c * s.s);
        table->row[t] = row, table->col[t] = col, table->offset[t] = (row * s.w + col) * s.c + c;
    }
}

/* The inputs under output pixel `pixel`'s window, zero where it hangs over the padding. */
template <umt_dtype D>
static __device__ void window_terms(const uint16_t *x, const thin_shape &s, const window_table *table, int pixel,
                                    float *terms) {
    int q = pixel % s.q, rest = pixel / s.q, p = rest % s.p, n = rest / s.p;
    int top = p * s.stride - s.pad, left = q * s.stride - s.pad, corner = ((n * s.h + top) * s.w + left) * s.c;
#pragma unroll
    for (int t = 0; t < THIN_TERMS; t++) {
        if (t >= s.terms) break;
        int row = top + table->row[t], col = left + table->col[t];
        bool inside = (unsigned)row < (unsigned)s.h && (unsigned)col < (unsigned)s.w;
        terms[t] = inside ? umt_dev_widen<D>(x[corner + table->offset[t]]) : 0.0f;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Forward: a thread per output pixel, its window read once, its k channels eight at a time    */

/* Written as "v < 0 ? 0 : v" so that a NaN passes through, as the ReLU kernels do. */
static __device__ float relu(float v) { return v < 0.0f ? 0.0f : v; }

/* With RELU, y = max(round(conv) + bias, 0) rounded again: bias_relu after the plain forward.
 * The weights sit in shared memory as [group][term][8 channels], so that each term's eight
 * weights are two 16-byte reads that every thread of the block makes alike (one broadcast). */
template <umt_dtype D, bool RELU>
static __global__ void thin_forward_kernel(const uint16_t *x, const uint16_t *w, const float *bias, uint4 *y,
                                           thin_shape s) {
    extern __shared__ float4 shared[]; /* the weights, then the k biases */
    __shared__ window_table table;
    float *weights = (float *)shared, *biases = weights + s.k * s.terms;
    for (int i = threadIdx.x; i < s.k * s.terms; i += blockDim.x) {
        int k = i / s.terms, t = i % s.terms; /* w is K,R,S,C: k's terms in (r, s, c) order */
        weights[((k / GROUP) * s.terms + t) * GROUP + k % GROUP] = umt_dev_widen<D>(w[i]);
    }
    for (int i = threadIdx.x; i < s.k; i += blockDim.x) biases[i] = bias ? bias[i] : 0.0f;
    make_window_table(s, &table);
    __syncthreads();
    int pixels = s.n * s.p * s.q;
    for (int pixel = blockIdx.x * blockDim.x + threadIdx.x; pixel < pixels; pixel += gridDim.x * blockDim.x) {
        float terms[THIN_TERMS];
        window_terms<D>(x, s, &table, pixel, terms);
        for (int group = 0; group < s.groups; group++) {
            const float4 *filter = shared + group * s.terms * 2;
            float sum[GROUP] = {};
#pragma unroll
            for (int t = 0; t < THIN_TERMS; t++) {
                if (t >= s.terms) break;
                float4 a = filter[2 * t], b = filter[2 * t + 1];
                sum[0] += a.x * terms[t], sum[1] += a.y * terms[t], sum[2] += a.z * terms[t];
                sum[3] += a.w * terms[t], sum[4] += b.x * terms[t], sum[5] += b.y * terms[t];
                sum[6] += b.z * terms[t], sum[7] += b.w * terms[t];
            }
            umt_halves8 out;
#pragma unroll
            for (int e = 0; e < GROUP; e++) {
                out.h[e] = umt_dev_narrow<D>(sum[e]);
                if (RELU) out.h[e] = umt_dev_narrow<D>(relu(umt_dev_widen<D>(out.h[e]) + biases[group * GROUP + e]));
            }
            y[pixel * s.groups + group] = out.bits;
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Weight gradient (with MASKED, of a fused convolution + ReLU: the mask and the bias sums too) */

/* What a thread sums: per channel of its group, the weight gradient's terms and the bias's. */
typedef struct {
    float w[GROUP][THIN_TERMS], bias[GROUP];
} thin_sums;

/* Thread t holds channel group t % groups of pixels first + t / groups, stepping by the block's
 * lanes. MASKED: the gradient is first masked by y > 0 (written back when keep_dy). */
template <umt_dtype D, bool MASKED>
static __device__ void sum_block_pixels(const uint16_t *x, const uint4 *y, uint4 *dy, bool keep_dy,
                                        const thin_shape &s, const window_table *table, int first, int last,
                                        thin_sums *sums) {
    int lanes = (int)blockDim.x / s.groups;
    for (int pixel = first + threadIdx.x / s.groups; pixel < last; pixel += lanes) {
        float terms[THIN_TERMS];
        window_terms<D>(x, s, table, pixel, terms);
        int at = pixel * s.groups + threadIdx.x % s.groups;
        umt_halves8 grad;
        grad.bits = dy[at];
        if (MASKED) {
            umt_halves8 out;
            out.bits = y[at];
#pragma unroll
            for (int e = 0; e < GROUP; e++)
                if (!(umt_dev_widen<D>(out.h[e]) > 0.0f)) grad.h[e] = 0;
            if (keep_dy) dy[at] = grad.bits;
        }
#pragma unroll
        for (int e = 0; e < GROUP; e++) {
            float g = umt_dev_widen<D>(grad.h[e]);
            if (MASKED) sums->bias[e] += g;
#pragma unroll
            for (int t = 0; t < THIN_TERMS; t++)
                if (t < s.terms) sums->w[e][t] += g * terms[t];
        }
    }
}

/* The warp's sum of v over the lanes holding the same channels (lanes l and l ^ offset for
 * offset >= groups): a butterfly, the same order every time; lanes 0..groups-1 get it. */
static __device__ float warp_channel_sum(float v, int groups) {
    for (int offset = 16; offset >= groups; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* The block's partials: dw's k * terms in K,C,R,S order at partials[block * k * terms], and
 * with MASKED the bias's k at bias_partials[block * k]. Two blocks per multiprocessor at least
 * (at most 128 registers a thread): with one, the loads of x, y and dy wait unhidden. */
template <umt_dtype D, bool MASKED>
static __global__ void __launch_bounds__(THREADS, 2)
    thin_filter_kernel(const uint16_t *x, const uint4 *y, uint4 *dy, bool keep_dy, float *partials,
                       float *bias_partials, thin_shape s, int pixels_per_block) {
    extern __shared__ float warp_sums[]; /* [warp][k * terms + k]: (channel, term (r, s, c)), biases */
    __shared__ window_table table;
    make_window_table(s, &table);
    __syncthreads();
    int outputs = s.k * s.terms, row = outputs + s.k, pixels = s.n * s.p * s.q;
    int first = blockIdx.x * pixels_per_block;
    int last = first + pixels_per_block < pixels ? first + pixels_per_block : pixels;
    thin_sums sums = {};
    sum_block_pixels<D, MASKED>(x, y, dy, keep_dy, s, &table, first, last, &sums);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = threadIdx.x % s.groups;
#pragma unroll
    for (int e = 0; e < GROUP; e++) {
        int channel = group * GROUP + e;
#pragma unroll
        for (int t = 0; t < THIN_TERMS; t++) {
            if (t >= s.terms) break;
            float v = warp_channel_sum(sums.w[e][t], s.groups);
            if (lane < s.groups) warp_sums[warp * row + channel * s.terms + t] = v;
        }
        if (MASKED) {
            float v = warp_channel_sum(sums.bias[e], s.groups);
            if (lane < s.groups) warp_sums[warp * row + outputs + channel] = v;
        }
    }
    __syncthreads();
    /* Warps added in order; output o = (channel, term (r, s, c)) goes to its K,C,R,S place. */
    for (int o = threadIdx.x; o < (MASKED ? row : outputs); o += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) total += warp_sums[w * row + o];
        if (o >= outputs) {
            bias_partials[blockIdx.x * s.k + o - outputs] = total;
            continue;
        }
        int k = o / s.terms, t = o % s.terms, c = t % s.c, rs = t / s.c;
        partials[blockIdx.x * outputs + (k * s.c + c) * s.r * s.s + rs] = total;
    }
}

static __global__ void add_block_partials_kernel(const float *partials, float *sums, int64_t columns, int blocks) {
    umt_dev_add_chunk_partials(partials, sums, columns, blocks);
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points (conv.cu has checked the shape, the workspace and umt_cuda_conv_thin_takes)    */

size_t umt_cuda_conv_thin_workspace_bytes(const umt_conv_shape *s) {
    return (size_t)THIN_BLOCKS * (size_t)(s->k * s->c * s->r * s->s + s->k) * sizeof(float);
}

template <umt_dtype D>
static umt_status forward(const umt_conv_shape *s, const void *x, const void *w, const float *bias, bool relu,
                          void *y) {
    size_t shared = (size_t)(s->k * s->c * s->r * s->s + s->k) * sizeof(float);
    unsigned int blocks = blocks_for(s->n * s->p * s->q);
    if (relu)
        thin_forward_kernel<D, true><<<blocks, THREADS, shared, umt_cuda_stream()>>>(
            (const uint16_t *)x, (const uint16_t *)w, bias, (uint4 *)y, thin(s));
    else
        thin_forward_kernel<D, false><<<blocks, THREADS, shared, umt_cuda_stream()>>>(
            (const uint16_t *)x, (const uint16_t *)w, NULL, (uint4 *)y, thin(s));
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* y NULL: the plain weight gradient; else the fused one (mask, keep_dy, dbias). */
template <umt_dtype D>
static umt_status backward_filter(const umt_conv_shape *s, const void *x, const void *y, void *dy, bool keep_dy,
                                  float *dw, float *dbias, void *workspace) {
    int64_t pixels = s->n * s->p * s->q, lanes = THREADS / (s->k / GROUP), outputs = s->k * s->c * s->r * s->s;
    int64_t blocks = (pixels + lanes - 1) / lanes;
    if (blocks > THIN_BLOCKS) blocks = THIN_BLOCKS;
    int64_t per_block = (pixels + blocks - 1) / blocks;
    blocks = (pixels + per_block - 1) / per_block;
    size_t shared = (size_t)(THREADS / 32 * (outputs + s->k)) * sizeof(float);
    float *partials = (float *)workspace, *bias_partials = partials + THIN_BLOCKS * outputs;
    cudaStream_t stream = umt_cuda_stream();
    if (y)
        thin_filter_kernel<D, true><<<(unsigned int)blocks, THREADS, shared, stream>>>(
            (const uint16_t *)x, (const uint4 *)y, (uint4 *)dy, keep_dy, partials, bias_partials, thin(s),
            (int)per_block);
    else
        thin_filter_kernel<D, false><<<(unsigned int)blocks, THREADS, shared, stream>>>(
            (const uint16_t *)x, NULL, (uint4 *)dy, false, partials, NULL, thin(s), (int)per_block);
    UMT_CUDA_LAUNCHED();
    add_block_partials_kernel<<<umt_chunk_sum_blocks(outputs), THREADS, 0, stream>>>(partials, dw, outputs,
                                                                                      (int)blocks);
    UMT_CUDA_LAUNCHED();
    if (y && dbias) {
        add_block_partials_kernel<<<umt_chunk_sum_blocks(s->k), THREADS, 0, stream>>>(bias_partials, dbias, s->k,
                                                                                      (int)blocks);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

umt_status umt_cuda_conv2d_forward_thin(const umt_conv_shape *s, const void *x, const void *w, const float *bias,
                                        bool relu, void *y) {
    if (s->n == 0) return UMT_OK;
    return s->dtype == UMT_BF16 ? forward<UMT_BF16>(s, x, w, bias, relu, y) : forward<UMT_F16>(s, x, w, bias, relu, y);
}

umt_status umt_cuda_conv2d_backward_filter_thin(const umt_conv_shape *s, const void *x, const void *y, void *dy,
                                                bool keep_dy, float *dw, float *dbias, void *workspace) {
    if (s->n == 0) return UMT_OK;
    return s->dtype == UMT_BF16 ? backward_filter<UMT_BF16>(s, x, y, dy, keep_dy, dw, dbias, workspace)
                                : backward_filter<UMT_F16>(s, x, y, dy, keep_dy, dw, dbias, workspace);
}
