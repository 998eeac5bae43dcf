/* The slot pool's C: its lock, a short sleep, memory on a cache line, and the thread-exit key that
 * hands a thread's state back (arenalib/_slots.pxi).  Private to arenalib._arena. */
#ifndef ARENALIB_SRC_SLOTS_H
#define ARENALIB_SRC_SLOTS_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arenalib/platform.h"

#define arenalib_ctz(x) __builtin_ctzll(x)

static void arenalib_sleep_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

#if ARENALIB_FREE_THREADED
static pthread_mutex_t arenalib_pool_mutex = PTHREAD_MUTEX_INITIALIZER;
#define arenalib_pool_lock() pthread_mutex_lock(&arenalib_pool_mutex)
#define arenalib_pool_unlock() pthread_mutex_unlock(&arenalib_pool_mutex)
#define arenalib_pool_lock_reinit() pthread_mutex_init(&arenalib_pool_mutex, NULL)
#else /* the GIL serialises the slot pool */
#define arenalib_pool_lock() ((void)0)
#define arenalib_pool_unlock() ((void)0)
#define arenalib_pool_lock_reinit() ((void)0)
#endif

/* Zeroed memory on a cache-line boundary (NULL: none), never freed. */
static void *arenalib_cache_aligned(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0)
        return NULL;
    return memset(p, 0, size);
}

/* A thread-specific value with a destructor: arenalib's per-thread state goes back when a thread
 * that has some ends (see _thread_exit).  Set once per thread. */
static pthread_key_t arenalib_thread_exit_key;
static __thread int arenalib_thread_exit_armed;

static int arenalib_thread_exit_init(void (*on_exit)(void *)) {
    return pthread_key_create(&arenalib_thread_exit_key, on_exit);
}

/* A fork's child of a thread other than the main one (see _before_fork in _slots.pxi) counts its
 * armed threads alive: the one that brings the count to 0 as it ends stops the background thread,
 * which would keep the process alive for good (no thread of it returns from main). */
static int arenalib_headless;
static long arenalib_headless_armed;

static inline void arenalib_thread_exit_arm(void) {
    if (!arenalib_thread_exit_armed) {
        arenalib_thread_exit_armed = 1;
        if (arenalib_headless)
            __atomic_add_fetch(&arenalib_headless_armed, 1, __ATOMIC_SEQ_CST);
        pthread_setspecific(arenalib_thread_exit_key, (void *)1);
    }
}

/* In the child, on its one thread (armed now, whatever it was in the parent): headless. */
static void arenalib_headless_begin(void) {
    arenalib_headless = 1;
    arenalib_headless_armed = 1;
    arenalib_thread_exit_armed = 1;
    pthread_setspecific(arenalib_thread_exit_key, (void *)1);
}

/* An armed thread of a headless process ends: whether it was the last one. */
static int arenalib_headless_last(void) {
    return arenalib_headless && __atomic_sub_fetch(&arenalib_headless_armed, 1, __ATOMIC_SEQ_CST) == 0;
}

#endif /* ARENALIB_SRC_SLOTS_H */
