/* Accessing-now records: the handshake that keeps a segment's memory from going away while another
   thread touches it, on a free-threaded CPython (on a GIL build, every function is empty).
   arenalib/_access.pxi says how the protocol works and who takes part; this is its C.

   C, not Cython: the records are per-thread (__thread, a pthread key) and the protocol is a
   sequence of atomics and fences whose order is the whole point; Cython has neither, and the fast
   functions must stay static inline for the hot paths (every Segment access announces itself).
   Included by arenalib/_access.pxi only, into the one translation unit of arenalib._arena. */

#ifndef ARENALIB_ACCESS_H
#define ARENALIB_ACCESS_H

#include <Python.h>
#include <pthread.h>
#include <sched.h>

#include "arenalib/platform.h"  /* ARENALIB_FREE_THREADED */
#include "fork.h"               /* the exclusive flag: a lock a fork may leave held */

/* Segment._freed of a root segment: a free under way is FREEING until it is done or undone.
   (Also defined, to the same values, by arenalib/_arena.pxd until it includes this header.) */
#ifndef ARENALIB_SEG_ALIVE
#define ARENALIB_SEG_ALIVE 0
#define ARENALIB_SEG_FREED 1
#define ARENALIB_SEG_FREEING 2
#endif

#define ARENALIB_ACCESS_RECORDS 1024
/* Segment._accessor once records of two threads (or a thread without one) have named it. */
#define ARENALIB_ACCESSOR_MANY ((void *)1)

#if ARENALIB_FREE_THREADED
typedef struct {
    void *life;           /* the Lifetime this thread is accessing now, or NULL */
    void *seg;            /* the root segment it is accessing now, or NULL */
    int taken;            /* the record belongs to a live thread */
    char padding[64 - 2 * sizeof(void *) - sizeof(int)];
} __attribute__((aligned(64))) arenalib_access_record;

static arenalib_access_record arenalib_records[ARENALIB_ACCESS_RECORDS];
static int arenalib_records_used;      /* records ever taken: [0, used) is scanned */
static pthread_mutex_t arenalib_overflow_lock = PTHREAD_MUTEX_INITIALIZER;
static char arenalib_overflow_token;   /* the token of a thread without a record */
static int arenalib_overflow_users;    /* threads inside the overflow lock: writers lock it only then */
static pthread_key_t arenalib_record_key;
static __thread arenalib_access_record *arenalib_my_record;
static __thread int arenalib_no_record;  /* the table was full when this thread looked */

static void arenalib_record_release(void *record) {
    arenalib_access_record *r = (arenalib_access_record *)record;
    __atomic_store_n(&r->seg, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&r->life, NULL, __ATOMIC_RELAXED);
    __atomic_store_n(&r->taken, 0, __ATOMIC_RELEASE);
}

static int arenalib_records_init(void) {
    return pthread_key_create(&arenalib_record_key, arenalib_record_release);
}

