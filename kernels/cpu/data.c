/*
 * kernels/cpu/data.c — gathering a batch out of a u8 dataset.
 *
 * A pixel has only 256 values, so the normalisation is a table lookup: the table is computed
 * with exactly the operations of torchvision's ToTensor then Normalize ((v / 255 - mean) / std
 * in f32), so a batch matches PyTorch's bit for bit.
 */
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

umt_status umt_cpu_gather_batch(const uint8_t *samples, const uint8_t *labels, const int64_t *indices, int64_t count,
                                int64_t sample_numel, float mean, float std, float *images_out, int32_t *labels_out) {
    float table[256];
    for (int v = 0; v < 256; v++) table[v] = ((float)v / 255.0f - mean) / std;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *src = samples + indices[i] * sample_numel;
        float *dst = images_out + i * sample_numel;
        for (int64_t j = 0; j < sample_numel; j++) dst[j] = table[src[j]];
        labels_out[i] = labels[indices[i]];
    }
    return UMT_OK;
}
