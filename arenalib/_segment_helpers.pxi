# The Panama-style helpers of issue 27: what a Java FFM (Panama) or a bytes/bytearray user looks for,
# as module-level cdef functions the thin methods of Segment and ArenaBase call (Cython refuses an
# include in a class body, so each method there is one line that calls its function here).
#
#   arena.allocate_from(data)        MemorySegment allocateFrom(...)   bytearray(data)
#   arena.allocate_string(s)         allocateFrom(String)               s.encode() (+ a NUL)
#   arenalib.copy(src, so, dst, do, n)  MemorySegment.copy              dst[do:do+n] = src[so:so+n]
#   seg.mismatch(other)              MemorySegment.mismatch             (no equivalent)
#   seg == other                     MemorySegment.equals is identity   bytearray == other
#   seg.hex(sep, bytes_per_sep)      (HexFormat.of().formatHex)         bytes.hex
#   seg.readonly()                   MemorySegment.asReadOnly           memoryview.toreadonly
#   seg.is_accessible_by(thread)     MemorySegment.isAccessibleBy       (no equivalent)
#
# Every function keeps THE RULE of _segment.pxi: convert the arguments (any __index__), acquire the
# other objects' buffers (any __buffer__; a buffer of a Segment is an export of it, which its free,
# reset or close refuse to break, so it needs no pin of its own), make the result object, and only
# then pin the segment being touched (its last liveness check), touch, unpin.  The allocating
# helpers write the new segment's first bytes inside ArenaBase._allocate, as the block is bound to it.

from cpython.buffer cimport PyBUF_SIMPLE, PyObject_CheckBuffer
from cpython.number cimport PyNumber_Index
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.limits cimport ULONG_MAX
from libc.string cimport memcmp

cdef extern from "Python.h":
    # A new str of ``size`` code points below ``maxchar`` (127: one byte each, PyUnicode_DATA).
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object text) noexcept
    bint PyUnicode_IS_COMPACT_ASCII(object text) noexcept  # (always ready: safe on 3.10-3.11 too)
    Py_ssize_t PyUnicode_GET_LENGTH(object text) noexcept

cdef const char* _HEX_DIGITS = b"0123456789abcdef"
cdef unsigned short _HEX_PAIRS[256]  # byte -> its two digits, as they lie in memory (_hex_init)


cdef int _hex_init() except -1:
    cdef int byte
    cdef unsigned char* pair
    for byte in range(256):
        pair = <unsigned char*>&_HEX_PAIRS[byte]
        pair[0] = _HEX_DIGITS[byte >> 4]
        pair[1] = _HEX_DIGITS[byte & 15]
    return 0


_hex_init()


cdef int _acquire_bytes(object value, Py_buffer* view, str what) except -1:
    """The contiguous bytes of any bytes-like ``value`` (as bytes' methods take them); the caller
    releases ``view``.  May run Python code (a __buffer__): a step of the conversion."""
    if not PyObject_CheckBuffer(value):
        raise TypeError(f"{what} must be a bytes-like object, not {type(value).__name__}")
    PyObject_GetBuffer(value, view, PyBUF_SIMPLE)
    return 0


cdef int _check_still_alive(Py_buffer* view) except -1:
    """After the last step that may run Python code, for a buffer acquired before it: raise
    ArenaClosedError when it is a Segment's that died meanwhile.  Its export keeps the memory,
    but not the segment alive: a deferred close or free (in a __buffer__ acquired later, in a
    finalizer the result's allocation ran) kills it at once and frees the memory at the release."""
    cdef PyObject* exporter = <PyObject*>view.obj  # (NULL for an exporter that names none)
    if exporter != NULL and type(<object>exporter) is Segment:
        (<Segment>exporter)._check()
    return 0


# -- arena.allocate_from, arena.allocate_string ------------------------------------------------------

