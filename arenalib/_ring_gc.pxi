# The garbage collector's view of a Ring (included by _ring.pyx, after the class; _ring.pyx installs
# these slots on the type at import).
#
# Cython's own slots see only _pool; the Python objects in the request table (each request's user_data
# and the exporters its buffer exports hold, the user_data of completions reaped and not yet returned)
# are visited by _table_traverse, so that a cycle through them (user_data=self.on_read, where self
# holds the ring) is found.  The traversal runs no Python code and touches no reference count.
#
# A ring in a garbage cycle is closed by _ring_finalize (tp_finalize, PEP 442), which the collector
# runs on every object of the cycle before it clears any of them: the requests are cancelled and
# reaped while the objects their buffers come from are whole (a memoryview's managed buffer, cleared,
# releases its exporter: a read in flight would then write into memory its owner may free).
# _ring_clear (tp_clear) does the same for a ring still open after that.  Neither is a Python method
# (a __del__ called by hand from another thread could close a ring under its owner); an ordinary
# deallocation is __dealloc__'s.

cdef traverseproc base_traverse = NULL  # Cython's (_pool, and the type of a heap type)


cdef int _ring_traverse(Ring self, visitproc visit, void* arg) noexcept:
    cdef int ret = base_traverse(<PyObject*>self, visit, arg) if base_traverse != NULL else 0
    if ret:
        return ret
    ret = _provisions_traverse(self, visit, arg)
    if ret:
        return ret
    return _table_traverse(&self._table, visit, arg)


cdef void _ring_finalize(Ring self) noexcept:
    """A ring in a garbage cycle: closed as an unclosed ring is at collection (cancel, reap, unpin,
    ResourceWarning), which drops every reference of its tables.  A busy ring is in use by a call
    under way, so never garbage; it is left alone.  The exception state is kept (tp_finalize's rule)."""
    cdef saved_exc exc
    if self._open and not self._busy:
        exc_save(&exc)
        _close_unclosed(self)
        exc_restore(&exc)


cdef int _ring_clear(Ring self) noexcept:
    _ring_finalize(self)
    return 0
