/*
 * tests/test_cpu_threads.c — the CPU backend's threads (kernels/cpu/threads.h): every threaded
 * kernel gives the same bits at 1, 2 and 3 threads (odd shapes, large enough to be split), and so
 * do training steps; a count of N runs N parts at once; kernels stay correct when called from
 * inside a part, from several threads at once and in a forked child; the count is set, read and
 * refused out of range.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threads.h"
#include "tests/conv_shape.h"
#include "umtrain.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */

static uint32_t lcg_state = 1;

/* Uniform in [-1, 1) from the top 24 bits of a 32-bit LCG. */
static float lcg_uniform(void) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)(lcg_state >> 8) / (float)(1u << 23) - 1.0f;
}

static float *random_floats(int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    assert_non_null(x);
    for (int64_t i = 0; i < n; i++) x[i] = lcg_uniform();
    return x;
}

static float *copy_floats(const float *x, int64_t n) {
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof *y);
    assert_non_null(y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* got equals want bit for bit, else fail naming the first element that differs. */
static void assert_same_bits(const void *got, const void *want, size_t bytes, const char *what, int threads) {
    if (memcmp(got, want, bytes) == 0) return;
    const uint8_t *g = got, *w = want;
    size_t at = 0;
    while (g[at] == w[at]) at++;
    fail_msg("%s at %d threads differs from 1 thread at byte %zu of %zu", what, threads, at, bytes);
}

/* Thread counts compared with one thread: a split in two, and one that leaves odd remainders. */
static const int counts[] = {2, 3};

/* ------------------------------------------------------------------------------------------ */
/* GEMM                                                                                        */

typedef struct {
    bool trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
} gemm_case;

/* C after one product at `threads` threads, from the same A, B and C each time (strides 3 past). */
static float *gemm_at(gemm_case t, int threads, const float *a, const float *b, const float *c0) {
    int64_t lda = (t.trans_a ? t.m : t.k) + 3, ldb = (t.trans_b ? t.k : t.n) + 3, ldc = t.n + 3;
    float *c = copy_floats(c0, t.m * ldc);
    assert_int_equal(umt_cpu_threads_set(threads), UMT_OK);
    assert_int_equal(umt_cpu_gemm(t.trans_a, t.trans_b, t.m, t.n, t.k, t.alpha, a, lda, b, ldb, t.beta, c, ldc),
                     UMT_OK);
    return c;
}

static void test_gemm_gives_the_same_bits_at_1_2_and_3_threads(void **state) {
    (void)state;
    /* Each is at least a million multiply-adds (gemm.c's least part), tall (split by rows) or
     * wide (by columns), with edges in every dimension. */
    const gemm_case cases[] = {
        {false, false, 97, 301, 67, 1.0f, 0.0f},  {true, false, 301, 97, 53, 0.5f, 1.0f},
        {false, true, 65, 389, 129, 1.0f, -0.75f}, {true, true, 389, 65, 71, -2.0f, 1.0f},
        {false, true, 64, 288, 576, 1.0f, 1.0f},   {false, false, 7, 1001, 300, 1.0f, 0.0f},
        {true, false, 1001, 5, 257, 1.0f, 0.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gemm_case t = cases[i];
        int64_t lda = (t.trans_a ? t.m : t.k) + 3, ldb = (t.trans_b ? t.k : t.n) + 3, ldc = t.n + 3;
        float *a = random_floats((t.trans_a ? t.k : t.m) * lda), *b = random_floats((t.trans_b ? t.n : t.k) * ldb);
        float *c0 = random_floats(t.m * ldc);
        float *one = gemm_at(t, 1, a, b, c0);
        for (size_t j = 0; j < sizeof counts / sizeof *counts; j++) {
            float *c = gemm_at(t, counts[j], a, b, c0);
            char what[96];
            snprintf(what, sizeof what, "gemm case %zu (%lldx%lldx%lld)", i, (long long)t.m, (long long)t.n,
                     (long long)t.k);
            assert_same_bits(c, one, (size_t)(t.m * ldc) * sizeof *c, what, counts[j]);
            free(c);
        }
        free(a), free(b), free(c0), free(one);
    }
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* Convolutions                                                                                */

/* y, dx (accumulated onto dx0) and dw (onto dw0) of one shape at `threads` threads. */
typedef struct {
    float *y, *dx, *dw;
} conv_out;

static conv_out conv_at(const umt_conv_shape *s, int threads, const float *x, const float *w, const float *dy,
                        const float *dx0, const float *dw0) {
    int64_t xs = s->n * s->c * s->h * s->w, ws = s->k * s->c * s->r * s->s, ys = s->n * s->k * s->p * s->q;
    size_t bytes = 0;
    assert_int_equal(umt_cpu_conv2d_workspace_bytes(s, &bytes), UMT_OK);
    void *workspace = malloc(bytes);
    assert_non_null(workspace);
    conv_out out = {random_floats(ys), copy_floats(dx0, xs), copy_floats(dw0, ws)};
    assert_int_equal(umt_cpu_threads_set(threads), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_forward(s, x, w, out.y, workspace, bytes), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_backward_data(s, w, dy, out.dx, workspace, bytes), UMT_OK);
    assert_int_equal(umt_cpu_conv2d_backward_filter(s, x, dy, out.dw, workspace, bytes), UMT_OK);
    free(workspace);
    return out;
}

static void test_convolutions_give_the_same_bits_at_1_2_and_3_threads(void **state) {
    (void)state;
    /* Odd sizes, stride 2 with padding and a non-square filter; stride 1 with padding; the MNIST
     * CNN's second layer at a small batch. */
    const umt_conv_shape shapes[] = {conv_shape(3, 13, 29, 23, 37, 3, 5, 2, 2),
                                     conv_shape(2, 9, 31, 27, 21, 3, 3, 1, 1),
                                     conv_shape(4, 32, 26, 26, 64, 3, 3, 1, 0)};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const umt_conv_shape *s = &shapes[i];
        int64_t xs = s->n * s->c * s->h * s->w, ws = s->k * s->c * s->r * s->s, ys = s->n * s->k * s->p * s->q;
        float *x = random_floats(xs), *w = random_floats(ws), *dy = random_floats(ys);
        float *dx0 = random_floats(xs), *dw0 = random_floats(ws);
        conv_out one = conv_at(s, 1, x, w, dy, dx0, dw0);
        for (size_t j = 0; j < sizeof counts / sizeof *counts; j++) {
            conv_out many = conv_at(s, counts[j], x, w, dy, dx0, dw0);
            assert_same_bits(many.y, one.y, (size_t)ys * sizeof(float), "conv2d_forward y", counts[j]);
            assert_same_bits(many.dx, one.dx, (size_t)xs * sizeof(float), "conv2d_backward_data dx", counts[j]);
            assert_same_bits(many.dw, one.dw, (size_t)ws * sizeof(float), "conv2d_backward_filter dw", counts[j]);
            free(many.y), free(many.dx), free(many.dw);
        }
        free(one.y), free(one.dx), free(one.dw);
        free(x), free(w), free(dy), free(dx0), free(dw0);
    }
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* The other threaded kernels                                                                  */

/* Pooling with bias, ReLU and dropout both ways, the channel bias sums, the ReLU mask, dropout
 * and the multi-tensor Adadelta update, in that order, at `threads` threads; out holds their
 * outputs one after another (out_count floats). */
enum { POOL_N = 7, POOL_C = 33, POOL_H = 26, POOL_W = 26, POOL_P = 13, POOL_Q = 13 };
enum { POOL_IN = POOL_N * POOL_C * POOL_H * POOL_W, POOL_OUT = POOL_N * POOL_C * POOL_P * POOL_Q };
enum { UPDATE_A = 100003, UPDATE_B = 515 };
enum { OTHER_OUT = 2 * POOL_OUT + POOL_IN + 2 * POOL_C + POOL_IN + POOL_IN + 3 * (UPDATE_A + UPDATE_B) };

static void other_kernels_at(int threads, const float *inputs, float *out) {
    assert_int_equal(umt_cpu_threads_set(threads), UMT_OK);
    umt_pool_shape s = {.n = POOL_N, .c = POOL_C, .h = POOL_H, .w = POOL_W, .p = POOL_P, .q = POOL_Q, .window = 2,
                        .stride = 2, .dtype = UMT_F32};
    const float *x = inputs, *bias = inputs + POOL_IN;
    float *y = out, *dy = out + POOL_OUT, *dx = dy + POOL_OUT, *dbias = dx + POOL_IN, *dconv = dbias + POOL_C;
    uint8_t *pick = malloc(POOL_OUT), *mask = malloc(POOL_IN);
    assert_non_null(pick), assert_non_null(mask);
    umt_dropout_draw drop = {.p = 0.3f, .seed = 91, .first = 7};
    assert_int_equal(umt_cpu_bias_relu_max_pool_dropout_forward(&s, x, bias, y, pick, &drop), UMT_OK);
    memcpy(dy, inputs + POOL_IN + POOL_C, POOL_OUT * sizeof *dy);
    memset(dbias, 0, 2 * POOL_C * sizeof *dbias);
    assert_int_equal(umt_cpu_bias_relu_max_pool_dropout_backward(&s, pick, y, dy, dx, true, dbias, 0.25f), UMT_OK);
    /* bias_relu_backward over the pool's input gradient (as conv1's), its channel sums after the pool's */
    float *relu_grad = dconv + POOL_C, *dropped = relu_grad + POOL_IN;
    memcpy(relu_grad, dx, POOL_IN * sizeof *relu_grad);
    assert_int_equal(umt_cpu_bias_relu_backward(UMT_F32, false, x, relu_grad, dconv, POOL_N, POOL_C, POOL_H * POOL_W),
                     UMT_OK);
    assert_int_equal(umt_cpu_dropout_forward(x, dropped, mask, POOL_IN, 5, 0.5f, 77, NULL), UMT_OK);
    /* Adadelta over two tensors of odd lengths: param, square_avg, delta_avg in out, grads from inputs */
    float *param = dropped + POOL_IN, *square = param + UPDATE_A + UPDATE_B, *delta = square + UPDATE_A + UPDATE_B;
    const float *grad = inputs + POOL_IN + POOL_C + POOL_OUT;
    memcpy(param, grad + UPDATE_A + UPDATE_B, (UPDATE_A + UPDATE_B) * sizeof *param);
    memset(square, 0, 2 * (UPDATE_A + UPDATE_B) * sizeof *square);
    umt_update_tensor tensors[2] = {{param, grad, square, delta, NULL, UPDATE_A, 0, 0},
                                    {param + UPDATE_A, grad + UPDATE_A, square + UPDATE_A, delta + UPDATE_A, NULL,
                                     UPDATE_B, 0, 0}};
    umt_update_rule rule = {.kind = UMT_OPT_ADADELTA, .lr = 1.0f, .rho = 0.9f, .eps = 1e-6f, .weight_decay = 0.01f};
    for (int step = 0; step < 2; step++)
        assert_int_equal(umt_cpu_multi_update(tensors, 2, rule, (umt_update_fusion){0}), UMT_OK);
    free(pick), free(mask);
}

static void test_pooling_dropout_bias_sums_and_updates_give_the_same_bits_at_1_2_and_3_threads(void **state) {
    (void)state;
    float *inputs = random_floats(POOL_IN + POOL_C + POOL_OUT + 2 * (UPDATE_A + UPDATE_B));
    float *one = calloc(OTHER_OUT, sizeof *one), *many = calloc(OTHER_OUT, sizeof *many);
    assert_non_null(one), assert_non_null(many);
    other_kernels_at(1, inputs, one);
    for (size_t j = 0; j < sizeof counts / sizeof *counts; j++) {
        memset(many, 0, OTHER_OUT * sizeof *many);
        other_kernels_at(counts[j], inputs, many);
        assert_same_bits(many, one, OTHER_OUT * sizeof *one,
                         "pool forward/backward, bias sums, ReLU mask, dropout, Adadelta outputs", counts[j]);
    }
    free(inputs), free(one), free(many);
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* Training steps                                                                              */

enum { TRAIN_BATCH = 8, TRAIN_STEPS = 3 };

typedef struct {
    float losses[TRAIN_STEPS];
    float *params; /* every parameter after the steps, one after another */
    int64_t count;
} training;

/* The MNIST CNN (conv 1->32, conv 32->64 with the pool and dropout, linear 9216->32->10) on random
 * images, Adadelta, TRAIN_STEPS steps, at `threads` threads. */
static training train_at(int threads) {
    assert_int_equal(umt_cpu_threads_set(threads), UMT_OK);
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CPU;
    umt_context *ctx = NULL;
    assert_int_equal(umt_context_create(&co, &ctx), UMT_OK);
    umt_layer *conv1 = umt_conv2d_layer_new(ctx, "conv1", 1, 32, 3, 1, 0, true);
    umt_layer *conv2 = umt_conv2d_layer_new(ctx, "conv2", 32, 64, 3, 1, 0, true);
    umt_layer *fc1 = umt_linear_layer_new(ctx, "fc1", 9216, 32, true);
    umt_layer *fc2 = umt_linear_layer_new(ctx, "fc2", 32, 10, true);
    assert_non_null(fc2);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADADELTA);
    umt_optimizer *opt = NULL;
    assert_int_equal(umt_optimizer_create(ctx, &oo, &opt), UMT_OK);
    lcg_state = 5;
    float *pixels = random_floats(TRAIN_BATCH * 28 * 28);
    int32_t labels_host[TRAIN_BATCH];
    for (int i = 0; i < TRAIN_BATCH; i++) labels_host[i] = i * 7 % 10;
    training out = {0};
    for (int step = 0; step < TRAIN_STEPS; step++) {
        assert_int_equal(umt_step_begin(ctx), UMT_OK);
        assert_int_equal(umt_zero_grad(ctx), UMT_OK);
        umt_tensor *images = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, TRAIN_BATCH, 1, 28, 28);
        umt_tensor *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, TRAIN_BATCH);
        assert_int_equal(umt_tensor_copy_from_host(images, pixels, TRAIN_BATCH * 28 * 28 * sizeof(float)), UMT_OK);
        assert_int_equal(umt_tensor_copy_from_host(labels, labels_host, sizeof labels_host), UMT_OK);
        umt_tensor *h = umt_layer_forward_relu(ctx, conv1, images);
        h = umt_layer_forward_relu_max_pool2d_dropout(ctx, conv2, h, 2, 2, 0.25f);
        h = umt_layer_forward_relu(ctx, fc1, umt_flatten(ctx, h));
        h = umt_layer_forward(ctx, fc2, umt_dropout(ctx, h, 0.5f));
        umt_tensor *loss = umt_softmax_cross_entropy(ctx, h, labels);
        assert_non_null(loss);
        assert_int_equal(umt_backward(ctx, loss), UMT_OK);
        assert_int_equal(umt_optimizer_step(opt), UMT_OK);
        assert_int_equal(umt_tensor_get_f32(loss, 0, &out.losses[step]), UMT_OK);
    }
    for (int i = 0; i < umt_parameter_count(ctx); i++) out.count += umt_tensor_numel(umt_parameter_at(ctx, i));
    out.params = malloc((size_t)out.count * sizeof *out.params);
    assert_non_null(out.params);
    for (int i = 0, at = 0; i < umt_parameter_count(ctx); i++) {
        const umt_tensor *p = umt_parameter_at(ctx, i);
        assert_int_equal(umt_tensor_copy_to_host(p, out.params + at, (size_t)umt_tensor_numel(p) * sizeof(float)),
                         UMT_OK);
        at += (int)umt_tensor_numel(p);
    }
    free(pixels);
    umt_context_destroy(ctx);
    return out;
}

static void test_training_steps_give_the_same_bits_at_1_2_and_3_threads(void **state) {
    (void)state;
    training one = train_at(1);
    for (size_t j = 0; j < sizeof counts / sizeof *counts; j++) {
        training many = train_at(counts[j]);
        assert_same_bits(many.losses, one.losses, sizeof one.losses, "the losses", counts[j]);
        assert_int_equal(many.count, one.count);
        assert_same_bits(many.params, one.params, (size_t)one.count * sizeof(float), "the parameters", counts[j]);
        free(many.params);
    }
    free(one.params);
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* The pool                                                                                    */

/* Each part waits (up to 10 s) until `parts` parts have arrived: they can all arrive only if
 * they run at once, on as many threads. */
typedef struct {
    atomic_int arrived, timed_out;
} rendezvous;

static void meet(void *arg, int part, int parts) {
    (void)part;
    rendezvous *r = arg;
    atomic_fetch_add(&r->arrived, 1);
    for (int waited_ms = 0; atomic_load(&r->arrived) < parts; waited_ms++) {
        if (waited_ms == 10000) {
            atomic_store(&r->timed_out, 1);
            return;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
}

static void test_a_count_of_three_runs_three_parts_at_once(void **state) {
    (void)state;
    assert_int_equal(umt_cpu_threads_set(3), UMT_OK);
    assert_int_equal(umt_cpu_threads(), 3);
    for (int round = 0; round < 3; round++) {
        rendezvous r = {0};
        umt_cpu_parallel(3, meet, &r);
        assert_int_equal(atomic_load(&r.arrived), 3);
        if (atomic_load(&r.timed_out)) fail_msg("round %d: the 3 parts did not run at once on 3 threads", round);
    }
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* A product whose result is known: 300 x 200 x 100, C = A B, checked against the first run's. */
enum { NEST_M = 300, NEST_N = 200, NEST_K = 100 };
static float *nest_a, *nest_b, *nest_want;

static void nested_product(float *c) {
    assert_int_equal(umt_cpu_gemm(false, false, NEST_M, NEST_N, NEST_K, 1.0f, nest_a, NEST_K, nest_b, NEST_N, 0.0f,
                                  c, NEST_N),
                     UMT_OK);
}

static void product_in_part(void *arg, int part, int parts) {
    (void)parts;
    float **outputs = arg;
    nested_product(outputs[part]);
}

static void make_nest_operands(void) {
    lcg_state = 9;
    nest_a = random_floats(NEST_M * NEST_K), nest_b = random_floats(NEST_K * NEST_N);
    nest_want = random_floats(NEST_M * NEST_N);
    assert_int_equal(umt_cpu_threads_set(1), UMT_OK);
    nested_product(nest_want);
}

static void free_nest_operands(void) { free(nest_a), free(nest_b), free(nest_want); }

static void test_a_kernel_called_inside_a_part_runs_there_with_the_same_bits(void **state) {
    (void)state;
    make_nest_operands();
    assert_int_equal(umt_cpu_threads_set(2), UMT_OK);
    float *outputs[4];
    for (int i = 0; i < 4; i++) outputs[i] = random_floats(NEST_M * NEST_N);
    umt_cpu_parallel(4, product_in_part, outputs);
    for (int i = 0; i < 4; i++) {
        assert_same_bits(outputs[i], nest_want, NEST_M * NEST_N * sizeof(float), "a product inside a part", 2);
        free(outputs[i]);
    }
    free_nest_operands();
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

static void *products_on_a_thread(void *arg) {
    float *c = arg;
    for (int i = 0; i < 10; i++) {
        nested_product(c);
        if (memcmp(c, nest_want, NEST_M * NEST_N * sizeof(float)) != 0) return "differs";
    }
    return NULL;
}

static void test_kernels_called_from_four_threads_at_once_give_their_bits(void **state) {
    (void)state;
    make_nest_operands();
    assert_int_equal(umt_cpu_threads_set(2), UMT_OK);
    pthread_t ids[4];
    float *outputs[4];
    for (int i = 0; i < 4; i++) {
        outputs[i] = random_floats(NEST_M * NEST_N);
        assert_int_equal(pthread_create(&ids[i], NULL, products_on_a_thread, outputs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *result = NULL;
        assert_int_equal(pthread_join(ids[i], &result), 0);
        if (result) fail_msg("thread %d: a product %s from one thread's", i, (const char *)result);
        free(outputs[i]);
    }
    free_nest_operands();
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

static void test_a_forked_child_runs_threaded_kernels(void **state) {
    (void)state;
    make_nest_operands();
    assert_int_equal(umt_cpu_threads_set(2), UMT_OK);
    float *c = random_floats(NEST_M * NEST_N);
    nested_product(c); /* the pool's workers exist before the fork */
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        alarm(20); /* a child that waits on the parent's workers would hang: the alarm ends it */
        nested_product(c);
        _exit(memcmp(c, nest_want, NEST_M * NEST_N * sizeof(float)) == 0 ? 0 : 3);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the forked child's product: %s %d", WIFEXITED(status) ? "exit status" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    nested_product(c); /* and the parent's pool still works */
    assert_same_bits(c, nest_want, NEST_M * NEST_N * sizeof(float), "the parent's product after the fork", 2);
    free(c);
    free_nest_operands();
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
}

/* ------------------------------------------------------------------------------------------ */
/* The count                                                                                   */

static void assert_error_mentions(const char *text) {
    if (!strstr(umt_last_error(), text)) fail_msg("error \"%s\" does not mention \"%s\"", umt_last_error(), text);
}

static void test_the_count_is_set_read_and_refused_out_of_range(void **state) {
    (void)state;
    assert_int_equal(unsetenv("UMT_CPU_THREADS"), 0);
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
    int cores = umt_cpu_threads();
    assert_true(cores >= 1);
    assert_int_equal(umt_cpu_threads_set(5), UMT_OK);
    assert_int_equal(umt_cpu_threads(), 5);
    assert_int_equal(umt_cpu_threads_set(-1), UMT_ERR_INVALID_ARGUMENT);
    assert_error_mentions("umt_cpu_threads_set: threads = -1, expected 0 (the default) to 256");
    assert_int_equal(umt_cpu_threads_set(257), UMT_ERR_INVALID_ARGUMENT);
    assert_int_equal(umt_cpu_threads(), 5); /* a refused count changes nothing */
    /* 0: the default again, which UMT_CPU_THREADS sets */
    assert_int_equal(setenv("UMT_CPU_THREADS", "3", 1), 0);
    assert_int_equal(umt_cpu_threads_set(0), UMT_OK);
    assert_int_equal(umt_cpu_threads(), 3);
    assert_int_equal(unsetenv("UMT_CPU_THREADS"), 0);
    assert_int_equal(umt_cpu_threads(), cores);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_gives_the_same_bits_at_1_2_and_3_threads),
        cmocka_unit_test(test_convolutions_give_the_same_bits_at_1_2_and_3_threads),
        cmocka_unit_test(test_pooling_dropout_bias_sums_and_updates_give_the_same_bits_at_1_2_and_3_threads),
        cmocka_unit_test(test_training_steps_give_the_same_bits_at_1_2_and_3_threads),
        cmocka_unit_test(test_a_count_of_three_runs_three_parts_at_once),
        cmocka_unit_test(test_a_kernel_called_inside_a_part_runs_there_with_the_same_bits),
        cmocka_unit_test(test_kernels_called_from_four_threads_at_once_give_their_bits),
        cmocka_unit_test(test_a_forked_child_runs_threaded_kernels),
        cmocka_unit_test(test_the_count_is_set_read_and_refused_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
