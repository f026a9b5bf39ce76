/*
 * kernels/cuda/pool.cu — max and average pooling over square windows (no padding), each next to
 * its backward. Our kernels, not cuDNN's, so that every result equals the CPU's bit for bit
 * (kernels/cpu/pool.c is the reference).
 *
 * Forwards give one output to a thread. Max pooling scans its window rows then columns and
 * keeps the first maximum, except that a NaN beats any number and the first NaN wins (the CPU's
 * rule, PyTorch's NaN propagation); argmax is the pick's index within its h*w plane.
 *
 * Backwards gather instead of scattering: one thread per input element walks the windows that
 * cover it in output order (rows, then columns), adding each contribution to dx in turn. That is
 * the order in which the CPU's scatter reaches the element, so overlapping windows (stride <
 * window) give the CPU's sums exactly, with no atomics and the same bits on every run. For max
 * pooling a window contributes when its argmax is this element. An argmax outside its window is
 * never matched, so a corrupt argmax loses its gradient where the CPU refuses it; argmax comes
 * from max_pool_forward, and checking it here would cost a wait for the GPU on every call.
 * Where windows do not overlap (stride >= window), each input has at most one window, and the
 * max-pool backwards scatter instead: one thread per output adds its gradient at its pick, the
 * same single addition (see max_pool_backward_scatter_kernel).
 */
#include <math.h>
#include <stdint.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/dropout8.h"
#include "kernels/cuda/fast_divide.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pool_scatter.h"

/* One thread per element of n (n >= 1 once the shape is checked). The kernels take the shape by
 * value, so it travels in the launch's parameters. */
#define LAUNCH_OVER(n, kernel, ...)                                                                                \
    do {                                                                                                           \
        kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(__VA_ARGS__);                                     \
        UMT_CUDA_LAUNCHED();                                                                                       \
    } while (0)

/* The first and last output index (in one dimension) whose window covers input index i; first >
 * last when none does (the input's tail that no window reaches). */
static __device__ void covering(int64_t i, int64_t window, int64_t stride, int64_t outputs, int64_t *first,
                                int64_t *last) {
    *first = i < window ? 0 : (i - window) / stride + 1;
    *last = i / stride < outputs - 1 ? i / stride : outputs - 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Max pooling                                                                                 */

/* Bitwise, not short-circuit: a test with no branch, where a scan unrolled over a window made one
 * branch a value of `||` and `&&`. */
static __device__ bool takes_over(float value, float best) {
    return (value > best) | (isnan(value) & !isnan(best));
}

/* With a bias (bias_relu_max_pool_dropout_forward), each input is first max(x + bias[channel], 0) as
 * bias_relu computes it (a NaN passes the ReLU), then rounded to the dtype as bias_relu stores
 * it: the pool then scans exactly the values it would have read. */
static __device__ float biased_relu(float v, const float *bias, int64_t channel, umt_dtype dtype) {
    if (!bias) return v;
    v = __fadd_rn(v, bias[channel]);
    v = v < 0.0f ? 0.0f : v;
    if (dtype == UMT_F32) return v;
    return dtype == UMT_BF16 ? umt_dev_bf16_to_f32(umt_dev_f32_to_bf16(v)) : umt_dev_f16_to_f32(umt_dev_f32_to_f16(v));
}

/* One output's window, scanned in Index arithmetic (int64_t, or int where every tensor is under
 * 2^31 elements): the first of its largest ReLU(x + bias) values (takes_over). Every max-pool
 * forward writes, per output, either argmax (the pick's index in its plane) or, when pick is
 * given instead, the pick's position in its window, i * window + j, in one byte. */
template <typename Index>
static __device__ void pool_window(const float *x_plane, const float *bias, Index channel, Index y0, Index x0,
                                   Index w, Index window, Index out, float *y, int32_t *argmax, uint8_t *pick) {
    Index best_index = y0 * w + x0, best_at = 0;
    float best = biased_relu(x_plane[best_index], bias, channel, UMT_F32);
    for (Index i = 0; i < window; i++) {
        for (Index j = 0; j < window; j++) {
            Index at = (y0 + i) * w + x0 + j;
            float v = biased_relu(x_plane[at], bias, channel, UMT_F32);
            if (takes_over(v, best)) {
                best = v;
                best_index = at, best_at = i * window + j;
            }
        }
    }
    y[out] = best;
    if (pick)
        pick[out] = (uint8_t)best_at;
    else
        argmax[out] = (int32_t)best_index;
}

static __global__ void max_pool_forward_kernel(umt_pool_shape s, const float *x, const float *bias, float *y,
                                               int32_t *argmax, uint8_t *pick) {
    FOR_EACH_INDEX(out, s.n * s.c * s.p * s.q) {
        int64_t plane = out / (s.p * s.q), oy = out / s.q % s.p, ox = out % s.q, channel = plane % s.c;
        pool_window<int64_t>(x + plane * s.h * s.w, bias, channel, oy * s.stride, ox * s.stride, s.w, s.window, out,
                             y, argmax, pick);
    }
}

/* The same in 32-bit indices, an output's coordinates by multiply-shift divisions
 * (kernels/cuda/fast_divide.h): the 64-bit divisions of the kernel above were most of its
 * instructions, about a hundred each. by_plane: p * q; by_q: q; by_c: c. */
static __global__ void max_pool_forward_fast_kernel(umt_pool_shape s, umt_fast_divisor by_plane, umt_fast_divisor by_q,
                                                    umt_fast_divisor by_c, const float *x, const float *bias, float *y,
                                                    int32_t *argmax, uint8_t *pick) {
    int total = (int)(s.n * s.c * s.p * s.q), c = (int)s.c;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int plane = umt_fast_divide(out, by_plane), within = out - plane * (int)(s.p * s.q);
        int oy = umt_fast_divide(within, by_q), ox = within - oy * (int)s.q;
        int channel = plane - umt_fast_divide(plane, by_c) * c;
        pool_window<int>(x + plane * (int)(s.h * s.w), bias, channel, oy * (int)s.stride, ox * (int)s.stride,
                         (int)s.w, (int)s.window, out, y, argmax, pick);
    }
}

