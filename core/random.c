/* core/random.c — what the context's RNG draws for callers: uniform fills and permutations; its state,
 * kept and set back. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/context.h"
#include "core/tensor.h"

umt_status umt_tensor_uniform(umt_context *ctx, umt_tensor *t, float low, float high) {
    UMT_TRY(umt_check_input(ctx, "umt_tensor_uniform", "t", t, UMT_F32, 0));
    if (!(low <= high)) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_tensor_uniform: low %g > high %g", low, high);
    /* Drawn on the host in index order, so a seed gives the same values on every backend. */
    float *host = malloc((size_t)t->numel * sizeof *host);
    if (!host) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "umt_tensor_uniform: no memory for %lld values", (long long)t->numel);
    for (int64_t i = 0; i < t->numel; ++i) host[i] = low + (high - low) * umt_rng_uniform(&ctx->rng);
    umt_tensor_written(t);
    umt_status st = umt_kernels(ctx)->f32.upload(t->data, host, t->bytes);
    free(host);
    return st;
}

umt_status umt_permutation(umt_context *ctx, int64_t n, int64_t *out) {
    if (!ctx || !out) return umt_fail_null("umt_permutation", ctx ? "out" : "ctx");
    if (n < 0) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_permutation: n = %lld (expected >= 0)", (long long)n);
    for (int64_t i = 0; i < n; ++i) out[i] = i;
    /* Fisher-Yates: each of the n! orders equally likely. */
    for (int64_t i = n - 1; i > 0; --i) {
        int64_t j = (int64_t)umt_rng_below(&ctx->rng, (uint64_t)i + 1);
        int64_t tmp = out[i];
        out[i] = out[j];
        out[j] = tmp;
    }
    return UMT_OK;
}

umt_status umt_rng_state_get(const umt_context *ctx, umt_rng_state *out) {
    if (!ctx || !out) return umt_fail_null("umt_rng_state_get", ctx ? "out" : "ctx");
    memcpy(out->s, ctx->rng.s, sizeof out->s);
    return UMT_OK;
}

umt_status umt_rng_state_set(umt_context *ctx, const umt_rng_state *state) {
    if (!ctx || !state) return umt_fail_null("umt_rng_state_set", ctx ? "state" : "ctx");
    if (!(state->s[0] | state->s[1] | state->s[2] | state->s[3]))
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_rng_state_set: the state is all zeros (a generator from it "
                        "draws only zeros; expected one umt_rng_state_get gave)");
    memcpy(ctx->rng.s, state->s, sizeof ctx->rng.s);
    return UMT_OK;
}
