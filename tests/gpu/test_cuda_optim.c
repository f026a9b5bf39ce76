/*
 * tests/gpu/test_cuda_optim.c — the mixed-precision optimizer step (kernels/optim_step.h) on the
 * GPU against the CPU reference, on fresh random inputs: the fused updates with their bf16/f16
 * copies, the deterministic sum of squares and the step's decision (clipping, loss scaling,
 * skipping on inf/NaN, growth), then the same through the public API on a CUDA context; and
 * the multi-tensor update (all parameters in one launch) against the per-tensor fused updates,
 * both on the GPU, bit for bit. The non-finite check (issue 26): a NaN loss or gradient found
 * by the GPU's decision as by the CPU's, the same step, culprit and doorbell (a kernel's store
 * into pinned host memory), no update written under stop from that step on; and the decision
 * over more tensors than one launch takes (its last launch's last block decides).
 *
 * Each kernel runs through the CPU table on host buffers and through the CUDA table on device
 * copies of the same values. Where the plain updates are bit-exact (no clipping: the multiplier
 * is 1 / a power of two), everything must match bit for bit; with clipping, the two sums of
 * squares add in different orders, so the multiplier and what follows from it match within
 * 1e-6 relative (the parameters within 1e-5 relative + 1e-6).
 *
 * The seed is printed once; UMT_TEST_SEED=<seed> repeats a run. Needs a GPU (tag "gpu"):
 *     bazel test --config=cuda //tests/gpu:test_cuda_optim
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/optim/optim.h"
#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/optim_step.h"
#include "tests/gpu/kernel_twins.h"
#include "umtrain.h"

static umt_context *gpu_context; /* holds the CUDA backend (its stream) for the kernel tests */

/* Sets both sides of an f32 twin to the same fresh random values, times scale. */
static void refill(twin t, float lo, float hi, float scale) {
    float *host = t.host;
    for (size_t i = 0; i < t.bytes / sizeof(float); i++) host[i] = uniform(lo, hi) * scale;
    CUDA_OK(cudaMemcpy(t.device, t.host, t.bytes, cudaMemcpyHostToDevice));
}

static void expect_same_bytes(const char *what, twin t) {
    const uint8_t *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes; i++)
        if (got[i] != want[i])
            fail_msg("%s: byte %zu: cuda %02x, cpu %02x (seed %u)", what, i, got[i], want[i], run_seed);
}

