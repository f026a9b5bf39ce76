/*
 * examples/big_mlp.c — a wide MLP whose weights, gradients and Adam state are several times the
 * device budget, trained through the offload tier (offload/offload.h).
 *
 *   UMT_DEVICE_BUDGET=2G bazel-bin/examples/big_mlp                  # 8 x 8192^2: 8 GiB of state
 *   bazel-bin/examples/big_mlp --no-offload                          # the same, all in GPU memory
 *   UMT_DEVICE_BUDGET=2G bazel-bin/examples/big_mlp --bench 5        # step time against the link
 *
 * Flags: --width N (8192) --depth N (8) --batch N (512) --steps N (10) --seed N (1)
 *        --lr X (1e-4) --update-on backward|auto|gpu|cpu (where and when offloaded parameters are
 *        updated. backward, the default: during backward as each gradient is final, through the
 *        GPU's update ring and CPU threads beside it, the fewest bytes over the link; after backward
 *        instead where the budget cannot hold the ring (auto) or the step needs every gradient
 *        first (--clip-grad-norm, fp16's loss scale: gpu). After backward: gpu in chunks, cpu
 *        threads in pinned memory, auto the faster of the two, timed on the first steps)
 *        --host-updates N|auto (auto; with updates in backward: the first N streamed layers of
 *        each backward are updated by CPU threads beside the GPU's, only their gradients crossing;
 *        auto: as many as balance the CPU's measured rate against the link's, then the count
 *        searched step by step for the fastest)
 *        --reserve SIZE (device bytes kept for activations; default: the memory plan's, what its
 *        dry step measured the batch to need) --offload-activations (saved activations may go to
 *        the offload tier too: the first step sends all, the plan then keeps what fits; the reserve
 *        shrinks to what that step needs. Turned on by the memory plan, and said, when the batch's
 *        do not fit beside the tier's buffers)
 *        --no-offload (plain pools: fails past the budget) --bench N (N timed steps after warm-up)
 *        --dry-run (the memory plan alone: each pool's predicted peak, printed before step 1 in
 *        every run; nothing trained)
 *        --precision fp32|bf16|fp16 (fp32; bf16/fp16: only the weights' half-precision compute copies
 *        cross to the GPU, the fp32 masters and Adam state stay home; fp16 scales the loss)
 *        --clip-grad-norm X (0: off) --grad-accum N (1: each step runs N micro-batches of --batch,
 *        core/micro_batch.h) --dist auto|on (on: the data-parallel path on this one GPU too, its
 *        all-reduce of each gradient before it goes home: dist/umt_dist.h)
 *        --bf16-gradients-home (bf16: the gradients the CPU threads update with cross in bf16, half
 *        the bytes; the losses then differ from the in-memory run's within bf16 rounding, and from
 *        run to run with the CPU's searched count; umt_offload_options)
 *
 *   UMT_DEVICE_BUDGET=2G bazel-bin/examples/big_mlp --batch 2048 --offload-activations
 *                                             # saved activations home as asked (the plan keeps them at 2G)
 *
 * The task is synthetic and fixed: one random batch of `batch` inputs with random labels among
 * `width` classes, which the network learns to fit, so the loss falls step after step and two
 * runs with the same seed print the same losses whatever lives where. The plan is printed before
 * the first step (stderr); each step prints its loss; --bench prints the step time, the bytes
 * that crossed the link per step, the link-bound floor those bytes allow at the link speed
 * measured in the same run, and the ratio floor / step time (1.0 is the link's limit); with CPU
 * updates in backward, their term at the CPU's rate alone too, and the host's memory that the
 * CPU's updates and the link share.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/umt_dist.h"
#include "examples/example_common.h"
#include "examples/example_progress.h"
#include "umtrain.h"

typedef struct {
    int64_t width, depth, batch;
    int steps, bench, host_updates, grad_accum;
    uint64_t seed;
    float lr, clip;
    umt_precision precision;
    bool offload, offload_activations, dry_run, dist, bf16_gradients_home;
    bool reserve_given; /* --reserve: the caller's, never changed */
    size_t reserve;
    umt_offload_optimizer update_on;
} options;

static void print_usage(FILE *out) {
    fprintf(out, "usage: big_mlp [--width N] [--depth N] [--batch N] [--steps N] [--seed N] [--lr X]\n"
            "               [--update-on backward|auto|gpu|cpu] [--reserve SIZE] [--offload-activations] [--no-offload]\n"
            "               [--host-updates N|auto] [--bench N] [--dry-run] [--precision fp32|bf16|fp16]\n"
            "               [--clip-grad-norm X] [--grad-accum N] [--dist auto|on] [--bf16-gradients-home]\n");
}

