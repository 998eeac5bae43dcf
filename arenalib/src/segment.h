/* What a Segment needs below Cython: the live counters of live_objects(), the tp_dealloc hook that
   counts a segment out, and the ThreadSanitizer annotations around its user bytes.

   C, not Cython: the counters are cache-line-aligned shards picked by thread; the hook wraps the
   tp_dealloc Cython generates (a __dealloc__ would cost more, see below); the annotations are
   TSan's own functions, declared only under -fsanitize=thread.  All static inline where a hot path
   calls them (every segment made or dropped, every access).  Included by arenalib/_segment.pxi
   only, into the one translation unit of arenalib._arena. */

#ifndef ARENALIB_SEGMENT_H
#define ARENALIB_SEGMENT_H

#include <Python.h>
#include <pthread.h>

#include "arenalib/platform.h"  /* ARENALIB_FREE_THREADED */

/* Under ThreadSanitizer, a segment's bytes between _pin() and _unpin() are the program's data,
   written by its threads without synchronisation by design (as a bytearray's are): the checks
   stay on arenalib's own state, not on those bytes.  Whether a stale handle ever reaches the
   next owner's bytes is what the tests check by content (the hand-over goes through jemalloc,
   which is not instrumented, so ThreadSanitizer could not judge it). */
#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define arenalib_user_bytes_begin() \
    (AnnotateIgnoreReadsBegin(__FILE__, __LINE__), AnnotateIgnoreWritesBegin(__FILE__, __LINE__))
#define arenalib_user_bytes_end() \
    (AnnotateIgnoreWritesEnd(__FILE__, __LINE__), AnnotateIgnoreReadsEnd(__FILE__, __LINE__))
#else
#define arenalib_user_bytes_begin() ((void)0)
#define arenalib_user_bytes_end() ((void)0)
#endif

/* Live Segment objects and exports, for live_objects(): every segment made and dropped counts,
   so with threads in parallel each thread counts on a cache line of its own (one shared
   counter was a line both threads wrote on every allocate: BufferPool per thread scaled
   1.16x at 512 B), and a read sums the lines. */
#if ARENALIB_FREE_THREADED
#define ARENALIB_SHARDS 64
typedef struct { Py_ssize_t value; char padding[64 - sizeof(Py_ssize_t)]; }
    __attribute__((aligned(64))) arenalib_shard;
static arenalib_shard arenalib_live_segments[ARENALIB_SHARDS];
static arenalib_shard arenalib_live_exports[ARENALIB_SHARDS];
static arenalib_shard arenalib_live_anchors[ARENALIB_SHARDS];
static inline void arenalib_shard_add(arenalib_shard *shards, Py_ssize_t delta) {
    unsigned long me = (unsigned long)pthread_self();
    __atomic_add_fetch(&shards[((me >> 12) * 0x9E3779B97F4A7C15UL) >> 58].value, delta,
                       __ATOMIC_RELAXED);
}
static inline Py_ssize_t arenalib_shard_sum(arenalib_shard *shards) {
    Py_ssize_t total = 0;
    int i;
    for (i = 0; i < ARENALIB_SHARDS; i++)
        total += __atomic_load_n(&shards[i].value, __ATOMIC_RELAXED);
    return total;
}
#else  /* the GIL serialises one counter */
typedef struct { Py_ssize_t value; } arenalib_shard;
static arenalib_shard arenalib_live_segments[1];
static arenalib_shard arenalib_live_exports[1];
static arenalib_shard arenalib_live_anchors[1];
#define arenalib_shard_add(shards, delta) ((void)((shards)[0].value += (delta)))
#define arenalib_shard_sum(shards) ((shards)[0].value)
#endif

/* A Segment leaving counts itself out in its type's tp_dealloc, wrapped around the one Cython
   generates: a __dealloc__ would save and restore the error state around it for every segment
   (~6 ns of a ~320 ns scope).  A segment counts when make_segment() made it, which is when its
   Lifetime pointer is set (a Segment.__new__ from Python has none, and never counted in).

   Such a segment's owner pointer (Segment._arena) is borrowed: what keeps the owner alive is
   Segment._keeper, the owner itself or, on a free-threaded build, a per-thread anchor of a shared
   Arena (a reference taken on an object another thread owns is an atomic add on a line every
   thread writes).  So make_segment() sets the pointer here, without a reference, and the hook
   clears it before Cython's dealloc would drop a reference it never took.  Where Segment keeps
   the two fields, segment_dealloc_init() computes in Cython and hands over once. */
