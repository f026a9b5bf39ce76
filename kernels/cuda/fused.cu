/*
 * kernels/cuda/fused.cu — bias + ReLU in one pass, and its backward in one read of the gradient;
 * the same backward at a pooled size after a dropout, for bias + ReLU + max pool + dropout (whose
 * forward is pool.cu's, the bias and ReLU applied on the way in); max pool + dropout's backward
 * in one pass (at the end of the file).
 *
 * Unfused, a convolution or linear layer followed by a ReLU costs, after the library's product:
 * a bias pass (read and write the activation), a ReLU pass (read it, write the output), and in
 * backward a zeroed gradient for the pre-ReLU tensor, a ReLU-backward pass (read y, dy and dx,
 * write dx) and a bias-gradient pass (read dx again). Fused: one forward pass (read, write) and
 * one backward pass that reads y and dy, writes the masked gradient over dy and sums it per
 * channel on the way. At batch 4096 these activations are 300 MB each in bf16.
 *
 * Semantics (kernels/backend.h, reference kernels/cpu/fused.c): y = max(x + bias, 0) rounded once
 * to the dtype, bit for bit the unfused kernels' result (rounding is monotone and keeps 0);
 * the masked gradient is exactly theirs; the bias sums are deterministic (a fixed split, then
 * the chunks added in order) but split differently from the unfused sums, so they agree to
 * rounding. The dtype is a template argument: no switch per element.
 */
#include <limits.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/bias_rows.h"
#include "kernels/cuda/chunk_sums.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/dropout8.h"
#include "kernels/cuda/fast_divide.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pool_scatter.h"
#include "kernels/cuda/scratch.h"

/* Chunk partials of the bias sums: [chunk * k + channel]. A context's stream runs its kernels
 * in order, so one buffer per layout of the context's scratch (scratch.h) serves every call; a
 * shape with more channels than a buffer holds takes one chunk (no partials). */
enum { PARTIALS = UMT_FUSED_PARTIALS, TARGET_BLOCKS = 1024, SUM_COLUMNS = 32, SUM_ROW_GROUPS = 16 };
enum { VECTOR = UMT_HALVES_PER_VECTOR }; /* halves in one umt_halves8 (kernels/cuda/float16.h) */

template <umt_dtype D> static __device__ float load(const void *p, int64_t i) { return umt_dev_load_as_f32(p, D, i); }
template <umt_dtype D> static __device__ void store(void *p, int64_t i, float v) { umt_dev_store_from_f32(p, D, i, v); }

/* The gradient that passes where y > 0: dy itself (scale 0: bias_relu_backward), or after a
 * dropout (scale 1/(1-p): bias_relu_max_pool_dropout_backward) 0 + dy * scale rounded to the
 * dtype, as the dropout's backward stores it into a zeroed gradient. */
template <umt_dtype D> static __device__ float passed(float g, float scale) {
    if (scale == 0.0f) return g;
    float v = 0.0f + g * scale;
    if constexpr (D == UMT_F32) return v;
    else return umt_dev_widen<D>(umt_dev_narrow<D>(v));
}

/* ------------------------------------------------------------------------------------------ */
/* Forward: y = max(x + bias, 0)                                                                */

/* Channels last (NHWC, or a linear layer's rows): element i is channel i % k. */
template <umt_dtype D>
static __global__ void bias_relu_rows_kernel(const void *x, const float *bias, void *y, int64_t count, int64_t k) {
    FOR_EACH_INDEX(i, count) store<D>(y, i, umt_dev_relu(load<D>(x, i) + (bias ? bias[i % k] : 0.0f)));
}

/* Eight halves per 16-byte load (k % 8 == 0): lowp.cu's bias rows with the ReLU. */
template <umt_dtype D>
static __global__ void bias_relu_rows_vector_kernel(const uint4 *x, const float *bias, uint4 *y, int64_t vectors,
                                                    int64_t k) {
    umt_dev_bias_rows_vectors<D, true>(x, bias, y, vectors, k);
}