static void expect_close(const char *what, twin t) {
    const float *want = t.host, *got = downloaded(t);
    for (size_t i = 0; i < t.bytes / sizeof(float); i++) {
        double bound = 1e-5 * fabs(want[i]) + 1e-6;
        if (!(fabs((double)got[i] - want[i]) <= bound))
            fail_msg("%s[%zu]: cuda %.9g, cpu %.9g (seed %u)", what, i, got[i], want[i], run_seed);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* One "optimizer" of a few parameters, run on both sides through the backend slots            */

enum { MAX_PARAMS = 3 };

typedef struct {
    umt_optimizer_kind kind;
    int count;
    int64_t n[MAX_PARAMS];
    twin param[MAX_PARAMS], grad[MAX_PARAMS], s0[MAX_PARAMS], s1[MAX_PARAMS], lowp[MAX_PARAMS];
    umt_dtype lowp_dtype;
    twin scalars, partials;
    umt_step_options options;
    twin loss;                   /* the step's loss, read by the non-finite check */
    int64_t *doorbell[2];        /* the check's doorbell: CPU memory, and pinned memory for the GPU */
    bool consume;                /* the updates zero the gradients they read (umt_update_fusion.zero_grad) */
} rig;

static rig make_rig(umt_optimizer_kind kind, int count, const int64_t *n, umt_step_options options) {
    rig r = {.kind = kind, .count = count, .options = options};
    r.lowp_dtype = (random_u32() & 1) ? UMT_BF16 : UMT_F16;
    for (int i = 0; i < count; i++) {
        r.n[i] = n[i];
        r.param[i] = twin_random(n[i], -1, 1);
        r.grad[i] = twin_random(n[i], -1, 1);
        r.s0[i] = twin_random(n[i], 0, 1); /* non-negative: Adam's v and Adadelta's averages */
        r.s1[i] = twin_random(n[i], 0, 1);
        uint16_t *poison = malloc((size_t)n[i] * 2);
        memset(poison, 0xff, (size_t)n[i] * 2);
        r.lowp[i] = twin_of(poison, (size_t)n[i] * 2);
        free(poison);
    }
    umt_step_scalars initial = umt_step_scalars_initial(options.loss_scaling, 1024.0f);
    r.scalars = twin_of(&initial, sizeof initial);
    double *zeros = calloc((size_t)count * UMT_GRAD_SUMSQ_PARTIALS, sizeof *zeros);
    r.partials = twin_of(zeros, (size_t)count * UMT_GRAD_SUMSQ_PARTIALS * sizeof *zeros);
    free(zeros);
    float loss = 2.5f;
    r.loss = twin_of(&loss, sizeof loss);
    if (options.nonfinite == UMT_NONFINITE_OFF) return r;
    r.doorbell[0] = calloc(1, sizeof(int64_t));
    CUDA_OK(cudaHostAlloc((void **)&r.doorbell[1], sizeof(int64_t), cudaHostAllocDefault));
    *r.doorbell[1] = 0;
    return r;
}

static void free_doorbells(rig *r) {
    free(r->doorbell[0]);
    cudaFreeHost(r->doorbell[1]);
}

/* P(t) (kernel_twins.h) names the host side for the CPU, the device side for CUDA. */
/* One step of the rig through one backend: sums of squares, the decision, the updates. */
static void step_on(const umt_backend *be, rig *r, int64_t step) {
    on_device = be == gpu;
    umt_update_tensor tensors[MAX_PARAMS];
    for (int i = 0; i < r->count; i++) tensors[i] = (umt_update_tensor){.grad = P(r->grad[i]), .n = r->n[i]};
    umt_step_options options = r->options;
    if (options.nonfinite != UMT_NONFINITE_OFF) {
        options.loss = P(r->loss);
        options.doorbell = r->doorbell[on_device];
    }
    EXPECT_OK(be->f32.step_decide(tensors, r->count, P(r->partials), P(r->scalars), options));
    for (int i = 0; i < r->count; i++) {
        umt_update_fusion fusion = {.scalars = P(r->scalars), .lowp = P(r->lowp[i]), .lowp_dtype = r->lowp_dtype,
                                    .zero_grad = r->consume};
        switch (r->kind) {
        case UMT_OPT_SGD:
            EXPECT_OK(be->f32.sgd_update_fused(P(r->param[i]), P(r->grad[i]), P(r->s0[i]), r->n[i], 0.1f, 0.9f, 1e-2f,
                                           fusion));
            break;
        case UMT_OPT_ADAM:
        case UMT_OPT_ADAMW:
            EXPECT_OK(be->f32.adam_update_fused(P(r->param[i]), P(r->grad[i]), P(r->s0[i]), P(r->s1[i]), r->n[i], 1e-3f,
                                            0.9f, 0.999f, 1e-8f, 1e-2f, r->kind == UMT_OPT_ADAMW, step, fusion));
            break;
        case UMT_OPT_ADADELTA:
            EXPECT_OK(be->f32.adadelta_update_fused(P(r->param[i]), P(r->grad[i]), P(r->s0[i]), P(r->s1[i]), r->n[i],
                                                1.0f, 0.9f, 1e-6f, 1e-2f, fusion));
            break;
        }
    }
}

static void step_both(rig *r, int64_t step) {
    step_on(cpu, r, step);
    step_on(gpu, r, step);
}

#define SAME_BITS(field) assert_memory_equal(&got.field, &want.field, sizeof got.field)

/* Relative closeness of two floats; equal infinities and two NaNs count as close. */
static bool close_enough(float got, float want) {
    return got == want || (isnan(got) && isnan(want)) || fabsf(got - want) <= 1e-6f * fabsf(want);
}

/* The step scalars of both sides, field by field: exactly, but grad_norm (and, with clipping,
 * the multiplier) within 1e-6 relative, since the sums add in different orders. The multiplier
 * of a skipped step is meaningless and not compared. */
static void expect_same_scalars(const rig *r) {
    umt_step_scalars got, want;
    memcpy(&want, r->scalars.host, sizeof want);
    memcpy(&got, downloaded(r->scalars), sizeof got);
    if (!close_enough(got.grad_norm, want.grad_norm))
        fail_msg("grad_norm: cuda %.9g, cpu %.9g (seed %u)", got.grad_norm, want.grad_norm, run_seed);
    assert_int_equal(got.found_inf, want.found_inf);
    if (!want.found_inf) {
        bool clipped = r->options.max_grad_norm > 0.0f;
        if (clipped ? !close_enough(got.multiplier, want.multiplier) : got.multiplier != want.multiplier)
            fail_msg("multiplier: cuda %.9g, cpu %.9g (seed %u)", got.multiplier, want.multiplier, run_seed);
    }
    SAME_BITS(loss_scale);
    SAME_BITS(growth_count);
    SAME_BITS(skipped_steps);
    SAME_BITS(applied_steps);
    SAME_BITS(adam_step_size);
    SAME_BITS(adam_bias_correction2_sqrt);
    SAME_BITS(steps);
    SAME_BITS(nonfinite_steps);
    SAME_BITS(first_nonfinite_step);
    SAME_BITS(first_nonfinite_loss);
    SAME_BITS(first_nonfinite_what);
    SAME_BITS(first_nonfinite_tensor);
    SAME_BITS(stopped);
    SAME_BITS(blocks_done); /* 0: the GPU's counter is ready for the next step */
}

static void expect_same_updates(const rig *r, bool exact) {
    static const char *const names[] = {"param", "state 0", "state 1"};
    for (int i = 0; i < r->count; i++) {
        const twin outs[] = {r->param[i], r->s0[i], r->s1[i]};
        for (int k = 0; k < 3; k++) exact ? expect_same_bytes(names[k], outs[k]) : expect_close(names[k], outs[k]);
        /* The copy is the master rounded once: comparable exactly when the masters are. */
        if (exact) expect_same_bytes("lowp copy", r->lowp[i]);
    }
}

static umt_step_options scaling_options(umt_optimizer_kind kind, float max_grad_norm, int growth_interval) {
    umt_step_options o = {.max_grad_norm = max_grad_norm, .loss_scaling = true, .growth_interval = growth_interval,
                          .adam = kind == UMT_OPT_ADAM || kind == UMT_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f,
                          .beta2 = 0.999f};
    return o;
}

/* ------------------------------------------------------------------------------------------ */
/* The kernels                                                                                 */

static void test_fused_scaled_updates_and_lowp_copies_match_the_cpu_bit_for_bit(void **state) {
    (void)state;
    static const int64_t sizes[] = {1, 7, 1000, 65537};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; kind++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            rig r = make_rig((umt_optimizer_kind)kind, 1, &sizes[s], scaling_options((umt_optimizer_kind)kind, 0, 2));
            for (int64_t step = 1; step <= 3; step++) {
                /* Gradients carry the scale (1024, then 2048 after two clean steps): exact. */
                umt_step_scalars *host = r.scalars.host;
                refill(r.grad[0], -1, 1, host->loss_scale);
                step_both(&r, step);
                expect_same_scalars(&r);
            }
            expect_same_updates(&r, true);
        }
}

static void test_clipped_updates_over_several_parameters_match_the_cpu(void **state) {
    (void)state;
    const int64_t n[MAX_PARAMS] = {1000, 65537, 7};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; kind++) {
        /* Norm about sqrt(66544 / 3) * 1024 unscaled ~ 149: a max of 1 clips hard. */
        umt_step_options options = scaling_options((umt_optimizer_kind)kind, 1.0f, 2000);
        rig r = make_rig((umt_optimizer_kind)kind, MAX_PARAMS, n, options);
        for (int64_t step = 1; step <= 3; step++) {
            for (int i = 0; i < MAX_PARAMS; i++) refill(r.grad[i], -1, 1, 1024.0f);
            step_both(&r, step);
            expect_same_scalars(&r);
        }
        umt_step_scalars *host = r.scalars.host;
        assert_true(host->multiplier < 1.0f / 1024.0f / 10.0f);
        expect_same_updates(&r, false);
    }
}

