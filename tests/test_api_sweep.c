/*
 * tests/test_api_sweep.c — every function of include/umtrain.h, given NULL for each of its pointer
 * arguments in turn (the others valid), and an object of another context for each argument that
 * belongs to one: no crash, and a message that names the argument.
 *
 * The table has one row per function of the header, in its order. A row lists the function's
 * pointer arguments, each with what NULL must do there:
 *   NAMED    refused: an error status, NULL or the documented neutral value, and a message
 *            "<function>: ... <argument> is NULL";
 *   KEPT     an op's input: NULL in, NULL out, and the message of the failure that made the NULL
 *            stands (so that a whole forward pass is checked once, at its end);
 *   ACCEPTED NULL means something (no bias, the defaults, nothing to free): no "is NULL" message.
 * An argument that belongs to a context (a tensor, layer, optimizer, dataset) is also given its
 * twin of a second context: refused with "<function>: ... <argument> belongs to another context
 * than <owner>". Each case runs in a child process (fork) that builds its own fixture, so a crash
 * is one failed case and the sweep goes on. The header itself is read (tests/BUILD passes its
 * path) and every function it declares must have a row, so a new API function joins the table.
 * Tagged bad-input: tools/test.sh runs it again under ASan and UBSan.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/header_functions.h"
#include "umtrain.h"

static const char *header_path; /* argv[1] */
static char dir[64], images_path[128], labels_path[128], bmp_path[128], folder_path[128], checkpoint_path[128],
    save_path[128];

/* ----------------------------------------------------------------------------------------- */
/* The fixture: one context with a little of everything, built afresh in each child */

typedef struct {
    umt_context *ctx;
    umt_tensor *x, *y;  /* f32 [2,3] */
    umt_tensor *w;      /* f32 [3,2]: x's right-hand side in a product */
    umt_tensor *image;  /* f32 [1,2,4,4]: convolutions and pools */
    umt_tensor *labels; /* i32 [2] */
    umt_layer *fc, *conv, *bn; /* linear 3->2, conv2d 2->2 kernel 3, batch norm over 3 channels */
    umt_tensor *fc_weight, *fc_bias, *conv_weight, *conv_bias, *bn_gamma, *bn_beta, *bn_mean, *bn_var;
    umt_optimizer *opt;
    umt_dataset *ds;
    umt_samples *samples;
    umt_loader *loader;
    umt_step_graph *graph;
    umt_step_group *group; /* of graph alone */
    umt_tensor *loss; /* mean(linear(x)), recorded: what backward takes */
} world;

/* A tensor of a pool that lives across steps, holding values. */
static umt_tensor *persistent(umt_context *ctx, umt_dtype dtype, int ndim, const int64_t *shape, const void *values) {
    umt_tensor *t = umt_tensor_new(ctx, UMT_POOL_WEIGHTS, dtype, ndim, shape);
    if (t && umt_tensor_copy_from_host(t, values, (size_t)umt_tensor_numel(t) * umt_dtype_size(dtype)) != UMT_OK)
        return NULL;
    return t;
}

static bool world_tensors(world *w) {
    float values[32];
    for (int i = 0; i < 32; ++i) values[i] = 0.1f * (float)(i % 7) - 0.3f;
    int32_t labels[2] = {0, 2};
    w->x = persistent(w->ctx, UMT_F32, 2, (int64_t[]){2, 3}, values);
    w->y = persistent(w->ctx, UMT_F32, 2, (int64_t[]){2, 3}, values + 6);
    w->w = persistent(w->ctx, UMT_F32, 2, (int64_t[]){3, 2}, values + 12);
    w->image = persistent(w->ctx, UMT_F32, 4, (int64_t[]){1, 2, 4, 4}, values);
    w->labels = persistent(w->ctx, UMT_I32, 1, (int64_t[]){2}, labels);
    return w->x && w->y && w->w && w->image && w->labels;
}

static bool world_model(world *w) {
    umt_context *ctx = w->ctx;
    w->fc = umt_linear_layer_new(ctx, "fc", 3, 2, true);
    w->conv = umt_conv2d_layer_new(ctx, "conv", 2, 2, 3, 1, 0, true);
    w->bn = umt_batchnorm_layer_new(ctx, "bn", 3);
    if (!w->fc || !w->conv || !w->bn) return false;
    umt_tensor **parameters[] = {&w->fc_weight, &w->fc_bias, &w->conv_weight, &w->conv_bias, &w->bn_gamma, &w->bn_beta};
    for (int i = 0; i < 6; ++i) *parameters[i] = umt_parameter_at(ctx, i);
    w->bn_mean = umt_buffer_at(ctx, 0);
    w->bn_var = umt_buffer_at(ctx, 1);
    umt_optimizer_options sgd = umt_optimizer_defaults(UMT_OPT_SGD);
    return umt_optimizer_create(ctx, &sgd, &w->opt) == UMT_OK;
}

static bool world_build(world *w) {
    *w = (world){0};
    umt_context_options o = umt_context_defaults();
    o.device = UMT_DEVICE_CPU;
    if (umt_context_create(&o, &w->ctx) != UMT_OK || !world_tensors(w) || !world_model(w)) return false;
    umt_loader_options lo = umt_loader_defaults();
    lo.batch_size = 2;
    if (umt_dataset_load_idx(w->ctx, images_path, labels_path, 3, &w->ds) != UMT_OK ||
        umt_samples_load_idx(images_path, labels_path, 3, &w->samples) != UMT_OK ||
        umt_loader_create(w->ctx, w->samples, &lo, &w->loader) != UMT_OK ||
        umt_step_graph_create(w->ctx, false, &w->graph) != UMT_OK ||
        umt_step_group_create(&w->graph, 1, &w->group) != UMT_OK || umt_step_begin(w->ctx) != UMT_OK)
        return false;
    w->loss = umt_mean(w->ctx, umt_linear(w->ctx, w->x, w->fc_weight, w->fc_bias));
    return w->loss != NULL;
}

static void world_destroy(world *w) {
    umt_step_group_destroy(w->group); /* before its member's context */
    umt_context_destroy(w->ctx); /* the loader first: it reads the samples */
    umt_samples_destroy(w->samples);
}

/* A training step for umt_step_graph_run; user may be NULL. */
static umt_tensor *sweep_step(umt_context *ctx, void *user, const void *input, size_t input_bytes) {
    (void)user, (void)input, (void)input_bytes;
    if (umt_step_begin(ctx) != UMT_OK) return NULL;
    return umt_mean(ctx, umt_parameter_at(ctx, 0));
}

static void on_grad_ready(umt_tensor *parameter, void *user) { (void)parameter, (void)user; }

