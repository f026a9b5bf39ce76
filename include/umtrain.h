/*
 * umtrain.h — the public C API of umtrain, the one header an embedding program includes.
 *
 * The model of use:
 *   1. Create a context (it owns the memory pools, the autograd tape and the RNG).
 *   2. Create parameters (weights pool, gradients in the grads pool) or layers that hold them.
 *   3. Each step: umt_step_begin, build the forward pass with umt_* ops (the tape records
 *      them), umt_backward on the scalar loss, umt_optimizer_step.
 *
 * Errors: functions return a umt_status (UMT_OK on success); functions that return a pointer
 * return NULL on failure. Either way umt_last_error() names what was wrong.
 *
 * Misuse: every pointer argument is checked. A NULL one is refused with UMT_ERR_INVALID_ARGUMENT
 * and the message "<function>: <argument> is NULL", except where this header says what NULL means
 * there (no bias, the defaults, nothing to free: each destroy function and umt_tensor_free take
 * NULL as a no-op). Ops accept NULL inputs (the tensors they compute from) and return NULL,
 * keeping the message of the failure that made the NULL, so a whole forward pass can be written
 * first and checked once. A function that returns a value rather than a status (a count, a
 * setting, a name) records the same message for a NULL argument and returns the neutral value
 * named where it is declared. Every tensor, layer, optimizer and dataset belongs to the context it
 * was made from: given one of another context than its ctx, a function refuses it with
 * "<function>: <argument> belongs to another context than ctx".
 *
 * Threads: a process may hold several contexts, on the CPU or on one GPU (each CUDA context has
 * its own stream, cuBLAS and cuDNN handles, convolution plans and kernel scratch), and use them
 * from several host threads at once:
 *   - different contexts on different threads, concurrently: safe (a sweep trains N models so);
 *   - one context (and everything made from it: tensors, layers, optimizers, datasets, step
 *     graphs, loaders) from one thread at a time: the caller orders its uses; it may move from
 *     thread to thread between calls;
 *   - functions that take no context (parsing, names, umt_samples_*, umt_checkpoint_check_writable,
 *     umt_cuda_device_count, umt_cpu_threads, umt_cpu_threads_set): safe from any thread;
 *   - a step group (umt_step_group) uses all its members' contexts: while it runs, none of them
 *     may be used from another thread;
 *   - a dataset shared with umt_dataset_share is read by every context that shares it at once;
 *   - umt_last_error and umt_last_status are per thread: a thread sees its own calls' failures.
 * Environment variables (UMT_*) are read, never written: set them before the threads start.
 */
#ifndef UMTRAIN_H
#define UMTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------------------------------- */
/* Status and errors */

typedef enum {
    UMT_OK = 0,
    UMT_ERR_INVALID_ARGUMENT, /* a bad value from the caller: shape, dtype, flag, NULL */
    UMT_ERR_OUT_OF_MEMORY,    /* the allocator said no */
    UMT_ERR_BUDGET,           /* a request would pass the device memory budget */
    UMT_ERR_IO,               /* a file could not be opened, read or written */
    UMT_ERR_FORMAT,           /* a file's contents are not what they should be */
    UMT_ERR_UNSUPPORTED,      /* valid, but not implemented for this dtype or device */
    UMT_ERR_STATE,            /* called at the wrong time (e.g. backward with no forward) */
    UMT_ERR_DEVICE            /* the CUDA runtime or a CUDA library reported an error */
} umt_status;

/* The message of the most recent failure on this thread: names the culprit and what was
 * expected. Never NULL; "" when nothing has failed. */
const char *umt_last_error(void);

/* The status of that most recent failure: what a function that returned NULL failed with
 * (e.g. UMT_ERR_BUDGET behind a NULL tensor). */
umt_status umt_last_status(void);

/* A short fixed name for a status code, e.g. "UMT_ERR_FORMAT". */
const char *umt_status_name(umt_status status);

/* ----------------------------------------------------------------------------------------- */
/* Element types, devices, pools */

typedef enum { UMT_F32 = 0, UMT_BF16, UMT_F16, UMT_I32, UMT_U8, UMT_DTYPE_COUNT } umt_dtype;

/* Bytes per element of a dtype (0 for an invalid value). */
size_t umt_dtype_size(umt_dtype dtype);
/* "f32", "bf16", "f16", "i32", "u8". */
const char *umt_dtype_name(umt_dtype dtype);

typedef enum { UMT_DEVICE_CPU = 0, UMT_DEVICE_CUDA } umt_device;

/* "cpu" or "cuda" -> device; UMT_ERR_INVALID_ARGUMENT for anything else. */
umt_status umt_device_parse(const char *name, umt_device *out);
/* GPUs visible to this process; 0 in a build without CUDA or on a machine without a GPU. */
int umt_cuda_device_count(void);
/* UMT_DEVICE_CUDA when this build has CUDA and a GPU is present, else UMT_DEVICE_CPU. */
umt_device umt_default_device(void);

/* The CPU backend's threads. Its kernels (matrix products, convolutions, pooling, dropout, bias
 * sums, the multi-tensor optimizer update) split their outputs over this many threads, the
 * caller's among them. Results are the same bit for bit at any count: each output element is
 * computed by one thread, reduced in the order one thread alone would follow. Process-wide; the
 * default is $UMT_CPU_THREADS (1 to 256; a CPU context refuses to start on any other value), else
 * the cores this process may run on (its CPU affinity). Safe from any thread; a kernel called
 * while another thread's kernel uses the threads runs on its caller's thread alone. */
int umt_cpu_threads(void);
/* Sets the count for the kernels that start after it: 1 to 256, or 0 for the default again. */
umt_status umt_cpu_threads_set(int threads);

/* How the CUDA backend places the GPU pools (the CPU backend ignores it):
 *   managed       — CUDA managed memory with per-pool advice and prefetch (the default);
 *   managed-plain — managed memory, no advice, no prefetch (for comparison);
 *   device        — plain cudaMalloc memory (for comparison). */
typedef enum { UMT_MEM_MANAGED = 0, UMT_MEM_MANAGED_PLAIN, UMT_MEM_DEVICE } umt_memory_mode;

/* "managed", "managed-plain", "device" -> mode; UMT_ERR_INVALID_ARGUMENT otherwise. */
umt_status umt_memory_mode_parse(const char *name, umt_memory_mode *out);
const char *umt_memory_mode_name(umt_memory_mode mode);

/* The arithmetic of forward and backward passes:
 *   fp32 — everything in f32 (the default of a context);
 *   bf16 — activations, their gradients and compute copies of the weights in bfloat16, NHWC
 *          convolutions, tensor-core products with f32 accumulation; f32 masters, parameter
 *          gradients, losses, reductions and optimizer state (CUDA only);
 *   fp16 — the same in IEEE half; it needs loss scaling (umt_optimizer_options.loss_scaling). */
typedef enum { UMT_PRECISION_FP32 = 0, UMT_PRECISION_BF16, UMT_PRECISION_FP16 } umt_precision;

/* "fp32", "bf16", "fp16" -> precision; UMT_ERR_INVALID_ARGUMENT otherwise. */
umt_status umt_precision_parse(const char *name, umt_precision *out);
const char *umt_precision_name(umt_precision precision);
/* bf16 on a GPU that has bf16 tensor cores (compute capability 8.0 or newer), else fp32: what
 * trainers use when no precision is asked for. */
umt_precision umt_precision_default(umt_device device, int cuda_device);

/* "2G", "64M", "512K", "1048576" (binary units, optional "iB"/"B") -> bytes. */
umt_status umt_parse_bytes(const char *text, size_t *out);

/* Every tensor's storage comes from exactly one pool; each pool has one placement (on CUDA:
 * managed memory with its own access advice, or pinned host memory) and one lifetime. */
typedef enum {
    UMT_POOL_WEIGHTS = 0, /* parameters (fp32 masters), whole run */
    UMT_POOL_GRADS,       /* parameter gradients, whole run */
    UMT_POOL_OPTIM,       /* optimizer state (momentum, Adam moments, Adadelta accumulators) */
    UMT_POOL_ACTIVATIONS, /* forward outputs, gradients of activations, batches: one step */
    UMT_POOL_WORKSPACE,   /* scratch for one call */
    UMT_POOL_DATASET,     /* a whole dataset kept resident */
    UMT_POOL_STAGING,     /* batches on their way in */
    UMT_POOL_OFFLOAD,     /* what does not fit the device budget */
    UMT_POOL_INPUTS,      /* batches copied in from the staging ring, a few steps deep */
    UMT_POOL_STREAM,      /* the offload tier's device double buffer: the layers in use */
    UMT_POOL_COUNT
} umt_pool;

/* "weights", "grads", "optim", "activations", "workspace", "dataset", "staging", "offload",
 * "inputs", "stream". */
const char *umt_pool_name(umt_pool pool);

#define UMT_MAX_DIMS 4

/* ----------------------------------------------------------------------------------------- */
/* Context */

typedef struct umt_context umt_context;
typedef struct umt_tensor umt_tensor;

