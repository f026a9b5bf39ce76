/*
 * kernels/cuda/loss.cu — mean, log-softmax, negative log-likelihood, softmax cross-entropy and
 * accuracy counting, each next to its backward (kernels/cpu/loss.c is the reference).
 *
 * Rows are samples, columns classes. A softmax row is one block: the threads stride over the
 * columns and combine their row maximum and sum of exponentials with a block reduction. Sums
 * are in double, as on the CPU, so results agree with it to float rounding.
 *
 * Scalar results (mean, the losses) are reduced deterministically, in two passes: each block
 * (for the softmax loss of rows of at most 32 columns, each warp's group of rows) writes its
 * partial sum into `partials`, then one block adds those in a fixed order. No float atomics, so
 * the same inputs always give the same bits.
 *
 * Labels are checked on the device. In the losses and their backwards every block first scans
 * all the labels (a batch's few thousand ints, read from L2) for the lowest row whose label is
 * out of range, so that no block writes anything when one is (outputs stay untouched, as on the
 * CPU), without a launch of its own before the op's. They never wait for that verdict: block 0
 * latches the first bad label (the op, row, value) into `verdict`, and the next host read
 * (umt_cuda_download, umt_cuda_synchronize) turns it into the CPU's error message.
 * So a training step queues without a single host wait, and can be captured into a CUDA graph;
 * and a loss is one launch, its backward another (the last block of the loss's grid, which the
 * counter in `report` names, adds the blocks' partial sums). count_correct returns a host count
 * anyway: a kernel records the lowest bad row in `report`, and it waits and reports at once.
 *
 * `partials`, `report` and `verdict` are the context's own (its scratch, kernels/cuda/scratch.h): a
 * context's calls run in order on its stream, so they never overlap on the device, and two
 * contexts on two streams never share them.
 */
#include <math.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/scratch.h"

/* THREADS must be a multiple of the warp size (32) for block_reduce. */
enum { MAX_PARTIALS = UMT_LOSS_PARTIALS };

#define NO_BAD_ROW 0xffffffffffffffffull

typedef struct {
    unsigned long long first_bad_row; /* count_correct's check: NO_BAD_ROW when every label is in range */
    unsigned long long correct;       /* count_correct's result */
    unsigned int blocks_done;         /* a loss's blocks finished so far (0 between launches) */
} label_report;

/* The ops whose verdict is deferred, by the code `verdict` records. */
static const char *const deferred_ops[] = {"nll_loss", "nll_loss_backward", "softmax_xent", "softmax_xent_backward"};
enum { NLL_LOSS, NLL_LOSS_BACKWARD, SOFTMAX_XENT, SOFTMAX_XENT_BACKWARD };

/* The first bad label a deferred check found since the host last looked (op < 0: none). */
typedef struct {
    int op;
    int label;
    long long row, cols;
} label_verdict;

static_assert(sizeof(label_report) <= UMT_LABEL_SLOT_BYTES && sizeof(label_verdict) <= UMT_LABEL_SLOT_BYTES,
              "the label slots of scratch.h hold a report and a verdict");

/* The context's partials, label report and verdict (its scratch), handed to each kernel. */
typedef struct {
    double *partials; /* MAX_PARTIALS */
    label_report *report;
    label_verdict *verdict;
} loss_scratch;

static umt_status scratch_for(const char *op, loss_scratch *out) {
    const umt_cuda_scratch *scratch;
    UMT_TRY(umt_cuda_scratch_get(op, &scratch));
    *out = loss_scratch{scratch->loss_partials, (label_report *)scratch->label_report,
                        (label_verdict *)scratch->label_verdict};
    return UMT_OK;
}

extern "C" umt_status umt_cuda_label_scratch_clear(const umt_cuda_scratch *scratch, cudaStream_t stream) {
    static const label_report clear_report = {NO_BAD_ROW, 0, 0};
    static const label_verdict no_verdict = {-1, 0, 0, 0};
    UMT_CUDA_TRY(cudaMemcpyAsync(scratch->label_report, &clear_report, sizeof clear_report, cudaMemcpyHostToDevice,
                                 stream));
    UMT_CUDA_TRY(cudaMemcpyAsync(scratch->label_verdict, &no_verdict, sizeof no_verdict, cudaMemcpyHostToDevice,
                                 stream));
    return UMT_OK;
}

/* Blocks for a kernel that writes one partial sum per block. */
static unsigned int partial_blocks_for(int64_t n, int64_t per_block) {
    int64_t blocks = (n + per_block - 1) / per_block;
    return blocks < 1 ? 1u : blocks > MAX_PARTIALS ? (unsigned int)MAX_PARTIALS : (unsigned int)blocks;
}

/* ------------------------------------------------------------------------------------------ */
/* Block reduction                                                                             */

static __device__ double combine(double a, double b, bool take_max) { return take_max ? (b > a ? b : a) : a + b; }

/* The sum (or maximum) of v over the block, returned to every thread. All threads of the block
 * must call it. Warps reduce with shuffles, then warp 0 reduces the warps' results; the order
 * is fixed, so the result is deterministic. */