/* A memory plan's forward: a loss from the first parameter; user may be NULL. */
static umt_tensor *sweep_plan_forward(umt_context *ctx, void *user, int64_t batch) {
    (void)user, (void)batch;
    return umt_mean(ctx, umt_parameter_at(ctx, 0));
}

/* ----------------------------------------------------------------------------------------- */
/* One call: its arguments, where it writes, what it returned */

typedef struct {
    const world *w, *other; /* this context's objects, and their twins of another context */
    int which;              /* the argument under test (its index among the row's arguments) */
    bool foreign;           /* give it the other context's twin instead of NULL */
    umt_device device;
    umt_memory_mode memory_mode;
    umt_precision precision;
    umt_offload_optimizer offload_optimizer;
    umt_optimizer_kind optimizer_kind;
    umt_loader_kind loader_kind;
    size_t size, size2;
    double ms, mean;
    int64_t count, chw[3], permutation[4];
    float value, host[6];
    umt_pool_stats pool_stats;
    umt_memory_plan_request plan_request;
    umt_memory_plan plan;
    umt_offload_stats offload_stats;
    umt_link_speed link;
    umt_host_memory_speed host_memory;
    umt_loader_stats loader_stats;
    umt_checkpoint_info info;
    umt_checkpoint_load_options load_options;
    umt_nonfinite_policy nonfinite_policy;
    umt_nonfinite_report nonfinite_report;
    umt_rng_state rng_state;
    umt_context *context;
    umt_tensor *tensor, *tensor2;
    umt_optimizer *optimizer;
    umt_dataset *dataset;
    umt_samples *samples, *samples2;
    umt_loader *loader;
    umt_step_graph *graph;
    umt_step_group *group;
    umt_context_options context_options;
    umt_offload_options offload_options;
    umt_optimizer_options optimizer_options;
    umt_image_folder_options folder_options;
    umt_loader_options loader_options;
    enum { RETURNS_VALUE, RETURNS_STATUS, RETURNS_POINTER } returns;
    umt_status status;
    const void *pointer;
} sweep;

static const int64_t shape23[2] = {2, 3}, shape32[2] = {3, 2}, indices[2] = {0, 1};

/* Argument i, a context's object: NULL under test, or the other context's twin. */
#define OWN(i, field) (s->which == (i) ? (s->foreign ? s->other->field : NULL) : s->w->field)
/* Argument i of no context: NULL under test. */
#define ARG(i, value) (s->which == (i) ? NULL : (value))
#define CTX(i) ARG(i, s->w->ctx)
#define STATUS(call) (s->returns = RETURNS_STATUS, s->status = (call))
#define POINTER(call) (s->returns = RETURNS_POINTER, s->pointer = (call))
#define VALUE(call) ((void)(call))
#define CALL(function) static void call_##function(sweep *s)

