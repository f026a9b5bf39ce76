/* tests/micro_batch_run.c — see micro_batch_run.h. */
#include "tests/micro_batch_run.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/scratch.h"

#define SIDE 12

static void check(umt_status st, const char *what) {
    if (st != UMT_OK) fail_msg("%s: %s", what, umt_last_error());
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

void mb_write_data(void) {
    enum { IMAGE_HEADER = 16, LABEL_HEADER = 8, PIXELS = MB_SAMPLES * SIDE * SIDE };
    static uint8_t images[IMAGE_HEADER + PIXELS], labels[LABEL_HEADER + MB_SAMPLES];
    put_be32(images, 0x803), put_be32(images + 4, MB_SAMPLES), put_be32(images + 8, SIDE), put_be32(images + 12, SIDE);
    put_be32(labels, 0x801), put_be32(labels + 4, MB_SAMPLES);
    uint32_t x = 12345;
    for (int i = 0; i < PIXELS; ++i) images[IMAGE_HEADER + i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < MB_SAMPLES; ++i)
        labels[LABEL_HEADER + i] = (uint8_t)(((x = x * 1664525u + 1013904223u) >> 24) % 10);
    scratch_write("mb-images.idx", images, sizeof images);
    scratch_write("mb-labels.idx", labels, sizeof labels);
}

typedef struct {
    const mb_run *run;
    umt_context *ctx;
    umt_dataset *data;
    umt_layer *conv, *bn, *fc1, *fc2;
    umt_optimizer *opt;
    int64_t grad_ready_calls;
} model;

static umt_tensor *micro_loss(model *m, const int64_t *indices, int64_t count) {
    umt_context *ctx = m->ctx;
    umt_tensor *images = NULL, *labels = NULL;
    if (umt_dataset_batch(ctx, m->data, indices, count, 0.5f, 0.25f, &images, &labels)) return NULL;
    umt_tensor *h = umt_layer_forward(ctx, m->conv, images);
    if (m->bn) h = umt_layer_forward(ctx, m->bn, h);
    h = umt_max_pool2d_dropout(ctx, umt_relu(ctx, h), 2, 2, m->run->dropout);
    h = umt_layer_forward_relu(ctx, m->fc1, umt_flatten(ctx, h));
    h = umt_layer_forward(ctx, m->fc2, umt_dropout(ctx, h, m->run->dropout));
    return umt_softmax_cross_entropy(ctx, h, labels);
}

/* One step over indices[0..count): whole, or as run->micro_batches micro-batches. */
static umt_tensor *step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    model *m = user;
    const int64_t *indices = input;
    int64_t count = (int64_t)(input_bytes / sizeof *indices);
    int k = m->run->micro_batches;
    if (umt_step_begin(ctx) || umt_zero_grad(ctx)) return NULL;
    umt_tensor *loss = NULL;
    for (int i = 0; i < k; ++i) {
        int64_t first = count * i / k, samples = count * (i + 1) / k - first;
        if (k > 1 && umt_micro_batch_begin(ctx, first, samples, count)) return NULL;
        loss = micro_loss(m, indices + first, samples);
        if (!loss || umt_backward_scaled(ctx, loss, m->opt)) return NULL;
    }
    if (umt_optimizer_step(m->opt)) return NULL;
    return k > 1 ? umt_micro_batch_loss(ctx) : loss;
}

static void count_grad_ready(umt_tensor *parameter, void *user) {
    (void)parameter;
    ((model *)user)->grad_ready_calls++;
}

