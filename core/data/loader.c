/*
 * core/data/loader.c — the prefetching loader: loader threads assemble the next batches of an epoch
 * into the staging ring (memory/staging.c), whose copies to the device overlap the compute
 * stream's work; umt_loader_next hands them out in order.
 *
 * Batch b of an epoch lives in slot b % depth. A thread may claim batch b only once batch
 * b - depth has been handed out (its slot released); it reads and decodes the samples of the
 * seeded permutation, augments and normalises them into the slot's host buffer and submits the
 * copy. umt_loader_next waits (on the host) until its batch is there, makes the compute stream
 * wait for the copy, and copies the batch into the step's activation arena on the device, so the
 * slot is free again as soon as that device-to-device copy has run.
 *
 * Why a device ring and not a copy straight into the arena: the arena's planned addresses are
 * the same every step, so the next batch cannot land there while this step still runs.
 *
 * A step graph (core/step/step_graph.c) replays the same copies at the same addresses, so it
 * cannot follow umt_loader_next from slot to slot. For it, umt_loader_hold_next runs before the
 * step, outside any capture: it takes the next batch as umt_loader_next does, but copies it into
 * the loader's one held block; umt_loader_take_held, inside the step, copies the held block into
 * the step's tensors, the same copy at the same addresses every step, which a graph replays.
 *
 * Everything a thread does depends only on the batch number (the permutation and a per-epoch
 * augmentation seed fix every pixel), so the batches are the same whatever the threads' timing.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/signals.h"
#include "core/context.h"
#include "core/data/samples.h"
#include "core/tensor.h"
#include "memory/staging.h"

#define MAX_DEPTH 64
#define MAX_WORKERS 64

struct umt_loader {
    umt_context *ctx;
    const umt_samples *samples;
    umt_loader_options options;
    umt_staging *staging;
    int depth;
    int64_t sample_numel;   /* C*H*W */
    size_t labels_offset;   /* from a slot's start: the labels after batch_size images */
    uint8_t *inline_pixels; /* pageable-sync: the caller's decode buffer */
    /* The epoch: written only while no thread fills a batch (start_epoch waits for that). */
    int64_t *order;
    int64_t epoch_samples;
    uint64_t augment_seed;
    /* Shared with the threads, under lock. */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    pthread_t *threads;
    int thread_count;
    int64_t batches, next_fill, next_take, filling;
    int64_t *slot_batch; /* the batch whose data is in the slot, ready to take; -1 none */
    bool stopping;
    umt_status error;
    char error_message[1024];
    int64_t batches_taken;
    /* umt_loader_hold_next: the held batch, at one device address for every step (inputs pool,
     * made at the first), and its samples (0: none held). */
    char *held;
    int64_t held_count;
};

umt_loader_options umt_loader_defaults(void) {
    return (umt_loader_options){.batch_size = 64, .depth = 4, .workers = 1, .kind = UMT_LOADER_PINNED,
                                .shuffle = true, .mean = 0.0f, .std = 1.0f};
}

umt_status umt_loader_kind_parse(const char *name, umt_loader_kind *out) {
    if (!name || !out) return umt_fail_null("umt_loader_kind_parse", name ? "out" : "name");
    if (!strcmp(name, "pinned")) return *out = UMT_LOADER_PINNED, UMT_OK;
    if (!strcmp(name, "pageable-sync")) return *out = UMT_LOADER_PAGEABLE_SYNC, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "loader '%s': expected pinned or pageable-sync", name);
}

/* ----------------------------------------------------------------------------------------- */
/* Assembling a batch (loader threads, or the caller in pageable-sync mode) */

/* One sample: random crop of the padded image and flip (when asked), then (v/255 - mean)/std,
 * the dataset kernels' normalisation; interleaved HWC bytes in, planar CHW floats out. */
