/*
 * kernels/cuda/optim.cu — optimizer updates, in place, one thread per element.
 *
 * The formulas, and the order of every operation, are those of kernels/cpu/optim.c (PyTorch's
 * single-tensor update rules; the formulas are written out there). Multiplies and adds go
 * through the __f*_rn intrinsics so that nvcc cannot fuse them into FMAs: each operation is
 * rounded as on the CPU, and a run on the GPU follows the CPU's bit for bit. The step-dependent
 * Adam corrections are computed on the host, in double, exactly as the CPU file does.
 */
#include <math.h>

#include "core/cuda_check.h"
#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch.h"


static __global__ void sgd_kernel(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                  float momentum, float weight_decay) {
    FOR_EACH_INDEX(i, n) {
        float g = __fadd_rn(grad[i], __fmul_rn(weight_decay, param[i]));
        if (momentum != 0.0f) {
            velocity[i] = __fadd_rn(__fmul_rn(momentum, velocity[i]), g);
            g = velocity[i];
        }
        param[i] = __fsub_rn(param[i], __fmul_rn(lr, g));
    }
}

/* The host-computed, step-dependent factors of one Adam step. */
typedef struct {
    float step_size;             /* lr / (1 - beta1^step) */
    float bias_correction2_sqrt; /* sqrt(1 - beta2^step) */
    float decay;                 /* AdamW's 1 - lr * weight_decay, or 1 */
} adam_factors;

static __global__ void adam_kernel(float *param, const float *grad, float *m, float *v, int64_t n, float beta1,
                                   float beta2, float eps, float weight_decay, bool decoupled, adam_factors f) {
    float one_minus_beta1 = 1.0f - beta1, one_minus_beta2 = 1.0f - beta2;
    FOR_EACH_INDEX(i, n) {
        float g = grad[i];
        if (decoupled)
            param[i] = __fmul_rn(param[i], f.decay);
        else
            g = __fadd_rn(g, __fmul_rn(weight_decay, param[i]));
        m[i] = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_beta1, g));
        v[i] = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[i]), f.bias_correction2_sqrt), eps);
        param[i] = __fsub_rn(param[i], __fdiv_rn(__fmul_rn(f.step_size, m[i]), denom));
    }
}

static __global__ void adadelta_kernel(float *param, const float *grad, float *square_avg, float *delta_avg,
                                       int64_t n, float lr, float rho, float eps, float weight_decay) {
    float one_minus_rho = 1.0f - rho;
    FOR_EACH_INDEX(i, n) {
        float g = __fadd_rn(grad[i], __fmul_rn(weight_decay, param[i]));
        square_avg[i] = __fadd_rn(__fmul_rn(rho, square_avg[i]), __fmul_rn(__fmul_rn(one_minus_rho, g), g));
        float std_dev = __fsqrt_rn(__fadd_rn(square_avg[i], eps));
        float delta = __fmul_rn(__fdiv_rn(__fsqrt_rn(__fadd_rn(delta_avg[i], eps)), std_dev), g);
        delta_avg[i] = __fadd_rn(__fmul_rn(rho, delta_avg[i]), __fmul_rn(__fmul_rn(one_minus_rho, delta), delta));
        param[i] = __fsub_rn(param[i], __fmul_rn(lr, delta));
    }
}

extern "C" umt_status umt_cuda_sgd_update(float *param, const float *grad, float *velocity, int64_t n, float lr,
                                          float momentum, float weight_decay) {
    if (momentum != 0.0f && !velocity)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "sgd_update: momentum %g needs a velocity buffer (got NULL)",
                        momentum);
    if (n <= 0) return UMT_OK;
    sgd_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, velocity, n, lr, momentum,
                                                                 weight_decay);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_adam_update(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                                           float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                                           int64_t step) {
    if (step < 1) return umt_fail(UMT_ERR_INVALID_ARGUMENT, "adam_update: step %lld (expected >= 1)", (long long)step);
    if (n <= 0) return UMT_OK;
    double bias_correction1 = 1.0 - pow(beta1, (double)step);
    double bias_correction2 = 1.0 - pow(beta2, (double)step);
    adam_factors f;
    f.step_size = (float)(lr / bias_correction1);
    f.bias_correction2_sqrt = (float)sqrt(bias_correction2);
    f.decay = decoupled ? 1.0f - lr * weight_decay : 1.0f;
    adam_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, m, v, n, beta1, beta2, eps,
                                                                  weight_decay, decoupled, f);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}

extern "C" umt_status umt_cuda_adadelta_update(float *param, const float *grad, float *square_avg, float *delta_avg,
                                               int64_t n, float lr, float rho, float eps, float weight_decay) {
    if (n <= 0) return UMT_OK;
    adadelta_kernel<<<blocks_for(n), THREADS, 0, umt_cuda_stream()>>>(param, grad, square_avg, delta_avg, n, lr, rho,
                                                                      eps, weight_decay);
    UMT_CUDA_LAUNCHED();
    return UMT_OK;
}
