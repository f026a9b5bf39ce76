/*
 * tests/gpu/test_cuda_offload.c — the offload tier on a real GPU: a model trained with a budget
 * that forces its parameters, gradients and Adam state into pinned host memory gives the same
 * losses over 10 steps as the same model in GPU memory (fp32, updates on the GPU, on the CPU,
 * auto, and during backward); a middle budget offloads optimizer state only (and updates it in
 * backward, the parameters resident); the device stays within the budget; the
 * UMT_MEM_TRACE file is valid JSON naming every pool, with the CPU threads' updates on the
 * devices' time axis; a refusal prints the pools largest first;
 * at a batch whose saved activations do not fit beside the rest, a run that offloads them gives
 * the in-memory losses too, where the same budget without them is refused.
 */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"
#include "memory/trace.h"
#include "tests/gpu/offload_count.h"
#include "umtrain.h"

#define WIDTH 2048
#define DEPTH 6
#define BATCH 64
#define STEPS 10
/* The activation test: 8 MiB per saved activation, 13 of them, and their gradients. */
#define BATCH_WIDE 1024

typedef struct {
    umt_context *ctx;
    umt_layer *layers[DEPTH];
    umt_optimizer *opt;
    umt_tensor *x, *labels;
} model;

/* The context of the case running now. A case that fails midway leaves it, and what it holds of
 * the GPU, to the teardown, so that the next case starts as it would have alone. */
static umt_context *alive;

static void destroy(model *m) {
    umt_context_destroy(m->ctx);
    m->ctx = alive = NULL;
}

/* Streamed parameters updated by CPU threads in each backward (umt_offload_options.host_updates); the
 * teardown sets it back to 0. */
static int host_updates;

static int destroy_leftover(void **state) {
    (void)state;
    unsetenv("UMT_MEM_TRACE");
    host_updates = 0;
    umt_context_destroy(alive);
    alive = NULL;
    return 0;
}

/* budget NULL: no UMT_DEVICE_BUDGET, no offload (the in-memory run). */
static void build_with(model *m, const char *budget, umt_offload_optimizer where, int batch, size_t reserve,
                       bool activations) {
    if (budget) setenv("UMT_DEVICE_BUDGET", budget, 1);
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CUDA;
    o.seed = 7;
    umt_status st = umt_context_create(&o, &m->ctx);
    unsetenv("UMT_DEVICE_BUDGET");
    if (st != UMT_OK) fail_msg("context: %s", umt_last_error());
    alive = m->ctx;
    umt_offload_options tier = umt_offload_defaults();
    tier.reserve_bytes = reserve;
    tier.optimizer = where;
    tier.activations = activations;
    tier.host_updates = host_updates;
    if (budget && umt_offload_enable(m->ctx, &tier) != UMT_OK) fail_msg("offload: %s", umt_last_error());
    for (int l = 0; l < DEPTH; ++l) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", l);
        m->layers[l] = umt_linear_layer_new(m->ctx, name, WIDTH, WIDTH, true);
        assert_non_null(m->layers[l]);
    }
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    assert_int_equal(umt_optimizer_create(m->ctx, &oo, &m->opt), UMT_OK);
    m->x = umt_tensor_new_2d(m->ctx, UMT_POOL_DATASET, UMT_F32, batch, WIDTH);
    m->labels = umt_tensor_new_1d(m->ctx, UMT_POOL_DATASET, UMT_I32, batch);
    assert_int_equal(umt_tensor_uniform(m->ctx, m->x, -1.0f, 1.0f), UMT_OK);
    int32_t labels[BATCH_WIDE];
    for (int i = 0; i < batch; ++i) labels[i] = (i * 37) % WIDTH;
    assert_int_equal(umt_tensor_copy_from_host(m->labels, labels, (size_t)batch * sizeof *labels), UMT_OK);
}

static void build(model *m, const char *budget, umt_offload_optimizer where) {
    build_with(m, budget, where, BATCH, (size_t)16 << 20, false);
}

/* One training step; its loss read back. */
static umt_status train_step(model *m, float *loss_out) {
    UMT_TRY(umt_step_begin(m->ctx));
    UMT_TRY(umt_zero_grad(m->ctx));
    umt_tensor *h = m->x;
    for (int l = 0; l < DEPTH; ++l) {
        h = umt_layer_forward(m->ctx, m->layers[l], h);
        if (l + 1 < DEPTH) h = umt_relu(m->ctx, h);
    }
    umt_tensor *loss = umt_softmax_cross_entropy(m->ctx, h, m->labels);
    if (!loss) return umt_last_status();
    UMT_TRY(umt_backward(m->ctx, loss));
    UMT_TRY(umt_optimizer_step(m->opt));
    return umt_tensor_get_f32(loss, 0, loss_out);
}

