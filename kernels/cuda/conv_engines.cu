/*
 * kernels/cuda/conv_engines.cu — half-precision convolutions through cuDNN's graph API, each
 * direction's engine timed on its first run.
 *
 * cuDNN has two front doors. The legacy calls (cudnnConvolutionForward and its two backwards,
 * conv.cu's f32 path) choose among a fixed list of algorithms. The graph API (cudnnBackend*)
 * describes the same convolution as a graph of one operation and reaches every engine cuDNN
 * has, Hopper's own kernels among them; for the MNIST CNN's second convolution in bf16 its
 * engines are the faster ones (docs/PERF.md).
 *
 * Making a direction's set of engines:
 *   1. descriptors: x, w, y as N,H,W,C tensors (w as K,R,S,C), the convolution (sums in f32),
 *      the operation (forward, backward data or backward filter, with its alpha and beta) and
 *      the graph that holds it; they live as long as the set;
 *   2. candidates: for a timed set whose engine the cache remembers (below), that engine alone,
 *      rebuilt from its identity without asking any heuristic; otherwise the RANKED
 *      configurations that cuDNN's instant heuristic (mode A) ranks first (the fallback
 *      heuristic's when it offers none), kept when deterministic (no
 *      NONDETERMINISTIC note, as every kernel of this folder), compiled ahead of time (run-time
 *      compilation costs seconds), within the workspace limit, and not the same engine as one
 *      kept already. The first that cuDNN can build as an execution plan is built at once, so
 *      that a shape no engine takes fails here; the others are built only if they are timed.
 *
 * Mode A's order is a guess, and a poor one for the backward directions: its first
 * weight-gradient engine can be much slower than the fastest on its list. So a
 * timed set's first run times the first candidate on the call's own tensors and, if one run
 * of it takes WORTH_TIMING_US or more, every other one; it keeps the fastest and releases the
 * rest. Below that, the search (milliseconds per candidate, most of it loading kernels) costs
 * more than a training run can win back. Timing makes the host wait for the GPU, so a first
 * run inside a CUDA graph capture takes the first candidate, as an untimed set does.
 *
 * A set worth timing also times mode B's ranking, cuDNN's other one: at batch 4096 its 13th
 * forward and 22nd data-gradient engines beat all of mode A's, though its own first ones are
 * slower at smaller batches (docs/PERF.md). Its query takes tens of times longer than mode A's
 * (a second or so for a run's sets), so it is asked only when timing is worth it, and only where
 * the cache (below) has no choice yet. Its candidates must fit the workspace the set already
 * reported, which the memory plan has counted.
 *
 * Close timings may pick different engines in two runs of a program, and two engines may round
 * f32 sums differently: UMT_CONV_TIMING=0 takes the heuristic's first everywhere, for runs that
 * must match bit for bit. UMT_CONV_TIMING=all times every candidate whatever the first one's
 * time (the GPU tests use it to run every engine).
 *
 * A timed choice is remembered on disk (kernels/engine_cache.h says where, and why that is safe)
 * as the engine's identity, its global index and knobs: a set made later, in this process or
 * another, whose key (the GPU, its driver, cuDNN, the shape, the direction and the workspace
 * limit) has an entry builds that engine at once, without asking either heuristic or timing.
 * That saves a run's start the queries and the timing, and repeats the first run's engines, and
 * so its bits. UMT_CONV_TIMING=all leaves the file alone: it times every candidate every time.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/cuda_check.h"
#include "core/base/error.h"
#include "kernels/cuda/conv_engine_identity.h"
#include "kernels/cuda/conv_engines.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/engine_cache.h"

/* RANKED configurations asked of each heuristic; a set holds both rankings' at most. */
enum { RANKED = 24, MAX_CANDIDATES = 2 * RANKED, TIMED_RUNS = 8 };
static const float WORTH_TIMING_US = 50.0f;
/* The byte alignment the engines may assume of every tensor (16-byte vector loads); the pools
 * align each allocation to 256 bytes. */
enum { TENSOR_ALIGNMENT = 16 };
/* The tensors' ids in the graph and in each run's variant pack. */
enum { UID_X = 1, UID_W, UID_Y };
/* The descriptors a set's graph is built from. */
enum { X, W, Y, CONVOLUTION, OPERATION, GRAPH, DESCRIPTORS };

