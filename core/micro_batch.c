/*
 * core/micro_batch.c — a step's batch as micro-batches (core/micro_batch.h tells the story).
 */
#include "core/micro_batch.h"

#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tape.h"
#include "core/tensor.h"

void umt_micro_batch_reset(umt_context *ctx) {
    umt_micro_batch_state *m = &ctx->micro;
    m->index = 0;
    m->first = m->samples = m->batch = 0;
    m->draw_count = m->next_draw = 0;
}

/* The step's loss scalar, made at the first split step (never inside a capture: the step graph
 * runs two eager steps first). */
static umt_status step_loss(umt_context *ctx) {
    umt_micro_batch_state *m = &ctx->micro;
    if (!m->loss) m->loss = umt_tensor_alloc(ctx, UMT_POOL_OPTIM, UMT_F32, 1, (int64_t[]){1});
    if (!m->loss)
        return umt_fail(umt_last_status(), "umt_micro_batch_begin: no memory for the step loss: %s", umt_last_error());
    return umt_kernels(ctx)->f32.fill(m->loss->data, 1, 0.0f);
}

static umt_status check_range(const umt_micro_batch_state *m, int64_t first, int64_t samples, int64_t batch) {
    const char *f = "umt_micro_batch_begin";
    if (batch < 1 || samples < 1 || first < 0 || first > batch - samples)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: samples [%lld, %lld) of a batch of %lld (expected 1 or more "
                        "samples inside the batch)", f, (long long)first, (long long)(first + samples),
                        (long long)batch);
    int64_t expected = m->index ? m->first + m->samples : 0;
    if (m->index && batch != m->batch)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: a batch of %lld, but the step's micro-batches split %lld (a new "
                        "batch starts with umt_step_begin)", f, (long long)batch, (long long)m->batch);
    if (first != expected)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: first = %lld, expected %lld: micro-batches follow each other "
                        "from sample 0 of the step's batch", f, (long long)first, (long long)expected);
    return UMT_OK;
}

umt_status umt_micro_batch_begin(umt_context *ctx, int64_t first, int64_t samples, int64_t batch) {
    if (!ctx) return umt_fail_null("umt_micro_batch_begin", "ctx");
    umt_micro_batch_state *m = &ctx->micro;
    UMT_TRY(check_range(m, first, samples, batch));
    if (m->index && ctx->tape.count)
        return umt_fail(UMT_ERR_STATE, "umt_micro_batch_begin: the micro-batch of samples [%lld, %lld) has not run "
                        "backward (its %d ops are still on the tape)", (long long)m->first,
                        (long long)(m->first + m->samples), ctx->tape.count);
    /* The first micro-batch starts where umt_step_begin left the step; each later one frees the
     * last one's activations, as a step's start does, and takes its dropout draws again. */
    if (m->index) UMT_TRY(umt_step_release(ctx));
    else UMT_TRY(step_loss(ctx));
    if (m->index) umt_forward_trace_begin(ctx);
    m->first = first;
    m->samples = samples;
    m->batch = batch;
    m->next_draw = 0;
    m->index++;
    return UMT_OK;
}

umt_tensor *umt_micro_batch_loss(umt_context *ctx) {
    if (!ctx) return umt_fail_null("umt_micro_batch_loss", "ctx"), NULL;
    if (!ctx->micro.index) {
        umt_fail(UMT_ERR_STATE, "umt_micro_batch_loss: this step is not split (no umt_micro_batch_begin since "
                 "umt_step_begin)");
        return NULL;
    }
    return ctx->micro.loss;
}

float umt_micro_batch_weight(const umt_context *ctx) {
    const umt_micro_batch_state *m = &ctx->micro;
    return m->index ? (float)((double)m->samples / (double)m->batch) : 1.0f;
}

bool umt_micro_batch_is_last(const umt_context *ctx) {
    const umt_micro_batch_state *m = &ctx->micro;
    return !m->index || m->first + m->samples == m->batch;
}

umt_status umt_micro_batch_after_backward(umt_context *ctx, const umt_tensor *loss) {
    if (!ctx->micro.index) return UMT_OK;
    return umt_kernels(ctx)->f32.accumulate(ctx->micro.loss->data, loss->data, umt_micro_batch_weight(ctx), 1);
}

umt_status umt_micro_batch_dropout(umt_context *ctx, const umt_tensor *x, const char *op, int64_t *first,
                                   uint64_t *seed, void **seed_on_device, bool *repeated) {
    umt_micro_batch_state *m = &ctx->micro;
    *first = 0;
    *repeated = false;
    if (!m->index) return UMT_OK;
    /* Sample s's elements are s * per_sample on: the same in x's storage order, NCHW or NHWC. */
    if (x->ndim < 1 || x->shape[0] != m->samples)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "%s: under micro-batching the first axis is the micro-batch's "
                        "%lld samples, but x's is %lld", op, (long long)m->samples,
                        (long long)(x->ndim ? x->shape[0] : 0));
    *first = m->first * (x->numel / x->shape[0]);
    if (m->first == 0) return UMT_OK;
    if (m->next_draw >= m->draw_count)
        return umt_fail(UMT_ERR_STATE, "%s: micro-batch [%lld, %lld) draws dropout %d, but the first micro-batch drew "
                        "%d (each must run the same ops)", op, (long long)m->first, (long long)(m->first + m->samples),
                        m->next_draw + 1, m->draw_count);
    *seed = m->draws[m->next_draw].seed;
    *seed_on_device = m->draws[m->next_draw].seed_on_device;
    m->next_draw++;
    *repeated = true;
    return UMT_OK;
}

umt_status umt_micro_batch_keep_draw(umt_context *ctx, uint64_t seed, void *seed_on_device) {
    umt_micro_batch_state *m = &ctx->micro;
    if (!m->index) return UMT_OK;
    if (m->draw_count == m->draw_slots) {
        int slots = m->draw_slots ? 2 * m->draw_slots : 16;
        umt_micro_draw *grown = realloc(m->draws, (size_t)slots * sizeof *grown);
        if (!grown) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "micro-batching: no memory for %d dropout draws", slots);
        m->draws = grown;
        m->draw_slots = slots;
    }
    m->draws[m->draw_count++] = (umt_micro_draw){seed, seed_on_device};
    return UMT_OK;
}

void umt_micro_batch_release(umt_context *ctx) {
    free(ctx->micro.draws);
    ctx->micro = (umt_micro_batch_state){0};
}