static arenalib_access_record *arenalib_record_claim(void) {
    int i, expected, used;
    for (i = 0; i < ARENALIB_ACCESS_RECORDS; i++) {
        expected = 0;
        if (__atomic_load_n(&arenalib_records[i].taken, __ATOMIC_RELAXED) == 0
                && __atomic_compare_exchange_n(&arenalib_records[i].taken, &expected, 1, 0,
                                               __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            used = __atomic_load_n(&arenalib_records_used, __ATOMIC_RELAXED);
            while (used < i + 1 && !__atomic_compare_exchange_n(
                    &arenalib_records_used, &used, i + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
                ;
            if (pthread_setspecific(arenalib_record_key, &arenalib_records[i]) != 0) {
                arenalib_record_release(&arenalib_records[i]);
                break;
            }
            arenalib_my_record = &arenalib_records[i];
            return arenalib_my_record;
        }
    }
    arenalib_no_record = 1;
    return NULL;
}

static inline int arenalib_access_blocked(int *busy, int *seg_state) {
    return arenalib_generation_locked(busy)
        || (seg_state && __atomic_load_n(seg_state, __ATOMIC_ACQUIRE) == ARENALIB_SEG_FREEING);
}

static inline void arenalib_access_exit(void *token) {
    arenalib_access_record *r = (arenalib_access_record *)token;
    if (token == (void *)&arenalib_overflow_token) {
        __atomic_sub_fetch(&arenalib_overflow_users, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&arenalib_overflow_lock);
    } else if (r != NULL) {
        __atomic_store_n(&r->seg, NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&r->life, NULL, __ATOMIC_RELEASE);
    }
}

/* Note in a root segment's ``accessor`` that ``r`` (NULL: a thread without a record) accesses
   it; written only on a thread's first access, so the segment's line stays unshared. */
static inline void arenalib_note_accessor(void **accessor, arenalib_access_record *r) {
    void *seen = __atomic_load_n(accessor, __ATOMIC_RELAXED);
    void *expected = NULL;
    if (seen == (void *)r && r != NULL)
        return;
    if (seen == ARENALIB_ACCESSOR_MANY)
        return;
    if (seen == NULL && r != NULL
            && __atomic_compare_exchange_n(accessor, &expected, (void *)r, 0, __ATOMIC_RELAXED,
                                           __ATOMIC_RELAXED))
        return;
    __atomic_store_n(accessor, ARENALIB_ACCESSOR_MANY, __ATOMIC_RELAXED);
}

/* Announce an access of ``life`` (and of root segment ``seg`` with state ``seg_state`` and
   accessor note ``accessor``, or NULLs), once no writer is at work on either; the token goes
   to arenalib_access_exit(). */
static inline void *arenalib_access_enter(void *life, int *busy, void *seg, int *seg_state,
                                          void **accessor) {
    arenalib_access_record *r = arenalib_my_record;
    void *token;
    if (r == NULL && !arenalib_no_record)
        r = arenalib_record_claim();
    if (accessor != NULL)
        arenalib_note_accessor(accessor, r);  /* before the fence, as the record is */
    for (;;) {
        if (r != NULL) {
            __atomic_store_n(&r->seg, seg, __ATOMIC_RELAXED);
            __atomic_store_n(&r->life, life, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            token = r;
        } else {
            pthread_mutex_lock(&arenalib_overflow_lock);
            __atomic_add_fetch(&arenalib_overflow_users, 1, __ATOMIC_SEQ_CST);
            /* As after a record's stores: the accessor note and the count come before the
               checks in C11's order too, not only on the hardware's. */
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            token = &arenalib_overflow_token;
        }
        if (!arenalib_access_blocked(busy, seg_state))
            return token;
        arenalib_access_exit(token);
        while (arenalib_access_blocked(busy, seg_state))
            sched_yield();
    }
}

/* Threads without a record access under the overflow lock: wait for the one inside, unless
   it is this thread (``my_token``: a caller holding an access of its own while it waits;
   arenalib's frees and releases take theirs only after free_begin(), and pass NULL). */
static void arenalib_wait_overflow(void *my_token) {
    if (my_token != (void *)&arenalib_overflow_token
            && __atomic_load_n(&arenalib_overflow_users, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&arenalib_overflow_lock);
        pthread_mutex_unlock(&arenalib_overflow_lock);
    }
}

/* Wait until no other thread's record names ``life`` (or, when life is NULL, ``seg``). */
static void arenalib_wait_readers(void *life, void *seg, void *my_token) {
    int i, used = __atomic_load_n(&arenalib_records_used, __ATOMIC_ACQUIRE);
    arenalib_access_record *r;
    for (i = 0; i < used; i++) {
        r = &arenalib_records[i];
        if ((void *)r == my_token)
            continue;
        if (life != NULL)
            while (__atomic_load_n(&r->life, __ATOMIC_ACQUIRE) == life)
                sched_yield();
        else
            while (__atomic_load_n(&r->seg, __ATOMIC_ACQUIRE) == seg)
                sched_yield();
    }
    arenalib_wait_overflow(my_token);
}

/* Exclusive use of ``life`` (a reset or a close) against every reader. */
static void arenalib_exclusive_begin(void *life, int *busy) {
    while (!arenalib_generation_try_lock(busy))
        sched_yield();  /* another reset or close of the same owner is at work */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    arenalib_wait_readers(life, NULL, NULL);
}

static inline void arenalib_exclusive_end(int *busy) {
    arenalib_generation_unlock(busy);
}

/* Start freeing a root segment: 0 when it is freed already (by this call's rival, say). */
static int arenalib_free_begin(int *seg_state, void *seg, void **accessor, void *my_token) {
    arenalib_access_record *r;
    int expected;
    for (;;) {
        expected = ARENALIB_SEG_ALIVE;
        if (__atomic_compare_exchange_n(seg_state, &expected, ARENALIB_SEG_FREEING, 0,
                                        __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
            break;
        if (expected == ARENALIB_SEG_FREED)
            return 0;
        sched_yield();  /* another thread is freeing it: see whether it stays freed */
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* Every reader that missed FREEING noted itself before its fence: read after ours. */
    r = (arenalib_access_record *)__atomic_load_n(accessor, __ATOMIC_RELAXED);
    if (r == ARENALIB_ACCESSOR_MANY) {
        arenalib_wait_readers(NULL, seg, my_token);
    } else if (r != NULL && (void *)r != my_token) {
        while (__atomic_load_n(&r->seg, __ATOMIC_ACQUIRE) == seg)
            sched_yield();
    }
    return 1;
}

static inline void arenalib_free_end(int *seg_state, int freed) {
    __atomic_store_n(seg_state, freed ? ARENALIB_SEG_FREED : ARENALIB_SEG_ALIVE, __ATOMIC_RELEASE);
}

/* In a fork's child only the calling thread is left: the others' records are free. */
static void arenalib_records_after_fork(void) {
    int i;
    for (i = 0; i < ARENALIB_ACCESS_RECORDS; i++) {
        if (&arenalib_records[i] != arenalib_my_record)
            arenalib_record_release(&arenalib_records[i]);
    }
    pthread_mutex_init(&arenalib_overflow_lock, NULL);
    arenalib_overflow_users = 0;
}
#else  /* the GIL orders every access before every free: nothing to do */
static inline int arenalib_records_init(void) { return 0; }
static inline void *arenalib_access_enter(void *l, int *b, void *s, int *st, void **a) {
    return NULL;
}
static inline void arenalib_access_exit(void *token) { }
static inline void arenalib_exclusive_begin(void *life, int *busy) { }
static inline void arenalib_exclusive_end(int *busy) { }
static inline int arenalib_free_begin(int *st, void *seg, void **a, void *token) {
    if (*st == ARENALIB_SEG_FREED) return 0;
    *st = ARENALIB_SEG_FREEING;
    return 1;
}
static inline void arenalib_free_end(int *st, int freed) {
    *st = freed ? ARENALIB_SEG_FREED : ARENALIB_SEG_ALIVE;
}
static inline void arenalib_records_after_fork(void) { }
#endif

#endif  /* ARENALIB_ACCESS_H */