static void test_an_inf_or_nan_gradient_skips_the_step_on_the_gpu_as_on_the_cpu(void **state) {
    (void)state;
    const int64_t n[MAX_PARAMS] = {1000, 65537, 7};
    const float poisons[2] = {INFINITY, NAN};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; kind++)
        for (int k = 0; k < 2; k++) {
            umt_step_options options = scaling_options((umt_optimizer_kind)kind, 1.0f, 2000);
        rig r = make_rig((umt_optimizer_kind)kind, MAX_PARAMS, n, options);
            /* The lowp copies start poisoned: a skipped step must not write them either. */
            int which = (int)(random_u32() % MAX_PARAMS);
            int64_t at = (int64_t)(random_u32() % (uint32_t)n[which]);
            ((float *)r.grad[which].host)[at] = poisons[k];
            CUDA_OK(cudaMemcpy(r.grad[which].device, r.grad[which].host, r.grad[which].bytes, cudaMemcpyHostToDevice));
            void *saved[MAX_PARAMS][4];
            for (int i = 0; i < MAX_PARAMS; i++) {
                const twin outs[4] = {r.param[i], r.s0[i], r.s1[i], r.lowp[i]};
                for (int o = 0; o < 4; o++) {
                    saved[i][o] = malloc(outs[o].bytes);
                    memcpy(saved[i][o], outs[o].host, outs[o].bytes);
                }
            }
            step_both(&r, 1);
            expect_same_scalars(&r);
            umt_step_scalars *host = r.scalars.host;
            assert_int_equal(host->found_inf, 1);
            assert_int_equal(host->skipped_steps, 1);
            assert_int_equal(host->applied_steps, 0);
            assert_float_equal(host->loss_scale, 512.0, 0.0);
            for (int i = 0; i < MAX_PARAMS; i++) {
                const twin outs[4] = {r.param[i], r.s0[i], r.s1[i], r.lowp[i]};
                for (int o = 0; o < 4; o++) {
                    assert_memory_equal(outs[o].host, saved[i][o], outs[o].bytes); /* the CPU wrote nothing */
                    expect_same_bytes("skipped step's buffer", outs[o]);          /* nor did the GPU */
                    free(saved[i][o]);
                }
            }
        }
}

/* Whether both sides of every gradient of the rig are all zeros (+0.0). */
static void expect_zero_gradients(const rig *r, const char *when) {
    for (int i = 0; i < r->count; i++) {
        const uint8_t *host = r->grad[i].host, *device = downloaded(r->grad[i]);
        for (size_t k = 0; k < r->grad[i].bytes; k++)
            if (host[k] || device[k])
                fail_msg("%s: gradient %d byte %zu: cpu %02x, cuda %02x (expected zeros; seed %u)", when, i, k,
                         host[k], device[k], run_seed);
    }
}

/* Updates that consume their gradients (zero_grad) move everything as those that do not, bit
 * for bit, on both sides, and leave the gradients zero; a skipped step (an inf) zeroes them too
 * and writes nothing else. */