static __device__ double block_reduce(double v, bool take_max) {
    __shared__ double warp_results[32];
    __shared__ double result;
    const double identity = take_max ? -INFINITY : 0.0;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset), take_max);
    /* A previous call's readers of warp_results and result must be done before they change. */
    __syncthreads();
    if (lane == 0) warp_results[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? warp_results[lane] : identity;
        for (int offset = 16; offset > 0; offset /= 2) {
            v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset), take_max);
        }
        if (lane == 0) result = v;
    }
    __syncthreads();
    return result;
}

/* A row of logits in dtype D, read as f32 (bf16/f16 widened exactly) by x[c]: what the row
 * functions below take, besides a plain float pointer. */
template <umt_dtype D> struct half_row {
    const uint16_t *x;
    __device__ float operator[](int64_t c) const { return umt_dev_widen<D>(x[c]); }
};

/* The row's maximum, ignoring NaNs like the CPU's strict ">" (-inf for an empty row). */
template <typename Row> static __device__ float row_max(Row x, int64_t cols) {
    float max = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        if (x[c] > max) max = x[c];
    }
    return (float)block_reduce(max, true);
}

/* block_reduce's first stage alone: the sum (or maximum) of v over the warp, every lane's. When
 * only warp 0 holds values (a row of at most 32 columns, one per thread), block_reduce's second
 * stage combines this with identities (+ 0.0, max with -inf), so this is its result, bit for bit. */
static __device__ double warp_reduce(double v, bool take_max) {
    for (int offset = 16; offset > 0; offset /= 2) v = combine(v, __shfl_xor_sync(0xffffffffu, v, offset), take_max);
    return v;
}

/* log(sum_c exp(x[c] - max)), never overflowing. */
template <typename Row> static __device__ double shifted_log_sum_exp(Row x, int64_t cols, float max) {
    double sum = 0.0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += exp((double)x[c] - max);
    return log(block_reduce(sum, false));
}

/* out[0] = sign * (sum of partials[0, count)) / divisor, by the whole block, in a fixed order.
 * The loads bypass L1: a loss's last block reads partials that other blocks wrote. */
static __device__ void write_mean(loss_scratch s, int count, double sign, double divisor, float *out) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) sum += __ldcg(&s.partials[i]);
    sum = block_reduce(sum, false);
    if (threadIdx.x == 0) out[0] = (float)(sign * sum / divisor);
}

/* out[0] = the mean of x from its blocks' partials (umt_cuda_mean's second launch). */
static __global__ void finish_mean_kernel(loss_scratch s, int count, double divisor, float *out) {
    write_mean(s, count, 1.0, divisor, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Label checks                                                                                */

/* The lowest row whose label is out of range (NO_BAD_ROW when none), found by the whole block
 * (every thread must call it): each block of a loss finds the same one. A thread reads
 * SCAN_LOADS of its rows at once before it looks at any: one at a time, each load waited for
 * the one before (the check's branch comes first), and every block of a loss scans all labels. */
enum { SCAN_LOADS = 4 };
static __device__ unsigned long long lowest_bad_row(const int32_t *labels, int64_t rows, int64_t cols) {
    __shared__ unsigned long long lowest;
    if (threadIdx.x == 0) lowest = NO_BAD_ROW;
    __syncthreads();
    bool found = false;
    for (int64_t first = threadIdx.x; first < rows && !found; first += SCAN_LOADS * (int64_t)blockDim.x) {
        int32_t label[SCAN_LOADS];
#pragma unroll
        for (int u = 0; u < SCAN_LOADS; u++) {
            int64_t r = first + u * (int64_t)blockDim.x;
            label[u] = r < rows ? __ldg(&labels[r]) : 0;
        }
#pragma unroll
        for (int u = 0; u < SCAN_LOADS; u++) {
            int64_t r = first + u * (int64_t)blockDim.x;
            if (!found && r < rows && (label[u] < 0 || label[u] >= cols)) {
                atomicMin(&lowest, (unsigned long long)r); /* a minimum: the same whatever the order */
                found = true; /* this thread's later rows are higher */
            }
        }
    }
    __syncthreads();
    return lowest;
}

/* Keeps the first bad label for the host (a later one does not overwrite it): one thread. */
static __device__ void latch_verdict(loss_scratch s, int op, const int32_t *labels, unsigned long long row,
                                     int64_t cols) {
    if (s.verdict->op < 0) *s.verdict = label_verdict{op, labels[row], (long long)row, (long long)cols};
}

/* Whether this block is the last of its grid to finish: every other block's writes are then
 * visible to it. The last one sets the count back to 0 for the next launch (a replayed graph's
 * too). Every thread must call it, after its writes. */
static __device__ bool finishes_last(loss_scratch s) {
    __shared__ bool last;
    __threadfence(); /* this block's partial is visible to every block before the count says so */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&s.report->blocks_done, 1u) == gridDim.x - 1;
        if (last) s.report->blocks_done = 0;
    }
    __syncthreads();
    return last;
}

/* Whether every label is in range. If not, block 0 latches the verdict for op, and the caller's
 * block returns having written nothing. Every thread must call it. */
