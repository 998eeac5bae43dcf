/* tracemalloc, told about arena blocks at the cost of a load when it is not tracing: the flag is
   CPython's own (found by _tracemalloc_flag.c at import; NULL: ask CPython, as it did before).
   CPython reads the same flag unlocked before it does anything; so do these, atomically. */
#ifndef ARENALIB_TRACEMALLOC_H
#define ARENALIB_TRACEMALLOC_H

#include <Python.h>
#include <stdint.h>

extern const int *arenalib_tracemalloc_flag;
void arenalib_tracemalloc_flag_init(void);

/* Whether tracemalloc traces (untracking address 0 changes nothing, and returns -2 when not). */
static inline int arenalib_tracemalloc_tracing(unsigned int domain) {
    const int *flag = arenalib_tracemalloc_flag;
    if (flag != NULL)
        return __atomic_load_n(flag, __ATOMIC_RELAXED) != 0;
    return PyTraceMalloc_Untrack(domain, 0) == 0;
}

static inline void arenalib_trace_track(unsigned int domain, size_t ptr, size_t size) {
    const int *flag = arenalib_tracemalloc_flag;
    if (flag == NULL || __atomic_load_n(flag, __ATOMIC_RELAXED))
        (void)PyTraceMalloc_Track(domain, (uintptr_t)ptr, size);
}

static inline void arenalib_trace_untrack(unsigned int domain, size_t ptr) {
    const int *flag = arenalib_tracemalloc_flag;
    if (flag == NULL || __atomic_load_n(flag, __ATOMIC_RELAXED))
        (void)PyTraceMalloc_Untrack(domain, (uintptr_t)ptr);
}

#endif