static void test_updates_that_consume_their_gradients_zero_them_and_move_the_same(void **state) {
    (void)state;
    const int64_t n[MAX_PARAMS] = {1000, 65537, 7};
    for (int kind = UMT_OPT_SGD; kind <= UMT_OPT_ADADELTA; kind++) {
        umt_step_options options = scaling_options((umt_optimizer_kind)kind, 0, 2000);
        rig keep = make_rig((umt_optimizer_kind)kind, MAX_PARAMS, n, options);
        rig eat = keep;
        eat.consume = true;
        for (int i = 0; i < MAX_PARAMS; i++) {
            eat.param[i] = twin_of(keep.param[i].host, keep.param[i].bytes);
            eat.s0[i] = twin_of(keep.s0[i].host, keep.s0[i].bytes);
            eat.s1[i] = twin_of(keep.s1[i].host, keep.s1[i].bytes);
            eat.lowp[i] = twin_of(keep.lowp[i].host, keep.lowp[i].bytes);
            eat.grad[i] = twin_of(keep.grad[i].host, keep.grad[i].bytes);
        }
        eat.scalars = twin_of(keep.scalars.host, keep.scalars.bytes);
        eat.partials = twin_of(keep.partials.host, keep.partials.bytes);
        for (int64_t step = 1; step <= 2; step++) {
            for (int i = 0; i < MAX_PARAMS; i++) {
                refill(keep.grad[i], -1, 1, 1024.0f);
                memcpy(eat.grad[i].host, keep.grad[i].host, keep.grad[i].bytes);
                CUDA_OK(cudaMemcpy(eat.grad[i].device, keep.grad[i].host, keep.grad[i].bytes, cudaMemcpyHostToDevice));
            }
            step_both(&keep, step);
            step_both(&eat, step);
            expect_zero_gradients(&eat, "a clean step");
            for (int i = 0; i < MAX_PARAMS; i++) {
                const twin a[4] = {keep.param[i], keep.s0[i], keep.s1[i], keep.lowp[i]};
                const twin b[4] = {eat.param[i], eat.s0[i], eat.s1[i], eat.lowp[i]};
                for (int o = 0; o < 4; o++) {
                    assert_memory_equal(a[o].host, b[o].host, a[o].bytes);
                    assert_memory_equal(downloaded(a[o]), downloaded(b[o]), a[o].bytes);
                }
            }
            expect_same_updates(&eat, true);
        }
        /* An inf: the step is skipped, the gradients are zeroed all the same, nothing else moves. */
        for (int i = 0; i < MAX_PARAMS; i++) refill(eat.grad[i], -1, 1, 1024.0f);
        ((float *)eat.grad[1].host)[5] = INFINITY;
        CUDA_OK(cudaMemcpy(eat.grad[1].device, eat.grad[1].host, eat.grad[1].bytes, cudaMemcpyHostToDevice));
        void *saved[MAX_PARAMS];
        for (int i = 0; i < MAX_PARAMS; i++) {
            saved[i] = malloc(eat.param[i].bytes);
            memcpy(saved[i], eat.param[i].host, eat.param[i].bytes);
        }
        step_both(&eat, 3);
        assert_int_equal(((umt_step_scalars *)eat.scalars.host)->found_inf, 1);
        expect_zero_gradients(&eat, "a skipped step");
        for (int i = 0; i < MAX_PARAMS; i++) {
            assert_memory_equal(eat.param[i].host, saved[i], eat.param[i].bytes);
            expect_same_bytes("skipped step's parameter", eat.param[i]);
            free(saved[i]);
        }
    }
}

/* Sets both sides of a one-float twin. */
static void set_float(twin t, float value) {
    *(float *)t.host = value;
    CUDA_OK(cudaMemcpy(t.device, &value, sizeof value, cudaMemcpyHostToDevice));
}

/* Copies of every buffer a step may write, the CPU's side (the GPU's must match it). */
static void save_outputs(const rig *r, void *saved[MAX_PARAMS][4]) {
    for (int i = 0; i < r->count; i++) {
        const twin outs[4] = {r->param[i], r->s0[i], r->s1[i], r->lowp[i]};
        for (int o = 0; o < 4; o++) {
            saved[i][o] = malloc(outs[o].bytes);
            memcpy(saved[i][o], outs[o].host, outs[o].bytes);
        }
    }
}

/* Nothing written since save_outputs, on either side; the copies freed. */
static void expect_nothing_written(const rig *r, void *saved[MAX_PARAMS][4]) {
    for (int i = 0; i < r->count; i++) {
        const twin outs[4] = {r->param[i], r->s0[i], r->s1[i], r->lowp[i]};
        for (int o = 0; o < 4; o++) {
            assert_memory_equal(outs[o].host, saved[i][o], outs[o].bytes);
            expect_same_bytes("a skipped step's buffer", outs[o]);
            free(saved[i][o]);
        }
    }
}

/* fp32/bf16's check (no scaler): a NaN loss, or a NaN in the second parameter's gradient, at step
 * 2 of 3: the same decision, step, culprit and doorbell on both sides; nothing written from it
 * on under stop, the clean step 3 applied under skip. */
static void test_the_nonfinite_check_decides_on_the_gpu_as_on_the_cpu(void **state) {
    (void)state;
    const int64_t n[MAX_PARAMS] = {1000, 65537, 7};
    for (int policy = UMT_NONFINITE_STOP; policy <= UMT_NONFINITE_SKIP; policy++)
        for (int on_loss = 0; on_loss < 2; on_loss++) {
            umt_step_options options = {.growth_interval = 2000, .nonfinite = (umt_nonfinite_policy)policy};
            rig r = make_rig(UMT_OPT_SGD, MAX_PARAMS, n, options);
            step_both(&r, 1);
            expect_same_scalars(&r);
            assert_int_equal(*r.doorbell[0], 0);
            void *saved[MAX_PARAMS][4];
            save_outputs(&r, saved);
            if (on_loss) {
                set_float(r.loss, NAN);
            } else {
                ((float *)r.grad[1].host)[4321] = NAN;
                CUDA_OK(cudaMemcpy(r.grad[1].device, r.grad[1].host, r.grad[1].bytes, cudaMemcpyHostToDevice));
            }
            step_both(&r, 2);
            expect_same_scalars(&r);
            umt_step_scalars *host = r.scalars.host;
            assert_int_equal(host->found_inf, 1);
            assert_int_equal(host->first_nonfinite_step, 2);
            assert_int_equal(host->first_nonfinite_tensor, on_loss ? -1 : 1);
            int32_t what = on_loss ? UMT_NONFINITE_FOUND_LOSS : UMT_NONFINITE_FOUND_GRADIENT;
            assert_int_equal(host->first_nonfinite_what, what);
            CUDA_OK(cudaDeviceSynchronize());
            assert_int_equal(*r.doorbell[0], 2);
            assert_int_equal(*(volatile int64_t *)r.doorbell[1], 2); /* the kernel's store into pinned memory */
            expect_nothing_written(&r, saved);
            /* A clean step 3: stopped for good, or applied. */
            set_float(r.loss, 2.5f);
            for (int i = 0; i < MAX_PARAMS; i++) refill(r.grad[i], -1, 1, 1.0f);
            if (policy == UMT_NONFINITE_STOP) save_outputs(&r, saved);
            step_both(&r, 3);
            expect_same_scalars(&r);
            assert_int_equal(host->found_inf, policy == UMT_NONFINITE_STOP);
            assert_int_equal(host->nonfinite_steps, 1);
            if (policy == UMT_NONFINITE_STOP) expect_nothing_written(&r, saved);
            else expect_same_updates(&r, true);
            free_doorbells(&r);
        }
}

