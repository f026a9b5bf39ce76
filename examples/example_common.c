/* examples/example_common.c — the pieces the example programs share (see the header). */
#include "examples/example_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Whether the usage text names flag as a whole word ("--mem", not the start of "--mem-report"). */
static bool usage_lists(void (*usage)(FILE *out), const char *flag) {
    char *text = NULL;
    size_t size = 0, n = strlen(flag);
    FILE *f = open_memstream(&text, &size);
    if (!f) return true; /* no memory to look: the likelier answer */
    usage(f);
    fclose(f);
    bool listed = false;
    for (const char *p = text; !listed && (p = strstr(p, flag)) != NULL; p += n) {
        bool starts = p == text || p[-1] == '[' || p[-1] == ' ';
        listed = starts && (p[n] == ' ' || p[n] == ']' || p[n] == '\n' || p[n] == '\0');
    }
    free(text);
    return listed;
}

int example_missing_value(const char *program, const char *flag, void (*usage)(FILE *out)) {
    if (usage_lists(usage, flag)) {
        fprintf(stderr, "%s: %s needs a value\n", program, flag);
    } else {
        fprintf(stderr, "%s: unknown flag %s\n", program, flag);
        usage(stderr);
    }
    return -1;
}

int example_number(const char *program, const char *flag, const char *text, double low, double high, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    /* Written so that NaN, which compares false with everything, is out of every range. */
    if (errno || end == text || *end || !(v >= low && v <= high)) {
        /* %.15g: whole bounds as whole numbers ([1, 1048576], not [1, 1.04858e+06]). */
        fprintf(stderr, "%s: %s '%s': expected a number in [%.15g, %.15g]\n", program, flag, text, low, high);
        return -1;
    }
    *out = v;
    return 0;
}

int example_whole_number(const char *program, const char *flag, const char *text, double low, double high,
                         double *out) {
    double v = 0;
    if (example_number(program, flag, text, low, high, &v)) return -1;
    if (v != floor(v)) {
        fprintf(stderr, "%s: %s '%s': expected a whole number in [%.15g, %.15g]\n", program, flag, text, low, high);
        return -1;
    }
    *out = v;
    return 0;
}

int example_check(const char *program, umt_status status) {
    if (status == UMT_OK) return 0;
    fprintf(stderr, "%s: %s\n", program, umt_last_error());
    return -1;
}

int example_optimizer(const char *program, const char *name, float lr, umt_optimizer_kind *kind, float *chosen_lr) {
    if (example_check(program, umt_optimizer_kind_parse(name, kind))) return -1;
    *chosen_lr = lr > 0 ? lr : umt_optimizer_defaults(*kind).lr;
    return 0;
}

/* "the loss is nan", "the gradient of fc1.weight is not finite (the loss was 2.31)", or both. */
static void nonfinite_text(const umt_nonfinite_report *report, char *text, size_t size) {
    char loss[32];
    /* "nan" whatever its sign bit (printf may say "-nan"); "inf", "-inf" or the finite value. */
    if (isnan(report->loss_value)) snprintf(loss, sizeof loss, "nan");
    else snprintf(loss, sizeof loss, "%g", (double)report->loss_value);
    const char *parameter = report->parameter ? report->parameter : "a parameter";
    if (report->loss && report->parameter)
        snprintf(text, size, "the loss is %s and the gradient of %s is not finite", loss, parameter);
    else if (report->loss)
        snprintf(text, size, "the loss is %s", loss);
    else
        snprintf(text, size, "the gradient of %s is not finite (the loss was %s)", parameter, loss);
}

