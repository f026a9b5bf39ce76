/* core/base/capture_lock.c — the process's capture lock (core/base/capture_lock.h). */
#define _GNU_SOURCE /* PTHREAD_MUTEX_RECURSIVE in glibc's headers under -std=c11 */
#include "core/base/capture_lock.h"

#include <pthread.h>

static pthread_mutex_t lock;
static pthread_once_t made = PTHREAD_ONCE_INIT;

static void make(void) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&lock, &attr);
    pthread_mutexattr_destroy(&attr);
}

void umt_capture_lock(void) {
    pthread_once(&made, make);
    pthread_mutex_lock(&lock);
}

void umt_capture_unlock(void) { pthread_mutex_unlock(&lock); }
