/* core/precision.c — the mixed-precision policy (see core/precision.h). */
#include "core/precision.h"

#include <string.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"

#ifdef UMT_WITH_CUDA
#include <cuda_runtime.h>
#endif

size_t umt_compute_copy_bytes(umt_dtype compute, const umt_tensor *t) {
    bool copied = umt_dtype_is_lowp(compute) && t->kind_pool == UMT_POOL_WEIGHTS && t->dtype == UMT_F32 && t->ndim >= 2;
    return copied ? (size_t)t->numel * umt_dtype_size(compute) : 0;
}

static const char *const precision_names[] = {"fp32", "bf16", "fp16"};
#define PRECISION_COUNT ((int)(sizeof precision_names / sizeof precision_names[0]))

umt_status umt_precision_parse(const char *name, umt_precision *out) {
    if (!name || !out) return umt_fail_null("umt_precision_parse", name ? "out" : "name");
    for (int p = 0; p < PRECISION_COUNT; ++p)
        if (!strcmp(name, precision_names[p])) return *out = (umt_precision)p, UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "precision '%s': expected fp32, bf16 or fp16", name);
}

const char *umt_precision_name(umt_precision precision) {
    return (unsigned)precision < (unsigned)PRECISION_COUNT ? precision_names[precision] : "invalid-precision";
}

umt_precision umt_precision_default(umt_device device, int cuda_device) {
#ifdef UMT_WITH_CUDA
    int major = 0;
    /* Ampere (8.0) brought bf16 tensor cores; older GPUs would emulate it slowly. */
    if (device == UMT_DEVICE_CUDA &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cuda_device) == cudaSuccess && major >= 8)
        return UMT_PRECISION_BF16;
#else
    (void)device;
    (void)cuda_device;
#endif
    return UMT_PRECISION_FP32;
}

umt_status umt_precision_check(const umt_context *ctx) {
    umt_precision p = ctx->options.precision;
    if ((unsigned)p >= (unsigned)PRECISION_COUNT)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_context_create: precision %d (expected 0..%d)", (int)p,
                        PRECISION_COUNT - 1);
    if (p != UMT_PRECISION_FP32 && !umt_kernels(ctx)->lowp.gemm)
        return umt_fail(UMT_ERR_UNSUPPORTED, "umt_context_create: precision %s needs the CUDA backend (%s has fp32 only)",
                        umt_precision_name(p), umt_kernels(ctx)->name);
    return UMT_OK;
}

umt_precision umt_context_precision(const umt_context *ctx) {
    if (!ctx) return umt_fail_null("umt_context_precision", "ctx"), UMT_PRECISION_FP32;
    return ctx->options.precision;
}

umt_dtype umt_context_compute_dtype(const umt_context *ctx) {
    if (!ctx) return umt_fail_null("umt_context_compute_dtype", "ctx"), UMT_F32;
    return umt_compute_dtype(ctx);
}

umt_dtype umt_compute_dtype(const umt_context *ctx) {
    switch (ctx->options.precision) {
    case UMT_PRECISION_BF16: return UMT_BF16;
    case UMT_PRECISION_FP16: return UMT_F16;
    case UMT_PRECISION_FP32: break;
    }
    return UMT_F32;
}