/* f32 max pool forward (NCHW): the 32-bit kernel where every index fits. */
static umt_status max_pool_forward_f32(const umt_pool_shape *s, const float *x, const float *bias, float *y,
                                       int32_t *argmax, uint8_t *pick) {
    int64_t outputs = s->n * s->c * s->p * s->q;
    if (s->n * s->c * s->h * s->w >= INT32_MAX) {
        LAUNCH_OVER(outputs, max_pool_forward_kernel, *s, x, bias, y, argmax, pick);
        return UMT_OK;
    }
    LAUNCH_OVER(outputs, max_pool_forward_fast_kernel, *s, umt_fast_divisor_of((int)(s->p * s->q)),
                umt_fast_divisor_of((int)s->q), umt_fast_divisor_of((int)s->c), x, bias, y, argmax, pick);
    return UMT_OK;
}

static __global__ void max_pool_backward_kernel(umt_pool_shape s, const int32_t *argmax, const float *dy,
                                                float *dx) {
    FOR_EACH_INDEX(in, s.n * s.c * s.h * s.w) {
        int64_t plane = in / (s.h * s.w), iy = in / s.w % s.h, ix = in % s.w;
        int64_t oy_first, oy_last, ox_first, ox_last;
        covering(iy, s.window, s.stride, s.p, &oy_first, &oy_last);
        covering(ix, s.window, s.stride, s.q, &ox_first, &ox_last);
        const int32_t *plane_argmax = argmax + plane * s.p * s.q;
        const float *plane_dy = dy + plane * s.p * s.q;
        int32_t self = (int32_t)(iy * s.w + ix);
        float sum = dx[in];
        bool picked = false;
        for (int64_t oy = oy_first; oy <= oy_last; oy++) {
            for (int64_t ox = ox_first; ox <= ox_last; ox++) {
                if (plane_argmax[oy * s.q + ox] == self) {
                    sum = __fadd_rn(sum, plane_dy[oy * s.q + ox]);
                    picked = true;
                }
            }
        }
        if (picked) dx[in] = sum;
    }
}

/* Windows that do not overlap (stride >= window, MNIST's 2x2 pool) cover each input at most
 * once, so each output can add its gradient straight to its pick: one thread per output,
 * a quarter of the gather's threads, 32-bit index arithmetic (the plane fits INT32_MAX, and
 * the caller checks the total). The same single addition as the gather: the same bits. A pick
 * outside its window (a corrupt argmax) is dropped, as the gather drops it. */
static __device__ bool pick_in_window(int32_t pick, int oy, int ox, int w, int window, int stride, int *row,
                                      int *col) {
    *row = pick / w, *col = pick % w;
    return *row >= oy * stride && *row < oy * stride + window && *col >= ox * stride && *col < ox * stride + window;
}

static __global__ void max_pool_backward_scatter_kernel(umt_pool_shape s, const int32_t *argmax, const float *dy,
                                                        float *dx) {
    int total = (int)(s.n * s.c * s.p * s.q), p = (int)s.p, q = (int)s.q, w = (int)s.w, hw = (int)(s.h * s.w);
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int plane = out / (p * q), oy = out / q % p, ox = out % q, row, col;
        if (!pick_in_window(argmax[out], oy, ox, w, (int)s.window, (int)s.stride, &row, &col)) continue;
        float *at = dx + (int64_t)plane * hw + row * w + col;
        *at = __fadd_rn(*at, dy[out]);
    }
}

/* Whether the scatter above applies: windows apart and 32-bit indices everywhere. */
static bool scatter_applies(const umt_pool_shape *s) {
    return s->stride >= s->window && s->n * s->c * s->h * s->w < INT32_MAX;
}

extern "C" umt_status umt_cuda_max_pool_forward(const umt_pool_shape *shape, const float *x, float *y,
                                                int32_t *argmax) {
    UMT_TRY(umt_cpu_check_pool_shape("max_pool_forward", shape));
    return max_pool_forward_f32(shape, x, NULL, y, argmax, NULL);
}

