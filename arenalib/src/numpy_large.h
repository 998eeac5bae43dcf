/* The NumPy handler's big blocks (arenalib/_numpy.pxi): an array of ARENALIB_NP_LARGE_MIN bytes or
   more gets a page-aligned arena block (on a huge page where advised huge, src/numpy.h).  Where its
   size class has room for the 16-byte header, the block has one, right before the data, which
   starts 16 or 64 bytes into the page (the block's lead, arenalib_np_api.big_lead).  Where the
   array's size is its class's own (every power of two, and three more sizes a doubling), the block
   has no header, its data is the page's start, and this table, one per arena, says which data
   addresses are such blocks and the size NumPy asked for each.

   Why no header there: jemalloc's size classes from 16 KiB on are four a doubling (1 MiB, 1.25 MiB,
   1.5 MiB ...), so a 16-byte header in front of an array whose size is a class's own (1 MiB of
   float64) took the next class, a quarter more address space and jemalloc "active" bytes a block (a
   mixed workload of power-of-two arrays: 561 MiB active where NumPy's default had 450).  Below
   ARENALIB_NP_LARGE_MIN the header stays, for speed (see there): a 16-128 KiB power-of-two array
   still takes the next class, a quarter of at most 160 KiB.
   Why 16 or 64 bytes in: where an array's data start decides how fast NumPy's loops over it run,
   and which start is fast depends on the vectors NumPy's loops use on the CPU.  With 64-byte
   (AVX-512) vectors, an output 16 bytes past a cache line makes every store straddle two lines: on
   a Zen 4 host, `np.multiply(a, b, out=t); np.add(t, a, out=t)` at 1.5 MB took 5% longer with t
   16 or 2064 bytes into its page than at 0, 64, 1024, 2688 or 4032 (a and b 16 bytes in, as
   NumPy's default handler's big arrays are: glibc's chunk header), and c = a*b + a in an arena
   scope took 1.03x NumPy's default handler's at 1.5, 3 and 10 MB with the data 16 bytes in, against
   0.97-0.99x with it on a line, 64 bytes in (3 processes each, 2026-12-06).  With 32-byte (AVX2)
   vectors, on an older AMD host, data 16 bytes in, where the inputs' was, ran faster than on a
   line: the loop at 1.5 MB with t there took 0.91-1.00x (mean 0.96) the time of t on the page's
   start (10 processes), and c = a*b + a at 3 MB 0.95x the default handler's against 1.01x
   (2026-12-06).  So the lead is 64 where NumPy's CPU features say AVX512_SKX (the kernels NumPy
   dispatches there) and the class has room for it, 16 otherwise.

   How free() tells the two kinds apart: every block the handler hands out whose data is page-aligned
   is recorded here, the big ones and the few small ones whose data falls on a page (a slab region
   in about 256 of the 48-, 80- and 112-byte classes; their records say ARENALIB_NP_HAS_HEADER).  So
   a page-aligned address is looked up, and one not recorded is not the handler's (a second free, a
   pointer never handed out) and is never read; any other address has its header 16 bytes before it,
   in the same page.  (A version that kept small blocks off page boundaries by taking another block
   failed: the free-block cache, last in first out, handed the same one back, and after ~600 live
   arrays of those classes every allocation of the class failed; an attack found it, 2026-12-04.)

   Linear probing with backward-shift deletion; at most half full while memory allows, never full
   (one empty slot ends every probe).  Free-threaded builds: frees come from any thread, so a spin
   lock guards it (its sections are a few probes, or one rehash); GIL builds: NumPy calls the handler
   with the GIL held, which guards it.  No fork handler: NumPy calls the handler with the thread's
   state attached, and os.fork() stops the world first on a free-threaded build (PyOS_BeforeFork,
   3.13+), so no thread is inside a section when the child is made. */

#ifndef ARENALIB_SRC_NUMPY_LARGE_H
#define ARENALIB_SRC_NUMPY_LARGE_H

#include <Python.h>
#include <sched.h>
#include <stdint.h>

#include "arenalib/platform.h"  /* ARENALIB_FREE_THREADED, arenalib_try_lock */

/* Past jemalloc's thread cache (tcache_max, 128 KiB: _jemalloc_conf.c), not from 16 KiB (its first
   large class, where the classes start to come four a doubling).  An aligned request skips the
   arena's free-block cache (to 64 KiB) and jemalloc's thread cache, but its free goes into them: an
   np.empty() of 16-128 KiB cost 3.1-3.3x NumPy's default handler's instead of 0.97x (to 50 KB) and
   1.5x (64-128 KiB), and the blocks a loop's temporaries free piled up in the thread cache while
   each new one came from elsewhere.  Past 128 KiB every block is jemalloc's own extent either way. */
#define ARENALIB_NP_LARGE_MIN ((size_t)131073)
#define ARENALIB_NP_PAGE ((size_t)4096)

/* A big block with a header has its data 16 or 64 bytes into its page (its lead: see the top of
   this file), never on the page, so its block starts on the page of its data. */
static inline char *arenalib_np_page_of(const void *data) {
    return (char *)((uintptr_t)data & ~(uintptr_t)(ARENALIB_NP_PAGE - 1));
}

/* In a record's size: the block has a header (a small block whose data fell on a page). */
#define ARENALIB_NP_HAS_HEADER ((size_t)1 << (sizeof(size_t) * 8 - 1))

typedef struct {
    uintptr_t *keys;  /* data addresses; 0: an empty slot */
    size_t *sizes;    /* the size NumPy asked for, of the block at the same index */
    size_t mask;      /* slots - 1 (slots a power of two; no slots before the first block) */
    size_t count;
    int lock;
} arenalib_np_large;