static __device__ bool labels_in_range(loss_scratch s, int op, const int32_t *labels, int64_t rows, int64_t cols) {
    unsigned long long bad = lowest_bad_row(labels, rows, cols);
    if (bad == NO_BAD_ROW) return true;
    if (blockIdx.x == 0 && threadIdx.x == 0) latch_verdict(s, op, labels, bad, cols);
    return false;
}

static __global__ void reset_report_kernel(loss_scratch s) {
    s.report->first_bad_row = NO_BAD_ROW;
    s.report->correct = 0;
}

/* count_correct's check: the lowest bad row into the report, which the kernel after it reads. */
static __global__ void check_labels_kernel(loss_scratch s, const int32_t *labels, int64_t rows, int64_t cols) {
    FOR_EACH_INDEX(r, rows) {
        if (labels[r] < 0 || labels[r] >= cols) atomicMin(&s.report->first_bad_row, (unsigned long long)r);
    }
}

/* Queues that check. The report is clear here: it starts clear, and finish_label_check clears it. */
static umt_status start_label_check(loss_scratch s, const int32_t *labels, int64_t rows, int64_t cols) {
    check_labels_kernel<<<blocks_for(rows), THREADS, 0, umt_cuda_stream()>>>(s, labels, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* Called by the host reads after their wait (the stream is idle): the CPU's error for the first
 * bad label a loss met since the last read, and the verdict cleared. */
extern "C" umt_status umt_cuda_take_label_verdict(void) {
    loss_scratch s;
    UMT_TRY(scratch_for("label check", &s));
    label_verdict host;
    UMT_CUDA_TRY(cudaMemcpyAsync(&host, s.verdict, sizeof host, cudaMemcpyDeviceToHost, umt_cuda_stream()));
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    if (host.op < 0) return UMT_OK;
    const label_verdict none = {-1, 0, 0, 0};
    UMT_CUDA_TRY(cudaMemcpyAsync(s.verdict, &none, sizeof none, cudaMemcpyHostToDevice, umt_cuda_stream()));
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: row %lld has label %d, expected 0 <= label < %lld",
                    deferred_ops[host.op], host.row, host.label, host.cols);
}

/* Waits for count_correct's kernels and turns a reported label into the CPU's error message
 * (the lowest bad row, as the CPU's first-to-last scan finds), leaving the report clear. */
static umt_status finish_label_check(loss_scratch s, const char *op, const int32_t *labels, int64_t cols,
                                     int64_t *correct) {
    label_report host;
    UMT_CUDA_TRY(cudaMemcpyAsync(&host, s.report, sizeof host, cudaMemcpyDeviceToHost, umt_cuda_stream()));
    reset_report_kernel<<<1, 1, 0, umt_cuda_stream()>>>(s);
    UMT_CUDA_LAUNCHED();
    UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
    if (host.first_bad_row != NO_BAD_ROW) {
        int32_t label;
        UMT_CUDA_TRY(cudaMemcpyAsync(&label, labels + host.first_bad_row, sizeof label, cudaMemcpyDefault,
                                     umt_cuda_stream()));
        UMT_CUDA_TRY(cudaStreamSynchronize(umt_cuda_stream()));
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: row %lld has label %d, expected 0 <= label < %lld", op,
                        (long long)host.first_bad_row, (int)label, (long long)cols);
    }
    *correct = (int64_t)host.correct;
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Mean                                                                                        */

static __global__ void sum_partials_kernel(loss_scratch s, const float *x, int64_t n) {
    double sum = 0.0;
    FOR_EACH_INDEX(i, n) sum += x[i];
    sum = block_reduce(sum, false);
    if (threadIdx.x == 0) s.partials[blockIdx.x] = sum;
}

static __global__ void mean_backward_kernel(const float *dout, float *dx, int64_t n) {
    float share = (float)((double)dout[0] / (double)n);
    FOR_EACH_INDEX(i, n) dx[i] += share;
}

extern "C" umt_status umt_cuda_mean(const float *x, float *out, int64_t n) {
    loss_scratch s;
    UMT_TRY(scratch_for("mean", &s));
    /* The grid depends on n only, so the summation order (and the result) is reproducible. */
    unsigned int blocks = partial_blocks_for(n, THREADS);
    sum_partials_kernel<<<blocks, THREADS, 0, umt_cuda_stream()>>>(s, x, n);
    UMT_CUDA_LAUNCHED();
    finish_mean_kernel<<<1, THREADS, 0, umt_cuda_stream()>>>(s, (int)blocks, (double)n, out);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_mean_backward(const float *dout, float *dx, int64_t n) {
    if (n <= 0) return UMT_OK;
    mean_backward_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(dout, dx, n);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Log-softmax                                                                                 */

/* One block per row (striding over rows when there are more rows than blocks). */
static __global__ void log_softmax_kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x_row = x + r * cols;
        float *y_row = y + r * cols;
        float max = row_max(x_row, cols);
        double log_sum = shifted_log_sum_exp(x_row, cols, max);
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y_row[c] = (float)((double)x_row[c] - max - log_sum);
    }
}

/* dx += dy - exp(y) * sum_c dy, per row; exp(y) is the softmax, so y is all it needs. */
static __global__ void log_softmax_backward_kernel(const float *y, const float *dy, float *dx, int64_t rows,
                                                   int64_t cols) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *y_row = y + r * cols, *dy_row = dy + r * cols;
        float *dx_row = dx + r * cols;
        double dy_sum = 0.0;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dy_sum += dy_row[c];
        dy_sum = block_reduce(dy_sum, false);
        /* Separate multiply and subtract (no fused DFMA), as the CPU rounds them. */
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            dx_row[c] += (float)__dsub_rn(dy_row[c], __dmul_rn(exp((double)y_row[c]), dy_sum));
        }
    }
}