/* NCHW: a block per plane (grid-strided), so the channel is known without a division per pixel. */
template <umt_dtype D>
static __global__ void bias_relu_planes_kernel(const void *x, const float *bias, void *y, int64_t planes, int64_t k,
                                               int64_t hw) {
    for (int64_t plane = blockIdx.x; plane < planes; plane += gridDim.x) {
        float b = bias ? bias[plane % k] : 0.0f;
        for (int64_t i = plane * hw + threadIdx.x; i < (plane + 1) * hw; i += blockDim.x)
            store<D>(y, i, umt_dev_relu(load<D>(x, i) + b));
    }
}

static bool channels_last(bool nhwc, int64_t hw) { return nhwc || hw == 1; }

static bool aligned16(const void *a, const void *b) { return ((uintptr_t)a | (uintptr_t)b) % sizeof(uint4) == 0; }

static umt_status check_args(const char *op, umt_dtype dtype, int64_t n, int64_t k, int64_t hw) {
    if (dtype != UMT_F32 && dtype != UMT_BF16 && dtype != UMT_F16)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: dtype %s (expected f32, bf16 or f16)", op,
                        umt_dtype_name(dtype));
    if (n < 0 || k < 0 || hw < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: n=%lld k=%lld hw=%lld, expected sizes >= 0", op, (long long)n,
                        (long long)k, (long long)hw);
    return UMT_OK;
}

template <umt_dtype D>
static umt_status bias_relu(bool nhwc, const void *x, const float *bias, void *y, int64_t n, int64_t k, int64_t hw) {
    int64_t count = n * k * hw;
    cudaStream_t stream = umt_cuda_stream();
    if (!channels_last(nhwc, hw)) {
        bias_relu_planes_kernel<D><<<blocks_for(n * k * THREADS), THREADS, 0, stream>>>(x, bias, y, n * k, k, hw);
    } else {
        bool vector = false;
        if constexpr (D != UMT_F32) vector = k % VECTOR == 0 && aligned16(x, y);
        if constexpr (D != UMT_F32)
            if (vector)
                bias_relu_rows_vector_kernel<D><<<blocks_for(count / VECTOR), THREADS, 0, stream>>>(
                    (const uint4 *)x, bias, (uint4 *)y, count / VECTOR, k);
        if (!vector) bias_relu_rows_kernel<D><<<blocks_for(count), THREADS, 0, stream>>>(x, bias, y, count, k);
    }
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_bias_relu(umt_dtype dtype, bool nhwc, const void *x, const float *bias, void *y,
                                         int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(check_args("bias_relu", dtype, n, k, hw));
    if (n == 0 || k == 0 || hw == 0) return UMT_OK;
    switch (dtype) {
    case UMT_BF16: return bias_relu<UMT_BF16>(nhwc, x, bias, y, n, k, hw);
    case UMT_F16: return bias_relu<UMT_F16>(nhwc, x, bias, y, n, k, hw);
    default: return bias_relu<UMT_F32>(nhwc, x, bias, y, n, k, hw);
    }
}

/* A linear layer's bias + ReLU, then the dropout that follows it, eight halves a thread
 * (k % 8 == 0): the dropout drawn on the rounded values before they are stored, as pool.cu's
 * pool forward draws the conv2 block's (the same draws of element first + i as dropout_forward
 * over the stored values), so the dropout's pass and its mask are gone. */
template <umt_dtype D>
static __global__ void bias_relu_dropout_rows_vector_kernel(const uint4 *x, const float *bias, uint4 *y,
                                                            int64_t vectors, int64_t k, umt_dropout_draw drop,
                                                            float scale) {
    uint64_t seed = drop.seed_on_device ? *drop.seed_on_device : drop.seed;
    FOR_EACH_INDEX(v, vectors) {
        umt_halves8 out = umt_dev_bias_row_vector<D, true>(x[v], bias, v * VECTOR % k);
        y[v] = umt_dev_dropout8<D>(out, seed, (uint64_t)drop.first + (uint64_t)v * VECTOR, drop.p, scale, NULL).bits;
    }
}

extern "C" umt_status umt_cuda_bias_relu_dropout(umt_dtype dtype, const void *x, const float *bias, void *y,
                                                 int64_t rows, int64_t k, const umt_dropout_draw *drop) {
    const char *op = "bias_relu_dropout";
    UMT_TRY(check_args(op, dtype, rows, k, 1));
    if (drop && (!(drop->p >= 0.0f && drop->p < 1.0f) || drop->first < 0))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g, first = %lld (expected 0 <= p < 1, first >= 0)", op,
                        (double)drop->p, (long long)drop->first);
    if (!drop || drop->p == 0.0f) return umt_cuda_bias_relu(dtype, false, x, bias, y, rows, k, 1);
    int64_t count = rows * k;
    if (count == 0) return UMT_OK;
    if (dtype != UMT_F32 && k % VECTOR == 0 && aligned16(x, y)) {
        auto kernel = dtype == UMT_BF16 ? bias_relu_dropout_rows_vector_kernel<UMT_BF16>
                                        : bias_relu_dropout_rows_vector_kernel<UMT_F16>;
        kernel<<<blocks_for(count / VECTOR), THREADS, 0, umt_cuda_stream()>>>(
            (const uint4 *)x, bias, (uint4 *)y, count / VECTOR, k, *drop, 1.0f / (1.0f - drop->p));
        UMT_CUDA_LAUNCHED();
        return UMT_OK;
    }
    /* Any other shape: the two kernels in turn, the dropout in place without a mask. */
    UMT_TRY(umt_cuda_bias_relu(dtype, false, x, bias, y, rows, k, 1));
    if (dtype == UMT_F32)
        return umt_cuda_dropout_forward((const float *)y, (float *)y, NULL, count, drop->first, drop->p, drop->seed,
                                        drop->seed_on_device);
    return umt_cuda_dropout_forward_lp(dtype, y, y, NULL, count, drop->first, drop->p, drop->seed,
                                       drop->seed_on_device);
}