/* cuDNN 9.19's headers (this machine's) deprecate the handle attributes of graphs and plans in
 * favour of device-property descriptors; cuDNN 9.14 on the GPU machine runs with these. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static const cudnnBackendAttributeName_t GRAPH_HANDLE = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
static const cudnnBackendAttributeName_t PLAN_HANDLE = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

typedef struct {
    cudnnBackendDescriptor_t config;
    cudnnBackendDescriptor_t plan; /* NULL until built */
    size_t workspace_bytes;        /* the configuration's */
    umt_engine_identity engine;    /* which engine it is: its global index and knobs */
    /* A configuration made from a remembered identity owns the engine and knob descriptors it
     * was made of (a heuristic's configurations come whole). */
    cudnnBackendDescriptor_t parts[1 + UMT_ENGINE_MOST_KNOBS];
    int part_count;
} candidate;

struct umt_conv_engines {
    cudnnHandle_t handle;
    float worth_timing_us; /* a first candidate quicker than this is kept without timing the rest */
    cudnnBackendDescriptor_t graph[DESCRIPTORS];
    candidate candidates[MAX_CANDIDATES];
    int count; /* 1 once chosen: candidates[0] is then the engine every run uses */
    bool to_choose; /* a timed set whose first run has not chosen yet (its only candidate too: mode B may add more) */
    size_t workspace_bytes; /* what the set reported it needs: mode B's candidates must fit it */
    /* The last run's variant pack (its tensors' addresses): a replayed step reuses it. */
    cudnnBackendDescriptor_t pack;
    const void *pack_pointers[4];
    char cache_key[UMT_ENGINE_KEY_BYTES]; /* "" when the choice is not remembered */
};

/* Each direction's operation and the attribute names of its three tensors. */
typedef struct {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, convolution, alpha, beta;
} operation_names;

static const operation_names OPERATIONS[3] = {
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
    {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
};

static const char *const DIRECTION_NAMES[3] = {"forward", "backward data", "backward filter"};

/* ------------------------------------------------------------------------------------------ */
/* The graph                                                                                   */

/* Dimensions are always given N,C,H,W; the strides say the memory is N,H,W,C. */
static umt_status tensor(cudnnBackendDescriptor_t *d, int64_t uid, cudnnDataType_t type, int64_t n, int64_t c,
                         int64_t h, int64_t w) {
    const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c}, alignment = TENSOR_ALIGNMENT;
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, d));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
    UMT_CUDNN_TRY(cudnnBackendFinalize(*d));
    return UMT_OK;
}

static umt_status convolution(cudnnBackendDescriptor_t *d, const umt_conv_shape *s) {
    const cudnnDataType_t sums = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2, dilations[2] = {1, 1}, strides[2] = {s->stride, s->stride}, pads[2] = {s->pad, s->pad};
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, d));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &sums));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads));
    UMT_CUDNN_TRY(cudnnBackendFinalize(*d));
    return UMT_OK;
}

/* output = alpha * convolution + beta * output, alpha 1. */
static umt_status operation(umt_conv_engines *e, umt_conv_direction direction, bool accumulate) {
    const operation_names *names = &OPERATIONS[direction];
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const cudnnBackendAttributeType_t described = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    cudnnBackendDescriptor_t *op = &e->graph[OPERATION];
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(names->type, op));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->x, described, 1, &e->graph[X]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->w, described, 1, &e->graph[W]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->y, described, 1, &e->graph[Y]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->convolution, described, 1, &e->graph[CONVOLUTION]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*op, names->beta, CUDNN_TYPE_FLOAT, 1, &beta));
    UMT_CUDNN_TRY(cudnnBackendFinalize(*op));
    return UMT_OK;
}

static umt_status describe(umt_conv_engines *e, const umt_conv_shape *s, umt_conv_direction direction,
                           bool accumulate) {
    const cudnnDataType_t type = s->dtype == UMT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    UMT_TRY(tensor(&e->graph[X], UID_X, type, s->n, s->c, s->h, s->w));
    UMT_TRY(tensor(&e->graph[W], UID_W, type, s->k, s->c, s->r, s->s));
    UMT_TRY(tensor(&e->graph[Y], UID_Y, type, s->n, s->k, s->p, s->q));
    UMT_TRY(convolution(&e->graph[CONVOLUTION], s));
    UMT_TRY(operation(e, direction, accumulate));
    cudnnBackendDescriptor_t *graph = &e->graph[GRAPH];
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                           &e->graph[OPERATION]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*graph, GRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &e->handle));
    UMT_CUDNN_TRY(cudnnBackendFinalize(*graph));
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Candidates                                                                                  */

