/*
 * tests/gpu/test_dist_gpu.c — data parallelism on 2 GPUs (needs two; skips with one):
 *   - 2 ranks at global batch B match one rank at batch B: the loss of each of 20 steps and every
 *     parameter after them, relative error <= 1e-5 (fp32, no dropout, no batch norm: per-rank
 *     batch statistics would differ from the global batch's by design);
 *   - reducing in bf16 stays within bf16's rounding of that;
 *   - a rank killed mid-training ends the run (the launcher stops the other) instead of a hang;
 *   - a rank that stops answering (SIGSTOP, alive) is caught by the other's watchdog, which
 *     aborts NCCL and fails naming its rank.
 * The test process itself never touches CUDA: every GPU run happens in forked children (the
 * launcher's ranks, or one plain child for the reference), results come back through shared
 * memory mapped before the fork.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dist/umt_dist.h"
#include "umtrain.h"

enum { STEPS = 20, GLOBAL_BATCH = 256, MAX_VALUES = 1 << 16, PIXELS = 28 * 28 };

typedef struct {
    bool reduce_bf16;
    int fail_rank, fail_step, fail_signal; /* fail_signal 0: no failure */
    double timeout_s;
} run_plan;

typedef struct {
    float loss[STEPS];
    float values[MAX_VALUES]; /* every parameter, concatenated in creation order */
    int64_t value_count;
    char error[512];
} shared_result;

/* ----------------------------------------------------------------------------------------- */
/* One rank's training run */

typedef struct {
    umt_layer *conv, *fc1, *fc2;
} small_cnn;

static umt_tensor *forward(umt_context *ctx, const small_cnn *m, umt_tensor *images) {
    umt_tensor *x = umt_relu(ctx, umt_layer_forward(ctx, m->conv, images)); /* [N,8,26,26] */
    x = umt_flatten(ctx, umt_max_pool2d(ctx, x, 2, 2));                      /* [N,1352] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->fc1, x));
    return umt_log_softmax(ctx, umt_layer_forward(ctx, m->fc2, x));
}

/* Sample i of step s's global batch, the same on every rank and in the reference. */
static void make_sample(int step, int64_t i, float *pixels, int32_t *label) {
    uint64_t h = (uint64_t)step * 1000003u + (uint64_t)i * 7919u + 17;
    for (int j = 0; j < PIXELS; ++j) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        pixels[j] = (float)((h >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    *label = (int32_t)((h >> 20) % 10);
}

static umt_status batch_of(umt_context *ctx, int step, int64_t first, int64_t count, umt_tensor **images,
                           umt_tensor **labels) {
    float *pixels = malloc((size_t)count * PIXELS * sizeof *pixels);
    int32_t *classes = malloc((size_t)count * sizeof *classes);
    for (int64_t i = 0; i < count; ++i) make_sample(step, first + i, pixels + i * PIXELS, classes + i);
    *images = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, count, 1, 28, 28);
    *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, count);
    umt_status st = *images && *labels ? UMT_OK : umt_last_status();
    if (st == UMT_OK) st = umt_tensor_copy_from_host(*images, pixels, (size_t)count * PIXELS * sizeof *pixels);
    if (st == UMT_OK) st = umt_tensor_copy_from_host(*labels, classes, (size_t)count * sizeof *classes);
    free(pixels);
    free(classes);
    return st;
}

static umt_status step_once(umt_context *ctx, small_cnn *m, umt_dist *dist, umt_optimizer *opt, int step,
                            const umt_dist_process *p, float *loss_out) {
    int64_t offset, part;
    umt_dist_shard(GLOBAL_BATCH, p->rank, p->size, &offset, &part);
    umt_tensor *images, *labels;
    umt_status st = umt_step_begin(ctx);
    if (st == UMT_OK) st = umt_zero_grad(ctx);
    if (st == UMT_OK) st = batch_of(ctx, step, offset, part, &images, &labels);
    umt_tensor *loss = st == UMT_OK ? umt_nll_loss(ctx, forward(ctx, m, images), labels) : NULL;
    if (st == UMT_OK && !loss) st = umt_last_status();
    if (st == UMT_OK) st = umt_backward(ctx, loss);
    if (st == UMT_OK) st = umt_dist_finish_gradients(dist);
    if (st == UMT_OK) st = umt_optimizer_step(opt);
    float value = 0;
    if (st == UMT_OK) st = umt_tensor_get_f32(loss, 0, &value);
    /* The global batch's loss is the mean of the ranks' (equal parts). */
    double mean = value;
    if (st == UMT_OK) st = umt_dist_sum(dist, &mean, 1);
    *loss_out = (float)(mean / p->size);
    return st;
}

static umt_status copy_parameters(umt_context *ctx, shared_result *out) {
    out->value_count = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) {
        umt_tensor *t = umt_parameter_at(ctx, i);
        int64_t n = umt_tensor_numel(t);
        if (out->value_count + n > MAX_VALUES) return UMT_ERR_INVALID_ARGUMENT;
        umt_status st = umt_tensor_copy_to_host(t, out->values + out->value_count, (size_t)n * sizeof(float));
        if (st != UMT_OK) return st;
        out->value_count += n;
    }
    return UMT_OK;
}

