/*
 * tests/gpu/test_cuda_ledger.c — one budget per GPU across processes (issue 27), on a real GPU,
 * each process asking for 60% of the free memory the test measured first:
 *   - two processes started at once, each asking for it in one block: one gets it, the other is
 *     refused naming the first's pid, and together they never hold more than the card had free;
 *   - a process killed while it holds it: its reservation is free for the next, which gets it;
 *   - a process started beside one that holds it has a budget of what is left, and its memory plan
 *     takes the ladder (micro-batches) for a batch that a process alone on the GPU runs whole.
 * The test's own process never touches CUDA (a child forked from a process that has cannot use
 * it): children do, each a process of its own, reporting through a pipe (tests/forked.h). The
 * ledger lives in a temporary directory (UMT_LEDGER_DIR), apart from other umtrain runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/base/error.h"
#include "core/context.h"
#include "memory/budget.h"
#include "memory/ledger.h"
#include "tests/forked.h"
#include "umtrain.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
/* The plan's model: an MLP of DEPTH layers of WIDTH, whose activations grow with the batch. */
#define WIDTH 4096
#define DEPTH 8

typedef enum { MEASURE, HOLD, PLAN } job;

/* What a child does. */
typedef struct {
    job job;
    size_t bytes;           /* HOLD: one block of this many bytes */
    int start_fd;           /* -1, or read to its end first: the start line of a race */
    size_t wait_free_bytes; /* 0, or wait (30 s at most) until the GPU has this much free */
    int64_t batch;          /* PLAN: the batch (0: sized between its budget and the card's capacity) */
} task;

/* What it reports. */
typedef struct {
    int64_t pid;
    bool created;   /* its context was made */
    int status;     /* of its block, or of its plan */
    size_t free_bytes, total_bytes;  /* the GPU's, at the end of its work */
    size_t budget_bytes, held_bytes; /* umt_device_budget */
    size_t capacity_bytes;           /* the ledger's */
    int other_count;                 /* other live holders in the ledger */
    int64_t batch, micro_batches;
    bool fits;
    char message[1536];
} report;

static size_t free0, total0; /* measured by a child before any test */
static char ledger_dir[] = "/tmp/umt_ledger_gpu_XXXXXX";

/* ----------------------------------------------------------------------------------------- */
/* In the children: no cmocka here */

static void wait_free(size_t bytes) {
    size_t free_bytes = 0, total = 0;
    for (int i = 0; i < 300; ++i) {
        if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && free_bytes >= bytes) return;
        nanosleep(&(struct timespec){0, 100000000}, NULL); /* the driver frees a killed process's memory */
    }
}

typedef struct {
    umt_layer *layers[DEPTH];
} mlp;

static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    const mlp *m = user;
    umt_tensor *h = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, WIDTH);
    umt_tensor *labels = h ? umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch) : NULL;
    for (int l = 0; l < DEPTH - 1; ++l) h = umt_layer_forward_relu(ctx, m->layers[l], h);
    h = umt_layer_forward(ctx, m->layers[DEPTH - 1], h);
    return labels ? umt_softmax_cross_entropy(ctx, h, labels) : NULL;
}

static umt_status plan(umt_context *ctx, mlp *m, int64_t batch, int64_t k, umt_memory_plan *out) {
    umt_memory_plan_request rq = {.batch = batch, .micro_batches = k};
    return umt_memory_plan_make(ctx, &rq, plan_forward, m, out);
}

/* A batch whose whole step needs about halfway between this context's budget and the card's
 * capacity (what a process alone gets): from the device peak at two batches, forced whole. */
static umt_status sized_batch(umt_context *ctx, mlp *m, size_t budget, size_t capacity, int64_t *batch) {
    umt_memory_plan small, large;
    UMT_TRY(plan(ctx, m, 1024, 1, &small));
    UMT_TRY(plan(ctx, m, 2048, 1, &large));
    if (large.device_peak_bytes <= small.device_peak_bytes)
        return umt_fail(UMT_ERR_STATE, "sized_batch: the device peak did not grow from batch 1024 (%zu) to 2048 (%zu)",
                        small.device_peak_bytes, large.device_peak_bytes);
    double per_sample = (double)(large.device_peak_bytes - small.device_peak_bytes) / 1024.0;
    double target = 0.5 * ((double)budget + (double)capacity);
    *batch = 1024 + (int64_t)((target - (double)small.device_peak_bytes) / per_sample);
    /* Under cuDNN's element limit (the largest tensor is batch x WIDTH): k from the budget alone. */
    int64_t most = (int64_t)(INT32_MAX / WIDTH) / 2;
    if (*batch > most) *batch = most;
    return UMT_OK;
}

