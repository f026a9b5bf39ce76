/*
 * kernels/cuda/conv_thin.cu — direct convolution for thin inputs (c*r*s <= 9: a one-channel
 * image under a 3x3 filter): forward and weight gradient in bf16/f16 NHWC and in f32 NCHW
 * (kernels/cpu/conv.c is the reference; conv.cu sends these shapes here and the rest to cuDNN).
 *
 * Why not cuDNN: each output pixel of such a layer is a dot product of only c*r*s <= 9 terms,
 * too short for tensor cores, so the work is moving the output (the MNIST CNN's first layer
 * writes 43 kB per image in bf16, its input is 1.5 kB). cuDNN's kernels for one input channel
 * are generic ones (a layout change, and a split-K GEMM millions deep for the weight gradient)
 * that took several times what reading or writing the output once takes (docs/PERF.md,
 * tools/kernel_profile.sh).
 *
 * Forward: a thread computes one output pixel: its c*r*s inputs read once into registers, then
 * its channels eight at a time from weights in shared memory that all threads read alike; f32
 * sums in (r, s, c) order, one rounding to the dtype. The block's outputs go through shared
 * memory, four vectors of each pixel at a time, so that a warp's stores fill whole 32-byte
 * sectors (a thread's own 16-byte stores, a pixel's width apart, left each sector half written
 * per store and doubled the L2's work).
 *
 * Weight gradient dw[k,c,r,s] += sum over pixels of dy[pixel,k] * x[window(pixel), c, r, s]:
 * at most FILTER_BLOCKS blocks each take a run of dy's vectors and stream it through shared
 * memory, a tile at a time with the next tile's copy (cp.async) in flight while this one is
 * summed: the loads no longer wait in registers, so a thread's sums (4 channels x c*r*s terms)
 * fit three blocks on a multiprocessor. Each pixel's window terms are read once into shared
 * memory beside its tile, and the threads of its channels take them from there. The block adds
 * its threads' sums in a fixed order (butterfly shuffles in the warp, then warps in order) and
 * writes one partial per block into the workspace; kernels/cuda/chunk_sums.h adds the blocks'
 * partials in a fixed order, the weights' and the bias's in one launch. No atomics: the same
 * bits on every run, as every kernel of this folder. The f32 kernels (NCHW) are simpler: the
 * channels are planes, so lanes take a plane's neighbouring pixels and every load and store is
 * coalesced as it stands.
 *
 * Fused with the bias and the ReLU that follow (umt_conv2d_relu): the forward adds the bias and
 * clamps before its one store; the weight gradient masks the gradient by y > 0 as it reads it
 * (writing the mask back only when the input's gradient needs it) and sums the bias gradient
 * on the way. The first layer's activation is then written once and read once in backward.
 */
#include <cuda_pipeline.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/chunk_sums.h"
#include "kernels/cuda/conv_thin.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/fast_divide.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

/* THIN_TERMS: the most c*r*s taken; GROUP: channels per 16-byte vector, QUAD per 8-byte one. A
 * warp's 32 lanes must hold whole pixels' channel vectors, so k / 8 is a power of two, and at
 * most MAX_GROUPS. The weight gradient: at most FILTER_BLOCKS blocks (three on each of a Hopper
 * GPU's 132 multiprocessors, one wave; a constant rather than the GPU's count, so that a shape's
 * sums are added in the same order on any GPU), each streaming dy through shared memory in
 * tiles of TILE_VECTORS vectors (of at most TILE_PIXELS pixels, whose window terms are staged
 * beside them); the tiles and terms, or the warps' sums after them (8 warps of k * THIN_TERMS
 * + k floats), fit the 48 KiB of shared memory a launch gets without asking. */
enum {
    THIN_TERMS = 9,
    MAX_GROUPS = 16,
    GROUP = UMT_HALVES_PER_VECTOR,
    QUAD = GROUP / 2,
    FILTER_BLOCKS = 396,
    TILE_VECTORS = 512,
    TILE_PIXELS = 256,
    F32_CHANNELS = 4,
    F32_BLOCKS = 528,
    PIXELS = 2 /* the forward's pixels a thread, which share its reads of the weights */
};

static bool is_half(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }

bool umt_cuda_conv_is_thin(const umt_conv_shape *s) {
    int64_t groups = s->k / GROUP;
    bool groups_fit_a_warp = s->k % GROUP == 0 && groups <= MAX_GROUPS && (groups & (groups - 1)) == 0;
    /* 32-bit index math in the kernels: every tensor under 2^31 elements */
    bool int32_sizes = s->n * s->c * s->h * s->w < INT32_MAX && s->n * s->k * s->p * s->q < INT32_MAX;
    return is_half(s->dtype) && s->nhwc && s->c * s->r * s->s <= THIN_TERMS && groups_fit_a_warp && int32_sizes;
}