static void train(model *m, float losses[STEPS]) {
    for (int s = 0; s < STEPS; ++s)
        if (train_step(m, &losses[s]) != UMT_OK) fail_msg("step %d: %s", s + 1, umt_last_error());
}

static void expect_same_losses(const float *a, const float *b) {
    for (int s = 0; s < STEPS; ++s) {
        double rel = fabs((double)a[s] - b[s]) / fabs((double)b[s]);
        print_message("step %2d: in memory %.9g, offloaded %.9g, relative %.2e\n", s + 1, b[s], a[s], rel);
        assert_true(rel <= 1e-5);
    }
    assert_true(b[STEPS - 1] < b[0]); /* and it trains */
}

static float reference[STEPS];

/* Updates in backward: every step updated every parameter the tier holds anything of then; the
 * other ways: none. */
static void expect_updates_in_backward(const model *m, umt_offload_optimizer where) {
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(m->ctx, &st), UMT_OK);
    /* backward updates after backward where the budget cannot hold its ring */
    if (where == UMT_OFFLOAD_OPTIM_BACKWARD) where = st.optimizer;
    uint64_t expected = where == UMT_OFFLOAD_OPTIM_BACKWARD ? (uint64_t)STEPS * offload_count_parameters(m->ctx) : 0;
    print_message("%llu updates in backward, %llu expected\n", (unsigned long long)st.updates_in_backward,
                  (unsigned long long)expected);
    assert_int_equal(st.updates_in_backward, expected);
}

static int make_reference(void **state) {
    (void)state;
    model m;
    build(&m, NULL, UMT_OFFLOAD_OPTIM_AUTO);
    train(&m, reference);
    destroy(&m);
    return 0;
}

/* Every weight matrix, its gradient and its Adam state in pinned host memory; the device within
 * the budget. Updates in backward need their ring too (4 entries of three 4 MiB chunks). */
static umt_offload_stats run_fully_offloaded(umt_offload_optimizer where, size_t budget_mib) {
    model m;
    char budget_text[32];
    snprintf(budget_text, sizeof budget_text, "%zuM", budget_mib);
    build(&m, budget_text, where);
    float losses[STEPS];
    train(&m, losses);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(m.ctx, &st), UMT_OK);
    /* weights and grads of each matrix, and all Adam state (the biases' too: stage 1 took it all) */
    assert_int_equal(st.offloaded_tensors, 2 * DEPTH + 4 * DEPTH);
    assert_true(st.bytes_to_device > (uint64_t)STEPS * DEPTH * WIDTH * WIDTH * 4);
    struct cudaPointerAttributes a;
    umt_tensor *w = umt_parameter_at(m.ctx, 0);
    assert_int_equal(cudaPointerGetAttributes(&a, w->offload.home), cudaSuccess);
    assert_int_equal(a.type, cudaMemoryTypeHost);
    size_t budget, used;
    umt_device_budget(m.ctx, &budget, &used);
    assert_true(budget <= budget_mib << 20);
    assert_true(used <= budget);
    expect_same_losses(losses, reference);
    expect_updates_in_backward(&m, where);
    destroy(&m);
    return st;
}

static void test_offloaded_run_matches_in_memory_losses_with_gpu_updates(void **state) {
    (void)state;
    run_fully_offloaded(UMT_OFFLOAD_OPTIM_GPU, 200);
}

static void test_offloaded_run_matches_in_memory_losses_with_cpu_updates(void **state) {
    (void)state;
    run_fully_offloaded(UMT_OFFLOAD_OPTIM_CPU, 200);
}

static void test_auto_times_both_updates_and_keeps_the_faster(void **state) {
    (void)state;
    umt_offload_stats st = run_fully_offloaded(UMT_OFFLOAD_OPTIM_AUTO, 200);
    assert_true(st.optimizer == UMT_OFFLOAD_OPTIM_GPU || st.optimizer == UMT_OFFLOAD_OPTIM_CPU);
    assert_true(st.optimizer_gpu_ms > 0 && st.optimizer_cpu_ms > 0);
}

