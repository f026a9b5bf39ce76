/*
 * tests/gpu/offload_count.c — see offload_count.h.
 */
#include "tests/gpu/offload_count.h"

#include <stdbool.h>

#include "core/context.h"
#include "core/tensor.h"

int offload_count_parameters(const umt_context *ctx) {
    int count = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) {
        const umt_tensor *p = umt_parameter_at(ctx, i);
        bool any = p->offload.home != NULL;
        for (const umt_tensor *t = ctx->run_tensors; t && !any; t = t->next)
            any = t->kind_pool == UMT_POOL_OPTIM && t->owner == p && t->offload.home;
        count += any;
    }
    return count;
}
