# The argument conversions of the Segment: the first step of "convert, then check, then touch".
#
# Everything here may run Python code (__index__, a slice's bounds, a __buffer__), so it all runs
# before a method pins its segment; none of it reads a segment, so none of it can meet freed memory.
# Each returns what the touching step needs as C values, and defers to that step what only a live
# segment can judge: an out-of-range index is -1 here, an IndexError only once the segment is known
# to be alive (a dead segment says it is dead, whatever the index).
# (The arena's own conversions, sizes and alignments, are still in _arena.pyx.)

from cpython.buffer cimport PyBUF_FULL_RO, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.exc cimport PyErr_Clear
from cpython.number cimport PyNumber_Index
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.slice cimport PySlice_Unpack

cdef extern from "Python.h":
    Py_ssize_t PySlice_AdjustIndices(Py_ssize_t length, Py_ssize_t* start, Py_ssize_t* stop,
                                     Py_ssize_t step) noexcept


cdef inline Py_ssize_t _as_byte(object value) except -1:
    """The int ``value`` as a byte, or ValueError/TypeError as bytearray does."""
    cdef Py_ssize_t byte
    if type(value) is int:  # the common case, without the cost of a try block
        byte = _long_as_ssize(value)
        if 0 <= byte <= 255:
            return byte
        PyErr_Clear()  # out of range, or too large: the general path says which
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
    cdef object index = PyNumber_Index(value)  # one __index__ call; TypeError for a non-integer
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