/* At 200M the update ring (48 MiB) does not fit beside the double buffer: updates in backward
 * give way to auto's, after backward, and the run trains to the same losses. */
static void test_updates_in_backward_give_way_where_the_ring_does_not_fit(void **state) {
    (void)state;
    umt_offload_stats st = run_fully_offloaded(UMT_OFFLOAD_OPTIM_BACKWARD, 200);
    assert_true(st.optimizer == UMT_OFFLOAD_OPTIM_GPU || st.optimizer == UMT_OFFLOAD_OPTIM_CPU);
    assert_int_equal(st.updates_in_backward, 0);
}

static void test_offloaded_run_matches_in_memory_losses_with_updates_in_backward(void **state) {
    (void)state;
    run_fully_offloaded(UMT_OFFLOAD_OPTIM_BACKWARD, 240);
}

/* The first two layers of each backward updated by CPU threads, the other four through the ring:
 * the same losses and updates, and fewer bytes home. Per step a layer through the ring sends its
 * weights and both Adam moments (3 units of WIDTH^2 floats), a layer on the CPU its gradient (1);
 * the biases' state adds a little. */
/* UMT_OFFLOAD_HOST_AUTO: the share the measured rates give (printed). It takes a layer of the six
 * once it passes a twelfth: Adam's share, 12 R / (B + 8 R), does so when the CPU updates more than
 * B / 136 elements a second, 0.4 G at 50 GB/s (one core of a GPU host does more: docs/PERF.md,
 * "CPU Adam update"). */
static void test_updates_in_backward_share_the_cpu_by_measured_rates(void **state) {
    (void)state;
    host_updates = UMT_OFFLOAD_HOST_AUTO;
    umt_offload_stats st = run_fully_offloaded(UMT_OFFLOAD_OPTIM_BACKWARD, 240);
    uint64_t ring_only = (uint64_t)STEPS * 3 * DEPTH * WIDTH * WIDTH * 4;
    print_message("%.1f MB to the host in %d steps; through the ring alone at least %.1f MB; CPU updates %d a step "
                  "(-1: still searched)\n", st.bytes_to_host / 1e6, STEPS, ring_only / 1e6, st.host_updates);
    assert_true(st.bytes_to_host < ring_only);
    /* The search for the count (four steps a count) stays within the streamed parameters. */
    assert_true(st.host_updates >= -1 && st.host_updates <= DEPTH);
}

/* umt_offload_host_memory_measure: the CPU's update and the link, alone and both at once, each
 * rate measured (a rate of 0 would mean a side did not run), and the bytes an element of the
 * update reads and writes in f32 (master, two states and the gradient: 28); refused without the
 * tier, naming what to call. */
static void test_host_memory_measure_times_the_cpu_and_the_link_alone_and_at_once(void **state) {
    (void)state;
    model m = {0};
    build(&m, "1G", UMT_OFFLOAD_OPTIM_BACKWARD); /* room for the link's buffers (256 MiB) */
    umt_host_memory_speed hm;
    assert_int_equal(umt_offload_host_memory_measure(m.ctx, &hm), UMT_OK);
    print_message("CPU update %.2f G/s alone, %.2f beside the link; link %.1f GB/s alone, %.1f beside the CPU\n",
                  hm.cpu_alone / 1e9, hm.cpu_beside_link / 1e9, hm.link_alone_gbps, hm.link_beside_cpu_gbps);
    assert_true(hm.cpu_alone > 0 && hm.cpu_beside_link > 0);
    assert_true(hm.link_alone_gbps > 0 && hm.link_beside_cpu_gbps > 0);
    assert_float_equal(hm.update_bytes, 28.0, 0.0);
    destroy(&m);
    model plain = {0};
    build(&plain, NULL, UMT_OFFLOAD_OPTIM_BACKWARD);
    assert_int_equal(umt_offload_host_memory_measure(plain.ctx, &hm), UMT_ERR_STATE);
    assert_non_null(strstr(umt_last_error(), "umt_offload_enable"));
    destroy(&plain);
}