static void prepare_sample(const umt_loader *l, const uint8_t *hwc, int64_t position, float *out) {
    const umt_loader_options *o = &l->options;
    int64_t c_count = l->samples->chw[0], h = l->samples->chw[1], w = l->samples->chw[2], dy = 0, dx = 0;
    bool flip = false;
    if (o->crop_padding > 0 || o->flip) {
        /* A draw per sample from the epoch's seed and its position: independent of the threads. */
        umt_rng rng;
        umt_rng_seed(&rng, l->augment_seed + (uint64_t)position * 0x9e3779b97f4a7c15ULL);
        int64_t pad = o->crop_padding;
        dy = (int64_t)umt_rng_below(&rng, (uint64_t)(2 * pad + 1)) - pad;
        dx = (int64_t)umt_rng_below(&rng, (uint64_t)(2 * pad + 1)) - pad;
        flip = o->flip && (umt_rng_next(&rng) & 1);
    }
    for (int64_t c = 0; c < c_count; ++c)
        for (int64_t y = 0; y < h; ++y)
            for (int64_t x = 0; x < w; ++x) {
                int64_t sy = y + dy, sx = (flip ? w - 1 - x : x) + dx;
                /* Padding is black (pixel 0) before normalisation, as torchvision pads. */
                int v = sy >= 0 && sy < h && sx >= 0 && sx < w ? hwc[(sy * w + sx) * c_count + c] : 0;
                out[(c * h + y) * w + x] = ((float)v / 255.0f - o->mean) / o->std;
            }
}

static int64_t batch_count(const umt_loader *l, int64_t batch) {
    int64_t first = batch * l->options.batch_size, left = l->epoch_samples - first;
    return left < l->options.batch_size ? left : l->options.batch_size;
}

static umt_status fill_slot(umt_loader *l, int64_t batch, uint8_t *pixels) {
    int slot = (int)(batch % l->depth);
    int64_t first = batch * l->options.batch_size, count = batch_count(l, batch);
    UMT_TRY(umt_staging_wait_copied(l->staging, slot));
    char *host = umt_staging_host(l->staging, slot);
    float *images = (float *)host;
    int32_t *labels = (int32_t *)(host + l->labels_offset);
    for (int64_t i = 0; i < count; ++i) {
        UMT_TRY(l->samples->ops->read(l->samples, l->order[first + i], pixels, &labels[i]));
        prepare_sample(l, pixels, first + i, images + i * l->sample_numel);
    }
    return umt_staging_submit(l->staging, slot, l->labels_offset + (size_t)count * sizeof *labels);
}

/* ----------------------------------------------------------------------------------------- */
/* Loader threads */

/* Under lock: the first error wins; its message travels to the caller's thread. */
static void record_error(umt_loader *l, umt_status status) {
    if (l->error != UMT_OK) return;
    l->error = status;
    snprintf(l->error_message, sizeof l->error_message, "%s", umt_last_error());
}

/* Under lock: a batch is left to fill and its slot has been handed out (released). */
static bool can_claim(const umt_loader *l) {
    return l->error == UMT_OK && l->next_fill < l->batches && l->next_fill < l->next_take + l->depth;
}

static void *worker_main(void *arg) {
    umt_loader *l = arg;
    uint8_t *pixels = malloc((size_t)l->sample_numel);
    umt_status started = pixels ? umt_staging_thread_start(l->staging)
                                : umt_fail(UMT_ERR_OUT_OF_MEMORY, "loader thread: no memory for a sample");
    pthread_mutex_lock(&l->lock);
    if (started != UMT_OK) record_error(l, started);
    while (started == UMT_OK) {
        while (!l->stopping && !can_claim(l)) pthread_cond_wait(&l->changed, &l->lock);
        if (l->stopping) break;
        int64_t batch = l->next_fill++;
        l->filling++;
        pthread_mutex_unlock(&l->lock);
        umt_status status = fill_slot(l, batch, pixels);
        pthread_mutex_lock(&l->lock);
        l->filling--;
        if (status == UMT_OK) l->slot_batch[batch % l->depth] = batch;
        else record_error(l, status);
        pthread_cond_broadcast(&l->changed);
    }
    pthread_mutex_unlock(&l->lock);
    free(pixels);
    return NULL;
}

/* ----------------------------------------------------------------------------------------- */
/* Creating and destroying */