static umt_status train(const umt_dist_process *p, const run_plan *plan, umt_context *ctx, shared_result *out) {
    small_cnn m = {umt_conv2d_layer_new(ctx, "conv", 1, 8, 3, 1, 0, true), umt_linear_layer_new(ctx, "fc1", 1352, 32, true),
                   umt_linear_layer_new(ctx, "fc2", 32, 10, true)};
    if (!m.conv || !m.fc1 || !m.fc2) return umt_last_status();
    umt_dist_options o = umt_dist_defaults();
    o.reduce_bf16 = plan->reduce_bf16;
    o.timeout_s = plan->timeout_s;
    /* Small buckets, so that several all-reduces overlap backward and run in order. */
    o.bucket_bytes = 64 << 10;
    umt_dist *dist = NULL;
    umt_optimizer *opt = NULL;
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.lr = 0.05f;
    oo.momentum = 0.9f;
    umt_status st = umt_dist_create(ctx, p, &o, &dist);
    if (st == UMT_OK) st = umt_optimizer_create(ctx, &oo, &opt);
    for (int s = 0; s < STEPS && st == UMT_OK; ++s) {
        if (plan->fail_signal && p->rank == plan->fail_rank && s == plan->fail_step) raise(plan->fail_signal);
        st = step_once(ctx, &m, dist, opt, s, p, &out->loss[s]);
    }
    /* The failure runs keep training until they are stopped or fail. */
    for (int s = 0; plan->fail_signal && st == UMT_OK && s < 100000; ++s) st = step_once(ctx, &m, dist, opt, 0, p, &out->loss[0]);
    if (st == UMT_OK && p->rank == 0) st = copy_parameters(ctx, out);
    if (st != UMT_OK) snprintf(out->error, sizeof out->error, "%s", umt_last_error());
    umt_dist_destroy(dist);
    return st;
}

/* A rank's whole life; its exit code is the result: 0 ok, 42 failed naming its rank, 1 other. */
static int run_rank(const umt_dist_process *p, const run_plan *plan, shared_result *out) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.cuda_device = p->local_rank;
    co.seed = 5;
    umt_context *ctx = NULL;
    umt_status st = umt_context_create(&co, &ctx);
    if (st == UMT_OK) st = train(p, plan, ctx, out);
    char mine[32];
    snprintf(mine, sizeof mine, "rank %d", p->rank);
    int code = st == UMT_OK ? 0 : strstr(umt_last_error(), mine) ? 42 : 1;
    if (st != UMT_OK) fprintf(stderr, "rank %d: %s\n", p->rank, umt_last_error());
    umt_context_destroy(ctx);
    return code;
}

/* ----------------------------------------------------------------------------------------- */
/* Runs, from the CUDA-free test process */

