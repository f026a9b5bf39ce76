/*
 * tests/gpu/prototype_idx.h — a small learnable dataset for the GPU tests that train a CNN
 * (test_step_graph.c, test_dist_gpu.c): IDX files of noisy copies of ten random prototypes.
 */
#ifndef UMT_TESTS_GPU_PROTOTYPE_IDX_H
#define UMT_TESTS_GPU_PROTOTYPE_IDX_H

#include <stdint.h>

/* Makes the folder dir (a mkdtemp template ending in XXXXXX, rewritten with the folder's name),
 * and in it `images` (samples images of 28 x 28) and `labels` (10 classes): each image its class's
 * prototype, every pixel moved by a draw in [-spread, spread] and clamped to 0..255, from a
 * generator seeded with seed. 0, or -1 when a file cannot be made. */
int prototype_idx_write(char *dir, int samples, uint64_t seed, int spread);

/* Removes what prototype_idx_write made in dir. */
void prototype_idx_remove(const char *dir);

#endif /* UMT_TESTS_GPU_PROTOTYPE_IDX_H */