static umt_status check_options(const umt_samples *samples, const umt_loader_options *o) {
    if (samples->size < 1)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_loader_create: %s %s empty (0 samples, expected at least 1)",
                        samples->name ? samples->name : "the samples", samples->name ? "is" : "are");
    if (o->batch_size < 1 || o->depth < 1 || o->depth > MAX_DEPTH || o->workers < 1 || o->workers > MAX_WORKERS ||
        (unsigned)o->kind > UMT_LOADER_PAGEABLE_SYNC || !(o->std > 0) || o->crop_padding < 0 ||
        o->crop_padding > samples->chw[1])
        return umt_fail(UMT_ERR_INVALID_ARGUMENT,
                        "umt_loader_create: batch %lld, depth %d, workers %d, kind %d, std %g, crop padding %d: "
                        "expected batch >= 1, depth 1..%d, workers 1..%d, std > 0, padding 0..image height",
                        (long long)o->batch_size, o->depth, o->workers, (int)o->kind, (double)o->std,
                        o->crop_padding, MAX_DEPTH, MAX_WORKERS);
    return UMT_OK;
}

/* The threads start with SIGINT and SIGTERM blocked (they inherit the mask): those signals go to
 * the program's own threads, where a checkpoint save can hold them off (core/base/signals.h). */
static umt_status start_threads(umt_loader *l) {
    l->threads = calloc((size_t)l->options.workers, sizeof *l->threads);
    if (!l->threads) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_loader_create: no memory for the threads");
    sigset_t previous;
    umt_signals_block_stop(&previous);
    umt_status status = UMT_OK;
    for (; l->thread_count < l->options.workers; ++l->thread_count)
        if (pthread_create(&l->threads[l->thread_count], NULL, worker_main, l) != 0) {
            status = umt_fail(UMT_ERR_STATE, "umt_loader_create: cannot start loader thread %d", l->thread_count);
            break;
        }
    umt_signals_restore(&previous);
    return status;
}

static umt_status make_loader(umt_loader *l) {
    bool pageable = l->options.kind == UMT_LOADER_PAGEABLE_SYNC;
    /* Pageable-sync assembles each batch when it is asked for: one slot is all it uses. */
    l->depth = pageable ? 1 : l->options.depth;
    size_t image_bytes = (size_t)(l->options.batch_size * l->sample_numel) * sizeof(float);
    l->labels_offset = (image_bytes + UMT_POOL_ALIGN - 1) / UMT_POOL_ALIGN * UMT_POOL_ALIGN;
    size_t slot_bytes = l->labels_offset + (size_t)l->options.batch_size * sizeof(int32_t);
    l->order = malloc((size_t)l->samples->size * sizeof *l->order);
    l->slot_batch = malloc((size_t)l->depth * sizeof *l->slot_batch);
    if (!l->order || !l->slot_batch) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_loader_create: no memory");
    for (int i = 0; i < l->depth; ++i) l->slot_batch[i] = -1;
    UMT_TRY(umt_staging_create(&l->ctx->memory, l->depth, slot_bytes, pageable, &l->staging));
    if (pageable) {
        l->inline_pixels = malloc((size_t)l->sample_numel);
        return l->inline_pixels ? UMT_OK : umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_loader_create: no memory");
    }
    return start_threads(l);
}

static void destroy_owned(void *object) { umt_loader_destroy(object); }

umt_status umt_loader_create(umt_context *ctx, const umt_samples *samples, const umt_loader_options *options,
                             umt_loader **out) {
    if (out) *out = NULL;
    if (!ctx || !samples || !options || !out)
        return umt_fail_null("umt_loader_create", !ctx ? "ctx" : !samples ? "samples" : !options ? "options" : "out");
    UMT_TRY(check_options(samples, options));
    umt_loader *l = calloc(1, sizeof *l);
    if (!l) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_loader_create: no memory");
    *l = (umt_loader){.ctx = ctx, .samples = samples, .options = *options,
                      .sample_numel = samples->chw[0] * samples->chw[1] * samples->chw[2]};
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->changed, NULL);
    umt_status status = make_loader(l);
    if (status == UMT_OK) status = umt_context_own(ctx, l, destroy_owned);
    if (status != UMT_OK) {
        umt_loader_destroy(l);
        return status;
    }
    *out = l;
    return UMT_OK;
}

void umt_loader_destroy(umt_loader *l) {
    if (!l) return;
    umt_context_disown(l->ctx, l);
    pthread_mutex_lock(&l->lock);
    l->stopping = true;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < l->thread_count; ++i) pthread_join(l->threads[i], NULL);
    umt_staging_destroy(l->staging);
    umt_memory_free(&l->ctx->memory, UMT_POOL_INPUTS, l->held);
    pthread_cond_destroy(&l->changed);
    pthread_mutex_destroy(&l->lock);
    free(l->threads);
    free(l->inline_pixels);
    free(l->slot_batch);
    free(l->order);
    free(l);
}

