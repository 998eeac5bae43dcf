/* arenalib's platform layer: the thread identity, the atomics and the per-module state that
 * arenalib's inline fast paths (arenalib/fast.pxd, and arenalib's own modules) compile in.
 *
 * C, not Cython: these are one instruction each (a TLS read, an atomic load or store), which
 * Cython cannot spell, and a debugger and the compiler's warnings see them here with line numbers.
 * A module that cimports arenalib.fast includes this header: build it with
 * `-I $(python -c "import arenalib; print(arenalib.get_c_include())")`.  Its text is part of the
 * ABI fingerprint (tools/abi_fingerprint.py). */
#ifndef ARENALIB_PLATFORM_H
#define ARENALIB_PLATFORM_H

#include <Python.h>
#include <pthread.h>

#ifdef Py_GIL_DISABLED
#define ARENALIB_FREE_THREADED 1
#else
#define ARENALIB_FREE_THREADED 0
#endif

/* Whether inline code takes and parks the shared parked slot: only where the GIL serialises it. */
#define ARENALIB_INLINE_PARKING (!ARENALIB_FREE_THREADED)

/* The calling thread's identity, equal to PyThread_get_thread_ident() (pthread_self()); read
 * straight from the thread control block where glibc keeps it, as pthread_self() does. */
static inline unsigned long arenalib_thread_ident(void) {
#if defined(__x86_64__) && defined(__GLIBC__)
    unsigned long self;
    __asm__("movq %%fs:16, %0" : "=r"(self));
    return self;
#else
    return (unsigned long)pthread_self();
#endif
}

#define arenalib_clz(x) __builtin_clzll(x)
#define arenalib_try_lock(p) (__atomic_exchange_n((p), 1, __ATOMIC_ACQUIRE) == 0)
#define arenalib_unlock(p) __atomic_store_n((p), 0, __ATOMIC_RELEASE)
#define arenalib_load_owner(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define arenalib_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define arenalib_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define arenalib_store_owner(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
/* A thread taking a biased arena over reads the owner's record after membarrier() (slicing_lock):
 * acquire, so that reading the owner's clearing of it (a release) orders the owner's carves, marks
 * and rewinds before the taker's work for ThreadSanitizer too, which does not see membarrier(). */
#define arenalib_load_carving(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define arenalib_set_carving(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define arenalib_clear_carving(p) __atomic_store_n((p), (void *)0, __ATOMIC_RELEASE)
/* Orders this thread's own accesses for the compiler only: the thread that revokes a biased
 * arena issues membarrier(), which makes that enough (asymmetric fences). */
#define arenalib_compiler_fence() __atomic_signal_fence(__ATOMIC_SEQ_CST)

/* Counters one thread writes and others read (a shared Arena's per-thread books): relaxed
 * atomics where threads run at once (plain moves on x86-64), plain elsewhere, each value passed
 * through an empty asm so that it stays a scalar.  Left plain, GCC packs two neighbouring
 * counters into one 16-byte vector load, add and store, and a ConfinedArena allocate-free pair,
 * which chains through them in memory, ran 1.4x slower (5.7 ns against 4.1; the vector
 * store-to-load round trip, most likely); as atomics, the inline allocate grew past GCC's
 * inlining limit. */
#if ARENALIB_FREE_THREADED
#define arenalib_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define arenalib_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#else
#define arenalib_store_relaxed(p, v) \
    do { __typeof__(*(p)) arenalib_value_ = (v); __asm__("" : "+r"(arenalib_value_)); \
         *(p) = arenalib_value_; } while (0)
#define arenalib_load_relaxed(p) (*(p))
#endif

/* This module's pointer to arenalib's InlineState, set by abi_check() (with the GIL) once the
 * layouts this module was compiled with are accepted; and the verdict on arenalib's C ABI for
 * cores handed to this module (0: not judged yet, 1: same as ours, -1: another).  Static: each
 * module that includes this header judges for itself. */
static void *arenalib_inline_state_ptr = 0;
static int arenalib_abi_verdict = 0;
/* 1 until the verdict is 1, then 0: OR-ed into the thread identity that the inline fast paths
 * compare with the core's permits (a thread identity is an aligned pointer, so its low bit is 0),
 * so that a core handed to this module before any check of arenalib's C ABI matches no permit and
 * goes to the slow path, which judges it.  No branch of its own on the hot path. */
static unsigned long arenalib_abi_unaccepted = 1;
/* The two slow paths the fast paths fall to most, copied out of the table by abi_check(): one
 * load to reach them, as a cimported function would take. */
static void *arenalib_allocate_slow_fn = 0;
static void *arenalib_free_slow_fn = 0;

#endif /* ARENALIB_PLATFORM_H */
