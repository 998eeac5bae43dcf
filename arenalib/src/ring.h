/* The C helpers of arenalib._ring (the Ring) that Cython has no words for: the exporter at the end of
   a chain of memoryviews, the exception state kept across a finalizer, the garbage collector's slots
   of the Ring type, and the fork counter.  C only: nothing here calls back into Python code.

   Included by _ring.pyx alone (`cdef extern from "src/ring.h"`; meson's implicit include of the
   source directory finds it), so its statics exist once. */
#ifndef ARENALIB_RING_H
#define ARENALIB_RING_H

#include <Python.h>
#include <pthread.h>

/* Whether the exporter at the end of a chain of memoryviews is of type ``raw`` (BufferPool's raw
   views).  A memoryview of a memoryview, a slice and a cast all name the first exporter, but an
   exporter may itself hand out a memoryview's buffer: the chain is followed, 64 links at most. */
static int arenalib_ring_exported_by(PyObject *obj, PyObject *raw) {
    int depth;
    for (depth = 0; obj != NULL && depth < 64; depth++) {
        if ((PyObject *)Py_TYPE(obj) == raw)
            return 1;
        if (!PyMemoryView_Check(obj))
            return 0;
        obj = PyMemoryView_GET_BUFFER(obj)->obj;
    }
    return 0;
}

/* The exporter a buffer export holds (no new reference): Cython's Py_buffer.obj is an object. */
static PyObject *arenalib_ring_buffer_obj(Py_buffer *view) { return view->obj; }

/* The exception state, kept across a finalizer (tp_finalize's rule; PyErr_Fetch is deprecated from
   3.12 on). */
typedef struct { PyObject *type, *value, *tb; } arenalib_ring_exc;

static void arenalib_ring_exc_save(arenalib_ring_exc *e) {
#if PY_VERSION_HEX >= 0x030C0000
    e->type = NULL; e->tb = NULL; e->value = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&e->type, &e->value, &e->tb);
#endif
}

static void arenalib_ring_exc_restore(arenalib_ring_exc *e) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(e->value);
#else
    PyErr_Restore(e->type, e->value, e->tb);
#endif
}

/* Installs the Ring's own collector slots (Cython's traverse sees only _pool; its clear would drop
   _pool while it is still counted), keeping Cython's traverse in *base to chain to. */
static void arenalib_ring_set_gc(PyTypeObject *type, traverseproc traverse, inquiry clear,
                                 destructor finalize, traverseproc *base) {
    *base = type->tp_traverse;
    type->tp_traverse = traverse;
    type->tp_clear = clear;
    type->tp_finalize = finalize;
}

/* Forks seen by this process's children: a ring remembers the count it was made at, so a fork child
   finds it changed with no system call (glibc's getpid() is one). */
static unsigned long arenalib_ring_forks = 0;
static void arenalib_ring_in_child(void) { arenalib_ring_forks++; }
static int arenalib_ring_atfork(void) { return pthread_atfork(NULL, NULL, arenalib_ring_in_child); }

#endif /* ARENALIB_RING_H */
