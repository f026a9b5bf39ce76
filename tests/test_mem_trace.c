/*
 * tests/test_mem_trace.c — the memory picture (UMT_MEM_TRACE, memory/trace.h, drawn by
 * tools/mem_trace_svg.py), on the CPU:
 *   - the trace writer takes the intervals of CPU work from many threads at once (the offload
 *     tier's CPU updates run in a CUDA host function and on worker threads) beside the main
 *     thread's counters, and the file stays one valid JSON document the tool reads whole;
 *   - the tool's arithmetic on a small hand-written trace: the lanes' coverage of the step (the
 *     union of their bars), the exit status under --min-coverage, the pools stacked (their sum,
 *     not the largest pool, is the GPU's use), the budget drawn as a line, the pools otherData
 *     leaves out (pinned host memory) listed and not stacked.
 *
 * argv[1] is tools/mem_trace_svg.py (tests/BUILD passes its location); python3 runs it.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memory/pool.h"
#include "memory/trace.h"
#include "tests/run_program.h"
#include "tests/scratch.h"

static const char *tool;

enum { THREADS = 4, INTERVALS_PER_THREAD = 250 };

typedef struct {
    umt_trace *trace;
    int thread;
} writer;

/* One thread's CPU "updates": a little work each, timed on the trace's clock, then written. */
static void *write_intervals(void *arg) {
    writer *w = arg;
    volatile double sink = 0;
    for (int i = 0; i < INTERVALS_PER_THREAD; ++i) {
        double begin = umt_trace_now_us(w->trace);
        for (int k = 0; k < 2000; ++k) sink += k * 0.5;
        char name[32];
        snprintf(name, sizeof name, "fc\"%d\\%d", w->thread, i); /* a quote and a backslash: escaped */
        double end = umt_trace_now_us(w->trace);
        umt_trace_host_interval(w->trace, begin, end, name, "cpu update", UMT_TRACE_HOST_UPDATE, 0);
    }
    return NULL;
}

/* Runs the tool on trace with extra flags; its output in out, its exit status returned. */
static int draw(const char *trace, const char *flags, char *out, size_t size) {
    char command[2048];
    snprintf(command, sizeof command, "python3 %s %s -o %s %s", tool, trace, scratch_path("picture.svg"), flags);
    return run_program(command, out, size);
}

static void test_cpu_threads_intervals_beside_the_counters_make_one_valid_trace(void **state) {
    (void)state;
    umt_memory mem;
    umt_memory_init(&mem, UMT_DEVICE_CPU, UMT_MEM_MANAGED, 0);
    char path[512];
    snprintf(path, sizeof path, "%s", scratch_path("threads.json"));
    umt_trace *trace = NULL;
    assert_int_equal(umt_trace_open(path, &mem, &trace), UMT_OK);
    umt_trace_mark(trace, "step 0");
    pthread_t ids[THREADS];
    writer writers[THREADS];
    for (int t = 0; t < THREADS; ++t) {
        writers[t] = (writer){trace, t};
        assert_int_equal(pthread_create(&ids[t], NULL, write_intervals, &writers[t]), 0);
    }
    size_t bytes[UMT_POOL_COUNT] = {0};
    for (int i = 0; i < 1000; ++i) { /* the main thread writes meanwhile, as during backward */
        bytes[UMT_POOL_WEIGHTS] = (size_t)(i % 7 + 1) << 20;
        umt_trace_counters(trace, bytes);
        umt_trace_alloc(trace, UMT_POOL_WEIGHTS, 4096, i % 2);
    }
    for (int t = 0; t < THREADS; ++t) assert_int_equal(pthread_join(ids[t], NULL), 0);
    umt_trace_mark(trace, "step 1");
    umt_trace_close(trace);
    umt_memory_release(&mem);

    char out[4096];
    int status = draw(path, "--step 0", out, sizeof out);
    assert_int_equal(status, 0);
    char expected[64];
    snprintf(expected, sizeof expected, "%d intervals", THREADS * INTERVALS_PER_THREAD);
    if (!strstr(out, expected) || !strstr(out, "lanes cover")) fail_msg("mem_trace_svg printed:\n%s", out);
}

/* Step 0 from 0 to 100 ms: copy in 0-30 ms, the CPU's update 20-60, copy out 70-90: 80% covered,
 * blank 60-70 and 90-100. weights 1 GiB, then 0.5 GiB from 60 ms; stream 0.5 GiB from 20 ms: the
 * stack reaches 1.5 GiB (20-60 ms) though no pool holds more than 1 GiB; offload (pinned host
 * memory) is not stacked. A bar of a category the tool does not know gets a lane and counts. */