int example_nonfinite_check(const char *program, const umt_optimizer *opt, example_nonfinite *check, bool wait,
                            int64_t epoch, int64_t epoch_base, int64_t steps) {
    if (check->policy == UMT_NONFINITE_OFF || check->told) return 0;
    if (!wait && !umt_optimizer_nonfinite_found(opt)) return 0;
    umt_nonfinite_report report;
    if (example_check(program, umt_optimizer_nonfinite_get(opt, &report))) return -1;
    if (!report.first_step) return 0;
    check->told = true;
    char what[320];
    nonfinite_text(&report, what, sizeof what);
    fprintf(stderr, "%s: epoch %lld step %lld/%lld (optimizer step %lld): %s", program, (long long)(epoch + 1),
            (long long)(report.first_step - epoch_base), (long long)steps, (long long)report.first_step, what);
    if (check->policy == UMT_NONFINITE_SKIP) {
        fprintf(stderr, "; its update is skipped, as any such step's will be (--on-nonfinite skip)\n");
        return 0;
    }
    fprintf(stderr, "; the run stops: no update was applied from that step on (--on-nonfinite skip would skip such "
            "steps and go on)\n");
    return -1;
}

void example_nonfinite_summary(const char *program, const umt_optimizer *opt, const example_nonfinite *check) {
    umt_nonfinite_report report;
    if (check->policy != UMT_NONFINITE_SKIP || umt_optimizer_nonfinite_get(opt, &report) || !report.steps) return;
    printf("%s: %lld steps skipped for a NaN or infinite loss or gradient (--on-nonfinite skip)\n", program,
           (long long)report.steps);
}

int64_t example_limit(int64_t n, int64_t limit) { return limit > 0 && limit < n ? limit : n; }

const char *example_count_text(char *buffer, size_t size, int64_t used, int64_t total) {
    if (used < total) snprintf(buffer, size, "%lld of %lld", (long long)used, (long long)total);
    else snprintf(buffer, size, "%lld", (long long)total);
    return buffer;
}

double example_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* dir/name, or dir/name.gz when only the compressed file is there. */
static void idx_path(char *path, size_t size, const char *dir, const char *split, const char *kind) {
    snprintf(path, size, "%s/%s-%s-ubyte", dir, split, kind);
    if (access(path, F_OK) == 0) return;
    snprintf(path, size, "%s/%s-%s-ubyte.gz", dir, split, kind);
    if (access(path, F_OK) != 0) snprintf(path, size, "%s/%s-%s-ubyte", dir, split, kind);
}

int example_load_mnist(const char *program, umt_context *ctx, const char *dir, const char *split, umt_dataset **out) {
    char images[1024], labels[1024];
    idx_path(images, sizeof images, dir, split, "images-idx3");
    idx_path(labels, sizeof labels, dir, split, "labels-idx1");
    umt_status status = umt_dataset_load_idx(ctx, images, labels, 10, out);
    if (status == UMT_OK) return 0;
    fprintf(stderr, "%s: %s\n", program, umt_last_error());
    if (status == UMT_ERR_IO) fprintf(stderr, "(tools/fetch_mnist.sh puts MNIST into data/mnist)\n");
    return -1;
}

int example_load_mnist_samples(const char *program, const char *dir, const char *split, umt_samples **out) {
    char images[1024], labels[1024];
    idx_path(images, sizeof images, dir, split, "images-idx3");
    idx_path(labels, sizeof labels, dir, split, "labels-idx1");
    umt_status status = umt_samples_load_idx(images, labels, 10, out);
    if (status == UMT_OK) return 0;
    fprintf(stderr, "%s: %s\n", program, umt_last_error());
    if (status == UMT_ERR_IO) fprintf(stderr, "(tools/fetch_mnist.sh puts MNIST into data/mnist)\n");
    return -1;
}

