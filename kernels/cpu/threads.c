/*
 * kernels/cpu/threads.c — the CPU backend's thread pool (threads.h says what it promises).
 *
 * The pool is process-wide: threads - 1 workers, started at the first parallel call and again
 * whenever the thread count changes, plus the caller, which runs parts too. A job is published
 * under the lock with a new generation number; each worker wakes, takes parts from a shared
 * counter until none is left, and the last one to finish wakes the caller. Parts are taken, not
 * assigned, so a slow thread (the machine is shared) holds up only the parts it took.
 *
 * One caller at a time owns the pool (a trylock): any other caller, and any call from inside a
 * part, runs its parts itself, one after another. That keeps the pool free of queues and
 * deadlocks: a kernel never waits for the pool, only for its own parts.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "kernels/cpu/threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/base/error.h"

static struct {
    pthread_mutex_t owner; /* held by the one caller whose job the pool runs */
    pthread_mutex_t lock;  /* guards what follows */
    pthread_cond_t job_posted, job_finished;
    pthread_t workers[UMT_CPU_THREADS_MAX];
    int worker_count;     /* started and not yet stopped */
    uint64_t started_at;  /* the generation when they started: a job after it is theirs */
    bool stopping;        /* the workers are asked to return (a new thread count) */
    uint64_t generation;  /* bumped by each job */
    int workers_busy;     /* workers that have not finished the current job */
    umt_cpu_task *task;   /* the current job: task(arg, part, parts) for each part */
    void *arg;
    int parts;
    atomic_int next_part; /* the next part not yet taken */
} pool = {
    .owner = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .job_posted = PTHREAD_COND_INITIALIZER,
    .job_finished = PTHREAD_COND_INITIALIZER,
};

/* True on a worker, and on a caller while it runs parts: a kernel called there runs inline. */
static _Thread_local bool inside_part;

/* umt_cpu_threads_set's count; 0: the default (UMT_CPU_THREADS, else the cores). */
static atomic_int chosen_threads;

/* ----------------------------------------------------------------------------------------- */
/* The thread count                                                                          */

/* UMT_CPU_THREADS as a count, 0 when unset, -1 when it is not a whole number in range. */
static int environment_threads(void) {
    const char *text = getenv("UMT_CPU_THREADS");
    if (!text || !*text) return 0;
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || *end || value < 1 || value > UMT_CPU_THREADS_MAX) return -1;
    return (int)value;
}

/* The cores this process may run on (its affinity mask: a container's or taskset's limit), at
 * most UMT_CPU_THREADS_MAX. */
static int available_cores(void) {
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores < 1) cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores < 1 ? 1 : cores > UMT_CPU_THREADS_MAX ? UMT_CPU_THREADS_MAX : (int)cores;
}

umt_status umt_cpu_threads_check_environment(void) {
    if (environment_threads() >= 0) return UMT_OK;
    return umt_fail(UMT_ERR_INVALID_ARGUMENT, "UMT_CPU_THREADS '%s': expected a whole number from 1 to %d",
                    getenv("UMT_CPU_THREADS"), UMT_CPU_THREADS_MAX);
}

int umt_cpu_threads(void) {
    int chosen = atomic_load(&chosen_threads);
    if (chosen > 0) return chosen;
    int from_environment = environment_threads(); /* a bad value: refused by the context, the cores here */
    return from_environment > 0 ? from_environment : available_cores();
}

umt_status umt_cpu_threads_set(int threads) {
    if (threads < 0 || threads > UMT_CPU_THREADS_MAX)
        return umt_fail(UMT_ERR_INVALID_ARGUMENT, "umt_cpu_threads_set: threads = %d, expected 0 (the default) to %d",
                        threads, UMT_CPU_THREADS_MAX);
    atomic_store(&chosen_threads, threads);
    return UMT_OK;
}

/* ----------------------------------------------------------------------------------------- */
/* Splitting work                                                                            */

int umt_cpu_parts(int64_t units, int64_t min_units) {
    int64_t most = min_units > 0 ? units / min_units : units;
    int threads = umt_cpu_threads();
    return most < 1 ? 1 : most < threads ? (int)most : threads;
}