typedef struct {
    umt_device device;           /* where ops run */
    uint64_t seed;               /* seeds the context's RNG: parameter init, shuffles, dropout */
    umt_memory_mode memory_mode; /* CUDA only */
    int cuda_device;             /* CUDA only: which GPU */
    umt_precision precision;     /* bf16 and fp16: CUDA only */
    bool tf32;                   /* CUDA, fp32: convolutions may run on TF32 tensor cores (10-bit
                                  * mantissas), as PyTorch's default allows (cudnn.allow_tf32; its
                                  * matrix products stay fp32, as here); false: fp32 arithmetic */
    bool one_stream;             /* CUDA: every kernel of a step on one stream. false (the default):
                                  * a layer's weight gradient runs on a second stream beside its
                                  * input gradient (the same kernels, the same bits; that stream's
                                  * cuBLAS and convolutions get workspaces of their own, made at
                                  * their first use there) */
} umt_context_options;

/* Options with defaults: umt_default_device(), seed 1, managed memory, GPU 0, fp32. */
umt_context_options umt_context_defaults(void);

/* On CUDA, the device budget is set here: the GPU's free memory (cudaMemGetInfo) less a
 * headroom, or UMT_DEVICE_BUDGET (e.g. "2G") if that is lower, or what other umtrain processes
 * on the same GPU leave of its capacity (the GPU's ledger, a file in $UMT_LEDGER_DIR or /dev/shm:
 * memory/README.md). Every managed or device allocation counts against it, and against what the
 * other processes leave and the GPU has free at that moment; one that would pass either is
 * refused with UMT_ERR_BUDGET, naming the other processes, and nothing is allocated. options
 * NULL: umt_context_defaults(). */
umt_status umt_context_create(const umt_context_options *options, umt_context **out);
/* Frees every tensor, layer and optimizer made from the context, and its pools. With
 * UMT_MEM_REPORT=1 in the environment, prints the pool report first. NULL is ok. */
void umt_context_destroy(umt_context *ctx);
/* The precision the context computes in (its options' precision); UMT_PRECISION_FP32 for a NULL ctx. */
umt_precision umt_context_precision(const umt_context *ctx);
/* The dtype its layers compute in: UMT_F32, or UMT_BF16 / UMT_F16 under bf16 / fp16 (the images'
 * dtype to ask umt_dataset_batch_as for); UMT_F32 for a NULL ctx. */
umt_dtype umt_context_compute_dtype(const umt_context *ctx);
/* Waits until the device has finished all queued work (a no-op on the CPU). */
umt_status umt_synchronize(umt_context *ctx);

/* Device time between two points of the queued work: umt_timer_start marks a point on the
 * device's stream (a CUDA event; the CPU uses its clock), umt_timer_stop marks a second one,
 * waits for it and gives the milliseconds between them. One timer per context. */
umt_status umt_timer_start(umt_context *ctx);
umt_status umt_timer_stop(umt_context *ctx, double *elapsed_ms);

/* The device budget and the managed/device bytes held now (both 0 on the CPU). */
umt_status umt_device_budget(const umt_context *ctx, size_t *budget_bytes, size_t *used_bytes);

/* Bytes in use, peak and capacity of one pool, and how many allocations it served. */
typedef struct {
    size_t in_use_bytes;
    size_t peak_bytes;
    size_t capacity_bytes; /* bytes held from the system, including arena slack */
    uint64_t allocations;
    /* activations, once planned from the first training step: the planned peak, and the sum of
     * the sizes that step allocated (what an arena without reuse would need); 0 otherwise */
    size_t planned_peak_bytes;
    size_t planned_total_bytes;
} umt_pool_stats;

umt_status umt_pool_stats_get(const umt_context *ctx, umt_pool pool, umt_pool_stats *out);
/* Prints one line per pool (placement, capacity, peak, allocations) and the budget to stderr,
 * and on CUDA the GPU's ledger: its capacity and the other umtrain processes holding memory on
 * the GPU; nothing for a NULL ctx. */
void umt_memory_report(const umt_context *ctx);

/* ----------------------------------------------------------------------------------------- */
/* The memory plan: every pool's peak before the first step, and how many micro-batches
 *
 * Once the model and the optimizer exist (and the dataset, where it lives in a pool), a plan
 * predicts each pool's peak without moving any data: dry steps run the caller's forward and
 * umt_backward with kernels that do nothing and tensors whose storage is only recorded, so that
 * the activation arena's first step (every size added up) and its later steps (planned) are
 * measured by the arena's own code, convolution workspaces by the backend's own answer. Then it
 * chooses, in this order: everything on the GPU (one micro-batch); micro-batches, the fewest
 * that fit the device budget and keep every tensor within the element limit; the offload tier
 * (below) for the optimizer state, then weights and gradients, with the fewest micro-batches whose
 * step fits what the tier leaves; the tier with saved activations in host memory too. Where none
 * fits, or host memory cannot hold what the tier keeps there, the plan does not fit and says why,
 * naming the pools and their sizes. Nothing of the context changes: the RNG, the tape, the pools
 * and the hooks are as they were.
 *
 * The offload tier is enabled before the model exists (umt_offload_enable). A plan made without it
 * that needs it (plan.offload.needed, plan.offload.enabled false) is a plan for the same model
 * with it: make the context again with the tier, the model after it with the same seed (the same
 * initial parameters), plan again there, and give the tier the plan (umt_offload_adopt_plan)
 * before the first step. examples/example_common.c (example_plan) does it for the trainers. */

/* The caller's forward on `batch` samples of inputs it makes with umt_tensor_new (in the
 * activations pool: their storage is recorded, not backed, and never read), returning the
 * scalar loss, or NULL on failure. It must not call umt_step_begin or read any tensor's values. */
typedef umt_tensor *(*umt_plan_forward_fn)(umt_context *ctx, void *user, int64_t batch);

typedef struct {
    int64_t batch;         /* samples per optimizer step (>= 1) */
    int64_t micro_batches; /* k forced (1..batch), or 0: the plan chooses */
    int64_t last_batch;    /* an epoch's last, shorter step (0: none) */
    int64_t eval_batch;    /* the evaluation's batch, forward only with grad off (0: none) */
    size_t step_value_bytes; /* the host values a step hands its kernels, all micro-batches together
                              * (umt_dataset_batch: 8 bytes of index per sample; 0: none): the
                              * staging and inputs pools' ring (core/step_values.h) */
    int64_t element_limit; /* the most elements a tensor may have (0: INT_MAX on CUDA, what cuDNN
                            * takes; no limit on the CPU) */
    size_t later_device_bytes; /* device bytes the caller allocates after the plan and before the first
                                * step (a loader's ring of batches: umt_loader_create), held beside
                                * the step (0: none) */
    size_t later_dataset_bytes; /* bytes the caller puts in the dataset pool after the plan (a batch
                                 * made once and trained on at every step, as big_mlp's), held beside
                                 * the step (0: none) */
    bool updates_in_backward;  /* the tier updates in backward (UMT_OFFLOAD_OPTIM_BACKWARD): its update
                                * ring is counted beside the streamed parameters */
} umt_memory_plan_request;

typedef enum {
    UMT_PLAN_FITS = 0,            /* one micro-batch: everything fits as asked */
    UMT_PLAN_MICRO_BATCHES,       /* k > 1 micro-batches fit where the whole batch does not */
    UMT_PLAN_FORCED,              /* the caller's k (umt_memory_plan_request.micro_batches) */
    UMT_PLAN_OFFLOAD_STATE,       /* with the state in the offload tier, k >= 1 micro-batches fit where
                                   * even one sample beside it does not */
    UMT_PLAN_OFFLOAD_ACTIVATIONS  /* saved activations go to the tier too: even one sample does not fit
                                   * beside the tier otherwise (fits false: not even then) */
} umt_plan_verdict;

/* "fits", "micro-batches", "forced", "offload-state", "offload-activations". */
const char *umt_plan_verdict_name(umt_plan_verdict verdict);

/* What a plan asks of the offload tier (include/umtrain.h, "The offload tier"). */
typedef struct {
    bool needed;  /* the plan trains only with the tier (verdicts offload-state and offload-activations,
                   * or a forced k that fits only with it) */
    bool enabled; /* the context has the tier: the plan was made with it in view */
    bool pools[UMT_POOL_COUNT]; /* the pools that send tensors to pinned host memory: optim, weights, grads;
                                 * activations (saved activations, .activations) */
    bool activations;     /* saved activations go to host memory: umt_offload_options.activations */
    size_t reserve_bytes; /* device bytes left for one micro-batch's step, with the plan's margin:
                           * umt_offload_options.reserve_bytes (set whenever the budget binds) */
    size_t state_bytes;   /* the model's weights (with their compute copies), gradients and optimizer state */
    size_t least_device_bytes; /* the least device memory the tier can hold the state in: its streaming
                                * buffers and what it cannot stream (0 on the CPU) */
    size_t host_bytes;    /* pinned host memory it needs at most: the state, which it makes there, and
                           * with .activations every activation of a micro-batch (0: not needed) */
    size_t host_available_bytes; /* the host's available memory when planned (0: unknown) */
} umt_plan_offload;