static const char synthetic[] =
    "{\"otherData\": {\"device\": \"cuda\", \"budget_bytes\": 2147483648,\n"
    "\"stacked_pools\": [\"weights\", \"stream\"]},\n"
    "\"traceEvents\": [\n"
    "{\"name\": \"step 0\", \"cat\": \"step\", \"ph\": \"i\", \"ts\": 0},\n"
    "{\"name\": \"pool bytes\", \"ph\": \"C\", \"ts\": 0, \"args\": {\"weights\": 1073741824, \"stream\": 0, "
    "\"offload\": 4294967296}},\n"
    "{\"name\": \"pool bytes\", \"ph\": \"C\", \"ts\": 20000, \"args\": {\"weights\": 1073741824, "
    "\"stream\": 536870912, \"offload\": 4294967296}},\n"
    "{\"name\": \"pool bytes\", \"ph\": \"C\", \"ts\": 60000, \"args\": {\"weights\": 536870912, "
    "\"stream\": 536870912, \"offload\": 4294967296}},\n"
    "{\"name\": \"fc1\", \"cat\": \"prefetch\", \"ph\": \"X\", \"ts\": 0, \"dur\": 30000, \"args\": {\"bytes\": 1}},\n"
    "{\"name\": \"fc1\", \"cat\": \"cpu update\", \"ph\": \"X\", \"ts\": 20000, \"dur\": 40000},\n"
    "{\"name\": \"fc1\", \"cat\": \"offload\", \"ph\": \"X\", \"ts\": 70000, \"dur\": 15000},\n"
    "{\"name\": \"x\", \"cat\": \"something new\", \"ph\": \"X\", \"ts\": 80000, \"dur\": 10000},\n"
    "{\"name\": \"step 1\", \"cat\": \"step\", \"ph\": \"i\", \"ts\": 100000},\n"
    "{\"name\": \"fc2\", \"cat\": \"offload\", \"ph\": \"X\", \"ts\": 100000, \"dur\": 5000},\n"
    "{\"name\": \"step 2\", \"cat\": \"step\", \"ph\": \"i\", \"ts\": 110000}\n"
    "]}\n";

static void test_the_lanes_coverage_is_the_union_of_their_bars_and_min_coverage_fails_under_it(void **s) {
    (void)s;
    char path[512]; /* a copy: scratch_path's buffers are reused */
    snprintf(path, sizeof path, "%s", scratch_write("synthetic.json", (const uint8_t *)synthetic, strlen(synthetic)));
    char out[4096];
    assert_int_equal(draw(path, "--step 0", out, sizeof out), 0);
    if (!strstr(out, "step 0: 100.0 ms, lanes cover 80.0%") || !strstr(out, "longest blank 10.0 ms at 60.0 ms") ||
        !strstr(out, "something new 10.0"))
        fail_msg("mem_trace_svg printed:\n%s", out);
    assert_int_equal(draw(path, "--step 0 --min-coverage 0.8", out, sizeof out), 0);
    assert_int_equal(draw(path, "--step 0 --min-coverage 0.95", out, sizeof out), 1);
    if (!strstr(out, "under --min-coverage 95.0%")) fail_msg("mem_trace_svg printed:\n%s", out);
    /* The default step is the last whole one: 10 ms, half of it copying out. */
    assert_int_equal(draw(path, "", out, sizeof out), 0);
    if (!strstr(out, "step 1: 10.0 ms, lanes cover 50.0%")) fail_msg("mem_trace_svg printed:\n%s", out);
}

static void test_the_pools_are_stacked_under_the_budget_line(void **state) {
    (void)state;
    char path[512]; /* a copy: scratch_path's buffers are reused */
    snprintf(path, sizeof path, "%s", scratch_write("synthetic.json", (const uint8_t *)synthetic, strlen(synthetic)));
    char out[4096];
    assert_int_equal(draw(path, "--step 0", out, sizeof out), 0);
    if (!strstr(out, "2 pools stacked (1.500 GiB at most of a 2.000 GiB budget)"))
        fail_msg("mem_trace_svg printed:\n%s", out);
    size_t size = 0;
    uint8_t *bytes = scratch_read(scratch_path("picture.svg"), &size);
    char *picture = calloc(size + 1, 1); /* a string: scratch_read's bytes end without a NUL */
    assert_non_null(picture);
    memcpy(picture, bytes, size);
    free(bytes);
    int areas = 0;
    for (const char *p = picture; (p = strstr(p, "<path class=\"pool\"")); ++p) areas++;
    bool budget_line = strstr(picture, "<line class=\"budget\"") != NULL;
    bool offload_listed = strstr(picture, "offload (pinned host memory, not drawn): 4.000 GiB") != NULL;
    bool sum_listed = strstr(picture, "all pools together: 1.500 GiB at most") != NULL;
    free(picture);
    assert_int_equal(areas, 2);
    assert_true(budget_line);
    assert_true(offload_listed);
    assert_true(sum_listed);
}

static int setup(void **state) {
    (void)state;
    return scratch_make("mem_trace");
}

static int teardown(void **state) {
    (void)state;
    return scratch_remove();
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s tools/mem_trace_svg.py\n", argv[0]);
        return 2;
    }
    tool = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_threads_intervals_beside_the_counters_make_one_valid_trace),
        cmocka_unit_test(test_the_lanes_coverage_is_the_union_of_their_bars_and_min_coverage_fails_under_it),
        cmocka_unit_test(test_the_pools_are_stacked_under_the_budget_line),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