static destructor arenalib_segment_cython_dealloc;
static Py_ssize_t arenalib_segment_life_offset;
static Py_ssize_t arenalib_segment_owner_offset;

/* The automatic arena (arenalib.allocate(), _auto.pxi), once made, and what frees a segment of it
   that became garbage: called as the type's tp_finalize, through
   PyObject_CallFinalizerFromDealloc(), which lends the segment a reference meanwhile (the free is
   Cython code that takes and drops references to it; without one, the drop would deallocate it
   again) and restores the error state the dealloc was called with. */
static PyObject *arenalib_auto_owner;
static void (*arenalib_auto_free)(PyObject *seg);

static void arenalib_segment_finalize(PyObject *o) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    arenalib_auto_free(o);
    PyErr_Restore(type, value, traceback);
}

static void arenalib_segment_dealloc(PyObject *o);

/* The dealloc of an automatic segment, out of line: the common path stays a leaf function. */
static __attribute__((noinline)) void arenalib_segment_dealloc_auto(PyObject *o) {
    if (PyObject_CallFinalizerFromDealloc(o) < 0)
        return;  /* resurrected by the free (it cannot be: the free keeps no reference) */
    arenalib_shard_add(arenalib_live_segments, -1);
    *(PyObject **)((char *)o + arenalib_segment_owner_offset) = NULL;
    arenalib_segment_cython_dealloc(o);
}

static void arenalib_segment_dealloc(PyObject *o) {
    if (*(void **)((char *)o + arenalib_segment_life_offset) != NULL) {
        PyObject **owner = (PyObject **)((char *)o + arenalib_segment_owner_offset);
        /* Every other segment pays one compare for this (a made segment's owner is never NULL,
           the automatic arena's pointer is until it is made). */
        if (__builtin_expect(*owner == __atomic_load_n(&arenalib_auto_owner, __ATOMIC_RELAXED), 0)) {
            arenalib_segment_dealloc_auto(o);
            return;
        }
        arenalib_shard_add(arenalib_live_segments, -1);
        *owner = NULL;
    }
    arenalib_segment_cython_dealloc(o);
}

/* What frees an automatic segment (set once, at the module's start, before any thread can
   deallocate a segment). */
static void arenalib_set_auto_free(void (*free)(PyObject *)) {
    arenalib_auto_free = free;
}

/* Make ``owner`` the automatic arena (once, at its creation), or forget it when it goes (at the
   interpreter's exit, so that no later object at its address is taken for it).  Atomic: other
   threads' segments compare their owner with it meanwhile (any value they see is right for them:
   a segment of the automatic arena is handed to another thread after its creation). */
static void arenalib_set_auto_owner(PyObject *owner) {
    __atomic_store_n(&arenalib_auto_owner, owner, __ATOMIC_RELEASE);  /* borrowed: the module keeps it */
}

static void arenalib_forget_auto_owner(PyObject *owner) {
    PyObject *expected = owner;
    __atomic_compare_exchange_n(&arenalib_auto_owner, &expected, NULL, 0, __ATOMIC_RELEASE,
                                __ATOMIC_RELAXED);
}

/* Point a new segment at its owner without a reference (the None Cython's tp_new put there
   goes). */
static inline void arenalib_segment_set_owner(PyObject *seg, PyObject *owner) {
    PyObject **field = (PyObject **)((char *)seg + arenalib_segment_owner_offset);
    PyObject *was = *field;
    *field = owner;
    Py_XDECREF(was);
}

static void arenalib_segment_dealloc_init(PyTypeObject *t, Py_ssize_t life_offset,
                                          Py_ssize_t owner_offset) {
    arenalib_segment_life_offset = life_offset;
    arenalib_segment_owner_offset = owner_offset;
    arenalib_segment_cython_dealloc = t->tp_dealloc;
    t->tp_dealloc = arenalib_segment_dealloc;
    t->tp_finalize = arenalib_segment_finalize;  /* called for automatic segments only (above) */
}

#endif  /* ARENALIB_SEGMENT_H */