typedef struct {
    umt_plan_verdict verdict;
    bool fits;              /* the step fits the budget (less 1% and 1 MiB kept free for what no dry
                             * step sees) and the element limit, as planned (with the offload tier
                             * where offload.needed says so, host memory holding what it keeps) */
    int64_t batch;          /* B */
    int64_t micro_batches;  /* k */
    int64_t micro_batch;    /* ceil(B / k): the samples of one micro-batch. A step runs as k near-equal
                             * micro-batches (ceil and floor of B / k samples, the larger first), an
                             * epoch's last step as as many; the plan measured each of those sizes */
    size_t peak_bytes[UMT_POOL_COUNT];   /* each pool's predicted peak (as umt_pool_stats.peak_bytes) */
    const char *place[UMT_POOL_COUNT];   /* where it lives: "managed", "device", "pinned", "host" */
    size_t activations_planned_bytes;    /* the activation arena from the second step on */
    size_t device_peak_bytes; /* the most GPU memory held at once (0 on the CPU) */
    size_t budget_bytes;      /* the device budget (0 on the CPU: no budget) */
    int64_t largest_elements; /* the largest tensor of the step, in elements */
    int64_t element_limit;
    char why[384];            /* one or two sentences: what decided, with the sizes */
    /* The offload tier's part. The pools of a verdict that needs it are placed as the tier's own
     * planner (memory/offload_plan.h) will place them at the first step: weights, grads and optim
     * hold what stays on the GPU, offload (pinned) what goes home, stream its buffers. */
    umt_plan_offload offload;
} umt_memory_plan;

/* Makes the plan for request on ctx (forward and user as above; user may be NULL). A verdict
 * that does not fit is a plan, not a failure: the status is UMT_OK and plan->fits false, with
 * the reason in plan->why. Fails only when a dry step fails for another reason than size. Plans
 * assume the tier's default updates, after backward (UMT_OFFLOAD_OPTIM_BACKWARD adds its ring). */
umt_status umt_memory_plan_make(umt_context *ctx, const umt_memory_plan_request *request, umt_plan_forward_fn forward,
                                void *user, umt_memory_plan *out);
/* The plan as one short table: each pool that holds bytes, its place and predicted peak, then
 * the micro-batches, the offload tier where it is needed (the pools it takes and why: the state,
 * its least, the reserve, the host memory), the device peak against the budget, and why. Nothing
 * for a NULL plan (a NULL out is refused by name). */
void umt_memory_plan_print(const umt_memory_plan *plan, FILE *out);


/* ----------------------------------------------------------------------------------------- */
/* The offload tier: training a model larger than the device budget (CUDA)
 *
 * Enabled on a context before its model exists, the tier makes parameters, gradients and
 * optimizer state in pinned host memory. At the first umt_step_begin a placement plan (printed)
 * moves back to the GPU what fits the budget less reserve_bytes, optimizer state leaving first,
 * then weights and gradients; the rest is streamed through device buffers one layer ahead of
 * use, while compute runs. The losses are those of the same model in GPU memory. */

/* Where the update of offloaded parameters runs:
 *   auto     — the first two steps measure gpu and cpu, the faster one is kept (the default);
 *   gpu      — in umt_optimizer_step, on the GPU, parameters, gradients and state streamed
 *              through the double buffer in chunks;
 *   cpu      — in umt_optimizer_step, on the CPU, in place in pinned host memory, one thread per
 *              core;
 *   backward — on the GPU during umt_backward, as soon as a parameter's gradient is final: the
 *              weights and gradient are still in the double buffer, the kernel reads and writes
 *              the optimizer state in pinned memory directly, and only the updated weights go
 *              back. Fewest bytes over the link, but the update uses the learning rate set before
 *              backward, the gradient is consumed (not kept, not accumulated over several
 *              backward calls), and clipping is impossible; umt_optimizer_step then only counts
 *              the step for those parameters. Opt-in for that reason (examples/big_mlp.c takes
 *              it by default: its loop needs neither). It needs an update ring on the device
 *              beside the streamed parameters: where the budget cannot hold it, the tier updates
 *              after backward instead, as auto does, and says so once. */
typedef enum {
    UMT_OFFLOAD_OPTIM_AUTO = 0,
    UMT_OFFLOAD_OPTIM_GPU,
    UMT_OFFLOAD_OPTIM_CPU,
    UMT_OFFLOAD_OPTIM_BACKWARD
} umt_offload_optimizer;

/* "auto", "gpu", "cpu", "backward" -> where; UMT_ERR_INVALID_ARGUMENT otherwise. */
umt_status umt_offload_optimizer_parse(const char *name, umt_offload_optimizer *out);
const char *umt_offload_optimizer_name(umt_offload_optimizer where);

typedef struct {
    size_t reserve_bytes;            /* device bytes the plan leaves for activations and scratch */
    umt_offload_optimizer optimizer; /* where offloaded parameters are updated */
    /* UMT_OFFLOAD_OPTIM_BACKWARD: the first this many streamed parameters whose gradients are final
     * in each backward are updated by CPU threads in pinned memory instead of through the GPU's
     * update ring, beside it: only their gradients cross the link. 0: none;
     * UMT_OFFLOAD_HOST_AUTO (the default): the share that balances the CPU's time against the
     * link's, both measured when the plan is made, for the first step; then the count is searched
     * on whole steps and the fastest kept (umt_offload_stats.host_updates says when it has). */
    int host_updates;
    /* Activations saved for backward may go to host memory too. The first step sends every one
     * (their sizes are unknown before a forward pass); from the second the plan keeps on the GPU
     * those that fit. */
    bool activations;
    /* Under bf16, true: a gradient that goes home for the CPU threads' update in backward crosses as
     * bf16, rounded on the GPU: half the bytes over the link and through host memory. The losses
     * then differ from the in-memory run's within bf16 rounding, and, since which parameters the
     * CPU takes is searched on measured step times, from one run to the next. false (the default):
     * f32, the losses equal to the in-memory run's bit for bit whatever the CPU takes. (Updates
     * after backward read every gradient in f32 for the step's decision; fp16 updates after
     * backward, for its loss scale: both stay f32.) */
    bool bf16_gradients_home;
} umt_offload_options;

#define UMT_OFFLOAD_HOST_AUTO (-1)

/* No reserve, updates where they run faster (auto), the CPU's share of updates in backward
 * measured (UMT_OFFLOAD_HOST_AUTO), saved activations on the GPU. */
umt_offload_options umt_offload_defaults(void);
/* Turns the tier on for ctx (options NULL: the defaults): call it right after umt_context_create,
 * before any parameter exists. UMT_ERR_UNSUPPORTED on the CPU or in a build without CUDA;
 * UMT_ERR_STATE once the context has parameters. Create the model and the optimizer before the
 * first step. Every precision (bf16/fp16: only the weights' compute copies cross to the GPU),
 * clipping and loss scaling (updates in backward then run after backward instead, said once),
 * micro-batches and data parallelism (dist/umt_dist.h: each gradient all-reduced on the GPU
 * before it goes home) work with it; a step graph runs its steps eagerly (offload/README.md). */
umt_status umt_offload_enable(umt_context *ctx, const umt_offload_options *options);
/* Gives the tier of ctx what a memory plan made on it decided (umt_memory_plan_make): the device
 * bytes to leave for one micro-batch's step (plan->offload.reserve_bytes) and whether saved
 * activations go to host memory (plan->offload.activations); train in plan->micro_batches
 * micro-batches. Before the first step, when the tier places the model: UMT_ERR_STATE after it,
 * and on a context without the tier; UMT_ERR_UNSUPPORTED in a build without CUDA. */
umt_status umt_offload_adopt_plan(umt_context *ctx, const umt_memory_plan *plan);

/* What the offload tier has done since the context was made (all 0 without offload). */
typedef struct {
    int offloaded_tensors;        /* weights, gradients and optimizer states in the offload tier */
    size_t offloaded_bytes;
    uint64_t bytes_to_device;     /* host -> device copies: weights, gradients, optimizer chunks */
    uint64_t bytes_to_host;       /* device -> host copies: gradients, updated parameters and state */
    uint64_t activation_bytes_to_device; /* of which saved activations (umt_offload_options.activations) */
    uint64_t activation_bytes_to_host;
    uint64_t activations_offloaded;      /* saved activations whose device bytes were given up, all steps */
    uint64_t updates_in_backward;        /* parameters updated during backward (UMT_OFFLOAD_OPTIM_BACKWARD), all steps */
    umt_offload_optimizer optimizer; /* where offloaded updates run now (auto until measured) */
    double optimizer_gpu_ms;      /* the measured offloaded update of each kind (0: not measured) */
    double optimizer_cpu_ms;
    /* UMT_OFFLOAD_OPTIM_BACKWARD: the streamed parameters CPU threads update each step (the
     * option's count, or auto's once its search has settled; -1 while it runs) */
    int host_updates;
    uint64_t host_updated_elements; /* of which elements the CPU threads updated in backward, all steps */
    double host_update_rate;        /* their rate timed alone when the tier planned, elements/s (0: not timed) */
    int host_threads;               /* the CPU threads that run those updates (0: none started) */
    double host_busy_seconds;       /* thread-seconds they spent updating, all steps: with the elements, their
                                     * rate inside the steps (host_updated_elements / busy * threads) */
} umt_offload_stats;

