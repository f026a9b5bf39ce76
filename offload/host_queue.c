/*
 * offload/host_queue.c — the CPU threads that run updates in backward, newest gradient first.
 *
 * Backward sends gradients home last layer first; the next forward needs the weights first layer
 * first. Served in the order they arrive (a host function per update on one stream, as this tier
 * did before), the CPU finishes with the layer the forward needs first: the forward waits for the
 * whole queue, and the CPU then idles until the next backward sends a gradient. This queue serves
 * the newest arrival first, work item by work item: when the earliest of the CPU's layers comes
 * home, the threads turn to it, and the forward starts on it while they finish the later ones.
 * Each update is the same arithmetic on the same arrays whatever the order: the bits are those of
 * the queue in arrival order.
 *
 * Three parts:
 *   arrival  a host function on the host-update stream, after the gradient's copy home, pushes
 *            the job on a stack (no CUDA call and no wait: it takes a lock, nothing more);
 *   threads  one per core but the spare, started once: each takes the next work item of the job
 *            on top of the stack; the thread that ends a job's last item writes the job's count
 *            of finished updates to a word of pinned memory;
 *   waits    a stream that must not read the weights before the update (the next forward's copy
 *            in) waits on that word with cuStreamWaitValue32, since a CPU thread cannot record a
 *            CUDA event; the host waits on a condition variable.
 * No deadlock: a stream's wait is queued after the job that ends it, and everything the job needs
 * (the gradient's copy home, its arrival) was queued before that wait, so no wait blocks work
 * that its own job depends on, whichever hardware queue the driver puts the streams on.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "core/base/error.h"
#include "core/context.h"
#include "core/tensor.h"
#include "memory/pool.h"
#include "memory/trace.h"
#include "offload/state.h"

#include "core/base/cuda_check.h"

struct umt_offload_host_queue {
    pthread_mutex_t lock;
    pthread_cond_t work;     /* a job arrived, or the queue stops */
    pthread_cond_t finished; /* a job's last item is done */
    umt_offload_host_job **stack; /* arrived jobs with items not yet handed out, newest on top */
    int depth, capacity;
    pthread_t threads[UMT_OFFLOAD_MAX_THREADS];
    int thread_count;
    bool stopping;
    umt_trace *trace;
};

/* ----------------------------------------------------------------------------------------- */
/* The stream's wait on a word the CPU writes: a driver call, found through the runtime */

typedef CUresult (*wait_value_fn)(CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned int flags);
static wait_value_fn wait_value;
static pthread_once_t wait_value_once = PTHREAD_ONCE_INIT;

static void find_wait_value(void) {
    enum cudaDriverEntryPointQueryResult found;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess && found == cudaDriverEntryPointSuccess)
        wait_value = (wait_value_fn)fn;
}

/* stream waits until the word at host (pinned) reaches value, counting cyclically. */
static umt_status stream_wait_value(void *stream, _Atomic uint32_t *host, uint32_t value) {
    void *device = NULL;
    UMT_CUDA_TRY(cudaHostGetDevicePointer(&device, (void *)host, 0));
    CUresult r = wait_value((CUstream)stream, (CUdeviceptr)(uintptr_t)device, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return umt_fail(UMT_ERR_DEVICE, "offload: cuStreamWaitValue32 (a stream's wait for the CPU's update) "
                        "returned CUresult %d", (int)r);
    return UMT_OK;
}

/* Whether a stream can wait on a word of pinned memory here: one wait, already met, on stream. */
static umt_status check_wait_value(umt_offload *o, void *stream) {
    pthread_once(&wait_value_once, find_wait_value);
    if (!wait_value)
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: the driver gives no cuStreamWaitValue32 (CUDA 12 or later), "
                        "which the CPU's updates in backward need");
    _Atomic uint32_t *word = NULL;
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, sizeof *word, (void **)&word));
    atomic_init(word, 1);
    umt_status st = stream_wait_value(stream, word, 1);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, (void *)word);
    if (st == UMT_OK && e != cudaSuccess)
        st = umt_fail(UMT_ERR_DEVICE, "offload: a stream's wait on pinned memory failed: %s", cudaGetErrorString(e));
    return st;
}

/* ----------------------------------------------------------------------------------------- */
/* The threads */

static const char *label(const umt_offload_host_job *job) {
    return job->parameter->name ? job->parameter->name : "a parameter";
}

/* Under the lock: the job's last item is done. UMT_MEM_TRACE: its bar on the CPU's track, from
 * its first item's start (other jobs' items may have run in between). */
static void finish(umt_offload_host_queue *q, umt_offload_host_job *job) {
    umt_trace_host_interval(q->trace, job->begin_us, umt_trace_now_us(q->trace), label(job), "cpu update",
                            UMT_TRACE_HOST_UPDATE, 0);
    atomic_store(job->finished, job->queued); /* after every item's writes: the lock ordered them */
    pthread_cond_broadcast(&q->finished);
}