cdef Segment _allocate_from(ArenaBase arena, object data, object align):
    """A new segment of ``arena`` holding a copy of the bytes of ``data`` (any buffer; a strided
    one is copied in C order, as bytearray(data) does)."""
    cdef size_t alignment = 1 if align is None else parse_align(align)
    cdef Py_buffer source
    cdef Segment seg
    cdef void* token
    if not PyObject_CheckBuffer(data):
        raise TypeError(f"allocate_from() needs a bytes-like object, not {type(data).__name__}")
    PyObject_GetBuffer(data, &source, PyBUF_FULL_RO)
    try:
        # The source's buffer is held all along, so no finalizer the segment's creation runs can
        # free it; when it is a Segment such a finalizer killed, the check after says so (and the
        # new segment, written from memory its export kept, is dropped).
        if PyBuffer_IsContiguous(&source, b"C"):
            # Copied as the block is bound to the segment (see ArenaBase._allocate).
            seg = arena._allocate(source.len, False, alignment, NULL, <const char*>source.buf,
                                  source.len)
            _check_still_alive(&source)
        else:
            seg = arena._allocate(source.len, False, alignment, NULL, NULL, -1)
            _check_still_alive(&source)
            seg._pin(&token)
            PyBuffer_ToContiguous(seg._ptr, &source, source.len, b"C")
            seg._unpin(token)
    finally:
        PyBuffer_Release(&source)
    return seg


cdef inline Segment allocate_ascii(ArenaBase arena, object text, Py_ssize_t terminator):
    """A new segment of ``arena`` holding the characters of ``text``, a compact ASCII str (they are
    its UTF-8: read in place, no copy), and ``terminator`` NUL bytes after them.  The caller keeps
    ``text`` alive."""
    cdef Py_ssize_t length = PyUnicode_GET_LENGTH(text)  # (plus a NUL: no overflow, a str is smaller)
    # Copied, and the NUL written, as the block is bound to the segment (see ArenaBase._allocate).
    return arena._allocate(length + terminator, False, 1, NULL, <const char*>PyUnicode_DATA(text),
                           length)


cdef Segment _allocate_string(ArenaBase arena, object text, object encoding, object nul):
    """A new segment of ``arena`` holding ``text`` encoded, and a NUL byte after it when ``nul``."""
    cdef bint terminated = parse_flag(nul, "nul")
    cdef const char* data
    cdef Py_ssize_t length
    cdef Py_ssize_t terminator = terminated  # the NUL's bytes: one code unit of the encoding
    cdef object encoded
    if not isinstance(text, str):  # (a subclass's own encode() is not called: its str is encoded)
        raise TypeError(f"allocate_string() needs a str, not {type(text).__name__}")
    if encoding == "utf-8" or encoding == "utf8":
        if PyUnicode_IS_COMPACT_ASCII(text):
            return allocate_ascii(arena, text, terminator)
        data = PyUnicode_AsUTF8AndSize(text, &length)  # str's own UTF-8, cached in it: no copy
        encoded = text  # what keeps ``data``
    else:
        if terminated:
            terminator = _nul_width(encoding)
        encoded = str.encode(text, encoding)
        if type(encoded) is not bytes:
            raise TypeError(f"encoding {encoding!r} gave {type(encoded).__name__}, not bytes")
        data = PyBytes_AS_STRING(encoded)
        length = len(<bytes>encoded)
    if length > PY_SSIZE_T_MAX - terminator:
        raise MemoryError(f"a string of {length} bytes and its NUL is larger than any segment")
    # Copied, and the NUL written, as the block is bound to the segment (see ArenaBase._allocate).
    return arena._allocate(length + terminator, False, 1, NULL, data, length)


cdef dict _NUL_WIDTHS = {}  # of the standard library's encodings only: no registration changes them