CALL(umt_device_parse) { STATUS(umt_device_parse(ARG(0, "cpu"), ARG(1, &s->device))); }
CALL(umt_memory_mode_parse) { STATUS(umt_memory_mode_parse(ARG(0, "managed"), ARG(1, &s->memory_mode))); }
CALL(umt_precision_parse) { STATUS(umt_precision_parse(ARG(0, "fp32"), ARG(1, &s->precision))); }
CALL(umt_parse_bytes) { STATUS(umt_parse_bytes(ARG(0, "2G"), ARG(1, &s->size))); }
CALL(umt_context_create) { STATUS(umt_context_create(ARG(0, &s->context_options), ARG(1, &s->context))); }
CALL(umt_context_destroy) { VALUE(umt_context_destroy(CTX(0))); }
CALL(umt_context_precision) { VALUE(umt_context_precision(CTX(0))); }
CALL(umt_context_compute_dtype) { VALUE(umt_context_compute_dtype(CTX(0))); }
CALL(umt_synchronize) { STATUS(umt_synchronize(CTX(0))); }
CALL(umt_timer_start) { STATUS(umt_timer_start(CTX(0))); }
CALL(umt_timer_stop) { STATUS(umt_timer_stop(CTX(0), ARG(1, &s->ms))); }
CALL(umt_device_budget) { STATUS(umt_device_budget(CTX(0), ARG(1, &s->size), ARG(2, &s->size2))); }
CALL(umt_pool_stats_get) { STATUS(umt_pool_stats_get(CTX(0), UMT_POOL_WEIGHTS, ARG(1, &s->pool_stats))); }
CALL(umt_memory_report) { VALUE(umt_memory_report(CTX(0))); }
CALL(umt_memory_plan_make) {
    s->plan_request = (umt_memory_plan_request){.batch = 2};
    STATUS(umt_memory_plan_make(CTX(0), ARG(1, &s->plan_request), ARG(2, sweep_plan_forward), ARG(3, s->w->x),
                                ARG(4, &s->plan)));
}
CALL(umt_memory_plan_print) { VALUE(umt_memory_plan_print(ARG(0, &s->plan), ARG(1, stderr))); }
CALL(umt_offload_optimizer_parse) {
    STATUS(umt_offload_optimizer_parse(ARG(0, "auto"), ARG(1, &s->offload_optimizer)));
}
CALL(umt_offload_enable) { STATUS(umt_offload_enable(CTX(0), ARG(1, &s->offload_options))); }
CALL(umt_offload_adopt_plan) { STATUS(umt_offload_adopt_plan(CTX(0), ARG(1, &s->plan))); }
CALL(umt_offload_stats_get) { STATUS(umt_offload_stats_get(CTX(0), ARG(1, &s->offload_stats))); }
CALL(umt_link_measure) { STATUS(umt_link_measure(CTX(0), 1024, ARG(1, &s->link))); }
CALL(umt_offload_host_memory_measure) { STATUS(umt_offload_host_memory_measure(CTX(0), ARG(1, &s->host_memory))); }
CALL(umt_host_memory_least_seconds) {
    static const umt_host_memory_speed speed = {1e9, 1e9, 10, 10, 30};
    static double seconds;
    STATUS(umt_host_memory_least_seconds(ARG(0, &speed), 1e6, 1e6, ARG(1, &seconds)));
}
CALL(umt_tensor_new) { POINTER(umt_tensor_new(CTX(0), UMT_POOL_WEIGHTS, UMT_F32, 2, ARG(1, shape23))); }
CALL(umt_tensor_new_1d) { POINTER(umt_tensor_new_1d(CTX(0), UMT_POOL_WEIGHTS, UMT_F32, 3)); }
CALL(umt_tensor_new_2d) { POINTER(umt_tensor_new_2d(CTX(0), UMT_POOL_WEIGHTS, UMT_F32, 2, 3)); }
CALL(umt_tensor_new_4d) { POINTER(umt_tensor_new_4d(CTX(0), UMT_POOL_WEIGHTS, UMT_F32, 1, 1, 2, 3)); }
CALL(umt_tensor_free) { VALUE(umt_tensor_free(ARG(0, s->w->y))); }
CALL(umt_tensor_ndim) { VALUE(umt_tensor_ndim(ARG(0, s->w->x))); }
CALL(umt_tensor_dim) { VALUE(umt_tensor_dim(ARG(0, s->w->x), 0)); }
CALL(umt_tensor_numel) { VALUE(umt_tensor_numel(ARG(0, s->w->x))); }
CALL(umt_tensor_dtype) { VALUE(umt_tensor_dtype(ARG(0, s->w->x))); }
CALL(umt_tensor_pool) { VALUE(umt_tensor_pool(ARG(0, s->w->x))); }
CALL(umt_tensor_device) { VALUE(umt_tensor_device(ARG(0, s->w->x))); }
CALL(umt_tensor_name) { POINTER(umt_tensor_name(ARG(0, s->w->fc_weight))); }
CALL(umt_tensor_grad) { POINTER(umt_tensor_grad(ARG(0, s->w->fc_weight))); }
CALL(umt_tensor_copy_from_host) { STATUS(umt_tensor_copy_from_host(ARG(0, s->w->x), ARG(1, s->host), sizeof s->host)); }
CALL(umt_tensor_copy_to_host) { STATUS(umt_tensor_copy_to_host(ARG(0, s->w->x), ARG(1, s->host), sizeof s->host)); }
CALL(umt_tensor_fill) { STATUS(umt_tensor_fill(ARG(0, s->w->x), 1.0f)); }
CALL(umt_tensor_get_f32) { STATUS(umt_tensor_get_f32(ARG(0, s->w->x), 0, ARG(1, &s->value))); }
CALL(umt_tensor_convert) { STATUS(umt_tensor_convert(ARG(0, s->w->x), OWN(1, y))); }
CALL(umt_parameter_new) { POINTER(umt_parameter_new(CTX(0), ARG(1, "extra"), 2, ARG(2, shape23))); }
CALL(umt_tensor_uniform) { STATUS(umt_tensor_uniform(CTX(0), OWN(1, y), -1.0f, 1.0f)); }
CALL(umt_parameter_count) { VALUE(umt_parameter_count(CTX(0))); }
CALL(umt_parameter_at) { POINTER(umt_parameter_at(CTX(0), 0)); }
CALL(umt_buffer_new) { POINTER(umt_buffer_new(CTX(0), ARG(1, "extra"), 2, ARG(2, shape23))); }
CALL(umt_buffer_count) { VALUE(umt_buffer_count(CTX(0))); }
CALL(umt_buffer_at) { POINTER(umt_buffer_at(CTX(0), 0)); }
CALL(umt_step_begin) { STATUS(umt_step_begin(CTX(0))); }
CALL(umt_zero_grad) { STATUS(umt_zero_grad(CTX(0))); }
CALL(umt_backward) { STATUS(umt_backward(CTX(0), OWN(1, loss))); }
CALL(umt_set_grad_enabled) { VALUE(umt_set_grad_enabled(CTX(0), true)); }
CALL(umt_set_training) { VALUE(umt_set_training(CTX(0), true)); }
CALL(umt_set_grad_ready_hook) { VALUE(umt_set_grad_ready_hook(CTX(0), ARG(1, on_grad_ready), ARG(2, (void *)s))); }
CALL(umt_micro_batch_begin) { STATUS(umt_micro_batch_begin(CTX(0), 0, 2, 4)); }
CALL(umt_micro_batch_loss) { POINTER(umt_micro_batch_loss(CTX(0))); }
CALL(umt_matmul) { POINTER(umt_matmul(CTX(0), OWN(1, x), OWN(2, w))); }
CALL(umt_linear) { POINTER(umt_linear(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias))); }
CALL(umt_linear_relu) { POINTER(umt_linear_relu(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias))); }
CALL(umt_linear_relu_dropout) {
    POINTER(umt_linear_relu_dropout(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias), 0.5f));
}
CALL(umt_add) { POINTER(umt_add(CTX(0), OWN(1, x), OWN(2, y))); }
CALL(umt_mul) { POINTER(umt_mul(CTX(0), OWN(1, x), OWN(2, y))); }
CALL(umt_relu) { POINTER(umt_relu(CTX(0), OWN(1, x))); }
CALL(umt_reshape) { POINTER(umt_reshape(CTX(0), OWN(1, x), 2, ARG(2, shape32))); }
CALL(umt_flatten) { POINTER(umt_flatten(CTX(0), OWN(1, x))); }
CALL(umt_flatten_linear) { POINTER(umt_flatten_linear(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias))); }
CALL(umt_flatten_linear_relu) {
    POINTER(umt_flatten_linear_relu(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias)));
}
CALL(umt_flatten_linear_relu_dropout) {
    POINTER(umt_flatten_linear_relu_dropout(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias), 0.5f));
}
CALL(umt_mean) { POINTER(umt_mean(CTX(0), OWN(1, x))); }
CALL(umt_log_softmax) { POINTER(umt_log_softmax(CTX(0), OWN(1, x))); }
CALL(umt_nll_loss) { POINTER(umt_nll_loss(CTX(0), OWN(1, x), OWN(2, labels))); }
CALL(umt_softmax_cross_entropy) { POINTER(umt_softmax_cross_entropy(CTX(0), OWN(1, x), OWN(2, labels))); }
CALL(umt_linear_softmax_cross_entropy) {
    POINTER(umt_linear_softmax_cross_entropy(CTX(0), OWN(1, x), OWN(2, fc_weight), OWN(3, fc_bias), OWN(4, labels)));
}
CALL(umt_conv2d) { POINTER(umt_conv2d(CTX(0), OWN(1, image), OWN(2, conv_weight), OWN(3, conv_bias), 1, 0)); }
CALL(umt_conv2d_relu) { POINTER(umt_conv2d_relu(CTX(0), OWN(1, image), OWN(2, conv_weight), OWN(3, conv_bias), 1, 0)); }
CALL(umt_max_pool2d) { POINTER(umt_max_pool2d(CTX(0), OWN(1, image), 2, 2)); }
CALL(umt_avg_pool2d) { POINTER(umt_avg_pool2d(CTX(0), OWN(1, image), 2, 2)); }
CALL(umt_dropout) { POINTER(umt_dropout(CTX(0), OWN(1, x), 0.5f)); }
CALL(umt_max_pool2d_dropout) { POINTER(umt_max_pool2d_dropout(CTX(0), OWN(1, image), 2, 2, 0.5f)); }
CALL(umt_bias_relu_max_pool2d_dropout) {
    POINTER(umt_bias_relu_max_pool2d_dropout(CTX(0), OWN(1, image), OWN(2, conv_bias), 2, 2, 0.5f));
}
CALL(umt_batch_norm) {
    POINTER(umt_batch_norm(CTX(0), OWN(1, x), OWN(2, bn_gamma), OWN(3, bn_beta), OWN(4, bn_mean), OWN(5, bn_var), 0.1f,
                           1e-5f));
}
CALL(umt_count_correct) { STATUS(umt_count_correct(CTX(0), OWN(1, x), OWN(2, labels), ARG(3, &s->count))); }
CALL(umt_linear_layer_new) { POINTER(umt_linear_layer_new(CTX(0), ARG(1, "extra"), 3, 2, true)); }
CALL(umt_conv2d_layer_new) { POINTER(umt_conv2d_layer_new(CTX(0), ARG(1, "extra"), 2, 2, 3, 1, 0, true)); }
CALL(umt_batchnorm_layer_new) { POINTER(umt_batchnorm_layer_new(CTX(0), ARG(1, "extra"), 3)); }
CALL(umt_layer_forward) { POINTER(umt_layer_forward(CTX(0), OWN(1, fc), OWN(2, x))); }
CALL(umt_layer_forward_relu) { POINTER(umt_layer_forward_relu(CTX(0), OWN(1, fc), OWN(2, x))); }
CALL(umt_layer_forward_flatten_relu) { POINTER(umt_layer_forward_flatten_relu(CTX(0), OWN(1, fc), OWN(2, x))); }
CALL(umt_layer_softmax_cross_entropy) {
    POINTER(umt_layer_softmax_cross_entropy(CTX(0), OWN(1, fc), OWN(2, x), OWN(3, labels)));
}
CALL(umt_layer_forward_flatten_relu_dropout) {
    POINTER(umt_layer_forward_flatten_relu_dropout(CTX(0), OWN(1, fc), OWN(2, x), 0.5f));
}
CALL(umt_layer_forward_relu_max_pool2d_dropout) {
    POINTER(umt_layer_forward_relu_max_pool2d_dropout(CTX(0), OWN(1, conv), OWN(2, image), 2, 2, 0.5f));
}
CALL(umt_nonfinite_policy_parse) {
    STATUS(umt_nonfinite_policy_parse(ARG(0, "stop"), ARG(1, &s->nonfinite_policy)));
}
CALL(umt_optimizer_kind_parse) { STATUS(umt_optimizer_kind_parse(ARG(0, "sgd"), ARG(1, &s->optimizer_kind))); }
CALL(umt_optimizer_create) {
    STATUS(umt_optimizer_create(CTX(0), ARG(1, &s->optimizer_options), ARG(2, &s->optimizer)));
}
CALL(umt_optimizer_step) { STATUS(umt_optimizer_step(ARG(0, s->w->opt))); }
CALL(umt_backward_scaled) { STATUS(umt_backward_scaled(CTX(0), OWN(1, loss), OWN(2, opt))); }
CALL(umt_optimizer_skipped_steps) { VALUE(umt_optimizer_skipped_steps(ARG(0, s->w->opt))); }
CALL(umt_optimizer_loss_scale) { VALUE(umt_optimizer_loss_scale(ARG(0, s->w->opt))); }
CALL(umt_optimizer_set_lr) { VALUE(umt_optimizer_set_lr(ARG(0, s->w->opt), 0.5f)); }
CALL(umt_optimizer_lr) { VALUE(umt_optimizer_lr(ARG(0, s->w->opt))); }
CALL(umt_optimizer_nonfinite_found) { VALUE(umt_optimizer_nonfinite_found(ARG(0, s->w->opt))); }
CALL(umt_optimizer_nonfinite_get) {
    STATUS(umt_optimizer_nonfinite_get(ARG(0, s->w->opt), ARG(1, &s->nonfinite_report)));
}
CALL(umt_optimizer_steps) { VALUE(umt_optimizer_steps(ARG(0, s->w->opt))); }
CALL(umt_optimizer_destroy) { VALUE(umt_optimizer_destroy(ARG(0, s->w->opt))); }
CALL(umt_step_graph_create) { STATUS(umt_step_graph_create(CTX(0), false, ARG(1, &s->graph))); }
CALL(umt_step_graph_run) {
    STATUS(umt_step_graph_run(ARG(0, s->w->graph), ARG(1, sweep_step), ARG(2, (void *)s), ARG(3, &s->count),
                              sizeof s->count));
}
CALL(umt_step_graph_loss) { POINTER(umt_step_graph_loss(ARG(0, s->w->graph))); }
CALL(umt_step_graph_take_mean_loss) {
    STATUS(umt_step_graph_take_mean_loss(ARG(0, s->w->graph), ARG(1, &s->mean), ARG(2, &s->count)));
}
CALL(umt_step_graph_stats_get) { VALUE(umt_step_graph_stats_get(ARG(0, s->w->graph))); }
CALL(umt_step_graph_off_reason) { POINTER(umt_step_graph_off_reason(ARG(0, s->w->graph))); }
CALL(umt_step_graph_destroy) { VALUE(umt_step_graph_destroy(ARG(0, s->w->graph))); }
CALL(umt_step_group_create) {
    umt_step_graph *graphs[1] = {s->w->graph};
    STATUS(umt_step_group_create(ARG(0, graphs), 1, ARG(1, &s->group)));
}
CALL(umt_step_group_run) {
    void *users[1] = {s};
    const void *inputs[1] = {&s->count};
    size_t bytes[1] = {sizeof s->count};
    STATUS(umt_step_group_run(ARG(0, s->w->group), ARG(1, sweep_step), ARG(2, users), ARG(3, inputs), ARG(4, bytes)));
}
CALL(umt_step_group_stats_get) { VALUE(umt_step_group_stats_get(ARG(0, s->w->group))); }
CALL(umt_step_group_off_reason) { POINTER(umt_step_group_off_reason(ARG(0, s->w->group))); }
CALL(umt_step_group_destroy) { VALUE(umt_step_group_destroy(ARG(0, s->w->group))); }
CALL(umt_rng_state_get) { STATUS(umt_rng_state_get(CTX(0), ARG(1, &s->rng_state))); }
CALL(umt_rng_state_set) { STATUS(umt_rng_state_set(CTX(0), ARG(1, &s->rng_state))); }
CALL(umt_checkpoint_save) { STATUS(umt_checkpoint_save(CTX(0), OWN(1, opt), ARG(2, &s->info), ARG(3, save_path))); }
CALL(umt_checkpoint_check_writable) { STATUS(umt_checkpoint_check_writable(ARG(0, save_path))); }
CALL(umt_checkpoint_load) {
    STATUS(umt_checkpoint_load(CTX(0), OWN(1, opt), ARG(2, &s->info), ARG(3, checkpoint_path)));
}
CALL(umt_checkpoint_load_with) {
    STATUS(umt_checkpoint_load_with(CTX(0), OWN(1, opt), ARG(2, &s->info), ARG(3, checkpoint_path),
                                    ARG(4, &s->load_options)));
}
CALL(umt_dataset_load_idx) {
    STATUS(umt_dataset_load_idx(CTX(0), ARG(1, images_path), ARG(2, labels_path), 3, ARG(3, &s->dataset)));
}
CALL(umt_dataset_share) { STATUS(umt_dataset_share(CTX(0), ARG(1, s->w->ds), ARG(2, &s->dataset))); }
CALL(umt_dataset_destroy) { VALUE(umt_dataset_destroy(ARG(0, s->w->ds))); }
CALL(umt_dataset_size) { VALUE(umt_dataset_size(ARG(0, s->w->ds))); }
CALL(umt_dataset_num_classes) { VALUE(umt_dataset_num_classes(ARG(0, s->w->ds))); }
CALL(umt_dataset_sample_shape) { VALUE(umt_dataset_sample_shape(ARG(0, s->w->ds), ARG(1, s->chw))); }
CALL(umt_dataset_batch) {
    STATUS(umt_dataset_batch(CTX(0), OWN(1, ds), ARG(2, indices), 2, 0.0f, 1.0f, ARG(3, &s->tensor),
                             ARG(4, &s->tensor2)));
}
CALL(umt_dataset_batch_as) {
    STATUS(umt_dataset_batch_as(CTX(0), OWN(1, ds), ARG(2, indices), 2, 0.0f, 1.0f, UMT_F32, ARG(3, &s->tensor),
                                ARG(4, &s->tensor2)));
}
CALL(umt_images_load) {
    const char *paths[1] = {bmp_path};
    STATUS(umt_images_load(CTX(0), ARG(1, paths), 1, 1, 2, 2, UMT_INVERT_NO, 0.0f, 1.0f, ARG(2, &s->tensor)));
}
CALL(umt_permutation) { STATUS(umt_permutation(CTX(0), 4, ARG(1, s->permutation))); }
CALL(umt_samples_load_idx) {
    STATUS(umt_samples_load_idx(ARG(0, images_path), ARG(1, labels_path), 3, ARG(2, &s->samples)));
}
CALL(umt_samples_destroy) { VALUE(umt_samples_destroy(ARG(0, s->w->samples))); }
CALL(umt_samples_size) { VALUE(umt_samples_size(ARG(0, s->w->samples))); }
CALL(umt_samples_num_classes) { VALUE(umt_samples_num_classes(ARG(0, s->w->samples))); }
CALL(umt_samples_shape) { VALUE(umt_samples_shape(ARG(0, s->w->samples), ARG(1, s->chw))); }
CALL(umt_samples_class_name) { POINTER(umt_samples_class_name(ARG(0, s->w->samples), 0)); }
CALL(umt_samples_skipped) { VALUE(umt_samples_skipped(ARG(0, s->w->samples))); }
CALL(umt_samples_first_skip) { POINTER(umt_samples_first_skip(ARG(0, s->w->samples))); }
CALL(umt_image_folder_open) {
    STATUS(umt_image_folder_open(ARG(0, &s->folder_options), ARG(1, &s->samples), ARG(2, &s->samples2)));
}
CALL(umt_loader_kind_parse) { STATUS(umt_loader_kind_parse(ARG(0, "pinned"), ARG(1, &s->loader_kind))); }
CALL(umt_loader_create) {
    STATUS(umt_loader_create(CTX(0), ARG(1, s->w->samples), ARG(2, &s->loader_options), ARG(3, &s->loader)));
}
CALL(umt_loader_destroy) { VALUE(umt_loader_destroy(ARG(0, s->w->loader))); }
CALL(umt_loader_start_epoch) { STATUS(umt_loader_start_epoch(ARG(0, s->w->loader), 0, ARG(1, &s->count))); }
CALL(umt_loader_start_epoch_at) {
    STATUS(umt_loader_start_epoch_at(ARG(0, s->w->loader), 0, 1, ARG(1, &s->count)));
}
CALL(umt_loader_next) { STATUS(umt_loader_next(ARG(0, s->w->loader), ARG(1, &s->tensor), ARG(2, &s->tensor2))); }
CALL(umt_loader_take_stats) { STATUS(umt_loader_take_stats(ARG(0, s->w->loader), ARG(1, &s->loader_stats))); }
CALL(umt_loader_hold_next) { STATUS(umt_loader_hold_next(ARG(0, s->w->loader), ARG(1, &s->count))); }
CALL(umt_loader_take_held) {
    STATUS(umt_loader_take_held(ARG(0, s->w->loader), ARG(1, &s->tensor), ARG(2, &s->tensor2)));
}

