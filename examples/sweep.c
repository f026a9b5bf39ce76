/*
 * examples/sweep.c — N trainings of the MNIST CNN at once in one process: a hyperparameter sweep.
 *
 * A small model uses a sliver of a large GPU. Here each configuration (a seed, a learning rate,
 * an optimizer, a width of fc1) is a context of its own, trained on a host thread of its own and,
 * on a GPU, on a CUDA stream of its own (include/umtrain.h says which calls are thread-safe), with
 * the step graph of mnist_cnn. The MNIST images are on the device once: a data context loads them,
 * and every configuration's context reads them through a share (umt_dataset_share). At the end one
 * table: each configuration's test accuracy, time and images/s, and the total.
 *
 *   bazel build //examples:sweep
 *   bazel-bin/examples/sweep --sweep-seeds 1,2,3,4 --sweep-lr 1.0,0.5 --epochs 5
 *   bazel-bin/examples/sweep --sweep 8 --bench 2000        # 8 at once against 1 alone, images/s
 *
 * Lists are zipped: configuration i takes the i-th value of each list, and a list of one value
 * gives it to all (the sweep has as many configurations as the longest list, or --sweep N).
 * Each configuration trains as it would alone: its own RNG, its own shuffles and dropout, the
 * same bits (the CPU always; a GPU with UMT_CONV_TIMING=0, which keeps cuDNN's engine choice from
 * depending on timings taken beside the others). Recipe: PyTorch's MNIST example (Adadelta lr
 * 1.0 by default, lr x gamma each epoch, batch 64).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/example_common.h"
#include "examples/mnist_cnn_model.h"
#include "umtrain.h"

static const char *const program = "sweep";

enum { MOST_RUNS = 64, WARMUP_STEPS = 20 };

/* ----------------------------------------------------------------------------------------- */
/* Options */

typedef struct {
    uint64_t seed;
    float lr; /* 0: the optimizer's recipe rate (Adadelta 1.0, else PyTorch's default) */
    umt_optimizer_kind optimizer;
    int64_t width; /* fc1's units */
} config;

typedef struct {
    umt_device device;
    umt_precision precision;
    bool precision_given, graph, one_graph;
    const char *data_dir;
    int epochs, bench_steps;
    int64_t batch_size, train_limit, test_limit;
    float gamma;
    int runs; /* --sweep N, or the longest list */
    config configs[MOST_RUNS];
} options;

static void usage(FILE *out) {
    fprintf(out, "usage: sweep [--sweep N] [--sweep-seeds S,..] [--sweep-lr F,..] [--sweep-optimizer NAME,..]\n"
                 "             [--sweep-width N,..] [--epochs N] [--batch-size N] [--gamma F] [--device cpu|cuda]\n"
                 "             [--precision fp32|bf16|fp16] [--graph on|off] [--data-dir DIR] [--train-limit N]\n"
                 "             [--test-limit N] [--bench STEPS] [--one-graph on|off]\n"
                 "defaults: one configuration (seed 1, adadelta, its rate 1.0, width 128), 1 epoch, batch 64,\n"
                 "          gamma 0.7, the GPU when there is one, data/mnist. Lists are zipped (a list of one\n"
                 "          value goes to every configuration); --sweep N without seeds takes seeds 1..N.\n"
                 "          --bench STEPS: STEPS steps of one configuration alone, then of all at once; prints\n"
                 "          the total images/s of each and their ratio, instead of training epochs.\n"
                 "          --one-graph on: every configuration's step in one CUDA graph (umt_step_group),\n"
                 "          driven from one thread, instead of a graph and a thread each.\n");
}

