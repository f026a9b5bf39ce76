/* dist/watchdog.c — the watchdog thread (see the header). */
#include "dist/watchdog.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/base/error.h"

enum { POLL_MS = 100, GRACE_SECONDS = 20, HUNG_EXIT_CODE = 3 };

typedef struct {
    cudaEvent_t done;
    double since_s;
    bool in_flight;
    char name[64];
} slot_state;

struct umt_watchdog {
    ncclComm_t comm;
    int device, rank, slot_count;
    double timeout_s;
    pthread_t thread;
    pthread_mutex_t lock;
    bool stop, aborted;
    char reason[512];
    slot_state *slots;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Under the lock: why this rank must stop now, or false. */
static bool find_failure(umt_watchdog *w, char *reason, size_t size) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t asked = ncclCommGetAsyncError(w->comm, &async);
    if (asked != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        snprintf(reason, size, "NCCL reported an error: %s (%s)", ncclGetErrorString(asked != ncclSuccess ? asked : async),
                 ncclGetLastError(w->comm));
        return true;
    }
    double now = now_s();
    for (int s = 0; s < w->slot_count; ++s) {
        slot_state *slot = &w->slots[s];
        if (!slot->in_flight) continue;
        cudaError_t q = cudaEventQuery(slot->done);
        if (q == cudaSuccess) slot->in_flight = false;
        else if (q != cudaErrorNotReady) {
            snprintf(reason, size, "%s: %s", slot->name, cudaGetErrorString(q));
            return true;
        } else if (now - slot->since_s > w->timeout_s) {
            snprintf(reason, size, "%s unfinished after %.0f s (a peer rank died or hangs)", slot->name, w->timeout_s);
            return true;
        }
    }
    return false;
}

static void abort_rank(umt_watchdog *w) {
    fprintf(stderr, "umtrain rank %d: %s; aborting the NCCL communicator\n", w->rank, w->reason);
    fflush(stderr);
    /* Should the abort itself block (it waits for NCCL's own threads), SIGALRM ends the process. */
    alarm(GRACE_SECONDS + 10);
    ncclCommAbort(w->comm);
    /* The rank's own waits end now and report the failure; if something still blocks it, the
     * process must not stay behind holding the GPU. */
    for (int i = 0; i < GRACE_SECONDS * 1000 / POLL_MS; ++i) {
        nanosleep(&(struct timespec){0, POLL_MS * 1000 * 1000}, NULL);
        pthread_mutex_lock(&w->lock);
        bool stopping = w->stop;
        pthread_mutex_unlock(&w->lock);
        if (stopping) {
            alarm(0);
            return;
        }
    }
    fprintf(stderr, "umtrain rank %d: still blocked %d s after the abort; exiting\n", w->rank, GRACE_SECONDS);
    _exit(HUNG_EXIT_CODE);
}

static void *watch(void *arg) {
    umt_watchdog *w = arg;
    /* Events belong to the rank's device; a new thread starts on device 0. */
    cudaSetDevice(w->device);
    for (;;) {
        nanosleep(&(struct timespec){0, POLL_MS * 1000 * 1000}, NULL);
        pthread_mutex_lock(&w->lock);
        bool failed = !w->stop && find_failure(w, w->reason, sizeof w->reason), stopping = w->stop;
        if (failed) w->aborted = true;
        pthread_mutex_unlock(&w->lock);
        if (stopping) return NULL;
        if (failed) {
            abort_rank(w);
            return NULL;
        }
    }
}

umt_status umt_watchdog_start(ncclComm_t comm, int device, int rank, double timeout_s, int slots,
                              umt_watchdog **out) {
    umt_watchdog *w = calloc(1, sizeof *w);
    slot_state *s = calloc((size_t)slots, sizeof *s);
    if (!w || !s) {
        free(w);
        free(s);
        return umt_fail(UMT_ERR_OUT_OF_MEMORY, "rank %d: no memory for the watchdog", rank);
    }
    *w = (umt_watchdog){.comm = comm, .device = device, .rank = rank, .slot_count = slots, .timeout_s = timeout_s,
                        .slots = s};
    for (int i = 0; i < slots; ++i) snprintf(s[i].name, sizeof s[i].name, "collective %d", i);
    pthread_mutex_init(&w->lock, NULL);
    int e = pthread_create(&w->thread, NULL, watch, w);
    if (e != 0) {
        pthread_mutex_destroy(&w->lock);
        free(s);
        free(w);
        return umt_fail(UMT_ERR_STATE, "rank %d: starting the watchdog thread: %s", rank, strerror(e));
    }
    *out = w;
    return UMT_OK;
}

void umt_watchdog_name(umt_watchdog *w, int slot, const char *name) {
    pthread_mutex_lock(&w->lock);
    snprintf(w->slots[slot].name, sizeof w->slots[slot].name, "%s", name);
    pthread_mutex_unlock(&w->lock);
}

void umt_watchdog_mark(umt_watchdog *w, int slot, cudaEvent_t done) {
    pthread_mutex_lock(&w->lock);
    slot_state *s = &w->slots[slot];
    s->done = done;
    s->since_s = now_s();
    s->in_flight = true;
    pthread_mutex_unlock(&w->lock);
}

umt_status umt_watchdog_check(umt_watchdog *w) {
    pthread_mutex_lock(&w->lock);
    bool aborted = w->aborted;
    umt_status status = aborted ? umt_fail(UMT_ERR_DEVICE, "rank %d: %s", w->rank, w->reason) : UMT_OK;
    pthread_mutex_unlock(&w->lock);
    return status;
}

bool umt_watchdog_aborted(umt_watchdog *w) {
    pthread_mutex_lock(&w->lock);
    bool aborted = w->aborted;
    pthread_mutex_unlock(&w->lock);
    return aborted;
}

void umt_watchdog_stop(umt_watchdog *w) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    free(w->slots);
    free(w);
}