umt_status umt_offload_stats_get(const umt_context *ctx, umt_offload_stats *out);

/* The host <-> device link with pinned memory, in GB/s (1e9 bytes per second): the best of a few
 * copies of `bytes` each way alone, and both ways at once (the sum). CUDA only; the buffers come
 * from the staging and stream pools and are freed before it returns. */
typedef struct {
    double to_device_gbps;
    double to_host_gbps;
    double both_ways_gbps;
} umt_link_speed;

umt_status umt_link_measure(umt_context *ctx, size_t bytes, umt_link_speed *out);

/* The host's memory, which the offload tier's CPU updates and the link share: the CPU threads'
 * rate of the tier's update (Adam with the context's compute copy, on pinned arrays of about a
 * layer's size; elements/s, median of a few rounds) alone and while the link copies both ways at
 * once, and the link's both-ways GB/s alone and meanwhile; update_bytes, the host-memory bytes an
 * element of that update reads and writes. With both at once the host's memory carries
 * cpu_beside_link * update_bytes + link_beside_cpu_gbps * 1e9 bytes a second. CUDA, on a context
 * with the offload tier; its scratch (about 1.2 GB pinned, 256 MiB of the stream pool) is freed
 * before it returns. Call it before the first step, while the budget has room for the link's
 * buffers, or where the tier's memory is not in use. */
typedef struct {
    double cpu_alone, cpu_beside_link;
    double link_alone_gbps, link_beside_cpu_gbps;
    double update_bytes;
} umt_host_memory_speed;

umt_status umt_offload_host_memory_measure(umt_context *ctx, umt_host_memory_speed *out);

/* The least time for `elements` of the CPU's update and `bytes` over the link (both ways counted)
 * at the rates of `speed`, when at any moment each side runs alone or both run at once (each
 * slower then): x seconds of both at once leave the rest of each side's work to run alone,
 *   T(x) = x + max(0, (E - cpu_beside_link x) / cpu_alone) + max(0, (B - link_beside x) / link_alone),
 * which is convex and piecewise linear, so its least value is at x = 0 or where a side's work
 * runs out. A bound, under those three ways of running, for an offloaded step's CPU updates and
 * copies (big_mlp --bench prints it). Pure arithmetic, in any build; refuses rates that are not
 * positive and negative work, naming the value. */
umt_status umt_host_memory_least_seconds(const umt_host_memory_speed *speed, double elements, double bytes,
                                         double *seconds);

/* ----------------------------------------------------------------------------------------- */
/* Tensors: contiguous, row-major, up to UMT_MAX_DIMS dimensions. */

/* A tensor in the given pool. Tensors of the activations pool live until the next
 * umt_step_begin; the others until umt_tensor_free or umt_context_destroy. Contents are
 * uninitialised. */
umt_tensor *umt_tensor_new(umt_context *ctx, umt_pool pool, umt_dtype dtype, int ndim,
                           const int64_t *shape);
umt_tensor *umt_tensor_new_1d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0);
umt_tensor *umt_tensor_new_2d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0,
                              int64_t n1);
umt_tensor *umt_tensor_new_4d(umt_context *ctx, umt_pool pool, umt_dtype dtype, int64_t n0,
                              int64_t n1, int64_t n2, int64_t n3);
/* Frees a tensor of a persistent pool (not activations). NULL is ok. */
void umt_tensor_free(umt_tensor *t);

/* Shape, type and place of a tensor; for a NULL t: 0, 0, 0, UMT_DTYPE_COUNT, UMT_POOL_COUNT,
 * UMT_DEVICE_CPU. */
int umt_tensor_ndim(const umt_tensor *t);
int64_t umt_tensor_dim(const umt_tensor *t, int axis);
int64_t umt_tensor_numel(const umt_tensor *t);
umt_dtype umt_tensor_dtype(const umt_tensor *t);
umt_pool umt_tensor_pool(const umt_tensor *t);
/* The device whose ops read and write the tensor (its context's). */
umt_device umt_tensor_device(const umt_tensor *t);
/* The parameter's name, or NULL for other tensors (and for a NULL t). */
const char *umt_tensor_name(const umt_tensor *t);
/* The gradient after umt_backward (NULL when the tensor takes no gradient, and for a NULL t). */
umt_tensor *umt_tensor_grad(const umt_tensor *t);

/* Copies between the tensor and host memory; bytes must equal numel * dtype size. */
umt_status umt_tensor_copy_from_host(umt_tensor *t, const void *src, size_t bytes);
umt_status umt_tensor_copy_to_host(const umt_tensor *t, void *dst, size_t bytes);
/* Sets every element of an f32 tensor to value. */
umt_status umt_tensor_fill(umt_tensor *t, float value);
/* Reads element i of an f32 tensor into *out (a convenience for losses and tests). */
umt_status umt_tensor_get_f32(const umt_tensor *t, int64_t i, float *out);
/* Converts src into dst of the same shape, between f32, bf16 and f16 (round to nearest even). */
umt_status umt_tensor_convert(const umt_tensor *src, umt_tensor *dst);

/* A trainable f32 tensor in the weights pool, its gradient in the grads pool, registered with
 * the context so that optimizers and checkpoints find it. Contents are uninitialised. */
umt_tensor *umt_parameter_new(umt_context *ctx, const char *name, int ndim, const int64_t *shape);
/* Fills an f32 tensor from U(low, high) drawn from the context's RNG. */
umt_status umt_tensor_uniform(umt_context *ctx, umt_tensor *t, float low, float high);
/* Number of registered parameters and the i-th one, in creation order; 0 and NULL for a NULL
 * ctx, NULL for an index out of range (the message names the index and the count). */
int umt_parameter_count(const umt_context *ctx);
umt_tensor *umt_parameter_at(const umt_context *ctx, int i);

/* A named f32 tensor of model state that is not trained (batch norm's running statistics), in
 * the weights pool and registered with the context so that checkpoints save it. */
umt_tensor *umt_buffer_new(umt_context *ctx, const char *name, int ndim, const int64_t *shape);
/* As umt_parameter_count and umt_parameter_at, for buffers. */
int umt_buffer_count(const umt_context *ctx);
umt_tensor *umt_buffer_at(const umt_context *ctx, int i);

/* ----------------------------------------------------------------------------------------- */
/* Autograd */

/* Starts a step: frees the previous step's activations and clears the tape. */
umt_status umt_step_begin(umt_context *ctx);
/* Sets every parameter gradient to zero. */
umt_status umt_zero_grad(umt_context *ctx);
/* Runs the tape backwards from a scalar loss; parameter gradients accumulate (+=). */
umt_status umt_backward(umt_context *ctx, umt_tensor *loss);
/* With grad disabled, ops record nothing (evaluation). Returns the previous setting (false for a
 * NULL ctx, which sets nothing). */
bool umt_set_grad_enabled(umt_context *ctx, bool enabled);

/* Training mode (the default) or evaluation mode: dropout is the identity and batch norm uses
 * its running statistics in evaluation. Returns the previous setting (false for a NULL ctx). */
bool umt_set_training(umt_context *ctx, bool training);

/* Called during umt_backward as soon as a parameter's gradient is final for this step (with user);
 * fn NULL removes the hook. */
typedef void (*umt_grad_ready_fn)(umt_tensor *parameter, void *user);
void umt_set_grad_ready_hook(umt_context *ctx, umt_grad_ready_fn fn, void *user);

/* Micro-batching (gradient accumulation): one step over `batch` samples run as micro-batches of
 * consecutive samples, for a batch whose activations do not fit at once.
 *   umt_step_begin(ctx); umt_zero_grad(ctx);
 *   for each micro-batch [first, first + samples):
 *       umt_micro_batch_begin(ctx, first, samples, batch);
 *       loss = forward on those samples (the micro-batch's mean loss); umt_backward(ctx, loss);
 *   umt_optimizer_step(opt);
 * Each backward counts its loss by samples / batch, so the gradients are the whole batch's mean
 * loss's; dropout draws the whole batch's masks (the first axis of a dropout's input must be the
 * micro-batch's samples); gradient hooks (data parallelism) run in the last micro-batch only.
 * Batch norm uses each micro-batch's own statistics, as PyTorch does under accumulation. A
 * micro-batch after the first frees the previous one's activations: it must have run backward.
 * The first micro-batch starts at sample 0, each next where the last ended. Make the first the
 * largest: the activation arena is planned from it, and a larger one later takes more memory. */
umt_status umt_micro_batch_begin(umt_context *ctx, int64_t first, int64_t samples, int64_t batch);
/* The step's loss so far, on the device: each finished micro-batch's loss times samples / batch
 * (the whole batch's mean after the last); NULL when this step is not split. */
umt_tensor *umt_micro_batch_loss(umt_context *ctx);

/* ----------------------------------------------------------------------------------------- */
/* Ops: each returns a new tensor in the activations pool and records itself on the tape. */

/* [M,K] x [K,N] -> [M,N] */
umt_tensor *umt_matmul(umt_context *ctx, umt_tensor *a, umt_tensor *b);
/* x [N,in], weight [out,in], bias [out] or NULL -> x weightᵀ + bias, [N,out] */
umt_tensor *umt_linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias);
/* relu(linear(x, weight, bias)) in one op: the bias and the ReLU in one pass after the product,
 * and in backward the ReLU mask and the bias gradient in one pass over the gradient. */