/* ----------------------------------------------------------------------------------------- */
/* Epochs and batches (the caller's thread) */

umt_status umt_loader_start_epoch(umt_loader *l, int64_t limit, int64_t *batches) {
    if (!l) return umt_fail_null("umt_loader_start_epoch", "loader");
    return umt_loader_start_epoch_at(l, limit, 0, batches);
}

umt_status umt_loader_start_epoch_at(umt_loader *l, int64_t limit, int64_t first_batch, int64_t *batches) {
    if (!l) return umt_fail_null("umt_loader_start_epoch_at", "loader");
    if (limit < 0 || first_batch < 0)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_loader_start_epoch_at: %s %lld (expected >= 0)",
                        limit < 0 ? "limit" : "first_batch", (long long)(limit < 0 ? limit : first_batch));
    int64_t n = limit && limit < l->samples->size ? limit : l->samples->size;
    pthread_mutex_lock(&l->lock);
    /* No new claims; the batches being filled finish first (an unfinished epoch is dropped). */
    l->batches = l->next_fill;
    while (l->filling > 0) pthread_cond_wait(&l->changed, &l->lock);
    umt_status status = UMT_OK;
    if (l->options.shuffle) status = umt_permutation(l->ctx, n, l->order);
    else for (int64_t i = 0; i < n; ++i) l->order[i] = i;
    /* Drawn only when used, so that without augmentation the RNG's stream matches the
     * GPU-resident path (the same seed, the same permutations). */
    if (l->options.crop_padding > 0 || l->options.flip) l->augment_seed = umt_rng_next(&l->ctx->rng);
    l->epoch_samples = n;
    l->batches = status == UMT_OK ? (n + l->options.batch_size - 1) / l->options.batch_size : 0;
    /* The threads claim batches from next_fill on, and the caller takes them from next_take. */
    l->next_fill = l->next_take = first_batch < l->batches ? first_batch : l->batches;
    for (int i = 0; i < l->depth; ++i) l->slot_batch[i] = -1;
    l->error = UMT_OK;
    if (batches) *batches = l->batches;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    return status;
}

/* Waits until a thread has filled the batch into its slot, or failed. */
static umt_status wait_filled(umt_loader *l, int slot, int64_t batch) {
    pthread_mutex_lock(&l->lock);
    while (l->slot_batch[slot] != batch && l->error == UMT_OK) pthread_cond_wait(&l->changed, &l->lock);
    umt_status status = l->slot_batch[slot] == batch ? UMT_OK : l->error;
    if (status != UMT_OK) umt_fail(status, "%s", l->error_message);
    pthread_mutex_unlock(&l->lock);
    return status;
}

/* The slot's batch into new arena tensors, queued on the compute stream after its copy. */
/* count samples' images and labels at device (a slot's layout) into new tensors of the step. */
static umt_status batch_tensors(umt_loader *l, const char *device, int64_t count, umt_tensor **images,
                                umt_tensor **labels) {
    const int64_t *chw = l->samples->chw;
    umt_tensor *x = umt_tensor_alloc(l->ctx, UMT_POOL_ACTIVATIONS, UMT_F32, 4, (int64_t[]){count, chw[0], chw[1], chw[2]});
    umt_tensor *y = x ? umt_tensor_alloc(l->ctx, UMT_POOL_ACTIVATIONS, UMT_I32, 1, (int64_t[]){count}) : NULL;
    if (!y) return umt_last_status();
    UMT_TRY(umt_kernels(l->ctx)->f32.copy(x->data, device, x->bytes));
    UMT_TRY(umt_kernels(l->ctx)->f32.copy(y->data, device + l->labels_offset, y->bytes));
    *images = x;
    *labels = y;
    return UMT_OK;
}

static umt_status take_slot(umt_loader *l, int slot, int64_t count, umt_tensor **images, umt_tensor **labels) {
    UMT_TRY(umt_staging_acquire(l->staging, slot));
    UMT_TRY(batch_tensors(l, umt_staging_device(l->staging, slot), count, images, labels));
    return umt_staging_release(l->staging, slot);
}

