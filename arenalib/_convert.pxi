# Argument conversion, the first step of "convert, then check, then touch" (STYLE.md).
#
# Everything here may run Python code (__index__, a slice's bounds, a __buffer__), so it all runs
# before a method checks liveness or pins its segment; none of it reads a segment or an arena's
# memory, so none of it can meet freed memory.  Each returns what the touching step needs as C
# values, and defers to that step what only a live segment can judge: an out-of-range index is -1
# here, an IndexError only once the segment is known to be alive (a dead segment says it is dead,
# whatever the index).

from cpython.buffer cimport PyBUF_FULL_RO, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.exc cimport PyErr_Clear
from cpython.number cimport PyIndex_Check, PyNumber_Index
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.slice cimport PySlice_Unpack

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
    if not PyIndex_Check(size):  # the TypeError names the argument (PyNumber_Index's would not)
        raise TypeError(f"{name} must be an integer, not {type(size).__name__}")
    cdef object index = PyNumber_Index(size)  # one __index__ call
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


cdef bint parse_flag(object value, str name) except -1:
    """A flag argument (zero=, nul=): a bool, or an int as C has them; TypeError for any other
    object, whose truth would be a guess (zero="no" is true, zero=None false)."""
    if value is True:
        return True
    if value is False:
        return False
    if isinstance(value, int):
        return value != 0
    raise TypeError(f"{name} must be a bool or an int, not {type(value).__name__}")


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


# -- the Segment's indices, slices, bytes and sources ----------------------------------------------

cdef extern from "Python.h":
    Py_ssize_t PySlice_AdjustIndices(Py_ssize_t length, Py_ssize_t* start, Py_ssize_t* stop,
                                     Py_ssize_t step) noexcept


cdef inline Py_ssize_t _as_byte(object value) except -1:
    """The int ``value`` as a byte, or ValueError/TypeError as bytearray does."""
    cdef Py_ssize_t byte
    if type(value) is int:  # the common case, inline: the general path's try block costs
        byte = _long_as_ssize(value)  # ~25 instructions of prologue wherever it sits
        if 0 <= byte <= 255:
            return byte
        PyErr_Clear()  # out of range, or too large: the general path says which
    return _as_byte_general(value)


cdef Py_ssize_t _as_byte_general(object value) except -1:
    """_as_byte() of anything but an exact int in range(0, 256)."""
    cdef Py_ssize_t byte
    try:
        byte = value
    except OverflowError:
        raise ValueError(f"byte must be in range(0, 256), not {value!r}") from None
    if byte < 0 or byte > 255:
        raise ValueError(f"byte must be in range(0, 256), not {value!r}")
    return byte


cdef inline Py_ssize_t _slice_length(object key, Py_ssize_t size, Py_ssize_t* start,
                                     Py_ssize_t* step) except -1:
    """The bytes a slice of a ``size``-byte segment selects; its first index and step go to
    ``start`` and ``step``.  May run __index__ of the slice's bounds."""
    cdef Py_ssize_t stop
    if PySlice_Unpack(key, start, &stop, step) < 0:
        return -1
    return PySlice_AdjustIndices(size, start, &stop, step[0])


cdef Py_ssize_t _bounded_index(object value, str name) except -1:
    """A non-negative ``value`` as Py_ssize_t; too large for any segment: PY_SSIZE_T_MAX."""
    if not PyIndex_Check(value):  # the TypeError names the argument (PyNumber_Index's would not)
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    cdef object index = PyNumber_Index(value)  # one __index__ call
    cdef Py_ssize_t n
    try:
        n = index
    except OverflowError:
        if index < 0:
            raise ValueError(f"{name} must be >= 0, not {index!r}") from None
        return PY_SSIZE_T_MAX
    if n < 0:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return n


cdef Py_ssize_t _position(object index, Py_ssize_t size) except -2:
    """``index`` (negative from the end, as for bytes) as a position in ``size`` bytes; -1 when it
    is out of range (the caller raises IndexError once the segment is known to be alive)."""
    cdef Py_ssize_t i
    try:
        i = index
    except OverflowError:
        return -1
    if i < 0:
        i += size
    return i if 0 <= i < size else -1


cdef int _acquire_source(object value, Py_buffer* view) except -1:
    """The buffer of a value assigned to a slice: any bytes-like object, whatever its shape (a
    NumPy scalar or 0-d array is refused, as ints are).  The caller releases ``view``."""
    if not PyObject_CheckBuffer(value):
        raise TypeError(f"a slice of a segment is assigned a bytes-like object, not {type(value).__name__}")
    PyObject_GetBuffer(value, view, PyBUF_FULL_RO)
    if view.ndim == 0:
        PyBuffer_Release(view)
        raise TypeError(f"a slice of a segment is assigned a bytes-like object, not {type(value).__name__}")
    return 0