static void build(model *m, const mb_run *run, const char *folder) {
    umt_context_options co = umt_context_defaults();
    co.device = run->device;
    co.precision = run->precision;
    co.seed = run->seed ? run->seed : 7;
    check(umt_context_create(&co, &m->ctx), "umt_context_create");
    char images[512], labels[512];
    snprintf(images, sizeof images, "%s/mb-images.idx", folder);
    snprintf(labels, sizeof labels, "%s/mb-labels.idx", folder);
    if (run->shared)
        check(umt_dataset_share(m->ctx, run->shared, &m->data), "umt_dataset_share");
    else
        check(umt_dataset_load_idx(m->ctx, images, labels, 10, &m->data), "umt_dataset_load_idx");
    m->conv = umt_conv2d_layer_new(m->ctx, "conv", 1, 4, 3, 1, 1, true);
    m->bn = run->batch_norm ? umt_batchnorm_layer_new(m->ctx, "bn", 4) : NULL;
    m->fc1 = umt_linear_layer_new(m->ctx, "fc1", 4 * (SIDE / 2) * (SIDE / 2), 32, true);
    m->fc2 = umt_linear_layer_new(m->ctx, "fc2", 32, 10, true);
    assert_true(m->conv && m->fc1 && m->fc2 && (m->bn || !run->batch_norm));
    umt_optimizer_options oo = umt_optimizer_defaults(run->optimizer);
    oo.lr = run->optimizer == UMT_OPT_SGD ? 0.05f : 0.002f;
    if (run->optimizer == UMT_OPT_SGD) oo.momentum = 0.9f;
    if (run->lr > 0) oo.lr = run->lr;
    oo.loss_scaling = run->precision == UMT_PRECISION_FP16;
    check(umt_optimizer_create(m->ctx, &oo, &m->opt), "umt_optimizer_create");
    /* A host hook is not replayed: a step graph would run every step eagerly beside it. */
    if (!run->graph) umt_set_grad_ready_hook(m->ctx, count_grad_ready, m);
}

static void collect(const model *m, mb_result *out) {
    int n = umt_parameter_count(m->ctx);
    out->count = 0;
    for (int i = 0; i < n; ++i) out->count += umt_tensor_numel(umt_parameter_at(m->ctx, i));
    out->params = malloc((size_t)out->count * sizeof *out->params);
    assert_non_null(out->params);
    int64_t at = 0;
    for (int i = 0; i < n; ++i) {
        umt_tensor *p = umt_parameter_at(m->ctx, i);
        int64_t numel = umt_tensor_numel(p);
        check(umt_tensor_copy_to_host(p, out->params + at, (size_t)numel * sizeof(float)), "umt_tensor_copy_to_host");
        at += numel;
    }
    out->grad_ready_calls = m->grad_ready_calls;
}

/* Step s takes every sample, in an order of its own. */
static void step_order(int s, int64_t order[MB_SAMPLES]) {
    for (int i = 0; i < MB_SAMPLES; ++i) order[i] = (i * (5 + 2 * s) + 3 * s) % MB_SAMPLES;
}

void mb_train(const mb_run *run, const char *folder, mb_result *out) {
    model m = {.run = run};
    build(&m, run, folder);
    umt_step_graph *graph = NULL;
    check(umt_step_graph_create(m.ctx, run->graph, &graph), "umt_step_graph_create");
    int64_t order[MB_SAMPLES];
    for (int s = 0; s < MB_STEPS; ++s) {
        step_order(s, order);
        check(umt_step_graph_run(graph, step, &m, order, sizeof order), "umt_step_graph_run");
        double mean = 0;
        int64_t steps = 0;
        check(umt_step_graph_take_mean_loss(graph, &mean, &steps), "umt_step_graph_take_mean_loss");
        assert_int_equal(steps, 1);
        out->losses[s] = mean;
    }
    collect(&m, out);
    out->replayed_steps = umt_step_graph_stats_get(graph).replayed_steps;
    umt_pool_stats dataset;
    check(umt_pool_stats_get(m.ctx, UMT_POOL_DATASET, &dataset), "umt_pool_stats_get");
    out->dataset_bytes = dataset.in_use_bytes;
    umt_step_graph_destroy(graph);
    umt_context_destroy(m.ctx);
}

typedef struct {
    const mb_run *run;
    const char *folder;
    mb_result *out;
    pthread_barrier_t *start;
} thread_run;

static void *train_on_thread(void *arg) {
    thread_run *t = arg;
    /* Every run builds and trains at the same time, so that their calls overlap as much as they can. */
    pthread_barrier_wait(t->start);
    mb_train(t->run, t->folder, t->out);
    return NULL;
}

void mb_train_at_once(const mb_run *runs, int count, const char *folder, mb_result *out) {
    enum { MOST = 16 };
    assert_true(count >= 1 && count <= MOST);
    pthread_t threads[MOST];
    thread_run args[MOST];
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, (unsigned)count), 0);
    for (int i = 0; i < count; ++i) {
        args[i] = (thread_run){&runs[i], folder, &out[i], &start};
        assert_int_equal(pthread_create(&threads[i], NULL, train_on_thread, &args[i]), 0);
    }
    for (int i = 0; i < count; ++i) assert_int_equal(pthread_join(threads[i], NULL), 0);
    pthread_barrier_destroy(&start);
}