static void release_candidate(candidate *c) {
    if (c->plan) cudnnBackendDestroyDescriptor(c->plan);
    if (c->config) cudnnBackendDestroyDescriptor(c->config);
    for (int i = c->part_count - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(c->parts[i]);
    memset(c, 0, sizeof *c);
}


/* Whether a configuration's engine may be used: deterministic and compiled ahead of time. */
static umt_status usable(cudnnBackendDescriptor_t config, bool *ok) {
    cudnnBackendDescriptor_t engine;
    cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t count = 0, numerical_count = 0, behavior_count = 0;
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine));
    cudnnStatus_t status = cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                          CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &numerical_count, numerical);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                          CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &behavior_count, behavior);
    cudnnBackendDestroyDescriptor(engine);
    if (status != CUDNN_STATUS_SUCCESS)
        return umt_fail(UMT_ERR_DEVICE, "conv2d: reading a cuDNN engine's notes: %s", cudnnGetErrorString(status));
    *ok = true;
    for (int64_t i = 0; i < numerical_count && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
        if (numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) *ok = false;
    for (int64_t i = 0; i < behavior_count && i < CUDNN_BEHAVIOR_NOTE_TYPE_COUNT; i++)
        if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) *ok = false;
    return UMT_OK;
}

/* Takes config (the set owns it from here) as the next candidate if it is usable and its
 * workspace fits; otherwise lets it go. */
static umt_status consider(umt_conv_engines *e, cudnnBackendDescriptor_t config, size_t max_workspace) {
    candidate *c = &e->candidates[e->count];
    c->config = config;
    bool ok = false;
    umt_status status = usable(config, &ok);
    if (status == UMT_OK) status = umt_cuda_engine_identity_of(config, &c->engine);
    if (status != UMT_OK) {
        release_candidate(c);
        return status;
    }
    for (int i = 0; i < e->count && ok; i++) /* the other ranking's, or a remembered one's, already */
        ok = !umt_engine_identity_equal(&e->candidates[i].engine, &c->engine);
    int64_t bytes = -1, count = 0;
    ok = ok &&
         cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &bytes) ==
             CUDNN_STATUS_SUCCESS &&
         bytes >= 0 && (size_t)bytes <= max_workspace;
    c->workspace_bytes = (size_t)bytes;
    if (ok)
        e->count++;
    else
        release_candidate(c);
    return UMT_OK;
}

/* Builds candidate c's execution plan; *built is false when cuDNN cannot build it for this
 * graph, or the plan wants more workspace than its configuration said (the buffer's size). */
static umt_status build(umt_conv_engines *e, candidate *c, bool *built) {
    *built = c->plan != NULL;
    if (*built) return UMT_OK;
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &c->plan));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(c->plan, PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &e->handle));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(c->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->config));
    int64_t bytes = -1, count = 0;
    *built = cudnnBackendFinalize(c->plan) == CUDNN_STATUS_SUCCESS &&
             cudnnBackendGetAttribute(c->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                      &count, &bytes) == CUDNN_STATUS_SUCCESS &&
             bytes >= 0 && (size_t)bytes <= c->workspace_bytes;
    if (!*built) {
        cudnnBackendDestroyDescriptor(c->plan);
        c->plan = NULL;
    }
    return UMT_OK;
}

/* Drops candidates from the front until the first one builds (none left: the shape has no engine). */
static umt_status build_first(umt_conv_engines *e) {
    bool built = false;
    while (e->count > 0) {
        UMT_TRY(build(e, &e->candidates[0], &built));
        if (built) return UMT_OK;
        release_candidate(&e->candidates[0]);
        memmove(&e->candidates[0], &e->candidates[1], (size_t)(e->count - 1) * sizeof(candidate));
        memset(&e->candidates[--e->count], 0, sizeof(candidate));
    }
    return UMT_OK;
}

/* The configurations heuristic `mode` ranks first (at most RANKED), in its order; none when the
 * mode does not take this graph. */
static umt_status rank(umt_conv_engines *e, cudnnBackendHeurMode_t mode, cudnnBackendDescriptor_t *heuristic,
                       cudnnBackendDescriptor_t *configs, int64_t *count) {
    *count = 0;
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, heuristic));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*heuristic, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e->graph[GRAPH]));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(*heuristic, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    if (cudnnBackendFinalize(*heuristic) != CUDNN_STATUS_SUCCESS) return UMT_OK;
    for (int i = 0; i < RANKED; i++)
        UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &configs[i]));
    UMT_CUDNN_TRY(cudnnBackendGetAttribute(*heuristic, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           RANKED, count, configs));
    if (*count > RANKED) *count = RANKED;
    return UMT_OK;
}