static umt_status plan_job(umt_context *ctx, const task *t, report *r) {
    mlp m;
    char name[16];
    for (int l = 0; l < DEPTH; ++l) {
        snprintf(name, sizeof name, "fc%d", l);
        m.layers[l] = umt_linear_layer_new(ctx, name, WIDTH, l == DEPTH - 1 ? 10 : WIDTH, true);
        if (!m.layers[l]) return umt_last_status();
    }
    r->batch = t->batch;
    if (!r->batch) UMT_TRY(sized_batch(ctx, &m, r->budget_bytes, r->capacity_bytes, &r->batch));
    umt_memory_plan p;
    UMT_TRY(plan(ctx, &m, r->batch, 0, &p));
    umt_memory_plan_print(&p, stdout);
    r->micro_batches = p.micro_batches;
    r->fits = p.fits;
    return UMT_OK;
}

static void note_context(umt_context *ctx, report *r) {
    umt_device_budget(ctx, &r->budget_bytes, &r->held_bytes);
    umt_ledger_view v;
    if (ctx->memory.ledger && umt_ledger_look(ctx->memory.ledger, &v) == UMT_OK) {
        r->capacity_bytes = v.capacity_bytes;
        r->other_count = v.other_count;
    }
}

/* The child: the task's work, and the GPU as it left it. Its context lives on with the process,
 * holding what it made, until the test lets it go (or kills it). */
static void work(const void *arg, void *out) {
    const task *t = arg;
    report *r = out;
    r->pid = (int64_t)getpid();
    char byte;
    if (t->start_fd >= 0)
        while (read(t->start_fd, &byte, 1) > 0) continue;
    if (t->wait_free_bytes) wait_free(t->wait_free_bytes);
    umt_context *ctx = NULL;
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    r->status = t->job == MEASURE ? UMT_OK : umt_context_create(&o, &ctx);
    r->created = ctx != NULL;
    if (ctx) note_context(ctx, r);
    if (ctx && t->job == HOLD) {
        umt_tensor *block = umt_tensor_new_1d(ctx, UMT_POOL_OPTIM, UMT_U8, (int64_t)t->bytes);
        /* Prefetched: its pages are on the GPU once the stream has run. */
        r->status = block ? umt_synchronize(ctx) : umt_last_status();
    }
    if (ctx && t->job == PLAN) r->status = plan_job(ctx, t, r);
    if (r->status != UMT_OK) snprintf(r->message, sizeof r->message, "%s", umt_last_error());
    if (ctx) {
        note_context(ctx, r);
        umt_memory_report(ctx); /* the pools and the ledger's other holders, in the test's log */
    }
    cudaMemGetInfo(&r->free_bytes, &r->total_bytes);
}

/* ----------------------------------------------------------------------------------------- */
/* The tests */

/* The child's report, printed. */
static report report_of(forked_child *c) {
    report r;
    forked_report(c, &r, sizeof r);
    print_message("pid %lld: created %d, status %s, budget %zu, held %zu, free %zu, %d other holder(s)%s%s\n",
                  (long long)r.pid, r.created, umt_status_name((umt_status)r.status), r.budget_bytes, r.held_bytes,
                  r.free_bytes, r.other_count, r.message[0] ? ": " : "", r.message);
    return r;
}

static report run_child(forked_child *c, const task *t) {
    *c = forked_spawn(work, t, sizeof(report), t->start_fd);
    return report_of(c);
}

static int setup(void **state) {
    (void)state;
    if (!mkdtemp(ledger_dir)) return -1;
    setenv("UMT_LEDGER_DIR", ledger_dir, 1);
    forked_child c;
    task measure = {.job = MEASURE, .start_fd = -1};
    report r = run_child(&c, &measure);
    forked_finish(&c, false);
    free0 = r.free_bytes;
    total0 = r.total_bytes;
    print_message("the GPU: %zu bytes free of %zu; each process asks for 60%%\n", free0, total0);
    return free0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char command[128];
    snprintf(command, sizeof command, "rm -rf %s", ledger_dir);
    return system(command) == 0 ? 0 : -1;
}

