/* tests/synthetic_mnist.c — see synthetic_mnist.h. */
#include "tests/synthetic_mnist.h"

#include <stdint.h>
#include <stdio.h>

enum { SIDE = 28 };

static void write_be32(FILE *f, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) fputc((int)(v >> shift) & 0xff, f);
}

static void write_image(FILE *f, int label, synthetic_pixels pixels, uint32_t *seed) {
    for (int p = 0; p < SIDE * SIDE; ++p) {
        *seed = *seed * 1664525u + 1013904223u;
        int row = p / SIDE, column = p % SIDE;
        int stripe = row % 10 == label || column % 10 == label;
        fputc(pixels == SYNTHETIC_NOISE ? (int)(*seed >> 24) : stripe ? 255 : 0, f);
    }
}

int synthetic_mnist_write(const char *dir, const char *split, int n, synthetic_pixels pixels) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, split);
    FILE *images = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, split);
    FILE *labels = fopen(path, "wb");
    if (!images || !labels) {
        if (images) fclose(images);
        if (labels) fclose(labels);
        return -1;
    }
    write_be32(images, 0x803);
    write_be32(images, (uint32_t)n);
    write_be32(images, SIDE);
    write_be32(images, SIDE);
    write_be32(labels, 0x801);
    write_be32(labels, (uint32_t)n);
    uint32_t seed = 7;
    for (int i = 0; i < n; ++i) {
        write_image(images, i % 10, pixels, &seed);
        fputc(i % 10, labels);
    }
    return fclose(images) | fclose(labels);
}