/* Considers heuristic `mode`'s ranking in order. */
static umt_status add_ranked(umt_conv_engines *e, cudnnBackendHeurMode_t mode, size_t max_workspace) {
    cudnnBackendDescriptor_t heuristic = NULL, configs[RANKED] = {NULL};
    int64_t count = 0;
    umt_status status = rank(e, mode, &heuristic, configs, &count);
    for (int64_t i = 0; i < count && status == UMT_OK && e->count < MAX_CANDIDATES; i++) {
        status = consider(e, configs[i], max_workspace);
        configs[i] = NULL;
    }
    for (int i = 0; i < RANKED; i++)
        if (configs[i]) cudnnBackendDestroyDescriptor(configs[i]);
    if (heuristic) cudnnBackendDestroyDescriptor(heuristic);
    return status;
}

/* Keeps candidate i as the set's engine, candidates[0], and releases the others. */
static void keep(umt_conv_engines *e, int i) {
    candidate kept = e->candidates[i];
    memset(&e->candidates[i], 0, sizeof kept);
    for (int j = 0; j < e->count; j++) release_candidate(&e->candidates[j]);
    e->candidates[0] = kept;
    e->count = 1;
}

/* UMT_CONV_TIMING: "0" no timing, "all" every candidate, otherwise when worth it. */
static const char *timing_setting(void) {
    const char *setting = getenv("UMT_CONV_TIMING");
    return setting ? setting : "";
}

static umt_status no_engine(umt_conv_direction direction, const umt_conv_shape *s, size_t max_workspace) {
    return umt_fail(UMT_ERR_UNSUPPORTED,
                    "conv2d: cuDNN offers no deterministic %s %s engine within %zu MiB of workspace for n=%lld "
                    "c=%lld h=%lld w=%lld k=%lld r=%lld s=%lld stride=%lld pad=%lld",
                    umt_dtype_name(s->dtype), DIRECTION_NAMES[direction], max_workspace >> 20, (long long)s->n,
                    (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k, (long long)s->r,
                    (long long)s->s, (long long)s->stride, (long long)s->pad);
}

/* ------------------------------------------------------------------------------------------ */
/* The engine cache (kernels/engine_cache.h)                                                   */


/* The key of a timed set: everything that decides which engines can run it, '/'-separated,
 * without spaces. False when the GPU cannot be asked or the key does not fit. */
static bool cache_key(const umt_conv_shape *s, umt_conv_direction direction, bool accumulate, size_t max_workspace,
                      char *key, size_t bytes) {
    char gpu[160];
    if (!umt_cuda_gpu_identity(gpu, sizeof gpu)) return false;
    static const char *const names[3] = {"forward", "data", "filter"};
    int n = snprintf(key, bytes,
                     "v2/%s/%s/%s%s/n%lld.c%lld.h%lld.w%lld.k%lld.r%lld.s%lld.stride%lld.pad%lld/workspace%zu",
                     gpu, umt_dtype_name(s->dtype), names[direction], accumulate ? "-added" : "",
                     (long long)s->n, (long long)s->c, (long long)s->h, (long long)s->w, (long long)s->k,
                     (long long)s->r, (long long)s->s, (long long)s->stride, (long long)s->pad, max_workspace);
    return n > 0 && (size_t)n < bytes;
}


/* The engine remembered for e's key in the cache at path, as the set's only candidate, when it
 * is there, this cuDNN makes it, and it passes what every candidate must (deterministic, compiled
 * ahead of time, within the workspace limit) and builds: true if so. Nothing is asked of the
 * heuristics. */
static umt_status take_remembered(umt_conv_engines *e, const char *path, size_t max_workspace, bool *taken) {
    *taken = false;
    umt_engine_identity id;
    if (!e->cache_key[0] || !umt_engine_cache_find(path, e->cache_key, &id)) return UMT_OK;
    /* Made into the first candidate's place, which keeps the engine and knob descriptors it is
     * made of: consider() takes the configuration there, and releases all of it if it refuses. */
    candidate *c = &e->candidates[0];
    cudnnBackendDescriptor_t config = umt_cuda_engine_config_of(e->graph[GRAPH], &id, c->parts, &c->part_count);
    umt_status status = config ? consider(e, config, max_workspace) : UMT_OK;
    bool built = false;
    if (status == UMT_OK && e->count == 1) status = build(e, c, &built);
    *taken = status == UMT_OK && built;
    if (*taken) return UMT_OK;
    /* Passed over, whatever went wrong: a cache is advice, and the heuristics are asked instead. */
    release_candidate(c);
    e->count = 0;
    return UMT_OK;
}

/* Remembers a timed choice. A cache that cannot be written costs only the next run's timing:
 * said once a process, and the run goes on. */
static void remember(const umt_conv_engines *e, int index) {
    char path[4096];
    if (!e->cache_key[0] || !umt_engine_cache_path(path, sizeof path)) return;
    if (umt_engine_cache_add(path, e->cache_key, &e->candidates[index].engine) == UMT_OK) return;
    static int said = 0;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED) == 0)
        fprintf(stderr, "umtrain: cuDNN's engine choices are not remembered: %s (UMT_CONV_CACHE=0 turns the cache "
                        "off)\n", umt_last_error());
}