int example_count_correct(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                          const umt_dataset *test, int64_t batch_size, int64_t first, int64_t count, int64_t *correct) {
    bool was_grad = umt_set_grad_enabled(ctx, false), was_training = umt_set_training(ctx, false);
    int64_t *indices = malloc((size_t)batch_size * sizeof *indices);
    umt_status status = indices ? UMT_OK : UMT_ERR_OUT_OF_MEMORY;
    *correct = 0;
    for (int64_t start = 0; start < count && status == UMT_OK; start += batch_size) {
        int64_t size = count - start < batch_size ? count - start : batch_size, right = 0;
        for (int64_t i = 0; i < size; ++i) indices[i] = first + start + i;
        umt_tensor *images = NULL, *labels = NULL;
        status = umt_step_begin(ctx);
        if (status == UMT_OK) status = umt_dataset_batch(ctx, test, indices, size, MNIST_MEAN, MNIST_STD, &images, &labels);
        umt_tensor *scores = status == UMT_OK ? forward(ctx, model, images) : NULL;
        if (status == UMT_OK) status = scores ? umt_count_correct(ctx, scores, labels, &right) : umt_last_status();
        *correct += right;
    }
    free(indices);
    umt_set_grad_enabled(ctx, was_grad);
    umt_set_training(ctx, was_training);
    return example_check(program, status);
}

int example_evaluate_loader(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                            umt_loader *test, int64_t limit, double *accuracy) {
    bool was_grad = umt_set_grad_enabled(ctx, false), was_training = umt_set_training(ctx, false);
    int64_t seen = 0, correct = 0;
    /* Without shuffling, the loader's first `limit` samples are the set's first. */
    umt_status status = umt_loader_start_epoch(test, limit, NULL);
    while (status == UMT_OK) {
        umt_tensor *images = NULL, *labels = NULL;
        int64_t right = 0;
        status = umt_step_begin(ctx);
        if (status == UMT_OK) status = umt_loader_next(test, &images, &labels);
        if (status != UMT_OK || !images) break;
        umt_tensor *scores = forward(ctx, model, images);
        status = scores ? umt_count_correct(ctx, scores, labels, &right) : umt_last_status();
        correct += right;
        seen += umt_tensor_dim(labels, 0);
    }
    umt_set_grad_enabled(ctx, was_grad);
    umt_set_training(ctx, was_training);
    *accuracy = seen ? 100.0 * (double)correct / (double)seen : 0.0;
    return example_check(program, status);
}

/* Loader threads by default: one for every four cores online, 1 to 4. One thread cannot assemble
 * MNIST batches of 512 as fast as an H100 trains on them (the compute stream waited 60% of an
 * epoch); four kept its wait under 1% (docs/PERF.md, the host data path). A small machine keeps
 * one, its cores left to the rest of the run. */
static int default_workers(void) {
    long quarter = sysconf(_SC_NPROCESSORS_ONLN) / 4;
    return quarter < 1 ? 1 : quarter > 4 ? 4 : (int)quarter;
}

example_input_flags example_input_defaults(void) {
    return (example_input_flags){.data_on = EXAMPLE_DATA_AUTO, .loader = UMT_LOADER_PINNED, .prefetch = 4,
                                 .workers = default_workers()};
}

int example_input_flag(const char *program, example_input_flags *flags, const char *flag, const char *value) {
    double v = 0;
    if (!strcmp(flag, "--prefetch")) {
        int bad = example_whole_number(program, flag, value, 1, 64, &v);
        flags->prefetch = (int)v;
        return bad;
    }
    if (!strcmp(flag, "--workers")) {
        int bad = example_whole_number(program, flag, value, 1, 64, &v);
        flags->workers = (int)v;
        return bad;
    }
    if (!strcmp(flag, "--loader")) return example_check(program, umt_loader_kind_parse(value, &flags->loader));
    if (strcmp(flag, "--data-on")) return 1;
    const char *names[] = {"auto", "gpu", "host"};
    for (int i = 0; i < 3; ++i)
        if (!strcmp(value, names[i])) return flags->data_on = (example_data_on)i, 0;
    fprintf(stderr, "%s: --data-on '%s': expected auto, gpu or host\n", program, value);
    return -1;
}

int example_evaluate(const char *program, umt_context *ctx, example_forward_fn forward, const void *model,
                     const umt_dataset *test, int64_t batch_size, int64_t limit, double *accuracy) {
    int64_t n = example_limit(umt_dataset_size(test), limit), correct = 0;
    int rc = example_count_correct(program, ctx, forward, model, test, batch_size, 0, n, &correct);
    *accuracy = 100.0 * (double)correct / (double)n;
    return rc;
}