static void *serve(void *arg) {
    umt_offload_host_queue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->depth && !q->stopping) pthread_cond_wait(&q->work, &q->lock);
        if (!q->depth) break; /* stopping, and nothing left */
        umt_offload_host_job *job = q->stack[q->depth - 1];
        int64_t item = job->handed_out++;
        if (job->handed_out == job->items) q->depth--; /* its last item is taken: off the stack */
        if (item == 0) job->begin_us = umt_trace_now_us(q->trace);
        pthread_mutex_unlock(&q->lock);
        bool ok = umt_offload_cpu_item(&job->job, item);
        pthread_mutex_lock(&q->lock);
        if (!ok) atomic_store(&job->failed, 1);
        if (++job->items_done == job->items) finish(q, job);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

/* The host function after a gradient's copy home: no CUDA calls here. */
static void CUDART_CB arrive(void *arg) {
    umt_offload_host_job *job = arg;
    umt_offload_host_queue *q = job->queue;
    pthread_mutex_lock(&q->lock);
    q->stack[q->depth++] = job; /* room for every job was made when it was queued */
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
}

umt_status umt_offload_queue_start(umt_offload *o, int spare) {
    if (o->host_queue) return UMT_OK;
    UMT_TRY(check_wait_value(o, o->host_update));
    umt_offload_host_queue *q = calloc(1, sizeof *q);
    if (!q) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory for the CPU's update queue");
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->finished, NULL);
    q->trace = o->ctx->memory.trace;
    int wanted = umt_offload_cpu_thread_count(spare);
    while (q->thread_count < wanted && pthread_create(&q->threads[q->thread_count], NULL, serve, q) == 0)
        q->thread_count++;
    o->host_queue = q;
    if (!q->thread_count)
        return umt_fail(UMT_ERR_STATE, "offload: no thread could be started for the CPU's updates in backward");
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Jobs, and the waits for them */

umt_status umt_offload_queue_job(umt_offload *o, umt_offload_host_job *job, void *arrived) {
    umt_offload_host_queue *q = o->host_queue;
    if (!q || !q->thread_count)
        return umt_fail(UMT_ERR_STATE, "offload: %s queued for the CPU before its threads started", label(job));
    pthread_mutex_lock(&q->lock);
    bool room = q->capacity >= o->host_job_count;
    if (!room) {
        umt_offload_host_job **grown = realloc(q->stack, (size_t)o->host_job_count * 2 * sizeof *grown);
        if (grown) q->stack = grown, q->capacity = o->host_job_count * 2, room = true;
    }
    pthread_mutex_unlock(&q->lock);
    if (!room) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to queue %s for the CPU", label(job));
    /* No thread touches the job now: its last update finished (umt_offload_queue_host_wait). */
    job->queue = q;
    job->items = umt_offload_cpu_items(&job->job);
    job->handed_out = job->items_done = 0;
    job->queued++;
    UMT_TRY(umt_offload_wait(o->host_update, arrived));
    UMT_CUDA_TRY(cudaLaunchHostFunc((cudaStream_t)o->host_update, arrive, job));
    return UMT_OK;
}

umt_status umt_offload_queue_stream_wait(umt_offload *o, void *stream, const umt_offload_host_job *job) {
    (void)o;
    return stream_wait_value(stream, job->finished, job->queued);
}

/* The host waits in slices of a millisecond, and asks the host-update stream between them: where
 * it failed, an arrival would never come, and the wait says so instead of hanging. */
umt_status umt_offload_queue_host_wait(umt_offload *o, const umt_offload_host_job *job) {
    umt_offload_host_queue *q = o->host_queue;
    if (!q) return UMT_OK;
    pthread_mutex_lock(&q->lock);
    while (atomic_load(job->finished) != job->queued) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 1000000;
        if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&q->finished, &q->lock, &until);
        if (atomic_load(job->finished) == job->queued) break;
        cudaError_t e = cudaStreamQuery((cudaStream_t)o->host_update);
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            pthread_mutex_unlock(&q->lock);
            return umt_fail(UMT_ERR_DEVICE, "offload: waiting for the CPU's update of %s: the host-update stream "
                            "failed: %s", label(job), cudaGetErrorString(e));
        }
    }
    pthread_mutex_unlock(&q->lock);
    return UMT_OK;
}

void umt_offload_queue_stop(umt_offload *o) {
    umt_offload_host_queue *q = o->host_queue;
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    q->stopping = true; /* the threads end once every arrived job is done */
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->thread_count; ++i) pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->finished);
    free(q->stack);
    free(q);
    o->host_queue = NULL;
}