extern "C" umt_status umt_cuda_max_pool_backward(const umt_pool_shape *shape, const int32_t *argmax, const float *dy,
                                                 float *dx) {
    UMT_TRY(umt_cpu_check_pool_shape("max_pool_backward", shape));
    if (scatter_applies(shape)) {
        LAUNCH_OVER(shape->n * shape->c * shape->p * shape->q, max_pool_backward_scatter_kernel, *shape, argmax, dy, dx);
        return UMT_OK;
    }
    LAUNCH_OVER(shape->n * shape->c * shape->h * shape->w, max_pool_backward_kernel, *shape, argmax, dy, dx);
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Average pooling                                                                             */

/* The window's sum in double, divided by its area in double, as on the CPU. */
static __global__ void avg_pool_forward_kernel(umt_pool_shape s, const float *x, float *y) {
    double area = (double)(s.window * s.window);
    FOR_EACH_INDEX(out, s.n * s.c * s.p * s.q) {
        int64_t plane = out / (s.p * s.q), oy = out / s.q % s.p, ox = out % s.q;
        double sum = 0.0;
        for (int64_t i = 0; i < s.window; i++) {
            const float *row = x + plane * s.h * s.w + (oy * s.stride + i) * s.w + ox * s.stride;
            for (int64_t j = 0; j < s.window; j++) sum += row[j];
        }
        y[out] = (float)(sum / area);
    }
}

/* Every covering window adds its dy / area (a float division, as on the CPU). */
static __global__ void avg_pool_backward_kernel(umt_pool_shape s, const float *dy, float *dx) {
    float area = (float)(s.window * s.window);
    FOR_EACH_INDEX(in, s.n * s.c * s.h * s.w) {
        int64_t plane = in / (s.h * s.w), iy = in / s.w % s.h, ix = in % s.w;
        int64_t oy_first, oy_last, ox_first, ox_last;
        covering(iy, s.window, s.stride, s.p, &oy_first, &oy_last);
        covering(ix, s.window, s.stride, s.q, &ox_first, &ox_last);
        if (oy_first > oy_last || ox_first > ox_last) continue;
        const float *plane_dy = dy + plane * s.p * s.q;
        float sum = dx[in];
        for (int64_t oy = oy_first; oy <= oy_last; oy++) {
            for (int64_t ox = ox_first; ox <= ox_last; ox++) {
                sum = __fadd_rn(sum, __fdiv_rn(plane_dy[oy * s.q + ox], area));
            }
        }
        dx[in] = sum;
    }
}

extern "C" umt_status umt_cuda_avg_pool_forward(const umt_pool_shape *shape, const float *x, float *y) {
    UMT_TRY(umt_cpu_check_pool_shape("avg_pool_forward", shape));
    LAUNCH_OVER(shape->n * shape->c * shape->p * shape->q, avg_pool_forward_kernel, *shape, x, y);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_avg_pool_backward(const umt_pool_shape *shape, const float *dy, float *dx) {
    UMT_TRY(umt_cpu_check_pool_shape("avg_pool_backward", shape));
    LAUNCH_OVER(shape->n * shape->c * shape->h * shape->w, avg_pool_backward_kernel, *shape, dy, dx);
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Mixed precision: bf16/f16 values, NCHW or NHWC storage (core/precision.h)                   */
/*                                                                                             */
/* The same windows, picks and gathering order as above; values are widened to f32 to compare  */
/* and sum, and rounded once at the store. Thread t takes element t of the storage order, so a  */
/* warp reads neighbouring channels of one pixel under NHWC: coalesced either way.              */

/* Storage offset of (image, channel, row, column) in a tensor of c channels of h x w pixels. */
static __device__ int64_t offset_of(bool nhwc, int64_t n, int64_t ch, int64_t row, int64_t col, int64_t c,
                                    int64_t h, int64_t w) {
    return nhwc ? ((n * h + row) * w + col) * c + ch : ((n * c + ch) * h + row) * w + col;
}

/* The inverse: storage index i -> (image, channel, row, column). */
static __device__ void coordinates_of(bool nhwc, int64_t i, int64_t c, int64_t h, int64_t w, int64_t *n,
                                      int64_t *ch, int64_t *row, int64_t *col) {
    if (nhwc) {
        *ch = i % c, *col = i / c % w, *row = i / (c * w) % h, *n = i / (c * w * h);
    } else {
        *col = i % w, *row = i / w % h, *ch = i / (w * h) % c, *n = i / (w * h * c);
    }
}

static __global__ void max_pool_forward_lp_kernel(umt_pool_shape s, const void *x, const float *bias, void *y,
                                                  int32_t *argmax, uint8_t *pick) {
    FOR_EACH_INDEX(out, s.n * s.c * s.p * s.q) {
        int64_t n, ch, oy, ox;
        coordinates_of(s.nhwc, out, s.c, s.p, s.q, &n, &ch, &oy, &ox);
        int64_t y0 = oy * s.stride, x0 = ox * s.stride, best_index = y0 * s.w + x0, best_at = 0;
        float best = biased_relu(umt_dev_load_as_f32(x, s.dtype, offset_of(s.nhwc, n, ch, y0, x0, s.c, s.h, s.w)),
                                 bias, ch, s.dtype);
        for (int64_t i = 0; i < s.window; i++) {
            for (int64_t j = 0; j < s.window; j++) {
                float v = biased_relu(
                    umt_dev_load_as_f32(x, s.dtype, offset_of(s.nhwc, n, ch, y0 + i, x0 + j, s.c, s.h, s.w)), bias, ch,
                    s.dtype);
                if (takes_over(v, best)) {
                    best = v;
                    best_index = (y0 + i) * s.w + x0 + j, best_at = i * s.window + j;
                }
            }
        }
        /* The pick is a value of x: storing it back into the same dtype is exact. */
        umt_dev_store_from_f32(y, s.dtype, out, best);
        if (pick)
            pick[out] = (uint8_t)best_at;
        else
            argmax[out] = (int32_t)best_index;
    }
}

static __global__ void max_pool_backward_lp_kernel(umt_pool_shape s, const int32_t *argmax, const void *dy, void *dx) {
    FOR_EACH_INDEX(in, s.n * s.c * s.h * s.w) {
        int64_t n, ch, iy, ix, oy_first, oy_last, ox_first, ox_last;
        coordinates_of(s.nhwc, in, s.c, s.h, s.w, &n, &ch, &iy, &ix);
        covering(iy, s.window, s.stride, s.p, &oy_first, &oy_last);
        covering(ix, s.window, s.stride, s.q, &ox_first, &ox_last);
        int32_t self = (int32_t)(iy * s.w + ix);
        float sum = 0.0f;
        bool picked = false;
        for (int64_t oy = oy_first; oy <= oy_last; oy++) {
            for (int64_t ox = ox_first; ox <= ox_last; ox++) {
                int64_t o = offset_of(s.nhwc, n, ch, oy, ox, s.c, s.p, s.q);
                if (argmax[o] == self) {
                    sum += umt_dev_load_as_f32(dy, s.dtype, o);
                    picked = true;
                }
            }
        }
        if (picked) umt_dev_store_from_f32(dx, s.dtype, in, umt_dev_load_as_f32(dx, s.dtype, in) + sum);
    }
}

static __global__ void avg_pool_forward_lp_kernel(umt_pool_shape s, const void *x, void *y) {
    float area = (float)(s.window * s.window);
    FOR_EACH_INDEX(out, s.n * s.c * s.p * s.q) {
        int64_t n, ch, oy, ox;
        coordinates_of(s.nhwc, out, s.c, s.p, s.q, &n, &ch, &oy, &ox);
        float sum = 0.0f;
        for (int64_t i = 0; i < s.window; i++)
            for (int64_t j = 0; j < s.window; j++)
                sum += umt_dev_load_as_f32(
                    x, s.dtype, offset_of(s.nhwc, n, ch, oy * s.stride + i, ox * s.stride + j, s.c, s.h, s.w));
        umt_dev_store_from_f32(y, s.dtype, out, sum / area);
    }
}

static __global__ void avg_pool_backward_lp_kernel(umt_pool_shape s, const void *dy, void *dx) {
    float area = (float)(s.window * s.window);
    FOR_EACH_INDEX(in, s.n * s.c * s.h * s.w) {
        int64_t n, ch, iy, ix, oy_first, oy_last, ox_first, ox_last;
        coordinates_of(s.nhwc, in, s.c, s.h, s.w, &n, &ch, &iy, &ix);
        covering(iy, s.window, s.stride, s.p, &oy_first, &oy_last);
        covering(ix, s.window, s.stride, s.q, &ox_first, &ox_last);
        if (oy_first > oy_last || ox_first > ox_last) continue;
        float sum = 0.0f;
        for (int64_t oy = oy_first; oy <= oy_last; oy++)
            for (int64_t ox = ox_first; ox <= ox_last; ox++)
                sum += umt_dev_load_as_f32(dy, s.dtype, offset_of(s.nhwc, n, ch, oy, ox, s.c, s.p, s.q));
        umt_dev_store_from_f32(dx, s.dtype, in, umt_dev_load_as_f32(dx, s.dtype, in) + sum / area);
    }
}

/* The paths MNIST takes under bf16: dtype fixed at compile time (no switch per element) and
 * 32-bit coordinates (scatter_applies' bound). Same windows, picks and roundings as above. */
template <umt_dtype D> static __device__ float load_f32(const void *x, int i) { return umt_dev_load_as_f32(x, D, i); }

template <umt_dtype D>
static __global__ void max_pool_forward_lp_fast_kernel(umt_pool_shape s, const void *x, const float *bias, void *y,
                                                       int32_t *argmax, uint8_t *pick) {
    int total = (int)(s.n * s.c * s.p * s.q), c = (int)s.c, h = (int)s.h, w = (int)s.w, window = (int)s.window;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int n, ch, oy, ox;
        umt_dev_pool_coordinates32(s.nhwc, out, c, (int)s.p, (int)s.q, &n, &ch, &oy, &ox);
        int y0 = oy * (int)s.stride, x0 = ox * (int)s.stride, best_index = y0 * w + x0, best_at = 0;
        float best =
            biased_relu(load_f32<D>(x, umt_dev_pool_offset32(s.nhwc, n, ch, y0, x0, c, h, w)), bias, ch, D);
        for (int i = 0; i < window; i++) {
            for (int j = 0; j < window; j++) {
                int at = umt_dev_pool_offset32(s.nhwc, n, ch, y0 + i, x0 + j, c, h, w);
                float v = biased_relu(load_f32<D>(x, at), bias, ch, D);
                if (takes_over(v, best)) {
                    best = v;
                    best_index = (y0 + i) * w + x0 + j, best_at = i * window + j;
                }
            }
        }
        umt_dev_store_from_f32(y, D, out, best);
        if (pick)
            pick[out] = (uint8_t)best_at;
        else
            argmax[out] = best_index;
    }
}

/* NHWC with channels in eights: a thread takes eight neighbouring channels of one output pixel,
 * reading each window position as one 16-byte load; each lane keeps its own first maximum.
 * WINDOW: the window's size when known at compile time (0: read from the shape). A known window
 * has all its loads issued before any comparison (with the 2x2 window read in a loop, conv2's
 * pool at batch 4096 waited on one load at a time). PICK: write each output's pick (its window
 * position, a byte), else its argmax (four bytes). drop.p > 0: the dropout that follows, drawn
 * on the rounded outputs before they are stored (scale its 1/(1-p)), as the dropout kernel
 * reading them back would: a pass over the output saved. The kernel is bound by its integer
 * work, not its bytes (docs/PERF.md, "Dropout drawn by the pool"): each channel's bias is read
 * once, and a lane keeps its best value's bits, so that no value is rounded twice. */
enum { LANES = UMT_HALVES_PER_VECTOR }; /* one umt_halves8 (kernels/cuda/float16.h) */

/* A lane's first maximum so far: the value, its bits in the dtype, where it lies. */
typedef struct {
    float value[LANES];
    uint16_t bits[LANES];
    int index[LANES], at[LANES];
} lane_best;

/* Window position (i, j) of the thread's output, its eight channels in v: with a bias, each is
 * max(x + bias, 0) rounded to the dtype (biased_relu's value) before the comparison. FINITE:
 * every input and bias of the window is finite, so no value met is a NaN (a sum overflows to an
 * infinity at worst): the conversions and the comparison need no NaN case, about a third of the
 * scan's integer work, where the kernel is bound by it. */
template <umt_dtype D, bool FINITE>
static __device__ __forceinline__ void scan_position(umt_halves8 v, bool biased, const float (&b)[LANES], bool first,
                                                     int index, int at, lane_best *best) {
#pragma unroll
    for (int e = 0; e < LANES; e++) {
        uint16_t h = v.h[e];
        if (biased) {
            float r = __fadd_rn(FINITE ? umt_dev_widen_number<D>(h) : umt_dev_widen<D>(h), b[e]);
            r = r < 0.0f ? 0.0f : r;
            h = FINITE ? umt_dev_narrow_number<D>(r) : umt_dev_narrow<D>(r);
        }
        float f = FINITE ? umt_dev_widen_number<D>(h) : umt_dev_widen<D>(h);
        if (first || (FINITE ? f > best->value[e] : takes_over(f, best->value[e]))) {
            best->value[e] = f, best->bits[e] = h;
            best->index[e] = index, best->at[e] = at;
        }
    }
}

/* The thread's window, its top-left vector at corner (rows w vectors of groups apart), scanned
 * into best. A window known at compile time has its loads issued together, and a window of
 * numbers alone (the inputs and the biases all finite) takes scan_position's FINITE case. */
template <umt_dtype D, int WINDOW>
static __device__ __forceinline__ void scan_window(const uint4 *corner, int w, int groups, int window, bool biased,
                                                   const float (&b)[LANES], int y0, int x0, lane_best *best) {
    if constexpr (WINDOW > 0) {
        umt_halves8 v[WINDOW * WINDOW];
        bool finite = true;
#pragma unroll
        for (int t = 0; t < WINDOW * WINDOW; t++) {
            v[t].bits = corner[(t / WINDOW * w + t % WINDOW) * groups];
            finite = finite & umt_dev_all_finite8<D>(v[t].bits);
        }
#pragma unroll
        for (int e = 0; e < LANES; e++) finite = finite & (isfinite(b[e]) != 0);
        if (finite)
#pragma unroll
            for (int t = 0; t < WINDOW * WINDOW; t++)
                scan_position<D, true>(v[t], biased, b, t == 0, (y0 + t / WINDOW) * w + x0 + t % WINDOW, t, best);
        else
#pragma unroll
            for (int t = 0; t < WINDOW * WINDOW; t++)
                scan_position<D, false>(v[t], biased, b, t == 0, (y0 + t / WINDOW) * w + x0 + t % WINDOW, t, best);
    } else {
        for (int i = 0; i < window; i++)
            for (int j = 0; j < window; j++) {
                umt_halves8 v;
                v.bits = corner[(i * w + j) * groups];
                scan_position<D, false>(v, biased, b, i == 0 && j == 0, (y0 + i) * w + x0 + j, i * window + j, best);
            }
    }
}

template <umt_dtype D, int WINDOW, bool PICK>
static __global__ void max_pool_forward_lp_nhwc8_kernel(umt_pool_shape s, const uint4 *__restrict__ x,
                                                        const float *__restrict__ bias, uint4 *y, int4 *argmax,
                                                        uint64_t *pick, umt_dropout_draw drop, float scale) {
    const int window = WINDOW ? WINDOW : (int)s.window;
    uint64_t seed = drop.p > 0.0f && drop.seed_on_device ? *drop.seed_on_device : drop.seed;
    int groups = (int)s.c / LANES, w = (int)s.w, q = (int)s.q, p = (int)s.p;
    int total = (int)(s.n * s.p * s.q) * groups;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int group = out % groups, pixel = out / groups, ox = pixel % q, oy = pixel / q % p, n = pixel / (q * p);
        int y0 = oy * (int)s.stride, x0 = ox * (int)s.stride;
        const uint4 *corner = x + ((n * (int)s.h + y0) * w + x0) * groups + group;
        float b[LANES];
#pragma unroll
        for (int e = 0; e < LANES; e++) b[e] = bias ? bias[group * LANES + e] : 0.0f;
        lane_best best;
        scan_window<D, WINDOW>(corner, w, groups, window, bias, b, y0, x0, &best);
        /* Without a bias the input's value is stored as a rounding of it would (a NaN quieted). */
        umt_halves8 result;
#pragma unroll
        for (int e = 0; e < LANES; e++) result.h[e] = bias ? best.bits[e] : umt_dev_narrow<D>(best.value[e]);
        if (drop.p > 0.0f) result = umt_dev_dropout8<D>(result, seed, (uint64_t)drop.first + (uint64_t)out * LANES,
                                                        drop.p, scale, NULL);
        y[out] = result.bits;
        if (PICK) { /* eight bytes, channel e's in byte e */
            uint64_t bytes = 0;
#pragma unroll
            for (int e = 0; e < LANES; e++) bytes |= (uint64_t)best.at[e] << (8 * e);
            pick[out] = bytes;
        } else {
            argmax[2 * out] = make_int4(best.index[0], best.index[1], best.index[2], best.index[3]);
            argmax[2 * out + 1] = make_int4(best.index[4], best.index[5], best.index[6], best.index[7]);
        }
    }
}

/* Whether the eight-lane kernel applies: NHWC, channels in eights, every pointer 16-byte aligned. */
static bool lanes_apply(const umt_pool_shape *s, const void *x, const void *y, const void *argmax) {
    return s->nhwc && s->c % LANES == 0 && ((uintptr_t)x | (uintptr_t)y | (uintptr_t)argmax) % 16 == 0;
}

template <umt_dtype D>
static __global__ void max_pool_backward_lp_scatter_kernel(umt_pool_shape s, const int32_t *argmax, const void *dy,
                                                           void *dx) {
    int total = (int)(s.n * s.c * s.p * s.q), c = (int)s.c, h = (int)s.h, w = (int)s.w;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int n, ch, oy, ox, row, col;
        umt_dev_pool_coordinates32(s.nhwc, out, c, (int)s.p, (int)s.q, &n, &ch, &oy, &ox);
        if (!pick_in_window(argmax[out], oy, ox, w, (int)s.window, (int)s.stride, &row, &col)) continue;
        int at = umt_dev_pool_offset32(s.nhwc, n, ch, row, col, c, h, w);
        umt_dev_scatter_add<D>(dx, at, 0.0f + load_f32<D>(dy, out));
    }
}