/* ----------------------------------------------------------------------------------------- */
/* The table: every function of include/umtrain.h, in its order */

typedef enum { NAMED, KEPT, ACCEPTED } null_rule;

typedef struct {
    const char *name;    /* as the header names it */
    null_rule on_null;
    const char *owner;   /* belongs to a context: the argument whose context it must share; else NULL */
} argument;

#define MAX_ARGS 6

typedef struct {
    const char *function;
    void (*call)(sweep *s); /* NULL for a function without pointer arguments */
    argument args[MAX_ARGS];
} row;

#define ROW(function, ...) {#function, call_##function, {__VA_ARGS__}}
#define NO_POINTERS(function) {#function, NULL, {{0}}}
#define N(name) {name, NAMED, NULL}
#define NO(name) {name, NAMED, "ctx"}
#define K(name) {name, KEPT, "ctx"}
#define A(name) {name, ACCEPTED, NULL}
#define AO(name) {name, ACCEPTED, "ctx"}

static const row table[] = {
    NO_POINTERS(umt_last_error),
    NO_POINTERS(umt_last_status),
    NO_POINTERS(umt_status_name),
    NO_POINTERS(umt_dtype_size),
    NO_POINTERS(umt_dtype_name),
    ROW(umt_device_parse, N("name"), N("out")),
    NO_POINTERS(umt_cuda_device_count),
    NO_POINTERS(umt_default_device),
    NO_POINTERS(umt_cpu_threads),
    NO_POINTERS(umt_cpu_threads_set),
    ROW(umt_memory_mode_parse, N("name"), N("out")),
    NO_POINTERS(umt_memory_mode_name),
    ROW(umt_precision_parse, N("name"), N("out")),
    NO_POINTERS(umt_precision_name),
    NO_POINTERS(umt_precision_default),
    ROW(umt_parse_bytes, N("text"), N("out")),
    NO_POINTERS(umt_pool_name),
    NO_POINTERS(umt_context_defaults),
    ROW(umt_context_create, A("options"), N("out")),
    ROW(umt_context_destroy, A("ctx")),
    ROW(umt_context_precision, N("ctx")),
    ROW(umt_context_compute_dtype, N("ctx")),
    ROW(umt_synchronize, N("ctx")),
    ROW(umt_timer_start, N("ctx")),
    ROW(umt_timer_stop, N("ctx"), N("elapsed_ms")),
    ROW(umt_device_budget, N("ctx"), N("budget_bytes"), N("used_bytes")),
    ROW(umt_pool_stats_get, N("ctx"), N("out")),
    ROW(umt_memory_report, N("ctx")),
    NO_POINTERS(umt_plan_verdict_name),
    ROW(umt_memory_plan_make, N("ctx"), N("request"), N("forward"), A("user"), N("out")),
    ROW(umt_memory_plan_print, A("plan"), N("out")),
    ROW(umt_offload_optimizer_parse, N("name"), N("out")),
    NO_POINTERS(umt_offload_optimizer_name),
    NO_POINTERS(umt_offload_defaults),
    ROW(umt_offload_enable, N("ctx"), A("options")),
    ROW(umt_offload_adopt_plan, N("ctx"), N("plan")),
    ROW(umt_offload_stats_get, N("ctx"), N("out")),
    ROW(umt_link_measure, N("ctx"), N("out")),
    ROW(umt_offload_host_memory_measure, N("ctx"), N("out")),
    ROW(umt_host_memory_least_seconds, N("speed"), N("seconds")),
    ROW(umt_tensor_new, N("ctx"), N("shape")),
    ROW(umt_tensor_new_1d, N("ctx")),
    ROW(umt_tensor_new_2d, N("ctx")),
    ROW(umt_tensor_new_4d, N("ctx")),
    ROW(umt_tensor_free, A("t")),
    ROW(umt_tensor_ndim, N("t")),
    ROW(umt_tensor_dim, N("t")),
    ROW(umt_tensor_numel, N("t")),
    ROW(umt_tensor_dtype, N("t")),
    ROW(umt_tensor_pool, N("t")),
    ROW(umt_tensor_device, N("t")),
    ROW(umt_tensor_name, N("t")),
    ROW(umt_tensor_grad, N("t")),
    ROW(umt_tensor_copy_from_host, N("t"), N("src")),
    ROW(umt_tensor_copy_to_host, N("t"), N("dst")),
    ROW(umt_tensor_fill, N("t")),
    ROW(umt_tensor_get_f32, N("t"), N("out")),
    ROW(umt_tensor_convert, N("src"), {"dst", NAMED, "src"}),
    ROW(umt_parameter_new, N("ctx"), N("name"), N("shape")),
    ROW(umt_tensor_uniform, N("ctx"), NO("t")),
    ROW(umt_parameter_count, N("ctx")),
    ROW(umt_parameter_at, N("ctx")),
    ROW(umt_buffer_new, N("ctx"), N("name"), N("shape")),
    ROW(umt_buffer_count, N("ctx")),
    ROW(umt_buffer_at, N("ctx")),
    ROW(umt_step_begin, N("ctx")),
    ROW(umt_zero_grad, N("ctx")),
    ROW(umt_backward, N("ctx"), NO("loss")),
    ROW(umt_set_grad_enabled, N("ctx")),
    ROW(umt_set_training, N("ctx")),
    ROW(umt_set_grad_ready_hook, N("ctx"), A("fn"), A("user")),
    ROW(umt_micro_batch_begin, N("ctx")),
    ROW(umt_micro_batch_loss, N("ctx")),
    ROW(umt_matmul, N("ctx"), K("a"), K("b")),
    ROW(umt_linear, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_linear_relu, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_linear_relu_dropout, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_add, N("ctx"), K("a"), K("b")),
    ROW(umt_mul, N("ctx"), K("a"), K("b")),
    ROW(umt_relu, N("ctx"), K("x")),
    ROW(umt_reshape, N("ctx"), K("x"), N("shape")),
    ROW(umt_flatten, N("ctx"), K("x")),
    ROW(umt_flatten_linear, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_flatten_linear_relu, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_flatten_linear_relu_dropout, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_mean, N("ctx"), K("x")),
    ROW(umt_log_softmax, N("ctx"), K("x")),
    ROW(umt_nll_loss, N("ctx"), K("log_probs"), K("labels")),
    ROW(umt_softmax_cross_entropy, N("ctx"), K("logits"), K("labels")),
    ROW(umt_linear_softmax_cross_entropy, N("ctx"), K("x"), K("weight"), AO("bias"), K("labels")),
    ROW(umt_conv2d, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_conv2d_relu, N("ctx"), K("x"), K("weight"), AO("bias")),
    ROW(umt_max_pool2d, N("ctx"), K("x")),
    ROW(umt_avg_pool2d, N("ctx"), K("x")),
    ROW(umt_dropout, N("ctx"), K("x")),
    ROW(umt_max_pool2d_dropout, N("ctx"), K("x")),
    ROW(umt_bias_relu_max_pool2d_dropout, N("ctx"), K("x"), K("bias")),
    NO_POINTERS(umt_bias_relu_max_pool2d_dropout_supports),
    ROW(umt_batch_norm, N("ctx"), K("x"), K("gamma"), K("beta"), NO("running_mean"), NO("running_var")),
    ROW(umt_count_correct, N("ctx"), NO("scores"), NO("labels"), N("correct")),
    ROW(umt_linear_layer_new, N("ctx"), N("name")),
    ROW(umt_conv2d_layer_new, N("ctx"), N("name")),
    ROW(umt_batchnorm_layer_new, N("ctx"), N("name")),
    ROW(umt_layer_forward, N("ctx"), NO("layer"), K("x")),
    ROW(umt_layer_forward_relu, N("ctx"), NO("layer"), K("x")),
    ROW(umt_layer_forward_flatten_relu, N("ctx"), NO("layer"), K("x")),
    ROW(umt_layer_forward_flatten_relu_dropout, N("ctx"), NO("layer"), K("x")),
    ROW(umt_layer_softmax_cross_entropy, N("ctx"), NO("layer"), K("x"), K("labels")),
    ROW(umt_layer_forward_relu_max_pool2d_dropout, N("ctx"), NO("layer"), K("x")),
    ROW(umt_nonfinite_policy_parse, N("name"), N("out")),
    NO_POINTERS(umt_nonfinite_policy_name),
    NO_POINTERS(umt_optimizer_defaults),
    ROW(umt_optimizer_kind_parse, N("name"), N("out")),
    ROW(umt_optimizer_create, N("ctx"), N("options"), N("out")),
    ROW(umt_optimizer_step, N("opt")),
    ROW(umt_backward_scaled, N("ctx"), NO("loss"), NO("opt")),
    ROW(umt_optimizer_skipped_steps, N("opt")),
    ROW(umt_optimizer_loss_scale, N("opt")),
    ROW(umt_optimizer_set_lr, N("opt")),
    ROW(umt_optimizer_lr, N("opt")),
    ROW(umt_optimizer_nonfinite_found, N("opt")),
    ROW(umt_optimizer_nonfinite_get, N("opt"), N("out")),
    ROW(umt_optimizer_steps, N("opt")),
    ROW(umt_optimizer_destroy, A("opt")),
    ROW(umt_step_graph_create, N("ctx"), N("out")),
    ROW(umt_step_graph_run, N("graph"), N("step"), A("user"), N("input")),
    ROW(umt_step_graph_loss, N("graph")),
    ROW(umt_step_graph_take_mean_loss, N("graph"), N("mean"), N("steps")),
    ROW(umt_step_graph_stats_get, N("graph")),
    ROW(umt_step_graph_off_reason, N("graph")),
    ROW(umt_step_graph_destroy, A("graph")),
    ROW(umt_step_group_create, N("graphs"), N("out")),
    ROW(umt_step_group_run, N("group"), N("step"), N("users"), N("inputs"), N("input_bytes")),
    ROW(umt_step_group_stats_get, N("group")),
    ROW(umt_step_group_off_reason, N("group")),
    ROW(umt_step_group_destroy, A("group")),
    NO_POINTERS(umt_lr_step),
    NO_POINTERS(umt_lr_cosine),
    ROW(umt_rng_state_get, N("ctx"), N("out")),
    ROW(umt_rng_state_set, N("ctx"), N("state")),
    ROW(umt_checkpoint_save, N("ctx"), AO("opt"), A("info"), N("path")),
    ROW(umt_checkpoint_check_writable, N("path")),
    ROW(umt_checkpoint_load, N("ctx"), AO("opt"), A("info"), N("path")),
    ROW(umt_checkpoint_load_with, N("ctx"), AO("opt"), A("info"), N("path"), A("options")),
    ROW(umt_dataset_load_idx, N("ctx"), N("images_path"), N("labels_path"), N("out")),
    ROW(umt_dataset_share, N("ctx"), N("source"), N("out")),
    ROW(umt_dataset_destroy, A("ds")),
    ROW(umt_dataset_size, N("ds")),
    ROW(umt_dataset_num_classes, N("ds")),
    ROW(umt_dataset_sample_shape, N("ds"), N("chw")),
    ROW(umt_dataset_batch, N("ctx"), NO("ds"), N("indices"), N("images"), N("labels")),
    ROW(umt_dataset_batch_as, N("ctx"), NO("ds"), N("indices"), N("images"), N("labels")),
    ROW(umt_images_load, N("ctx"), N("paths"), N("out")),
    ROW(umt_permutation, N("ctx"), N("out")),
    ROW(umt_samples_load_idx, N("images_path"), N("labels_path"), N("out")),
    ROW(umt_samples_destroy, A("samples")),
    ROW(umt_samples_size, N("samples")),
    ROW(umt_samples_num_classes, N("samples")),
    ROW(umt_samples_shape, N("samples"), N("chw")),
    ROW(umt_samples_class_name, N("samples")),
    ROW(umt_samples_skipped, N("samples")),
    ROW(umt_samples_first_skip, N("samples")),
    ROW(umt_image_folder_open, N("options"), N("train"), A("test")),
    ROW(umt_loader_kind_parse, N("name"), N("out")),
    NO_POINTERS(umt_loader_defaults),
    ROW(umt_loader_create, N("ctx"), N("samples"), N("options"), N("out")),
    ROW(umt_loader_destroy, A("loader")),
    ROW(umt_loader_start_epoch, N("loader"), A("batches")),
    ROW(umt_loader_start_epoch_at, N("loader"), A("batches")),
    ROW(umt_loader_next, N("loader"), N("images"), N("labels")),
    ROW(umt_loader_take_stats, N("loader"), N("out")),
    ROW(umt_loader_hold_next, N("loader"), N("count")),
    ROW(umt_loader_take_held, N("loader"), N("images"), N("labels")),
};

