# What Segment's indexing, slice assignment and slice() do, and the errors of a segment that may not
# be touched: module-level cdef functions, so that the class in _segment.pxi stays its interface
# (Cython keeps methods in the class body and refuses an include there).  Each method calls its
# function directly, a static C function of this module that the compiler may inline.
#
# Every function here keeps THE RULE of _segment.pxi: the conversions of _convert.pxi and any
# object creation first, then seg._pin(), then C that cannot call back, then seg._unpin().

cimport cython
from cpython.buffer cimport (
    PyBUF_SIMPLE, PyBuffer_IsContiguous, PyBuffer_Release, PyBuffer_ToContiguous,
    PyObject_CheckBuffer, PyObject_GetBuffer,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.number cimport PyIndex_Check
from libc.string cimport memchr, memcpy, memmove, memset

from arenalib._abi cimport load_life_owner, thread_ident

from arenalib._errors import ArenaClosedError, WrongThreadError


cdef inline void _gather(char* dst, const char* src, Py_ssize_t n, Py_ssize_t step) noexcept nogil:
    """dst[i] = src[i * step] for i < n."""
    cdef Py_ssize_t i
    if step == 1:
        memcpy(dst, src, <size_t>n)
    else:
        for i in range(n):
            dst[i] = src[i * step]


cdef inline void _scatter(char* dst, const char* src, Py_ssize_t n, Py_ssize_t step) noexcept nogil:
    """dst[i * step] = src[i] for i < n (step 1: the two may overlap)."""
    cdef Py_ssize_t i
    if step == 1:
        memmove(dst, src, <size_t>n)
    else:
        for i in range(n):
            dst[i * step] = src[i]


cdef object _segment_getitem(Segment seg, object key):
    """seg[key]: a byte as an int, or a slice as bytes."""
    cdef Py_ssize_t start, step, length, i
    cdef bytes copy
    cdef unsigned char byte
    cdef void* token
    if isinstance(key, slice):
        length = _slice_length(key, seg._size, &start, &step)
        copy = PyBytes_FromStringAndSize(NULL, length)
        seg._pin(&token)
        _gather(PyBytes_AS_STRING(copy), seg._ptr + start, length, step)
        seg._unpin(token)
        return copy
    i = _position(key, seg._size)
    seg._pin(&token)
    if i < 0:
        seg._unpin(token)
        raise IndexError("segment index out of range")
    byte = <unsigned char>seg._ptr[i]
    seg._unpin(token)
    return byte


cdef extern from "<string.h>" nogil:
    # (a GNU extension; Python.h asks for them with _GNU_SOURCE)
    void* memmem(const void* haystack, size_t haystack_len, const void* needle, size_t needle_len)


cdef extern from "Python.h":
    Py_ssize_t _index_clipped "PyNumber_AsSsize_t"(object item, PyObject* overflow) except? -1


cdef bint _segment_contains(Segment seg, object item) except -1:
    """``item in seg`` as bytearray has it: a byte (an int in range(256)) or a run of bytes (any
    contiguous bytes-like object) found in the segment."""
    cdef Py_ssize_t byte
    cdef Py_buffer needle
    cdef void* token
    cdef bint found
    cdef bint is_byte = False
    if PyIndex_Check(item):
        # As bytes.__contains__: an item whose __index__ fails (a NumPy array of several elements,
        # which has one) is looked for as bytes; a huge int is clipped, then out of range.
        try:
            byte = _index_clipped(item, NULL)
            is_byte = True
        except Exception:
            pass
    if is_byte:
        if byte < 0 or byte > 255:
            raise ValueError(f"byte must be in range(0, 256), not {item!r}")
        seg._pin(&token)
        found = memchr(seg._ptr, <int>byte, <size_t>seg._size) != NULL
        seg._unpin(token)
        return found
    if not PyObject_CheckBuffer(item):
        raise TypeError(f"a bytes-like object is required, not '{type(item).__name__}'")
    PyObject_GetBuffer(item, &needle, PyBUF_SIMPLE)
    try:
        seg._pin(&token)
        found = needle.len == 0 or memmem(seg._ptr, <size_t>seg._size, needle.buf,
                                          <size_t>needle.len) != NULL
        seg._unpin(token)
    finally:
        PyBuffer_Release(&needle)
    return found


@cython.final
@cython.auto_pickle(False)
cdef class SegmentIterator:
    """iter(seg): its bytes as ints, each read when the loop reaches it (as bytearray's and
    memoryview's iterators read them): a write made during the loop is seen, and a segment freed
    during it raises ArenaClosedError at the next step."""

    cdef Segment _segment  # None once exhausted
    cdef Py_ssize_t _index

    def __cinit__(self, Segment segment not None):
        self._segment = segment

    def __iter__(self):
        return self

    def __next__(self):
        cdef Segment seg
        cdef Py_ssize_t index
        cdef void* token
        cdef unsigned char byte
        cdef bint claimed = False
        # The position claimed under the iterator's critical section: with the GIL off, threads
        # sharing one iterator each take their own byte, and none reads the segment after another
        # dropped it (the last reference: a crash).
        with cython.critical_section(self):
            seg = self._segment
            index = self._index
            if seg is not None and index < seg._size:
                self._index = index + 1
                claimed = True
        if seg is None:
            raise StopIteration
        seg._pin(&token)  # (a dead segment raises, at its end too)
        if not claimed:
            seg._unpin(token)
            with cython.critical_section(self):
                if self._segment is seg:
                    self._segment = None  # (``seg`` still holds it: no dealloc in the section)
            raise StopIteration
        byte = <unsigned char>seg._ptr[index]
        seg._unpin(token)
        return byte

    def __length_hint__(self):
        cdef Segment seg
        cdef Py_ssize_t index
        with cython.critical_section(self):
            seg = self._segment
            index = self._index
        return 0 if seg is None else seg._size - index


cdef int _segment_setitem(Segment seg, object key, object value) except -1:
    """seg[key] = value: a byte from an int, or a slice from a bytes-like object of its length."""
    cdef Py_ssize_t start, step, length, i
    cdef int byte
    cdef Py_buffer source
    cdef const char* data
    cdef bytes copy
    cdef void* token
    if not isinstance(key, slice):
        i = _position(key, seg._size)
        byte = <int>_as_byte(value)
        seg._pin(&token)
        if i < 0:
            seg._unpin(token)
            raise IndexError("segment index out of range")
        seg._ptr[i] = <char>byte
        seg._unpin(token)
        return 0
    length = _slice_length(key, seg._size, &start, &step)
    _acquire_source(value, &source)
    try:
        data = <const char*>source.buf
        # A strided source, or one overlapping this segment under a strided copy, goes through
        # a contiguous copy first (as memoryview assignment does).
        if source.len == length and (not PyBuffer_IsContiguous(&source, b"C") or (
                step != 1 and data < seg._ptr + seg._size and seg._ptr < data + length)):
            copy = PyBytes_FromStringAndSize(NULL, length)
            PyBuffer_ToContiguous(PyBytes_AS_STRING(copy), &source, length, b"C")
            data = PyBytes_AS_STRING(copy)
        seg._pin(&token)
        if source.len != length:
            seg._unpin(token)
            raise ValueError(f"segment slice assignment needs {length} bytes, got {source.len}; "
                             "the size of a segment cannot change")
        _scatter(seg._ptr + start, data, length, step)
        seg._unpin(token)
    finally:
        PyBuffer_Release(&source)
    return 0


cdef object _segment_fill(object obj, object value):
    """Segment.fill(value)."""
    cdef Segment seg = <Segment>obj
    if seg._readonly:
        _refuse_write(seg)
    cdef int byte = <int>_as_byte(value)
    cdef void* token
    seg._pin(&token)
    memset(seg._ptr, byte, <size_t>seg._size)
    seg._unpin(token)
    return seg


cdef Segment _segment_slice(Segment seg, object offset, object size):
    """seg.slice(offset, size): a segment of the same memory and lifetime, without copying."""
    if seg._arena is None:
        seg._check()  # a Segment not made by an arena: TypeError, before anything is counted
    cdef Py_ssize_t start = _bounded_index(offset, "offset")
    cdef Py_ssize_t length = _bounded_index(size, "size")
    cdef Segment child = make_segment(seg._arena, length, False)  # kept by its _root (below)
    seg._check()  # a dead segment says so before its bounds are judged
    if start > seg._size or length > seg._size - start:
        raise IndexError(
            f"slice(offset={offset}, size={size}) is out of bounds for a segment of "
            f"{seg._size} bytes")
    child._ptr = seg._ptr + start
    child._root = seg._owner_segment()
    child._generation = seg._generation
    child._frame_stamp = seg._frame_stamp
    child._readonly = seg._readonly  # a slice of a readonly() segment is read-only too
    return child


cdef object _dead_segment_error(Segment seg):
    cdef SegmentOwner arena = seg._arena
    # Read under the access announcement: no close or reset of another thread half done (or
    # writing the generation: ThreadSanitizer saw that race on 3.13t) meanwhile.
    cdef void* token = access_enter(seg._life)
    cdef bint arena_open = arena._is_open()
    cdef bint same_generation = seg._generation == seg._life.generation
    access_exit(token)
    if not arena_open:
        why = f"its {type(arena).__name__} is closed"
    elif seg._dead_root():
        if not seg._owner_segment()._resized:
            why = "it was freed or released"
        elif seg._root is None:
            why = "it was resized (use the segment resize() returned)"
        else:
            why = "the segment it is a slice of was resized (slice the segment resize() returned)"
    elif same_generation:
        why = f"its {type(arena).__name__} was rewound to a mark made before it"
    else:
        why = f"its {type(arena).__name__} was reset"
    return ArenaClosedError(f"segment of {seg._size} bytes is no longer usable: {why}")


cdef object _wrong_thread_error(SegmentOwner arena):
    # Read again, atomically: its owner's close may have made it no thread's since (then 0).
    cdef unsigned long owner = load_life_owner(&arena._life.owner)
    return WrongThreadError(
        f"{type(arena).__name__} belongs to {f'thread {owner}' if owner else 'another thread'}; "
        f"thread {thread_ident()} may not use it or its segments")
