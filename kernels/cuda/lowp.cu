/*
 * kernels/cuda/lowp.cu — the elementwise kernels of mixed precision (core/precision.h): casts
 * and layout changes, bias rows and channels, ReLU and dropout on bf16/f16 activations.
 *
 * Every value is widened to f32 (exact), computed on in f32, and rounded to nearest even once,
 * at the store (kernels/cuda/float16.h). Biases and bias gradients are f32 masters and f32
 * gradients. The dtype switches inside the loads and stores are uniform across the grid, so
 * they cost no divergence. Semantics match the f32 slots of kernels/backend.h; the GPU tests check
 * them against the CPU's f32 kernels on the same (rounded) inputs.
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/bias_rows.h"
#include "kernels/cuda/chunk_sums.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/dropout8.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/scratch.h"

/* sum_rows_lp's block: 32 columns by 16 row groups, as sum_rows in elementwise.cu; and its grid's
 * second dimension: up to ROW_CHUNKS blocks share a column tile when there are many rows. */
enum {
    SUM_COLUMNS = 32,
    SUM_ROW_GROUPS = 16,
    ROW_CHUNKS = UMT_LOWP_ROW_CHUNKS,
    MAX_CHUNKED_COLUMNS = UMT_LOWP_MAX_CHUNKED_COLUMNS
};

/* The chunks' partial sums. A bias gradient under NHWC is a sum over n*h*w rows (millions) of
 * few columns (the channels): one block per column tile would leave the GPU idle, so the rows
 * are cut into chunks summed by separate blocks, and a second kernel adds the chunks' partials
 * in a fixed order (kernels/cuda/chunk_sums.h) — deterministic, without atomics. A context's
 * stream runs its kernels in order, so one buffer of the context's scratch (scratch.h, 512 KiB)
 * serves every call. */