bool umt_cuda_conv_is_thin_f32(const umt_conv_shape *s) {
    bool int32_sizes = s->n * s->c * s->h * s->w < INT32_MAX && s->n * s->k * s->p * s->q < INT32_MAX;
    return s->dtype == UMT_F32 && !s->nhwc && s->c * s->r * s->s <= THIN_TERMS && int32_sizes;
}

bool umt_cuda_conv_thin_takes(const umt_conv_shape *s, const void *vectors_a, const void *vectors_b) {
    return umt_cuda_conv_is_thin(s) && ((uintptr_t)vectors_a | (uintptr_t)vectors_b) % sizeof(uint4) == 0;
}

/* The shape in 32-bit ints (umt_cuda_conv_is_thin and _is_thin_f32 checked that they fit):
 * 64-bit divisions cost a GPU about a hundred instructions each, and a pixel's coordinates need
 * three. by_q and by_p divide by q and p (kernels/cuda/fast_divide.h); quad_shift is log2 of the
 * 8-byte vectors (k / 4) a pixel's gradient has (half shapes); nchw: x is in planes (f32). */
typedef struct {
    int n, c, h, w, k, r, s, p, q, stride, pad, terms, groups, quad_shift, nchw;
    umt_fast_divisor by_q, by_p;
} thin_shape;

static thin_shape thin(const umt_conv_shape *s) {
    int quad_shift = 0;
    while ((QUAD << quad_shift) < s->k) quad_shift++;
    return {(int)s->n,        (int)s->c,      (int)s->h,   (int)s->w,
            (int)s->k,        (int)s->r,      (int)s->s,   (int)s->p,
            (int)s->q,        (int)s->stride, (int)s->pad, (int)(s->c * s->r * s->s),
            (int)(s->k / GROUP), quad_shift,  !s->nhwc,   umt_fast_divisor_of((int)s->q),
            umt_fast_divisor_of((int)s->p)};
}

/* Term t of a window, in (r, s, c) order (the weights' K,R,S,C order): its row and column
 * within the window, and its offset in x from the window's top-left pixel (channels last, or
 * planes for f32 NCHW). Made once per block. */
typedef struct {
    int row[THIN_TERMS], col[THIN_TERMS], offset[THIN_TERMS];
} window_table;

static __device__ void make_window_table(const thin_shape &s, window_table *table) {
    for (int t = threadIdx.x; t < s.terms; t += blockDim.x) {
        int c = t % s.c, col = t / s.c % s.s, row = t / (s.c * s.s);
        table->row[t] = row, table->col[t] = col;
        table->offset[t] = s.nchw ? (c * s.h + row) * s.w + col : (row * s.w + col) * s.c + c;
    }
}

/* Element i of x as f32: D is x's dtype (f32 thin convolutions are NCHW, half ones NHWC). */
template <umt_dtype D> static __device__ float x_at(const void *x, int i) {
    if (D == UMT_F32) return ((const float *)x)[i];
    return umt_dev_widen<D>(((const uint16_t *)x)[i]);
}

/* The inputs under output pixel `pixel`'s window (pixel: the flat (n, p, q) index), all
 * THIN_TERMS of them, zero past c*r*s (so that the sums over terms run a fixed count, with no
 * test per term). PADDED (the shape's pad > 0): zero where the window hangs over the padding;
 * without padding every window lies inside x, and leaving out the test leaves out the window's
 * rows and columns, 18 registers the weight gradient's sums need. */
