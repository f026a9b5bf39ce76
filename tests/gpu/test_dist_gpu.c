/*
 * tests/gpu/test_dist_gpu.c — data parallelism on GPUs.
 *
 * On one GPU:
 *   - one rank reducing in bf16 (umt_dist_options.always): a one-rank all-reduce is the identity,
 *     so each gradient comes back rounded to bf16 (round to nearest even), element for element.
 * On two GPUs (skipped with one):
 *   - 2 ranks at global batch B match one rank at batch B: the loss of each of 20 steps and every
 *     parameter after them, relative error <= 1e-5 (fp32, no dropout, no batch norm: per-rank
 *     batch statistics would differ from the global batch's by design), op by op and with each
 *     rank's whole step (all-reduces included) captured once as a CUDA graph and replayed;
 *   - reducing in bf16 stays within bf16's rounding of that;
 *   - a rank killed mid-training ends the run (the launcher stops the other) instead of a hang,
 *     op by op and with the graph on;
 *   - a rank that stops answering (SIGSTOP, alive) is caught by the other's watchdog, which
 *     aborts NCCL and fails naming its rank, op by op and while the other replays its graph.
 * Batches come from a synthetic IDX dataset on the GPU, indexed by each step's global batch: the
 * step graph's input is the same on every rank (NCCL needs every rank to replay at the same
 * steps), and each rank's step takes its part of it.
 * The test process itself never touches CUDA: every GPU run happens in forked children (the
 * launcher's ranks, or one plain child for the reference), results come back through shared
 * memory mapped before the fork.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, mkdtemp */
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
#include "tests/gpu/prototype_idx.h"
#include "umtrain.h"

enum { STEPS = 20, GLOBAL_BATCH = 256, SAMPLES = STEPS * GLOBAL_BATCH, MAX_VALUES = 1 << 16 };
enum { SIDE = 28, PIXELS = SIDE * SIDE, CLASSES = 10 };

typedef struct {
    bool reduce_bf16, graph;
    int fail_rank, fail_step, fail_signal; /* fail_signal 0: no failure */
    double timeout_s;
} run_plan;

typedef struct {
    float loss[STEPS];
    float values[MAX_VALUES]; /* every parameter, concatenated in creation order */
    int64_t value_count;
    umt_step_graph_stats graph;
    umt_dist_stats dist;
    char error[512];
} shared_result;

static char data_dir[64];

/* Returns the status of a call that failed. */
#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        umt_status try_status_ = (call);                                                                           \
        if (try_status_ != UMT_OK) return try_status_;                                                             \
    } while (0)

/* ----------------------------------------------------------------------------------------- */
/* The dataset: noisy copies of ten random prototypes, written once by the test process */

static int write_dataset(void **state) {
    (void)state;
    snprintf(data_dir, sizeof data_dir, "/tmp/umt_dist_gpu_XXXXXX");
    return prototype_idx_write(data_dir, SAMPLES, 23, 100);
}

static int remove_dataset(void **state) {
    (void)state;
    prototype_idx_remove(data_dir);
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* One rank's training run */

typedef struct {
    umt_layer *conv, *fc1, *fc2;
} small_cnn;

typedef struct {
    small_cnn model;
    umt_dataset *data;
    umt_dist *dist;
    umt_optimizer *opt;
    const umt_dist_process *process;
} trainer;

static umt_tensor *forward(umt_context *ctx, const small_cnn *m, umt_tensor *images) {
    umt_tensor *x = umt_relu(ctx, umt_layer_forward(ctx, m->conv, images)); /* [N,8,26,26] */
    x = umt_flatten(ctx, umt_max_pool2d(ctx, x, 2, 2));                      /* [N,1352] */
    x = umt_relu(ctx, umt_layer_forward(ctx, m->fc1, x));
    return umt_log_softmax(ctx, umt_layer_forward(ctx, m->fc2, x));
}

/* Forward and backward of this rank's part of the global batch whose sample indices are
 * indices[0..count); the gradients are not averaged yet. */
static umt_tensor *forward_backward(umt_context *ctx, trainer *t, const int64_t *indices, int64_t count) {
    int64_t offset, part;
    umt_dist_shard(count, t->process->rank, t->process->size, &offset, &part);
    umt_tensor *images = NULL, *labels = NULL;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx) ||
        umt_dataset_batch(ctx, t->data, indices + offset, part, 0.5f, 0.25f, &images, &labels))
        return NULL;
    umt_tensor *loss = umt_nll_loss(ctx, forward(ctx, &t->model, images), labels);
    return loss && !umt_backward(ctx, loss) ? loss : NULL;
}