/* The comma-separated values of a --sweep-* list, each parsed by one; their count, or -1. */
static int parse_list(const char *flag, const char *text, int (*one)(const char *flag, const char *value, config *c),
                      config *configs) {
    char copy[1024];
    if (snprintf(copy, sizeof copy, "%s", text) >= (int)sizeof copy) {
        fprintf(stderr, "%s: %s: the list is longer than %zu characters\n", program, flag, sizeof copy - 1);
        return -1;
    }
    int count = 0;
    for (char *save = NULL, *value = strtok_r(copy, ",", &save); value; value = strtok_r(NULL, ",", &save)) {
        if (count == MOST_RUNS) {
            fprintf(stderr, "%s: %s: more than %d values\n", program, flag, MOST_RUNS);
            return -1;
        }
        if (one(flag, value, &configs[count++])) return -1;
    }
    return count;
}

static int seed_of(const char *flag, const char *value, config *c) {
    double v;
    if (example_whole_number(program, flag, value, 1, 1e15, &v)) return -1;
    c->seed = (uint64_t)v;
    return 0;
}

static int lr_of(const char *flag, const char *value, config *c) {
    double v;
    if (example_number(program, flag, value, 1e-9, 1e3, &v)) return -1;
    c->lr = (float)v;
    return 0;
}

static int optimizer_of(const char *flag, const char *value, config *c) {
    if (umt_optimizer_kind_parse(value, &c->optimizer) == UMT_OK) return 0;
    fprintf(stderr, "%s: %s '%s': expected sgd, adam, adamw or adadelta\n", program, flag, value);
    return -1;
}

static int width_of(const char *flag, const char *value, config *c) {
    double v;
    if (example_whole_number(program, flag, value, 1, 1 << 16, &v)) return -1;
    c->width = (int64_t)v;
    return 0;
}

/* One --sweep-* list into lists[which] (its count in counts[which]); 1 when flag is not one. */
static int parse_sweep_list(const char *flag, const char *value, config lists[4][MOST_RUNS], int counts[4]) {
    static const char *const flags[4] = {"--sweep-seeds", "--sweep-lr", "--sweep-optimizer", "--sweep-width"};
    static int (*const parsers[4])(const char *, const char *, config *) = {seed_of, lr_of, optimizer_of, width_of};
    for (int i = 0; i < 4; ++i)
        if (!strcmp(flag, flags[i])) return (counts[i] = parse_list(flag, value, parsers[i], lists[i])) < 0 ? -1 : 0;
    return 1;
}

static int parse_flag(options *o, const char *flag, const char *value) {
    double v;
    int bad = 0;
    if (!strcmp(flag, "--sweep"))
        bad = example_whole_number(program, flag, value, 1, MOST_RUNS, &v), o->runs = (int)v;
    else if (!strcmp(flag, "--epochs"))
        bad = example_whole_number(program, flag, value, 0, 1e6, &v), o->epochs = (int)v;
    else if (!strcmp(flag, "--batch-size"))
        bad = example_whole_number(program, flag, value, 1, 1 << 20, &v), o->batch_size = (int64_t)v;
    else if (!strcmp(flag, "--gamma")) bad = example_number(program, flag, value, 1e-6, 1, &v), o->gamma = (float)v;
    else if (!strcmp(flag, "--train-limit"))
        bad = example_whole_number(program, flag, value, 0, 1e12, &v), o->train_limit = (int64_t)v;
    else if (!strcmp(flag, "--test-limit"))
        bad = example_whole_number(program, flag, value, 0, 1e12, &v), o->test_limit = (int64_t)v;
    else if (!strcmp(flag, "--bench"))
        bad = example_whole_number(program, flag, value, 1, 1e9, &v), o->bench_steps = (int)v;
    else if (!strcmp(flag, "--data-dir")) o->data_dir = value;
    else if (!strcmp(flag, "--device")) bad = example_check(program, umt_device_parse(value, &o->device));
    else if (!strcmp(flag, "--precision"))
        bad = example_check(program, umt_precision_parse(value, &o->precision)), o->precision_given = true;
    else if (!strcmp(flag, "--graph") && (!strcmp(value, "on") || !strcmp(value, "off")))
        o->graph = !strcmp(value, "on");
    else if (!strcmp(flag, "--graph"))
        fprintf(stderr, "%s: --graph '%s': expected on or off\n", program, value), bad = 1;
    else if (!strcmp(flag, "--one-graph") && (!strcmp(value, "on") || !strcmp(value, "off")))
        o->one_graph = !strcmp(value, "on");
    else if (!strcmp(flag, "--one-graph"))
        fprintf(stderr, "%s: --one-graph '%s': expected on or off\n", program, value), bad = 1;
    else return 1;
    return bad ? -1 : 0;
}

