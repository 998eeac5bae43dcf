/* For the __dealloc__ of an owner of native memory (ArenaBase in arenalib/_arena.pyx, BufferPool
   in arenalib/_pool.pyx) that runs Python code: the ResourceWarning of an unclosed one, and any
   collection or finalizer the warning starts. */
#ifndef ARENALIB_SRC_DEALLOC_H
#define ARENALIB_SRC_DEALLOC_H

#include <Python.h>

/* Clear the dying object's weak references before that code runs: else it could take the object
   back through one and use it after it is freed (a stale segment then passed its checks against
   the next arena the memory became).  Cython clears them only after __dealloc__, which it runs with
   the count raised to 1 (__Pyx_DeallocKeepAliveBegin): a weak reference still gives back an object
   whose count is not 0, and PyObject_ClearWeakRefs() refuses one (SystemError).  So 0 for the
   call, as Cython has it when it clears them itself; the callbacks it runs find the referent gone. */
static inline void arenalib_clear_weakrefs_in_dealloc(PyObject *o) {
    Py_SET_REFCNT(o, 0);
    PyObject_ClearWeakRefs(o);
    Py_SET_REFCNT(o, 1);
}

#endif /* ARENALIB_SRC_DEALLOC_H */