static size_t sixty_percent(void) { return free0 / 10 * 6 / (2 * MIB) * (2 * MIB); }

static bool names_pid(const char *message, int64_t pid) {
    char text[48];
    snprintf(text, sizeof text, "pid %lld:", (long long)pid);
    return strstr(message, text) != NULL;
}

static void test_two_processes_started_at_once_never_hold_more_than_the_card_had_free(void **state) {
    (void)state;
    int start[2];
    assert_int_equal(pipe(start), 0);
    task hold = {.job = HOLD, .bytes = sixty_percent(), .start_fd = start[0]};
    forked_child a = forked_spawn(work, &hold, sizeof(report), start[0]);
    forked_child b = forked_spawn(work, &hold, sizeof(report), start[0]);
    close(start[0]);
    close(start[1]); /* both start now */
    report r[2] = {report_of(&a), report_of(&b)};
    assert_true(r[0].created && r[1].created);
    assert_int_equal((r[0].status == UMT_OK) + (r[1].status == UMT_OK), 1);
    const report *holder = r[0].status == UMT_OK ? &r[0] : &r[1], *refused = holder == &r[0] ? &r[1] : &r[0];
    assert_int_equal(refused->status, UMT_ERR_BUDGET);
    assert_true(names_pid(refused->message, holder->pid));
    assert_true(r[0].held_bytes + r[1].held_bytes <= free0);
    forked_finish(&a, false);
    forked_finish(&b, false);
}

static void test_a_killed_holders_reservation_is_freed_for_the_next(void **state) {
    (void)state;
    forked_child a, b;
    task hold = {.job = HOLD, .bytes = sixty_percent(), .start_fd = -1};
    report first = run_child(&a, &hold);
    assert_int_equal(first.status, UMT_OK);
    forked_finish(&a, true); /* SIGKILL while it holds 60% */
    hold.wait_free_bytes = free0 - GIB;
    report next = run_child(&b, &hold);
    assert_int_equal(next.status, UMT_OK);
    assert_int_equal(next.other_count, 0);
    assert_true(next.budget_bytes >= sixty_percent());
    forked_finish(&b, false);
}

static void test_a_process_beside_a_holder_plans_for_what_is_left(void **state) {
    (void)state;
    forked_child a, b, c;
    task hold = {.job = HOLD, .bytes = sixty_percent(), .start_fd = -1};
    assert_int_equal(run_child(&a, &hold).status, UMT_OK);
    task beside = {.job = PLAN, .start_fd = -1};
    report second = run_child(&b, &beside);
    assert_int_equal(second.status, UMT_OK);
    /* Its budget leaves out what the first holds: together within the card's capacity. */
    assert_int_equal(second.other_count, 1);
    assert_true(second.budget_bytes + sixty_percent() <= free0 - umt_budget_headroom(total0) + 64 * MIB);
    print_message("beside the holder: batch %lld as %lld micro-batch(es)\n", (long long)second.batch,
                  (long long)second.micro_batches);
    assert_true(second.micro_batches > 1);
    assert_true(second.fits);
    forked_finish(&a, false);
    forked_finish(&b, false);
    task alone = {.job = PLAN, .start_fd = -1, .wait_free_bytes = free0 - GIB, .batch = second.batch};
    report third = run_child(&c, &alone);
    assert_int_equal(third.status, UMT_OK);
    assert_int_equal(third.other_count, 0);
    assert_int_equal(third.micro_batches, 1);
    assert_true(third.fits);
    forked_finish(&c, false);
}

#define TEST(test) cmocka_unit_test_teardown(test, forked_kill_all)

int main(void) {
    const struct CMUnitTest tests[] = {
        TEST(test_two_processes_started_at_once_never_hold_more_than_the_card_had_free),
        TEST(test_a_killed_holders_reservation_is_freed_for_the_next),
        TEST(test_a_process_beside_a_holder_plans_for_what_is_left),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