#define ROWS ((int)(sizeof table / sizeof table[0]))

static int argument_count(const row *r) {
    int n = 0;
    while (n < MAX_ARGS && r->args[n].name) ++n;
    return n;
}

/* ----------------------------------------------------------------------------------------- */
/* Running one case in a child */

/* The inputs a call reads that are not objects of a context. */
static void sweep_inputs(sweep *s) {
    s->context_options = umt_context_defaults();
    s->context_options.device = UMT_DEVICE_CPU;
    s->offload_options = umt_offload_defaults();
    s->optimizer_options = umt_optimizer_defaults(UMT_OPT_SGD);
    s->folder_options = (umt_image_folder_options){.root = folder_path, .channels = 1, .height = 2, .width = 2};
    s->loader_options = umt_loader_defaults();
    s->loader_options.batch_size = 2;
    s->rng_state.s[0] = 1;
}

static bool starts_with(const char *text, const char *prefix) { return strncmp(text, prefix, strlen(prefix)) == 0; }

/* Whether the call did what the case expects; if not, says why on stderr. */
static bool verdict(const row *r, const argument *a, bool foreign, const sweep *s, const char *before) {
    const char *message = umt_last_error();
    char expected[1280], prefix[80], phrase[160];
    snprintf(prefix, sizeof prefix, "%s:", r->function);
    bool refused = s->returns == RETURNS_STATUS ? s->status != UMT_OK
                   : s->returns == RETURNS_POINTER ? s->pointer == NULL
                                                  : true;
    bool ok;
    if (foreign || a->on_null == NAMED) {
        if (foreign) snprintf(phrase, sizeof phrase, "%s belongs to another context than %s", a->name, a->owner);
        else snprintf(phrase, sizeof phrase, "%s is NULL", a->name);
        snprintf(expected, sizeof expected, "a refusal \"%s ... %s\"", prefix, phrase);
        ok = refused && starts_with(message, prefix) && strstr(message, phrase) &&
             umt_last_status() == UMT_ERR_INVALID_ARGUMENT;
    } else if (a->on_null == KEPT) {
        snprintf(expected, sizeof expected, "NULL back and the message before kept (\"%s\")", before);
        ok = s->pointer == NULL && strcmp(message, before) == 0;
    } else {
        snprintf(phrase, sizeof phrase, "%s is NULL", a->name);
        snprintf(expected, sizeof expected, "no \"%s\"", phrase);
        ok = !strstr(message, phrase);
    }
    if (!ok)
        fprintf(stderr, "  %s, %s %s: expected %s; got %s\"%s\"\n", r->function, a->name,
                foreign ? "of another context" : "NULL", expected, refused ? "" : "no refusal and ", message);
    return ok;
}