static void test_updates_in_backward_on_the_cpu_beside_the_ring(void **state) {
    (void)state;
    host_updates = 2;
    umt_offload_stats st = run_fully_offloaded(UMT_OFFLOAD_OPTIM_BACKWARD, 240);
    uint64_t unit = (uint64_t)WIDTH * WIDTH * 4, units = 3 * (DEPTH - 2) + 2;
    print_message("%.1f MB to the host in %d steps; %.1f MB for %llu units a step\n", st.bytes_to_host / 1e6, STEPS,
                  (double)(STEPS * units * unit) / 1e6, (unsigned long long)units);
    assert_true(st.bytes_to_host >= STEPS * units * unit);
    assert_true(st.bytes_to_host < STEPS * (units + 1) * unit);
}

/* Weights and gradients stay on the GPU, some Adam state is offloaded. */
static void run_middle_budget(const char *budget, umt_offload_optimizer where) {
    model m;
    build(&m, budget, where);
    float losses[STEPS];
    train(&m, losses);
    int weights_home = 0, state_home = 0;
    for (int i = 0; i < umt_parameter_count(m.ctx); ++i) weights_home += umt_parameter_at(m.ctx, i)->offload.home != NULL;
    for (umt_tensor *t = m.ctx->run_tensors; t; t = t->next) state_home += t->kind_pool == UMT_POOL_OPTIM && t->offload.home;
    assert_int_equal(weights_home, 0);
    /* Four state tensors per layer (Adam's two for the weights, two for the bias): some, not all. */
    assert_true(state_home >= 1 && state_home < 4 * DEPTH);
    expect_same_losses(losses, reference);
    expect_updates_in_backward(&m, where);
    destroy(&m);
}

static void test_a_middle_budget_offloads_optimizer_state_only(void **state) {
    (void)state;
    /* 432.5 MiB wanted; offloading Adam moments (16 MiB each) pays for the 128 MiB double buffer
     * after 8 of them, and 420M needs 11. */
    run_middle_budget("420M", UMT_OFFLOAD_OPTIM_AUTO);
}

static void test_resident_parameters_update_their_offloaded_state_in_backward(void **state) {
    (void)state;
    /* Everything on the GPU takes 433 MiB (a plan's "fits" line), so the budget stays below that.
     * The double buffer (128 MiB) and the update ring (4 entries of three 4 MiB chunks, 48 MiB)
     * then cost 3 more large moments (16 MiB each) than the 420M run's 9: at 425M, all 12. */
    run_middle_budget("425M", UMT_OFFLOAD_OPTIM_BACKWARD);
}

/* ----------------------------------------------------------------------------------------- */
/* The trace: a small JSON checker (the grammar, nothing more) */

static const char *json_value(const char *p);

