/*
 * core/data/samples.h — the inside of umt_samples: labelled samples the loader's threads read one at
 * a time on the host. Two kinds fill the table: an IDX pair in host memory (samples.c) and an
 * image folder decoded file by file (image_folder.c).
 */
#ifndef UMT_CORE_DATA_SAMPLES_H
#define UMT_CORE_DATA_SAMPLES_H

#include <stdint.h>

#include "umtrain.h"

typedef struct {
    /* Writes sample `index` as H*W*C interleaved bytes (C = chw[0]) and its label. Called from
     * several loader threads at once: it must only read the samples object. */
    umt_status (*read)(const umt_samples *samples, int64_t index, uint8_t *pixels, int32_t *label);
    void (*destroy)(umt_samples *samples);
} umt_samples_ops;

struct umt_samples {
    const umt_samples_ops *ops;
    int64_t size;
    int64_t chw[3];
    int num_classes;
    char **class_names; /* image folders: num_classes names; NULL for IDX */
    char *name;         /* what they are, for messages ("the test split of image folder R"); NULL for IDX */
    int64_t skipped;
    char *first_skip;
};

#endif /* UMT_CORE_DATA_SAMPLES_H */