void mb_expect_same_bits(const mb_result *a, const mb_result *b, const char *what) {
    assert_int_equal(a->count, b->count);
    for (int s = 0; s < MB_STEPS; ++s)
        if (memcmp(&a->losses[s], &b->losses[s], sizeof a->losses[s]) != 0)
            fail_msg("%s: the loss of step %d is %.17g, expected %.17g bit for bit", what, s + 1, b->losses[s],
                     a->losses[s]);
    for (int64_t i = 0; i < a->count; ++i)
        if (memcmp(&a->params[i], &b->params[i], sizeof a->params[i]) != 0)
            fail_msg("%s: parameter element %lld is %.9g, expected %.9g bit for bit", what, (long long)i,
                     (double)b->params[i], (double)a->params[i]);
}

/* The largest |a - b| over n values, relative to the largest |a|. */
static double relative_gap(const float *a, const float *b, int64_t n) {
    double gap = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
        gap = fmax(gap, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)a[i]));
    }
    return scale > 0 ? gap / scale : gap;
}

static double worst_gap(const mb_result *a, const mb_result *b, const char **where) {
    double worst = relative_gap(a->params, b->params, a->count);
    *where = "parameters";
    for (int s = 0; s < MB_STEPS; ++s) {
        double gap = fabs(a->losses[s] - b->losses[s]) / fmax(fabs(a->losses[s]), 1e-30);
        if (gap > worst) worst = gap, *where = "a loss";
    }
    return worst;
}

void mb_expect_close(const mb_result *a, const mb_result *b, double rel, const char *what) {
    assert_int_equal(a->count, b->count);
    const char *where;
    double gap = worst_gap(a, b, &where);
    if (!(gap <= rel))
        fail_msg("%s: %s differ by %.3g relative (expected at most %.3g); losses %.9g .. %.9g against %.9g .. %.9g",
                 what, where, gap, rel, a->losses[0], a->losses[MB_STEPS - 1], b->losses[0], b->losses[MB_STEPS - 1]);
}

bool mb_differ(const mb_result *a, const mb_result *b, double rel) {
    const char *where;
    return worst_gap(a, b, &where) > rel;
}

/* ----------------------------------------------------------------------------------------- */
/* Several runs' steps in one group graph (umt_step_group), from this thread */

void mb_train_grouped(const mb_run *runs, int count, const char *folder, mb_result *out,
                      umt_step_graph_stats *group_stats) {
    enum { MOST = 16 };
    assert_true(count >= 1 && count <= MOST);
    model models[MOST];
    umt_step_graph *graphs[MOST];
    void *users[MOST];
    const void *inputs[MOST];
    size_t bytes[MOST];
    int64_t order[MB_SAMPLES];
    for (int i = 0; i < count; ++i) {
        models[i] = (model){.run = &runs[i]};
        build(&models[i], &runs[i], folder);
        check(umt_step_graph_create(models[i].ctx, runs[i].graph, &graphs[i]), "umt_step_graph_create");
        users[i] = &models[i];
        inputs[i] = order;
        bytes[i] = sizeof order;
    }
    umt_step_group *group = NULL;
    check(umt_step_group_create(graphs, count, &group), "umt_step_group_create");
    for (int s = 0; s < MB_STEPS; ++s) {
        step_order(s, order);
        check(umt_step_group_run(group, step, users, inputs, bytes), "umt_step_group_run");
        for (int i = 0; i < count; ++i) {
            double mean = 0;
            int64_t steps = 0;
            check(umt_step_graph_take_mean_loss(graphs[i], &mean, &steps), "umt_step_graph_take_mean_loss");
            assert_int_equal(steps, 1);
            out[i].losses[s] = mean;
        }
    }
    *group_stats = umt_step_group_stats_get(group);
    umt_step_group_destroy(group);
    for (int i = 0; i < count; ++i) {
        collect(&models[i], &out[i]);
        out[i].replayed_steps = umt_step_graph_stats_get(graphs[i]).replayed_steps;
        umt_step_graph_destroy(graphs[i]);
        umt_context_destroy(models[i].ctx);
    }
}