static int usage(const char *why, const char *what) {
    fprintf(stderr, "big_mlp: %s%s%s\n", why, what ? " " : "", what ? what : "");
    print_usage(stderr);
    return 2;
}

static int parse(int argc, char **argv, options *o) {
    /* Updates in backward: big_mlp sets its learning rate before each backward and accumulates
     * only through micro-batches, the two things they need (include/umtrain.h). */
    *o = (options){.width = 8192, .depth = 8, .batch = 512, .steps = 10, .seed = 1, .lr = 1e-4f, .offload = true,
                   .update_on = UMT_OFFLOAD_OPTIM_BACKWARD, .host_updates = UMT_OFFLOAD_HOST_AUTO, .grad_accum = 1,
                   .precision = UMT_PRECISION_FP32};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--no-offload")) { o->offload = false; continue; }
        if (!strcmp(a, "--offload-activations")) { o->offload_activations = true; continue; }
        if (!strcmp(a, "--dry-run")) { o->dry_run = true; continue; }
        if (!strcmp(a, "--bf16-gradients-home")) { o->bf16_gradients_home = true; continue; }
        if (!v) return example_missing_value("big_mlp", a, print_usage), 2;
        i++;
        if (!strcmp(a, "--width")) o->width = atoll(v);
        else if (!strcmp(a, "--depth")) o->depth = atoll(v);
        else if (!strcmp(a, "--batch")) o->batch = atoll(v);
        else if (!strcmp(a, "--steps")) o->steps = atoi(v);
        else if (!strcmp(a, "--bench")) o->bench = atoi(v);
        else if (!strcmp(a, "--host-updates")) o->host_updates = strcmp(v, "auto") ? atoi(v) : UMT_OFFLOAD_HOST_AUTO;
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--lr")) o->lr = strtof(v, NULL);
        else if (!strcmp(a, "--clip-grad-norm")) o->clip = strtof(v, NULL);
        else if (!strcmp(a, "--grad-accum")) o->grad_accum = atoi(v);
        else if (!strcmp(a, "--dist")) {
            if (strcmp(v, "on") && strcmp(v, "auto")) return usage("--dist: expected auto or on, not", v);
            o->dist = !strcmp(v, "on");
        } else if (!strcmp(a, "--precision")) {
            if (umt_precision_parse(v, &o->precision)) return usage(umt_last_error(), NULL);
        }
        else if (!strcmp(a, "--update-on")) {
            if (umt_offload_optimizer_parse(v, &o->update_on)) return usage(umt_last_error(), NULL);
        } else if (!strcmp(a, "--reserve")) {
            if (umt_parse_bytes(v, &o->reserve)) return usage(umt_last_error(), NULL);
            o->reserve_given = true;
        } else return usage("unknown flag", a);
    }
    if (o->width < 2 || o->depth < 1 || o->batch < 1 || o->steps < 1 || o->bench < 0 ||
        o->host_updates < UMT_OFFLOAD_HOST_AUTO || o->grad_accum < 1 || !(o->clip >= 0))
        return usage("sizes must be positive", NULL);
    /* Otherwise the memory plan sets the reserve (plan_memory). --offload-activations asked for:
     * the recorded first step holds a few at once: the op's input and output, the one leaving,
     * the probabilities; in backward two gradients and the ones back; and 64 MiB of scratch. */
    size_t tensor = (size_t)(o->batch * o->width) * 4;
    if (o->offload_activations && !o->reserve_given) o->reserve = 8 * tensor + ((size_t)64 << 20);
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "big_mlp: %s: %s\n", what, umt_last_error());
    return 1;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ----------------------------------------------------------------------------------------- */
/* The model and one step */

typedef struct {
    umt_context *ctx;
    umt_layer **layers;
    umt_optimizer *opt;
    umt_tensor **x, **labels; /* one batch per micro-batch (--grad-accum) */
    umt_dist *dist;           /* --dist on, else NULL */
} model;

/* The step's grad_accum x batch inputs, drawn as one tensor (so that --grad-accum 2 --batch 256
 * steps on the inputs of --batch 512); with micro-batches, then split into their own tensors. */