/* More tensors than one launch takes (32): the partials of every launch, the decision in the last
 * launch's last block, a NaN in tensor 35 named as the CPU names it. */
static void test_the_decision_over_many_tensors_names_a_nonfinite_one_past_the_first_launch(void **state) {
    (void)state;
    enum { COUNT = 40 };
    twin grads[COUNT];
    umt_update_tensor on_cpu[COUNT], on_gpu[COUNT];
    for (int i = 0; i < COUNT; i++) {
        int64_t n = 100 + 37 * i;
        grads[i] = twin_random(n, -1, 1);
        on_cpu[i] = (umt_update_tensor){.grad = grads[i].host, .n = n};
        on_gpu[i] = (umt_update_tensor){.grad = grads[i].device, .n = n};
    }
    umt_step_scalars initial = umt_step_scalars_initial(false, 1.0f);
    /* The partials are doubles: written by both backends before they are read. */
    twin scalars = twin_of(&initial, sizeof initial);
    twin partials = twin_poisoned((size_t)COUNT * UMT_GRAD_SUMSQ_PARTIALS * sizeof(double));
    umt_step_options options = {.growth_interval = 1, .nonfinite = UMT_NONFINITE_SKIP};
    for (int poisoned = 1; poisoned >= 0; poisoned--) {
        ((float *)grads[35].host)[600] = poisoned ? NAN : 0.5f;
        CUDA_OK(cudaMemcpy(grads[35].device, grads[35].host, grads[35].bytes, cudaMemcpyHostToDevice));
        EXPECT_OK(cpu->f32.step_decide(on_cpu, COUNT, partials.host, scalars.host, options));
        EXPECT_OK(gpu->f32.step_decide(on_gpu, COUNT, partials.device, scalars.device, options));
        umt_step_scalars want, got;
        memcpy(&want, scalars.host, sizeof want);
        memcpy(&got, downloaded(scalars), sizeof got);
        assert_int_equal(got.found_inf, poisoned);
        assert_int_equal(want.found_inf, poisoned);
        assert_int_equal(got.first_nonfinite_tensor, 35);
        assert_int_equal(want.first_nonfinite_tensor, 35);
        assert_int_equal(got.steps, want.steps);
        assert_int_equal(got.nonfinite_steps, 1);
        assert_int_equal(got.blocks_done, 0);
        if (!poisoned && !close_enough(got.grad_norm, want.grad_norm))
            fail_msg("grad_norm: cuda %.9g, cpu %.9g (seed %u)", got.grad_norm, want.grad_norm, run_seed);
    }
}

/* The CUDA sum of squares in its own order, replayed on the host: partial `share` of a gradient
 * is thread t's walk (elements share * 256 + t, then every UMT_GRAD_SUMSQ_PARTIALS * 256 on, in
 * order, in double), then the block's fixed tree over its 256 threads. */
static double replayed_partial(const float *grad, int64_t n, int share) {
    enum { BLOCK = 256 };
    double walks[BLOCK];
    const int64_t stride = (int64_t)UMT_GRAD_SUMSQ_PARTIALS * BLOCK;
    for (int t = 0; t < BLOCK; t++) {
        walks[t] = 0.0;
        for (int64_t i = (int64_t)share * BLOCK + t; i < n; i += stride) walks[t] += (double)grad[i] * grad[i];
    }
    for (int half = BLOCK / 2; half > 0; half /= 2)
        for (int t = 0; t < half; t++) walks[t] += walks[t + half];
    return walks[0];
}

/* Gradients long enough that each thread walks far (a linear layer's 1,179,648), and short ones
 * whose shares past their elements get no block of their own (a bias of 10, a filter of 300,
 * one share short of all 128): every partial equals the host's replay of the kernel's order, bit
 * for bit (zeros where a share holds nothing, written over poisoned partials), and the norm is
 * the CPU's within rounding. */
static void test_the_sum_of_squares_of_long_gradients_keeps_its_order(void **state) {
    (void)state;
    enum { COUNT = 7 };
    const int64_t lengths[COUNT] = {65537, 10, 1179648, 300, 300001, 127 * 256 - 1, 8 * 8192 * 3 + 5};
    twin grads[COUNT];
    umt_update_tensor on_cpu[COUNT], on_gpu[COUNT];
    for (int i = 0; i < COUNT; i++) {
        grads[i] = twin_random(lengths[i], -1, 1);
        on_cpu[i] = (umt_update_tensor){.grad = grads[i].host, .n = lengths[i]};
        on_gpu[i] = (umt_update_tensor){.grad = grads[i].device, .n = lengths[i]};
    }
    umt_step_scalars initial = umt_step_scalars_initial(false, 1.0f);
    twin scalars = twin_of(&initial, sizeof initial);
    twin partials = twin_poisoned((size_t)COUNT * UMT_GRAD_SUMSQ_PARTIALS * sizeof(double));
    umt_step_options options = {.growth_interval = 1, .nonfinite = UMT_NONFINITE_SKIP};
    EXPECT_OK(gpu->f32.step_decide(on_gpu, COUNT, partials.device, scalars.device, options));
    const double *got = downloaded(partials);
    for (int i = 0; i < COUNT; i++)
        for (int share = 0; share < UMT_GRAD_SUMSQ_PARTIALS; share++) {
            double want = replayed_partial(grads[i].host, lengths[i], share);
            double have = got[i * UMT_GRAD_SUMSQ_PARTIALS + share];
            if (memcmp(&want, &have, sizeof want) != 0)
                fail_msg("gradient %d (%lld elements), partial %d: cuda %.17g, replayed %.17g (seed %u)", i,
                         (long long)lengths[i], share, have, want, run_seed);
        }
    umt_step_scalars on_device;
    memcpy(&on_device, downloaded(scalars), sizeof on_device);
    EXPECT_OK(cpu->f32.step_decide(on_cpu, COUNT, partials.host, scalars.host, options));
    const umt_step_scalars *on_host = scalars.host;
    if (!close_enough(on_device.grad_norm, on_host->grad_norm))
        fail_msg("grad_norm: cuda %.9g, cpu %.9g (seed %u)", on_device.grad_norm, on_host->grad_norm, run_seed);
    assert_int_equal(on_device.found_inf, 0);
}