/* Configuration i: the i-th value of each list, or its only one, or the default. */
static int zip_lists(options *o, config lists[4][MOST_RUNS], const int counts[4]) {
    int runs = o->runs;
    for (int l = 0; l < 4; ++l) runs = counts[l] > runs ? counts[l] : runs;
    for (int l = 0; l < 4; ++l)
        if (counts[l] > 1 && counts[l] != runs) {
            fprintf(stderr, "%s: a list of %d values in a sweep of %d configurations (expected 1 or %d)\n", program,
                    counts[l], runs, runs);
            return -1;
        }
    o->runs = runs;
    for (int i = 0; i < runs; ++i) {
        config c = {.seed = (uint64_t)i + 1, .optimizer = UMT_OPT_ADADELTA, .width = 128};
        if (counts[0]) c.seed = lists[0][counts[0] > 1 ? i : 0].seed;
        if (counts[1]) c.lr = lists[1][counts[1] > 1 ? i : 0].lr;
        if (counts[2]) c.optimizer = lists[2][counts[2] > 1 ? i : 0].optimizer;
        if (counts[3]) c.width = lists[3][counts[3] > 1 ? i : 0].width;
        o->configs[i] = c;
    }
    return 0;
}

static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.device = umt_default_device(), .graph = true, .data_dir = "data/mnist", .epochs = 1,
                   .batch_size = 64, .gamma = 0.7f, .runs = 1};
    static config lists[4][MOST_RUNS];
    int counts[4] = {0};
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--help")) return usage(stdout), 1;
        if (i + 1 >= argc) return example_missing_value(program, argv[i], usage);
        int rc = parse_sweep_list(argv[i], argv[i + 1], lists, counts);
        if (rc == 1) rc = parse_flag(o, argv[i], argv[i + 1]);
        if (rc == 1) fprintf(stderr, "%s: unknown flag %s\n", program, argv[i]), usage(stderr);
        if (rc) return -1;
    }
    if (!o->precision_given) o->precision = umt_precision_default(o->device, 0);
    return zip_lists(o, lists, counts);
}

/* ----------------------------------------------------------------------------------------- */
/* One configuration's training, on its own thread */

typedef struct {
    const options *o;
    const config *c;
    const umt_dataset *train, *test; /* the data context's: read through shares */
    pthread_barrier_t *bench_start, *bench_stop; /* --bench: every thread's timed steps between them */
    bool in_bench;                               /* --bench: this run takes part in the timed window */
    bool passed_start;                           /* --bench: this run is past the first barrier */
    /* run state */
    umt_context *ctx;
    umt_dataset *train_share, *test_share;
    mnist_cnn model;
    umt_optimizer *opt;
    umt_step_graph *graph;
    int64_t *order;
    float lr; /* the rate of the first epoch */
    /* results */
    int rc;
    double accuracy, seconds;
    int64_t images;
    uint64_t parameter_hash;
} run;

static umt_tensor *step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    run *r = user;
    umt_tensor *images = NULL, *labels = NULL;
    int64_t count = (int64_t)(input_bytes / sizeof(int64_t));
    if (umt_step_begin(ctx) || umt_zero_grad(ctx) ||
        umt_dataset_batch_as(ctx, r->train_share, input, count, MNIST_MEAN, MNIST_STD, umt_context_compute_dtype(ctx),
                             &images, &labels))
        return NULL;
    umt_tensor *loss = mnist_cnn_loss(ctx, &r->model, images, labels);
    if (!loss || umt_backward_scaled(ctx, loss, r->opt) || umt_optimizer_step(r->opt)) return NULL;
    return loss;
}