/* The next batch's slot, filled (*slot -1 at the end of the epoch); handed out by handed_out. */
static umt_status next_filled(umt_loader *l, int *slot) {
    /* Only this thread moves next_take; the threads read it under lock. */
    int64_t batch = l->next_take;
    *slot = -1;
    if (batch >= l->batches) return UMT_OK;
    int s = (int)(batch % l->depth);
    UMT_TRY(umt_staging_wait_begin(l->staging, s));
    if (l->options.kind == UMT_LOADER_PAGEABLE_SYNC) UMT_TRY(fill_slot(l, batch, l->inline_pixels));
    else UMT_TRY(wait_filled(l, s, batch));
    *slot = s;
    return UMT_OK;
}

/* The slot's batch is taken: its slot may be filled with a later one. */
static void handed_out(umt_loader *l, int slot) {
    pthread_mutex_lock(&l->lock);
    l->slot_batch[slot] = -1;
    l->next_take++;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    l->batches_taken++;
}

umt_status umt_loader_next(umt_loader *l, umt_tensor **images, umt_tensor **labels) {
    if (images) *images = NULL;
    if (labels) *labels = NULL;
    if (!l || !images || !labels)
        return umt_fail_null("umt_loader_next", !l ? "loader" : !images ? "images" : "labels");
    /* Each batch is a different slot with its own events: a replay could not follow. */
    if (l->ctx->values.recording)
        return umt_fail(UMT_ERR_UNSUPPORTED, "umt_loader_next: a step graph cannot replay the loader's batches "
                        "(umt_loader_hold_next before the step and umt_loader_take_held inside it can)");
    int slot;
    UMT_TRY(next_filled(l, &slot));
    if (slot < 0) return UMT_OK;
    UMT_TRY(take_slot(l, slot, batch_count(l, l->next_take), images, labels));
    handed_out(l, slot);
    return UMT_OK;
}

/* The slot's batch of count samples into the held block, on the compute stream. */
static umt_status hold_slot(umt_loader *l, int slot, int64_t count) {
    size_t image_bytes = (size_t)(count * l->sample_numel) * sizeof(float);
    size_t label_bytes = (size_t)count * sizeof(int32_t);
    if (!l->held)
        UMT_TRY(umt_memory_alloc(&l->ctx->memory, UMT_POOL_INPUTS, l->labels_offset + (size_t)l->options.batch_size *
                                 sizeof(int32_t), (void **)&l->held));
    UMT_TRY(umt_staging_acquire(l->staging, slot));
    const char *device = umt_staging_device(l->staging, slot);
    UMT_TRY(umt_kernels(l->ctx)->f32.copy(l->held, device, image_bytes));
    UMT_TRY(umt_kernels(l->ctx)->f32.copy(l->held + l->labels_offset, device + l->labels_offset, label_bytes));
    return umt_staging_release(l->staging, slot);
}

umt_status umt_loader_hold_next(umt_loader *l, int64_t *count) {
    if (count) *count = 0;
    if (!l || !count) return umt_fail_null("umt_loader_hold_next", !l ? "loader" : "count");
    if (l->ctx->values.recording)
        return umt_fail(UMT_ERR_STATE, "umt_loader_hold_next: called inside a step being captured (call it before "
                        "the step; umt_loader_take_held inside)");
    l->held_count = 0;
    int slot;
    UMT_TRY(next_filled(l, &slot));
    if (slot < 0) return UMT_OK;
    int64_t n = batch_count(l, l->next_take);
    UMT_TRY(hold_slot(l, slot, n));
    handed_out(l, slot);
    *count = l->held_count = n;
    return UMT_OK;
}

umt_status umt_loader_take_held(umt_loader *l, umt_tensor **images, umt_tensor **labels) {
    if (images) *images = NULL;
    if (labels) *labels = NULL;
    if (!l || !images || !labels)
        return umt_fail_null("umt_loader_take_held", !l ? "loader" : !images ? "images" : "labels");
    return l->held_count ? batch_tensors(l, l->held, l->held_count, images, labels) : UMT_OK;
}

umt_status umt_loader_take_stats(umt_loader *l, umt_loader_stats *out) {
    if (!l || !out) return umt_fail_null("umt_loader_take_stats", l ? "out" : "loader");
    out->batches = l->batches_taken;
    l->batches_taken = 0;
    return umt_staging_take_wait_ms(l->staging, &out->wait_ms);
}