cdef Py_ssize_t _nul_width(object encoding) except -1:
    """The bytes of a NUL character in ``encoding`` (2 in UTF-16, 4 in UTF-32, as Panama's
    allocateFrom(String, Charset) terminates): what one more NUL character adds to the encoded
    bytes, so a byte order mark counts once; 1 where that is not 1, 2 or 4 zero bytes (a codec
    that refuses a NUL, or gives something else)."""
    cdef object one, two
    width = _NUL_WIDTHS.get(encoding)
    if width is not None:
        return width
    try:
        one, two = "\0".encode(encoding), "\0\0".encode(encoding)
    except Exception:
        # A codec may refuse a NUL with any exception; the text itself may still encode (and if
        # it does not, its own encode() says why).
        return 1
    width = len(two) - len(one) if isinstance(two, bytes) and isinstance(one, bytes) else 1
    if width not in (1, 2, 4) or bytes(two[len(one):]) != bytes(width):
        width = 1
    # Remembered only for an encoding of the standard library: its search function is consulted
    # first, so no later codecs.register() can change what the name means.  A registered codec
    # can be unregistered and another registered under its name: it is asked every time.
    import encodings
    if type(encoding) is str and len(_NUL_WIDTHS) < 64 and encodings.search_function(encoding):
        _NUL_WIDTHS[encoding] = width
    return width


# -- arenalib.copy -----------------------------------------------------------------------------------

cdef inline Py_ssize_t _offset(object value, str name) except -1:
    """_bounded_index() with the common case first: an int that fits, without its try block (the
    cost of three conversions shows in copy() of small buffers)."""
    cdef Py_ssize_t n
    if type(value) is int:
        n = _long_as_ssize(value)
        if n >= 0:
            return n
        PyErr_Clear()  # negative or too large: the general path says which
    return _bounded_index(value, name)


cdef inline object _shown(object given, Py_ssize_t bounded):
    """An offset or size as the caller passed it (an int past Py_ssize_t's range is bounded)."""
    return given if type(given) is int else bounded


def copy(src, src_offset, dst, dst_offset, nbytes, /):
    """Copy ``nbytes`` bytes from ``src`` at byte ``src_offset`` to ``dst`` at byte ``dst_offset``.

    Any contiguous buffers (segments, bytes, bytearray, memoryview, mmap, NumPy arrays); the two may
    be the same object and the ranges may overlap (as memmove).  Panama's MemorySegment.copy; in
    Python, ``memoryview(dst).cast("B")[d:d + n] = memoryview(src).cast("B")[s:s + n]``.

    Raises ValueError for a negative offset or size, IndexError when a range is out of bounds,
    TypeError when ``dst`` is read-only (bytes, a readonly() segment), ArenaClosedError for a
    dead segment; a buffer that is not contiguous is refused by its exporter (BufferError from a
    memoryview, ValueError from a NumPy array)."""
    cdef Py_ssize_t source_at = _offset(src_offset, "src_offset")
    cdef Py_ssize_t target_at = _offset(dst_offset, "dst_offset")
    cdef Py_ssize_t length = _offset(nbytes, "nbytes")
    cdef Py_buffer source
    cdef Py_buffer target
    _acquire_bytes(src, &source, "src")
    try:
        # Read-only first, then the flag: a read-only dst is a TypeError, as for
        # memoryview(b"..")[0:1] = b"x", not the BufferError a writable request would raise.
        _acquire_bytes(dst, &target, "dst")
        try:
            if target.readonly:
                raise TypeError(f"copy() cannot write to read-only memory ({type(dst).__name__})")
            if source_at > source.len or length > source.len - source_at:
                raise IndexError(f"copy() reads [{_shown(src_offset, source_at)}:"
                                 f"{_shown(src_offset, source_at)}+{_shown(nbytes, length)}] of a "
                                 f"{source.len}-byte src")
            if target_at > target.len or length > target.len - target_at:
                raise IndexError(f"copy() writes [{_shown(dst_offset, target_at)}:"
                                 f"{_shown(dst_offset, target_at)}+{_shown(nbytes, length)}] of a "
                                 f"{target.len}-byte dst")
            # Both buffers are held: nothing can free either until they are released.
            _check_still_alive(&source)  # (dst's __buffer__ ran after src's was taken)
            memmove(<char*>target.buf + target_at, <const char*>source.buf + source_at,
                    <size_t>length)
        finally:
            PyBuffer_Release(&target)
    finally:
        PyBuffer_Release(&source)