static int make_batches(const options *o, model *m) {
    int64_t rows = o->grad_accum * o->batch, per = o->batch * o->width;
    bool split = o->grad_accum > 1;
    umt_tensor *all = umt_tensor_new_2d(m->ctx, UMT_POOL_DATASET, UMT_F32, rows, o->width);
    float *values = split ? malloc((size_t)(rows * o->width) * sizeof *values) : NULL;
    int32_t *labels = malloc((size_t)rows * sizeof *labels);
    m->x = calloc((size_t)o->grad_accum, sizeof *m->x);
    m->labels = calloc((size_t)o->grad_accum, sizeof *m->labels);
    bool made = all && (values || !split) && labels && m->x && m->labels;
    umt_status st = made ? umt_tensor_uniform(m->ctx, all, -1.0f, 1.0f) : UMT_ERR_OUT_OF_MEMORY;
    if (st == UMT_OK && split) st = umt_tensor_copy_to_host(all, values, (size_t)(rows * o->width) * sizeof *values);
    for (int64_t i = 0; i < rows && labels; ++i) labels[i] = (int32_t)((i * 7919 + 13) % o->width);
    for (int k = 0; k < o->grad_accum && st == UMT_OK; ++k) {
        m->x[k] = split ? umt_tensor_new_2d(m->ctx, UMT_POOL_DATASET, UMT_F32, o->batch, o->width) : all;
        m->labels[k] = umt_tensor_new_1d(m->ctx, UMT_POOL_DATASET, UMT_I32, o->batch);
        st = m->x[k] && m->labels[k] ? UMT_OK : umt_last_status();
        if (st == UMT_OK && split)
            st = umt_tensor_copy_from_host(m->x[k], values + k * per, (size_t)per * sizeof *values);
        if (st == UMT_OK)
            st = umt_tensor_copy_from_host(m->labels[k], labels + k * o->batch, (size_t)o->batch * sizeof *labels);
    }
    if (split) umt_tensor_free(all);
    free(values);
    free(labels);
    return st ? fail("batch") : 0;
}

static int build(options *o, model *m) {
    umt_context_options co = umt_context_defaults();
    co.device = UMT_DEVICE_CUDA;
    co.seed = o->seed;
    co.precision = o->precision;
    if (umt_context_create(&co, &m->ctx)) return fail("context");
    /* The tier first: the layers below are then made in host memory, and planned at step 1. */
    umt_offload_options tier = umt_offload_defaults();
    tier.reserve_bytes = o->reserve;
    tier.optimizer = o->update_on;
    tier.host_updates = o->host_updates;
    tier.activations = o->offload_activations;
    tier.bf16_gradients_home = o->bf16_gradients_home;
    if (o->offload && umt_offload_enable(m->ctx, &tier)) return fail("offload");
    m->layers = calloc((size_t)o->depth, sizeof *m->layers);
    for (int64_t l = 0; l < o->depth; ++l) {
        char name[32];
        snprintf(name, sizeof name, "fc%lld", (long long)l);
        if (!(m->layers[l] = umt_linear_layer_new(m->ctx, name, o->width, o->width, true))) return fail(name);
    }
    umt_optimizer_options oo = umt_optimizer_defaults(UMT_OPT_ADAM);
    oo.lr = o->lr;
    oo.max_grad_norm = o->clip;
    oo.loss_scaling = o->precision == UMT_PRECISION_FP16; /* fp16's gradients underflow without it */
    if (umt_optimizer_create(m->ctx, &oo, &m->opt)) return fail("optimizer");
    /* The data-parallel path after the model (its hook follows the tier's on the hook table). */
    if (o->dist) {
        umt_dist_process one = {.bootstrap = UMT_DIST_SINGLE, .rank = 0, .size = 1, .local_rank = 0};
        umt_dist_options d = umt_dist_defaults();
        d.always = true;
        if (umt_dist_create(m->ctx, &one, &d, &m->dist)) return fail("dist");
    }
    return 0;
}

static umt_tensor *forward(const options *o, model *m, int k) {
    umt_tensor *h = m->x[k];
    for (int64_t l = 0; l < o->depth; ++l) {
        h = umt_layer_forward(m->ctx, m->layers[l], h);
        if (l + 1 < o->depth) h = umt_relu(m->ctx, h);
    }
    return umt_softmax_cross_entropy(m->ctx, h, m->labels[k]);
}