/* ------------------------------------------------------------------------------------------ */
/* Backward: dy = y > 0 ? dy : 0 in place, and the per-channel sums of the result             */

/* Where a block's channel sum goes: straight into dbias when there is one chunk, else into the
 * chunk's partial, added by add_partials_kernel (kernels/cuda/chunk_sums.h). */
template <typename T> static __device__ void put_sum(float *dbias, T *partials, int64_t chunk, int64_t k, int64_t c,
                                                    T sum, bool chunked) {
    if (chunked)
        partials[chunk * k + c] = sum;
    else
        dbias[c] = (float)((T)dbias[c] + sum);
}

/* Channels last, any dtype and k: block (column tile, chunk) is 32 channels by 16 row groups
 * over its chunk's rows; the 16 groups' sums are added in group order. */
template <umt_dtype D>
static __global__ void mask_rows_kernel(const void *y, void *dy, float *dbias, float *row_partials, int64_t rows,
                                        int64_t k, int64_t rows_per_chunk, bool chunked, float scale) {
    __shared__ float partial[SUM_ROW_GROUPS][SUM_COLUMNS];
    int64_t c = (int64_t)blockIdx.x * SUM_COLUMNS + threadIdx.x, chunk = blockIdx.y;
    int64_t first = chunk * rows_per_chunk, last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum = 0.0f;
    if (c < k)
        for (int64_t r = first + threadIdx.y; r < last; r += SUM_ROW_GROUPS) {
            float g = load<D>(y, r * k + c) > 0.0f ? passed<D>(load<D>(dy, r * k + c), scale) : 0.0f;
            store<D>(dy, r * k + c, g);
            sum += g;
        }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || c >= k || !dbias) return;
    float total = 0.0f;
    for (int group = 0; group < SUM_ROW_GROUPS; group++) total += partial[group][threadIdx.x];
    put_sum<float>(dbias, row_partials, chunk, k, c, total, chunked);
}