umt_tensor *umt_linear_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias);
/* umt_dropout(umt_linear_relu(x, weight, bias), p) in one op: the dropout drawn as umt_dropout
 * draws it (the same elements kept, the same values) in the bias and ReLU's pass, with no mask
 * kept (the backward reads the output); in backward the dropout's and the ReLU's masks, the scale
 * and the bias gradient in one pass. 0 <= p < 1; in evaluation, or with p = 0, umt_linear_relu. */
umt_tensor *umt_linear_relu_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, float p);
/* Elementwise a + b; b may also be 1-D with the length of a's last dimension (broadcast). */
umt_tensor *umt_add(umt_context *ctx, umt_tensor *a, umt_tensor *b);
/* Elementwise a * b, same shapes. */
umt_tensor *umt_mul(umt_context *ctx, umt_tensor *a, umt_tensor *b);
umt_tensor *umt_relu(umt_context *ctx, umt_tensor *x);
/* Same elements, new shape (numel must match); shares storage with x. */
umt_tensor *umt_reshape(umt_context *ctx, umt_tensor *x, int ndim, const int64_t *shape);
/* [N, d1, d2, ...] -> [N, d1*d2*...] */
umt_tensor *umt_flatten(umt_context *ctx, umt_tensor *x);
/* umt_linear(umt_flatten(x), weight, bias) and the same with the ReLU, as one op. Under bf16 and
 * fp16 a 4-D x is NHWC while flattened features are in C,H,W order (PyTorch's, the checkpoints'),
 * so umt_flatten transposes it, and its backward transposes the gradient back; this op reads x
 * as it lies, with the weight's compute copy in H,W,C column order instead, when that copy is
 * made (the weight's first use) at a batch of 8 rows or more per output feature: below that the
 * transposes cost less than the H,W,C copy's upkeep, and the op is umt_flatten + umt_linear,
 * exactly (as under fp32). Read as it lies, the same products are summed in another order: the
 * results equal umt_flatten + umt_linear up to rounding. A weight whose copy is H,W,C cannot
 * also go to umt_linear (refused, named). */
umt_tensor *umt_flatten_linear(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias);
umt_tensor *umt_flatten_linear_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias);
/* umt_dropout(umt_flatten_linear_relu(x, weight, bias), p) in one op, as umt_linear_relu_dropout. */
umt_tensor *umt_flatten_linear_relu_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias,
                                            float p);
/* Mean of all elements -> a 1-element tensor. */
umt_tensor *umt_mean(umt_context *ctx, umt_tensor *x);
/* Row-wise log-softmax of a 2-D tensor. */
umt_tensor *umt_log_softmax(umt_context *ctx, umt_tensor *x);
/* Mean over rows of -log_probs[i, labels[i]]; labels i32 [N]. */
umt_tensor *umt_nll_loss(umt_context *ctx, umt_tensor *log_probs, umt_tensor *labels);
/* nll_loss(log_softmax(logits), labels) in one op. */
umt_tensor *umt_softmax_cross_entropy(umt_context *ctx, umt_tensor *logits, umt_tensor *labels);
/* umt_softmax_cross_entropy(umt_linear(x, weight, bias), labels), as one op where the backend
 * fuses it (on a GPU under bf16/fp16, at most 32 classes): one kernel forward, the logits never
 * written, and two backward (the weight and bias gradients beside the input gradient). The same
 * arithmetic and roundings with the products summed in another order, so not the same bits;
 * elsewhere (the CPU, fp32) exactly the two ops. */
umt_tensor *umt_linear_softmax_cross_entropy(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias,
                                             umt_tensor *labels);

/* x [N,C,H,W] (*) weight [K,C,R,S] + bias [K] (or NULL), square stride and zero padding,
 * dilation 1 -> [N,K,P,Q]. Scratch comes from the workspace pool. */
umt_tensor *umt_conv2d(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, int64_t stride,
                       int64_t padding);
/* relu(conv2d(...)) in one op, fused as umt_linear_relu is. */
umt_tensor *umt_conv2d_relu(umt_context *ctx, umt_tensor *x, umt_tensor *weight, umt_tensor *bias, int64_t stride,
                            int64_t padding);
/* Max / average over window x window patches every stride pixels, no padding: [N,C,H,W] ->
 * [N,C,(H-window)/stride+1,(W-window)/stride+1]. */
umt_tensor *umt_max_pool2d(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride);
umt_tensor *umt_avg_pool2d(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride);
/* Training: zeroes each element with probability p (a seeded draw from the context's RNG) and
 * scales the rest by 1/(1-p). Evaluation: the identity. */
umt_tensor *umt_dropout(umt_context *ctx, umt_tensor *x, float p);
/* umt_dropout(umt_max_pool2d(x, window, stride), p) as one op: its backward is one pass. */
umt_tensor *umt_max_pool2d_dropout(umt_context *ctx, umt_tensor *x, int64_t window, int64_t stride, float p);
/* umt_max_pool2d_dropout(relu(x + bias[channel]), ...) as one op over the pooled quarter: x is
 * a convolution's output without its bias (umt_conv2d with bias NULL), so the full-size ReLU
 * output is never written. Windows apart (stride >= window). */
umt_tensor *umt_bias_relu_max_pool2d_dropout(umt_context *ctx, umt_tensor *x, umt_tensor *bias, int64_t window,
                                             int64_t stride, float p);
/* Whether umt_bias_relu_max_pool2d_dropout takes this window and stride: windows apart (stride >=
 * window) and window <= 16 (a pick in one byte). */
bool umt_bias_relu_max_pool2d_dropout_supports(int64_t window, int64_t stride);
/* Batch norm over the channels of x [N,C,H,W] (or [N,C]): gamma, beta [C] parameters (inputs, as
 * x is), running_mean, running_var [C] buffers updated by momentum in training (state the op
 * updates, not inputs: NULL there is refused by name). */
umt_tensor *umt_batch_norm(umt_context *ctx, umt_tensor *x, umt_tensor *gamma, umt_tensor *beta,
                           umt_tensor *running_mean, umt_tensor *running_var, float momentum, float eps);

/* Number of rows of scores [N,C] whose arg-max equals labels[i] (i32 [N]). */
umt_status umt_count_correct(umt_context *ctx, const umt_tensor *scores, const umt_tensor *labels,
                             int64_t *correct);

/* ----------------------------------------------------------------------------------------- */
/* Layers: hold their parameters and compose ops in forward. */

typedef struct umt_layer umt_layer;

/* Linear layer: weight [out,in] and bias [out], initialised as PyTorch's nn.Linear
 * (Kaiming-uniform, bound 1/sqrt(in)). Parameters are named "<name>.weight", "<name>.bias". */
umt_layer *umt_linear_layer_new(umt_context *ctx, const char *name, int64_t in_features,
                                int64_t out_features, bool bias);
/* 2-D convolution layer: weight [out,in,k,k], bias [out], initialised as PyTorch's nn.Conv2d
 * (bound 1/sqrt(in*k*k)). Parameters "<name>.weight", "<name>.bias". */
umt_layer *umt_conv2d_layer_new(umt_context *ctx, const char *name, int64_t in_channels, int64_t out_channels,
                                int64_t kernel, int64_t stride, int64_t padding, bool bias);
/* Batch norm layer over `channels`: gamma = 1, beta = 0 ("<name>.weight", "<name>.bias"),
 * running mean 0 and variance 1 ("<name>.running_mean", "<name>.running_var"), momentum 0.1,
 * eps 1e-5, as PyTorch's nn.BatchNorm2d. */
umt_layer *umt_batchnorm_layer_new(umt_context *ctx, const char *name, int64_t channels);
umt_tensor *umt_layer_forward(umt_context *ctx, umt_layer *layer, umt_tensor *x);
/* relu(umt_layer_forward(...)), as one fused op for the layers that have one (linear, conv2d). */
umt_tensor *umt_layer_forward_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x);
/* umt_layer_forward_relu(umt_flatten(x)): for a linear layer, umt_flatten_linear_relu. */
umt_tensor *umt_layer_forward_flatten_relu(umt_context *ctx, umt_layer *layer, umt_tensor *x);
/* umt_dropout(umt_layer_forward_flatten_relu(...), p): for a linear layer,
 * umt_flatten_linear_relu_dropout. */
umt_tensor *umt_layer_forward_flatten_relu_dropout(umt_context *ctx, umt_layer *layer, umt_tensor *x, float p);
/* umt_max_pool2d_dropout(umt_layer_forward_relu(...), window, stride, p): for a conv2d layer
 * with a bias and windows apart, its product, then umt_bias_relu_max_pool2d_dropout. */
umt_tensor *umt_layer_forward_relu_max_pool2d_dropout(umt_context *ctx, umt_layer *layer, umt_tensor *x,
                                                      int64_t window, int64_t stride, float p);
/* umt_softmax_cross_entropy(umt_layer_forward(...), labels): for a linear layer,
 * umt_linear_softmax_cross_entropy. */
umt_tensor *umt_layer_softmax_cross_entropy(umt_context *ctx, umt_layer *layer, umt_tensor *x, umt_tensor *labels);

