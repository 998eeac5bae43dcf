/* A shared Arena's C (arenalib/_shared.pxi): the thread-local table that finds a thread's
 * ThreadCache of an arena, and the atomics of its thread list, peak and max_bytes reservation.
 * Private to arenalib._arena. */
#ifndef ARENALIB_SRC_SHARED_H
#define ARENALIB_SRC_SHARED_H

#include <stdint.h>

#include "arenalib/platform.h"

/* A direct-mapped cache: arena serial -> this thread's ThreadCache of that (shared) arena, and
   the anchor this thread's segments of it hold in the arena's place (see _shared.pxi; NULL: none
   yet).  Only its own thread reads or writes an entry, so the anchor needs no atomics: an anchor
   here is one the thread's anchor holder keeps alive, and the holder clears it before letting go. */
typedef struct { uint64_t serial; void *cache; void *anchor; } arenalib_tls_entry;
static __thread arenalib_tls_entry arenalib_tls_cache[8];
static inline void *arenalib_tls_get(uint64_t serial) {
    arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
    return e->serial == serial ? e->cache : NULL;
}
/* jemalloc has initialised this thread's state fully (see _thread_cache). */
static __thread int arenalib_thread_ready;
static inline void arenalib_tls_set(uint64_t serial, void *cache) {
    arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
    e->serial = serial;
    e->cache = cache;
    e->anchor = NULL;
}
static inline void *arenalib_tls_anchor(uint64_t serial) {
    arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
    return e->serial == serial ? e->anchor : NULL;
}
/* 1 when the anchor was set: the thread has a cache of the arena ``serial`` in the table. */
static inline int arenalib_tls_set_anchor(uint64_t serial, void *anchor) {
    arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
    if (e->serial != serial)
        return 0;
    e->anchor = anchor;
    return 1;
}
static inline void arenalib_tls_forget_anchor(void *anchor) {
    int i;
    for (i = 0; i < 8; i++)
        if (arenalib_tls_cache[i].anchor == anchor)
            arenalib_tls_cache[i].anchor = NULL;
}
/* The calling thread owns ``o`` (its reference count is the thread's to change without an
   atomic): always, where the GIL serialises reference counts. */
/* The calling thread's state is being cleared (PyThreadState_Clear marks it first, then clears
   its dict, then what the thread's context and locals hold, whose finalizers may allocate). */
#if ARENALIB_FREE_THREADED
#define arenalib_owned_here(o) _Py_IsOwnedByCurrentThread(o)
#else
#define arenalib_owned_here(o) 1
#endif
#if PY_VERSION_HEX >= 0x030C0000
/* GIL builds too: a finalizer run by the clearing of a thread's locals that made the thread's frame
   arena left it open for good (4,000 such threads and no arena could be opened; an attack, 12-04). */
static inline int arenalib_thread_state_ending(void) {
#if PY_VERSION_HEX >= 0x030D0000
    PyThreadState *state = PyThreadState_GetUnchecked();
#else
    PyThreadState *state = _PyThreadState_UncheckedGet();
#endif
    return state == NULL || state->_status.finalizing;
}
#else
/* 3.10 and 3.11 mark no thread state as being cleared (PyThreadState_Clear clears the dict first,
   and PyThreadState_GetDict then makes a new one that is never cleared): not detected there. */
#define arenalib_thread_state_ending() 0
#endif
/* The interpreter is finalizing: other threads run no Python code again (blocked without the GIL,
   or stopped on a free-threaded build), while their states are cleared. */
#if PY_VERSION_HEX >= 0x030D0000
#define arenalib_interpreter_finalizing() Py_IsFinalizing()
#else
#define arenalib_interpreter_finalizing() _Py_IsFinalizing()
#endif
#define arenalib_atomic_add(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
/* The thread list is walked without its lock by shared_update_peak(): a node is published
   whole (release) and read so (acquire). */
#define arenalib_publish(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define arenalib_follow(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
/* *peak = max(*peak, value), against other threads doing the same: a compare-and-swap where
   they run at once; with the GIL, which every caller (a Python-level allocate) holds, a store. */
static inline void arenalib_raise_peak(Py_ssize_t *peak, Py_ssize_t value) {
#ifdef Py_GIL_DISABLED
    Py_ssize_t seen = __atomic_load_n(peak, __ATOMIC_RELAXED);
    while (value > seen && !__atomic_compare_exchange_n(peak, &seen, value, 1, __ATOMIC_RELAXED,
                                                        __ATOMIC_RELAXED))
        ;
#else
    if (value > *peak)
        *peak = value;
#endif
}
/* Add size to *counter unless that would take it past limit; 0 (nothing added) when it would. */
static inline int arenalib_reserve(Py_ssize_t *counter, size_t size, Py_ssize_t limit) {
    Py_ssize_t live = __atomic_load_n(counter, __ATOMIC_RELAXED);
    do {
        if (live > limit || size > (size_t)(limit - live))
            return 0;
    } while (!__atomic_compare_exchange_n(counter, &live, live + (Py_ssize_t)size, 1,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return 1;
}
#define arenalib_load_thread(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define arenalib_store_thread(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

#endif /* ARENALIB_SRC_SHARED_H */