/* The same scatter, NHWC with channels in eights: a thread takes eight neighbouring channels of
 * one output pixel (one 16-byte load of dy, two of argmax) and works out the pixel once; each
 * channel's gradient still lands on its own pick with the same single addition. */
template <umt_dtype D>
static __global__ void max_pool_backward_lp_scatter_nhwc8_kernel(umt_pool_shape s, const int4 *argmax, const uint4 *dy,
                                                                 uint16_t *dx) {
    int groups = (int)s.c / LANES, c = (int)s.c, w = (int)s.w, q = (int)s.q, p = (int)s.p;
    int total = (int)(s.n * s.p * s.q) * groups;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int group = out % groups, pixel = out / groups, ox = pixel % q, oy = pixel / q % p, n = pixel / (q * p);
        int4 first = argmax[2 * out], second = argmax[2 * out + 1];
        int picks[LANES] = {first.x, first.y, first.z, first.w, second.x, second.y, second.z, second.w};
        umt_halves8 grad;
        grad.bits = dy[out];
        for (int e = 0; e < LANES; e++) {
            int row, col;
            if (!pick_in_window(picks[e], oy, ox, w, (int)s.window, (int)s.stride, &row, &col)) continue;
            int at = ((n * (int)s.h + row) * w + col) * c + group * LANES + e;
            umt_dev_scatter_add<D>(dx, at, 0.0f + umt_dev_widen<D>(grad.h[e]));
        }
    }
}