static shared_result *shared_new(void) {
    void *m = mmap(NULL, sizeof(shared_result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    memset(m, 0, sizeof(shared_result));
    return m;
}

static int run_two_ranks(const run_plan *plan, shared_result *out) {
    umt_dist_process p;
    assert_int_equal(umt_dist_launch(2, &p), UMT_OK);
    /* A rank writes only its own results; rank 1's go nowhere. */
    if (!p.launcher) _exit(run_rank(&p, plan, p.rank == 0 ? out : &(shared_result){0}));
    return p.exit_code;
}

static int run_reference(shared_result *out) {
    pid_t pid = fork();
    if (pid == 0) {
        umt_dist_process single = {.bootstrap = UMT_DIST_SINGLE, .size = 1, .id_pipe = {-1, -1}};
        _exit(run_rank(&single, &(run_plan){.timeout_s = 60}, out));
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int two_gpus(void) {
    /* Asked in a child: the test process must stay free of CUDA for the forks that follow. */
    pid_t pid = fork();
    if (pid == 0) _exit(umt_cuda_device_count() >= 2 ? 0 : 1);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Norm-wise relative error of the parameters (elementwise would blow up on values near 0). */
static double relative_error(const shared_result *a, const shared_result *b) {
    double diff = 0, norm = 0, worst = 0;
    for (int64_t i = 0; i < b->value_count; ++i) {
        double d = (double)a->values[i] - b->values[i];
        diff += d * d;
        norm += (double)b->values[i] * b->values[i];
        if (fabs(d) > worst) worst = fabs(d);
    }
    printf("parameters: %lld values, relative error %.3g, largest difference %.3g\n", (long long)b->value_count,
           sqrt(diff / norm), worst);
    return sqrt(diff / norm);
}

static void compare(const shared_result *two, const shared_result *one, double tolerance) {
    assert_int_equal(two->value_count, one->value_count);
    for (int s = 0; s < STEPS; ++s) {
        double e = fabs((double)two->loss[s] - one->loss[s]) / fabs((double)one->loss[s]);
        if (s == 0 || s == STEPS - 1) printf("step %d: loss %.7f (2 ranks) vs %.7f (1 rank), relative %.3g\n", s + 1,
                                             two->loss[s], one->loss[s], e);
        assert_true(e <= tolerance);
    }
    assert_true(relative_error(two, one) <= tolerance);
    /* And the run really trained: the loss moved. */
    assert_true(fabs((double)one->loss[STEPS - 1] - one->loss[0]) > 1e-3);
}

static void test_two_ranks_match_one_rank_at_the_same_global_batch(void **state) {
    (void)state;
    if (!two_gpus()) skip();
    shared_result *two = shared_new(), *one = shared_new();
    assert_int_equal(run_two_ranks(&(run_plan){.timeout_s = 60}, two), 0);
    assert_int_equal(run_reference(one), 0);
    compare(two, one, 1e-5);
    munmap(two, sizeof *two);
    munmap(one, sizeof *one);
}

static void test_reducing_in_bf16_stays_within_bf16_rounding(void **state) {
    (void)state;
    if (!two_gpus()) skip();
    shared_result *two = shared_new(), *one = shared_new();
    assert_int_equal(run_two_ranks(&(run_plan){.reduce_bf16 = true, .timeout_s = 60}, two), 0);
    assert_int_equal(run_reference(one), 0);
    compare(two, one, 2e-2);
    munmap(two, sizeof *two);
    munmap(one, sizeof *one);
}

static void test_a_killed_rank_ends_the_run_instead_of_hanging(void **state) {
    (void)state;
    if (!two_gpus()) skip();
    shared_result *r = shared_new();
    double start = seconds();
    int code = run_two_ranks(&(run_plan){.fail_rank = 1, .fail_step = 5, .fail_signal = SIGKILL, .timeout_s = 60}, r);
    printf("killed rank: the run ended with code %d after %.1f s\n", code, seconds() - start);
    assert_int_equal(code, 128 + SIGKILL);
    assert_true(seconds() - start < 60);
    munmap(r, sizeof *r);
}

static void test_a_stopped_rank_is_caught_by_the_watchdog_naming_the_rank(void **state) {
    (void)state;
    if (!two_gpus()) skip();
    shared_result *r = shared_new();
    double start = seconds();
    int code = run_two_ranks(&(run_plan){.fail_rank = 1, .fail_step = 5, .fail_signal = SIGSTOP, .timeout_s = 5}, r);
    printf("stopped rank: the run ended with code %d after %.1f s (rank 0: %s)\n", code, seconds() - start, r->error);
    /* 42: rank 0 failed with a message naming itself; 3 or SIGALRM: the watchdog's last resorts. */
    assert_true(code == 42 || code == 3 || code == 128 + SIGALRM);
    assert_true(seconds() - start < 90);
    munmap(r, sizeof *r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_match_one_rank_at_the_same_global_batch),
        cmocka_unit_test(test_reducing_in_bf16_stays_within_bf16_rounding),
        cmocka_unit_test(test_a_killed_rank_ends_the_run_instead_of_hanging),
        cmocka_unit_test(test_a_stopped_rank_is_caught_by_the_watchdog_naming_the_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