/* 0 for UMT_OK; otherwise the message, naming the configuration, and -1. */
static int check(const run *r, umt_status status) {
    if (status == UMT_OK) return 0;
    fprintf(stderr, "%s: configuration seed %llu: %s\n", program, (unsigned long long)r->c->seed, umt_last_error());
    return -1;
}

static int no_memory(const run *r, const char *what) {
    fprintf(stderr, "%s: configuration seed %llu: no memory for %s\n", program, (unsigned long long)r->c->seed, what);
    return -1;
}

/* The context, the shares of the data, the model, its optimizer and the step graph. */
static int build(run *r) {
    umt_context_options co = umt_context_defaults();
    co.device = r->o->device;
    co.precision = r->o->precision;
    co.seed = r->c->seed;
    if (check(r, umt_context_create(&co, &r->ctx)) || check(r, umt_dataset_share(r->ctx, r->train, &r->train_share)) ||
        check(r, umt_dataset_share(r->ctx, r->test, &r->test_share)))
        return -1;
    if (mnist_cnn_build_width(r->ctx, &r->model, r->c->width)) return check(r, umt_last_status());
    umt_optimizer_options oo = umt_optimizer_defaults(r->c->optimizer);
    /* The MNIST recipe's Adadelta rate is 1.0; other optimizers keep PyTorch's default. */
    oo.lr = r->lr = r->c->lr > 0 ? r->c->lr : r->c->optimizer == UMT_OPT_ADADELTA ? 1.0f : oo.lr;
    oo.loss_scaling = r->o->precision == UMT_PRECISION_FP16;
    oo.zero_grads_in_step = true; /* as mnist_cnn: nothing reads the gradients after a step */
    if (check(r, umt_optimizer_create(r->ctx, &oo, &r->opt)) ||
        check(r, umt_step_graph_create(r->ctx, r->o->graph && r->o->device == UMT_DEVICE_CUDA, &r->graph)))
        return -1;
    r->order = malloc((size_t)umt_dataset_size(r->train) * sizeof *r->order);
    return r->order ? 0 : no_memory(r, "an epoch's order");
}

static int run_step(run *r, const int64_t *indices, int64_t count) {
    return check(r, umt_step_graph_run(r->graph, step, r, indices, (size_t)count * sizeof *indices));
}

/* One epoch: the rate of the epoch, a shuffle from the context's RNG, then its steps (the last
 * one shorter). */
static int train_epoch(run *r, int epoch) {
    int64_t n = example_limit(umt_dataset_size(r->train), r->o->train_limit), batch = r->o->batch_size;
    umt_optimizer_set_lr(r->opt, umt_lr_step(r->lr, r->o->gamma, 1, epoch));
    if (check(r, umt_permutation(r->ctx, n, r->order))) return -1;
    for (int64_t first = 0; first < n; first += batch) {
        int64_t count = n - first < batch ? n - first : batch;
        if (run_step(r, r->order + first, count)) return -1;
        r->images += count;
    }
    return check(r, umt_synchronize(r->ctx));
}

/* FNV-1a over every parameter's bytes: two runs with the same hash have the same parameters. */
static int hash_parameters(run *r) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < umt_parameter_count(r->ctx); ++i) {
        umt_tensor *p = umt_parameter_at(r->ctx, i);
        size_t bytes = (size_t)umt_tensor_numel(p) * sizeof(float);
        unsigned char *host = malloc(bytes);
        if (!host) return no_memory(r, "a parameter's copy");
        int rc = check(r, umt_tensor_copy_to_host(p, host, bytes));
        for (size_t b = 0; rc == 0 && b < bytes; ++b) h = (h ^ host[b]) * 1099511628211ull;
        free(host);
        if (rc) return -1;
    }
    r->parameter_hash = h;
    return 0;
}