static void test_loss_scale_growth_and_backoff_match_the_cpu(void **state) {
    (void)state;
    const int64_t n = 4096;
    rig r = make_rig(UMT_OPT_ADAM, 1, &n, scaling_options(UMT_OPT_ADAM, 0, 2));
    /* clean x3 (1024 -> 2048 after two), inf (-> 1024), clean x2 (-> 2048) */
    const bool poisoned[6] = {false, false, false, true, false, false};
    const float scales[6] = {1024, 2048, 2048, 1024, 1024, 2048};
    for (int step = 0; step < 6; step++) {
        umt_step_scalars *host = r.scalars.host;
        refill(r.grad[0], -1, 1, host->loss_scale);
        if (poisoned[step]) {
            ((float *)r.grad[0].host)[random_u32() % n] = INFINITY;
            CUDA_OK(cudaMemcpy(r.grad[0].device, r.grad[0].host, r.grad[0].bytes, cudaMemcpyHostToDevice));
        }
        step_both(&r, step + 1);
        expect_same_scalars(&r);
        assert_float_equal(host->loss_scale, scales[step], 0.0);
    }
    umt_step_scalars *host = r.scalars.host;
    assert_int_equal(host->applied_steps, 5);
    assert_int_equal(host->skipped_steps, 1);
    expect_same_updates(&r, true);
}

/* ------------------------------------------------------------------------------------------ */
/* Through the public API on a CUDA context, against a CPU context                             */

/* w [n] with the given values, x fixed: grads of mean(w * x), plain or scaled with opt. */
static umt_tensor *linear_model(umt_context *ctx, const float *values, int64_t n) {
    umt_tensor *w = umt_parameter_new(ctx, "w", 1, &n);
    assert_non_null(w);
    EXPECT_OK(umt_tensor_copy_from_host(w, values, (size_t)n * sizeof(float)));
    return w;
}

static void backward_of_mean_product(umt_context *ctx, umt_tensor *w, const float *x_values, int64_t n,
                                     const umt_optimizer *opt) {
    EXPECT_OK(umt_step_begin(ctx));
    EXPECT_OK(umt_zero_grad(ctx));
    umt_tensor *x = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, n);
    assert_non_null(x);
    EXPECT_OK(umt_tensor_copy_from_host(x, x_values, (size_t)n * sizeof(float)));
    umt_tensor *loss = umt_mean(ctx, umt_mul(ctx, w, x));
    assert_non_null(loss);
    EXPECT_OK(opt ? umt_backward_scaled(ctx, loss, opt) : umt_backward(ctx, loss));
}