/* A whole step as the step graph runs it: the input is the global batch's indices. */
static umt_tensor *step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    trainer *t = user;
    umt_tensor *loss = forward_backward(ctx, t, input, (int64_t)(input_bytes / sizeof(int64_t)));
    if (!loss || umt_dist_finish_gradients(t->dist) || umt_optimizer_step(t->opt)) return NULL;
    return loss;
}

static umt_status step_once(trainer *t, umt_step_graph *g, int s, float *loss_out) {
    int64_t indices[GLOBAL_BATCH];
    for (int i = 0; i < GLOBAL_BATCH; ++i) indices[i] = (int64_t)(s % STEPS) * GLOBAL_BATCH + i;
    umt_status st = umt_step_graph_run(g, step, t, indices, sizeof indices);
    float value = 0;
    if (st == UMT_OK) st = umt_tensor_get_f32(umt_step_graph_loss(g), 0, &value);
    /* The global batch's loss is the mean of the ranks' (equal parts). */
    double mean = value;
    if (st == UMT_OK) st = umt_dist_sum(t->dist, &mean, 1);
    *loss_out = (float)(mean / t->process->size);
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

/* The model, the dataset, and data parallelism with small buckets (several all-reduces, in order,
 * overlapping backward); `always` runs the NCCL path on one rank too. */
static umt_status make_trainer(umt_context *ctx, const umt_dist_process *p, const run_plan *plan, bool always,
                               trainer *t) {
    *t = (trainer){.process = p};
    t->model = (small_cnn){umt_conv2d_layer_new(ctx, "conv", 1, 8, 3, 1, 0, true),
                           umt_linear_layer_new(ctx, "fc1", 1352, 32, true),
                           umt_linear_layer_new(ctx, "fc2", 32, 10, true)};
    if (!t->model.conv || !t->model.fc1 || !t->model.fc2) return umt_last_status();
    char images[128], labels[128];
    snprintf(images, sizeof images, "%s/images", data_dir);
    snprintf(labels, sizeof labels, "%s/labels", data_dir);
    TRY(umt_dataset_load_idx(ctx, images, labels, CLASSES, &t->data));
    umt_dist_options o = umt_dist_defaults();
    o.reduce_bf16 = plan->reduce_bf16;
    o.timeout_s = plan->timeout_s;
    o.always = always;
    o.bucket_bytes = 64 << 10;
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_SGD);
    oo.lr = 0.05f;
    oo.momentum = 0.9f;
    TRY(umt_dist_create(ctx, p, &o, &t->dist));
    return umt_optimizer_create(ctx, &oo, &t->opt);
}

static umt_status train(const umt_dist_process *p, const run_plan *plan, umt_context *ctx, shared_result *out) {
    trainer t;
    umt_step_graph *g = NULL;
    umt_status st = make_trainer(ctx, p, plan, false, &t);
    if (st == UMT_OK) st = umt_step_graph_create(ctx, plan->graph, &g);
    for (int s = 0; s < STEPS && st == UMT_OK; ++s) {
        if (plan->fail_signal && p->rank == plan->fail_rank && s == plan->fail_step) raise(plan->fail_signal);
        st = step_once(&t, g, s, &out->loss[s]);
    }
    /* The failure runs keep training until they are stopped or fail. */
    for (int s = 0; plan->fail_signal && st == UMT_OK && s < 100000; ++s) st = step_once(&t, g, s, &out->loss[0]);
    if (st == UMT_OK && p->rank == 0) st = copy_parameters(ctx, out);
    if (st != UMT_OK) snprintf(out->error, sizeof out->error, "%s", umt_last_error());
    if (g) out->graph = umt_step_graph_stats_get(g);
    if (t.dist) out->dist = umt_dist_stats_get(t.dist);
    /* The graph stays (the context owns it): umt_dist_destroy makes it let go of its collectives. */
    umt_dist_destroy(t.dist);
    return st;
}

static umt_context *rank_context(int gpu) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.cuda_device = gpu;
    co.seed = 5;
    umt_context *ctx = NULL;
    return umt_context_create(&co, &ctx) == UMT_OK ? ctx : NULL;
}

/* A rank's whole life; its exit code is the result: 0 ok, 42 failed naming its rank, 1 other. */
static int run_rank(const umt_dist_process *p, const run_plan *plan, shared_result *out) {
    umt_context *ctx = rank_context(p->cuda_device);
    umt_status st = ctx ? train(p, plan, ctx, out) : umt_last_status();
    if (st != UMT_OK && !out->error[0]) snprintf(out->error, sizeof out->error, "%s", umt_last_error());
    char mine[32];
    snprintf(mine, sizeof mine, "rank %d", p->rank);
    int code = st == UMT_OK ? 0 : strstr(out->error, mine) ? 42 : 1;
    if (st != UMT_OK) fprintf(stderr, "rank %d: %s\n", p->rank, out->error);
    umt_context_destroy(ctx);
    return code;
}