/* Mode A's candidates (the fallback heuristic's when it offers none), the first of them built. */
static umt_status add_first_ranking(umt_conv_engines *e, const umt_conv_shape *s, umt_conv_direction direction,
                                    size_t max_workspace) {
    UMT_TRY(add_ranked(e, CUDNN_HEUR_MODE_A, max_workspace));
    UMT_TRY(build_first(e));
    if (e->count == 0) UMT_TRY(add_ranked(e, CUDNN_HEUR_MODE_FALLBACK, max_workspace));
    UMT_TRY(build_first(e));
    return e->count == 0 ? no_engine(direction, s, max_workspace) : UMT_OK;
}

umt_status umt_cuda_conv_engines_make(cudnnHandle_t handle, const umt_conv_shape *s, umt_conv_direction direction,
                                      bool accumulate, bool timed, size_t max_workspace, umt_conv_engines **out,
                                      size_t *workspace_bytes) {
    umt_conv_engines *e = (umt_conv_engines *)calloc(1, sizeof *e);
    if (!e) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "conv2d: no host memory for a set of cuDNN engines");
    e->handle = handle;
    timed = timed && strcmp(timing_setting(), "0") != 0;
    e->worth_timing_us = strcmp(timing_setting(), "all") == 0 ? 0.0f : WORTH_TIMING_US;
    umt_status status = describe(e, s, direction, accumulate);
    /* A timed set's remembered engine first: then no heuristic is asked. */
    bool remembered = false;
    char path[4096];
    if (status == UMT_OK && timed && strcmp(timing_setting(), "all") != 0 && umt_engine_cache_path(path, sizeof path)) {
        if (cache_key(s, direction, accumulate, max_workspace, e->cache_key, sizeof e->cache_key))
            status = take_remembered(e, path, max_workspace, &remembered);
        else
            e->cache_key[0] = '\0';
    }
    if (remembered || !timed) e->cache_key[0] = '\0'; /* nothing to time, nothing to remember */
    e->to_choose = timed && !remembered;
    if (status == UMT_OK && !remembered) status = add_first_ranking(e, s, direction, max_workspace);
    if (status == UMT_OK && !timed) keep(e, 0);
    if (status != UMT_OK) {
        umt_cuda_conv_engines_free(e);
        return status;
    }
    e->workspace_bytes = 0;
    for (int i = 0; i < e->count; i++)
        if (e->candidates[i].workspace_bytes > e->workspace_bytes) e->workspace_bytes = e->candidates[i].workspace_bytes;
    *workspace_bytes = e->workspace_bytes;
    *out = e;
    return UMT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Runs                                                                                        */

/* The variant pack for these addresses: the last one when they are the same. */
static umt_status pack_for(umt_conv_engines *e, const void *const pointers[4]) {
    if (e->pack && memcmp(e->pack_pointers, pointers, sizeof e->pack_pointers) == 0) return UMT_OK;
    if (e->pack) cudnnBackendDestroyDescriptor(e->pack);
    e->pack = NULL;
    const int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *data[3] = {(void *)pointers[0], (void *)pointers[1], (void *)pointers[2]}, *workspace = (void *)pointers[3];
    UMT_CUDNN_TRY(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &e->pack));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3,
                                           data));
    UMT_CUDNN_TRY(cudnnBackendSetAttribute(e->pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                           &workspace));
    UMT_CUDNN_TRY(cudnnBackendFinalize(e->pack));
    memcpy(e->pack_pointers, pointers, sizeof e->pack_pointers);
    return UMT_OK;
}

