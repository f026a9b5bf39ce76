/*
 * core/data/dataset.c — labelled image datasets kept whole in the dataset pool, and batches
 * gathered from them.
 *
 * Loading reads both IDX files (core/data/idx.c validates each on its own), checks that they agree
 * with each other and with the number of classes, copies samples and labels into u8 tensors
 * of the dataset pool and drops the file buffers. A batch is then one backend call that
 * gathers and normalises rows on the device where the dataset lives.
 *
 * A share (umt_dataset_share) is the same samples seen from another context of the process on
 * the same device: it points at the source's bytes, which nothing writes after the upload (the
 * upload waits for its copy), so any number of contexts gather from them at once, on their own
 * streams and threads, and the bytes are in one pool only: the source context's.
 */
#include <math.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/data/idx.h"
#include "core/precision.h"
#include "core/step_values.h"
#include "core/tensor.h"

struct umt_dataset {
    umt_context *ctx;
    umt_tensor *samples; /* u8 [N,H,W] or [N,D], as in the file (NULL in a share) */
    umt_tensor *labels;  /* u8 [N] (NULL in a share) */
    const uint8_t *sample_bytes, *label_bytes; /* what batches gather from: these, or the source's */
    size_t bytes;        /* samples and labels together */
    bool shared;         /* a share: the bytes belong to another context's dataset pool */
    int64_t size;
    int64_t chw[3];
    int num_classes;
};

/* ----------------------------------------------------------------------------------------- */
/* Loading */

umt_status umt_idx_check_pair(const char *images_path, const umt_idx *images, const char *labels_path,
                              const umt_idx *labels, int num_classes) {
    if (images->ndim != 2 && images->ndim != 3)
        return umt_fail(UMT_ERR_FORMAT, "%s: images file has rank %d, expected 3 [N,H,W] or 2 [N,D]", images_path,
                        images->ndim);
    if (labels->ndim != 1)
        return umt_fail(UMT_ERR_FORMAT, "%s: labels file has rank %d, expected 1 [N]", labels_path, labels->ndim);
    if (images->dims[0] != labels->dims[0])
        return umt_fail(UMT_ERR_FORMAT, "images file %s holds %lld samples, labels file %s holds %lld", images_path,
                        (long long)images->dims[0], labels_path, (long long)labels->dims[0]);
    for (size_t i = 0; i < labels->data_bytes; ++i)
        if (labels->data[i] >= num_classes)
            return umt_fail(UMT_ERR_FORMAT, "%s: label %zu is %d, expected < %d (num_classes)", labels_path, i,
                            labels->data[i], num_classes);
    return UMT_OK;
}

/* A u8 tensor of the dataset pool holding a copy of the file's elements. */
static umt_status upload_idx(umt_context *ctx, const umt_idx *idx, umt_tensor **out) {
    *out = umt_tensor_alloc(ctx, UMT_POOL_DATASET, UMT_U8, idx->ndim, idx->dims);
    /* The shape is valid (the reader checked it), so only the pool can have refused; it has
     * recorded the message. */
    if (!*out) return umt_last_status();
    umt_status status = umt_kernels(ctx)->f32.upload((*out)->data, idx->data, idx->data_bytes);
    if (status != UMT_OK) {
        umt_tensor_free(*out);
        *out = NULL;
    }
    return status;
}

static void destroy_owned(void *object) { umt_dataset_destroy(object); }

/* The dataset over two validated files, registered with the context. */
static umt_status make_dataset(umt_context *ctx, const umt_idx *images, const umt_idx *labels, int num_classes,
                               umt_dataset **out) {
    umt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_dataset_load_idx: no memory for the dataset");
    ds->ctx = ctx;
    ds->size = images->dims[0];
    ds->num_classes = num_classes;
    /* [N,H,W] is a one-channel image; [N,D] a D-channel 1x1 one, so that every batch is 4-D. */
    bool flat = images->ndim == 2;
    ds->chw[0] = flat ? images->dims[1] : 1;
    ds->chw[1] = flat ? 1 : images->dims[1];
    ds->chw[2] = flat ? 1 : images->dims[2];
    umt_status status = upload_idx(ctx, images, &ds->samples);
    if (status == UMT_OK) status = upload_idx(ctx, labels, &ds->labels);
    if (status == UMT_OK) status = umt_context_own(ctx, ds, destroy_owned);
    if (status == UMT_OK) {
        ds->sample_bytes = ds->samples->data;
        ds->label_bytes = ds->labels->data;
        ds->bytes = ds->samples->bytes + ds->labels->bytes;
    }
    if (status != UMT_OK) {
        umt_tensor_free(ds->labels);
        umt_tensor_free(ds->samples);
        free(ds);
        return status;
    }
    *out = ds;
    return UMT_OK;
}