static int train(run *r) {
    double start = example_seconds();
    for (int epoch = 0; epoch < r->o->epochs; ++epoch)
        if (train_epoch(r, epoch)) return -1;
    r->seconds = example_seconds() - start;
    if (example_evaluate(program, r->ctx, mnist_cnn_forward, &r->model, r->test_share, 1000, r->o->test_limit,
                         &r->accuracy))
        return -1;
    return hash_parameters(r);
}

/* --bench: warm-up steps, then the timed ones between two barriers that every thread of the
 * window (and main) passes, so that main's clock sees them all run together. */
static int bench(run *r) {
    int64_t n = umt_dataset_size(r->train), batch = r->o->batch_size < n ? r->o->batch_size : n;
    if (check(r, umt_permutation(r->ctx, n, r->order))) return -1;
    for (int i = 0; i < WARMUP_STEPS + r->o->bench_steps; ++i) {
        if (i == WARMUP_STEPS) {
            if (check(r, umt_synchronize(r->ctx))) return -1;
            r->passed_start = true;
            pthread_barrier_wait(r->bench_start);
        }
        if (run_step(r, r->order + (int64_t)i * batch % (n - batch + 1), batch)) return -1;
    }
    if (check(r, umt_synchronize(r->ctx))) return -1;
    pthread_barrier_wait(r->bench_stop);
    r->images = batch * r->o->bench_steps;
    return 0;
}

static void *run_main(void *arg) {
    run *r = arg;
    r->rc = build(r);
    if (r->rc == 0) r->rc = r->in_bench ? bench(r) : train(r);
    /* A bench thread that failed would leave the others at a barrier: it passes what is left. */
    if (r->rc && r->in_bench) {
        if (!r->passed_start) pthread_barrier_wait(r->bench_start);
        pthread_barrier_wait(r->bench_stop);
    }
    return NULL;
}

static void release(run *r) {
    free(r->order);
    umt_context_destroy(r->ctx); /* its shares, model, optimizer and graph with it */
}

/* ----------------------------------------------------------------------------------------- */
/* --one-graph on: every configuration's step in one CUDA graph, all driven from this thread */

/* Every configuration's context, model and step graph, and the group of their graphs. */
static int build_together(run *runs, int count, umt_step_group **group) {
    umt_step_graph *graphs[MOST_RUNS];
    for (int i = 0; i < count; ++i) {
        if (build(&runs[i])) return -1;
        graphs[i] = runs[i].graph;
    }
    return example_check(program, umt_step_group_create(graphs, count, group));
}

/* One step of every configuration: count images of its own order from first. */
static int step_together(umt_step_group *group, run *runs, int n, int64_t first, int64_t count) {
    void *users[MOST_RUNS];
    const void *inputs[MOST_RUNS];
    size_t bytes[MOST_RUNS];
    for (int i = 0; i < n; ++i) {
        users[i] = &runs[i];
        inputs[i] = runs[i].order + first;
        bytes[i] = (size_t)count * sizeof *runs[i].order;
    }
    return example_check(program, umt_step_group_run(group, step, users, inputs, bytes));
}

static int synchronize_all(run *runs, int n) {
    for (int i = 0; i < n; ++i)
        if (check(&runs[i], umt_synchronize(runs[i].ctx))) return -1;
    return 0;
}

/* The epochs of every configuration in step: the same epoch, each with its own rate and shuffle. */
static int train_epochs_together(const options *o, run *runs, int n, umt_step_group *group) {
    int64_t size = example_limit(umt_dataset_size(runs[0].train), o->train_limit), batch = o->batch_size;
    for (int epoch = 0; epoch < o->epochs; ++epoch) {
        for (int i = 0; i < n; ++i) {
            umt_optimizer_set_lr(runs[i].opt, umt_lr_step(runs[i].lr, o->gamma, 1, epoch));
            if (check(&runs[i], umt_permutation(runs[i].ctx, size, runs[i].order))) return -1;
        }
        for (int64_t first = 0; first < size; first += batch) {
            int64_t count = size - first < batch ? size - first : batch;
            if (step_together(group, runs, n, first, count)) return -1;
            for (int i = 0; i < n; ++i) runs[i].images += count;
        }
        if (synchronize_all(runs, n)) return -1;
    }
    return 0;
}