/* Candidate i's time for one run (the mean of TIMED_RUNS, after one to warm it up); INFINITY
 * when cuDNN will not build or run it on these tensors after all. */
static umt_status time_candidate(umt_conv_engines *e, int i, cudaEvent_t start, cudaEvent_t stop, float *us) {
    *us = INFINITY;
    bool built;
    UMT_TRY(build(e, &e->candidates[i], &built));
    if (!built) return UMT_OK;
    cudnnBackendDescriptor_t plan = e->candidates[i].plan;
    if (cudnnBackendExecute(e->handle, plan, e->pack) != CUDNN_STATUS_SUCCESS) return UMT_OK;
    UMT_CUDA_TRY(cudaEventRecord(start, umt_cuda_stream()));
    for (int run = 0; run < TIMED_RUNS; run++) UMT_CUDNN_TRY(cudnnBackendExecute(e->handle, plan, e->pack));
    UMT_CUDA_TRY(cudaEventRecord(stop, umt_cuda_stream()));
    UMT_CUDA_TRY(cudaEventSynchronize(stop));
    float ms = 0.0f;
    UMT_CUDA_TRY(cudaEventElapsedTime(&ms, start, stop));
    *us = ms * 1000.0f / TIMED_RUNS;
    return UMT_OK;
}

/* The fastest candidate; the first without timing the others when it is quick already. */
static umt_status fastest(umt_conv_engines *e, int *best) {
    cudaEvent_t start = NULL, stop = NULL;
    umt_status status = UMT_OK;
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess)
        status = umt_fail(UMT_ERR_DEVICE, "conv2d: no CUDA events to time cuDNN's engines");
    float best_us = INFINITY;
    for (int i = 0; i < e->count && status == UMT_OK; i++) {
        float us;
        status = time_candidate(e, i, start, stop, &us);
        if (status == UMT_OK && us < best_us) {
            best_us = us;
            *best = i;
        }
        if (i == 0 && best_us < e->worth_timing_us) break;
        /* Worth timing: mode B's candidates too, within the workspace the set reported. */
        if (i == 0 && status == UMT_OK) status = add_ranked(e, CUDNN_HEUR_MODE_B, e->workspace_bytes);
    }
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    return status;
}

/* A timed set's first run: the fastest candidate, or the first when the stream is being
 * captured into a CUDA graph. The others are released. */
static umt_status choose(umt_conv_engines *e) {
    cudaStreamCaptureStatus capture;
    UMT_CUDA_TRY(cudaStreamIsCapturing(umt_cuda_stream(), &capture));
    int best = 0;
    if (capture == cudaStreamCaptureStatusNone) {
        UMT_TRY(fastest(e, &best));
        remember(e, best);
    }
    keep(e, best);
    e->to_choose = false;
    return UMT_OK;
}

umt_status umt_cuda_conv_engines_run(umt_conv_engines *e, const void *x, const void *w, const void *y,
                                     void *workspace) {
    const void *const pointers[4] = {x, w, y, workspace};
    static const char *const names[3] = {"x", "w", "y"};
    for (int i = 0; i < 3; i++) {
        if ((uintptr_t)pointers[i] % TENSOR_ALIGNMENT != 0)
            return umt_fail(UMT_ERR_INVALID_ARGUMENT, "conv2d: %s at %p, expected %d-byte alignment (cuDNN's engines)",
                            names[i], pointers[i], TENSOR_ALIGNMENT);
    }
    UMT_TRY(pack_for(e, pointers));
    if (e->to_choose) UMT_TRY(choose(e));
    UMT_CUDNN_TRY(cudnnBackendExecute(e->handle, e->candidates[0].plan, e->pack));
    return UMT_OK;
}

void umt_cuda_conv_engines_free(umt_conv_engines *e) {
    if (!e) return;
    for (int i = 0; i < MAX_CANDIDATES; i++) release_candidate(&e->candidates[i]);
    if (e->pack) cudnnBackendDestroyDescriptor(e->pack);
    for (int i = DESCRIPTORS - 1; i >= 0; i--)
        if (e->graph[i]) cudnnBackendDestroyDescriptor(e->graph[i]);
    free(e);
}