template <umt_dtype D, bool PADDED>
static __device__ __forceinline__ void window_terms(const void *x, const thin_shape &s, const window_table *table,
                                                    int pixel, float *terms) {
    int rest = umt_fast_divide(pixel, s.by_q), q = pixel - rest * s.q, n = umt_fast_divide(rest, s.by_p);
    int p = rest - n * s.p, top = p * s.stride - s.pad, left = q * s.stride - s.pad;
    int corner = D == UMT_F32 ? (n * s.c * s.h + top) * s.w + left : ((n * s.h + top) * s.w + left) * s.c;
#pragma unroll
    for (int t = 0; t < THIN_TERMS; t++) {
        if (t >= s.terms) {
            terms[t] = 0.0f;
            continue;
        }
        if (!PADDED) {
            terms[t] = x_at<D>(x, corner + table->offset[t]);
            continue;
        }
        int row = top + table->row[t], col = left + table->col[t];
        bool inside = (unsigned)row < (unsigned)s.h && (unsigned)col < (unsigned)s.w;
        terms[t] = inside ? x_at<D>(x, corner + table->offset[t]) : 0.0f;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Forward: a thread per output pixel, its window read once, its k channels eight at a time    */

/* Written as "v < 0 ? 0 : v" so that a NaN passes through, as the ReLU kernels do. */
static __device__ float relu(float v) { return v < 0.0f ? 0.0f : v; }

/* Two floats rounded to the dtype (to nearest even) in one instruction, lo in the low half. A NaN
 * comes out as the hardware's canonical NaN, as from cuDNN's convolutions (umt_dev_narrow keeps
 * the payload as the CPU does, at a few instructions an element). */
template <umt_dtype D> static __device__ uint32_t narrow_pair(float lo, float hi) {
    if (D == UMT_BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* One group's eight channels of PIXELS pixels (y = round(conv), with RELU max(y + bias, 0)
 * rounded again: bias_relu after the plain forward, bit for bit). The weights sit in shared
 * memory as [group][THIN_TERMS terms][8 channels], zero past c*r*s, so that each term's eight
 * weights are two 16-byte reads that every thread of the block makes alike (one broadcast),
 * once for all of the thread's pixels: those reads were most of the kernel's shared-memory
 * traffic, which bound it (docs/PERF.md, "Dropout drawn by the pool"). */
template <umt_dtype D, bool RELU>
static __device__ __forceinline__ void forward_group(const float4 *filter, const float *biases,
                                                     const float (&terms)[PIXELS][THIN_TERMS], uint4 (&out)[PIXELS]) {
    float sum[PIXELS][GROUP] = {};
#pragma unroll
    for (int t = 0; t < THIN_TERMS; t++) {
        float4 a = filter[2 * t], b = filter[2 * t + 1];
#pragma unroll
        for (int i = 0; i < PIXELS; i++) {
            float v = terms[i][t];
            sum[i][0] += a.x * v, sum[i][1] += a.y * v, sum[i][2] += a.z * v, sum[i][3] += a.w * v;
            sum[i][4] += b.x * v, sum[i][5] += b.y * v, sum[i][6] += b.z * v, sum[i][7] += b.w * v;
        }
    }
#pragma unroll
    for (int i = 0; i < PIXELS; i++) {
        uint32_t pairs[GROUP / 2];
#pragma unroll
        for (int e = 0; e < GROUP / 2; e++) {
            pairs[e] = narrow_pair<D>(sum[i][2 * e], sum[i][2 * e + 1]);
            if (!RELU) continue;
            float lo = umt_dev_widen<D>((uint16_t)(pairs[e] & 0xffffu));
            float hi = umt_dev_widen<D>((uint16_t)(pairs[e] >> 16));
            pairs[e] = narrow_pair<D>(relu(lo + biases[2 * e]), relu(hi + biases[2 * e + 1]));
        }
        out[i] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
}

/* STAGED vectors per pixel at a time: four (64 bytes, two whole sectors), or all of a smaller k's. */
enum { STAGED = 4 };

/* Each block takes PIXELS * THREADS pixels at a time, thread t pixels t, t + THREADS, ...;
 * their outputs, STAGED groups at a time, are stored from shared memory in order: a warp
 * writes 512 contiguous bytes (or runs of 64 where k > 32). */
template <umt_dtype D, bool RELU, bool PADDED>
static __global__ void thin_forward_kernel(const uint16_t *x, const uint16_t *w, const float *bias, uint4 *y,
                                           thin_shape s) {
    extern __shared__ float4 shared[]; /* the weights, then the k biases */
    __shared__ window_table table;
    __shared__ uint4 staged[STAGED * PIXELS * THREADS];
    float *weights = (float *)shared, *biases = weights + s.k * THIN_TERMS;
    for (int i = threadIdx.x; i < s.k * THIN_TERMS; i += blockDim.x) {
        int k = i / THIN_TERMS, t = i % THIN_TERMS; /* w is K,R,S,C: k's terms in (r, s, c) order */
        weights[((k / GROUP) * THIN_TERMS + t) * GROUP + k % GROUP] =
            t < s.terms ? umt_dev_widen<D>(w[k * s.terms + t]) : 0.0f;
    }
    for (int i = threadIdx.x; i < s.k; i += blockDim.x) biases[i] = bias ? bias[i] : 0.0f;
    make_window_table(s, &table);
    __syncthreads();
    int pixels = s.n * s.p * s.q, chunk = min(s.groups, (int)STAGED), chunk_shift = chunk == 4 ? 2 : chunk - 1;
    for (int first = blockIdx.x * PIXELS * THREADS; first < pixels; first += gridDim.x * PIXELS * THREADS) {
        float terms[PIXELS][THIN_TERMS]; /* a pixel past the end computes from zeros, unstored */
#pragma unroll
        for (int i = 0; i < PIXELS; i++) {
            int pixel = first + i * THREADS + (int)threadIdx.x;
            if (pixel < pixels) window_terms<D, PADDED>(x, s, &table, pixel, terms[i]);
            else
#pragma unroll
                for (int t = 0; t < THIN_TERMS; t++) terms[i][t] = 0.0f;
        }
        for (int group = 0; group < s.groups; group += chunk) {
            for (int g = 0; g < chunk; g++) {
                uint4 out[PIXELS];
                forward_group<D, RELU>(shared + (group + g) * THIN_TERMS * 2, biases + (group + g) * GROUP, terms,
                                       out);
#pragma unroll
                for (int i = 0; i < PIXELS; i++) staged[(i * THREADS + threadIdx.x) * chunk + g] = out[i];
            }
            __syncthreads();
            for (int v = threadIdx.x; v < chunk * PIXELS * THREADS; v += THREADS) {
                int at = first + (v >> chunk_shift);
                if (at < pixels) y[at * s.groups + group + (v & (chunk - 1))] = staged[v];
            }
            __syncthreads(); /* staged is written again for the next groups */
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Weight gradient (with MASKED, of a fused convolution + ReLU: the mask and the bias sums too) */

/* Four halves in one 8-byte load or store: a thread's channels of a pixel's gradient. */
typedef union {
    uint2 bits;
    uint16_t h[QUAD];
} halves4;

/* What a thread sums: per channel of its four, the weight gradient's terms and the bias's. */
typedef struct {
    float w[QUAD][THIN_TERMS], bias[QUAD];
} thin_sums;

/* Starts copying dy's vectors [from, to) (at most TILE_VECTORS) into stage, and with MASKED y's
 * after them, without waiting: one commit group, which __pipeline_wait_prior then waits for. */
template <bool MASKED>
static __device__ void fetch_tile(const uint4 *y, const uint4 *dy, uint4 *stage, int from, int to) {
    for (int v = (int)threadIdx.x; from + v < to; v += (int)blockDim.x) {
        __pipeline_memcpy_async(&stage[v], &dy[from + v], sizeof(uint4));
        if (MASKED) __pipeline_memcpy_async(&stage[TILE_VECTORS + v], &y[from + v], sizeof(uint4));
    }
    __pipeline_commit();
}

/* The window terms of pixels [first, last) (at most TILE_PIXELS) into terms[(pixel - first) *
 * THIN_TERMS + t], a thread a pixel: read and placed once per pixel, not once per thread of its
 * channels (eight for k = 32), whose address arithmetic and loads of x were most of the work. */
template <umt_dtype D, bool PADDED>
static __device__ __forceinline__ void stage_terms(const uint16_t *x, const thin_shape &s, const window_table *table,
                                                   int first, int last, float *terms) {
    for (int pixel = first + (int)threadIdx.x; pixel < last; pixel += (int)blockDim.x) {
        float own[THIN_TERMS];
        window_terms<D, PADDED>(x, s, table, pixel, own);
#pragma unroll
        for (int t = 0; t < THIN_TERMS; t++) terms[(pixel - first) * THIN_TERMS + t] = own[t];
    }
}

/* Adds the terms of dy's vectors [from, to), now in stage, with their pixels' window terms from
 * first_pixel on in terms, to the thread's sums. A thread takes 8-byte quads: quad u of the tile
 * is channels 4 * (u % (k / 4)) on of pixel (2 * from + u) / (k / 4), and u steps by the block's
 * threads, a multiple of k / 4, so a thread's channels stay the same (from is a multiple of
 * k / 8). MASKED: the gradient is first masked by y > 0 (written back to dy when keep_dy). */
template <umt_dtype D, bool MASKED>
static __device__ __forceinline__ void sum_tile(uint4 *dy, bool keep_dy, const uint4 *stage, const float *terms,
                                                const thin_shape &s, int from, int to, int first_pixel,
                                                thin_sums *sums) {
    const uint2 *grads = (const uint2 *)stage, *outs = (const uint2 *)(stage + TILE_VECTORS);
    for (int u = (int)threadIdx.x; u < 2 * (to - from); u += (int)blockDim.x) {
        int quad = 2 * from + u;
        const float *window = terms + ((quad >> s.quad_shift) - first_pixel) * THIN_TERMS;
        halves4 grad, out;
        grad.bits = grads[u];
        if (MASKED) out.bits = outs[u];
#pragma unroll
        for (int e = 0; e < QUAD; e++) {
            float g = umt_dev_widen<D>(grad.h[e]);
            if (MASKED && !(umt_dev_widen<D>(out.h[e]) > 0.0f)) g = 0.0f, grad.h[e] = 0;
            if (MASKED) sums->bias[e] += g;
#pragma unroll
            for (int t = 0; t < THIN_TERMS; t++) sums->w[e][t] += g * window[t];
        }
        if (MASKED && keep_dy) ((uint2 *)dy)[quad] = grad.bits;
    }
}

/* The warp's sum of v over the lanes holding the same channels (lanes l and l ^ offset for
 * offset >= quads): a butterfly, the same order every time; lanes 0..quads-1 get it. */
static __device__ float warp_channel_sum(float v, int quads) {
    for (int offset = 16; offset >= quads; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* Writes the block's partial: row = k * terms + k floats at partials[block * row], dw's in
 * K,C,R,S order, then with MASKED the bias's. warp_sums (shared) holds [warp][row]. */
template <bool MASKED>
static __device__ __forceinline__ void write_block_partial(const thin_sums &sums, const thin_shape &s,
                                                           float *warp_sums, float *partials) {
    int outputs = s.k * s.terms, row = outputs + s.k, quads = 2 * s.groups;
    int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, first_channel = QUAD * (lane % quads);
#pragma unroll
    for (int e = 0; e < QUAD; e++) {
#pragma unroll
        for (int t = 0; t < THIN_TERMS; t++) {
            if (t >= s.terms) break;
            float v = warp_channel_sum(sums.w[e][t], quads);
            if (lane < quads) warp_sums[warp * row + (first_channel + e) * s.terms + t] = v;
        }
        if (MASKED) {
            float v = warp_channel_sum(sums.bias[e], quads);
            if (lane < quads) warp_sums[warp * row + outputs + first_channel + e] = v;
        }
    }
    __syncthreads();
    /* Warps added in order; output o = (channel, term (r, s, c)) goes to its K,C,R,S place. */
    for (int o = (int)threadIdx.x; o < (MASKED ? row : outputs); o += (int)blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) total += warp_sums[w * row + o];
        int k = o / s.terms, t = o % s.terms, c = t % s.c, rs = t / s.c;
        partials[blockIdx.x * row + (o >= outputs ? o : (k * s.c + c) * s.r * s.s + rs)] = total;
    }
}

/* Each block sums dy's vectors [blockIdx.x * per_block, + per_block): two tiles in shared memory,
 * the next one's copy in flight while this one's window terms are staged and its vectors summed;
 * then its partial. Three blocks per multiprocessor (at most 80 registers a thread: an unpadded
 * shape's kernel needs no more, a padded one's spills a few). */
template <umt_dtype D, bool MASKED, bool PADDED>
static __global__ void __launch_bounds__(THREADS, 3)
    thin_filter_kernel(const uint16_t *x, const uint4 *y, uint4 *dy, bool keep_dy, float *partials, thin_shape s,
                       int per_block) {
    extern __shared__ uint4 stages[]; /* two tiles of dy (and y), a tile's terms; after them, the warps' sums */
    __shared__ window_table table;
    make_window_table(s, &table);
    __syncthreads();
    const int stage = (MASKED ? 2 : 1) * TILE_VECTORS, vectors = s.n * s.p * s.q * s.groups;
    const int tile = min((int)TILE_VECTORS, TILE_PIXELS * s.groups), pixel_shift = s.quad_shift - 1;
    float *terms = (float *)(stages + 2 * stage);
    int first = (int)blockIdx.x * per_block, last = min(first + per_block, vectors);
    thin_sums sums = {};
    fetch_tile<MASKED>(y, dy, stages, first, min(first + tile, last));
    for (int from = first, at = 0; from < last; from += tile, at++) {
        int next = from + tile, to = min(next, last);
        if (next < last) fetch_tile<MASKED>(y, dy, stages + (at + 1) % 2 * stage, next, min(next + tile, last));
        else __pipeline_commit(); /* an empty group: the wait below leaves the newest one pending */
        stage_terms<D, PADDED>(x, s, &table, from >> pixel_shift, to >> pixel_shift, terms);
        __pipeline_wait_prior(1);
        __syncthreads();
        sum_tile<D, MASKED>(dy, keep_dy, stages + at % 2 * stage, terms, s, from, to, from >> pixel_shift, &sums);
        __syncthreads(); /* this stage and the terms are written again at the next tile */
    }
    write_block_partial<MASKED>(sums, s, (float *)stages, partials);
}

/* dw += the blocks' weight gradient partials, and dbias += their bias partials when columns
 * passes outputs: one launch for both. */
static __global__ void add_block_partials_kernel(const float *partials, float *dw, float *dbias, int outputs,
                                                 int row, int columns, int blocks) {
    for (int column = (int)blockIdx.x; column < columns; column += (int)gridDim.x)
        umt_dev_add_chunk_column(partials, column < outputs ? &dw[column] : &dbias[column - outputs], row, column,
                                 blocks);
}

/* ------------------------------------------------------------------------------------------ */
/* f32 (NCHW): the forward and the weight gradient, each optionally fused with the bias and ReLU */

/* F32_STRIDE floats per channel's weights in shared memory: THIN_TERMS, zero past c*r*s, padded
 * to whole 16-byte reads. */
enum { F32_STRIDE = 12 };

/* A thread per output pixel, its window read once; each channel's sum goes to the channel's
 * plane, where a warp's 32 neighbouring pixels make one coalesced store. With RELU, y =
 * max(sum + bias, 0), as f32.bias_relu after the plain forward computes it. */
template <bool RELU, bool PADDED>
static __global__ void thin_forward_f32_kernel(const float *x, const float *w, const float *bias, float *y,
                                               thin_shape s, umt_fast_divisor by_plane) {
    extern __shared__ float4 shared_f32[]; /* [k][F32_STRIDE] weights, then the k biases */
    __shared__ window_table table;
    float *weights = (float *)shared_f32, *biases = weights + s.k * F32_STRIDE;
    for (int i = threadIdx.x; i < s.k * F32_STRIDE; i += blockDim.x) {
        int k = i / F32_STRIDE, t = i % F32_STRIDE, c = t % s.c, rs = t / s.c; /* w is K,C,R,S */
        weights[i] = t < s.terms ? w[(k * s.c + c) * s.r * s.s + rs] : 0.0f;
    }
    for (int i = threadIdx.x; i < s.k; i += blockDim.x) biases[i] = bias ? bias[i] : 0.0f;
    make_window_table(s, &table);
    __syncthreads();
    int plane = s.p * s.q;
    for (int pixel = blockIdx.x * blockDim.x + threadIdx.x; pixel < s.n * plane; pixel += gridDim.x * blockDim.x) {
        float terms[THIN_TERMS];
        window_terms<UMT_F32, PADDED>(x, s, &table, pixel, terms);
        int n = umt_fast_divide(pixel, by_plane), at = pixel - n * plane;
        for (int k = 0; k < s.k; k++) {
            const float4 *filter = shared_f32 + k * (F32_STRIDE / 4);
            float4 a = filter[0], b = filter[1], c = filter[2];
            float sum = 0.0f;
            sum += a.x * terms[0], sum += a.y * terms[1], sum += a.z * terms[2], sum += a.w * terms[3];
            sum += b.x * terms[4], sum += b.y * terms[5], sum += b.z * terms[6], sum += b.w * terms[7];
            sum += c.x * terms[8];
            if (RELU) sum = relu(__fadd_rn(sum, biases[k]));
            y[(n * s.k + k) * plane + at] = sum;
        }
    }
}

/* The weight gradient: dy's channels are planes, so a warp's lanes take neighbouring pixels of a
 * plane (each of a thread's loads is then one coalesced line for the warp) and a thread sums
 * F32_CHANNELS channels, blockIdx.y choosing which; blockIdx.x takes a run of (image, pixel)
 * positions. MASKED: dy masked by y > 0 first (written back when keep_dy), and the bias sums.
 * The warps' sums are added by butterfly shuffles, then warps in order, then blocks in order by
 * add_block_partials_kernel: the same bits on every run. (cuDNN's deterministic f32 weight
 * gradient for one input channel is a generic kernel that took milliseconds at batch 4096.) */
template <bool MASKED, bool PADDED>
static __global__ void __launch_bounds__(THREADS, 3)
    thin_filter_f32_kernel(const float *x, const float *y, float *dy, bool keep_dy, float *partials, thin_shape s,
                           umt_fast_divisor by_plane, int per_block) {
    __shared__ window_table table;
    __shared__ float warp_sums[THREADS / 32][F32_CHANNELS * (THIN_TERMS + 1)]; /* terms, then the bias */
    make_window_table(s, &table);
    __syncthreads();
    int plane = s.p * s.q, first_k = (int)blockIdx.y * F32_CHANNELS;
    int first = (int)blockIdx.x * per_block, last = min(first + per_block, s.n * plane);
    float sums[F32_CHANNELS][THIN_TERMS + 1] = {};
    for (int at = first + (int)threadIdx.x; at < last; at += (int)blockDim.x) {
        int n = umt_fast_divide(at, by_plane), pixel = at - n * plane;
        float terms[THIN_TERMS];
        window_terms<UMT_F32, PADDED>(x, s, &table, at, terms);
        /* Every load first, then the stores: a store to dy between them would keep the compiler
         * from issuing the next channel's load before it (they might alias), one at a time. */
        float g[F32_CHANNELS], out[F32_CHANNELS];
#pragma unroll
        for (int e = 0; e < F32_CHANNELS; e++) {
            int i = (n * s.k + first_k + e) * plane + pixel;
            bool channel = first_k + e < s.k;
            g[e] = channel ? dy[i] : 0.0f;
            if (MASKED) out[e] = channel ? y[i] : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < F32_CHANNELS; e++) {
            if (MASKED && !(out[e] > 0.0f)) {
                if (keep_dy && first_k + e < s.k) dy[(n * s.k + first_k + e) * plane + pixel] = 0.0f;
                g[e] = 0.0f;
            }
            if (MASKED) sums[e][THIN_TERMS] += g[e];
#pragma unroll
            for (int t = 0; t < THIN_TERMS; t++) sums[e][t] += g[e] * terms[t];
        }
    }
    int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, each = THIN_TERMS + (MASKED ? 1 : 0);
#pragma unroll
    for (int e = 0; e < F32_CHANNELS; e++)
#pragma unroll
        for (int t = 0; t < THIN_TERMS + 1; t++) {
            if (t >= each) break;
            float v = sums[e][t];
            for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
            if (lane == 0) warp_sums[warp][e * (THIN_TERMS + 1) + t] = v;
        }
    __syncthreads();
    /* Output o = (channel e, term t or the bias): dw's at its K,C,R,S place, the bias's after. */
    int outputs = s.k * s.terms, row = outputs + s.k;
    for (int o = (int)threadIdx.x; o < F32_CHANNELS * (s.terms + 1); o += (int)blockDim.x) {
        int e = o / (s.terms + 1), t = o % (s.terms + 1), k = first_k + e, c = t % s.c, rs = t / s.c;
        bool is_bias = t == s.terms;
        if (k >= s.k || (is_bias && !MASKED)) continue;
        float total = 0.0f;
        int column = e * (THIN_TERMS + 1) + (is_bias ? THIN_TERMS : t);
        for (int w = 0; w < (int)blockDim.x / 32; w++) total += warp_sums[w][column];
        partials[blockIdx.x * row + (is_bias ? outputs + k : (k * s.c + c) * s.r * s.s + rs)] = total;
    }
}

/* After a weight gradient's first kernel (checked here): dw += its blocks' partials (rows of
 * `row` floats, outputs of them dw's), and dbias += theirs when given (a masked gradient's). */
static umt_status finish_partials(const float *partials, float *dw, float *dbias, int64_t outputs, int64_t row,
                                  int64_t blocks) {
    UMT_CUDA_LAUNCHED();
    int64_t columns = dbias ? row : outputs;
    add_block_partials_kernel<<<umt_chunk_sum_blocks(columns), THREADS, 0, umt_cuda_stream()>>>(
        partials, dw, dbias, (int)outputs, (int)row, (int)columns, (int)blocks);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points (conv.cu has checked the shape, the workspace and umt_cuda_conv_thin_takes)    */

size_t umt_cuda_conv_thin_workspace_bytes(const umt_conv_shape *s) {
    size_t row = (size_t)(s->k * s->c * s->r * s->s + s->k);
    return (size_t)(s->dtype == UMT_F32 ? F32_BLOCKS : FILTER_BLOCKS) * row * sizeof(float);
}

template <umt_dtype D, bool PADDED>
static umt_status forward(const umt_conv_shape *s, const void *x, const void *w, const float *bias, bool relu,
                          void *y) {
    size_t shared = (size_t)(s->k * THIN_TERMS + s->k) * sizeof(float);
    unsigned int blocks = blocks_for((s->n * s->p * s->q + PIXELS - 1) / PIXELS);
    if (relu)
        thin_forward_kernel<D, true, PADDED><<<blocks, THREADS, shared, umt_cuda_stream()>>>(
            (const uint16_t *)x, (const uint16_t *)w, bias, (uint4 *)y, thin(s));
    else
        thin_forward_kernel<D, false, PADDED><<<blocks, THREADS, shared, umt_cuda_stream()>>>(
            (const uint16_t *)x, (const uint16_t *)w, NULL, (uint4 *)y, thin(s));
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* y NULL: the plain weight gradient; else the fused one (mask, keep_dy, dbias). Blocks: one per
 * tile of dy up to FILTER_BLOCKS, each taking a run of whole pixels' vectors. */
template <umt_dtype D, bool PADDED>
static umt_status backward_filter(const umt_conv_shape *s, const void *x, const void *y, void *dy, bool keep_dy,
                                  float *dw, float *dbias, void *workspace) {
    thin_shape t = thin(s);
    int64_t vectors = s->n * s->p * s->q * t.groups, outputs = t.k * t.terms, row = outputs + t.k;
    int64_t blocks = (vectors + TILE_VECTORS - 1) / TILE_VECTORS;
    if (blocks > FILTER_BLOCKS) blocks = FILTER_BLOCKS;
    int64_t per_block = (vectors + blocks - 1) / blocks;
    per_block = (per_block + t.groups - 1) / t.groups * t.groups;
    blocks = (vectors + per_block - 1) / per_block;
    size_t tiles = (size_t)2 * (y ? 2 : 1) * TILE_VECTORS * sizeof(uint4);
    tiles += (size_t)TILE_PIXELS * THIN_TERMS * sizeof(float); /* the window terms beside them */
    size_t sums = (size_t)(THREADS / 32 * row) * sizeof(float);
    size_t shared = tiles > sums ? tiles : sums;
    float *partials = (float *)workspace;
    cudaStream_t stream = umt_cuda_stream();
    if (y)
        thin_filter_kernel<D, true, PADDED><<<(unsigned int)blocks, THREADS, shared, stream>>>(
            (const uint16_t *)x, (const uint4 *)y, (uint4 *)dy, keep_dy, partials, t, (int)per_block);
    else
        thin_filter_kernel<D, false, PADDED><<<(unsigned int)blocks, THREADS, shared, stream>>>(
            (const uint16_t *)x, NULL, (uint4 *)dy, false, partials, t, (int)per_block);
    return finish_partials(partials, dw, y ? dbias : NULL, outputs, row, blocks);
}

umt_status umt_cuda_conv2d_forward_thin(const umt_conv_shape *s, const void *x, const void *w, const float *bias,
                                        bool relu, void *y) {
    if (s->n == 0) return UMT_OK;
    if (s->dtype == UMT_BF16)
        return s->pad ? forward<UMT_BF16, true>(s, x, w, bias, relu, y)
                      : forward<UMT_BF16, false>(s, x, w, bias, relu, y);
    return s->pad ? forward<UMT_F16, true>(s, x, w, bias, relu, y) : forward<UMT_F16, false>(s, x, w, bias, relu, y);
}

umt_status umt_cuda_conv2d_backward_filter_thin(const umt_conv_shape *s, const void *x, const void *y, void *dy,
                                                bool keep_dy, float *dw, float *dbias, void *workspace) {
    if (s->n == 0) return UMT_OK;
    if (s->dtype == UMT_BF16)
        return s->pad ? backward_filter<UMT_BF16, true>(s, x, y, dy, keep_dy, dw, dbias, workspace)
                      : backward_filter<UMT_BF16, false>(s, x, y, dy, keep_dy, dw, dbias, workspace);
    return s->pad ? backward_filter<UMT_F16, true>(s, x, y, dy, keep_dy, dw, dbias, workspace)
                  : backward_filter<UMT_F16, false>(s, x, y, dy, keep_dy, dw, dbias, workspace);
}

umt_status umt_cuda_conv2d_forward_thin_f32(const umt_conv_shape *s, const float *x, const float *w,
                                            const float *bias, bool relu, float *y) {
    if (s->n == 0) return UMT_OK;
    thin_shape t = thin(s);
    size_t shared = (size_t)(t.k * F32_STRIDE + t.k) * sizeof(float);
    unsigned int blocks = blocks_for(s->n * s->p * s->q);
    umt_fast_divisor by_plane = umt_fast_divisor_of(t.p * t.q);
    auto kernel = relu ? (s->pad ? thin_forward_f32_kernel<true, true> : thin_forward_f32_kernel<true, false>)
                       : (s->pad ? thin_forward_f32_kernel<false, true> : thin_forward_f32_kernel<false, false>);
    kernel<<<blocks, THREADS, shared, umt_cuda_stream()>>>(x, w, relu ? bias : NULL, y, t, by_plane);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* Blocks: the channels' runs of F32_CHANNELS (grid y) times runs of positions (grid x), about
 * F32_BLOCKS in all, each thread taking at least four positions. y NULL: the plain gradient. */
umt_status umt_cuda_conv2d_backward_filter_thin_f32(const umt_conv_shape *s, const float *x, const float *y,
                                                    float *dy, bool keep_dy, float *dw, float *dbias,
                                                    void *workspace) {
    if (s->n == 0) return UMT_OK;
    thin_shape t = thin(s);
    int64_t positions = s->n * s->p * s->q, outputs = t.k * t.terms, row = outputs + t.k;
    int64_t channel_runs = (t.k + F32_CHANNELS - 1) / F32_CHANNELS, most = F32_BLOCKS / channel_runs;
    int64_t blocks = (positions + 4 * THREADS - 1) / (4 * THREADS);
    if (blocks > most) blocks = most;
    if (blocks < 1) blocks = 1;
    int64_t per_block = (positions + blocks - 1) / blocks;
    blocks = (positions + per_block - 1) / per_block;
    float *partials = (float *)workspace;
    cudaStream_t stream = umt_cuda_stream();
    dim3 grid((unsigned int)blocks, (unsigned int)channel_runs);
    umt_fast_divisor by_plane = umt_fast_divisor_of(t.p * t.q);
    auto kernel = y ? (s->pad ? thin_filter_f32_kernel<true, true> : thin_filter_f32_kernel<true, false>)
                    : (s->pad ? thin_filter_f32_kernel<false, true> : thin_filter_f32_kernel<false, false>);
    kernel<<<grid, THREADS, 0, stream>>>(x, y, dy, y && keep_dy, partials, t, by_plane, (int)per_block);
    return finish_partials(partials, dw, y ? dbias : NULL, outputs, row, blocks);
}
