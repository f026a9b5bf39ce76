/* tests/gpu/prototype_idx.c — see prototype_idx.h. */
#include "tests/gpu/prototype_idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { SIDE = 28, PIXELS = SIDE * SIDE, CLASSES = 10 };

static uint32_t next_random(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

static void write_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16), (unsigned char)(v >> 8),
                          (unsigned char)v};
    fwrite(b, 1, 4, f);
}

int prototype_idx_write(char *dir, int samples, uint64_t seed, int spread) {
    if (!mkdtemp(dir)) return -1;
    char path[256];
    snprintf(path, sizeof path, "%s/images", dir);
    FILE *images = fopen(path, "wb");
    snprintf(path, sizeof path, "%s/labels", dir);
    FILE *labels = fopen(path, "wb");
    if (!images || !labels) {
        if (images) fclose(images);
        if (labels) fclose(labels);
        return -1;
    }
    uint8_t prototypes[CLASSES][PIXELS], pixels[PIXELS];
    for (int c = 0; c < CLASSES; ++c)
        for (int p = 0; p < PIXELS; ++p) prototypes[c][p] = (uint8_t)(next_random(&seed) % 256);
    write_be32(images, 0x803), write_be32(images, (uint32_t)samples);
    write_be32(images, SIDE), write_be32(images, SIDE);
    write_be32(labels, 0x801), write_be32(labels, (uint32_t)samples);
    for (int i = 0; i < samples; ++i) {
        uint8_t label = (uint8_t)(next_random(&seed) % CLASSES);
        for (int p = 0; p < PIXELS; ++p) {
            int v = prototypes[label][p] + (int)(next_random(&seed) % (uint32_t)(2 * spread + 1)) - spread;
            pixels[p] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
        fwrite(pixels, 1, PIXELS, images);
        fwrite(&label, 1, 1, labels);
    }
    int closed = fclose(images) | fclose(labels);
    return closed ? -1 : 0;
}

void prototype_idx_remove(const char *dir) {
    char path[256];
    snprintf(path, sizeof path, "%s/images", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/labels", dir);
    unlink(path);
    rmdir(dir);
}