/* Bias + ReLU + max pool's backward scatter (fused.cu), from each output's pick: its position
 * in its window (one byte). The same single addition as the scatter above, any dtype. */
template <umt_dtype D>
static __global__ void pick_scatter_kernel(umt_pool_shape s, const uint8_t *pick, const void *dy, void *dx) {
    int total = (int)(s.n * s.c * s.p * s.q), c = (int)s.c, h = (int)s.h, w = (int)s.w, window = (int)s.window;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int n, ch, oy, ox;
        umt_dev_pool_coordinates32(s.nhwc, out, c, (int)s.p, (int)s.q, &n, &ch, &oy, &ox);
        int at = umt_dev_pool_offset32(s.nhwc, n, ch, oy * (int)s.stride + pick[out] / window,
                                       ox * (int)s.stride + pick[out] % window, c, h, w);
        if constexpr (D == UMT_F32)
            ((float *)dx)[at] = __fadd_rn(((float *)dx)[at], ((const float *)dy)[out]);
        else
            umt_dev_scatter_add<D>(dx, at, 0.0f + load_f32<D>(dy, out));
    }
}

/* The same for a fresh gradient whose windows tile the input exactly, NHWC halves in eights:
 * a thread writes its output's window whole (umt_dev_pick_write8, pool_scatter.h). */