static int child(const row *r, int which, bool foreign) {
    /* cmocka's handlers would catch a crash and run the remaining tests in this child: a crash
     * must end it, for the parent to see. A hang is a failure too (SIGALRM). */
    int crashes[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (int i = 0; i < 5; ++i) signal(crashes[i], SIG_DFL);
    alarm(30);
    static world mine, other;
    if (!world_build(&mine) || (foreign && !world_build(&other))) {
        fprintf(stderr, "  %s: the fixture failed: %s\n", r->function, umt_last_error());
        return 2;
    }
    static sweep s;
    s = (sweep){.w = &mine, .other = &other, .which = which, .foreign = foreign};
    sweep_inputs(&s);
    umt_device device;
    umt_device_parse("an earlier failure", &device); /* the message a KEPT case must leave alone */
    char before[1024];
    snprintf(before, sizeof before, "%s", umt_last_error());
    r->call(&s);
    return verdict(r, &r->args[which], foreign, &s, before) ? 0 : 1;
}

/* Runs one case in a child process; false (and why on stderr) when it failed. */
static bool run_case(const row *r, int which, bool foreign) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) _exit(child(r, which, foreign));
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return false;
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "  %s, %s %s: killed by signal %d (%s)\n", r->function, r->args[which].name,
                foreign ? "of another context" : "NULL", WTERMSIG(status), strsignal(WTERMSIG(status)));
        return false;
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static const row *row_of(const char *function) {
    for (int i = 0; i < ROWS; ++i)
        if (strcmp(table[i].function, function) == 0) return &table[i];
    return NULL;
}