umt_status umt_dataset_load_idx(umt_context *ctx, const char *images_path, const char *labels_path, int num_classes,
                                umt_dataset **out) {
    if (out) *out = NULL;
    if (!ctx || !images_path || !labels_path || !out)
        return umt_fail_null("umt_dataset_load_idx",
                             !ctx ? "ctx" : !images_path ? "images_path" : !labels_path ? "labels_path" : "out");
    /* Labels are stored as u8, so at most 256 classes can be told apart. */
    if (num_classes < 1 || num_classes > 256)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_dataset_load_idx: num_classes %d, expected 1..256", num_classes);
    umt_idx images, labels;
    umt_status status = umt_idx_read(images_path, &images);
    if (status != UMT_OK) return status;
    status = umt_idx_read(labels_path, &labels);
    if (status == UMT_OK) status = umt_idx_check_pair(images_path, &images, labels_path, &labels, num_classes);
    if (status == UMT_OK) status = make_dataset(ctx, &images, &labels, num_classes, out);
    umt_idx_free(&images);
    umt_idx_free(&labels);
    return status;
}

/* The source's samples, read from ctx: a share on the same device, in ctx's list. */
umt_status umt_dataset_share(umt_context *ctx, const umt_dataset *source, umt_dataset **out) {
    if (out) *out = NULL;
    if (!ctx || !source || !out) return umt_fail_null("umt_dataset_share", !ctx ? "ctx" : !source ? "source" : "out");
    const umt_context_options *a = &ctx->options, *b = &source->ctx->options;
    bool same_gpu = a->device != UMT_DEVICE_CUDA || a->cuda_device == b->cuda_device;
    if (a->device != b->device || !same_gpu)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "umt_dataset_share: source lives on %s %d, ctx computes on %s %d: expected the same device",
                        b->device == UMT_DEVICE_CUDA ? "cuda" : "cpu", b->cuda_device,
                        a->device == UMT_DEVICE_CUDA ? "cuda" : "cpu", a->cuda_device);
    umt_dataset *ds = malloc(sizeof *ds);
    if (!ds) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_dataset_share: no memory for the share");
    *ds = *source;
    ds->ctx = ctx;
    ds->samples = ds->labels = NULL;
    ds->shared = true;
    umt_status status = umt_context_own(ctx, ds, destroy_owned);
    if (status != UMT_OK) {
        free(ds);
        return status;
    }
    ctx->shared_dataset_bytes += ds->bytes;
    *out = ds;
    return UMT_OK;
}

void umt_dataset_destroy(umt_dataset *ds) {
    if (!ds) return;
    umt_context_disown(ds->ctx, ds);
    if (ds->shared) ds->ctx->shared_dataset_bytes -= ds->bytes;
    umt_tensor_free(ds->labels);
    umt_tensor_free(ds->samples);
    free(ds);
}

int64_t umt_dataset_size(const umt_dataset *ds) {
    if (!ds) return umt_fail_null("umt_dataset_size", "ds"), 0;
    return ds->size;
}

int umt_dataset_num_classes(const umt_dataset *ds) {
    if (!ds) return umt_fail_null("umt_dataset_num_classes", "ds"), 0;
    return ds->num_classes;
}

void umt_dataset_sample_shape(const umt_dataset *ds, int64_t chw[3]) {
    if (!ds || !chw) {
        umt_fail_null("umt_dataset_sample_shape", ds ? "chw" : "ds");
        for (int i = 0; chw && i < 3; ++i) chw[i] = 0;
        return;
    }
    for (int i = 0; i < 3; ++i) chw[i] = ds->chw[i];
}

