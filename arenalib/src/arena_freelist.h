/* The free list of arena objects (arenalib/_arena.pyx): a scope per request makes and drops an
 * arena object each time.  Private to arenalib._arena. */
#ifndef ARENALIB_SRC_ARENA_FREELIST_H
#define ARENALIB_SRC_ARENA_FREELIST_H

#include <Python.h>
#include <string.h>

#include "arenalib/platform.h"

/* A scope per request makes and drops an arena object each time: up to 16 dropped ones (all
   ArenaBase subclasses have one size) are kept for the next, zeroed as PyType_GenericAlloc
   would (Cython's @freelist cannot serve subclasses).  With the GIL only: the list is shared. */
#if !ARENALIB_FREE_THREADED
#define ARENALIB_ARENA_FREELIST 16
static PyObject *arenalib_arena_freelist[ARENALIB_ARENA_FREELIST];
static int arenalib_arena_free_count;
static Py_ssize_t arenalib_arena_size;
static PyObject *arenalib_arena_alloc(PyTypeObject *t, Py_ssize_t nitems) {
    if (arenalib_arena_free_count && nitems == 0 && t->tp_basicsize == arenalib_arena_size) {
        PyObject *o = arenalib_arena_freelist[--arenalib_arena_free_count];
        memset(o, 0, (size_t)arenalib_arena_size);
        return PyObject_Init(o, t);
    }
    return PyType_GenericAlloc(t, nitems);
}
static void arenalib_arena_free(void *o) {
    if (arenalib_arena_free_count < ARENALIB_ARENA_FREELIST
            && Py_TYPE((PyObject *)o)->tp_basicsize == arenalib_arena_size)
        arenalib_arena_freelist[arenalib_arena_free_count++] = (PyObject *)o;
    else
        PyObject_Free(o);
}
/* Serve ``t`` (a concrete arena class) from the list, where nothing else allocates it. */
static void arenalib_arena_freelist_for(PyTypeObject *t) {
    if (t->tp_alloc == PyType_GenericAlloc && t->tp_free == PyObject_Free
            && !(t->tp_flags & (Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HEAPTYPE))) {
        arenalib_arena_size = t->tp_basicsize;
        t->tp_alloc = arenalib_arena_alloc;
        t->tp_free = arenalib_arena_free;
    }
}
#else
static void arenalib_arena_freelist_for(PyTypeObject *t) { }
#endif

#endif /* ARENALIB_SRC_ARENA_FREELIST_H */