/* ----------------------------------------------------------------------------------------- */
/* The tests */

static void test_every_function_of_the_header_has_a_row(void **state) {
    (void)state;
    static char names[UMT_HEADER_MAX_FUNCTIONS][64];
    int count = umt_header_functions(header_path, names);
    if (count < 0) fail_msg("cannot read %s", header_path);
    assert_true(count > 100); /* the parser found the API, not a fragment of it */
    int missing = 0, stale = 0;
    for (int i = 0; i < count; ++i)
        if (!row_of(names[i])) fprintf(stderr, "  %s is declared in umtrain.h but has no row\n", names[i]), ++missing;
    for (int r = 0; r < ROWS; ++r) {
        bool declared = false;
        for (int i = 0; i < count && !declared; ++i) declared = strcmp(names[i], table[r].function) == 0;
        if (!declared) fprintf(stderr, "  row %s: umtrain.h declares no such function\n", table[r].function), ++stale;
    }
    printf("umtrain.h declares %d functions; the table has %d rows\n", count, ROWS);
    assert_int_equal(missing, 0);
    assert_int_equal(stale, 0);
    assert_int_equal(count, ROWS);
}

static void sweep_all(bool foreign) {
    int cases = 0, failed = 0;
    for (int r = 0; r < ROWS; ++r)
        for (int a = 0; a < argument_count(&table[r]); ++a) {
            if (foreign && !table[r].args[a].owner) continue;
            cases++;
            if (!run_case(&table[r], a, foreign)) failed++;
        }
    printf("%d cases %s, %d failed\n", cases, foreign ? "of another context's objects" : "of NULL arguments", failed);
    assert_int_equal(failed, 0);
}

