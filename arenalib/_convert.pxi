# Argument conversion, the first step of "convert, then check, then touch" (STYLE.md): everything
# here may run Python code (__index__, __buffer__) and so comes before any liveness check.

from cpython.exc cimport PyErr_Clear
from cpython.number cimport PyNumber_Index

cdef extern from "src/convert.h":
    # Declared without an exception value: the fast paths inspect the result itself (-1 with an
    # exception set when it does not fit).
    Py_ssize_t _long_as_ssize "arenalib_long_as_ssize"(object value) noexcept


# -- sizes, alignments, limits ----------------------------------------------------------------------

cdef inline Py_ssize_t _parse_size(object size, str name) except -1:
    cdef Py_ssize_t n
    if type(size) is int:  # the common case, without the cost of a try block
        n = _long_as_ssize(size)
        if n >= 0:
            return n
        PyErr_Clear()  # negative or too large: the slow path says which
    return _parse_size_slow(size, name)


cdef Py_ssize_t _parse_size_slow(object size, str name) except -1:
    cdef object index = PyNumber_Index(size)  # one __index__ call; TypeError for a non-integer
    cdef Py_ssize_t n
    try:
        n = index
    except OverflowError:
        if index < 0:
            raise ValueError(f"{name} must be >= 0, not {index!r}") from None
        raise MemoryError(f"cannot allocate {index!r} bytes: larger than any address space") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, not {n}")
    return n


cdef Py_ssize_t parse_size(object size, str name) except -1:
    """A size argument as Py_ssize_t: ValueError when negative, MemoryError beyond any address space,
    TypeError when not an integer (for arenalib's other modules)."""
    return _parse_size(size, name)


cdef size_t parse_align(object align) except 0:
    """``align`` as a power of two; 1 when it is None (no constraint beyond malloc's)."""
    if align is None:
        return 1
    cdef Py_ssize_t n
    try:
        n = align
    except OverflowError:
        n = -1
    if n <= 0 or n & (n - 1) or <size_t>n > MAX_ALIGN:
        raise ValueError(f"align must be a power of two from 1 to {MAX_ALIGN}, not {align!r}")
    return <size_t>n


cdef Py_ssize_t _parse_max_bytes(object max_bytes) except -2:
    if max_bytes is None:
        return -1
    try:
        return _parse_size(max_bytes, "max_bytes")
    except MemoryError:
        return -1  # a limit beyond any address space is no limit


# The constructors take keyword arguments only; a positional one is caught by this default (cheaper
# than *args) to name the class and its keywords in the error.
cdef object _NOT_GIVEN = object()


cdef int _no_positional(ArenaBase arena, str keywords) except -1:
    name = type(arena).__name__
    raise TypeError(f"{name}() takes keyword arguments only: {name}({keywords}...)")