/* One block per row, capped: the row kernels stride over the rest. */
static unsigned int row_blocks_for(int64_t rows) {
    return rows < 1 ? 1u : rows > MAX_BLOCKS ? (unsigned int)MAX_BLOCKS : (unsigned int)rows;
}

extern "C" umt_status umt_cuda_log_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (rows <= 0) return UMT_OK;
    log_softmax_kernel<<<row_blocks_for(rows), THREADS, 0, umt_cuda_stream()>>>(x, y, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_log_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows,
                                                    int64_t cols) {
    if (rows <= 0) return UMT_OK;
    log_softmax_backward_kernel<<<row_blocks_for(rows), THREADS, 0, umt_cuda_stream()>>>(y, dy, dx, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Negative log-likelihood                                                                     */

/* The blocks' partial sums of logp[r, label r]; the last block to finish makes the loss. */
static __global__ void nll_loss_kernel(loss_scratch s, const float *logp, const int32_t *labels, float *loss,
                                       int64_t rows, int64_t cols) {
    if (!labels_in_range(s, NLL_LOSS, labels, rows, cols)) return;
    double sum = 0.0;
    FOR_EACH_INDEX(r, rows) sum += logp[r * cols + labels[r]];
    sum = block_reduce(sum, false);
    if (threadIdx.x == 0) s.partials[blockIdx.x] = sum;
    if (finishes_last(s)) write_mean(s, (int)gridDim.x, -1.0, (double)rows, loss);
}

static __global__ void nll_loss_backward_kernel(loss_scratch s,
                                                const float *dloss, const int32_t *labels, float *dlogp, int64_t rows,
                                                int64_t cols) {
    if (!labels_in_range(s, NLL_LOSS_BACKWARD, labels, rows, cols)) return;
    float share = (float)(-(double)dloss[0] / (double)rows);
    FOR_EACH_INDEX(r, rows) dlogp[r * cols + labels[r]] += share;
}

extern "C" umt_status umt_cuda_nll_loss(const float *logp, const int32_t *labels, float *loss, int64_t rows,
                                        int64_t cols) {
    loss_scratch s;
    UMT_TRY(scratch_for("nll_loss", &s));
    nll_loss_kernel<<<partial_blocks_for(rows, THREADS), THREADS, 0, umt_cuda_stream()>>>(s, logp, labels, loss, rows,
                                                                                          cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_nll_loss_backward(const float *dloss, const int32_t *labels, float *dlogp,
                                                 int64_t rows, int64_t cols) {
    loss_scratch s;
    UMT_TRY(scratch_for("nll_loss_backward", &s));
    nll_loss_backward_kernel<<<blocks_for(rows), THREADS, 0, umt_cuda_stream()>>>(s, dloss, labels, dlogp, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Softmax cross-entropy                                                                       */

/* A row of at most 32 columns by one warp, lane c holding column c: probs = softmax(row), and the
 * row's -log p[label] returned to every lane. The same arithmetic as the block's rows below
 * (row_max, shifted_log_sum_exp: warp_reduce is their block_reduce here), so the same bits. */
template <typename Row>
static __device__ double warp_row_loss(Row x_row, float *p_row, int32_t label, int64_t cols) {
    int lane = threadIdx.x % 32;
    float x = lane < cols ? x_row[lane] : 0.0f, own = -INFINITY;
    if (lane < cols && x > own) own = x; /* as row_max: a NaN never becomes the maximum */
    float max = (float)warp_reduce(own, true);
    double log_sum = log(warp_reduce(lane < cols ? exp((double)x - max) : 0.0, false));
    if (lane < cols) p_row[lane] = (float)exp((double)x - max - log_sum);
    return log_sum - ((double)x_row[label] - max);
}

/* Row r of logits of dtype D: a float pointer for f32, else a half_row. */
template <umt_dtype D> static __device__ auto logits_row(const void *logits, int64_t r, int64_t cols) {
    if constexpr (D == UMT_F32) return (const float *)logits + r * cols;
    else return half_row<D>{(const uint16_t *)logits + r * cols};
}

/* The loss's partial sums: group g of G = partial_blocks_for(rows, 1) takes rows g, g + G, g + 2G,
 * ... and sums their -log p[label] in that order, from 0.0; the last block to finish adds the G
 * partials (write_mean). Rows of any width are a block's, a group a block. */
template <umt_dtype D>
static __device__ double block_rows_loss(const void *logits, const int32_t *labels, float *probs, int64_t rows,
                                         int64_t cols) {
    double block_loss = 0.0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        auto x_row = logits_row<D>(logits, r, cols);
        float *p_row = probs + r * cols;
        float max = row_max(x_row, cols);
        double log_sum = shifted_log_sum_exp(x_row, cols, max);
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            p_row[c] = (float)exp((double)x_row[c] - max - log_sum);
        }
        block_loss += log_sum - ((double)x_row[labels[r]] - max);
    }
    return block_loss;
}

/* probs = softmax(row) for every row, and the mean of the rows' -log p[label]: each group's rows
 * summed into its partial, and the last block to finish makes the loss. The loss is taken from
 * the logits, not from probs: a probability that underflowed to 0 would give an infinite loss
 * where the true one is merely large. D: the logits' dtype (bf16/f16 ones widened as they are
 * read). A group a block: rows of any width. */
template <umt_dtype D>
static __global__ void softmax_xent_kernel(loss_scratch s, const void *logits, const int32_t *labels, float *probs,
                                           float *loss, int64_t rows, int64_t cols) {
    if (!labels_in_range(s, SOFTMAX_XENT, labels, rows, cols)) return;
    double block_loss = block_rows_loss<D>(logits, labels, probs, rows, cols);
    if (threadIdx.x == 0) s.partials[blockIdx.x] = block_loss;
    if (finishes_last(s)) write_mean(s, (int)gridDim.x, 1.0, (double)rows, loss);
}

/* The same for rows of at most 32 columns (MNIST's 10), a group a warp and eight a block: the
 * same partials and sum, so the same bits. A row of the whole block spent two block-wide
 * reductions on ten values (docs/PERF.md, "The loss by warps"), and a block a group made every
 * one of up to UMT_LOSS_PARTIALS blocks scan the labels and count itself done. */
template <umt_dtype D>
static __global__ void softmax_xent_warps_kernel(loss_scratch s, const void *logits, const int32_t *labels,
                                                 float *probs, float *loss, int64_t rows, int64_t cols, int groups) {
    if (!labels_in_range(s, SOFTMAX_XENT, labels, rows, cols)) return;
    int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g < groups) {
        double group_loss = 0.0;
        for (int64_t r = g; r < rows; r += groups)
            group_loss += warp_row_loss(logits_row<D>(logits, r, cols), probs + r * cols, labels[r], cols);
        if (threadIdx.x % 32 == 0) s.partials[g] = group_loss;
    }
    if (finishes_last(s)) write_mean(s, groups, 1.0, (double)rows, loss);
}

/* The loss's launch for logits of dtype D: by warps when a row fits one. */
template <umt_dtype D>
static void launch_softmax_xent(loss_scratch s, const void *logits, const int32_t *labels, float *probs, float *loss,
                                int64_t rows, int64_t cols) {
    unsigned int groups = partial_blocks_for(rows, 1);
    if (cols <= 32)
        softmax_xent_warps_kernel<D><<<(groups + THREADS / 32 - 1) / (THREADS / 32), THREADS, 0, umt_cuda_stream()>>>(
            s, logits, labels, probs, loss, rows, cols, (int)groups);
    else
        softmax_xent_kernel<D><<<groups, THREADS, 0, umt_cuda_stream()>>>(s, logits, labels, probs, loss, rows, cols);
}

/* Element i's share of the gradient, scale * (probs - onehot(labels)), scale = dloss[0] / rows. */
static __device__ float xent_gradient(float scale, const float *probs, const int32_t *labels, int64_t i,
                                      int64_t cols) {
    float onehot = i % cols == labels[i / cols] ? 1.0f : 0.0f;
    return __fmul_rn(scale, probs[i] - onehot);
}

/* dlogits += dloss[0] / rows * (probs - onehot(labels)) */
static __global__ void softmax_xent_backward_kernel(loss_scratch s,
                                                    const float *probs, const int32_t *labels, const float *dloss,
                                                    float *dlogits, int64_t rows, int64_t cols) {
    if (!labels_in_range(s, SOFTMAX_XENT_BACKWARD, labels, rows, cols)) return;
    float scale = (float)((double)dloss[0] / (double)rows);
    FOR_EACH_INDEX(i, rows * cols) dlogits[i] = __fadd_rn(dlogits[i], xent_gradient(scale, probs, labels, i, cols));
}

/* The same into a bf16/f16 gradient (D): the share as the f32 kernel adds it to a zeroed
 * gradient, then added to dlogits (unless fresh) and rounded once, as the recast back does. */
template <umt_dtype D>
static __global__ void softmax_xent_backward_half_kernel(loss_scratch s, const float *probs, const int32_t *labels,
                                                         const float *dloss, uint16_t *dlogits, int64_t rows,
                                                         int64_t cols, bool fresh) {
    if (!labels_in_range(s, SOFTMAX_XENT_BACKWARD, labels, rows, cols)) return;
    float scale = (float)((double)dloss[0] / (double)rows);
    FOR_EACH_INDEX(i, rows * cols) {
        float g = __fadd_rn(0.0f, xent_gradient(scale, probs, labels, i, cols));
        if (!fresh) g += umt_dev_widen<D>(dlogits[i]);
        dlogits[i] = umt_dev_narrow<D>(g);
    }
}

extern "C" umt_status umt_cuda_softmax_xent(const float *logits, const int32_t *labels, float *probs, float *loss,
                                            int64_t rows, int64_t cols) {
    loss_scratch s;
    UMT_TRY(scratch_for("softmax_xent", &s));
    launch_softmax_xent<UMT_F32>(s, logits, labels, probs, loss, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_softmax_xent_lp(umt_dtype dtype, const void *logits, const int32_t *labels,
                                               float *probs, float *loss, int64_t rows, int64_t cols) {
    UMT_TRY(umt_cuda_check_half("softmax_xent_lp", dtype));
    loss_scratch s;
    UMT_TRY(scratch_for("softmax_xent", &s));
    if (dtype == UMT_BF16) launch_softmax_xent<UMT_BF16>(s, logits, labels, probs, loss, rows, cols);
    else launch_softmax_xent<UMT_F16>(s, logits, labels, probs, loss, rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_softmax_xent_backward(const float *probs, const int32_t *labels, const float *dloss,
                                                     float *dlogits, int64_t rows, int64_t cols) {
    loss_scratch s;
    UMT_TRY(scratch_for("softmax_xent_backward", &s));
    int64_t n = rows * cols;
    softmax_xent_backward_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(s, probs, labels, dloss, dlogits,
                                                                                    rows, cols);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_softmax_xent_backward_lp(umt_dtype dtype, const float *probs, const int32_t *labels,
                                                        const float *dloss, void *dlogits, int64_t rows, int64_t cols,
                                                        bool fresh) {
    UMT_TRY(umt_cuda_check_half("softmax_xent_backward_lp", dtype));
    loss_scratch s;
    UMT_TRY(scratch_for("softmax_xent_backward", &s));
    auto kernel = dtype == UMT_BF16 ? softmax_xent_backward_half_kernel<UMT_BF16>
                                    : softmax_xent_backward_half_kernel<UMT_F16>;
    kernel<<<blocks_for(rows * cols), THREADS, 0, umt_cuda_stream()>>>(s, probs, labels, dloss, (uint16_t *)dlogits,
                                                                       rows, cols, fresh);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* A linear layer and the softmax cross-entropy as one op (the MNIST CNN's head)                */

/* fc2 and the loss of the MNIST CNN were seven short kernels on the step's critical path (the
 * product, its bias, the loss, the loss's backward, the input gradient's product and the bias
 * sum; the weight gradient's product beside them): docs/PERF.md, "fifteenth session". Here they
 * are three. The forward takes a row a warp when the classes fit the lanes: each block first
 * copies w (as f32, a row of in + 1 words, so that 32 lanes reading 32 rows at one k meet no
 * bank twice) into shared memory, and a row's logit c is then lane c's own sum over k, with no
 * shuffles; it writes the loss, and softmax - onehot for the backward. The backward's input
 * gradient is a thread an element; its weight and bias gradients, which nothing below waits for,
 * are the other kernel, which the op sends beside it (core/branch.h). */
enum { HEAD_SHARED = 48 * 1024 };

/* w [cols, in] of dtype D into shared w_s [cols][in + 1] as f32, by the whole block. */
template <umt_dtype D> static __device__ void head_stage_w(const uint16_t *w, float *w_s, int64_t in, int cols) {
    int n = cols * (int)in, row = (int)in; /* below 2^31: linear_xent_supports checks its bytes */
    for (int i = threadIdx.x; i < n; i += blockDim.x) w_s[i / row * (row + 1) + i % row] = umt_dev_widen<D>(w[i]);
}

/* This lane's logit (lane < cols; 0 for the others) of a row whose x lies in x_s: the dot product
 * with w's row summed over k in order, rounded to D as a half linear layer stores its product,
 * then the bias added and rounded again, as its bias pass stores it (add_rows_lp). */
template <umt_dtype D>
static __device__ float head_logit(const uint16_t *x_s, const float *w_s, const float *bias, int64_t in, int cols) {
    int lane = threadIdx.x % 32;
    if (lane >= cols) return 0.0f;
    const float *w_row = w_s + lane * (in + 1);
    /* Four sums over k (k % 4), so that each product need not wait for the one before. */
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t k = 0;
#pragma unroll 4
    for (; k + 4 <= in; k += 4)
        for (int j = 0; j < 4; j++) sum[j] = fmaf(umt_dev_widen<D>(x_s[k + j]), w_row[k + j], sum[j]);
    for (; k < in; k++) sum[k % 4] = fmaf(umt_dev_widen<D>(x_s[k]), w_row[k], sum[k % 4]);
    float dot = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    float product = umt_dev_widen<D>(umt_dev_narrow<D>(dot));
    return umt_dev_widen<D>(umt_dev_narrow<D>(product + bias[lane]));
}

/* The softmax of a row whose logit x lane c holds (c < cols), as warp_row_loss computes it: the
 * row's maximum and log-sum of exponentials, every lane's. */
static __device__ void head_softmax(float x, int cols, float *max, double *log_sum) {
    int lane = threadIdx.x % 32;
    float own = -INFINITY;
    if (lane < cols && x > own) own = x; /* as row_max: a NaN never becomes the maximum */
    *max = (float)warp_reduce(own, true);
    *log_sum = log(warp_reduce(lane < cols ? exp((double)x - *max) : 0.0, false));
}

/* loss = the mean over rows of -log softmax(x w^T + bias)[label]: softmax_xent_warps_kernel's
 * groups, partials and last block, with each row's logits made in the warp instead of read; and
 * for the backward, diff = softmax - onehot(label) in f32, as softmax_xent_backward computes it
 * from the probabilities. Shared memory: w_s, then each warp's row of x. */
template <umt_dtype D>
static __global__ void linear_xent_kernel(loss_scratch s, const uint16_t *x, const uint16_t *w, const float *bias,
                                          const int32_t *labels, float *diff, float *loss, int64_t rows, int64_t in,
                                          int cols, int groups) {
    extern __shared__ float head_shared[];
    float *w_s = head_shared;
    uint16_t *x_s = (uint16_t *)(w_s + cols * (in + 1)) + threadIdx.x / 32 * in;
    /* w's loads first, in flight while the labels are checked (shared memory only: a bad label
     * still leaves every output untouched). */
    head_stage_w<D>(w, w_s, in, cols);
    if (!labels_in_range(s, SOFTMAX_XENT, labels, rows, cols)) return;
    __syncthreads();
    int g = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (g < groups) {
        double group_loss = 0.0;
        for (int64_t r = g; r < rows; r += groups) {
            int32_t label = labels[r];
            for (int64_t k = lane; k < in; k += 32) x_s[k] = x[r * in + k];
            __syncwarp();
            float logit = head_logit<D>(x_s, w_s, bias, in, cols), max;
            double log_sum;
            head_softmax(logit, cols, &max, &log_sum);
            float at_label = __shfl_sync(0xffffffffu, logit, label);
            group_loss += log_sum - ((double)at_label - max);
            float p = (float)exp((double)logit - max - log_sum);
            if (lane < cols) diff[r * cols + lane] = p - (lane == label ? 1.0f : 0.0f);
            __syncwarp();
        }
        if (lane == 0) s.partials[g] = group_loss;
    }
    if (finishes_last(s)) write_mean(s, groups, 1.0, (double)rows, loss);
}

/* The logits' gradient of row r, class c, as softmax_xent_backward_half stores it: dloss / rows *
 * diff, rounded to D (and widened back for the products). */
template <umt_dtype D> static __device__ float head_grad(const float *diff, float scale, int64_t r, int c, int cols) {
    return umt_dev_widen<D>(umt_dev_narrow<D>(__fadd_rn(0.0f, __fmul_rn(scale, diff[r * cols + c]))));
}

/* The head's input gradient: a thread per element of dx, that row's logits' gradient times w over
 * the classes in order (written, or added to unless fresh). */
template <umt_dtype D>
static __global__ void linear_xent_dx_kernel(const uint16_t *w, const float *diff, const float *dloss, uint16_t *dx,
                                             bool dx_fresh, int64_t rows, int64_t in, int cols) {
    float scale = (float)((double)dloss[0] / (double)rows);
    FOR_EACH_INDEX(e, rows * in) {
        int64_t r = e / in, k = e - r * in;
        float v = 0.0f;
        for (int c = 0; c < cols; c++)
            v = fmaf(head_grad<D>(diff, scale, r, c, cols), umt_dev_widen<D>(w[c * in + k]), v);
        if (!dx_fresh) v += umt_dev_widen<D>(dx[e]);
        dx[e] = umt_dev_narrow<D>(v);
    }
}

/* The head's weight and bias gradients: a block takes HEAD_OUTPUTS elements of dw (then of dbias),
 * each summed over the rows by HEAD_GROUPS threads, thread g taking rows g, g + HEAD_GROUPS, ...
 * in order; the block then adds the groups' sums in order and adds the total to the element (the
 * same bits every run). */
enum { HEAD_OUTPUTS = 16, HEAD_GROUPS = THREADS / HEAD_OUTPUTS };

template <umt_dtype D>
static __global__ void linear_xent_dw_kernel(const uint16_t *x, const float *diff, const float *dloss, float *dw,
                                             float *dbias, int64_t rows, int64_t in, int cols) {
    __shared__ float part[HEAD_GROUPS][HEAD_OUTPUTS + 1];
    float scale = (float)((double)dloss[0] / (double)rows);
    int64_t weights = (int64_t)cols * in, outputs = weights + cols;
    int lane = threadIdx.x % HEAD_OUTPUTS, group = threadIdx.x / HEAD_OUTPUTS;
    int64_t o = (int64_t)blockIdx.x * HEAD_OUTPUTS + lane;
    bool weight = o < weights;
    int c = weight ? (int)(o / in) : (int)(o - weights);
    int64_t k = weight ? o - c * in : 0;
    float sum = 0.0f;
    if (o < outputs) {
        if (weight) {
#pragma unroll 4
            for (int64_t r = group; r < rows; r += HEAD_GROUPS)
                sum = fmaf(head_grad<D>(diff, scale, r, c, cols), umt_dev_widen<D>(x[r * in + k]), sum);
        } else {
#pragma unroll 4
            for (int64_t r = group; r < rows; r += HEAD_GROUPS) sum += head_grad<D>(diff, scale, r, c, cols);
        }
    }
    part[group][lane] = sum;
    __syncthreads();
    if (group != 0 || o >= outputs) return;
    float *to = weight ? (dw ? &dw[o] : NULL) : (dbias ? &dbias[o - weights] : NULL);
    if (!to) return;
    float total = 0.0f;
    for (int g = 0; g < HEAD_GROUPS; g++) total += part[g][lane];
    *to += total;
}

/* Shared memory of the forward kernel (bytes). */
static size_t head_forward_shared(int64_t in, int64_t cols) {
    return (size_t)(cols * (in + 1)) * sizeof(float) + (size_t)(THREADS / 32 * in) * sizeof(uint16_t);
}

extern "C" bool umt_cuda_linear_xent_supports(umt_dtype dtype, int64_t rows, int64_t in, int64_t cols) {
    return (dtype == UMT_BF16 || dtype == UMT_F16) && cols >= 1 && cols <= 32 && in >= 1 && rows >= 1 &&
           rows < INT32_MAX && head_forward_shared(in, cols) <= HEAD_SHARED;
}

static umt_status check_head(const char *op, umt_dtype dtype, int64_t rows, int64_t in, int64_t cols) {
    if (!umt_cuda_linear_xent_supports(dtype, rows, in, cols))
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: %s, %lld rows of %lld features, %lld classes (expected bf16 or f16, "
                        "at most 32 classes, and w's rows within 48 KiB as f32)", op, umt_dtype_name(dtype),
                        (long long)rows, (long long)in, (long long)cols);
    return UMT_OK;
}

extern "C" umt_status umt_cuda_linear_xent(umt_dtype dtype, const void *x, const void *w, const float *bias,
                                           const int32_t *labels, float *diff, float *loss, int64_t rows, int64_t in,
                                           int64_t cols) {
    UMT_TRY(check_head("linear_xent", dtype, rows, in, cols));
    loss_scratch s;
    UMT_TRY(scratch_for("softmax_xent", &s));
    unsigned int groups = partial_blocks_for(rows, 1), blocks = (groups + THREADS / 32 - 1) / (THREADS / 32);
    auto kernel = dtype == UMT_BF16 ? linear_xent_kernel<UMT_BF16> : linear_xent_kernel<UMT_F16>;
    kernel<<<blocks, THREADS, head_forward_shared(in, cols), umt_cuda_stream()>>>(
        s, (const uint16_t *)x, (const uint16_t *)w, bias, labels, diff, loss, rows, in, (int)cols, (int)groups);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_linear_xent_backward(umt_dtype dtype, const void *x, const void *w, const float *diff,
                                                    const float *dloss, void *dx, bool dx_fresh, float *dw,
                                                    float *dbias, int64_t rows, int64_t in, int64_t cols) {
    UMT_TRY(check_head("linear_xent_backward", dtype, rows, in, cols));
    bool bf16 = dtype == UMT_BF16;
    if (dw || dbias) {
        auto kernel = bf16 ? linear_xent_dw_kernel<UMT_BF16> : linear_xent_dw_kernel<UMT_F16>;
        unsigned int blocks = (unsigned int)((cols * in + cols + HEAD_OUTPUTS - 1) / HEAD_OUTPUTS);
        kernel<<<blocks, THREADS, 0, umt_cuda_stream()>>>((const uint16_t *)x, diff, dloss, dw, dbias, rows, in,
                                                          (int)cols);
        UMT_CUDA_LAUNCHED();
    }
    if (dx) {
        auto kernel = bf16 ? linear_xent_dx_kernel<UMT_BF16> : linear_xent_dx_kernel<UMT_F16>;
        kernel<<<blocks_for(rows * in), THREADS, 0, umt_cuda_stream()>>>((const uint16_t *)w, diff, dloss,
                                                                         (uint16_t *)dx, dx_fresh, rows, in, (int)cols);
        UMT_CUDA_LAUNCHED();
    }
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Accuracy                                                                                    */

/* One thread per row. Strictly greater: on a tie the lowest index wins, as in PyTorch's argmax. */
static __global__ void count_correct_kernel(loss_scratch s,
                                            const float *scores, const int32_t *labels, int64_t rows, int64_t cols) {
    if (s.report->first_bad_row != NO_BAD_ROW) return;
    FOR_EACH_INDEX(r, rows) {
        const float *row = scores + r * cols;
        int64_t best = 0;
        for (int64_t c = 1; c < cols; c++) {
            if (row[c] > row[best]) best = c;
        }
        if (best == labels[r]) atomicAdd(&s.report->correct, 1ull);
    }
}

extern "C" umt_status umt_cuda_count_correct(const float *scores, const int32_t *labels, int64_t rows, int64_t cols,
                                             int64_t *correct) {
    loss_scratch s;
    UMT_TRY(scratch_for("count_correct", &s));
    UMT_TRY(start_label_check(s, labels, rows, cols));
    count_correct_kernel<<<blocks_for(rows), THREADS, 0, umt_cuda_stream()>>>(s, scores, labels, rows, cols);
    UMT_CUDA_LAUNCHED();
    return finish_label_check(s, "count_correct", labels, cols, correct);
}