static void test_null_arguments_are_refused_by_name_or_mean_something(void **state) {
    (void)state;
    sweep_all(false);
}

static void test_objects_of_another_context_are_refused_naming_both(void **state) {
    (void)state;
    sweep_all(true);
}

/* ----------------------------------------------------------------------------------------- */
/* The files the fixture reads, written once */

static int write_file(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t written = fwrite(bytes, 1, size, f);
    return fclose(f) == 0 && written == size ? 0 : -1;
}

/* A 2x2 24-bit BMP, grey. */
static int write_bmp(const char *path) {
    uint8_t b[70] = {'B', 'M', 70, 0, 0, 0, 0, 0, 0, 0, 54, 0, 0, 0, 40, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 1, 0, 24};
    for (int i = 54; i < 70; ++i) b[i] = (uint8_t)(i * 9);
    return write_file(path, b, sizeof b);
}

/* Four 2x2 images of three classes. */
static int write_idx(void) {
    uint8_t images[4 + 12 + 16] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 2};
    for (int i = 16; i < 32; ++i) images[i] = (uint8_t)(i * 7);
    uint8_t labels[8 + 4] = {0, 0, 8, 1, 0, 0, 0, 4, 0, 1, 2, 1};
    return write_file(images_path, images, sizeof images) | write_file(labels_path, labels, sizeof labels);
}

static int write_folder(void) {
    char path[192];
    if (mkdir(folder_path, 0755) != 0) return -1;
    const char *classes[] = {"zero", "one"};
    for (int c = 0; c < 2; ++c) {
        snprintf(path, sizeof path, "%s/%s", folder_path, classes[c]);
        if (mkdir(path, 0755) != 0) return -1;
        snprintf(path, sizeof path, "%s/%s/a.bmp", folder_path, classes[c]);
        if (write_bmp(path) != 0) return -1;
    }
    return 0;
}

/* A checkpoint of the fixture's model, which umt_checkpoint_load reads. */
static int write_checkpoint(void) {
    world w;
    bool ok = world_build(&w) && umt_checkpoint_save(w.ctx, w.opt, NULL, checkpoint_path) == UMT_OK;
    if (!ok) fprintf(stderr, "the fixture: %s\n", umt_last_error());
    world_destroy(&w);
    return ok ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/umt_api_sweep_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(images_path, sizeof images_path, "%s/images-idx3-ubyte", dir);
    snprintf(labels_path, sizeof labels_path, "%s/labels-idx1-ubyte", dir);
    snprintf(bmp_path, sizeof bmp_path, "%s/digit.bmp", dir);
    snprintf(folder_path, sizeof folder_path, "%s/folder", dir);
    snprintf(checkpoint_path, sizeof checkpoint_path, "%s/model.ckpt", dir);
    snprintf(save_path, sizeof save_path, "%s/saved.ckpt", dir);
    return write_idx() | write_bmp(bmp_path) | write_folder() | write_checkpoint();
}

static int remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return remove(path);
    struct dirent *e;
    char child_path[512];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(child_path, sizeof child_path, "%s/%s", path, e->d_name);
            remove_tree(child_path);
        }
    closedir(d);
    return rmdir(path);
}

static int teardown(void **state) {
    (void)state;
    return remove_tree(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/umtrain.h\n", argv[0]);
        return 2;
    }
    header_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_function_of_the_header_has_a_row),
        cmocka_unit_test(test_null_arguments_are_refused_by_name_or_mean_something),
        cmocka_unit_test(test_objects_of_another_context_are_refused_naming_both),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