/* ----------------------------------------------------------------------------------------- */
/* The memory plan */

typedef struct {
    example_loss_fn loss;
    const void *model;
    int64_t chw[3];
} plan_model;

/* The plan's forward: a batch of images and labels (never filled: a dry step backs no byte). */
static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    const plan_model *p = user;
    umt_tensor *images = umt_tensor_new_4d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, p->chw[0], p->chw[1], p->chw[2]);
    umt_tensor *labels = images ? umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch) : NULL;
    return labels ? p->loss(ctx, p->model, images, labels) : NULL;
}

/* The plan needs the tier, and there is none yet: said, and the caller makes the model again. */
static int needs_offload(const char *program, const umt_memory_plan *plan, FILE *print) {
    if (print) {
        fprintf(print, "%s: the memory plan needs the offload tier (%s): the context and the model are made again with "
                "it, the same seed giving the same initial parameters\n", program, plan->why);
        fflush(print);
    }
    return EXAMPLE_NEEDS_OFFLOAD;
}

int example_plan(const char *program, umt_context *ctx, example_loss_fn loss, const void *model, const int64_t chw[3],
                 const example_plan_steps *steps, FILE *print, umt_memory_plan *plan) {
    plan_model p = {loss, model, {chw[0], chw[1], chw[2]}};
    int64_t batch = steps->batch > steps->samples && steps->samples > 0 ? steps->samples : steps->batch;
    umt_memory_plan_request rq = {.batch = batch, .micro_batches = steps->micro_batches,
                                  .last_batch = steps->samples % batch, .eval_batch = steps->eval_batch,
                                  .step_value_bytes = steps->step_value_bytes,
                                  .later_device_bytes = steps->later_device_bytes};
    if (rq.micro_batches > batch) rq.micro_batches = batch;
    if (example_check(program, umt_memory_plan_make(ctx, &rq, plan_forward, &p, plan))) return -1;
    if (plan->fits && plan->offload.needed && !plan->offload.enabled) return needs_offload(program, plan, print);
    if (print) {
        umt_memory_plan_print(plan, print);
        fflush(print);
    }
    /* Nothing fits, not even with the offload tier (or host memory cannot hold what it keeps). */
    if (!plan->fits && plan->verdict != UMT_PLAN_FORCED) {
        fprintf(stderr, "%s: the memory plan does not fit: %s\n", program, plan->why);
        return -1;
    }
    if (!plan->fits && print)
        fprintf(stderr, "%s: %lld micro-batches of %lld do not fit the plan's budget (%s); training anyway\n",
                program, (long long)plan->micro_batches, (long long)plan->micro_batch, plan->why);
    /* The tier places the model at the first step: it leaves the plan's reserve for the step. */
    return plan->offload.enabled ? example_check(program, umt_offload_adopt_plan(ctx, plan)) : 0;
}

int example_offload_on(const char *program, umt_context *ctx) {
    return example_check(program, umt_offload_enable(ctx, NULL));
}

int example_build_failed(const char *program, umt_status status, const umt_context *ctx, bool offload, FILE *print) {
    size_t budget = 0, used = 0;
    /* A budget refusal on a GPU: the tier (CUDA only) may take the state home. */
    if (status == UMT_ERR_BUDGET && !offload && umt_device_budget(ctx, &budget, &used) == UMT_OK && budget) {
        if (print)
            fprintf(print, "%s: the model does not fit the device budget (%s): the context and the model are made "
                    "again with the offload tier\n", program, umt_last_error());
        return EXAMPLE_NEEDS_OFFLOAD;
    }
    return example_check(program, status);
}

int example_equal_parts(int64_t total, int64_t at_least) {
    int64_t parts = at_least;
    while (total % parts) parts++;
    return (int)parts;
}
