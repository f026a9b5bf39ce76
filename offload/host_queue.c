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
 * A job's gradient comes home in pieces (offload/state.h), and each side learns of the other's
 * progress through words of pinned memory, with no host function and no interrupt between them:
 *   arrival  after each piece's copy home, the copy-out stream writes the job's count of pieces
 *            home (cuStreamWriteValue32, behind a memory barrier: the piece's bytes are visible
 *            first). Host functions would do, but the driver runs them in bursts milliseconds
 *            apart (measured, docs/PERF.md): the threads would wait for pieces long home;
 *   threads  one per core but the spare, started once: each takes the next work item whose piece
 *            is home from the newest job queued; while none is, one of them looks at the words
 *            every few tens of microseconds and wakes the others when a piece comes. The thread
 *            that ends an item counts it in its piece's word, the one that ends a job's last item
 *            the job's count of finished updates;
 *   waits    a stream that must not read the weights before the update (the next forward's copy
 *            in) waits on those words with cuStreamWaitValue32, since a CPU thread cannot record a
 *            CUDA event; the host waits on a condition variable.
 * No deadlock: a stream's wait is queued after the job that ends it, and everything the job needs
 * (the gradient's copy home, its count written) was queued before that wait, so no wait blocks
 * work that its own job depends on, whichever hardware queue the driver puts the streams on.
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
    pthread_cond_t work;     /* a piece arrived, a job was queued, or the queue stops */
    pthread_cond_t finished; /* a job's last item is done */
    umt_offload_host_job **stack; /* queued jobs with items not yet handed out, newest on top */
    int depth, capacity;
    pthread_t threads[UMT_OFFLOAD_MAX_THREADS];
    int thread_count;
    bool watching;   /* a thread looks at the arrival words while the others sleep */
    bool stopping;
    bool abandoning; /* stopping after a stream failed: pieces still on their way never come */
    umt_trace *trace;
    double busy_s; /* thread-seconds spent in work items, all steps (umt_offload_stats) */
};

/* ----------------------------------------------------------------------------------------- */
/* A stream's wait on a word the CPU writes, and its write of a word the CPU reads: driver calls,
 * found through the runtime */

typedef CUresult (*value_fn)(CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned int flags);
static value_fn wait_value, write_value;
static pthread_once_t value_fns_once = PTHREAD_ONCE_INIT;

static value_fn driver_fn(const char *name) {
    enum cudaDriverEntryPointQueryResult found;
    void *fn = NULL;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
        return (value_fn)fn;
    return NULL;
}

static void find_value_fns(void) {
    wait_value = driver_fn("cuStreamWaitValue32");
    write_value = driver_fn("cuStreamWriteValue32");
}

/* stream waits until the word at host (pinned) reaches value, counting cyclically; or, with
 * write, writes value to it once its earlier work is done and visible. */