template <umt_dtype D>
static __global__ void pick_write_nhwc8_kernel(umt_pool_shape s, const uint64_t *pick, const uint4 *dy, uint4 *dx) {
    int groups = (int)s.c / LANES, total = (int)(s.n * s.p * s.q) * groups;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        umt_halves8 grad;
        grad.bits = dy[out];
        umt_dev_pick_write8<D>(s, out / groups, out % groups, pick[out], grad, dx);
    }
}

/* The same for f32 NCHW: a thread writes its window's values whole, 0 + dy at the pick and 0
 * elsewhere (the memset and the scatter's single addition give those bits), its rows as float2
 * where the window is 2 wide and rows are 8-byte aligned. by_plane: p * q; by_q: q. */
template <bool PAIRS>
static __global__ void pick_write_f32_kernel(umt_pool_shape s, umt_fast_divisor by_plane, umt_fast_divisor by_q,
                                             const uint8_t *pick, const float *dy, float *dx) {
    int total = (int)(s.n * s.c * s.p * s.q), h = (int)s.h, w = (int)s.w, window = (int)s.window;
    for (int out = blockIdx.x * blockDim.x + threadIdx.x; out < total; out += gridDim.x * blockDim.x) {
        int plane = umt_fast_divide(out, by_plane), within = out - plane * (int)(s.p * s.q);
        int oy = umt_fast_divide(within, by_q), ox = within - oy * (int)s.q, picked = pick[out];
        float value = __fadd_rn(0.0f, dy[out]);
        float *corner = dx + plane * h * w + oy * window * w + ox * window;
        for (int i = 0; i < window; i++) {
            if constexpr (PAIRS)
                *(float2 *)(corner + i * w) =
                    make_float2(picked == 2 * i ? value : 0.0f, picked == 2 * i + 1 ? value : 0.0f);
            else
                for (int j = 0; j < window; j++) corner[i * w + j] = picked == i * window + j ? value : 0.0f;
        }
    }
}

