/*
 * kernels/cpu/threads.h — the CPU backend's threads: one kernel's work split into parts that run
 * at once, one thread each.
 *
 * A kernel splits its OUTPUT into parts (column blocks of C, pixel ranges of a convolution,
 * channels, planes, element ranges) and calls umt_cpu_parallel(parts, task, arg). Each part
 * computes its own outputs completely, every reduction inside it in the order one thread would
 * follow: which thread runs a part, and how many parts there are, never changes a bit of the result.
 *
 * The pool serves one caller at a time. A call made while another thread holds the pool, or from
 * inside a part, runs its parts one after another on the calling thread, so the kernels can be
 * called from any number of threads at once (a sweep's trainings, the offload tier's update
 * threads) and from inside each other, and never wait for one another.
 */
#ifndef UMT_KERNELS_CPU_THREADS_H
#define UMT_KERNELS_CPU_THREADS_H

#include <stdint.h>

#include "umtrain.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most threads umt_cpu_threads_set and UMT_CPU_THREADS accept. */
#define UMT_CPU_THREADS_MAX 256

/* One part of a kernel's work: part in [0, parts). */
typedef void umt_cpu_task(void *arg, int part, int parts);

/* Runs task(arg, part, parts) for every part in [0, parts) and returns when all are done: on
 * the pool's threads and the caller's, or all on the caller's (see above). */
void umt_cpu_parallel(int parts, umt_cpu_task *task, void *arg);

/* How many parts to cut work of `units` units into when a part should hold at least `min_units`:
 * from 1 to the thread count, so small work stays on the caller's thread. */
int umt_cpu_parts(int64_t units, int64_t min_units);

/* [*begin, *end): part `part` of `parts` nearly equal ranges over [0, count), each boundary a
 * multiple of `align` (except count itself), so parts start on whole tiles or cache lines. */
void umt_cpu_part_range(int64_t count, int64_t align, int part, int parts, int64_t *begin, int64_t *end);

/* The common case: task(arg, begin, end) over parts of [0, count), each at least min_per_part
 * units long (so small work stays on the caller's thread) and starting on a multiple of 16 (a
 * 64-byte line of floats: parts never write the same cache line). */
typedef void umt_cpu_range_task(void *arg, int64_t begin, int64_t end);
void umt_cpu_parallel_range(int64_t count, int64_t min_per_part, umt_cpu_range_task *task, void *arg);

/* UMT_CPU_THREADS, when it is set, is a whole number from 1 to UMT_CPU_THREADS_MAX; else
 * UMT_ERR_INVALID_ARGUMENT naming it (a CPU context refuses to start on a bad value). */
umt_status umt_cpu_threads_check_environment(void);

#ifdef __cplusplus
}
#endif

#endif /* UMT_KERNELS_CPU_THREADS_H */