static umt_status stream_value(void *stream, _Atomic uint32_t *host, uint32_t value, bool write) {
    void *device = NULL;
    UMT_CUDA_TRY(cudaHostGetDevicePointer(&device, (void *)host, 0));
    CUresult r = write ? write_value((CUstream)stream, (CUdeviceptr)(uintptr_t)device, value, CU_STREAM_WRITE_VALUE_DEFAULT)
                       : wait_value((CUstream)stream, (CUdeviceptr)(uintptr_t)device, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return umt_fail(UMT_ERR_DEVICE, "offload: %s returned CUresult %d", write ?
                        "cuStreamWriteValue32 (a gradient piece's arrival for the CPU)" :
                        "cuStreamWaitValue32 (a stream's wait for the CPU's update)", (int)r);
    return UMT_OK;
}

/* Whether a stream can write a word of pinned memory and wait on one here: a write of 2, then a
 * wait for it, on stream. */
static umt_status check_stream_values(umt_offload *o, void *stream) {
    pthread_once(&value_fns_once, find_value_fns);
    if (!wait_value || !write_value)
        return umt_fail(UMT_ERR_UNSUPPORTED, "offload: the driver gives no cuStreamWaitValue32 or cuStreamWriteValue32 "
                        "(CUDA 12 or later), which the CPU's updates in backward need");
    _Atomic uint32_t *word = NULL;
    UMT_TRY(umt_memory_alloc(&o->ctx->memory, UMT_POOL_OFFLOAD, sizeof *word, (void **)&word));
    atomic_init(word, 1);
    umt_status st = stream_value(stream, word, 2, true);
    if (st == UMT_OK) st = stream_value(stream, word, 2, false);
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    if (st == UMT_OK && e != cudaSuccess)
        st = umt_fail(UMT_ERR_DEVICE, "offload: a stream's write or wait on pinned memory failed: %s",
                      cudaGetErrorString(e));
    if (st == UMT_OK && atomic_load(word) != 2)
        st = umt_fail(UMT_ERR_DEVICE, "offload: a stream wrote 2 to pinned memory, and the host reads %u",
                      (unsigned)atomic_load(word));
    umt_memory_free(&o->ctx->memory, UMT_POOL_OFFLOAD, (void *)word);
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

/* Under the lock: the job's items whose piece is home, from the count the copy-out stream wrote
 * (cyclic: the count before this update is arrival_base). */
static int64_t available(const umt_offload_host_job *job) {
    uint32_t home = atomic_load(job->pieces_home) - job->arrival_base;
    if (home >= (uint32_t)job->pieces) return job->items;
    return (int64_t)home * job->piece_items;
}

/* Under the lock: the newest job on the stack with an item whose piece is home, or NULL. A newer
 * job may wait for its first pieces while an older one has items ready. */
static umt_offload_host_job *next_job(umt_offload_host_queue *q, int *at) {
    for (int i = q->depth - 1; i >= 0; --i)
        if (q->stack[i]->handed_out < available(q->stack[i])) return *at = i, q->stack[i];
    return NULL;
}

/* Under the lock, with no item ready: one thread looks at the arrival words again in a moment and
 * wakes the others when it finds a piece; the rest sleep until then. */
static void idle(umt_offload_host_queue *q) {
    if (q->watching || !q->depth) {
        pthread_cond_wait(&q->work, &q->lock);
        return;
    }
    q->watching = true;
    pthread_mutex_unlock(&q->lock);
    nanosleep(&(struct timespec){0, 20000}, NULL); /* a piece takes about half a millisecond */
    pthread_mutex_lock(&q->lock);
    q->watching = false;
    int at;
    if (next_job(q, &at)) pthread_cond_broadcast(&q->work);
}

static void *serve(void *arg) {
    umt_offload_host_queue *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        int at = 0;
        umt_offload_host_job *job;
        while (!(job = next_job(q, &at)) && !(q->stopping && (!q->depth || q->abandoning))) idle(q);
        if (!job) break; /* stopping, and nothing left that can run */
        int64_t item = job->handed_out++;
        if (job->handed_out == job->items) { /* its last item is taken: off the stack */
            for (int i = at; i + 1 < q->depth; ++i) q->stack[i] = q->stack[i + 1];
            q->depth--;
        }
        if (item == 0) job->begin_us = umt_trace_now_us(q->trace);
        pthread_mutex_unlock(&q->lock);
        double begin_s = umt_offload_seconds();
        bool ok = umt_offload_cpu_item(&job->job, item);
        double end_s = umt_offload_seconds();
        /* After the item's writes (a read-modify-write orders them): a stream waiting for the
         * piece may copy it in once every item of it is counted. */
        atomic_fetch_add(&job->piece_finished[item / job->piece_items], 1);
        pthread_mutex_lock(&q->lock);
        q->busy_s += end_s - begin_s;
        if (!ok) atomic_store(&job->failed, 1);
        if (++job->items_done == job->items) finish(q, job);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

umt_status umt_offload_queue_start(umt_offload *o, int spare) {
    if (o->host_queue) return UMT_OK;
    UMT_TRY(check_stream_values(o, o->copy_out));
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

umt_status umt_offload_queue_piece_home(umt_offload *o, umt_offload_host_job *job) {
    return stream_value(o->copy_out, job->pieces_home, ++job->pieces_sent, true);
}

umt_status umt_offload_queue_job(umt_offload *o, umt_offload_host_job *job) {
    umt_offload_host_queue *q = o->host_queue;
    if (!q || !q->thread_count)
        return umt_fail(UMT_ERR_STATE, "offload: %s queued for the CPU before its threads started", label(job));
    pthread_mutex_lock(&q->lock);
    bool room = q->capacity >= o->host_job_count;
    if (!room) {
        umt_offload_host_job **grown = realloc(q->stack, (size_t)o->host_job_count * 2 * sizeof *grown);
        if (grown) q->stack = grown, q->capacity = o->host_job_count * 2, room = true;
    }
    if (room) {
        /* No thread touches the job now: its last update finished (umt_offload_queue_host_wait). */
        job->queue = q;
        job->handed_out = job->items_done = 0;
        job->arrival_base = job->pieces_sent - (uint32_t)job->pieces; /* its pieces' writes are queued */
        job->queued++;
        q->stack[q->depth++] = job;
        pthread_cond_broadcast(&q->work); /* a thread starts looking for its pieces */
    }
    pthread_mutex_unlock(&q->lock);
    if (!room) return umt_fail(UMT_ERR_OUT_OF_MEMORY, "offload: no memory to queue %s for the CPU", label(job));
    return UMT_OK;
}

umt_status umt_offload_queue_stream_wait(umt_offload *o, void *stream, const umt_offload_host_job *job) {
    (void)o;
    return stream_value(stream, job->finished, job->queued, false);
}

umt_status umt_offload_queue_piece_wait(umt_offload *o, void *stream, const umt_offload_host_job *job, int k) {
    (void)o;
    int64_t first = k * job->piece_items, end = first + job->piece_items < job->items ? first + job->piece_items
                                                                                     : job->items;
    /* Counted cyclically: after n updates, n times the piece's items */
    return stream_value(stream, &job->piece_finished[k], job->queued * (uint32_t)(end - first), false);
}

/* The host waits in slices of a millisecond, and asks the copy-out stream between them: where it
 * failed, a piece would never come, and the wait says so instead of hanging. */
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
        cudaError_t e = cudaStreamQuery((cudaStream_t)o->copy_out);
        if (e != cudaSuccess && e != cudaErrorNotReady) {
            pthread_mutex_unlock(&q->lock);
            return umt_fail(UMT_ERR_DEVICE, "offload: waiting for the CPU's update of %s: the copy-out stream, which "
                            "brings its gradient home, failed: %s", label(job), cudaGetErrorString(e));
        }
    }
    pthread_mutex_unlock(&q->lock);
    return UMT_OK;
}

void umt_offload_queue_usage(const umt_offload *o, int *threads, double *busy_s) {
    umt_offload_host_queue *q = o->host_queue;
    *threads = 0, *busy_s = 0;
    if (!q) return;
    pthread_mutex_lock(&q->lock);
    *threads = q->thread_count, *busy_s = q->busy_s;
    pthread_mutex_unlock(&q->lock);
}

void umt_offload_queue_stop(umt_offload *o) {
    umt_offload_host_queue *q = o->host_queue;
    if (!q) return;
    /* Every piece sent home has arrived, unless the stream failed: then none will. */
    bool failed = cudaStreamSynchronize((cudaStream_t)o->copy_out) != cudaSuccess;
    pthread_mutex_lock(&q->lock);
    q->stopping = true; /* the threads end once every queued job is done */
    q->abandoning = failed;
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