/* ----------------------------------------------------------------------------------------- */
/* Batches */

static umt_status check_batch_request(const char *who, const umt_dataset *ds, const int64_t *indices, int64_t count,
                                      float mean, float std) {
    if (count <= 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: count %lld, expected > 0", who, (long long)count);
    if (!isfinite(mean) || !isfinite(std) || !(std > 0.0f))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: mean %g, std %g: expected finite, std > 0", who, (double)mean,
                        (double)std);
    for (int64_t i = 0; i < count; ++i)
        if (indices[i] < 0 || indices[i] >= ds->size)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: indices[%lld] is %lld, expected 0..%lld", who, (long long)i,
                            (long long)indices[i], (long long)ds->size - 1);
    return UMT_OK;
}

/* umt_dataset_batch and umt_dataset_batch_as, whose name (who) their messages give. */
static umt_status batch(const char *who, umt_context *ctx, const umt_dataset *ds, const int64_t *indices,
                        int64_t count, float mean, float std, umt_dtype dtype, umt_tensor **images,
                        umt_tensor **labels) {
    if (images) *images = NULL;
    if (labels) *labels = NULL;
    if (!ctx || !ds || !indices || !images || !labels)
        return umt_fail_null(who, !ctx ? "ctx" : !ds ? "ds" : !indices ? "indices" : !images ? "images" : "labels");
    if (dtype != UMT_F32 && !umt_dtype_is_lowp(dtype))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: images of %s (expected f32, bf16 or f16)", who,
                        umt_dtype_name(dtype));
    bool half = dtype != UMT_F32;
    if (half && !umt_kernels(ctx)->lowp.gather_batch)
        return umt_fail(UMT_ERR_UNSUPPORTED, "%s: %s images: the %s backend has no half-precision kernels (ask for "
                        "f32)", who, umt_dtype_name(dtype), umt_kernels(ctx)->name);
    UMT_TRY(umt_check_owner(ctx, who, "ds", ds->ctx));
    UMT_TRY(check_batch_request(who, ds, indices, count, mean, std));
    const int64_t shape[4] = {count, ds->chw[0], ds->chw[1], ds->chw[2]};
    umt_tensor *x = umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, half ? dtype : UMT_F32, 4, shape);
    umt_tensor *y = x ? umt_tensor_alloc(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, 1, (int64_t[]){count}) : NULL;
    /* Both live in the step arena, freed by the next umt_step_begin even when this fails. */
    if (!y) return umt_last_status();
    /* The kernel reads the indices where it runs: they travel with the step's values, a queued
     * copy from pinned memory (core/step_values.h), so the host does not wait for them. */
    void *device_indices = NULL;
    UMT_TRY(umt_step_values_input(ctx, indices, (size_t)count * sizeof *indices, &device_indices));
    const umt_backend *be = umt_kernels(ctx);
    int64_t hw = ds->chw[1] * ds->chw[2];
    if (half) {
        x->nhwc = true;
        UMT_TRY(be->lowp.gather_batch(dtype, ds->sample_bytes, ds->label_bytes, device_indices, count, ds->chw[0], hw,
                                      mean, std, x->data, y->data));
    } else {
        UMT_TRY(be->f32.gather_batch(ds->sample_bytes, ds->label_bytes, device_indices, count, ds->chw[0] * hw, mean,
                                     std, x->data, y->data));
    }
    *images = x;
    *labels = y;
    return UMT_OK;
}

umt_status umt_dataset_batch(umt_context *ctx, const umt_dataset *ds, const int64_t *indices, int64_t count, float mean,
                             float std, umt_tensor **images, umt_tensor **labels) {
    return batch("umt_dataset_batch", ctx, ds, indices, count, mean, std, UMT_F32, images, labels);
}

umt_status umt_dataset_batch_as(umt_context *ctx, const umt_dataset *ds, const int64_t *indices, int64_t count,
                                float mean, float std, umt_dtype dtype, umt_tensor **images, umt_tensor **labels) {
    return batch("umt_dataset_batch_as", ctx, ds, indices, count, mean, std, dtype, images, labels);
}
