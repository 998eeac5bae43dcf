# Segment: a view of native memory owned by an arena, with CPython's writable buffer protocol.
#
# A segment never owns its memory: its SegmentOwner (an arena, a BufferPool) does, and frees it on
# free(), reset() or close().  Every access first checks, in O(1), that the memory is still there
# (the segment's generation equals its arena's, and its root was not freed) and that the calling
# thread may touch it, so a stale handle raises instead of reading freed memory.  While a buffer
# export is alive, nothing may free the memory (BufferError, as mmap.close() does).
#
# THE RULE of every method that touches the memory: convert, then check, then touch.  All that can
# run Python code (argument conversion, __index__, slice.indices, buffer acquisition, object creation,
# which can start a GC) comes first; then _pin() announces the access and checks liveness; then only
# C that cannot call back runs until _unpin().  _access.pxi says how this holds with the GIL off.
#
# The parts: _convert.pxi converts the arguments; this file is the class, its checks and its buffer
# protocol; _segment_ops.pxi holds what indexing, slice assignment and slice() do; src/segment.h the
# C below them (live counters, the dealloc hook, ThreadSanitizer annotations).

cimport cython
from cpython.object cimport PyObject
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy, memset

from arenalib._abi cimport FREE_THREADED, Lifetime, life_generation, load_life_owner, owned_by_another
from arenalib._frames cimport frame_level_of, frame_stamp_alive

from arenalib._errors import ArenaClosedError, UnsupportedOperation

# The live counters, the dealloc hook and the ThreadSanitizer annotations: src/segment.h.
cdef extern from "src/segment.h":
    void user_bytes_begin "arenalib_user_bytes_begin"() noexcept nogil
    void user_bytes_end "arenalib_user_bytes_end"() noexcept nogil
    ctypedef struct Shards "arenalib_shard":
        pass
    Shards* LIVE_SEGMENTS "arenalib_live_segments"
    Shards* LIVE_EXPORTS "arenalib_live_exports"
    Shards* LIVE_ANCHORS "arenalib_live_anchors"
    void shard_add "arenalib_shard_add"(Shards* shards, Py_ssize_t delta) noexcept nogil
    Py_ssize_t shard_sum "arenalib_shard_sum"(Shards* shards) noexcept nogil
    void arenalib_segment_dealloc_init(type t, Py_ssize_t life_offset, Py_ssize_t owner_offset) noexcept
    void segment_set_owner "arenalib_segment_set_owner"(object seg, object owner) noexcept

cdef Py_ssize_t _ITEMSIZE_ONE = 1
cdef char* _FORMAT_BYTE = b"B"

cdef enum:  # what Segment._status() finds
    SEGMENT_USABLE = 0
    SEGMENT_NOT_FROM_ARENA
    SEGMENT_DEAD
    SEGMENT_WRONG_THREAD


cdef class SegmentOwner:
    """What hands out Segments (the arenas, BufferPool): the Lifetime its segments check, and what
    Segment.free() does.  Not instantiable."""

    def __cinit__(self):
        if type(self) is SegmentOwner:
            raise TypeError("SegmentOwner cannot be instantiated")

    cdef bint _is_open(self) noexcept:
        return False

    cdef int _free_segment(self, Segment seg) except -1:
        raise UnsupportedOperation(f"segments of {type(self).__name__} cannot be freed one by one")

    cdef int _check_freeable(self) except -1:
        """Raise unless this owner frees segments one by one (free(deferred=True) asks first: from
        __releasebuffer__ an error would be unraisable)."""
        return 0

    cdef void _exports_released(self) noexcept:
        """The last export of a segment of this owner, closed deferred, was released: let go of
        the memory (see ArenaBase.close)."""

    cdef Segment _resize_segment(self, Segment seg, Py_ssize_t size, bint zero):
        raise UnsupportedOperation(f"segments of {type(self).__name__} have a fixed size")