/* One vector of the masked gradient (eight channels of a row, y's and dy's), added to sum. */
template <umt_dtype D>
static __device__ __forceinline__ umt_halves8 masked_vector(uint4 y, uint4 dy, float scale, float sum[VECTOR]) {
    umt_halves8 out, grad;
    out.bits = y;
    grad.bits = dy;
#pragma unroll
    for (int e = 0; e < VECTOR; e++) {
        if (!(load<D>(out.h, e) > 0.0f))
            grad.h[e] = 0;
        else if (scale != 0.0f)
            grad.h[e] = umt_dev_narrow<D>(passed<D>(load<D>(grad.h, e), scale));
        sum[e] += load<D>(grad.h, e);
    }
    return grad;
}

/* The block's channel sums: for each channel, its threads' sums added in thread order. A thread
 * per channel adds them (a lane's eight channels in eight threads: one thread a lane, adding its
 * eight channels' 8 x THREADS / lanes sums in turn, was the kernel's tail at small batches). */
static __device__ void put_vector_sums(const float sum[VECTOR], int lanes, float *dbias, float *row_partials,
                                       int64_t chunk, int64_t k, bool chunked) {
    __shared__ float sums[THREADS][VECTOR];
    for (int e = 0; e < VECTOR; e++) sums[threadIdx.x][e] = sum[e];
    __syncthreads();
    if (!dbias) return;
    for (int i = (int)threadIdx.x; i < lanes * VECTOR; i += THREADS) {
        int lane = i % lanes, e = i / lanes;
        float total = 0.0f;
        for (int t = lane; t < THREADS; t += lanes) total += sums[t][e];
        put_sum<float>(dbias, row_partials, chunk, k, (int64_t)lane * VECTOR + e, total, chunked);
    }
}

/* Channels last, bf16/f16 with k % 8 == 0 and k / 8 dividing THREADS: lanes = k / 8 threads
 * cover a row with 16-byte loads, THREADS / lanes rows at a time; thread t always holds the
 * eight channels of lane t % lanes, and the block adds its lanes' sums in thread order. */
template <umt_dtype D>
static __global__ void mask_rows_vector_kernel(const uint4 *y, uint4 *dy, float *dbias, float *row_partials,
                                               int64_t rows, int64_t k, int64_t rows_per_chunk, bool chunked,
                                               float scale) {
    int lanes = (int)(k / VECTOR), lane = threadIdx.x % lanes, rows_at_once = THREADS / lanes;
    int64_t chunk = blockIdx.x, first = chunk * rows_per_chunk;
    int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum[VECTOR] = {0};
    for (int64_t r = first + threadIdx.x / lanes; r < last; r += rows_at_once)
        dy[r * lanes + lane] = masked_vector<D>(y[r * lanes + lane], dy[r * lanes + lane], scale, sum).bits;
    put_vector_sums(sum, lanes, dbias, row_partials, chunk, k, chunked);
}

/* The same rows, chunks and sums for bias + ReLU + max pool + dropout's backward, with each
 * masked vector written onto its window of a fresh dx (the gradient at the picks, 0 elsewhere:
 * pool.cu's pick write) instead of back into dy, to be read again by a second kernel: rows are
 * the pooled pixels, whose windows tile the input (stride = window, no tail). */
template <umt_dtype D>
static __global__ void mask_pick_write_kernel(umt_pool_shape s, const uint4 *y, const uint4 *dy, const uint64_t *pick,
                                              uint4 *dx, float *dbias, float *row_partials, int rows_per_chunk,
                                              bool chunked, float scale) {
    int lanes = (int)(s.c / VECTOR), lane = threadIdx.x % lanes, rows_at_once = THREADS / lanes;
    int rows = (int)(s.n * s.p * s.q), chunk = blockIdx.x, first = chunk * rows_per_chunk;
    int last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum[VECTOR] = {0};
    for (int r = first + (int)threadIdx.x / lanes; r < last; r += rows_at_once) {
        int v = r * lanes + lane;
        umt_dev_pick_write8<D>(s, r, lane, pick[v], masked_vector<D>(y[v], dy[v], scale, sum), dx);
    }
    put_vector_sums(sum, lanes, dbias, row_partials, chunk, s.c, chunked);
}