static const char *skip_space(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static const char *json_string(const char *p) {
    if (*p++ != '"') return NULL;
    for (; *p && *p != '"'; ++p)
        if (*p == '\\' && !*++p) return NULL;
    return *p == '"' ? p + 1 : NULL;
}

static const char *json_list(const char *p, char close, bool object) {
    p = skip_space(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
        if (object) {
            if (!(p = json_string(skip_space(p)))) return NULL;
            p = skip_space(p);
            if (*p++ != ':') return NULL;
        }
        if (!(p = json_value(p))) return NULL;
        p = skip_space(p);
        if (*p == close) return p + 1;
        if (*p++ != ',') return NULL;
    }
}

static const char *json_value(const char *p) {
    p = skip_space(p);
    if (*p == '{') return json_list(p, '}', true);
    if (*p == '[') return json_list(p, ']', false);
    if (*p == '"') return json_string(p);
    if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    char *end;
    strtod(p, &end);
    return end == p ? NULL : end;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return text;
}

static void test_trace_is_valid_json_naming_every_pool(void **state) {
    (void)state;
    const char *path = "/tmp/umt_test_offload_trace.json";
    setenv("UMT_MEM_TRACE", path, 1);
    model m;
    build(&m, "200M", UMT_OFFLOAD_OPTIM_GPU);
    unsetenv("UMT_MEM_TRACE");
    float losses[STEPS];
    train(&m, losses);
    destroy(&m);
    char *text = read_file(path);
    const char *end = json_value(text);
    assert_non_null(end);
    assert_int_equal(*skip_space(end), '\0');
    for (int p = 0; p < UMT_POOL_COUNT; ++p) {
        char key[32];
        snprintf(key, sizeof key, "\"%s\": ", umt_pool_name((umt_pool)p));
        assert_non_null(strstr(text, key));
    }
    assert_non_null(strstr(text, "\"cat\": \"prefetch\""));
    assert_non_null(strstr(text, "\"cat\": \"offload\""));
    assert_non_null(strstr(text, "\"name\": \"step 9\""));
    free(text);
}

/* A complete event of the trace (memory/trace.c writes one event a line): its track and times, us. */
typedef struct {
    int track;
    double begin, end;
} traced_interval;

static int complete_events(const char *text, traced_interval *out, int most) {
    int count = 0;
    for (const char *line = text; *line && count < most;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char event[1024]; /* one line at a time: searching the rest of a large file per line is slow */
        if (n < sizeof event) {
            memcpy(event, line, n);
            event[n] = '\0';
            const char *tid = strstr(event, "\"tid\": "), *ts = strstr(event, "\"ts\": "),
                       *dur = strstr(event, "\"dur\": ");
            if (strstr(event, "\"ph\": \"X\"") && tid && ts && dur) {
                double begin = strtod(ts + 6, NULL);
                out[count++] = (traced_interval){atoi(tid + 7), begin, begin + strtod(dur + 7, NULL)};
            }
        }
        line += n + (end != NULL);
    }
    return count;
}

/* The CPU threads' update after backward is on the trace's "cpu update" track, once a step, and on
 * the devices' time axis: the compute and copy-in streams are drained before it starts and get no
 * work until it ends (the host thread waits for the threads), so none of their intervals may
 * reach into it by more than the clocks' alignment (a generous 0.5 ms; a step's bars last
 * milliseconds, and backward's last kernel ends and the next step's first copy starts within
 * about that of the update). */
static void test_trace_times_the_cpu_threads_updates_on_the_devices_axis(void **state) {
    (void)state;
    const char *path = "/tmp/umt_test_offload_cpu_trace.json";
    setenv("UMT_MEM_TRACE", path, 1);
    model m;
    build(&m, "200M", UMT_OFFLOAD_OPTIM_CPU);
    unsetenv("UMT_MEM_TRACE");
    float losses[STEPS];
    train(&m, losses);
    destroy(&m);
    char *text = read_file(path);
    assert_non_null(json_value(text));
    assert_non_null(strstr(text, "\"budget_bytes\": "));
    assert_non_null(strstr(text, "\"stacked_pools\": [\"weights\""));
    enum { MOST = 1 << 18 };
    traced_interval *events = calloc(MOST, sizeof *events);
    assert_non_null(events);
    int count = complete_events(text, events, MOST), cpu = 0;
    free(text);
    const double tolerance_us = 500;
    for (int i = 0; i < count; ++i) {
        const traced_interval *u = &events[i];
        if (u->track != UMT_TRACE_HOST_UPDATE) continue;
        cpu++;
        for (int j = 0; j < count; ++j) {
            const traced_interval *d = &events[j];
            bool drained = d->track == UMT_TRACE_COMPUTE || d->track == UMT_TRACE_COPY_IN;
            if (!drained || d->end <= u->begin + tolerance_us || d->begin >= u->end - tolerance_us) continue;
            traced_interval seen = *d, update = *u;
            free(events);
            fail_msg("an interval on track %d (%.1f to %.1f us) reaches into the CPU update (%.1f to %.1f us)",
                     seen.track, seen.begin, seen.end, update.begin, update.end);
        }
    }
    free(events);
    assert_int_equal(cpu, STEPS);
}

static void test_a_refused_allocation_prints_the_pools_largest_first(void **state) {
    (void)state;
    model m;
    build(&m, "200M", UMT_OFFLOAD_OPTIM_GPU);
    float losses[STEPS];
    train(&m, losses);
    const char *path = "/tmp/umt_test_offload_refusal.txt";
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    umt_tensor *big = umt_tensor_new_2d(m.ctx, UMT_POOL_WEIGHTS, UMT_F32, 1024, 1024 * 64);
    fflush(stderr);
    dup2(saved, 2);
    close(fd);
    close(saved);
    assert_null(big);
    assert_int_equal(umt_last_status(), UMT_ERR_BUDGET);
    char *text = read_file(path);
    print_message("%s", text);
    const char *head = strstr(text, "pools, largest first");
    assert_non_null(head);
    /* The offload pool holds the most (everything big), then the double buffer. */
    const char *offload = strstr(head, "offload"), *stream = strstr(head, "stream ");
    assert_non_null(offload);
    assert_non_null(stream);
    assert_true(offload < stream);
    free(text);
    destroy(&m);
}

/* 12 saved activations of 8 MiB, and the gradients the recorded first step recycles: some
 * 112 MiB beside the double buffer and the rest (168 MiB), where 272M leaves 104 MiB (at 288M
 * they fit). With them offloaded the plan keeps none on the GPU: 265 MiB. */
static void test_saved_activations_offloaded_match_in_memory_losses(void **state) {
    (void)state;
    const size_t reserve = (size_t)96 << 20;
    model m;
    build_with(&m, NULL, UMT_OFFLOAD_OPTIM_GPU, BATCH_WIDE, 0, false);
    float reference_wide[STEPS], losses[STEPS];
    train(&m, reference_wide);
    destroy(&m);

    build_with(&m, "272M", UMT_OFFLOAD_OPTIM_GPU, BATCH_WIDE, reserve, false);
    float loss;
    umt_status refused = train_step(&m, &loss);
    print_message("without offloaded activations: %s\n", refused == UMT_OK ? "trained" : umt_last_error());
    assert_int_not_equal(refused, UMT_OK);
    assert_non_null(strstr(umt_last_error(), "device budget"));
    destroy(&m);

    build_with(&m, "272M", UMT_OFFLOAD_OPTIM_GPU, BATCH_WIDE, reserve, true);
    train(&m, losses);
    umt_offload_stats st;
    assert_int_equal(umt_offload_stats_get(m.ctx, &st), UMT_OK);
    print_message("saved activations given up %llu times; %.1f MB out, %.1f MB back\n",
                  (unsigned long long)st.activations_offloaded, st.activation_bytes_to_host / 1e6,
                  st.activation_bytes_to_device / 1e6);
    /* The first step gives up all 2 DEPTH - 1 it sends but the last; every later step at least one. */
    assert_true(st.activations_offloaded >= (uint64_t)(2 * DEPTH - 1 + STEPS - 1));
    assert_true(st.activation_bytes_to_device > 0 && st.activation_bytes_to_host >= st.activation_bytes_to_device);
    size_t budget, used;
    umt_device_budget(m.ctx, &budget, &used);
    assert_true(used <= budget);
    for (int s = 0; s < STEPS; ++s) {
        double rel = fabs((double)losses[s] - reference_wide[s]) / fabs((double)reference_wide[s]);
        print_message("step %2d: in memory %.9g, activations offloaded %.9g, relative %.2e%s\n", s + 1,
                      reference_wide[s], losses[s], rel, losses[s] == reference_wide[s] ? " (bit-identical)" : "");
        assert_true(rel <= 1e-5);
    }
    assert_true(reference_wide[STEPS - 1] < reference_wide[0]);
    destroy(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_offloaded_run_matches_in_memory_losses_with_gpu_updates, destroy_leftover),
        cmocka_unit_test_teardown(test_offloaded_run_matches_in_memory_losses_with_cpu_updates, destroy_leftover),
        cmocka_unit_test_teardown(test_auto_times_both_updates_and_keeps_the_faster, destroy_leftover),
        cmocka_unit_test_teardown(test_updates_in_backward_give_way_where_the_ring_does_not_fit, destroy_leftover),
        cmocka_unit_test_teardown(test_offloaded_run_matches_in_memory_losses_with_updates_in_backward, destroy_leftover),
        cmocka_unit_test_teardown(test_updates_in_backward_on_the_cpu_beside_the_ring, destroy_leftover),
        cmocka_unit_test_teardown(test_host_memory_measure_times_the_cpu_and_the_link_alone_and_at_once,
                                  destroy_leftover),
        cmocka_unit_test_teardown(test_updates_in_backward_share_the_cpu_by_measured_rates, destroy_leftover),
        cmocka_unit_test_teardown(test_a_middle_budget_offloads_optimizer_state_only, destroy_leftover),
        cmocka_unit_test_teardown(test_resident_parameters_update_their_offloaded_state_in_backward, destroy_leftover),
        cmocka_unit_test_teardown(test_trace_is_valid_json_naming_every_pool, destroy_leftover),
        cmocka_unit_test_teardown(test_trace_times_the_cpu_threads_updates_on_the_devices_axis, destroy_leftover),
        cmocka_unit_test_teardown(test_a_refused_allocation_prints_the_pools_largest_first, destroy_leftover),
        cmocka_unit_test_teardown(test_saved_activations_offloaded_match_in_memory_losses, destroy_leftover),
    };
    return cmocka_run_group_tests(tests, make_reference, NULL);
}
