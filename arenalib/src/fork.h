/* Locks that a fork can leave held, for the flags of each arena that no fork handler can reach (no
   list of the arenas is kept): a SlicingArena's busy lock (slicing.h) and a Lifetime's exclusive
   flag (access.h).  Private to arenalib._arena.

   Such a lock holds the fork generation of the process that took it (0: free).  A fork's child
   starts a new generation (_after_fork_child, _slots.pxi), so a lock taken before the fork is told
   apart: it was held by a thread the child does not have (a C library's thread carving, resetting
   or rewinding without the GIL goes on through a fork, which stops only Python's threads), and
   will never be released.
   - A Lifetime's exclusive flag keeps nobody waiting in the child, and the first thread that
     wants it takes it (arenalib_generation_try_lock), as the child's other locks are made anew:
     a reset, close or rewind that held it held the SlicingArena's busy lock too, or the locks of
     a shared Arena's slot, which the child makes anew.
   - A SlicingArena's busy lock is never taken over (arenalib_generation_try_lock_here): its
     holder may have left the chunk list half moved (taken over, the child handed out one address
     to two live segments).  The arena answers ARENA_EBUSY for good in the child, and its Python
     callers, which wait out a busy lock, see it is stale (arenalib_generation_stale) and raise. */
#ifndef ARENALIB_SRC_FORK_H
#define ARENALIB_SRC_FORK_H

static int arenalib_fork_generation = 1;

static inline int arenalib_generation_now(void) {
    return __atomic_load_n(&arenalib_fork_generation, __ATOMIC_RELAXED);
}

/* In a fork's child, before any other thread runs. */
static inline void arenalib_generation_next(void) {
    int next = arenalib_fork_generation + 1;
    __atomic_store_n(&arenalib_fork_generation, next > 0 ? next : 1, __ATOMIC_RELAXED);
}

/* Take ``lock`` if it is free or left held by a fork: 1 when taken. */
static inline int arenalib_generation_try_lock(int *lock) {
    int seen = 0;
    int now = arenalib_generation_now();
    if (__atomic_compare_exchange_n(lock, &seen, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
        return 1;
    return seen != now
        && __atomic_compare_exchange_n(lock, &seen, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
}

/* Take ``lock`` if it is free: 1 when taken. */
static inline int arenalib_generation_try_lock_here(int *lock) {
    int seen = 0;
    return __atomic_compare_exchange_n(lock, &seen, arenalib_generation_now(), 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_RELAXED);
}

/* Whether ``lock`` was left held by a fork (its holder is not in this process). */
static inline int arenalib_generation_stale(int *lock) {
    int held = __atomic_load_n(lock, __ATOMIC_ACQUIRE);
    return held != 0 && held != arenalib_generation_now();
}

/* Whether ``lock`` is held by a thread of this process. */
static inline int arenalib_generation_locked(int *lock) {
    int held = __atomic_load_n(lock, __ATOMIC_ACQUIRE);
    return held != 0 && held == arenalib_generation_now();
}

#define arenalib_generation_unlock(lock) __atomic_store_n((lock), 0, __ATOMIC_RELEASE)

#endif /* ARENALIB_SRC_FORK_H */