/* NCHW: block (channel, chunk) walks its chunk's planes of the channel and sums in double, as
 * kernels/cuda/conv.cu's sum_channel_bias does. Its threads take the chunk's (image, pixel) pairs
 * in turn, so that planes smaller than the block (a pooled 12x12 has 144) keep every thread busy;
 * a pair's image by a multiply-shift division (kernels/cuda/fast_divide.h; by_hw divides by hw,
 * and images_per_chunk * hw < 2^31, mask_planes checks). */
template <umt_dtype D>
static __global__ void mask_planes_kernel(const void *y, void *dy, float *dbias, double *plane_partials, int64_t n,
                                          int64_t k, int64_t hw, umt_fast_divisor by_hw, int64_t images_per_chunk,
                                          bool chunked, float scale) {
    __shared__ double partial[THREADS];
    int64_t channel = blockIdx.x, chunk = blockIdx.y, first = chunk * images_per_chunk;
    int64_t last = first + images_per_chunk < n ? first + images_per_chunk : n;
    int pairs = (int)((last - first) * hw);
    double sum = 0.0;
    for (int pair = (int)threadIdx.x; pair < pairs; pair += THREADS) {
        int image = umt_fast_divide(pair, by_hw), pixel = pair - image * (int)hw;
        int64_t i = ((first + image) * k + channel) * hw + pixel;
        float g = load<D>(y, i) > 0.0f ? passed<D>(load<D>(dy, i), scale) : 0.0f;
        store<D>(dy, i, g);
        sum += g;
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0 && dbias) put_sum<double>(dbias, plane_partials, chunk, k, channel, partial[0], chunked);
}

/* The partials of T's sums: float for rows, double for planes. */
template <typename T>
static __global__ void add_partials_kernel(const T *partials, float *dbias, int64_t k, int chunks) {
    umt_dev_add_chunk_partials(partials, dbias, k, chunks);
}

/* How many chunks (at least 1) cut `items` so that `tiles` blocks per chunk give the GPU about
 * TARGET_BLOCKS blocks, as the partials allow; *per_chunk items each. */
static int64_t chunks_for(int64_t items, int64_t tiles, int64_t k, int64_t *per_chunk) {
    int64_t chunks = (TARGET_BLOCKS + tiles - 1) / tiles;
    if (chunks > items) chunks = items;
    if (chunks * k > PARTIALS) chunks = PARTIALS / k;
    if (chunks < 1) chunks = 1;
    *per_chunk = (items + chunks - 1) / chunks;
    return (items + *per_chunk - 1) / *per_chunk;
}

/* After a first stage's launch (checked here): with several chunks, the second stage adds the
 * chunks' partials of T into dbias; one chunk wrote dbias itself. */