# -- seg.mismatch, seg == other -------------------------------------------------------------------------

cdef inline Py_ssize_t _first_difference(const char* a, const char* b, Py_ssize_t n) noexcept nogil:
    """The first i < n with a[i] != b[i], or -1: one memcmp for equal bytes (the common case, as
    fast as bytes ==); else memcmp finds a differing block, a byte loop the byte in it."""
    cdef Py_ssize_t start = 0
    cdef Py_ssize_t block
    if memcmp(a, b, <size_t>n) == 0:
        return -1
    while start < n:
        block = n - start if n - start < 256 else 256
        if memcmp(a + start, b + start, <size_t>block) != 0:
            while a[start] == b[start]:
                start += 1
            return start
        start += block
    return -1


cdef Py_ssize_t _segment_mismatch(Segment seg, object other) except -2:
    """The first offset where ``seg`` and ``other`` differ; the shorter's length when one is a
    prefix of the other; -1 when they are equal."""
    cdef void* token
    cdef Py_ssize_t common, found, length
    if type(other) is not bytes:
        return _segment_mismatch_buffer(seg, other)
    # Without a buffer export, as _segment_equals() does.
    length = len(<bytes>other)
    seg._pin(&token)
    common = seg._size if seg._size < length else length
    found = _first_difference(seg._ptr, PyBytes_AS_STRING(other), common)
    seg._unpin(token)
    return common if found < 0 and seg._size != length else found


cdef Py_ssize_t _segment_mismatch_buffer(Segment seg, object other) except -2:
    """_segment_mismatch() with any other bytes-like object: through its buffer."""
    cdef Py_buffer view
    cdef void* token
    cdef Py_ssize_t common, found
    _acquire_bytes(other, &view, "mismatch() argument")
    try:
        seg._pin(&token)
        common = seg._size if seg._size < view.len else view.len
        found = _first_difference(seg._ptr, <const char*>view.buf, common)
        seg._unpin(token)
    finally:
        PyBuffer_Release(&view)
    if found < 0 and seg._size != view.len:
        return common
    return found


cdef inline object _segment_equals_bytes(Segment seg, bytes other):
    """_segment_equals() with a bytes object, the common case: without a buffer export (a bytes
    object's memory is immutable and held by the reference the caller holds).  Inline in
    Segment.__eq__: the buffer path's frame (a Py_buffer, try blocks) cost it ~15 instructions of
    ~65 when they shared one."""
    cdef void* token
    cdef Py_ssize_t length = len(other)
    seg._pin(&token)
    cdef bint equal = (seg._size == length
                       and memcmp(seg._ptr, PyBytes_AS_STRING(other), <size_t>length) == 0)
    seg._unpin(token)
    return equal


cdef object _segment_equals(Segment seg, object other):
    """seg == other as bytearray has it: equal bytes, with any contiguous bytes-like object;
    NotImplemented for anything else (a str, an int, a strided memoryview)."""
    cdef Py_buffer view
    cdef void* token
    cdef bint equal
    if type(other) is bytes:
        return _segment_equals_bytes(seg, <bytes>other)
    if not PyObject_CheckBuffer(other):
        return NotImplemented
    cdef int status
    try:
        PyObject_GetBuffer(other, &view, PyBUF_SIMPLE)
    except Exception:
        # Whatever the exporter raised (BufferError from a strided memoryview, ValueError from a
        # strided NumPy array, anything from a __buffer__): bytearray's comparison clears it and
        # says NotImplemented too, unless this segment is dead (two dead segments compared each
        # other's failed export away, and Python then compared them by identity).  A dead segment
        # on the other side raises from its own reflected __eq__.
        status = seg._status()
        if status:
            seg._raise_status(status)
        return NotImplemented
    try:
        seg._pin(&token)
        equal = seg._size == view.len and memcmp(seg._ptr, view.buf, <size_t>seg._size) == 0
        seg._unpin(token)
    finally:
        PyBuffer_Release(&view)
    return equal


