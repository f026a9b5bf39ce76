/*
 * memory/ledger.h — one budget per GPU across processes: a small ledger of who holds what.
 *
 * Each process's device budget (memory/budget.h) is measured once, from the GPU's free memory.
 * Managed memory is populated lazily, so cudaMemGetInfo does not show another process's
 * cudaMallocManaged until its pages are touched: two processes started together both see the
 * whole card and may together reserve more than it has, which can hang a shared GPU. So every
 * umtrain context on a GPU keeps an entry in one file per GPU, named by the GPU's UUID, in
 * umt_ledger_dir() ($UMT_LEDGER_DIR, or /dev/shm): its process id and the device bytes it holds. Before each
 * new device block (memory/pool.c) the context reserves it here, and a block is allowed only if
 *   (b) every live holder's bytes and the request stay within umtrain's capacity on the card: the
 *       free memory less the headroom, measured by the first holder when the ledger had no live
 *       one and recorded in the file, and
 *   (c) the request fits the GPU's free memory measured again now, less a guard, so that memory
 *       taken by other programs (PyTorch, another framework) shrinks what is left;
 * (a), the context's own budget, is the pool's check, as before. A refusal allocates nothing and
 * names the other holders, the request and the capacity. memory/README.md says what the rule
 * guarantees and what it cannot see.
 *
 * This file knows nothing of CUDA: the caller passes the key (the UUID's text), the free bytes it
 * measured and the headroom, so the ledger is tested on the CPU (tests/test_ledger.c). One handle
 * is one holder (a context); the handles of several contexts of one process are holders of their
 * own, with the same pid. A handle is used by one thread at a time; handles on several threads,
 * and in several processes, exclude each other through the file's lock.
 */
#ifndef UMT_MEMORY_LEDGER_H
#define UMT_MEMORY_LEDGER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "umtrain.h"

/* Holders one ledger file has room for: contexts, across every process on the GPU. */
#define UMT_LEDGER_SLOTS 256
/* Other holders a view lists by name, the largest first (the rest are counted). */
#define UMT_LEDGER_SHOWN 8

typedef struct umt_ledger umt_ledger;

typedef struct {
    int64_t pid;  /* as that process saw itself (another pid namespace numbers it otherwise) */
    size_t bytes; /* the device bytes it holds, reservations included */
} umt_ledger_holder;

/* The ledger as one holder sees it. */
typedef struct {
    size_t capacity_bytes; /* umtrain's capacity on the GPU, recorded by the first live holder */
    size_t own_bytes;      /* this holder's entry */
    size_t others_bytes;   /* every other live holder's bytes, added up (SIZE_MAX at most) */
    int other_count;
    umt_ledger_holder others[UMT_LEDGER_SHOWN]; /* the largest other_count of them, largest first */
} umt_ledger_view;

/* $UMT_LEDGER_DIR when set and not empty, else /dev/shm, else (a machine without it) /tmp. */
const char *umt_ledger_dir(void);

/* Joins the ledger of the GPU named key (letters, digits, '-', '_' and '.', not first; at most
 * 64) in dir: the file dir/umtrain-ledger-<key>, made when missing. Dead holders' entries are
 * dropped; when no live holder is left, the capacity is recorded anew as free_bytes less
 * headroom_bytes. *view is the ledger as this new holder (holding 0 bytes) sees it. A file that is
 * not a ledger (truncated, foreign, garbage) is rebuilt when no live holder is in it, refused
 * while one is; a path that is not a regular file (a symbolic link, a FIFO, a directory) is
 * refused. */
umt_status umt_ledger_open(const char *dir, const char *key, size_t free_bytes, size_t headroom_bytes,
                           umt_ledger **out, umt_ledger_view *view);

/* Reserves request_bytes more for this holder when rules (b) and (c) above allow: free_bytes is
 * the GPU's free memory measured now, guard_bytes what (c) keeps free of it. A refusal
 * (UMT_ERR_BUDGET) changes nothing and names the other holders, the request and the capacity. */
umt_status umt_ledger_reserve(umt_ledger *ledger, size_t request_bytes, size_t free_bytes, size_t guard_bytes);

/* Lowers this holder's entry by bytes (freed blocks, or a reservation whose allocation failed).
 * Never fails: lowering is always safe, and an entry the lock could not be had for keeps its
 * higher count until the next update writes it. */
void umt_ledger_release(umt_ledger *ledger, size_t bytes);

/* The ledger now, as this holder sees it (dead holders dropped). */
umt_status umt_ledger_look(umt_ledger *ledger, umt_ledger_view *out);

/* The file's path. */
const char *umt_ledger_path(const umt_ledger *ledger);

/* The other holders as text: "pid 12: 300 bytes, pid 7 (this process): 20 bytes, 2 more: 9
 * bytes", or "none". */
void umt_ledger_describe_others(const umt_ledger_view *view, char *text, size_t size);

/* One line for UMT_MEM_REPORT: the file, the capacity, this holder's bytes and the others'. */
void umt_ledger_print(umt_ledger *ledger, FILE *out);

/* Leaves the ledger: the entry is removed and the handle freed. NULL is ok. */
void umt_ledger_close(umt_ledger *ledger);

#endif /* UMT_MEMORY_LEDGER_H */