template <typename T> static umt_status finish_sums(const T *partials, float *dbias, int64_t k, int64_t chunks) {
    UMT_CUDA_LAUNCHED();
    if (chunks > 1 && dbias) {
        add_partials_kernel<T><<<umt_chunk_sum_blocks(k), THREADS, 0, umt_cuda_stream()>>>(partials, dbias, k,
                                                                                           (int)chunks);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

template <umt_dtype D>
static umt_status mask_rows(const void *y, void *dy, float *dbias, int64_t rows, int64_t k, float scale) {
    const umt_cuda_scratch *scratch;
    UMT_TRY(umt_cuda_scratch_get("bias_relu_backward", &scratch));
    float *partials = scratch->fused_row_partials;
    cudaStream_t stream = umt_cuda_stream();
    int64_t per_chunk = 0, chunks = 0;
    bool vector = false;
    if constexpr (D != UMT_F32) {
        vector = k % VECTOR == 0 && THREADS % (k / VECTOR) == 0 && aligned16(y, dy);
        if (vector) {
            chunks = chunks_for(rows, 1, k, &per_chunk);
            mask_rows_vector_kernel<D><<<(unsigned int)chunks, THREADS, 0, stream>>>(
                (const uint4 *)y, (uint4 *)dy, dbias, partials, rows, k, per_chunk, chunks > 1, scale);
        }
    }
    if (!vector) {
        int64_t tiles = (k + SUM_COLUMNS - 1) / SUM_COLUMNS;
        if (tiles > MAX_BLOCKS)
            return umt_fail(UMT_ERR_UNSUPPORTED, "bias_relu_backward: %lld channels (at most %lld)", (long long)k,
                            (long long)MAX_BLOCKS * SUM_COLUMNS);
        chunks = chunks_for(rows, tiles, k, &per_chunk);
        mask_rows_kernel<D><<<dim3((unsigned int)tiles, (unsigned int)chunks), dim3(SUM_COLUMNS, SUM_ROW_GROUPS), 0,
                              stream>>>(y, dy, dbias, partials, rows, k, per_chunk, chunks > 1, scale);
    }
    return finish_sums<float>(partials, dbias, k, chunks);
}

template <umt_dtype D>
static umt_status mask_planes(const void *y, void *dy, float *dbias, int64_t n, int64_t k, int64_t hw, float scale) {
    if (k > MAX_BLOCKS)
        return umt_fail(UMT_ERR_UNSUPPORTED, "bias_relu_backward: %lld channels (at most %d)", (long long)k, MAX_BLOCKS);
    const umt_cuda_scratch *scratch;
    UMT_TRY(umt_cuda_scratch_get("bias_relu_backward", &scratch));
    double *partials = scratch->fused_plane_partials;
    cudaStream_t stream = umt_cuda_stream();
    int64_t per_chunk = 0, chunks = chunks_for(n, k, k, &per_chunk);
    if (per_chunk * hw >= INT32_MAX)
        return umt_fail(UMT_ERR_UNSUPPORTED, "bias_relu_backward: %lld images of %lld pixels a block (at most 2^31 - 1)",
                        (long long)per_chunk, (long long)hw);
    mask_planes_kernel<D><<<dim3((unsigned int)k, (unsigned int)chunks), THREADS, 0, stream>>>(
        y, dy, dbias, partials, n, k, hw, umt_fast_divisor_of((int)hw), per_chunk, chunks > 1, scale);
    return finish_sums<double>(partials, dbias, k, chunks);
}

/* scale 0: bias_relu_backward; else the gradient after a dropout (passed() above). */
template <umt_dtype D>
static umt_status bias_relu_backward(bool nhwc, const void *y, void *dy, float *dbias, int64_t n, int64_t k,
                                     int64_t hw, float scale) {
    return channels_last(nhwc, hw) ? mask_rows<D>(y, dy, dbias, n * hw, k, scale)
                                   : mask_planes<D>(y, dy, dbias, n, k, hw, scale);
}

extern "C" umt_status umt_cuda_bias_relu_backward(umt_dtype dtype, bool nhwc, const void *y, void *dy, float *dbias,
                                                  int64_t n, int64_t k, int64_t hw) {
    UMT_TRY(check_args("bias_relu_backward", dtype, n, k, hw));
    if (n == 0 || k == 0 || hw == 0) return UMT_OK;
    switch (dtype) {
    case UMT_BF16: return bias_relu_backward<UMT_BF16>(nhwc, y, dy, dbias, n, k, hw, 0.0f);
    case UMT_F16: return bias_relu_backward<UMT_F16>(nhwc, y, dy, dbias, n, k, hw, 0.0f);
    default: return bias_relu_backward<UMT_F32>(nhwc, y, dy, dbias, n, k, hw, 0.0f);
    }
}

extern "C" umt_status umt_cuda_bias_relu_dropout_backward(umt_dtype dtype, const void *y, void *dy, float *dbias,
                                                          int64_t rows, int64_t k, float p) {
    const char *op = "bias_relu_dropout_backward";
    UMT_TRY(check_args(op, dtype, rows, k, 1));
    if (!(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g (expected 0 <= p < 1)", op, (double)p);
    if (rows == 0 || k == 0) return UMT_OK;
    /* p = 0: no dropout, the plain ReLU backward (scale 0); else as the dropout kernels scale. */
    float scale = p == 0.0f ? 0.0f : 1.0f / (1.0f - p);
    switch (dtype) {
    case UMT_BF16: return bias_relu_backward<UMT_BF16>(false, y, dy, dbias, rows, k, 1, scale);
    case UMT_F16: return bias_relu_backward<UMT_F16>(false, y, dy, dbias, rows, k, 1, scale);
    default: return bias_relu_backward<UMT_F32>(false, y, dy, dbias, rows, k, 1, scale);
    }
}

/* mask_pick_write_kernel's shapes: a fresh dx of bf16/f16 NHWC in eights whose windows tile it,
 * k / 8 dividing THREADS, every pointer aligned for its vectors, 32-bit indices. */
static bool mask_pick_write_applies(const umt_pool_shape *s, const void *y, const void *dy, const void *dx,
                                    const uint8_t *pick, bool dx_fresh) {
    bool lanes = s->c % VECTOR == 0 && THREADS % (s->c / VECTOR) == 0;
    bool aligned = aligned16(y, dy) && aligned16(dx, dx) && (uintptr_t)pick % sizeof(uint64_t) == 0;
    return dx && dx_fresh && s->dtype != UMT_F32 && s->nhwc && umt_pool_windows_tile(s) && lanes && aligned &&
           s->n * s->c * s->h * s->w < INT32_MAX;
}

template <umt_dtype D>
static umt_status mask_pick_write(const umt_pool_shape *s, const uint8_t *pick, const void *y, const void *dy,
                                  void *dx, float *dbias, float scale) {
    const umt_cuda_scratch *scratch;
    UMT_TRY(umt_cuda_scratch_get("bias_relu_max_pool_dropout_backward", &scratch));
    float *partials = scratch->fused_row_partials;
    int64_t per_chunk = 0, chunks = chunks_for(s->n * s->p * s->q, 1, s->c, &per_chunk);
    mask_pick_write_kernel<D><<<(unsigned int)chunks, THREADS, 0, umt_cuda_stream()>>>(
        *s, (const uint4 *)y, (const uint4 *)dy, (const uint64_t *)pick, (uint4 *)dx, dbias, partials, (int)per_chunk,
        chunks > 1, scale);
    return finish_sums<float>(partials, dbias, s->c, chunks);
}

/* Bias + ReLU + max pool + dropout, backward (kernels/backend.h): the masked, scaled gradient and
 * its channel sums at the pooled size (the mask is y > 0), then the pool's scatter onto the
 * picks (windows apart: one addition each); in one pass where mask_pick_write applies. */
extern "C" umt_status umt_cuda_bias_relu_max_pool_dropout_backward(const umt_pool_shape *s, const uint8_t *pick,
                                                                   const void *y, void *dy, void *dx, bool dx_fresh,
                                                                   float *dbias, float p) {
    UMT_TRY(check_args("bias_relu_max_pool_dropout_backward", s->dtype, s->n, s->c, s->p * s->q));
    if (s->stride < s->window || (s->dtype == UMT_F32 && s->nhwc) || !(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "bias_relu_max_pool_dropout_backward: dtype %s, %s, window %lld, stride %lld, p %g (expected "
                        "f32 NCHW or bf16/f16, stride >= window, 0 <= p < 1)", umt_dtype_name(s->dtype),
                        s->nhwc ? "NHWC" : "NCHW", (long long)s->window, (long long)s->stride, (double)p);
    float scale = 1.0f / (1.0f - p); /* as the dropout kernels compute it */
    int64_t n = s->n, k = s->c, pixels = s->p * s->q;
    if (n == 0 || k == 0 || pixels == 0) return UMT_OK;
    if (dx) UMT_TRY(umt_cpu_check_pool_shape("bias_relu_max_pool_dropout_backward", s));
    if (mask_pick_write_applies(s, y, dy, dx, pick, dx_fresh))
        return s->dtype == UMT_BF16 ? mask_pick_write<UMT_BF16>(s, pick, y, dy, dx, dbias, scale)
                                    : mask_pick_write<UMT_F16>(s, pick, y, dy, dx, dbias, scale);
    switch (s->dtype) {
    case UMT_BF16: UMT_TRY(bias_relu_backward<UMT_BF16>(s->nhwc, y, dy, dbias, n, k, pixels, scale)); break;
    case UMT_F16: UMT_TRY(bias_relu_backward<UMT_F16>(s->nhwc, y, dy, dbias, n, k, pixels, scale)); break;
    default: UMT_TRY(bias_relu_backward<UMT_F32>(s->nhwc, y, dy, dbias, n, k, pixels, scale)); break;
    }
    return dx ? umt_cuda_pick_scatter(s, pick, dy, dx, dx_fresh) : UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Max pool + dropout, backward: one thread per output puts its kept, scaled gradient on its    */
/* window's pick. Windows apart (stride >= window), so no two outputs share a pick: a plain     */
/* read-add-write, the unfused pool scatter's single addition. 32-bit coordinates.              */

template <umt_dtype D>
static __global__ void max_pool_dropout_backward_kernel(umt_pool_shape s, const int32_t *argmax, const uint8_t *mask,
                                                        const void *dy, void *dx, float scale) {
    int total = (int)(s.n * s.c * s.p * s.q), c = (int)s.c, p = (int)s.p, q = (int)s.q, h = (int)s.h, w = (int)s.w;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        if (!mask[out]) continue;
        int image, channel, oy, ox;
        umt_dev_pool_coordinates32(s.nhwc, out, c, p, q, &image, &channel, &oy, &ox);
        int pick = argmax[out];
        int at = umt_dev_pool_offset32(s.nhwc, image, channel, pick / w, pick % w, c, h, w);
        /* Rounded to the dtype first: the value the unfused dropout backward would have stored. */
        float grad = load<D>(dy, out) * scale;
        if constexpr (D != UMT_F32) grad = D == UMT_BF16 ? umt_dev_bf16_to_f32(umt_dev_f32_to_bf16(grad))
                                                         : umt_dev_f16_to_f32(umt_dev_f32_to_f16(grad));
        umt_dev_scatter_add<D>(dx, at, grad);
    }
}

extern "C" umt_status umt_cuda_max_pool_dropout_backward(const umt_pool_shape *s, const int32_t *argmax,
                                                         const uint8_t *mask, const void *dy, void *dx, float p) {
    UMT_TRY(check_args("max_pool_dropout_backward", s->dtype, s->n, s->c, s->h * s->w));
    if (s->stride < s->window || s->n * s->c * s->h * s->w >= INT32_MAX || !(p >= 0.0f && p < 1.0f))
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "max_pool_dropout_backward: window %lld, stride %lld, %lld elements, p %g (expected stride >= "
                        "window, fewer than 2^31 elements, 0 <= p < 1)", (long long)s->window, (long long)s->stride,
                        (long long)(s->n * s->c * s->h * s->w), (double)p);
    int64_t count = s->n * s->c * s->p * s->q;
    if (count == 0) return UMT_OK;
    float scale = 1.0f / (1.0f - p); /* as the dropout kernels compute it */
    cudaStream_t stream = umt_cuda_stream();
    switch (s->dtype) {
    case UMT_BF16:
        max_pool_dropout_backward_kernel<UMT_BF16><<<blocks_for(count), THREADS, 0, stream>>>(*s, argmax, mask, dy, dx, scale);
        break;
    case UMT_F16:
        max_pool_dropout_backward_kernel<UMT_F16><<<blocks_for(count), THREADS, 0, stream>>>(*s, argmax, mask, dy, dx, scale);
        break;
    default:
        max_pool_dropout_backward_kernel<UMT_F32><<<blocks_for(count), THREADS, 0, stream>>>(*s, argmax, mask, dy, dx, scale);
        break;
    }
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}