#define LAUNCH_OVER(n, kernel, ...)                                                                                \
    do {                                                                                                           \
        if ((n) > 0) {                                                                                             \
            kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(__VA_ARGS__);                                 \
            UMT_CUDA_LAUNCHED();                                                                                   \
        }                                                                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Eight halves at a time: the ReLU and bias kernels of a training step move tens of MB each.  */
/* With the dtype a template argument there is no switch per element, and a 16-byte load or    */
/* store carries eight values instead of two bytes. Used when n is a multiple of 8 and every   */
/* pointer 16-byte aligned (the pools align to 256); the scalar kernels take the rest.          */

enum { VECTOR = UMT_HALVES_PER_VECTOR }; /* kernels/cuda/float16.h: umt_halves8, widen, narrow */

static bool vectorizable(int64_t n, const void *a, const void *b, const void *c) {
    return n % VECTOR == 0 && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % sizeof(uint4) == 0;
}

#define LAUNCH_VECTORS(n, kernel, ...)                                                                             \
    do {                                                                                                           \
        if ((n) > 0) {                                                                                             \
            kernel<<<blocks_for((n) / VECTOR), THREADS, 0, umt_cuda_stream()>>>(__VA_ARGS__);                      \
            UMT_CUDA_LAUNCHED();                                                                                   \
        }                                                                                                          \
    } while (0)

/* Launches kernel<UMT_BF16> or kernel<UMT_F16> over n / VECTOR vectors. */
#define LAUNCH_VECTORS_OF(dtype, n, kernel, ...)                                                                   \
    do {                                                                                                           \
        if ((dtype) == UMT_BF16)                                                                                   \
            LAUNCH_VECTORS(n, kernel<UMT_BF16>, __VA_ARGS__);                                                      \
        else                                                                                                       \
            LAUNCH_VECTORS(n, kernel<UMT_F16>, __VA_ARGS__);                                                       \
    } while (0)

template <umt_dtype D> static __global__ void relu_lp_vector_kernel(const uint4 *x, uint4 *y, int64_t vectors) {
    FOR_EACH_INDEX(v, vectors) {
        umt_halves8 in, out;
        in.bits = x[v];
        for (int e = 0; e < VECTOR; e++) {
            float f = umt_dev_widen<D>(in.h[e]);
            out.h[e] = umt_dev_narrow<D>(f < 0.0f ? 0.0f : f); /* the scalar kernel's rounding, NaNs included */
        }
        y[v] = out.bits;
    }
}

template <umt_dtype D>
static __global__ void relu_backward_lp_vector_kernel(const uint4 *y, const uint4 *dy, uint4 *dx, int64_t vectors) {
    FOR_EACH_INDEX(v, vectors) {
        umt_halves8 yv, dyv, dxv;
        yv.bits = y[v];
        dyv.bits = dy[v];
        dxv.bits = dx[v];
        for (int e = 0; e < VECTOR; e++)
            if (umt_dev_widen<D>(yv.h[e]) > 0.0f)
                dxv.h[e] = umt_dev_narrow<D>(umt_dev_widen<D>(dxv.h[e]) + umt_dev_widen<D>(dyv.h[e]));
        dx[v] = dxv.bits;
    }
}

/* cols is a multiple of VECTOR here, so a vector's eight values share one row. */
template <umt_dtype D>
static __global__ void add_rows_lp_vector_kernel(const uint4 *x, const float *bias, uint4 *out, int64_t vectors,
                                                 int64_t cols) {
    umt_dev_bias_rows_vectors<D, false>(x, bias, out, vectors, cols);
}

static bool is_half(umt_dtype dtype) { return dtype == UMT_BF16 || dtype == UMT_F16; }
static bool is_float(umt_dtype dtype) { return dtype == UMT_F32 || is_half(dtype); }

extern "C" umt_status umt_cuda_check_half(const char *op, umt_dtype dtype) {
    if (is_half(dtype)) return UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: dtype %s (expected bf16 or f16)", op, umt_dtype_name(dtype));
}

extern "C" umt_status umt_cuda_zero(void *x, size_t bytes) {
    if (bytes == 0) return UMT_OK;
    UMT_CUDA_TRY(cudaMemsetAsync(x, 0, bytes, umt_cuda_stream()));
    return UMT_OK;
}

/* Up to ZERO_LIST blocks per launch, passed by value in the kernel's parameters (no copy to the
 * device first; a captured step graph keeps them as it keeps any kernel's arguments). */
enum { ZERO_LIST = 32 };
typedef struct {
    uint32_t *words[ZERO_LIST];
    int64_t count[ZERO_LIST];
    int blocks;
} zero_list;

/* Four words to a store where a block starts on 16 bytes (a pool's blocks do), the last
 * count % 4 words one by one; a block elsewhere word by word. A quarter of the threads and
 * stores that one word each took: the zero fill is on every step's path. */
static __global__ void zero_many_kernel(zero_list list) {
    for (int b = 0; b < list.blocks; b++) {
        uint32_t *words = list.words[b];
        int64_t count = list.count[b], whole = ((uintptr_t)words % sizeof(uint4)) ? 0 : count / 4;
        FOR_EACH_INDEX(i, whole)((uint4 *)words)[i] = make_uint4(0, 0, 0, 0);
        FOR_EACH_INDEX(i, count - whole * 4) words[whole * 4 + i] = 0;
    }
}

extern "C" umt_status umt_cuda_zero_many(int count, void *const *blocks, const size_t *bytes) {
    UMT_TRY(umt_cpu_check_zero_many(count, bytes));
    for (int first = 0; first < count; first += ZERO_LIST) {
        zero_list list = {};
        int64_t most = 0;
        for (int i = first; i < count && i < first + ZERO_LIST; i++) {
            list.words[list.blocks] = (uint32_t *)blocks[i];
            list.count[list.blocks] = (int64_t)(bytes[i] / sizeof(uint32_t));
            if (list.count[list.blocks] > most) most = list.count[list.blocks];
            list.blocks++;
        }
        if (most == 0) continue;
        zero_many_kernel<<<blocks_for((most + 3) / 4), THREADS, 0, umt_cuda_stream()>>>(list);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* recast: one thread per destination element, in the destination's storage order            */

static __global__ void recast_kernel(const void *src, umt_dtype src_dtype, bool src_nhwc, void *dst,
                                     umt_dtype dst_dtype, bool dst_nhwc, int64_t n, int64_t c, int64_t hw,
                                     bool accumulate) {
    FOR_EACH_INDEX(j, n * c * hw) {
        int64_t image, channel, pixel;
        if (dst_nhwc) {
            channel = j % c, pixel = j / c % hw, image = j / (c * hw);
        } else {
            pixel = j % hw, channel = j / hw % c, image = j / (hw * c);
        }
        int64_t i = src_nhwc ? (image * hw + pixel) * c + channel : (image * c + channel) * hw + pixel;
        float v = umt_dev_load_as_f32(src, src_dtype, i);
        if (accumulate) v += umt_dev_load_as_f32(dst, dst_dtype, j);
        umt_dev_store_from_f32(dst, dst_dtype, j, v);
    }
}

/* The recasts of a bf16 training step are layout changes of whole activations (flatten of an
 * NHWC tensor, and its backward) and plain casts: with both dtypes template arguments, a cast
 * is a straight loop, and a layout change is a transpose of each image's [hw, c] (or [c, hw])
 * matrix through a shared-memory tile, so that reads and writes are both coalesced. Same
 * values and roundings as recast_kernel: one widening, the optional add, one rounding. */
enum { TILE = 32, TILE_ROWS = 8, MAX_GRID_Z = 65535 };

template <umt_dtype S, umt_dtype D>
static __global__ void cast_kernel(const void *src, void *dst, int64_t count, bool accumulate) {
    FOR_EACH_INDEX(i, count) {
        float v = umt_dev_load_as_f32(src, S, i);
        if (accumulate) v += umt_dev_load_as_f32(dst, D, i);
        umt_dev_store_from_f32(dst, D, i, v);
    }
}

/* Image z's src matrix [rows, cols] -> dst [cols, rows]; block (x, y) moves one 32x32 tile. */
template <umt_dtype S, umt_dtype D>
static __global__ void transpose_kernel(const void *src, void *dst, int64_t images, int64_t rows, int64_t cols,
                                        bool accumulate) {
    __shared__ float tile[TILE][TILE + 1]; /* +1: no bank conflicts on the transposed read */
    int64_t col0 = (int64_t)blockIdx.x * TILE, row0 = (int64_t)blockIdx.y * TILE;
    for (int64_t image = blockIdx.z; image < images; image += gridDim.z) {
        int64_t base = image * rows * cols;
        for (int r = threadIdx.y; r < TILE; r += TILE_ROWS) {
            int64_t row = row0 + r, col = col0 + threadIdx.x;
            if (row < rows && col < cols) tile[r][threadIdx.x] = umt_dev_load_as_f32(src, S, base + row * cols + col);
        }
        __syncthreads();
        for (int c = threadIdx.y; c < TILE; c += TILE_ROWS) {
            int64_t col = col0 + c, row = row0 + threadIdx.x;
            if (row < rows && col < cols) {
                int64_t at = base + col * rows + row;
                float v = tile[threadIdx.x][c];
                if (accumulate) v += umt_dev_load_as_f32(dst, D, at);
                umt_dev_store_from_f32(dst, D, at, v);
            }
        }
        __syncthreads();
    }
}

/* Image z's src matrix [rows, cols] -> dst [cols, rows] where a matrix is smaller than a tile
 * (a convolution weight's gradient, K images of [R*S, C]: conv2's 64 x [9, 32] in the MNIST
 * CNN): a thread per dst element, its src element read directly. transpose_kernel's 32x32 tiles
 * would hold 9 of 32 rows there, and its two waits (the tile's loads, then dst's) cost twice a
 * load's latency where both loads here are in flight at once. The same value and roundings. */
template <umt_dtype S, umt_dtype D>
static __global__ void transpose_small_kernel(const void *src, void *dst, int64_t count, int64_t rows, int64_t cols,
                                              bool accumulate) {
    FOR_EACH_INDEX(at, count) {
        int64_t matrix = rows * cols, base = at / matrix * matrix, within = at - base;
        int64_t col = within / rows, row = within - col * rows;
        float v = umt_dev_load_as_f32(src, S, base + row * cols + col);
        if (accumulate) v += umt_dev_load_as_f32(dst, D, at);
        umt_dev_store_from_f32(dst, D, at, v);
    }
}

/* Half to half, the common case of a bf16 step (the flatten of an NHWC activation, 75 MB at
 * batch 4096, and its backward), with rows and cols multiples of 8 and 16-byte aligned ends:
 * 64x64 tiles moved as 16-byte vectors both ways. The tile is kept as pairs of halves, 33 words
 * a row, so that the column reads of eight rows at once meet at most two to a bank. */
enum { VTILE = 64, VTILE_WORDS = VTILE / 2 + 1 };

template <umt_dtype S, umt_dtype D>
static __global__ void transpose_vector_kernel(const uint4 *src, uint4 *dst, int64_t images, int64_t rows,
                                               int64_t cols, bool accumulate) {
    __shared__ uint32_t tile[VTILE][VTILE_WORDS];
    int64_t col0 = (int64_t)blockIdx.x * VTILE, row0 = (int64_t)blockIdx.y * VTILE;
    for (int64_t image = blockIdx.z; image < images; image += gridDim.z) {
        int64_t base = image * rows * cols; /* a multiple of 64 elements: whole vectors */
        for (int v = threadIdx.x; v < VTILE * VTILE / VECTOR; v += blockDim.x) {
            int r = v / (VTILE / VECTOR), part = v % (VTILE / VECTOR);
            int64_t row = row0 + r, col = col0 + part * VECTOR;
            if (row >= rows || col >= cols) continue;
            uint4 bits = src[(base + row * cols + col) / VECTOR];
            uint32_t *words = &tile[r][part * VECTOR / 2];
            words[0] = bits.x, words[1] = bits.y, words[2] = bits.z, words[3] = bits.w;
        }
        __syncthreads();
        /* dst row = src column c of the tile; each vector is 8 consecutive src rows of it */
        for (int v = threadIdx.x; v < VTILE * VTILE / VECTOR; v += blockDim.x) {
            int part = v % (VTILE / VECTOR), c = v / (VTILE / VECTOR);
            int64_t col = col0 + c, row = row0 + part * VECTOR;
            if (row >= rows || col >= cols) continue;
            int64_t at = (base + col * rows + row) / VECTOR;
            umt_halves8 out, old;
            if (accumulate) old.bits = dst[at];
            for (int e = 0; e < VECTOR; e++) {
                uint32_t pair = tile[part * VECTOR + e][c / 2];
                float value = umt_dev_widen<S>((uint16_t)(c % 2 ? pair >> 16 : pair & 0xffffu));
                out.h[e] = umt_dev_narrow<D>(accumulate ? value + umt_dev_widen<D>(old.h[e]) : value);
            }
            dst[at] = out.bits;
        }
        __syncthreads();
    }
}

/* Half to half, eight at a time (the flatten's backward accumulates 75 MB this way). */
template <umt_dtype S, umt_dtype D>
static __global__ void cast_vector_kernel(const uint4 *src, uint4 *dst, int64_t vectors, bool accumulate) {
    FOR_EACH_INDEX(v, vectors) {
        umt_halves8 in, out, old;
        in.bits = src[v];
        if (accumulate) old.bits = dst[v];
        for (int e = 0; e < VECTOR; e++) {
            float value = umt_dev_widen<S>(in.h[e]);
            out.h[e] = umt_dev_narrow<D>(accumulate ? value + umt_dev_widen<D>(old.h[e]) : value);
        }
        dst[v] = out.bits;
    }
}

/* Whether both dtypes are halves, the sizes multiples of 8 and both ends 16-byte aligned. */
static bool vector_recast(umt_dtype s, umt_dtype d, const void *src, const void *dst, int64_t a, int64_t b) {
    return is_half(s) && is_half(d) && a % VECTOR == 0 && b % VECTOR == 0 && vectorizable(VECTOR, src, dst, dst);
}

template <umt_dtype S, umt_dtype D>
static umt_status recast_fast(const void *src, bool src_nhwc, void *dst, bool dst_nhwc, int64_t n, int64_t c,
                              int64_t hw, bool accumulate) {
    /* The layouts agree when they are the same, or when c or hw is 1. */
    if (src_nhwc == dst_nhwc || c == 1 || hw == 1) {
        if constexpr (S != UMT_F32 && D != UMT_F32)
            if (vector_recast(S, D, src, dst, n * c * hw, VECTOR)) {
                LAUNCH_VECTORS(n * c * hw, (cast_vector_kernel<S, D>), (const uint4 *)src, (uint4 *)dst,
                               n * c * hw / VECTOR, accumulate);
                return UMT_OK;
            }
        LAUNCH_OVER(n * c * hw, (cast_kernel<S, D>), src, dst, n * c * hw, accumulate);
        return UMT_OK;
    }
    int64_t rows = src_nhwc ? hw : c, cols = src_nhwc ? c : hw;
    if constexpr (S != UMT_F32 && D != UMT_F32)
        if (vector_recast(S, D, src, dst, rows, cols)) {
            dim3 grid((unsigned int)((cols + VTILE - 1) / VTILE), (unsigned int)((rows + VTILE - 1) / VTILE),
                      (unsigned int)(n < (int64_t)MAX_GRID_Z ? n : (int64_t)MAX_GRID_Z));
            transpose_vector_kernel<S, D><<<grid, THREADS, 0, umt_cuda_stream()>>>((const uint4 *)src, (uint4 *)dst, n,
                                                                                 rows, cols, accumulate);
            UMT_CUDA_LAUNCHED();
            return UMT_OK;
        }
    if (rows * cols <= TILE * TILE) {
        LAUNCH_OVER(n * rows * cols, (transpose_small_kernel<S, D>), src, dst, n * rows * cols, rows, cols,
                    accumulate);
        return UMT_OK;
    }
    dim3 grid((unsigned int)((cols + TILE - 1) / TILE), (unsigned int)((rows + TILE - 1) / TILE),
              (unsigned int)(n < (int64_t)MAX_GRID_Z ? n : (int64_t)MAX_GRID_Z));
    transpose_kernel<S, D><<<grid, dim3(TILE, TILE_ROWS), 0, umt_cuda_stream()>>>(src, dst, n, rows, cols, accumulate);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

template <umt_dtype S>
static umt_status recast_from(const void *src, bool src_nhwc, void *dst, umt_dtype dst_dtype, bool dst_nhwc, int64_t n,
                              int64_t c, int64_t hw, bool accumulate) {
    switch (dst_dtype) {
    case UMT_BF16: return recast_fast<S, UMT_BF16>(src, src_nhwc, dst, dst_nhwc, n, c, hw, accumulate);
    case UMT_F16: return recast_fast<S, UMT_F16>(src, src_nhwc, dst, dst_nhwc, n, c, hw, accumulate);
    default: return recast_fast<S, UMT_F32>(src, src_nhwc, dst, dst_nhwc, n, c, hw, accumulate);
    }
}

extern "C" umt_status umt_cuda_recast(const void *src, umt_dtype src_dtype, bool src_nhwc, void *dst,
                                      umt_dtype dst_dtype, bool dst_nhwc, int64_t n, int64_t c, int64_t hw,
                                      bool accumulate) {
    if (!is_float(src_dtype) || !is_float(dst_dtype))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "recast: %s -> %s (expected f32, bf16 or f16 on both sides)",
                        umt_dtype_name(src_dtype), umt_dtype_name(dst_dtype));
    if (n < 0 || c < 0 || hw < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "recast: n=%lld c=%lld hw=%lld (expected >= 0)", (long long)n,
                        (long long)c, (long long)hw);
    if (n == 0 || c == 0 || hw == 0) return UMT_OK;
    /* A cast has no grid limit; a transpose's tiles of either side must fit a grid's y. */
    bool same_layout = src_nhwc == dst_nhwc || c == 1 || hw == 1;
    if (same_layout || (c / TILE < MAX_GRID_Z && hw / TILE < MAX_GRID_Z)) {
        switch (src_dtype) {
        case UMT_BF16: return recast_from<UMT_BF16>(src, src_nhwc, dst, dst_dtype, dst_nhwc, n, c, hw, accumulate);
        case UMT_F16: return recast_from<UMT_F16>(src, src_nhwc, dst, dst_dtype, dst_nhwc, n, c, hw, accumulate);
        default: return recast_from<UMT_F32>(src, src_nhwc, dst, dst_dtype, dst_nhwc, n, c, hw, accumulate);
        }
    }
    LAUNCH_OVER(n * c * hw, recast_kernel, src, src_dtype, src_nhwc, dst, dst_dtype, dst_nhwc, n, c, hw, accumulate);
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Bias over rows (linear layers; NHWC channels are rows of c values too)                     */

static __global__ void add_rows_lp_kernel(umt_dtype dtype, const void *x, const float *bias, void *out, int64_t rows,
                                          int64_t cols) {
    FOR_EACH_INDEX(i, rows * cols) umt_dev_store_from_f32(out, dtype, i, umt_dev_load_as_f32(x, dtype, i) + bias[i % cols]);
}

/* dbias[c] += sum over r of dy[r, c], tiled as elementwise.cu's sum_rows (deterministic). */
static __global__ void sum_rows_lp_kernel(umt_dtype dtype, const void *dy, float *dbias, int64_t rows, int64_t cols) {
    __shared__ float partial[SUM_ROW_GROUPS][SUM_COLUMNS];
    for (int64_t first = (int64_t)blockIdx.x * SUM_COLUMNS; first < cols; first += (int64_t)gridDim.x * SUM_COLUMNS) {
        int64_t c = first + threadIdx.x;
        float sum = 0.0f;
        if (c < cols)
            for (int64_t r = threadIdx.y; r < rows; r += SUM_ROW_GROUPS) sum += umt_dev_load_as_f32(dy, dtype, r * cols + c);
        partial[threadIdx.y][threadIdx.x] = sum;
        __syncthreads();
        if (threadIdx.y == 0 && c < cols) {
            float total = 0.0f;
            for (int group = 0; group < SUM_ROW_GROUPS; group++) total += partial[group][threadIdx.x];
            dbias[c] += total;
        }
        __syncthreads();
    }
}

/* Block (tile, chunk) sums rows [chunk * rows_per_chunk, +rows_per_chunk) of its 32 columns. */
static __global__ void sum_row_chunks_lp_kernel(umt_dtype dtype, const void *dy, float *row_chunk_partials,
                                                int64_t rows, int64_t cols, int64_t rows_per_chunk) {
    __shared__ float partial[SUM_ROW_GROUPS][SUM_COLUMNS];
    int64_t c = (int64_t)blockIdx.x * SUM_COLUMNS + threadIdx.x;
    int64_t first = (int64_t)blockIdx.y * rows_per_chunk;
    int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum = 0.0f;
    if (c < cols)
        for (int64_t r = first + threadIdx.y; r < last; r += SUM_ROW_GROUPS) sum += umt_dev_load_as_f32(dy, dtype, r * cols + c);
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = 0.0f;
        for (int group = 0; group < SUM_ROW_GROUPS; group++) total += partial[group][threadIdx.x];
        row_chunk_partials[blockIdx.y * cols + c] = total;
    }
}

static __global__ void add_row_chunks_kernel(const float *row_chunk_partials, float *dbias, int64_t cols,
                                             int chunks) {
    umt_dev_add_chunk_partials(row_chunk_partials, dbias, cols, chunks);
}

extern "C" umt_status umt_cuda_add_rows_lp(umt_dtype dtype, const void *x, const float *bias, void *out, int64_t rows,
                                           int64_t cols) {
    UMT_TRY(umt_cuda_check_half("add_rows_lp", dtype));
    if (rows <= 0 || cols <= 0) return UMT_OK;
    if (cols % VECTOR == 0 && vectorizable(rows * cols, x, out, out)) {
        LAUNCH_VECTORS_OF(dtype, rows * cols, add_rows_lp_vector_kernel, (const uint4 *)x, bias, (uint4 *)out,
                          rows * cols / VECTOR, cols);
        return UMT_OK;
    }
    LAUNCH_OVER(rows * cols, add_rows_lp_kernel, dtype, x, bias, out, rows, cols);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sum_rows_lp(umt_dtype dtype, const void *dy, float *dbias, int64_t rows, int64_t cols) {
    UMT_TRY(umt_cuda_check_half("sum_rows_lp", dtype));
    if (rows <= 0 || cols <= 0) return UMT_OK;
    int64_t tiles = (cols + SUM_COLUMNS - 1) / SUM_COLUMNS;
    /* Chunk the rows when the column tiles alone would not fill the GPU and the partials fit. */
    if (tiles < 64 && cols <= MAX_CHUNKED_COLUMNS && rows >= 4 * ROW_CHUNKS * SUM_ROW_GROUPS) {
        int64_t rows_per_chunk = (rows + ROW_CHUNKS - 1) / ROW_CHUNKS;
        int chunks = (int)((rows + rows_per_chunk - 1) / rows_per_chunk);
        const umt_cuda_scratch *scratch;
        UMT_TRY(umt_cuda_scratch_get("sum_rows_lp", &scratch));
        float *partials = scratch->lowp_row_chunk_partials;
        sum_row_chunks_lp_kernel<<<dim3((unsigned int)tiles, (unsigned int)chunks), dim3(SUM_COLUMNS, SUM_ROW_GROUPS),
                                   0, umt_cuda_stream()>>>(dtype, dy, partials, rows, cols, rows_per_chunk);
        UMT_CUDA_LAUNCHED();
        add_row_chunks_kernel<<<umt_chunk_sum_blocks(cols), THREADS, 0, umt_cuda_stream()>>>(partials, dbias, cols,
                                                                                             chunks);
        UMT_CUDA_LAUNCHED();
        return UMT_OK;
    }
    dim3 block(SUM_COLUMNS, SUM_ROW_GROUPS);
    sum_rows_lp_kernel<<<tiles < MAX_BLOCKS ? (unsigned int)tiles : (unsigned int)MAX_BLOCKS, block, 0,
                         umt_cuda_stream()>>>(dtype, dy, dbias, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Bias over channels: NHWC is a matrix of n*hw rows by k columns; NCHW sums planes            */

static __global__ void add_channel_bias_nchw_lp_kernel(umt_dtype dtype, const void *x, const float *bias, void *y,
                                                       int64_t n, int64_t k, int64_t hw) {
    FOR_EACH_INDEX(i, n * k * hw) umt_dev_store_from_f32(y, dtype, i, umt_dev_load_as_f32(x, dtype, i) + bias[i / hw % k]);
}

/* One block per channel: its threads stride over the channel's n planes, then a tree in
 * shared memory (fixed order: deterministic). */
static __global__ void sum_channel_bias_nchw_lp_kernel(umt_dtype dtype, const void *dy, float *dbias, int64_t n,
                                                       int64_t k, int64_t hw) {
    __shared__ float partial[THREADS];
    int64_t channel = blockIdx.x;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n * hw; i += blockDim.x)
        sum += umt_dev_load_as_f32(dy, dtype, (i / hw * k + channel) * hw + i % hw);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) dbias[channel] += partial[0];
}

extern "C" umt_status umt_cuda_add_channel_bias_lp(umt_dtype dtype, bool nhwc, const void *x, const float *bias,
                                                   void *y, int64_t n, int64_t k, int64_t hw) {
    if (nhwc) return umt_cuda_add_rows_lp(dtype, x, bias, y, n * hw, k);
    UMT_TRY(umt_cuda_check_half("add_channel_bias_lp", dtype));
    LAUNCH_OVER(n * k * hw, add_channel_bias_nchw_lp_kernel, dtype, x, bias, y, n, k, hw);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_sum_channel_bias_lp(umt_dtype dtype, bool nhwc, const void *dy, float *dbias, int64_t n,
                                                   int64_t k, int64_t hw) {
    if (nhwc) return umt_cuda_sum_rows_lp(dtype, dy, dbias, n * hw, k);
    UMT_TRY(umt_cuda_check_half("sum_channel_bias_lp", dtype));
    if (n <= 0 || k <= 0 || hw <= 0) return UMT_OK;
    if (k > 0x7fffffff) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "sum_channel_bias_lp: %lld channels", (long long)k);
    sum_channel_bias_nchw_lp_kernel<<<(unsigned int)k, THREADS, 0, umt_cuda_stream()>>>(dtype, dy, dbias, n, k, hw);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* ReLU and dropout                                                                            */

/* "x < 0 ? 0 : x" lets a NaN through, as the f32 kernel does. */
static __global__ void relu_lp_kernel(umt_dtype dtype, const void *x, void *y, int64_t n) {
    FOR_EACH_INDEX(i, n) {
        float v = umt_dev_load_as_f32(x, dtype, i);
        umt_dev_store_from_f32(y, dtype, i, v < 0.0f ? 0.0f : v);
    }
}

static __global__ void relu_backward_lp_kernel(umt_dtype dtype, const void *y, const void *dy, void *dx, int64_t n) {
    FOR_EACH_INDEX(i, n) {
        if (umt_dev_load_as_f32(y, dtype, i) > 0.0f)
            umt_dev_store_from_f32(dx, dtype, i, umt_dev_load_as_f32(dx, dtype, i) + umt_dev_load_as_f32(dy, dtype, i));
    }
}

/* The draw is umt_dropout_keep's (kernels/backend.h): the f32 kernel's, element for element. */
static __global__ void dropout_forward_lp_kernel(umt_dtype dtype, const void *x, void *y, uint8_t *mask, int64_t n,
                                                 int64_t first, float p, float scale, uint64_t seed,
                                                 const uint64_t *seed_on_device) {
    if (seed_on_device) seed = *seed_on_device;
    FOR_EACH_INDEX(i, n) {
        bool keep = umt_dropout_keep(seed, (uint64_t)(first + i), p);
        if (mask) mask[i] = keep ? 1 : 0;
        umt_dev_store_from_f32(y, dtype, i, keep ? umt_dev_load_as_f32(x, dtype, i) * scale : 0.0f);
    }
}

/* Eight elements a thread: one 16-byte load and store, the eight mask bytes as one 8-byte
 * store; the same draws (element i's) and roundings as the kernel above. */
template <umt_dtype D>
static __global__ void dropout_forward_lp_vector_kernel(const uint4 *x, uint4 *y, uint64_t *mask, int64_t vectors,
                                                        int64_t first, float p, float scale, uint64_t seed,
                                                        const uint64_t *seed_on_device) {
    if (seed_on_device) seed = *seed_on_device;
    FOR_EACH_INDEX(v, vectors) {
        umt_halves8 in;
        in.bits = x[v];
        uint64_t kept;
        y[v] = umt_dev_dropout8<D>(in, seed, (uint64_t)(first + v * VECTOR), p, scale, &kept).bits;
        if (mask) mask[v] = kept;
    }
}

static __global__ void dropout_backward_lp_kernel(umt_dtype dtype, const uint8_t *mask, const void *dy, void *dx,
                                                  int64_t n, float scale) {
    FOR_EACH_INDEX(i, n) {
        if (mask[i])
            umt_dev_store_from_f32(dx, dtype, i,
                                   umt_dev_load_as_f32(dx, dtype, i) + umt_dev_load_as_f32(dy, dtype, i) * scale);
    }
}

extern "C" umt_status umt_cuda_relu_lp(umt_dtype dtype, const void *x, void *y, int64_t n) {
    UMT_TRY(umt_cuda_check_half("relu_lp", dtype));
    if (vectorizable(n, x, y, y)) {
        LAUNCH_VECTORS_OF(dtype, n, relu_lp_vector_kernel, (const uint4 *)x, (uint4 *)y, n / VECTOR);
        return UMT_OK;
    }
    LAUNCH_OVER(n, relu_lp_kernel, dtype, x, y, n);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_relu_backward_lp(umt_dtype dtype, const void *y, const void *dy, void *dx, int64_t n) {
    UMT_TRY(umt_cuda_check_half("relu_backward_lp", dtype));
    if (vectorizable(n, y, dy, dx)) {
        LAUNCH_VECTORS_OF(dtype, n, relu_backward_lp_vector_kernel, (const uint4 *)y, (const uint4 *)dy, (uint4 *)dx,
                          n / VECTOR);
        return UMT_OK;
    }
    LAUNCH_OVER(n, relu_backward_lp_kernel, dtype, y, dy, dx, n);
    return UMT_OK;
}

static umt_status check_dropout(const char *op, umt_dtype dtype, float p) {
    UMT_TRY(umt_cuda_check_half(op, dtype));
    if (!(p >= 0.0f && p < 1.0f)) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g (expected 0 <= p < 1)", op, p);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_dropout_forward_lp(umt_dtype dtype, const void *x, void *y, uint8_t *mask, int64_t n,
                                                  int64_t first, float p, uint64_t seed,
                                                  const uint64_t *seed_on_device) {
    UMT_TRY(check_dropout("dropout_forward_lp", dtype, p));
    if (first < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "dropout_forward_lp: first = %lld, expected >= 0",
                        (long long)first);
    if (vectorizable(n, x, y, y) && (uintptr_t)mask % sizeof(uint64_t) == 0) {
        LAUNCH_VECTORS_OF(dtype, n, dropout_forward_lp_vector_kernel, (const uint4 *)x, (uint4 *)y, (uint64_t *)mask,
                          n / VECTOR, first, p, 1.0f / (1.0f - p), seed, seed_on_device);
        return UMT_OK;
    }
    LAUNCH_OVER(n, dropout_forward_lp_kernel, dtype, x, y, mask, n, first, p, 1.0f / (1.0f - p), seed,
                seed_on_device);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_dropout_backward_lp(umt_dtype dtype, const uint8_t *mask, const void *dy, void *dx,
                                                   int64_t n, float p) {
    UMT_TRY(check_dropout("dropout_backward_lp", dtype, p));
    LAUNCH_OVER(n, dropout_backward_lp_kernel, dtype, mask, dy, dx, n, 1.0f / (1.0f - p));
    return UMT_OK;
}
