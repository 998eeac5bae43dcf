# Segment: a view of native memory owned by an arena, with CPython's writable buffer protocol.
#
# A segment never owns its memory: the arena does, and frees it on free(), reset() or close().  Every
# access first checks, in O(1), that the memory is still there (the segment's generation equals its
# arena's, and its root was not freed) and that the calling thread may touch it, so a stale handle
# raises instead of reading freed memory.  While a buffer export is alive, nothing may free the memory
# (BufferError, as mmap.close() does).

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.string cimport memmove, memset

from numbers import Integral

cdef Py_ssize_t _ITEMSIZE_ONE = 1
cdef Py_ssize_t _live_segment_objects = 0
cdef Py_ssize_t _live_exports = 0
cdef char* _FORMAT_BYTE = b"B"


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


@cython.final
@cython.freelist(64)
@cython.no_gc  # references only its arena and root segment: never part of a cycle
cdef class Segment:
    """A block of native memory from an arena, usable wherever a writable buffer is accepted.

    Segments are made by ``arena.allocate()``, ``segment.slice()`` and ``BufferPool.acquire()``;
    constructing one directly raises TypeError.
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("Segment cannot be constructed directly; use an arena's allocate()")

    cdef Segment _owner_segment(self):
        return self if self._root is None else self._root

    cdef int _check(self) except -1:
        cdef ArenaBase arena = self._arena
        if arena is None:
            raise TypeError("this Segment was not made by an arena")
        if arena._core.generation != self._generation or (
                self._root is not None and self._root._freed) or self._freed:
            raise _dead_segment_error(self)
        if arena._core.owner and arena._core.owner != thread_ident():
            raise _wrong_thread_error(arena)
        return 0

    # -- buffer protocol -------------------------------------------------------------------------

    def __getbuffer__(self, Py_buffer* view, int flags):
        self._check()
        view.buf = self._ptr
        view.len = self._size
        view.readonly = 0
        view.itemsize = 1
        view.format = _FORMAT_BYTE if flags & PyBUF_FORMAT else NULL
        view.ndim = 1
        view.shape = &self._size if flags & PyBUF_ND else NULL
        view.strides = &_ITEMSIZE_ONE if flags & PyBUF_STRIDES else NULL
        view.suboffsets = NULL
        view.internal = NULL
        view.obj = self
        cdef Segment owner = self._owner_segment()
        owner._exports += 1
        self._arena._core.exports += 1
        global _live_exports
        _live_exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        cdef Segment owner = self._owner_segment()
        owner._exports -= 1
        self._arena._core.exports -= 1
        global _live_exports
        _live_exports -= 1

    # -- properties ------------------------------------------------------------------------------

    @property
    def nbytes(self):
        """Size in bytes (as memoryview.nbytes)."""
        return self._size

    @property
    def address(self):
        """Address of the first byte, as an int (for ctypes, iovecs and io_uring registration).

        The address is valid only while ``alive`` is true."""
        self._check()
        return <size_t>self._ptr

    @property
    def arena(self):
        """The arena that owns this segment's memory."""
        return self._arena

    @property
    def alive(self):
        """True while the memory is there: not freed, reset or closed with its arena."""
        cdef ArenaBase arena = self._arena
        return (arena is not None and arena._core.generation == self._generation and not self._freed
                and (self._root is None or not self._root._freed))

    @property
    def exports(self):
        """Number of live buffer exports (memoryviews, NumPy arrays ...) of this segment's memory."""
        return self._owner_segment()._exports

    def __len__(self):
        return self._size

    # -- access ----------------------------------------------------------------------------------

    def fill(self, value):
        """Set every byte to ``value`` (an int in range(0, 256)); returns the segment."""
        self._check()
        memset(self._ptr, <int>_as_byte(value), <size_t>self._size)
        return self

    def tobytes(self):
        """A bytes copy of the whole segment."""
        self._check()
        return PyBytes_FromStringAndSize(self._ptr, self._size)

    def slice(self, offset, size):
        """A segment viewing ``size`` bytes from ``offset``, without copying (Panama's asSlice).

        The slice shares this segment's memory and lifetime; an export of it counts as an export
        of the parent.  Negative arguments raise ValueError, out-of-bounds ones IndexError."""
        self._check()
        cdef Py_ssize_t start = _bounded_index(offset, "offset")
        cdef Py_ssize_t length = _bounded_index(size, "size")
        if start > self._size or length > self._size - start:
            raise IndexError(
                f"slice(offset={offset}, size={size}) is out of bounds for a segment of "
                f"{self._size} bytes")
        cdef Segment child = make_segment(self._arena, self._ptr + start, length)
        child._root = self._owner_segment()
        child._generation = self._generation
        return child

    def free(self):
        """Give the memory back to the arena now; any later use of this segment raises
        ArenaClosedError.  Not available for slices and for SlicingArena segments."""
        self._check()
        if self._root is not None:
            raise UnsupportedOperation("a slice shares its parent's memory: free the parent instead")
        if self._arena._core.kind == ARENA_KIND_SLICING:
            raise UnsupportedOperation(
                "SlicingArena segments cannot be freed one by one; use reset() or close()")
        if self._exports:
            raise BufferError(
                f"cannot free a segment while {self._exports} buffer export(s) of it "
                "(memoryview, NumPy array ...) are alive; release them first")
        self._arena._free_segment(self)

    def __getitem__(self, key):
        self._check()
        if isinstance(key, slice):
            start, stop, step = key.indices(self._size)
            if step == 1:
                return PyBytes_FromStringAndSize(self._ptr + <Py_ssize_t>start,
                                                 max(<Py_ssize_t>stop - <Py_ssize_t>start, 0))
            with memoryview(self) as view:
                return view[key].tobytes()
        return <unsigned char>self._ptr[_segment_index(self, key)]

    def __setitem__(self, key, value):
        self._check()
        cdef const unsigned char[::1] data
        if isinstance(key, slice):
            start, stop, step = key.indices(self._size)
            if step != 1:
                with memoryview(self) as view:
                    view[key] = value
                return
            length = max(stop - start, 0)
            if isinstance(value, Integral):  # int, bool, NumPy integer scalars: as bytearray does
                raise TypeError("a slice of a segment is assigned a bytes-like object, not "
                                f"{type(value).__name__}")
            with memoryview(value) as source:
                if source.nbytes != length:
                    raise ValueError(
                        f"segment slice assignment needs {length} bytes, got {source.nbytes}; "
                        "the size of a segment cannot change")
                data = source.cast("B") if source.c_contiguous else source.tobytes()
                if length:
                    # memmove: the source may be this very memory (seg[0:4] = seg.slice(2, 4))
                    memmove(self._ptr + <Py_ssize_t>start, &data[0], <size_t>length)
            return
        self._ptr[_segment_index(self, key)] = <char>_as_byte(value)

    def __delitem__(self, key):
        raise TypeError("a segment has a fixed size: its bytes cannot be deleted")

    def __iter__(self):
        return iter(self.tobytes())

    def __repr__(self):
        cdef ArenaBase arena = self._arena
        if arena is None:
            return "<arenalib.Segment (not made by an arena)>"
        state = "alive" if self.alive else "dead"
        kind = "slice of " if self._root is not None else ""
        return (f"<arenalib.Segment {self._size} bytes at {<size_t>self._ptr:#x}, "
                f"{kind}{type(arena).__name__} {id(arena):#x}, {state}>")

    def __dealloc__(self):
        global _live_segment_objects
        if self._arena is not None:
            _live_segment_objects -= 1

    def __reduce__(self):
        raise TypeError("a Segment views native memory and cannot be pickled or copied; "
                        "use tobytes()")