/* The f32 checks, plus a half dtype. */
static umt_status check_pool_shape_lp(const char *op, const umt_pool_shape *s) {
    if (s->dtype != UMT_BF16 && s->dtype != UMT_F16)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: dtype %s (expected bf16 or f16)", op, umt_dtype_name(s->dtype));
    return umt_cpu_check_pool_shape(op, s);
}

/* The half-precision forward, with or without a bias and ReLU on the way in (checked shape),
 * writing argmax or pick (the other NULL), then the dropout `drop` (NULL: none) over y: drawn by
 * the eight-lane kernel as it writes, or by the dropout kernel after the others. */
static umt_status max_pool_forward_half(const umt_pool_shape *shape, const void *x, const float *bias, void *y,
                                        int32_t *argmax, uint8_t *pick, const umt_dropout_draw *drop) {
    int64_t outputs = shape->n * shape->c * shape->p * shape->q;
    const void *picks = argmax ? (const void *)argmax : (const void *)pick;
    if (shape->n * shape->c * shape->h * shape->w < INT32_MAX && lanes_apply(shape, x, y, picks)) {
        int64_t groups = outputs / LANES;
        bool bf16 = shape->dtype == UMT_BF16, two = shape->window == 2;
        auto kernel = pick ? (bf16 ? (two ? max_pool_forward_lp_nhwc8_kernel<UMT_BF16, 2, true>
                                          : max_pool_forward_lp_nhwc8_kernel<UMT_BF16, 0, true>)
                                   : (two ? max_pool_forward_lp_nhwc8_kernel<UMT_F16, 2, true>
                                          : max_pool_forward_lp_nhwc8_kernel<UMT_F16, 0, true>))
                           : (bf16 ? (two ? max_pool_forward_lp_nhwc8_kernel<UMT_BF16, 2, false>
                                          : max_pool_forward_lp_nhwc8_kernel<UMT_BF16, 0, false>)
                                   : (two ? max_pool_forward_lp_nhwc8_kernel<UMT_F16, 2, false>
                                          : max_pool_forward_lp_nhwc8_kernel<UMT_F16, 0, false>));
        umt_dropout_draw none = {0.0f, 0, NULL, 0}, draw = drop ? *drop : none;
        LAUNCH_OVER(groups, kernel, *shape, (const uint4 *)x, bias, (uint4 *)y, (int4 *)argmax, (uint64_t *)pick,
                    draw, 1.0f / (1.0f - draw.p));
        return UMT_OK;
    }
    if (shape->n * shape->c * shape->h * shape->w < INT32_MAX) {
        if (shape->dtype == UMT_BF16)
            LAUNCH_OVER(outputs, max_pool_forward_lp_fast_kernel<UMT_BF16>, *shape, x, bias, y, argmax, pick);
        else
            LAUNCH_OVER(outputs, max_pool_forward_lp_fast_kernel<UMT_F16>, *shape, x, bias, y, argmax, pick);
    } else {
        LAUNCH_OVER(outputs, max_pool_forward_lp_kernel, *shape, x, bias, y, argmax, pick);
    }
    if (!drop || drop->p == 0.0f) return UMT_OK;
    return umt_cuda_dropout_forward_lp(shape->dtype, y, y, NULL, outputs, drop->first, drop->p, drop->seed,
                                       drop->seed_on_device);
}

extern "C" umt_status umt_cuda_max_pool_forward_lp(const umt_pool_shape *shape, const void *x, void *y,
                                                   int32_t *argmax) {
    UMT_TRY(check_pool_shape_lp("max_pool_forward_lp", shape));
    return max_pool_forward_half(shape, x, NULL, y, argmax, NULL, NULL);
}

/* Bias + ReLU + max pool + dropout (kernels/backend.h): f32 NCHW, or a half dtype in either
 * layout. */
extern "C" umt_status umt_cuda_bias_relu_max_pool_dropout_forward(const umt_pool_shape *shape, const void *x,
                                                                  const float *bias, void *y, uint8_t *pick,
                                                                  const umt_dropout_draw *drop) {
    const umt_pool_shape *s = shape;
    const char *op = "bias_relu_max_pool_dropout_forward";
    if ((s->dtype == UMT_F32 && s->nhwc) || s->stride < s->window || s->window > 16)
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "%s: dtype %s, %s, window %lld, stride %lld (expected f32 NCHW or bf16/f16, stride >= window, "
                        "window <= 16)", op, umt_dtype_name(s->dtype), s->nhwc ? "NHWC" : "NCHW",
                        (long long)s->window, (long long)s->stride);
    if (drop && (!(drop->p >= 0.0f && drop->p < 1.0f) || drop->first < 0))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: p = %g, first = %lld (expected 0 <= p < 1, first >= 0)", op,
                        (double)drop->p, (long long)drop->first);
    if (s->dtype != UMT_F32) {
        UMT_TRY(check_pool_shape_lp(op, s));
        return max_pool_forward_half(s, x, bias, y, NULL, pick, drop);
    }
    UMT_TRY(umt_cpu_check_pool_shape(op, s));
    UMT_TRY(max_pool_forward_f32(s, (const float *)x, bias, (float *)y, NULL, pick));
    if (!drop || drop->p == 0.0f) return UMT_OK;
    return umt_cuda_dropout_forward((const float *)y, (float *)y, NULL, s->n * s->c * s->p * s->q, drop->first,
                                    drop->p, drop->seed, drop->seed_on_device);
}