static int train_together(const options *o, run *runs, int n) {
    umt_step_group *group = NULL;
    double start = example_seconds();
    int rc = build_together(runs, n, &group);
    if (rc == 0) rc = train_epochs_together(o, runs, n, group);
    double seconds = example_seconds() - start;
    umt_step_group_destroy(group);
    for (int i = 0; i < n && rc == 0; ++i) {
        run *r = &runs[i];
        r->seconds = seconds; /* they trained together */
        rc = example_evaluate(program, r->ctx, mnist_cnn_forward, &r->model, r->test_share, 1000, o->test_limit,
                              &r->accuracy) || hash_parameters(r) ? -1 : 0;
    }
    return rc;
}

/* --bench with --one-graph on: the configurations' steps together, images/s in total. */
static int bench_together(const options *o, run *runs, int n, double *images_per_s) {
    umt_step_group *group = NULL;
    int rc = build_together(runs, n, &group);
    int64_t size = umt_dataset_size(runs[0].train), batch = o->batch_size < size ? o->batch_size : size;
    for (int i = 0; i < n && rc == 0; ++i) rc = check(&runs[i], umt_permutation(runs[i].ctx, size, runs[i].order));
    double t0 = 0;
    for (int s = 0; s < WARMUP_STEPS + o->bench_steps && rc == 0; ++s) {
        if (s == WARMUP_STEPS && !(rc = synchronize_all(runs, n))) t0 = example_seconds();
        if (rc == 0) rc = step_together(group, runs, n, (int64_t)s * batch % (size - batch + 1), batch);
    }
    if (rc == 0 && !(rc = synchronize_all(runs, n)))
        *images_per_s = (double)n * (double)batch * o->bench_steps / (example_seconds() - t0);
    if (rc == 0) {
        umt_step_graph_stats stats = umt_step_group_stats_get(group);
        printf("bench: one graph for %d: %lld captures, %lld replays, %lld eager steps%s%s\n", n,
               (long long)stats.captures, (long long)stats.replayed_steps, (long long)stats.eager_steps,
               umt_step_group_off_reason(group) ? ": off, " : "",
               umt_step_group_off_reason(group) ? umt_step_group_off_reason(group) : "");
    }
    umt_step_group_destroy(group);
    return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* The sweep */

/* Runs runs[0..count) at once, each on its own thread; 0 when all succeeded. */
static int run_all(run *runs, int count) {
    pthread_t threads[MOST_RUNS];
    int started = 0, rc = 0;
    for (; started < count; ++started)
        if (pthread_create(&threads[started], NULL, run_main, &runs[started]) != 0) break;
    if (started < count) fprintf(stderr, "%s: could not start thread %d of %d\n", program, started + 1, count);
    for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
    for (int i = 0; i < started; ++i) rc |= runs[i].rc;
    return started < count ? -1 : rc;
}

static const char *config_text(const config *c, char *buffer, size_t size) {
    char lr[32] = "default";
    if (c->lr > 0) snprintf(lr, sizeof lr, "%g", (double)c->lr);
    static const char *const names[] = {"sgd", "adam", "adamw", "adadelta"};
    snprintf(buffer, size, "seed %llu lr %s %s width %lld", (unsigned long long)c->seed, lr, names[c->optimizer],
             (long long)c->width);
    return buffer;
}

static void print_table(const options *o, const run *runs, double wall_s) {
    printf("\n%-44s %9s %9s %10s  %s\n", "configuration", "accuracy", "time s", "images/s", "parameters (FNV-1a)");
    int64_t images = 0;
    for (int i = 0; i < o->runs; ++i) {
        char text[128];
        const run *r = &runs[i];
        images += r->images;
        printf("%-44s %8.2f%% %9.2f %10.0f  %016llx\n", config_text(r->c, text, sizeof text), r->accuracy,
               r->seconds, (double)r->images / r->seconds, (unsigned long long)r->parameter_hash);
    }
    printf("%d %s at once: %.2f s, %.0f images/s in total\n", o->runs, o->runs == 1 ? "training" : "trainings", wall_s,
           (double)images / wall_s);
}

/* N configurations for bench: configurations 0..count) of runs, in one window; images/s total. */
static int bench_window(const options *o, run *runs, int count, double *images_per_s) {
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)count + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)count + 1);
    pthread_t threads[MOST_RUNS];
    int started = 0;
    for (; started < count; ++started) {
        runs[started].bench_start = &start, runs[started].bench_stop = &stop, runs[started].in_bench = true;
        if (pthread_create(&threads[started], NULL, run_main, &runs[started]) != 0) break;
    }
    int rc = started < count ? -1 : 0;
    if (rc == 0) {
        pthread_barrier_wait(&start);
        double t0 = example_seconds();
        pthread_barrier_wait(&stop);
        *images_per_s = (double)count * (double)o->batch_size * o->bench_steps / (example_seconds() - t0);
    }
    for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
    for (int i = 0; i < started; ++i) rc |= runs[i].rc;
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&stop);
    return rc;
}