/* ----------------------------------------------------------------------------------------- */
/* One rank reducing in bf16, on one GPU */

/* x rounded to the nearest bf16, ties to even (what the pack's conversion does), back in f32. */
static float bf16_rounded(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static umt_status gradients_to_host(umt_context *ctx, float *out, int64_t *count) {
    *count = 0;
    for (int i = 0; i < umt_parameter_count(ctx); ++i) {
        umt_tensor *g = umt_tensor_grad(umt_parameter_at(ctx, i));
        int64_t n = umt_tensor_numel(g);
        if (*count + n > MAX_VALUES) return UMT_ERR_INVALID_ARGUMENT;
        TRY(umt_tensor_copy_to_host(g, out + *count, (size_t)n * sizeof(float)));
        *count += n;
    }
    return UMT_OK;
}

/* In a child: one step's gradients before and after umt_dist_finish_gradients; the exit code says
 * how they compare (0: every element rounded to bf16, and some changed by it). */
static int bf16_rounding_child(shared_result *before, shared_result *after) {
    umt_dist_process single = {.bootstrap = UMT_DIST_SINGLE, .size = 1, .id_pipe = {-1, -1}};
    umt_context *ctx = rank_context(0);
    trainer t;
    int64_t indices[GLOBAL_BATCH];
    for (int i = 0; i < GLOBAL_BATCH; ++i) indices[i] = i;
    umt_status st = ctx ? make_trainer(ctx, &single, &(run_plan){.reduce_bf16 = true, .timeout_s = 60}, true, &t)
                        : umt_last_status();
    /* Before the finish the buckets hold the packed copies; the gradients are still the step's. */
    if (st == UMT_OK && !forward_backward(ctx, &t, indices, GLOBAL_BATCH)) st = umt_last_status();
    if (st == UMT_OK) st = gradients_to_host(ctx, before->values, &before->value_count);
    if (st == UMT_OK) st = umt_dist_finish_gradients(t.dist);
    if (st == UMT_OK) st = gradients_to_host(ctx, after->values, &after->value_count);
    if (st == UMT_OK) after->dist = umt_dist_stats_get(t.dist);
    if (st != UMT_OK) fprintf(stderr, "bf16 on one rank: %s\n", umt_last_error());
    if (ctx) umt_dist_destroy(t.dist);
    umt_context_destroy(ctx);
    return st == UMT_OK ? 0 : 1;
}

static int gpus_here(void) {
    /* Asked in a child: the test process must stay free of CUDA for the forks that follow. */
    pid_t pid = fork();
    if (pid == 0) _exit(umt_cuda_device_count() > 9 ? 9 : umt_cuda_device_count());
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

static shared_result *shared_new(void) {
    void *m = mmap(NULL, sizeof(shared_result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    memset(m, 0, sizeof(shared_result));
    return m;
}

static int child_exit_code(pid_t pid) {
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_one_rank_reducing_in_bf16_rounds_each_gradient_to_bf16(void **state) {
    (void)state;
    if (gpus_here() < 1) skip();
    shared_result *before = shared_new(), *after = shared_new();
    pid_t pid = fork();
    if (pid == 0) _exit(bf16_rounding_child(before, after));
    assert_int_equal(child_exit_code(pid), 0);
    assert_int_equal(after->value_count, before->value_count);
    assert_int_equal(after->dist.buckets, 3);
    int64_t rounded = 0, nonzero = 0;
    for (int64_t i = 0; i < before->value_count; ++i) {
        float expected = bf16_rounded(before->values[i]);
        if (memcmp(&after->values[i], &expected, sizeof expected) != 0)
            fail_msg("gradient element %lld: %.9g after the bf16 all-reduce, expected %.9g (%.9g rounded to bf16)",
                     (long long)i, (double)after->values[i], (double)expected, (double)before->values[i]);
        rounded += after->values[i] != before->values[i];
        nonzero += before->values[i] != 0.0f;
    }
    printf("bf16 on one rank: %lld gradient elements, %lld nonzero, %lld changed by the rounding\n",
           (long long)before->value_count, (long long)nonzero, (long long)rounded);
    /* Not vacuous: the step made gradients, and the rounding touched most of them. */
    assert_true(nonzero > before->value_count / 10);
    assert_true(rounded > nonzero / 2);
    munmap(before, sizeof *before);
    munmap(after, sizeof *after);
}

/* ----------------------------------------------------------------------------------------- */
/* Runs on two GPUs, from the CUDA-free test process */

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
    return child_exit_code(pid);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

static void check_two_ranks_against_one(const run_plan *plan, double tolerance) {
    shared_result *two = shared_new(), *one = shared_new();
    assert_int_equal(run_two_ranks(plan, two), 0);
    assert_int_equal(run_reference(one), 0);
    compare(two, one, tolerance);
    printf("2 ranks, graph %s: %lld captures, %lld steps replayed, %lld eager; %d buckets, %lld all-reduces issued "
           "op by op, %lld captured\n", plan->graph ? "on" : "off", (long long)two->graph.captures,
           (long long)two->graph.replayed_steps, (long long)two->graph.eager_steps, two->dist.buckets,
           (long long)two->dist.eager_collectives, (long long)two->dist.captured_collectives);
    assert_int_equal(two->dist.buckets, 3);
    if (plan->graph) {
        /* Two warm-up steps eager, then one capture replayed to the end. */
        assert_int_equal(two->graph.captures, 1);
        assert_int_equal(two->graph.replayed_steps, STEPS - 2);
        assert_int_equal(two->dist.captured_collectives, two->dist.buckets);
    } else {
        assert_int_equal(two->graph.replayed_steps, 0);
    }
    munmap(two, sizeof *two);
    munmap(one, sizeof *one);
}

static void test_two_ranks_match_one_rank_at_the_same_global_batch(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_two_ranks_against_one(&(run_plan){.timeout_s = 60}, 1e-5);
}

static void test_two_ranks_replaying_their_step_graph_match_one_rank(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_two_ranks_against_one(&(run_plan){.graph = true, .timeout_s = 60}, 1e-5);
}

static void test_reducing_in_bf16_stays_within_bf16_rounding(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_two_ranks_against_one(&(run_plan){.reduce_bf16 = true, .graph = true, .timeout_s = 60}, 2e-2);
}

static void check_killed_rank(bool graph) {
    shared_result *r = shared_new();
    double start = seconds();
    int code = run_two_ranks(
        &(run_plan){.graph = graph, .fail_rank = 1, .fail_step = 5, .fail_signal = SIGKILL, .timeout_s = 60}, r);
    printf("killed rank, graph %s: the run ended with code %d after %.1f s\n", graph ? "on" : "off", code,
           seconds() - start);
    assert_int_equal(code, 128 + SIGKILL);
    assert_true(seconds() - start < 60);
    munmap(r, sizeof *r);
}

static void test_a_killed_rank_ends_the_run_instead_of_hanging(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_killed_rank(false);
}

static void test_a_killed_rank_ends_the_run_with_the_graph_on(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_killed_rank(true);
}

static void check_stopped_rank(bool graph) {
    shared_result *r = shared_new();
    double start = seconds();
    int code = run_two_ranks(
        &(run_plan){.graph = graph, .fail_rank = 1, .fail_step = 5, .fail_signal = SIGSTOP, .timeout_s = 5}, r);
    printf("stopped rank, graph %s: the run ended with code %d after %.1f s (rank 0: %s)\n", graph ? "on" : "off",
           code, seconds() - start, r->error);
    /* 42: rank 0 failed with a message naming itself; 3 or SIGALRM: the watchdog's last resorts. */
    assert_true(code == 42 || code == 3 || code == 128 + SIGALRM);
    assert_true(seconds() - start < 90);
    /* With the graph on, rank 0 was replaying when its peer stopped. */
    if (graph && code == 42) assert_true(r->graph.replayed_steps >= 2);
    munmap(r, sizeof *r);
}

static void test_a_stopped_rank_is_caught_by_the_watchdog_naming_the_rank(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_stopped_rank(false);
}

static void test_a_stopped_rank_is_caught_by_the_watchdog_while_the_other_replays(void **state) {
    (void)state;
    if (gpus_here() < 2) skip();
    check_stopped_rank(true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_reducing_in_bf16_rounds_each_gradient_to_bf16),
        cmocka_unit_test(test_two_ranks_match_one_rank_at_the_same_global_batch),
        cmocka_unit_test(test_two_ranks_replaying_their_step_graph_match_one_rank),
        cmocka_unit_test(test_reducing_in_bf16_stays_within_bf16_rounding),
        cmocka_unit_test(test_a_killed_rank_ends_the_run_instead_of_hanging),
        cmocka_unit_test(test_a_killed_rank_ends_the_run_with_the_graph_on),
        cmocka_unit_test(test_a_stopped_rank_is_caught_by_the_watchdog_naming_the_rank),
        cmocka_unit_test(test_a_stopped_rank_is_caught_by_the_watchdog_while_the_other_replays),
    };
    return cmocka_run_group_tests(tests, write_dataset, remove_dataset);
}