@cython.final
@cython.freelist(1024)
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

    cdef int _pin(self, void** token) except -1:
        """The last step before touching the memory (see THE RULE above): announce the access (on a
        free-threaded build, for owners any thread may use: see _access.pxi), then check that the
        memory is still there.  Until _unpin(token), no free, release, reset or close can take it.
        Owned by the calling thread (a ConfinedArena, a thread's frame arena): only this thread
        may kill it (every kill path checks the owner first, the C API's too), and it runs no
        Python code until _unpin(), so the check is all it needs.  Any thread's, on a GIL build:
        the access counts as an export of the root and of the owner, which a C-level free, reset
        or close from a thread without the GIL that tests the exports after it refuses to break
        (an Arena's reset and a rewind of what Python carved take the GIL instead, which closes
        the gap between this check and the count; for the rest the C API asks its caller that
        no other thread use what it kills); on a free-threaded build they wait for the access to
        end.  (Counting an owned arena's accesses too cost `seg == b` ~4
        ns of ~47 here.)"""
        cdef PyObject* owner = _owner_of(self)
        cdef Lifetime* life = self._life
        token[0] = access_enter_root(life, <Segment>owner) if life != NULL else NULL
        cdef int status = self._status()
        if status:
            access_exit(token[0])
            return self._raise_status(status)
        if not FREE_THREADED and load_life_owner(&life.owner) == 0:
            _count_export(<Segment>owner, life, 1)
            token[0] = PIN_COUNTED
        user_bytes_begin()
        return 0

    cdef void _unpin(self, void* token) noexcept:
        user_bytes_end()
        if FREE_THREADED:
            access_exit(token)
        elif token == PIN_COUNTED:
            _count_export(<Segment>_owner_of(self), self._life, -1)

    cdef int _status(self) noexcept:
        """SEGMENT_USABLE when the calling thread may touch the memory now, else what is wrong."""
        cdef Lifetime* life = self._life
        if life == NULL:
            return SEGMENT_NOT_FROM_ARENA
        # The owner first, as Panama checks a confined segment's thread before its state: another
        # thread reads nothing else of an arena one thread owns (whose accesses take no records),
        # and a closed arena is no thread's.  An owner that became 0 did so after the close that
        # made this segment dead, which the generation read next then shows (_core_shut).
        if owned_by_another(life):
            return SEGMENT_WRONG_THREAD
        # A free under way (SEG_FREEING) may still be refused: alive until it is done.
        if not self._current() or self._dead_root():
            return SEGMENT_DEAD
        return SEGMENT_USABLE

    cdef bint _current(self) noexcept:
        """The memory was not reset, closed or rewound away: the owner's generation is the
        segment's, and so is the stamp of the level of marks it was carved in (see _frames.pxd)."""
        cdef Lifetime* life = self._life
        return (life_generation(life) == self._generation
                and frame_stamp_alive(life, self._frame_stamp))

    cdef bint _dead_root(self) noexcept:
        """The memory was freed or released (read while another thread may be freeing it)."""
        return state_read(&(<Segment>_owner_of(self))._freed) == SEG_FREED

    cdef int _raise_status(self, int status) except -1:
        if status == SEGMENT_NOT_FROM_ARENA:
            raise TypeError("this Segment was not made by an arena")
        if status == SEGMENT_DEAD:
            raise _dead_segment_error(self)
        raise _wrong_thread_error(self._arena)

    cdef int _check(self) except -1:
        """Raise unless the calling thread may use the segment now (read as _pin() reads, so that
        no reset or close of another thread is half done)."""
        cdef Lifetime* life = self._life
        cdef void* token = access_enter(life) if life != NULL else NULL
        cdef int status = self._status()
        access_exit(token)
        if status:
            return self._raise_status(status)
        return 0

    # -- buffer protocol -------------------------------------------------------------------------

    def __getbuffer__(self, Py_buffer* view, int flags):
        cdef void* token
        if self._readonly and flags & PyBUF_WRITABLE:
            raise BufferError("this segment is read-only (made by readonly()): no writable buffer")
        self._pin(&token)
        view.buf = self._ptr
        view.len = self._size
        view.readonly = self._readonly
        view.itemsize = 1
        view.format = _FORMAT_BYTE if flags & PyBUF_FORMAT else NULL
        view.ndim = 1
        view.shape = &self._size if flags & PyBUF_ND else NULL
        view.strides = &_ITEMSIZE_ONE if flags & PyBUF_STRIDES else NULL
        view.suboffsets = NULL
        view.internal = NULL
        view.obj = self
        _count_export(self._owner_segment(), self._life, 1)
        shard_add(LIVE_EXPORTS, 1)
        self._unpin(token)
        if _debug_entries:  # after the touch (it makes objects), while the export holds the memory
            debug_note_export(self._owner_segment(), 1)

    def __releasebuffer__(self, Py_buffer* view):
        cdef Segment owner = self._owner_segment()
        _count_export(owner, self._life, -1)
        shard_add(LIVE_EXPORTS, -1)
        if _debug_entries:
            debug_note_export(owner, -1)
        # The count first, then the flag (free(deferred=True) sets the flag, then reads the count):
        # of a last release and a deferred free at once, one sees the other, and one claims it.
        if count_read(&owner._exports) == 0 and flag_claim(&owner._free_pending):
            owner._free_pending_now()
        # An arena closed deferred: the last export's release gives its memory back.
        if state_read(&self._life.release_pending) and count_read(&self._life.exports) == 0:
            self._arena._exports_released()

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
        if self._life == NULL:
            return False
        cdef void* token = access_enter(self._life)
        cdef bint alive = self._current() and not self._dead_root()
        access_exit(token)
        return alive

    @property
    def exports(self):
        """Number of live buffer exports (memoryviews, NumPy arrays ...) of this segment's memory."""
        return count_read(&self._owner_segment()._exports)

    def __len__(self):
        return self._size

    # -- access ----------------------------------------------------------------------------------

    def fill(self, value):
        """Set every byte to ``value`` (an int in range(0, 256)); returns the segment."""
        # fill(value) goes to _segment_fill() straight (src/entries.h).
        return _segment_fill(self, value)

    def tobytes(self):
        """A bytes copy of the whole segment."""
        cdef bytes copy = PyBytes_FromStringAndSize(NULL, self._size)
        cdef void* token
        self._pin(&token)
        memcpy(PyBytes_AS_STRING(copy), self._ptr, <size_t>self._size)
        self._unpin(token)
        return copy

    def slice(self, offset, size):
        """A segment viewing ``size`` bytes from ``offset``, without copying (Panama's asSlice).

        The slice shares this segment's memory and lifetime; an export of it counts as an export
        of the parent.  Negative arguments raise ValueError, out-of-bounds ones IndexError."""
        return _segment_slice(self, offset, size)

    def free(self, *, bint deferred=False):
        """Give the memory back to the arena now; any later use of this segment raises
        ArenaClosedError.  Not available for slices and for SlicingArena segments.

        deferred=True: while a buffer export (memoryview ...) of the segment is alive, free it
        when the last one is released instead of raising BufferError; until then it stays usable.
        For the caller that must let go of a buffer its own caller still holds (asyncio's
        buffer_updated(), see arenalib.aio).  A ConfinedArena's segment whose last export is
        released by another thread stays allocated until the arena's reset or close."""
        self._check()
        if self._root is not None:
            raise UnsupportedOperation("a slice (or readonly() view) shares its parent's memory: "
                                       "free the parent instead")
        if deferred:
            self._arena._check_freeable()
            self._free_when_unexported()
        else:
            self._arena._free_segment(self)  # the owner's rule (and its refusal while exports live)

    def __enter__(self):
        """``with arena.allocate(n) as seg:`` / ``with pool.acquire() as seg:``: the segment is freed
        (released to its pool) at the block's end, deferred while a buffer export of it is alive
        (see free()).  UnsupportedOperation for a slice or a SlicingArena's segment, which are not
        freed one by one (``with arena.frame()`` frees a SlicingArena's)."""
        self._check()
        if self._root is not None:
            raise UnsupportedOperation("a slice (or readonly() view) is not freed by itself: "
                                       "use `with` on the segment it was made from")
        self._arena._check_freeable()
        return self

    def __exit__(self, exc_type, exc, tb):
        # free(deferred=True), unless the memory went already (freed, resized, reset or closed in the
        # block).  The block's exception, if any, propagates unchanged; a failure of the free is
        # noted on it (as ArenaBase.__exit__ does).
        cdef int status = self._status()
        if status == SEGMENT_DEAD:
            return False
        try:
            if status:
                self._raise_status(status)  # (a ConfinedArena's segment left on another thread)
            if self._root is not None:  # __exit__ called without __enter__, which refuses these
                raise UnsupportedOperation("a slice (or readonly() view) is not freed by itself")
            self._arena._check_freeable()
            self._free_when_unexported()
        except ArenaClosedError:
            pass  # another thread freed it, or reset or closed its arena, since the look above
        except Exception as free_error:
            if exc is None or isinstance(exc, GeneratorExit):
                raise  # (a generator's close() swallows GeneratorExit, and a note on it with it)
            _add_note(exc, f"and freeing the segment failed: {free_error!r}")
        return False

    def resize(self, size, *, zero=True):
        """A segment of ``size`` bytes holding this one's bytes (up to the smaller size), from
        the same arena; this segment dies (ArenaClosedError), as a pointer passed to C's
        realloc() does.  A segment's length never changes, so that no length a caller or another
        thread has checked turns false.

        In place when the arena can (the returned segment's address is this one's: jemalloc's
        xallocx(), the last carve of a SlicingArena), else the bytes move (jemalloc's rallocx(), a
        new carve).  zero: the bytes past the old size are zero-filled (False: left as they
        are).  The alignment asked at allocation is kept.  Raises BufferError while a buffer
        export of the segment or of a slice of it is alive, UnsupportedOperation for a slice or
        a BufferPool's buffer, MemoryError when the memory cannot be had or max_bytes would be
        exceeded (the segment then unchanged and alive)."""
        cdef Py_ssize_t n = _parse_size(size, "size")
        cdef bint fill_zero = parse_flag(zero, "zero")
        self._check()
        if self._root is not None:
            raise UnsupportedOperation(
                "a slice (or readonly() view) shares its parent's memory: resize the parent")
        return self._arena._resize_segment(self, n, fill_zero)

    cdef int _free_when_unexported(self) except -1:
        """Free this checked root segment now if no export of it is alive, else mark it for the
        last export's release (see __releasebuffer__)."""
        while True:
            flag_set(&self._free_pending)
            if count_read(&self._exports) != 0 or not flag_claim(&self._free_pending):
                return 0  # the last export's release frees it (it claims the flag)
            try:
                self._arena._free_segment(self)
                return 0
            except BufferError:
                # With the GIL off, another thread took an export between the count read and the
                # free, which refused: marked again for its release (which may have come and gone
                # since, finding no mark: then the count is 0 again and the free is tried anew).
                # Raising instead left the segment unfreed for good (helper 53).
                pass

    cdef int _free_pending_now(self) except -1:
        """The deferred free, once its last export is gone (an error is unraisable from there)."""
        if owned_by_another(self._life):
            return 0  # a ConfinedArena's, released elsewhere: its reset or close takes it
        if self._current() and not self._dead_root():
            try:
                self._free_when_unexported()  # (a new export may have come since the count)
            except ArenaClosedError:
                pass  # another thread's reset or close took the memory since the check above
        return 0

    def __getitem__(self, key):
        return _segment_getitem(self, key)

    def __setitem__(self, key, value):
        if self._readonly:
            _refuse_write(self)
        _segment_setitem(self, key, value)

    def __delitem__(self, key):
        raise TypeError("a segment has a fixed size: its bytes cannot be deleted")

    def __iter__(self):
        return SegmentIterator(self)

    def __contains__(self, item):
        return _segment_contains(self, item)

    def __repr__(self):
        cdef SegmentOwner arena = self._arena
        if arena is None:
            return "<arenalib.Segment (not made by an arena)>"
        state = "alive" if self.alive else "dead"
        kind = "slice of " if self._root is not None else ""
        return (f"<arenalib.Segment {self._size} bytes at {<size_t>self._ptr:#x}, "
                f"{kind}{type(arena).__name__} {id(arena):#x}, {state}>")

    # (No __dealloc__: segment_dealloc_init() counts a segment out.)

    def __reduce__(self):
        raise TypeError("a Segment views native memory and cannot be pickled or copied; "
                        "use tobytes()")

    # -- Panama-style helpers (issue 27): their bodies and equivalents are in _segment_helpers.pxi --

    def mismatch(self, other, /):
        """The first byte offset where this segment and ``other`` (any contiguous bytes-like
        object, as bytes.find() takes) differ; the shorter one's length when one is a prefix of
        the other; -1 when they are equal.  A strided buffer is refused by its exporter
        (BufferError from a memoryview, ValueError from a NumPy array).

        Panama's MemorySegment.mismatch; in Python, a loop over both (or ``==`` for equality)."""
        cdef Py_ssize_t found = _segment_mismatch(self, other)
        if found < 0:
            return -1  # the common answer: Cython's constant, not a conversion (~20 instructions)
        return found

    def __eq__(self, other):
        # Equal bytes, as bytearray compares with any bytes-like object (and so unhashable).
        if type(other) is bytes:
            return _segment_equals_bytes(self, <bytes>other)  # (inline here: see there)
        return _segment_equals(self, other)

    def __ne__(self, other):
        equal = _segment_equals(self, other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # equal by content, which changes: no hash (as bytearray)

    def hex(self, sep=None, bytes_per_sep=1):
        """The bytes as hexadecimal digits, as Python's ``bytes.hex(sep, bytes_per_sep)`` gives them
        (sep=None: no separator, which bytes.hex() says by leaving sep out), without a copy to bytes
        first.  Panama has none (Java's HexFormat.of().formatHex(segment.toArray(JAVA_BYTE)))."""
        return _segment_hex(self, sep, bytes_per_sep)

    def readonly(self):
        """A read-only segment of the same memory and lifetime (Panama's asReadOnly; in Python,
        memoryview.toreadonly()).

        Its buffer exports are read-only (a writable request raises BufferError, as bytes does);
        fill(), item and slice assignment raise TypeError; slices of it are read-only too."""
        return _segment_readonly(self)

    def is_accessible_by(self, thread, /):
        """Whether ``thread`` (a threading.Thread or a threading.get_ident() value) may use this
        segment now: True while it is alive, unless its arena is a ConfinedArena owned by another
        thread.  Panama's MemorySegment.isAccessibleBy."""
        return _segment_accessible_by(self, thread)


cdef int segment_dealloc_init() except -1:
    """Hook Segment's tp_dealloc (src/segment.h), telling it where a Segment keeps its Lifetime
    and owner pointers: computed on a probe, as Cython lays the object out (its C struct's name is
    Cython's, not ours to spell)."""
    cdef Segment probe = Segment.__new__(Segment)
    cdef char* base = <char*><void*>probe
    # Cython takes no address of an object field: _arena is the field after _size, and _keeper the
    # one after it (arenalib/_arena.pxd), which the probe confirms.
    cdef Py_ssize_t owner_offset = <char*>&probe._size + sizeof(Py_ssize_t) - base
    probe._keeper = probe
    cdef PyObject** fields = <PyObject**>(base + owner_offset)
    if fields[0] != <PyObject*>None or fields[1] != <PyObject*>probe:
        probe._keeper = None
        raise ImportError("arenalib: Segment's fields are not laid out as arenalib/_arena.pxd says")
    probe._keeper = None
    arenalib_segment_dealloc_init(Segment, <char*>&probe._life - base, owner_offset)
    return 0


cdef void* PIN_COUNTED = <void*>1  # _pin()'s token on a GIL build when it counted an export

cdef inline PyObject* _owner_of(Segment seg) noexcept:
    """_owner_segment() borrowed (``seg`` keeps its root): the checks of every access take no
    reference (a round trip of one cost _pin and _status ~10 instructions of ~60)."""
    return <PyObject*>seg if seg._root is None else <PyObject*>seg._root


cdef inline void _count_export(Segment root, Lifetime* life, Py_ssize_t delta) noexcept:
    """An export or pin of ``root``'s memory begins (1) or ends (-1): counted on the root, its
    owner and, for a segment carved under a mark, that mark's level (which a rewind may not kill).
    The owner's count last when one ends: a close that reads it 0 frees the stack of marks (a
    release takes no access record), so no level may be counted after."""
    if delta > 0:
        count_add(&root._exports, delta)
        count_add(&life.exports, delta)
    if root._frame_stamp:
        count_add(&frame_level_of(life, root._frame_stamp).exports, delta)
    if delta < 0:
        count_add(&root._exports, delta)
        count_add(&life.exports, delta)


cdef Segment make_segment(SegmentOwner arena, Py_ssize_t size, bint keep=True):
    """new_segment(), out of line for arenalib's other modules."""
    return new_segment(arena, size, keep)


cdef inline Segment new_segment(SegmentOwner arena, Py_ssize_t size, bint keep):
    """A new root segment of ``arena``, dead until its caller sets ``_ptr`` and ``_generation``.

    keep=False leaves ``_keeper`` to the caller (None meanwhile): the caller keeps the arena
    alive until it sets one, or the segment's _root keeps it.  Made before the memory is taken:
    creating the object may start a GC, and with it any Python code, which must not run between
    taking the memory and handing it out."""
    cdef Segment seg = Segment.__new__(Segment)
    seg._size = size
    segment_set_owner(seg, arena)  # borrowed (src/segment.h): _keeper holds the reference
    if keep:
        seg._keeper = arena
    seg._life = arena._life  # never NULL (an owner's __cinit__ sets it first): the dealloc hook's mark
    seg._frame_stamp = 0
    seg._readonly = False
    seg._lg_align = 0
    seg._resized = False
    shard_add(LIVE_SEGMENTS, 1)
    return seg