# -- seg.hex ---------------------------------------------------------------------------------------

cdef str _segment_hex(Segment seg, object sep, object bytes_per_sep):
    """bytes.hex() of the segment's bytes, without copying them to a bytes first."""
    cdef str text
    cdef unsigned char* out
    cdef const unsigned char* data
    cdef Py_ssize_t i
    cdef void* token
    if type(bytes_per_sep) is not int:
        # A conversion (any __index__), before the export or the pin below: code that frees or
        # closes there finds the segment not yet touched.
        bytes_per_sep = PyNumber_Index(bytes_per_sep)
    if not -2147483648 <= bytes_per_sep <= 2147483647:  # judged without a sep too, as bytes.hex() does
        raise OverflowError("Python int too large to convert to C int")  # (its words)
    if sep is not None:
        # The separated forms through memoryview.hex(), which judges sep (a str or bytes: its
        # characters are read, no code of it runs) as bytes.hex() does; the memoryview holds an
        # export, so no free can run under it.
        with memoryview(seg) as view:
            return view.hex(sep, bytes_per_sep)
    if seg._size > PY_SSIZE_T_MAX // 2:
        raise MemoryError(f"the hex of {seg._size} bytes is longer than any str")
    text = PyUnicode_New(2 * seg._size, 127)
    out = <unsigned char*>PyUnicode_DATA(text)
    seg._pin(&token)
    data = <const unsigned char*>seg._ptr
    for i in range(seg._size):  # both digits of a byte in one 2-byte store
        memcpy(out + 2 * i, &_HEX_PAIRS[data[i]], 2)
    seg._unpin(token)
    return text


# -- seg.readonly, seg.is_accessible_by ------------------------------------------------------------

cdef Segment _segment_readonly(Segment seg):
    """A read-only segment of the same memory and lifetime (what slice() makes, marked read-only)."""
    cdef Segment view = _segment_slice(seg, 0, seg._size)
    view._readonly = True
    return view


cdef int _refuse_write(Segment seg) except -1:
    """TypeError for a write to a read-only segment (what bytes and a read-only memoryview raise)."""
    raise TypeError("this segment is read-only (made by readonly()): it cannot be written")


cdef bint _segment_accessible_by(Segment seg, object thread) except -1:
    """Whether ``thread`` (a threading.Thread, or an ident as threading.get_ident() gives) may use
    the segment now: it is alive, and its owner is not confined to another thread."""
    cdef unsigned long ident
    if isinstance(thread, int) and not isinstance(thread, bool):
        if thread < 0 or thread > <object>ULONG_MAX:
            return False  # no thread has that ident (threading.get_ident() is an unsigned long)
        ident = thread
    else:
        import threading  # already imported by any program that has a Thread to pass
        if not isinstance(thread, threading.Thread):
            raise TypeError(f"is_accessible_by() needs a threading.Thread or a thread ident (int), "
                            f"not {type(thread).__name__}")
        if thread.ident is None:
            return False  # not started: it may not be the owner, whoever that is
        ident = thread.ident
    cdef Lifetime* life = seg._life
    if life == NULL:
        return False
    # The owner first, as Segment._status reads it: a close clears it last, so a thread that read
    # 0 (or the owner) then sees the close.  Read after the liveness, a close in between made a
    # segment alive while its owner held it answer True for every thread.
    cdef unsigned long owner = load_life_owner(&life.owner)
    if owner != 0 and owner != ident:
        return False
    cdef void* token = access_enter(life)
    cdef bint alive = seg._current() and not seg._dead_root()
    access_exit(token)
    return alive