/* ----------------------------------------------------------------------------------------- */
/* Optimizers and learning-rate schedules */

typedef struct umt_optimizer umt_optimizer;

typedef enum { UMT_OPT_SGD = 0, UMT_OPT_ADAM, UMT_OPT_ADAMW, UMT_OPT_ADADELTA } umt_optimizer_kind;

/* What a step does when its loss or a gradient is NaN or infinite (umt_optimizer_options.on_nonfinite).
 * The check runs on the device, in every step's own queue of work, before any parameter moves:
 * the sum of squares of every gradient (the global norm's) and the loss of the step's last
 * umt_backward (the micro-batches' sum when the step is split) must be finite. No step waits for
 * the host; the host learns of the first such step from umt_optimizer_nonfinite_found, a step or
 * two later on a GPU, at once on the CPU. Under loss scaling (fp16) a gradient's overflow stays
 * the scaler's to handle (skipped, the scale halved), and only a non-finite loss counts. */
typedef enum {
    UMT_NONFINITE_OFF = 0, /* no check: every update is applied, whatever it holds (PyTorch's way) */
    UMT_NONFINITE_STOP,    /* that step's update and every later one are skipped: the parameters stay
                            * those from before it, and the program should stop */
    UMT_NONFINITE_SKIP     /* that step's update is skipped and counted; the next steps go on */
} umt_nonfinite_policy;

/* "off", "stop", "skip" -> policy; UMT_ERR_INVALID_ARGUMENT otherwise. */
umt_status umt_nonfinite_policy_parse(const char *name, umt_nonfinite_policy *out);
/* "off", "stop", "skip"; "invalid-policy" for anything else. */
const char *umt_nonfinite_policy_name(umt_nonfinite_policy policy);

typedef struct {
    umt_optimizer_kind kind;
    float lr;
    float weight_decay; /* L2 added to the gradient; decoupled for AdamW */
    float momentum;     /* SGD */
    float beta1, beta2; /* Adam, AdamW */
    float rho;          /* Adadelta */
    float eps;          /* Adam, AdamW, Adadelta */
    /* Gradient clipping by global norm (PyTorch's clip_grad_norm_): every gradient is
     * multiplied by min(1, max_grad_norm / (norm + 1e-6)), norm the L2 norm of all of them
     * together, computed on the device. 0 turns clipping off. */
    float max_grad_norm;
    /* Dynamic loss scaling (PyTorch's GradScaler), for fp16: umt_backward_scaled multiplies
     * the loss gradient by the scale; the step divides it out, and skips the update when a
     * gradient is inf or NaN, halving the scale; after loss_scale_growth_interval clean steps
     * in a row the scale doubles. All on the device: no step waits for the host. */
    bool loss_scaling;
    float loss_scale_init;          /* the first scale (> 0; PyTorch: 65536) */
    int loss_scale_growth_interval; /* clean steps before the scale doubles (>= 1; PyTorch: 2000) */
    /* Every parameter's update in one launch (default) rather than one launch per parameter;
     * the same arithmetic, bit for bit. */
    bool multi_tensor;
    /* The non-finite check (umt_nonfinite_policy above); off by default. On, it costs one small
     * kernel per step (the sum of squares clipping computes too) and no wait; the updates of the
     * steps it lets through are bit for bit those without it. With the offload tier, updates in
     * backward (UMT_OFFLOAD_OPTIM_BACKWARD) then run after backward, as they do with clipping. */
    umt_nonfinite_policy on_nonfinite;
    /* The step consumes the gradients it updates from: its update writes a zero over each one it
     * has read (over all of them when the step is skipped), so that they are zero after it, as
     * after umt_zero_grad, and the next umt_zero_grad has nothing to fill for them: one pass over
     * every gradient fewer a step, with the same updates bit for bit. Off by default: PyTorch
     * keeps the gradients after a step, to read or to add to. A parameter that a subsystem
     * updates itself (the offload tier) keeps that subsystem's own way. */
    bool zero_grads_in_step;
} umt_optimizer_options;

/* PyTorch's defaults for the kind (SGD lr 0.01; Adam lr 1e-3; AdamW lr 1e-3 wd 1e-2;
 * Adadelta lr 1.0 rho 0.9 eps 1e-6); no clipping; loss scaling off, and when turned on,
 * GradScaler's scale 65536 and growth interval 2000; no non-finite check. */
umt_optimizer_options umt_optimizer_defaults(umt_optimizer_kind kind);
/* "sgd", "adam", "adamw", "adadelta" -> kind; UMT_ERR_INVALID_ARGUMENT for anything else. */
umt_status umt_optimizer_kind_parse(const char *name, umt_optimizer_kind *out);

/* An optimizer over every parameter registered with ctx; its state lives in the optim pool.
 * Parameters made later are not covered; do not free a covered parameter while it lives. */
umt_status umt_optimizer_create(umt_context *ctx, const umt_optimizer_options *options,
                                umt_optimizer **out);
/* One update of every parameter from its gradient. A parameter with a bf16/f16 compute copy
 * (a context of that precision) has the copy rewritten in the same pass. With loss scaling or
 * clipping on, an inf or NaN gradient skips the whole step (nothing moves, not even Adam's
 * step count); it still counts in umt_optimizer_steps. */
umt_status umt_optimizer_step(umt_optimizer *opt);
/* umt_backward with the loss gradient seeded with opt's current loss scale instead of 1 (read
 * on the device: no wait). Without loss scaling it is umt_backward. opt must belong to ctx. */
umt_status umt_backward_scaled(umt_context *ctx, umt_tensor *loss, const umt_optimizer *opt);
/* Steps skipped (for an inf or NaN gradient, a non-finite loss, or after UMT_NONFINITE_STOP), and
 * the current loss scale (1 without loss scaling). Both read the device: they wait for queued
 * work, so ask once per epoch, not per step. -1 and NaN when the read fails or opt is NULL
 * (umt_last_error says why). */
int64_t umt_optimizer_skipped_steps(const umt_optimizer *opt);
float umt_optimizer_loss_scale(const umt_optimizer *opt);
void umt_optimizer_set_lr(umt_optimizer *opt, float lr);
/* The learning rate (0 for a NULL opt). */
float umt_optimizer_lr(const umt_optimizer *opt);

/* Whether the non-finite check has found a step whose loss or gradients are NaN or infinite.
 * Never waits: the device stores the first such step's count into host memory, so this is a read
 * of one word, cheap enough for every step; on a GPU it turns true once the GPU has run that step
 * (the host may be a few steps ahead). false without the check, and for a NULL opt. */
bool umt_optimizer_nonfinite_found(const umt_optimizer *opt);

typedef struct {
    int64_t steps;      /* steps whose loss or gradients were NaN or infinite: their updates skipped */
    int64_t first_step; /* the first of them, counted as umt_optimizer_steps counts (1: the first
                         * step of the optimizer, or of the checkpoint it was loaded from); 0: none */
    bool loss;          /* that step's loss was NaN or infinite, */
    float loss_value;   /* and this was its value (the loss of that step in any case; 0 if none was read) */
    const char *parameter; /* the first parameter (creation order) whose gradient held NaN or an
                            * infinity in that step, or NULL: the loss alone was (its name, which
                            * lives as long as the optimizer's context) */
    bool stopped;       /* UMT_NONFINITE_STOP: no update has been applied since first_step */
} umt_nonfinite_report;

/* What the non-finite check found (all zero without it). Reads the device: waits for queued work
 * (ask when umt_optimizer_nonfinite_found says so, or once per epoch). */
umt_status umt_optimizer_nonfinite_get(const umt_optimizer *opt, umt_nonfinite_report *out);
/* Steps taken so far (0 for a NULL opt). */
int64_t umt_optimizer_steps(const umt_optimizer *opt);
void umt_optimizer_destroy(umt_optimizer *opt);

/* ----------------------------------------------------------------------------------------- */
/* Whole training steps as one CUDA graph
 *
 * A step function does one whole training step: umt_step_begin, umt_zero_grad, forward, loss,
 * backward, umt_optimizer_step, and returns the loss (one f32), or NULL on failure. The host
 * data it changes from step to step (batch indices for umt_dataset_batch) must be read from
 * `input`, and it must not wait for the GPU. umt_step_graph_run runs it eagerly for a few
 * warm-up steps, then captures it once into a CUDA graph and from then on replays the graph
 * with the next input: one launch per step. The learning rate, the fp16 loss scale and the
 * dropout seeds are read from device memory, so schedules and dropout stay as in eager steps
 * (the same losses in fp32, bit for bit). A step whose input size differs from the captured
 * one (an epoch's last, shorter batch) runs eagerly; the graph is captured again when memory it
 * baked in moved (the activation arena after an evaluation). Where capture is impossible (CPU,
 * a failed capture, a step a replay cannot follow) every step runs eagerly, and the reason is
 * printed once on stderr. Everything else a step's kernels take by value is baked in at
 * capture: change another hyper-parameter (momentum, weight decay) with a new graph. The
 * optimizer's non-finite check (on_nonfinite) runs inside a replay as in an eager step: the
 * step's loss and gradients are checked on the device, and its doorbell rings in host memory.
 * With data parallelism (dist/umt_dist.h) the step's all-reduces are captured with it; NCCL then
 * needs every rank to capture, replay and run eagerly at the same steps, so every rank must call
 * this at the same steps with inputs of the same size (the global batch, of which the step takes
 * its rank's part), and the ranks agree on what only one knows (a failed capture, moved memory). */