static inline int arenalib_np_page_aligned(const void *data) {
    return ((uintptr_t)data & (ARENALIB_NP_PAGE - 1)) == 0;
}

static inline void arenalib_np_large_lock(arenalib_np_large *t) {
#if ARENALIB_FREE_THREADED
    while (!arenalib_try_lock(&t->lock))
        sched_yield();
#else
    (void)t;
#endif
}

static inline void arenalib_np_large_unlock(arenalib_np_large *t) {
#if ARENALIB_FREE_THREADED
    arenalib_unlock(&t->lock);
#else
    (void)t;
#endif
}

static inline size_t arenalib_np_large_slot(const arenalib_np_large *t, uintptr_t key) {
    /* Fibonacci hashing of the page number: consecutive pages spread over the table. */
    return (size_t)(((uint64_t)(key >> 12) * 0x9E3779B97F4A7C15ULL) >> 24) & t->mask;
}

static inline void arenalib_np_large_put(arenalib_np_large *t, uintptr_t key, size_t size) {
    size_t i = arenalib_np_large_slot(t, key);
    while (t->keys[i] != 0)
        i = (i + 1) & t->mask;
    t->keys[i] = key;
    t->sizes[i] = size;
    t->count++;
}

/* The slot of ``key``, or -1. */
static inline Py_ssize_t arenalib_np_large_find_slot(const arenalib_np_large *t, uintptr_t key) {
    if (t->keys == NULL)
        return -1;
    size_t i = arenalib_np_large_slot(t, key);
    while (t->keys[i] != 0) {
        if (t->keys[i] == key)
            return (Py_ssize_t)i;
        i = (i + 1) & t->mask;
    }
    return -1;
}

static inline void arenalib_np_large_remove_slot(arenalib_np_large *t, size_t i) {
    /* Backward shift: every key after the hole whose probe passes through it moves into it. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->keys[j] == 0)
            break;
        size_t home = arenalib_np_large_slot(t, t->keys[j]);
        /* keys[j] may fill the hole at i unless its home lies cyclically in (i, j]. */
        if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
            continue;
        t->keys[i] = t->keys[j];
        t->sizes[i] = t->sizes[j];
        i = j;
    }
    t->keys[i] = 0;
    t->count--;
}

/* Room for one more key at most half full: 0, or -1 when there is no memory for a bigger table and
   the one there is cannot take it (it would be full). */
static inline int arenalib_np_large_room(arenalib_np_large *t) {
    size_t slots = t->keys == NULL ? 0 : t->mask + 1;
    if ((t->count + 1) * 2 <= slots)
        return 0;
    size_t grown = slots ? slots * 2 : 64;
    uintptr_t *keys = (uintptr_t *)PyMem_RawCalloc(grown, sizeof(uintptr_t));
    size_t *sizes = (size_t *)PyMem_RawMalloc(grown * sizeof(size_t));
    if (keys == NULL || sizes == NULL) {
        PyMem_RawFree(keys);
        PyMem_RawFree(sizes);
        return t->count + 2 <= slots ? 0 : -1;
    }
    arenalib_np_large old = *t;
    t->keys = keys;
    t->sizes = sizes;
    t->mask = grown - 1;
    t->count = 0;
    for (size_t i = 0; i < slots; i++)
        if (old.keys[i] != 0)
            arenalib_np_large_put(t, old.keys[i], old.sizes[i]);
    PyMem_RawFree(old.keys);
    PyMem_RawFree(old.sizes);
    return 0;
}

/* Record the block at ``data`` of ``size`` bytes: 0, or -1 (no memory; nothing recorded). */
static inline int arenalib_np_large_add(arenalib_np_large *t, void *data, size_t size) {
    arenalib_np_large_lock(t);
    int err = arenalib_np_large_room(t);
    if (err == 0)
        arenalib_np_large_put(t, (uintptr_t)data, size);
    arenalib_np_large_unlock(t);
    return err;
}

/* The size of the block at ``data`` in ``size``, its record removed (``take``) or kept: 1, or 0
   when ``data`` is not a block of the table's. */
static inline int arenalib_np_large_lookup(arenalib_np_large *t, void *data, size_t *size, int take) {
    arenalib_np_large_lock(t);
    Py_ssize_t i = arenalib_np_large_find_slot(t, (uintptr_t)data);
    if (i >= 0) {
        *size = t->sizes[i];
        if (take)
            arenalib_np_large_remove_slot(t, (size_t)i);
    }
    arenalib_np_large_unlock(t);
    return i >= 0;
}

/* The table of *slot, made (and published: two threads may make an arena's first handler at once)
   if there is none yet; NULL: no memory. */
static inline arenalib_np_large *arenalib_np_large_make(void **slot) {
    arenalib_np_large *t = (arenalib_np_large *)__atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (t != NULL)
        return t;
    t = (arenalib_np_large *)PyMem_RawCalloc(1, sizeof(arenalib_np_large));
    if (t == NULL)
        return NULL;
    void *expected = NULL;
    if (__atomic_compare_exchange_n(slot, &expected, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return t;
    PyMem_RawFree(t);
    return (arenalib_np_large *)expected;
}

/* At the arena's deallocation (no array of it is left). */
static inline void arenalib_np_large_free(void **slot) {
    arenalib_np_large *t = (arenalib_np_large *)*slot;
    if (t != NULL) {
        PyMem_RawFree(t->keys);
        PyMem_RawFree(t->sizes);
        PyMem_RawFree(t);
        *slot = NULL;
    }
}

#endif  /* ARENALIB_SRC_NUMPY_LARGE_H */