extern "C" umt_status umt_cuda_max_pool_backward_lp(const umt_pool_shape *shape, const int32_t *argmax, const void *dy,
                                                    void *dx) {
    UMT_TRY(check_pool_shape_lp("max_pool_backward_lp", shape));
    if (scatter_applies(shape) && lanes_apply(shape, dy, argmax, argmax)) {
        int64_t groups = shape->n * shape->p * shape->q * shape->c / LANES;
        if (shape->dtype == UMT_BF16)
            LAUNCH_OVER(groups, max_pool_backward_lp_scatter_nhwc8_kernel<UMT_BF16>, *shape, (const int4 *)argmax,
                        (const uint4 *)dy, (uint16_t *)dx);
        else
            LAUNCH_OVER(groups, max_pool_backward_lp_scatter_nhwc8_kernel<UMT_F16>, *shape, (const int4 *)argmax,
                        (const uint4 *)dy, (uint16_t *)dx);
        return UMT_OK;
    }
    if (scatter_applies(shape)) {
        if (shape->dtype == UMT_BF16)
            LAUNCH_OVER(shape->n * shape->c * shape->p * shape->q, max_pool_backward_lp_scatter_kernel<UMT_BF16>, *shape, argmax, dy, dx);
        else
            LAUNCH_OVER(shape->n * shape->c * shape->p * shape->q, max_pool_backward_lp_scatter_kernel<UMT_F16>, *shape, argmax, dy, dx);
        return UMT_OK;
    }
    LAUNCH_OVER(shape->n * shape->c * shape->h * shape->w, max_pool_backward_lp_kernel, *shape, argmax, dy, dx);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_avg_pool_forward_lp(const umt_pool_shape *shape, const void *x, void *y) {
    UMT_TRY(check_pool_shape_lp("avg_pool_forward_lp", shape));
    LAUNCH_OVER(shape->n * shape->c * shape->p * shape->q, avg_pool_forward_lp_kernel, *shape, x, y);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_avg_pool_backward_lp(const umt_pool_shape *shape, const void *dy, void *dx) {
    UMT_TRY(check_pool_shape_lp("avg_pool_backward_lp", shape));
    LAUNCH_OVER(shape->n * shape->c * shape->h * shape->w, avg_pool_backward_lp_kernel, *shape, dy, dx);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_pick_scatter(const umt_pool_shape *s, const uint8_t *pick, const void *dy, void *dx,
                                            bool fresh) {
    UMT_TRY(umt_cpu_check_pool_shape("bias_relu_max_pool_dropout_backward", s));
    if (!scatter_applies(s) || s->window > 16)
        return umt_fail(UMT_ERR_UNSUPPORTED,
                        "bias_relu_max_pool_dropout_backward: window %lld, stride %lld, %lld elements (expected stride "
                        ">= window, window <= 16, fewer than 2^31 elements)", (long long)s->window, (long long)s->stride,
                        (long long)(s->n * s->c * s->h * s->w));
    bool tiles = umt_pool_windows_tile(s);
    int64_t outputs = s->n * s->c * s->p * s->q;
    if (fresh && tiles && s->dtype == UMT_F32 && !s->nhwc) {
        umt_fast_divisor by_plane = umt_fast_divisor_of((int)(s->p * s->q)), by_q = umt_fast_divisor_of((int)s->q);
        bool pairs = s->window == 2 && s->w % 2 == 0 && (uintptr_t)dx % sizeof(float2) == 0;
        auto kernel = pairs ? pick_write_f32_kernel<true> : pick_write_f32_kernel<false>;
        LAUNCH_OVER(outputs, kernel, *s, by_plane, by_q, pick, (const float *)dy, (float *)dx);
        return UMT_OK;
    }
    if (fresh && tiles && s->dtype != UMT_F32 && lanes_apply(s, dy, dx, pick)) {
        if (s->dtype == UMT_BF16)
            LAUNCH_OVER(outputs / LANES, pick_write_nhwc8_kernel<UMT_BF16>, *s, (const uint64_t *)pick,
                        (const uint4 *)dy, (uint4 *)dx);
        else
            LAUNCH_OVER(outputs / LANES, pick_write_nhwc8_kernel<UMT_F16>, *s, (const uint64_t *)pick,
                        (const uint4 *)dy, (uint4 *)dx);
        return UMT_OK;
    }
    if (fresh)
        UMT_CUDA_TRY(cudaMemsetAsync(dx, 0, (size_t)(s->n * s->c * s->h * s->w) * umt_dtype_size(s->dtype),
                                     umt_cuda_stream()));
    switch (s->dtype) {
    case UMT_BF16: LAUNCH_OVER(outputs, pick_scatter_kernel<UMT_BF16>, *s, pick, dy, dx); break;
    case UMT_F16: LAUNCH_OVER(outputs, pick_scatter_kernel<UMT_F16>, *s, pick, dy, dx); break;
    default: LAUNCH_OVER(outputs, pick_scatter_kernel<UMT_F32>, *s, pick, dy, dx); break;
    }
    return UMT_OK;
}
