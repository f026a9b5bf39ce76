/*
 * core/data/samples.c — host-side samples: what every kind shares, and the IDX kind, whose samples
 * are the decompressed files kept in host memory (the loader reads rows out of them).
 */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/data/idx.h"
#include "core/data/samples.h"

void umt_samples_destroy(umt_samples *s) {
    if (!s) return;
    for (int i = 0; s->class_names && i < s->num_classes; ++i) free(s->class_names[i]);
    free(s->class_names);
    free(s->name);
    free(s->first_skip);
    s->ops->destroy(s);
}

/* A NULL samples gets the neutral value umtrain.h names, and a message. */
int64_t umt_samples_size(const umt_samples *s) {
    if (!s) return umt_fail_null("umt_samples_size", "samples"), 0;
    return s->size;
}

int umt_samples_num_classes(const umt_samples *s) {
    if (!s) return umt_fail_null("umt_samples_num_classes", "samples"), 0;
    return s->num_classes;
}

void umt_samples_shape(const umt_samples *s, int64_t chw[3]) {
    if (!s || !chw) {
        umt_fail_null("umt_samples_shape", s ? "chw" : "samples");
        for (int i = 0; chw && i < 3; ++i) chw[i] = 0;
        return;
    }
    for (int i = 0; i < 3; ++i) chw[i] = s->chw[i];
}

const char *umt_samples_class_name(const umt_samples *s, int i) {
    if (!s) return umt_fail_null("umt_samples_class_name", "samples"), NULL;
    return s->class_names && i >= 0 && i < s->num_classes ? s->class_names[i] : NULL;
}

int64_t umt_samples_skipped(const umt_samples *s) {
    if (!s) return umt_fail_null("umt_samples_skipped", "samples"), 0;
    return s->skipped;
}

const char *umt_samples_first_skip(const umt_samples *s) {
    if (!s) return umt_fail_null("umt_samples_first_skip", "samples"), NULL;
    return s->first_skip;
}

/* ----------------------------------------------------------------------------------------- */
/* IDX pairs in host memory */

typedef struct {
    umt_samples base;
    umt_idx images, labels;
    int64_t sample_bytes;
} idx_samples;

/* An IDX row is C*H*W bytes with C = 1 ([N,H,W]) or H = W = 1 ([N,D]): interleaved already. */
static umt_status idx_read(const umt_samples *base, int64_t index, uint8_t *pixels, int32_t *label) {
    const idx_samples *s = (const idx_samples *)base;
    memcpy(pixels, s->images.data + index * s->sample_bytes, (size_t)s->sample_bytes);
    *label = s->labels.data[index];
    return UMT_OK;
}

static void idx_destroy(umt_samples *base) {
    idx_samples *s = (idx_samples *)base;
    umt_idx_free(&s->images);
    umt_idx_free(&s->labels);
    free(s);
}

static const umt_samples_ops idx_ops = {.read = idx_read, .destroy = idx_destroy};

umt_status umt_samples_load_idx(const char *images_path, const char *labels_path, int num_classes, umt_samples **out) {
    if (out) *out = NULL;
    if (!images_path || !labels_path || !out)
        return umt_fail_null("umt_samples_load_idx",
                             !images_path ? "images_path" : !labels_path ? "labels_path" : "out");
    if (num_classes < 1 || num_classes > 256)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_samples_load_idx: num_classes %d, expected 1..256", num_classes);
    idx_samples *s = calloc(1, sizeof *s);
    if (!s) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_samples_load_idx: no memory");
    umt_status status = umt_idx_read(images_path, &s->images);
    if (status == UMT_OK) status = umt_idx_read(labels_path, &s->labels);
    if (status == UMT_OK) status = umt_idx_check_pair(images_path, &s->images, labels_path, &s->labels, num_classes);
    if (status != UMT_OK) {
        idx_destroy(&s->base);
        return status;
    }
    bool flat = s->images.ndim == 2;
    s->base = (umt_samples){.ops = &idx_ops, .size = s->images.dims[0], .num_classes = num_classes,
                            .chw = {flat ? s->images.dims[1] : 1, flat ? 1 : s->images.dims[1],
                                    flat ? 1 : s->images.dims[2]}};
    s->sample_bytes = s->base.chw[0] * s->base.chw[1] * s->base.chw[2];
    *out = &s->base;
    return UMT_OK;
}
