/*
 * kernels/cuda/data.cu — gathering a batch out of a u8 dataset on the device.
 *
 * As in kernels/cpu/data.c, a pixel has only 256 values, so normalisation is a table lookup.
 * The table is computed on the host with the CPU file's very expression, (v / 255 - mean) / std
 * in f32, so the batch matches the CPU (and PyTorch) bit for bit; it travels as a kernel
 * parameter and each block copies it into shared memory, where threads of a warp reading
 * different entries do not serialise as they would on the parameter (constant) bank.
 *
 * indices, like every pointer here, is device memory (kernels/backend.h).
 */
#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/float16.h"
#include "kernels/cuda/launch.h"

enum { PIXEL_VALUES = 256 };

typedef struct {
    float value[PIXEL_VALUES];
} normalise_table;

/* A batch's element type: f32, or the 16 bits of a bf16/f16 (D). */
template <umt_dtype D> struct element { typedef uint16_t type; };
template <> struct element<UMT_F32> { typedef float type; };

/* A table value as a batch of dtype D stores it: as it is in f32, else rounded once (as recast
 * rounds an f32 value). */
template <umt_dtype D> static __device__ typename element<D>::type stored(float value) {
    if constexpr (D == UMT_F32) return value;
    else return umt_dev_narrow<D>(value);
}

/* The table into shared memory as a batch of dtype D stores it (every thread of the block). */
template <umt_dtype D>
static __device__ void load_table(const normalise_table &table, typename element<D>::type *shared_table) {
    for (int v = threadIdx.x; v < PIXEL_VALUES; v += blockDim.x) shared_table[v] = stored<D>(table.value[v]);
    __syncthreads();
}

/* images_out[i] = table[samples[indices[i]]] and labels_out[i] = labels[indices[i]]: a block per
 * image (grid-strided), its threads across the image's pixels, so that no thread divides to find
 * its row (a 64-bit division per pixel made this small kernel slow: docs/PERF.md, "Figures behind
 * the comments"); the block's first thread takes the label, so that a step's batch is one launch,
 * not two. The table is kept in shared memory as the batch stores it; samples are stored C,H,W
 * and the batch N,H,W,C, which is one order for one channel (an f32 batch is gathered as one
 * channel of c * hw pixels: its own C,H,W order), else pixel p of channel ch goes to p * c + ch. */
template <umt_dtype D>
static __global__ void gather_batch_kernel(const uint8_t *samples, const uint8_t *labels, const int64_t *indices,
                                           int64_t count, int64_t c, int64_t hw, normalise_table table,
                                           typename element<D>::type *images_out, int32_t *labels_out) {
    __shared__ typename element<D>::type shared_table[PIXEL_VALUES];
    load_table<D>(table, shared_table);
    int64_t sample_numel = c * hw;
    for (int64_t row = blockIdx.x; row < count; row += gridDim.x) {
        int64_t index = indices[row];
        if (threadIdx.x == 0) labels_out[row] = labels[index];
        const uint8_t *sample = samples + index * sample_numel;
        typename element<D>::type *image = images_out + row * sample_numel;
        if (c == 1) {
            for (int64_t j = threadIdx.x; j < hw; j += blockDim.x) image[j] = shared_table[sample[j]];
        } else {
            for (int64_t j = threadIdx.x; j < sample_numel; j += blockDim.x) {
                int64_t ch = j / hw, p = j - ch * hw;
                image[p * c + ch] = shared_table[sample[j]];
            }
        }
    }
}

/* The same gather where each image is one channel of whole 16-byte vectors at 16-byte aligned
 * places on both sides (MNIST's 784 pixels are 49 vectors): a thread a vector, one load of
 * sixteen pixels and their stores as vectors, and a block takes as many images as its threads
 * hold (five of MNIST's), so a batch of 4096 is one wave of blocks, where a block an image
 * looped over its image's bytes one at a time. The same table values land in the same places. */
