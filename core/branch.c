/* core/branch.c — a layer's weight gradient on a second stream (core/branch.h says why and when). */
#include "core/branch.h"

#include <stdlib.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/device.h"
#include "core/hooks.h"
#include "core/tensor.h"
#include "memory/pool.h"

bool umt_branch_takes(const umt_context *ctx, const umt_tensor *weight, const void *dx, double flops) {
    if (!dx || ctx->options.one_stream || !ctx->backend->streams.branch_begin || flops > UMT_BRANCH_MOST_FLOPS)
        return false;
    /* A dry step has no subsystems registered (core/step/dry_step.c); it takes the real step's choice. */
    bool hooked = ctx->dry ? ctx->dry_hooked_in_backward : umt_hooks_in_backward(ctx);
    return !hooked && weight->tape_uses == 1;
}

umt_status umt_branch_begin(umt_context *ctx, bool products) {
    umt_branch_state *b = &ctx->branch;
    if (products && !b->cublas_workspace)
        UMT_TRY(umt_memory_alloc(&ctx->memory, UMT_POOL_WORKSPACE, UMT_CUBLAS_WORKSPACE_BYTES, &b->cublas_workspace));
    UMT_TRY(umt_kernels(ctx)->streams.branch_begin(products ? b->cublas_workspace : NULL, UMT_CUBLAS_WORKSPACE_BYTES));
    ctx->branch.open = true;
    ctx->branch.in_node = true;
    return UMT_OK;
}

umt_status umt_branch_end(umt_context *ctx, umt_status made) {
    umt_status ended = umt_kernels(ctx)->streams.branch_end();
    return made != UMT_OK ? made : ended;
}

umt_status umt_branch_workspace(umt_context *ctx, size_t bytes, void **out) {
    return umt_context_workspace_block(ctx, &ctx->branch.workspace, &ctx->branch.workspace_bytes, bytes, out);
}

/* Keeps slot for the join; if there is no memory for the list, waits for the side now instead. */
static void defer(umt_context *ctx, int slot) {
    umt_branch_state *b = &ctx->branch;
    if (b->deferred_count == b->deferred_slots) {
        int slots = b->deferred_slots ? 2 * b->deferred_slots : 16;
        int *grown = realloc(b->deferred, (size_t)slots * sizeof *grown);
        if (!grown) {
            /* A failed join is a device error, which the next call on the stream reports. */
            (void)umt_branch_join(ctx);
            umt_memory_end_of_life(&ctx->memory, UMT_POOL_ACTIVATIONS, slot);
            return;
        }
        b->deferred = grown;
        b->deferred_slots = slots;
    }
    b->deferred[b->deferred_count++] = slot;
}

void umt_branch_end_of_life(umt_context *ctx, int slot) {
    bool read_by_side = ctx->branch.in_node;
    ctx->branch.in_node = false;
    if (read_by_side)
        defer(ctx, slot);
    else
        umt_memory_end_of_life(&ctx->memory, UMT_POOL_ACTIVATIONS, slot);
}

umt_status umt_branch_join(umt_context *ctx) {
    umt_branch_state *b = &ctx->branch;
    if (!b->open) return UMT_OK;
    UMT_TRY(umt_kernels(ctx)->streams.branch_join());
    b->open = b->in_node = false;
    for (int i = 0; i < b->deferred_count; ++i)
        umt_memory_end_of_life(&ctx->memory, UMT_POOL_ACTIVATIONS, b->deferred[i]);
    b->deferred_count = 0;
    return UMT_OK;
}

void umt_branch_release(umt_context *ctx) {
    free(ctx->branch.deferred);
    ctx->branch.deferred = NULL;
    ctx->branch.deferred_count = ctx->branch.deferred_slots = 0;
}