typedef struct umt_step_graph umt_step_graph;
typedef umt_tensor *(*umt_step_fn)(umt_context *ctx, void *user, const void *input, size_t input_bytes);

/* capture false: always eager (for comparison); the run still keeps its loss on the device. */
umt_status umt_step_graph_create(umt_context *ctx, bool capture, umt_step_graph **out);
/* One training step on input (input_bytes long; NULL only when 0), eagerly or by a replay; user
 * goes to step as it is (NULL is fine). No host wait. */
umt_status umt_step_graph_run(umt_step_graph *graph, umt_step_fn step, void *user, const void *input,
                              size_t input_bytes);
/* The last step's loss: a 1-element f32 tensor of the graph, rewritten by every step (NULL for a
 * NULL graph). */
const umt_tensor *umt_step_graph_loss(const umt_step_graph *graph);
/* The mean loss of the steps since the previous call, and their count; waits for the GPU. */
umt_status umt_step_graph_take_mean_loss(umt_step_graph *graph, double *mean, int64_t *steps);
typedef struct {
    int64_t eager_steps, replayed_steps, captures;
} umt_step_graph_stats;
/* All 0 for a NULL graph. */
umt_step_graph_stats umt_step_graph_stats_get(const umt_step_graph *graph);
/* Why steps run eagerly for good (NULL while capture is on or allowed, and for a NULL graph). */
const char *umt_step_graph_off_reason(const umt_step_graph *graph);
void umt_step_graph_destroy(umt_step_graph *graph);

/* Several trainings' steps as one CUDA graph (core/step/step_group.c): one launch a step for all
 * of them. A sweep trains N small models on one GPU; launched as N graphs from N threads their
 * steps overlap little. A group captures its members' steps (each on its own context's stream)
 * into one graph with a branch per member, which the GPU runs side by side, and replays it with
 * each member's next input. Each member trains as it would alone: the same bits. The members are
 * step graphs of distinct contexts on one GPU, all driven by the calling thread, without
 * collectives. Where a group cannot capture (the CPU, a member's graph without capture or off, a
 * failed capture) each member runs its own step graph (umt_step_graph_run), said once. A step in
 * which a member's input size differs from the captured one runs every member eagerly; one whose
 * memory moved (an evaluation) makes the group capture again after the warm-up. Losses and
 * counts are read through the members (umt_step_graph_loss, _take_mean_loss, _stats_get). */
typedef struct umt_step_group umt_step_group;
/* graphs[0..count): the members, which must outlive the group. */
umt_status umt_step_group_create(umt_step_graph *const *graphs, int count, umt_step_group **out);
/* One step of every member i: step(its context, users[i], inputs[i], input_bytes[i]). No host wait. */
umt_status umt_step_group_run(umt_step_group *group, umt_step_fn step, void *const *users,
                              const void *const *inputs, const size_t *input_bytes);
/* The group's own counts: steps its members ran eagerly together, replays, captures (all 0 for
 * NULL); each member's own are its graph's (umt_step_graph_stats_get). */
umt_step_graph_stats umt_step_group_stats_get(const umt_step_group *group);
/* Why each member runs its own step graph (NULL while the group captures, and for NULL). */
const char *umt_step_group_off_reason(const umt_step_group *group);
void umt_step_group_destroy(umt_step_group *group);

/* Step decay: base_lr * gamma^(floor(epoch / step_size)). */
float umt_lr_step(float base_lr, float gamma, int step_size, int epoch);
/* Cosine annealing from base_lr (t = 0) to min_lr (t = total). */
float umt_lr_cosine(float base_lr, float min_lr, int64_t t, int64_t total);

/* ----------------------------------------------------------------------------------------- */
/* Checkpoints: every parameter and buffer (by name), the optimizer's state and step count, the
 * context's RNG, and the caller's epoch and step, in one file with a header, a version and a
 * checksum (docs/CHECKPOINT.md). Written to a temporary file and renamed over the target, so a
 * crash never leaves a torn checkpoint. */

/* The context's random number generator (xoshiro256**) as it is at one point of a run: a program
 * that must draw again what it drew from there (an epoch's shuffle, resuming inside that epoch)
 * keeps it, sets it back, draws, and sets the state it had before. */
typedef struct {
    uint64_t s[4];
} umt_rng_state;

umt_status umt_rng_state_get(const umt_context *ctx, umt_rng_state *out);
/* A state of all zeros is refused (the generator would draw only zeros from it). */
umt_status umt_rng_state_set(umt_context *ctx, const umt_rng_state *state);

typedef struct {
    int64_t epoch; /* epochs finished */
    int64_t step;  /* optimizer steps taken */
    /* Saved inside an epoch (a run stopped by a signal): the steps of the epoch after `epoch` that
     * were taken, and the RNG as it was when that epoch began, before its shuffle: set it back
     * (umt_rng_state_set) to draw the same order, then the context's own state again to go on
     * from the saved step. 0 and all zeros at an epoch's end. */
    int64_t epoch_step;
    umt_rng_state epoch_rng;
} umt_checkpoint_info;

/* opt may be NULL (a model-only checkpoint). info's epoch, step and epoch_step (0 when info is
 * NULL) and the optimizer's step count must be within 0..2^53, as load requires; a path must be
 * named (not NULL, not empty). A NaN or infinite value in any tensor it would write (a parameter,
 * a buffer, an optimizer state: what load refuses) stops the save with UMT_ERR_STATE naming the
 * tensor and the element, and the file at path is left as it was: a diverged run never replaces
 * its last good checkpoint. A checkpoint saved at an epoch's end (epoch_step 0) is format version
 * 1, as before; one saved inside an epoch is version 2 (docs/CHECKPOINT.md).
 * Signals: from the temporary file's creation to its rename or removal, the calling thread
 * blocks SIGINT and SIGTERM, and restores its mask after. A SIGINT or SIGTERM whose action is the
 * default (ending the process) stops the save within 16 MiB of writing: the temporary file is
 * removed, and the signal then takes effect, so the process ends as it would have, leaving the
 * previous checkpoint at path and no temporary file. One the program catches or ignores waits
 * for the save to finish (a handler then runs; Ctrl-C can mean "stop after this save"). A signal
 * goes to a thread that does not block it, so for this to hold the program's other threads
 * should block both (umtrain's loader threads do). */
umt_status umt_checkpoint_save(umt_context *ctx, const umt_optimizer *opt, const umt_checkpoint_info *info,
                               const char *path);
/* Whether umt_checkpoint_save could write path now: path is not a folder, and the temporary file
 * a save writes first can be created beside it (it is created and removed). For programs that
 * save after long work: ask before it, so that a mistyped folder costs nothing. */
umt_status umt_checkpoint_check_writable(const char *path);
/* Loads into the context's parameters and buffers (names, shapes and dtypes must match; a
 * missing, extra or mismatched tensor, a truncated file or a bad checksum is an error naming
 * it) and, when opt is given, into the optimizer; restores the RNG; fills *info if not NULL.
 * path must be a regular file (a FIFO, a directory or a device is refused before any read). An
 * epoch, step or optimizer step count outside 0..2^53 is refused, and so is a NaN or infinite
 * value in any tensor it would load (naming the tensor and the element): see
 * umt_checkpoint_load_with to load one anyway. Names read from the file are printed escaped
 * (\xNN for any byte outside printable ASCII). A refused file changes nothing. */
umt_status umt_checkpoint_load(umt_context *ctx, umt_optimizer *opt, umt_checkpoint_info *info, const char *path);

/* How umt_checkpoint_load_with loads; all false (or NULL options) is umt_checkpoint_load. */
typedef struct {
    /* Load NaN and infinite values instead of refusing the file: to look into a run that
     * diverged (which layer went first, and where), not to train on. */
    bool allow_nonfinite;
} umt_checkpoint_load_options;

/* umt_checkpoint_load with options (NULL: the defaults). */
umt_status umt_checkpoint_load_with(umt_context *ctx, umt_optimizer *opt, umt_checkpoint_info *info, const char *path,
                                    const umt_checkpoint_load_options *options);

/* ----------------------------------------------------------------------------------------- */
/* Datasets */

typedef struct umt_dataset umt_dataset;

/* Loads an image IDX file (u8, [N,H,W] or [N,D]) and a label IDX file (u8, [N]), raw or
 * gzip-compressed, validating magic, rank, dimensions, sizes against the file's length,
 * that both hold N samples and that every label is < num_classes. The samples live in the
 * dataset pool. */
umt_status umt_dataset_load_idx(umt_context *ctx, const char *images_path,
                                const char *labels_path, int num_classes, umt_dataset **out);
void umt_dataset_destroy(umt_dataset *ds);
/* Samples and classes (0 for a NULL ds). */
int64_t umt_dataset_size(const umt_dataset *ds);
int umt_dataset_num_classes(const umt_dataset *ds);
/* Shape of one sample as a [C,H,W] image (C = 1 for [N,H,W] files; [D,1,1] for [N,D]); zeros for a
 * NULL ds. */