template <umt_dtype D>
static __global__ void gather_vectors_kernel(const uint4 *samples, const uint8_t *labels, const int64_t *indices,
                                             int64_t count, int vectors, normalise_table table,
                                             typename element<D>::type *images_out, int32_t *labels_out) {
    typedef typename element<D>::type stored_type;
    __shared__ stored_type shared_table[PIXEL_VALUES];
    load_table<D>(table, shared_table);
    int per_block = (int)blockDim.x / vectors, local = (int)threadIdx.x / vectors, v = (int)threadIdx.x % vectors;
    if (local >= per_block) return;
    for (int64_t row = (int64_t)blockIdx.x * per_block + local; row < count; row += (int64_t)gridDim.x * per_block) {
        int64_t index = indices[row];
        if (v == 0) labels_out[row] = labels[index];
        uint4 bytes = samples[index * vectors + v];
        const uint8_t *pixel = (const uint8_t *)&bytes;
        uint4 out[sizeof(stored_type)]; /* sixteen values of sizeof(stored_type) bytes */
        stored_type *value = (stored_type *)out;
#pragma unroll
        for (int k = 0; k < 16; k++) value[k] = shared_table[pixel[k]];
        uint4 *image = (uint4 *)(images_out + (row * vectors + v) * 16);
#pragma unroll
        for (int k = 0; k < (int)sizeof(stored_type); k++) image[k] = out[k];
    }
}

/* Whether gather_vectors_kernel applies: one channel, whole vectors, both ends 16-byte aligned,
 * and at least one image's vectors to a block. */
static bool gathers_vectors(const void *samples, const void *images_out, int64_t c, int64_t hw) {
    return c == 1 && hw % 16 == 0 && hw / 16 <= THREADS && ((uintptr_t)samples | (uintptr_t)images_out) % 16 == 0;
}

/* The table: the CPU file's expression for each pixel value. */
static normalise_table table_for(float mean, float std) {
    normalise_table table;
    for (int v = 0; v < PIXEL_VALUES; v++) table.value[v] = ((float)v / 255.0f - mean) / std;
    return table;
}

/* The launch: a vector a thread where gather_vectors_kernel applies, else a block per image, as
 * many as a grid takes. */
template <umt_dtype D>
static umt_status gather(const uint8_t *samples, const uint8_t *labels, const int64_t *indices, int64_t count,
                         int64_t c, int64_t hw, float mean, float std, void *images_out, int32_t *labels_out) {
    if (count <= 0) return UMT_OK;
    if (gathers_vectors(samples, images_out, c, hw)) {
        int vectors = (int)(hw / 16);
        int64_t per_block = THREADS / vectors, wanted = (count + per_block - 1) / per_block;
        unsigned int blocks = wanted < MAX_BLOCKS ? (unsigned int)wanted : (unsigned int)MAX_BLOCKS;
        gather_vectors_kernel<D><<<blocks, THREADS, 0, umt_cuda_stream()>>>(
            (const uint4 *)samples, labels, indices, count, vectors, table_for(mean, std),
            (typename element<D>::type *)images_out, labels_out);
        UMT_CUDA_LAUNCHED();
        return UMT_OK;
    }
    unsigned int blocks = count < MAX_BLOCKS ? (unsigned int)count : (unsigned int)MAX_BLOCKS;
    gather_batch_kernel<D><<<blocks, THREADS, 0, umt_cuda_stream()>>>(
        samples, labels, indices, count, c, hw, table_for(mean, std), (typename element<D>::type *)images_out,
        labels_out);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_gather_batch_lp(umt_dtype dtype, const uint8_t *samples, const uint8_t *labels,
                                               const int64_t *indices, int64_t count, int64_t c, int64_t hw,
                                               float mean, float std, void *images_out, int32_t *labels_out) {
    UMT_TRY(umt_cuda_check_half("gather_batch_lp", dtype));
    auto launch = dtype == UMT_BF16 ? gather<UMT_BF16> : gather<UMT_F16>;
    return launch(samples, labels, indices, count, c, hw, mean, std, images_out, labels_out);
}

extern "C" umt_status umt_cuda_gather_batch(const uint8_t *samples, const uint8_t *labels, const int64_t *indices,
                                            int64_t count, int64_t sample_numel, float mean, float std,
                                            float *images_out, int32_t *labels_out) {
    return gather<UMT_F32>(samples, labels, indices, count, 1, sample_numel, mean, std, images_out, labels_out);
}
