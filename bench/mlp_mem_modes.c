/*
 * bench/mlp_mem_modes.c — what managed memory with advice costs against plain device memory.
 *
 *   bazel build --config=cuda //bench:mlp_mem_modes && bazel-bin/bench/mlp_mem_modes [steps] [rounds]
 *
 * Trains the 784-256-10 MLP of examples/mnist_mlp at batch 512 on a fixed random batch kept in
 * the dataset pool, in each --mem mode (managed, managed-plain, device), and prints:
 *   first step  — the step that finds every page where the allocator left it (cold);
 *   step        — the median over `rounds` of the mean step time over `steps` steps (warm),
 * with the ratio of each mode to device. The modes run in turn, round after round, so that
 * clock drift and other load hit all three alike. Each measurement runs in a child process:
 * one process drives one CUDA context, and a fresh one makes every first step truly cold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "umtrain.h"

#define BATCH 512
#define MODES 3
#define MAX_ROUNDS 15

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    fprintf(stderr, "mlp_mem_modes: %s: %s\n", what, umt_last_error());
    return 1;
}

typedef struct {
    umt_context *ctx;
    umt_layer *fc1, *fc2;
    umt_optimizer *opt;
    umt_tensor *x, *y;
} model;

static int build(umt_memory_mode mode, model *m) {
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    o.memory_mode = mode;
    if (umt_context_create(&o, &m->ctx)) return fail("context");
    m->fc1 = umt_linear_layer_new(m->ctx, "fc1", 784, 256, true);
    m->fc2 = umt_linear_layer_new(m->ctx, "fc2", 256, 10, true);
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.momentum = 0.9f;
    if (!m->fc1 || !m->fc2 || umt_optimizer_create(m->ctx, &oo, &m->opt)) return fail("model");
    m->x = umt_tensor_new_2d(m->ctx, UMT_POOL_DATASET, UMT_F32, BATCH, 784);
    m->y = umt_tensor_new_1d(m->ctx, UMT_POOL_DATASET, UMT_I32, BATCH);
    if (!m->x || !m->y || umt_tensor_uniform(m->ctx, m->x, -1.0f, 1.0f)) return fail("batch");
    int32_t labels[BATCH];
    for (int i = 0; i < BATCH; ++i) labels[i] = (i * 7) % 10;
    return umt_tensor_copy_from_host(m->y, labels, sizeof labels) ? fail("labels") : 0;
}

/* One training step, queued on the device without waiting for it. */
static int step(model *m) {
    umt_context *ctx = m->ctx;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx)) return fail("step");
    umt_tensor *h = umt_relu(ctx, umt_layer_forward(ctx, m->fc1, m->x));
    umt_tensor *loss = umt_softmax_cross_entropy(ctx, umt_layer_forward(ctx, m->fc2, h), m->y);
    if (!loss || umt_backward(ctx, loss) || umt_optimizer_step(m->opt)) return fail("train");
    return 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* In a child: build the model in `mode`, time its first step and then `steps` warm steps. */
static int measure(umt_memory_mode mode, int steps, double result[2]) {
    model m;
    if (build(mode, &m)) return 1;
    double t0 = now_ms();
    if (step(&m) || umt_synchronize(m.ctx)) return fail("first step");
    result[0] = now_ms() - t0;
    for (int i = 0; i < 10; ++i) /* warm-up: caches, clocks */
        if (step(&m)) return 1;
    if (umt_synchronize(m.ctx)) return fail("sync");
    t0 = now_ms();
    for (int i = 0; i < steps; ++i)
        if (step(&m)) return 1;
    if (umt_synchronize(m.ctx)) return fail("sync");
    result[1] = (now_ms() - t0) / steps;
    umt_context_destroy(m.ctx);
    return 0;
}

/* Runs measure() in a child process and reads its two numbers back through a pipe. */
static int measure_in_child(umt_memory_mode mode, int steps, double result[2]) {
    int fds[2];
    if (pipe(fds)) return perror("mlp_mem_modes: pipe"), 1;
    pid_t pid = fork();
    if (pid < 0) return perror("mlp_mem_modes: fork"), 1;
    if (pid == 0) {
        close(fds[0]);
        int rc = measure(mode, steps, result);
        if (!rc && write(fds[1], result, 2 * sizeof(double)) != 2 * sizeof(double)) rc = 1;
        _exit(rc);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], result, 2 * sizeof(double));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return got == 2 * sizeof(double) && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 200, rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (steps < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: mlp_mem_modes [steps >= 1] [rounds 1..%d]\n", MAX_ROUNDS);
        return 2;
    }
    /* The parent touches no CUDA at all: a process that has initialised CUDA cannot fork a
     * child that uses it. */
    double first_ms[MODES][MAX_ROUNDS], step_ms[MODES][MAX_ROUNDS];
    for (int round = 0; round < rounds; ++round)
        for (int mode = 0; mode < MODES; ++mode) {
            double r[2];
            if (measure_in_child((umt_memory_mode)mode, steps, r)) {
                fprintf(stderr, "mlp_mem_modes: the %s measurement failed\n", umt_memory_mode_name((umt_memory_mode)mode));
                return 1;
            }
            first_ms[mode][round] = r[0];
            step_ms[mode][round] = r[1];
        }
    double first[MODES], median[MODES];
    for (int mode = 0; mode < MODES; ++mode) {
        qsort(first_ms[mode], (size_t)rounds, sizeof(double), compare_doubles);
        qsort(step_ms[mode], (size_t)rounds, sizeof(double), compare_doubles);
        first[mode] = first_ms[mode][rounds / 2];
        median[mode] = step_ms[mode][rounds / 2];
    }
    printf("MLP 784-256-10, batch %d, SGD momentum, %d steps x %d rounds (medians over rounds)\n", BATCH, steps, rounds);
    printf("%-14s %14s %12s %16s\n", "--mem", "first step ms", "step ms", "step / device");
    for (int mode = 0; mode < MODES; ++mode)
        printf("%-14s %14.3f %12.4f %16.3f\n", umt_memory_mode_name((umt_memory_mode)mode), first[mode], median[mode],
               median[mode] / median[UMT_MEM_DEVICE]);
    return 0;
}