static void test_scaled_backward_and_clipped_step_on_a_cuda_context_match_the_cpu(void **state) {
    (void)state;
    enum { N = 5000 };
    static float values[N], x[N], plain[N], scaled[N], on_gpu[N], on_cpu[N];
    for (int i = 0; i < N; i++) {
        values[i] = uniform(-1, 1);
        x[i] = uniform(-100, 100);
    }
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    umt_context *host_ctx = NULL;
    EXPECT_OK(umt_context_create(&o, &host_ctx));
    umt_tensor *w_gpu = linear_model(gpu_context, values, N), *w_cpu = linear_model(host_ctx, values, N);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAMW);
    oo.loss_scaling = true;
    oo.max_grad_norm = 0.5f;
    umt_optimizer *opt_gpu = NULL, *opt_cpu = NULL;
    EXPECT_OK(umt_optimizer_create(gpu_context, &oo, &opt_gpu));
    EXPECT_OK(umt_optimizer_create(host_ctx, &oo, &opt_cpu));
    /* The seed is the scale, 65536: every gradient is 2^16 times umt_backward's, exactly. */
    backward_of_mean_product(gpu_context, w_gpu, x, N, NULL);
    EXPECT_OK(umt_tensor_copy_to_host(umt_tensor_grad(w_gpu), plain, sizeof plain));
    backward_of_mean_product(gpu_context, w_gpu, x, N, opt_gpu);
    EXPECT_OK(umt_tensor_copy_to_host(umt_tensor_grad(w_gpu), scaled, sizeof scaled));
    for (int i = 0; i < N; i++)
        if (scaled[i] != 65536.0f * plain[i]) fail_msg("grad[%d]: %.9g, expected 65536 x %.9g", i, scaled[i], plain[i]);
    backward_of_mean_product(host_ctx, w_cpu, x, N, opt_cpu);
    EXPECT_OK(umt_optimizer_step(opt_gpu));
    EXPECT_OK(umt_optimizer_step(opt_cpu));
    EXPECT_OK(umt_tensor_copy_to_host(w_gpu, on_gpu, sizeof on_gpu));
    EXPECT_OK(umt_tensor_copy_to_host(w_cpu, on_cpu, sizeof on_cpu));
    for (int i = 0; i < N; i++)
        if (!(fabsf(on_gpu[i] - on_cpu[i]) <= 1e-5f * fabsf(on_cpu[i]) + 1e-6f))
            fail_msg("w[%d]: cuda %.9g, cpu %.9g (seed %u)", i, on_gpu[i], on_cpu[i], run_seed);
    assert_int_equal(umt_optimizer_skipped_steps(opt_gpu), 0);
    /* An overflowing gradient on the GPU: the step is skipped and the scale halves. */
    float poison = INFINITY;
    EXPECT_OK(gpu->f32.upload((float *)umt_tensor_grad(w_gpu)->data + (random_u32() % N), &poison, sizeof poison));
    EXPECT_OK(umt_optimizer_step(opt_gpu));
    EXPECT_OK(umt_tensor_copy_to_host(w_gpu, plain, sizeof plain));
    assert_memory_equal(plain, on_gpu, sizeof plain);
    assert_int_equal(umt_optimizer_skipped_steps(opt_gpu), 1);
    assert_float_equal(umt_optimizer_loss_scale(opt_gpu), 32768.0, 0.0);
    print_message("cuda: skipped %lld, scale %g after an injected inf\n",
                  (long long)umt_optimizer_skipped_steps(opt_gpu), umt_optimizer_loss_scale(opt_gpu));
    umt_context_destroy(host_ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* The multi-tensor update against the per-tensor updates, both on the GPU                     */

enum { MULTI_COUNT = 40 }; /* more than one launch's 32 tensors */

static int set_up(void **state);
static int tear_down(void **state);

typedef struct {
    twin param, grad, s0, s1, lowp;
    int64_t n, channels, pixels;
} multi_case;

/* A fresh tensor and its copy with the same bytes: sizes cross chunks, one is a conv weight
 * whose copy is NHWC (64 filters of 32 channels x 3x3), one a flattened linear weight's, large
 * enough for the multi-tensor kernel's tiles, whose channels and pixels (40 x 21) leave the
 * last tiles part empty, and one of one channel (its copy in the master's order). */
static void make_pair(int i, multi_case *a, multi_case *b) {
    enum { KINDS = 7 };
    static const int64_t sizes[KINDS] = {1, 7, 1000, 4097, 64 * 32 * 9, 80 * 40 * 21, 32 * 1 * 9};
    static const int64_t channels[KINDS] = {0, 0, 0, 0, 32, 40, 1}, pixels[KINDS] = {0, 0, 0, 0, 9, 21, 9};
    int64_t n = sizes[i % KINDS];
    a->n = b->n = n;
    a->channels = b->channels = channels[i % KINDS];
    a->pixels = b->pixels = pixels[i % KINDS];
    a->param = twin_random(n, -1, 1);
    a->grad = twin_random(n, -1, 1);
    a->s0 = twin_random(n, 0, 1);
    a->s1 = twin_random(n, 0, 1);
    uint16_t *poison = malloc((size_t)n * 2);
    memset(poison, 0xff, (size_t)n * 2);
    a->lowp = twin_of(poison, (size_t)n * 2);
    free(poison);
    b->param = twin_of(a->param.host, a->param.bytes);
    b->grad = twin_of(a->grad.host, a->grad.bytes);
    b->s0 = twin_of(a->s0.host, a->s0.bytes);
    b->s1 = twin_of(a->s1.host, a->s1.bytes);
    b->lowp = twin_of(a->lowp.host, a->lowp.bytes);
}

static void expect_same_device_bytes(const char *what, int i, twin a, twin b) {
    const uint8_t *x = downloaded(a), *y = downloaded(b);
    for (size_t k = 0; k < a.bytes; k++)
        if (x[k] != y[k]) fail_msg("%s of tensor %d: byte %zu: per-tensor %02x, multi %02x (seed %u)", what, i, k, x[k],
                                   y[k], run_seed);
}

/* The per-tensor fused slot on one tensor (the path the multi-tensor kernel must reproduce). */
static void update_one(const umt_update_rule *rule, const multi_case *c, umt_update_fusion fusion) {
    switch (rule->kind) {
    case UMT_OPT_SGD:
        EXPECT_OK(gpu->f32.sgd_update_fused(c->param.device, c->grad.device, rule->momentum != 0.0f ? c->s0.device : NULL,
                                        c->n, rule->lr, rule->momentum, rule->weight_decay, fusion));
        break;
    case UMT_OPT_ADAM:
    case UMT_OPT_ADAMW:
        EXPECT_OK(gpu->f32.adam_update_fused(c->param.device, c->grad.device, c->s0.device, c->s1.device, c->n, rule->lr,
                                         rule->beta1, rule->beta2, rule->eps, rule->weight_decay, rule->decoupled,
                                         rule->step, fusion));
        break;
    case UMT_OPT_ADADELTA:
        EXPECT_OK(gpu->f32.adadelta_update_fused(c->param.device, c->grad.device, c->s0.device, c->s1.device, c->n,
                                             rule->lr, rule->rho, rule->eps, rule->weight_decay, fusion));
        break;
    }
}

/* variant 0: plain; 1: step scalars (1/1024 loss scale) and bf16/f16 copies; 2: the same, and
 * the multi-tensor side reads the learning rate from the device; 3: as 2, both sides consuming
 * their gradients (zero_grad: the tiled and the plain kernels leave them zero). */
static void check_multi(umt_update_rule rule, int variant) {
    static multi_case a[MULTI_COUNT], b[MULTI_COUNT];
    umt_update_tensor tensors[MULTI_COUNT];
    umt_dtype lowp_dtype = (random_u32() & 1) ? UMT_BF16 : UMT_F16;
    for (int i = 0; i < MULTI_COUNT; i++) {
        make_pair(i, &a[i], &b[i]);
        tensors[i] = (umt_update_tensor){b[i].param.device, b[i].grad.device,
                                         rule.kind != UMT_OPT_SGD || rule.momentum != 0.0f ? b[i].s0.device : NULL,
                                         rule.kind != UMT_OPT_SGD ? b[i].s1.device : NULL,
                                         variant ? b[i].lowp.device : NULL, b[i].n, b[i].channels, b[i].pixels};
    }
    /* Scalars decided once by step_decide from the gradients (a clean step), shared read-only by both paths. */
    umt_step_scalars initial = umt_step_scalars_initial(true, 1024.0f);
    twin scalars = twin_of(&initial, sizeof initial);
    twin partials = twin_poisoned((size_t)UMT_GRAD_SUMSQ_PARTIALS * MULTI_COUNT * sizeof(double));
    umt_step_options options = {.loss_scaling = true, .growth_interval = 2000, .lr = rule.lr,
                                .adam = rule.kind == UMT_OPT_ADAM || rule.kind == UMT_OPT_ADAMW,
                                .beta1 = rule.beta1, .beta2 = rule.beta2};
    EXPECT_OK(gpu->f32.step_decide(tensors, MULTI_COUNT, partials.device, scalars.device, options));
    twin lr = twin_of(&rule.lr, sizeof rule.lr);
    umt_update_fusion common = {.scalars = variant ? scalars.device : NULL, .lowp_dtype = lowp_dtype,
                                .lr_on_device = variant >= 2 ? lr.device : NULL, .zero_grad = variant == 3};
    for (int i = 0; i < MULTI_COUNT; i++) {
        umt_update_fusion fusion = {.scalars = common.scalars, .lowp = variant ? a[i].lowp.device : NULL,
                                    .lowp_dtype = lowp_dtype, .lowp_channels = a[i].channels,
                                    .lowp_pixels = a[i].pixels, .zero_grad = variant == 3};
        update_one(&rule, &a[i], fusion);
    }
    EXPECT_OK(gpu->f32.multi_update(tensors, MULTI_COUNT, rule, common));
    for (int i = 0; i < MULTI_COUNT; i++) {
        expect_same_device_bytes("param", i, a[i].param, b[i].param);
        expect_same_device_bytes("state 0", i, a[i].s0, b[i].s0);
        expect_same_device_bytes("state 1", i, a[i].s1, b[i].s1);
        expect_same_device_bytes("lowp copy", i, a[i].lowp, b[i].lowp);
        expect_same_device_bytes("gradient", i, a[i].grad, b[i].grad);
        const uint8_t *g = downloaded(b[i].grad);
        for (size_t k = 0; variant == 3 && k < b[i].grad.bytes; k++)
            if (g[k]) fail_msg("consumed gradient of tensor %d: byte %zu is %02x (seed %u)", i, k, g[k], run_seed);
    }
    /* Each case makes 11 blocks per tensor pair: give them back before the next case. */
    tear_down(NULL);
    set_up(NULL);
}

static void test_multi_tensor_update_matches_the_per_tensor_updates_bit_for_bit(void **state) {
    (void)state;
    umt_update_rule rules[] = {
        {.kind = UMT_OPT_SGD, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-2f},
        {.kind = UMT_OPT_SGD, .lr = 0.1f},
        {.kind = UMT_OPT_ADAM, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f,
         .step = 3},
        {.kind = UMT_OPT_ADAMW, .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f,
         .decoupled = true, .step = 3},
        {.kind = UMT_OPT_ADADELTA, .lr = 1.0f, .rho = 0.9f, .eps = 1e-6f, .weight_decay = 1e-2f},
    };
    for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++)
        for (int variant = 0; variant < 4; variant++) check_multi(rules[r], variant);
}