static int bench_all(const options *o, run *alone, run *runs) {
    double one = 0, all = 0;
    if (bench_window(o, alone, 1, &one)) return -1;
    if (o->one_graph ? bench_together(o, runs, o->runs, &all) : bench_window(o, runs, o->runs, &all)) return -1;
    printf("bench: batch %lld, %s, %d steps each: 1 alone %.0f images/s; %d at once %.0f images/s in total (%.2fx)\n",
           (long long)o->batch_size, umt_precision_name(o->precision), o->bench_steps, one, o->runs, all, all / one);
    return 0;
}

/* The data context: MNIST's two splits, loaded once for every configuration. */
static int load_data(const options *o, umt_context **data, umt_dataset **train, umt_dataset **test) {
    umt_context_options co = umt_context_defaults();
    co.device = o->device;
    return example_check(program, umt_context_create(&co, data)) ||
                   example_load_mnist(program, *data, o->data_dir, "train", train) ||
                   example_load_mnist(program, *data, o->data_dir, "t10k", test)
               ? -1
               : 0;
}

int main(int argc, char **argv) {
    static options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc < 0 ? 2 : 0;
    umt_context *data = NULL;
    umt_dataset *train = NULL, *test = NULL;
    static run runs[MOST_RUNS + 1];
    if (load_data(&o, &data, &train, &test)) {
        umt_context_destroy(data);
        return 1;
    }
    printf("sweep: %d configuration(s) at once on %s, %s, batch %lld, %d epoch(s)\n", o.runs,
           o.device == UMT_DEVICE_CUDA ? "cuda" : "cpu",
           umt_precision_name(o.precision), (long long)o.batch_size, o.epochs);
    for (int i = 0; i <= o.runs; ++i) runs[i] = (run){.o = &o, .c = &o.configs[i < o.runs ? i : 0], .train = train,
                                                      .test = test};
    double start = example_seconds();
    rc = o.bench_steps ? bench_all(&o, &runs[o.runs], runs)
         : o.one_graph ? train_together(&o, runs, o.runs)
                       : run_all(runs, o.runs);
    if (!rc && !o.bench_steps) print_table(&o, runs, example_seconds() - start);
    for (int i = 0; i <= o.runs; ++i) release(&runs[i]);
    umt_context_destroy(data);
    return rc ? 1 : 0;
}