cdef Segment make_segment(ArenaBase arena, char* ptr, Py_ssize_t size):
    """A new root segment over ``size`` bytes at ``ptr`` of ``arena``'s current generation."""
    global _live_segment_objects
    cdef Segment seg = Segment.__new__(Segment)
    seg._ptr = ptr
    seg._size = size
    seg._arena = arena
    seg._generation = arena._core.generation
    _live_segment_objects += 1
    return seg


cdef Py_ssize_t _bounded_index(object value, str name) except -1:
    """A non-negative ``value`` as Py_ssize_t; too large for any segment: PY_SSIZE_T_MAX."""
    cdef Py_ssize_t n
    try:
        n = value
    except OverflowError:
        if value < 0:
            raise ValueError(f"{name} must be >= 0, not {value!r}") from None
        return PY_SSIZE_T_MAX
    if n < 0:
        raise ValueError(f"{name} must be >= 0, not {value!r}")
    return n


cdef Py_ssize_t _segment_index(Segment seg, object index) except -1:
    """``index`` (negative from the end, as for bytes) checked against the segment's size."""
    cdef Py_ssize_t i
    try:
        i = index
    except OverflowError:
        raise IndexError("cannot fit 'int' into an index-sized integer") from None
    if i < 0:
        i += seg._size
    if i < 0 or i >= seg._size:
        raise IndexError("segment index out of range")
    return i


cdef object _dead_segment_error(Segment seg):
    cdef ArenaBase arena = seg._arena
    if not arena._core.open:
        why = f"its {type(arena).__name__} is closed"
    elif seg._freed or (seg._root is not None and seg._root._freed):
        why = "it was freed or released"
    else:
        why = f"its {type(arena).__name__} was reset"
    return ArenaClosedError(f"segment of {seg._size} bytes is no longer usable: {why}")


cdef object _wrong_thread_error(ArenaBase arena):
    return WrongThreadError(
        f"{type(arena).__name__} belongs to thread {arena._core.owner}; "
        f"thread {thread_ident()} may not use it or its segments")