/* ------------------------------------------------------------------------------------------ */

static int set_up(void **state) {
    seed_next_test(state);
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    if (umt_context_create(&o, &gpu_context) != UMT_OK) {
        print_message("cuda context: %s\n", umt_last_error());
        return -1;
    }
    return 0;
}

static int tear_down(void **state) {
    release_buffers(state);
    umt_context_destroy(gpu_context);
    gpu_context = NULL;
    return 0;
}

/* Each test in a CUDA context of its own (it starts the backend), the buffers the harness's. */
#undef TEST
#define TEST(f) cmocka_unit_test_setup_teardown(f, set_up, tear_down)

int main(void) {
    choose_run_seed();
    const struct CMUnitTest tests[] = {
        TEST(test_fused_scaled_updates_and_lowp_copies_match_the_cpu_bit_for_bit),
        TEST(test_clipped_updates_over_several_parameters_match_the_cpu),
        TEST(test_an_inf_or_nan_gradient_skips_the_step_on_the_gpu_as_on_the_cpu),
        TEST(test_updates_that_consume_their_gradients_zero_them_and_move_the_same),
        TEST(test_the_nonfinite_check_decides_on_the_gpu_as_on_the_cpu),
        TEST(test_the_decision_over_many_tensors_names_a_nonfinite_one_past_the_first_launch),
        TEST(test_the_sum_of_squares_of_long_gradients_keeps_its_order),
        TEST(test_loss_scale_growth_and_backoff_match_the_cpu),
        TEST(test_scaled_backward_and_clipped_step_on_a_cuda_context_match_the_cpu),
        TEST(test_multi_tensor_update_matches_the_per_tensor_updates_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