/* One training step; the loss is read back only when asked (reading it waits for the step). */
static int step(const options *o, model *m, float *loss_out) {
    if (umt_step_begin(m->ctx) || umt_zero_grad(m->ctx)) return fail("step begin");
    umt_tensor *loss = NULL;
    int64_t whole = o->grad_accum * o->batch;
    for (int k = 0; k < o->grad_accum; ++k) {
        if (o->grad_accum > 1 && umt_micro_batch_begin(m->ctx, k * o->batch, o->batch, whole))
            return fail("micro-batch");
        if (!(loss = forward(o, m, k))) return fail("forward");
        /* Scaled by the optimizer's loss scale under fp16 (1, a plain backward, otherwise). */
        if (umt_backward_scaled(m->ctx, loss, m->opt)) return fail("backward");
        if (o->grad_accum > 1) loss = umt_micro_batch_loss(m->ctx);
    }
    if (m->dist && umt_dist_finish_gradients(m->dist)) return fail("all-reduce");
    if (umt_optimizer_step(m->opt)) return fail("optimizer");
    if (loss_out && umt_tensor_get_f32(loss, 0, loss_out)) return fail("loss");
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* The memory plan before step 1 (include/umtrain.h) */

typedef struct {
    const options *o;
    const model *m;
} plan_user;

/* The step's loss on inputs of a micro-batch (recorded, not made: the batch comes after the plan,
 * in the dataset pool, and the plan adds its bytes as later_dataset_bytes). */
static umt_tensor *plan_forward(umt_context *ctx, void *user, int64_t batch) {
    const plan_user *p = user;
    model micro = *p->m;
    umt_tensor *x = umt_tensor_new_2d(ctx, UMT_POOL_ACTIVATIONS, UMT_F32, batch, p->o->width);
    umt_tensor *labels = umt_tensor_new_1d(ctx, UMT_POOL_ACTIVATIONS, UMT_I32, batch);
    if (!x || !labels) return NULL;
    micro.x = &x;
    micro.labels = &labels;
    return forward(p->o, &micro, 0);
}

/* The memory plan before step 1, printed. The batch is the caller's, as --batch and --grad-accum
 * say: with weights streamed, each micro-batch streams every one of them again, which costs more
 * than sending saved activations home (docs/PERF.md), so the plan chooses only where the state
 * and the saved activations live, and the tier adopts that: its device reserve for a step, and
 * whether saved activations go home. --reserve or --offload-activations keep the caller's choice. */
static int plan_memory(options *o, const model *m) {
    plan_user user = {o, m};
    size_t batch_bytes = (size_t)(o->grad_accum * o->batch) * (size_t)(o->width * 4 + 4); /* x and labels */
    umt_memory_plan_request rq = {.batch = o->grad_accum * o->batch, .micro_batches = o->grad_accum,
                                  .updates_in_backward = o->update_on == UMT_OFFLOAD_OPTIM_BACKWARD,
                                  .later_dataset_bytes = batch_bytes};
    umt_memory_plan plan;
    if (umt_memory_plan_make(m->ctx, &rq, plan_forward, &user, &plan)) return fail("memory plan");
    umt_memory_plan_print(&plan, stdout);
    if (!o->offload || o->reserve_given || o->offload_activations) return 0;
    if (!plan.fits) return fprintf(stderr, "big_mlp: the memory plan finds no way to train: %s\n", plan.why), 1;
    if (umt_offload_adopt_plan(m->ctx, &plan)) return fail("adopt the plan");
    o->offload_activations = plan.offload.activations;
    if (o->offload_activations) printf("big_mlp: the plan sends saved activations to the offload tier too\n");
    return 0;
}

/* ----------------------------------------------------------------------------------------- */
/* --bench: step time against the link */

/* The most warm-up steps: the search for the count of CPU updates takes four a count. */
#define WARM_UP_MOST 48

/* The floor's terms that this run measures, and floor / step for them: the link's bytes at its
 * speed, the CPU's update at its rate alone (issue 24's floor is the largest of these and the step
 * in GPU memory, which needs a run of its own: bench/offload.sh runs both); and, printed beside
 * them, the host's memory that both go through: the step's bytes there at what it carried with
 * the CPU's update and the link running at once, and the least time the three measured ways of
 * running (each side alone, both at once) leave for the step's work. */
static void print_floor(const umt_link_speed *link, const umt_host_memory_speed *hm, double update_rate,
                        double host_elements, double in, double out, double step_s) {
    /* Both directions run at once: the link's term is whichever of them, or their sum, takes longest. */
    double link_s = in / (link->to_device_gbps * 1e9);
    double t_out = out / (link->to_host_gbps * 1e9), t_both = (in + out) / (link->both_ways_gbps * 1e9);
    if (t_out > link_s) link_s = t_out;
    if (t_both > link_s) link_s = t_both;
    printf("bench: link %.1f GB/s to device, %.1f GB/s to host, %.1f GB/s both ways (pinned, measured now)\n",
           link->to_device_gbps, link->to_host_gbps, link->both_ways_gbps);
    printf("bench: per step %.3f GB to device + %.3f GB to host; link-bound floor %.1f ms; floor / step = %.2f\n",
           in / 1e9, out / 1e9, 1e3 * link_s, link_s / step_s);
    double update_s = host_elements > 0 && update_rate > 0 ? host_elements / update_rate : 0;
    if (update_s <= 0) return;
    double floor_s = update_s > link_s ? update_s : link_s;
    printf("bench: floor of the link and the CPU's update: %.1f ms (the %s); floor / step = %.2f\n", 1e3 * floor_s,
           update_s > link_s ? "update" : "link", floor_s / step_s);
    if (hm->cpu_beside_link <= 0) return; /* not measured: no offload tier */
    double carried = hm->cpu_beside_link * hm->update_bytes + hm->link_beside_cpu_gbps * 1e9;
    double bytes = host_elements * hm->update_bytes + in + out, host_s = bytes / carried;
    printf("bench: host memory: the CPU's update %.2f G elements/s alone, %.2f beside the link (%.0f bytes an "
           "element); the link %.1f GB/s alone, %.1f beside the CPU: %.1f GB/s with both at once\n",
           hm->cpu_alone / 1e9, hm->cpu_beside_link / 1e9, hm->update_bytes, hm->link_alone_gbps,
           hm->link_beside_cpu_gbps, carried / 1e9);
    printf("bench: host memory per step %.2f GB (the CPU's update %.2f, the link %.2f) at %.1f GB/s: %.1f ms = %.2f "
           "of the step\n", bytes / 1e9, host_elements * hm->update_bytes / 1e9, (in + out) / 1e9, carried / 1e9,
           1e3 * host_s, host_s / step_s);
    double shared_s = 0;
    if (umt_host_memory_least_seconds(hm, host_elements, in + out, &shared_s) != UMT_OK) {
        fail("the least time of the host's memory");
        return;
    }
    printf("bench: the step's CPU update and link bytes, each side alone or both at once at those rates, take at "
           "least %.1f ms = %.2f of the step; the floor of the link and the update is %.2f of that\n", 1e3 * shared_s,
           shared_s / step_s, floor_s / shared_s);
}

static int bench(const options *o, model *m) {
    /* The link and the host's memory first, before the plan gives the budget to resident parameters. */
    umt_link_speed link;
    umt_host_memory_speed hm = {0};
    if (o->offload && umt_link_measure(m->ctx, (size_t)128 << 20, &link)) return fail("link measure");
    if (o->offload && umt_offload_host_memory_measure(m->ctx, &hm)) return fail("host memory measure");
    /* Warm-up: the first step records the order of uses, auto mode times both updates, and with
     * updates in backward auto's count of CPU updates is searched over the next steps. */
    umt_offload_stats before, after;
    int warm = 0;
    do {
        if (step(o, m, NULL)) return 1;
        umt_offload_stats_get(m->ctx, &before);
    } while (++warm < 3 || (before.host_updates < 0 && warm < WARM_UP_MOST));
    if (umt_synchronize(m->ctx)) return fail("synchronize");
    umt_offload_stats_get(m->ctx, &before);
    printf("bench: warm-up %d steps%s\n", warm, before.host_updates < 0 ? " (the CPU's count still searched)" : "");
    double start = seconds();
    for (int i = 0; i < o->bench; ++i)
        if (step(o, m, NULL)) return 1;
    if (umt_synchronize(m->ctx)) return fail("synchronize");
    double step_s = (seconds() - start) / o->bench;
    umt_offload_stats_get(m->ctx, &after);
    double in = (double)(after.bytes_to_device - before.bytes_to_device) / o->bench;
    double out = (double)(after.bytes_to_host - before.bytes_to_host) / o->bench;
    printf("bench: step %.1f ms (%d steps, batch %lld, width %lld, depth %lld, %s, updates on the %s)\n", 1e3 * step_s,
           o->bench, (long long)o->batch, (long long)o->width, (long long)o->depth,
           o->offload ? "offload tier" : "in GPU memory",
           o->offload ? umt_offload_optimizer_name(after.optimizer) : "gpu, in place");
    if (after.optimizer_gpu_ms > 0 && after.optimizer_cpu_ms > 0)
        printf("bench: offloaded update measured: gpu streamed %.1f ms, cpu threads %.1f ms\n", after.optimizer_gpu_ms,
               after.optimizer_cpu_ms);
    /* Updates in backward: the CPU threads' share must be done within each step, whatever runs beside it. */
    double host_elements = (double)(after.host_updated_elements - before.host_updated_elements) / o->bench;
    if (host_elements > 0 && after.host_update_rate > 0)
        printf("bench: update term: CPU threads %.3f G elements a step at %.2f G/s (timed alone): %.1f ms\n",
               host_elements / 1e9, after.host_update_rate / 1e9, 1e3 * host_elements / after.host_update_rate);
    /* Inside the steps: how much of the step the threads worked, and their rate while they did. */
    double busy_s = (after.host_busy_seconds - before.host_busy_seconds) / o->bench;
    if (host_elements > 0 && busy_s > 0 && after.host_threads > 0)
        printf("bench: the %d CPU threads worked %.1f ms each of the %.1f ms step (%.0f%%), at %.2f G elements/s while "
               "they did\n", after.host_threads, 1e3 * busy_s / after.host_threads, 1e3 * step_s,
               100 * busy_s / after.host_threads / step_s, host_elements / busy_s * after.host_threads / 1e9);
    if (in + out == 0) return 0;
    print_floor(&link, &hm, after.host_update_rate, host_elements, in, out, step_s);
    if (o->offload_activations)
        printf("bench: of which saved activations %.3f GB to device + %.3f GB to host per step\n",
               (double)(after.activation_bytes_to_device - before.activation_bytes_to_device) / o->bench / 1e9,
               (double)(after.activation_bytes_to_host - before.activation_bytes_to_host) / o->bench / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    model m = {0};
    if (build(&o, &m)) return 1;
    size_t budget = 0, used = 0;
    umt_device_budget(m.ctx, &budget, &used);
    double state_gib = (double)(4 * o.depth * o.width * (o.width + 1)) * 4 / (double)(1 << 30);
    printf("big_mlp: %lld layers of %lld x %lld, batch %lld%s, %s: weights + grads + Adam %.2f GiB, device budget "
           "%.2f GiB (%.1fx)\n", (long long)o.depth, (long long)o.width, (long long)o.width, (long long)o.batch,
           o.grad_accum > 1 ? " per micro-batch" : "", umt_precision_name(o.precision), state_gib,
           (double)budget / (1 << 30), state_gib * (1 << 30) / (double)budget);
    rc = plan_memory(&o, &m);
    /* The batch is made in the dataset pool once; its values come from the same seeded RNG. */
    if (!rc && !o.dry_run) rc = make_batches(&o, &m);
    if (!rc && o.bench && !o.dry_run) rc = bench(&o, &m);
    example_progress progress; /* a run of steps: each line with the run's time and ETA */
    example_progress_start(&progress, stdout, 0, 0);
    example_progress_epoch(&progress, 0, o.steps);
    for (int s = 0; !o.bench && !o.dry_run && s < o.steps && !rc; ++s) {
        float loss = 0;
        double t0 = seconds();
        char line[128];
        rc = step(&o, &m, &loss);
        snprintf(line, sizeof line, "step %d loss %.9g (%.1f ms)", s + 1, loss, 1e3 * (seconds() - t0));
        if (!rc) example_progress_line(&progress, s + 1, line);
    }
    example_progress_break(&progress);
    umt_offload_stats st;
    umt_offload_stats_get(m.ctx, &st);
    if (!rc && !o.dry_run)
        printf("big_mlp: %d tensors (%.2f GiB) in the offload tier; %.2f GB copied to the device, %.2f GB to the host; "
               "saved activations: %llu sent out (%.2f GB out, %.2f GB back)\n",
               st.offloaded_tensors, (double)st.offloaded_bytes / (1 << 30), (double)st.bytes_to_device / 1e9,
               (double)st.bytes_to_host / 1e9, (unsigned long long)st.activations_offloaded,
               (double)st.activation_bytes_to_host / 1e9, (double)st.activation_bytes_to_device / 1e9);
    free(m.layers);
    free(m.x);
    free(m.labels);
    umt_dist_destroy(m.dist);
    umt_context_destroy(m.ctx);
    return rc;
}