void umt_dataset_sample_shape(const umt_dataset *ds, int64_t chw[3]);

/* The samples of source (a dataset of another context of this process, on the same device), read
 * by ctx without a copy: one dataset on the GPU gathered from by many contexts (a sweep), its
 * bytes uploaded once and counted once, in the source context's dataset pool (UMT_MEM_REPORT
 * shows the share as a line "dataset shared ... (counted there)" in ctx's report). The share
 * belongs to ctx (freed with it, or by umt_dataset_destroy); the source's context must outlive
 * it. Nothing writes a dataset's samples after its load, so contexts on several threads gather
 * from one at once. */
umt_status umt_dataset_share(umt_context *ctx, const umt_dataset *source, umt_dataset **out);

/* Gathers samples indices[0..count) into a new batch: images f32 [count,C,H,W] normalised
 * as (pixel/255 - mean)/std, labels i32 [count]; both in the activations pool. */
umt_status umt_dataset_batch(umt_context *ctx, const umt_dataset *ds, const int64_t *indices,
                             int64_t count, float mean, float std, umt_tensor **images,
                             umt_tensor **labels);

/* The same batch with its images in dtype: UMT_F32 as umt_dataset_batch, or bf16 or f16 (what
 * a first layer computing in them casts its input to), each value the f32 one rounded once and
 * laid out NHWC, as that cast makes them: a model then gets the same bits with no cast in its
 * step. Half images need a backend with half-precision kernels (CUDA): elsewhere,
 * UMT_ERR_UNSUPPORTED. */
umt_status umt_dataset_batch_as(umt_context *ctx, const umt_dataset *ds, const int64_t *indices,
                                int64_t count, float mean, float std, umt_dtype dtype,
                                umt_tensor **images, umt_tensor **labels);

/* Light-on-dark (as MNIST) from a file: keep it, invert it, or invert when the file's mean
 * grey level is above half (a dark figure on a light page). */
typedef enum { UMT_INVERT_NO = 0, UMT_INVERT_YES, UMT_INVERT_AUTO } umt_invert;

/* Reads PNG, JPEG or BMP files (stb_image), converts each to `channels` (1: grey, 3: RGB),
 * resizes it to height x width when it differs, optionally inverts it, and normalises it as
 * (pixel/255 - mean)/std into a new f32 batch [count, channels, height, width] in the
 * activations pool. An unreadable file, a path that is not a regular file (a FIFO, a directory,
 * a device), a corrupt file (a PNG chunk whose CRC does not match, a JPEG Huffman table of more
 * than 256 codes), or one over 16384 pixels on a side, is an error naming it and saying why. */
umt_status umt_images_load(umt_context *ctx, const char *const *paths, int64_t count, int64_t channels, int64_t height,
                           int64_t width, umt_invert invert, float mean, float std, umt_tensor **out);

/* A seeded random permutation of 0..n-1 from the context's RNG (for shuffling an epoch). */
umt_status umt_permutation(umt_context *ctx, int64_t n, int64_t *out);

/* ----------------------------------------------------------------------------------------- */
/* Host-side samples and the prefetching loader */

/* Labelled samples read on the host, one at a time, by the loader's threads: an IDX pair kept in
 * host memory, or an image folder decoded file by file. Independent of any context. */
typedef struct umt_samples umt_samples;

/* The IDX pair of umt_dataset_load_idx (same checks), kept in host memory. */
umt_status umt_samples_load_idx(const char *images_path, const char *labels_path, int num_classes,
                                umt_samples **out);
void umt_samples_destroy(umt_samples *samples);
/* Samples and classes (0 for a NULL samples). */
int64_t umt_samples_size(const umt_samples *samples);
int umt_samples_num_classes(const umt_samples *samples);
/* [C,H,W] of one sample, as umt_dataset_sample_shape (zeros for a NULL samples). */
void umt_samples_shape(const umt_samples *samples, int64_t chw[3]);
/* Image folders: the name of class i (its folder), NULL otherwise (and for a NULL samples). */
const char *umt_samples_class_name(const umt_samples *samples, int i);
/* Image folders opened with skip_bad: how many files (and empty class folders) this split
 * skipped, and the message of the first one (NULL when none); 0 and NULL for a NULL samples. Each
 * counts once: with train/ and test/ folders in the split of its folder, otherwise in the
 * training split. */
int64_t umt_samples_skipped(const umt_samples *samples);
const char *umt_samples_first_skip(const umt_samples *samples);

typedef struct {
    const char *root;     /* root/<class>/<file>.png|jpg|jpeg|bmp, or root/train/<class>, root/test/<class> */
    int channels;         /* 1 (grey) or 3 (colour); 0: what the first readable file has */
    int height, width;    /* every image is resized to this */
    double test_fraction; /* without train/ and test/ folders: this share of each class is test */
    bool skip_bad;        /* skip (and count) bad files, those that do not decode too (the scan then
                           * decodes each file), and empty class folders, instead of failing */
} umt_image_folder_options;

/* Scans an image folder: class names are the sub-folders' names, sorted; each entry named like
 * an image (.png, .jpg, .jpeg, .bmp) is read and checked, and its header read (stb_image). An
 * unreadable or non-image file, an entry that is not a regular file, a file whose channels do
 * not match (grey for 1, colour for 3), or an empty class folder is an error naming it, unless
 * skip_bad. Pixels are decoded later, by the loader's threads. test may be NULL. */
umt_status umt_image_folder_open(const umt_image_folder_options *options, umt_samples **train,
                                 umt_samples **test);

typedef enum {
    UMT_LOADER_PINNED = 0,   /* loader threads, pinned staging ring, copies on a copy stream */
    UMT_LOADER_PAGEABLE_SYNC /* for comparison: assembled in the caller, pageable, synchronous copy */
} umt_loader_kind;

/* "pinned", "pageable-sync" -> kind. */
umt_status umt_loader_kind_parse(const char *name, umt_loader_kind *out);

typedef struct {
    int64_t batch_size;
    int depth;            /* staging slots: batches assembled ahead of the one in use (>= 1) */
    int workers;          /* loader threads (>= 1; pageable-sync uses none) */
    umt_loader_kind kind;
    bool shuffle;         /* a new permutation from the context's RNG each epoch */
    float mean, std;      /* normalisation: (pixel/255 - mean) / std */
    int crop_padding;     /* > 0: random crop of the original size from the image padded by this */
    bool flip;            /* random horizontal flip */
} umt_loader_options;

/* batch 64, depth 4, one worker, pinned, shuffled, mean 0, std 1, no augmentation. */
umt_loader_options umt_loader_defaults(void);

typedef struct umt_loader umt_loader;

/* A loader over samples (which must outlive it) for the context's device; its staging ring is
 * taken from the staging (host side) and inputs (device side) pools. */
umt_status umt_loader_create(umt_context *ctx, const umt_samples *samples, const umt_loader_options *options,
                             umt_loader **out);
void umt_loader_destroy(umt_loader *loader);
/* Starts an epoch over the first `limit` samples (0: all): draws the permutation, wakes the
 * threads. A previous epoch need not be finished. Returns the number of batches in *batches
 * (batches may be NULL). */
umt_status umt_loader_start_epoch(umt_loader *loader, int64_t limit, int64_t *batches);
/* The same epoch (the same draws from the context's RNG), started at batch first_batch: the
 * batches before it are never assembled, and umt_loader_next hands out first_batch first. For a
 * run resumed inside an epoch; *batches is still the whole epoch's count. */
umt_status umt_loader_start_epoch_at(umt_loader *loader, int64_t limit, int64_t first_batch, int64_t *batches);
/* The next batch of the epoch into new tensors of the activations pool (call after
 * umt_step_begin): images f32 [n,C,H,W], labels i32 [n]. At the end of the epoch both are NULL.
 * An error of a loader thread (a file that does not decode) is returned here, naming the file. */
umt_status umt_loader_next(umt_loader *loader, umt_tensor **images, umt_tensor **labels);
/* The same batch in two halves, for steps a step graph captures and replays (umt_step_graph_run),
 * which umt_loader_next's batches, each in a slot of its own, cannot be. Before the step, outside
 * it: umt_loader_hold_next takes the epoch's next batch into the loader's held block, which stays
 * at one device address (queued on the compute stream; *count its samples, 0 at the end of the
 * epoch). Inside the step: umt_loader_take_held copies the held batch into new tensors of the
 * activations pool, as umt_loader_next would (both NULL when none is held); a replay repeats that
 * copy. A batch's samples are the same either way. */
umt_status umt_loader_hold_next(umt_loader *loader, int64_t *count);
umt_status umt_loader_take_held(umt_loader *loader, umt_tensor **images, umt_tensor **labels);

typedef struct {
    int64_t batches;      /* handed out since the last call */
    double wait_ms;       /* the compute stream's wait for data (CUDA events; the CPU's clock) */
} umt_loader_stats;

/* What the loader did since the previous call (waits for the timing events it still needs). */
umt_status umt_loader_take_stats(umt_loader *loader, umt_loader_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* UMTRAIN_H */