void umt_cpu_part_range(int64_t count, int64_t align, int part, int parts, int64_t *begin, int64_t *end) {
    int64_t blocks = (count + align - 1) / align;
    int64_t first = blocks * part / parts, last = blocks * (part + 1) / parts;
    *begin = first * align < count ? first * align : count;
    *end = last * align < count ? last * align : count;
}

/* ----------------------------------------------------------------------------------------- */
/* The pool                                                                                  */

/* Takes the current job's parts until none is left. */
static void run_parts(void) {
    for (int part; (part = atomic_fetch_add(&pool.next_part, 1)) < pool.parts;) pool.task(pool.arg, part, pool.parts);
}

static void *worker_main(void *unused) {
    (void)unused;
    inside_part = true;
    pthread_mutex_lock(&pool.lock);
    /* Not the generation now: the first job may have been posted before this thread ran. */
    uint64_t seen = pool.started_at;
    for (;;) {
        while (pool.generation == seen && !pool.stopping) pthread_cond_wait(&pool.job_posted, &pool.lock);
        if (pool.stopping) break;
        seen = pool.generation;
        pthread_mutex_unlock(&pool.lock);
        run_parts();
        pthread_mutex_lock(&pool.lock);
        if (--pool.workers_busy == 0) pthread_cond_signal(&pool.job_finished);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* Stops the workers and starts `count` new ones (fewer if the system refuses threads: the
 * caller's thread runs whatever parts are left). Called by the pool's owner only. */
static void resize_workers(int count) {
    pthread_mutex_lock(&pool.lock);
    pool.stopping = true;
    pthread_cond_broadcast(&pool.job_posted);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < pool.worker_count; i++) pthread_join(pool.workers[i], NULL);
    pool.worker_count = 0;
    pool.stopping = false;
    pool.started_at = pool.generation;
    while (pool.worker_count < count &&
           pthread_create(&pool.workers[pool.worker_count], NULL, worker_main, NULL) == 0)
        pool.worker_count++;
}

/* fork() copies only the forking thread: the child starts with no workers and a free pool. */
static void before_fork(void) { pthread_mutex_lock(&pool.owner); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool.owner); }
static void after_fork_child(void) {
    pool.worker_count = 0;
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.job_posted, NULL);
    pthread_cond_init(&pool.job_finished, NULL);
    pthread_mutex_init(&pool.owner, NULL);
}
static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;
static void install_fork_handlers(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

static void run_inline(int parts, umt_cpu_task *task, void *arg) {
    bool was_inside = inside_part;
    inside_part = true;
    for (int part = 0; part < parts; part++) task(arg, part, parts);
    inside_part = was_inside;
}

void umt_cpu_parallel(int parts, umt_cpu_task *task, void *arg) {
    int threads = umt_cpu_threads();
    if (parts <= 1 || threads <= 1 || inside_part || pthread_mutex_trylock(&pool.owner) != 0) {
        run_inline(parts, task, arg);
        return;
    }
    pthread_once(&fork_handlers_once, install_fork_handlers);
    if (pool.worker_count != threads - 1) resize_workers(threads - 1);

    pthread_mutex_lock(&pool.lock);
    pool.task = task, pool.arg = arg, pool.parts = parts;
    atomic_store(&pool.next_part, 0);
    pool.workers_busy = pool.worker_count;
    pool.generation++;
    pthread_cond_broadcast(&pool.job_posted);
    pthread_mutex_unlock(&pool.lock);

    inside_part = true;
    run_parts();
    inside_part = false;

    pthread_mutex_lock(&pool.lock);
    while (pool.workers_busy > 0) pthread_cond_wait(&pool.job_finished, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.owner);
}

/* umt_cpu_parallel_range's parts: each turns its part number into its range. */
typedef struct {
    int64_t count;
    umt_cpu_range_task *task;
    void *arg;
} range_job;

static void range_part(void *arg, int part, int parts) {
    const range_job *job = arg;
    int64_t begin, end;
    umt_cpu_part_range(job->count, 16, part, parts, &begin, &end);
    if (begin < end) job->task(job->arg, begin, end);
}

void umt_cpu_parallel_range(int64_t count, int64_t min_per_part, umt_cpu_range_task *task, void *arg) {
    range_job job = {count, task, arg};
    umt_cpu_parallel(umt_cpu_parts(count, min_per_part), range_part, &job);
}
