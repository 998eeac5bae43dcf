# cython: language_level=3
"""BufferPool: fixed-size, aligned buffers carved from one region of the private jemalloc, recycled
in O(1) for I/O (io_uring, O_DIRECT, sockets).

BufferPool is not an arena: it is a SegmentOwner (what segments need: a Lifetime, a free-segment
hook) holding one region of the private jemalloc, outside every arena, let go by close() and freed
once no raw view holds it either (_region.pxi).  Each acquire() makes a new Segment over a free
buffer; release() marks that Segment freed, so a stale handle raises ArenaClosedError even after the
same buffer is acquired again.

Thread safety: the pool's state is read and written inside a critical section on the pool (the
GIL on a GIL build, the pool object's own lock on a free-threaded one).  A method takes it once,
does only C inside (no Python object is made, no error raised: the outcome is carried out and
raised after, _pool_errors.pxi), and leaves: a second critical section on the pool inside the
first, or Python code that could take one, suspends the first on a free-threaded build, so another
thread could act in the middle (torn figures), and costs the mutex's slow path.  The calls that
can run Python code (making the Segment object or stats()' mincore vector may start the garbage
collector, and with it finalizers that may switch threads or use this pool) happen before the state
is read.  Segments' accesses of the buffers take no lock: release(), reset() and close() wait for
the accesses under way to end (the accessing-now records of _access.pxi).

Limits: a pool whose region and bookkeeping together exceed the machine's RAM and swap is refused
(MemoryError).  The bookkeeping (a free-stack entry and a state byte per buffer) is allocated with
the pool but written only as buffers are handed out and released (_pool_buffers.pxi), so a pool
costs what is used of it.
"""

cimport cython
from libc.string cimport memset

from arenalib._arena cimport (
    SEG_FREED, TRACE_DOMAIN, PyTraceMalloc_Track, PyTraceMalloc_Untrack, Segment, SegmentOwner,
    count_open_pools,
    count_read, exclusive_begin, exclusive_end, free_begin, free_end, make_segment, parse_align,
    parse_flag, parse_size,
)

cdef extern from "src/dealloc.h":
    void clear_weakrefs_in_dealloc "arenalib_clear_weakrefs_in_dealloc"(object owner) noexcept

import warnings

from arenalib._errors import ArenaClosedError, ArenaError, PoolExhaustedError, UnsupportedOperation

include "_region.pxi"
include "_pool_buffers.pxi"
include "_pool_errors.pxi"


cdef Py_ssize_t _positive(object value, str name) except -1:
    cdef Py_ssize_t n
    try:
        n = parse_size(value, name)
    except ValueError:  # parse_size's message says ">= 0", and 0 is refused here too
        raise ValueError(f"{name} must be >= 1, not {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1, not {value!r}")
    return n


@cython.final
cdef class BufferPool(SegmentOwner):
    """BufferPool(buffer_size, count, *, align=4096, zero=False)\n--\n\n``count`` buffers of ``buffer_size``
    bytes, each aligned to ``align``, in one contiguous region.

    BufferPool(buffer_size, count, *, align=4096, zero=False)

    Buffers are ``stride`` bytes apart (buffer_size rounded up to align), so the whole region can be
    registered with the kernel at once (``region()``) or buffer by buffer (``iovecs()``).
    acquire() hands out a free buffer as a Segment of ``buffer_size`` bytes in O(1) (PoolExhaustedError
    when none is free; try_acquire() returns None instead); release(seg) or seg.free() gives it back in
    O(1).  A released Segment is dead: any use raises ArenaClosedError, even once its buffer is acquired
    again by someone else.

    zero=False (the default, for I/O that overwrites the buffer anyway): a buffer is handed out as the
    previous user left it.  zero=True: a buffer is zero-filled at each acquire.

    Thread-safe: every method may be called from any thread, with or without the GIL.
    close() (or the end of a with-block) lets go of the region; it raises BufferError while a buffer
    export (memoryview ...) of an acquired segment is alive or an io_uring Ring has the buffers
    registered.
    """

    def __cinit__(self, buffer_size, count, *, align=4096, zero=False):
        self._life = &self._lifetime
        cdef bint zeroed = parse_flag(zero, "zero")
        cdef Py_ssize_t size = _positive(buffer_size, "buffer_size")
        cdef Py_ssize_t n = _positive(count, "count")
        cdef Py_ssize_t a = <Py_ssize_t>parse_align(align)
        cdef size_t stride = pool_stride(size, n, <size_t>a)
        cdef size_t total = stride * <size_t>n
        if books_init(&self._books, n, zeroed) != 0:
            raise MemoryError(f"cannot allocate the bookkeeping of {n} buffers "
                              f"({<size_t>n * BOOKKEEPING_PER_BUFFER} bytes)")
        self._buffer_size = size
        self._count = n
        self._stride = stride
        self._align = <size_t>a
        self._zero = zeroed
        self._region = _Region.allocate(total, <size_t>a, zeroed)
        self._base = <char*>self._region.ptr
        # The region is the allocation tracemalloc sees (untracked by close(), as arenas' blocks are).
        self._traced = PyTraceMalloc_Track(TRACE_DOMAIN, <size_t>self._base, total) == 0
        self._lifetime.generation = 1
        self._open = True
        count_open_pools(1)

    cdef bint _is_open(self) noexcept:
        return self._open

    def close(self):
        """Let go of the region (freed once no raw view holds it): every acquired segment is dead from
        now on; idempotent.

        Raises BufferError, changing nothing, while a buffer export (memoryview ...) of an acquired
        segment is alive, or while an io_uring Ring has the buffers registered."""
        cdef Py_ssize_t exports = 0
        cdef Py_ssize_t registrations = 0
        with cython.critical_section(self):
            if self._open:
                exclusive_begin(&self._lifetime)  # accesses under way end first
                exports = count_read(&self._lifetime.exports)
                registrations = self._registrations
                if not exports and not registrations:
                    self._close_now()
                exclusive_end(&self._lifetime)
        refuse_if_pinned("cannot close BufferPool", exports, registrations)

    cdef int _registered(self, int delta) except -1:
        """Count a ring's registration of the region in (+1) or out (-1): close() and reset() refuse
        while one is counted (arenalib._ring).  ArenaClosedError to register a closed pool."""
        cdef bint refused
        with cython.critical_section(self):  # no Python code inside (the error is made after)
            refused = delta > 0 and not self._open
            if not refused:
                self._registrations += delta
        if refused:
            raise_closed()
        return 0

    cdef Py_ssize_t _lend(self, void* lender, lender_take_fn take, bint incremental) except -1:
        """Lend every free buffer to a ring's provided-buffer ring (Ring.provide(), which has counted
        itself in with _registered): each goes to ``take`` now and again whenever a segment the ring
        delivered over it is released, until _unlend().  ``incremental``: the kernel fills a buffer
        in parts (IOU_PBUF_RING_INC), each delivered as a segment of its own.  How many;
        ValueError when the pool is lent already, ArenaClosedError when closed, MemoryError."""
        cdef Py_ssize_t n = -1
        cdef bint is_open
        # Made first (Python's allocator, no Python code), kept for the pool's life.
        cdef PartUse* parts = NULL
        if incremental and self._books.parts == NULL:
            parts = <PartUse*>PyMem_Calloc(<size_t>self._count, sizeof(PartUse))
            if parts == NULL:
                raise MemoryError(f"cannot allocate the books of {self._count} incremental buffers")
        with cython.critical_section(self):  # C only inside
            is_open = self._open
            if parts != NULL and self._books.parts == NULL:
                books_install_parts(&self._books, parts)
                parts = NULL
            if is_open and self._lender == NULL:
                self._lender = lender
                self._lender_take = take
                n = books_lend(&self._books, self._count, lender, take)
        PyMem_Free(parts)  # (another thread's lending made them first)
        if not is_open:
            raise_closed()
        if n < 0:
            raise ValueError("the BufferPool is provided to a Ring already: withdraw() it first "
                             "(a pool lends its buffers to one group at a time)")
        return n

    cdef Py_ssize_t _unlend(self, void* lender) noexcept:
        """End the lending to ``lender``: its buffers not handed out are free again (the ring has
        made sure the kernel picks none any more); segments it delivered come back to the free list."""
        cdef Py_ssize_t n = 0
        with cython.critical_section(self):
            if self._lender == lender:
                self._lender = NULL
                self._lender_take = NULL
                n = books_unlend(&self._books)
        return n

    cdef bint _deliver(self, Segment seg, Py_ssize_t index, Py_ssize_t nbytes, bint more) noexcept:
        """Bind ``seg`` (fresh from make_segment) to the ``nbytes`` the kernel filled of lent buffer
        ``index`` (from its start, or, lent incrementally, after the parts before; ``more``: the
        kernel fills more of it); False, ``seg`` left dead, when that buffer is not lent."""
        cdef Py_ssize_t offset = -1
        with cython.critical_section(self):
            if self._open:
                offset = books_deliver(&self._books, index, nbytes, more, self._buffer_size)
            if offset >= 0:
                seg._ptr = self._base + <size_t>index * self._stride + <size_t>offset
                seg._size = nbytes
                seg._generation = self._lifetime.generation
        return offset >= 0

    cdef void _close_now(self) noexcept:
        """Every segment dead, the region untracked and let go (it goes when no raw view holds it)."""
        self._open = False
        self._lifetime.generation += 1
        if self._traced:
            PyTraceMalloc_Untrack(TRACE_DOMAIN, <size_t>self._base)
            self._traced = False
        self._region = None
        count_open_pools(-1)

    @property
    def closed(self):
        """True once close() was called (or the with-block ended)."""
        with cython.critical_section(self):
            return not self._open

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __reduce__(self):
        raise TypeError("BufferPool owns native memory and cannot be pickled")

    def __dealloc__(self):
        books_free(&self._books)
        if not self._open:
            return
        # As an unclosed file does: give the memory back and say so with a ResourceWarning.
        clear_weakrefs_in_dealloc(self)  # (before any object is made here: a GC may start)
        message = f"unclosed {self!r}"
        self._close_now()
        if warnings is not None:  # None while the interpreter is tearing modules down
            warnings.warn(message, ResourceWarning, stacklevel=2)

    # -- acquire / release -----------------------------------------------------------------------

    def acquire(self):
        """A free buffer as a Segment of ``buffer_size`` bytes; PoolExhaustedError when none is free."""
        return self._acquire(True)

    def try_acquire(self):
        """A free buffer as a Segment of ``buffer_size`` bytes, or None when none is free."""
        return self._acquire(False)

    cdef Segment _acquire(self, bint raise_exhausted):
        # Made first, with no address: this may run the garbage collector and with it any Python code
        # (another thread included), so the state is read only afterwards, with nothing in between.
        cdef Segment seg = make_segment(self, self._buffer_size)
        cdef int outcome
        with cython.critical_section(self):
            outcome = self._take(seg)
        if outcome == TAKEN:
            return seg
        if outcome == POOL_EXHAUSTED and not raise_exhausted:
            return None
        raise_outcome(self, outcome, 0, 0)

    cdef int _take(self, Segment seg) noexcept:
        """Bind ``seg`` to a free buffer (in the pool's critical section)."""
        if not self._open:
            return POOL_CLOSED
        cdef bint dirty
        cdef Py_ssize_t i = books_take(&self._books, self._count, &dirty)
        if i < 0:
            return POOL_EXHAUSTED
        cdef char* ptr = self._base + <size_t>i * self._stride
        if self._zero and dirty:
            memset(ptr, 0, <size_t>self._buffer_size)
        seg._ptr = ptr
        seg._generation = self._lifetime.generation
        return TAKEN

    def release(self, segment, *, bint deferred=False):
        """Give an acquired buffer back; the segment is dead from now on (any use raises
        ArenaClosedError).  ``seg.free()`` does the same.

        Raises, changing nothing: TypeError for a non-Segment; ValueError for a segment of another
        pool or arena, or a slice; ArenaClosedError for a segment already released (or made stale by
        reset() or close()); BufferError while a buffer export of it (memoryview ...) is alive.

        deferred=True: while exports of it are alive, release it when the last one is released
        instead of raising BufferError; until then the segment stays usable (see Segment.free)."""
        if type(segment) is not Segment:
            raise TypeError(f"release() takes a Segment from acquire(), not {type(segment).__name__}")
        cdef Segment seg = <Segment>segment
        if not deferred:
            self._release(seg)
            return
        self._check_releasable(seg)
        seg._check()
        seg._free_when_unexported()

    cdef int _free_segment(self, Segment seg) except -1:
        # Segment.free() of a pool segment: release the buffer to the pool (Segment.free() has
        # already refused slices, dead segments and live exports).
        return self._release(seg)

    cdef int _check_releasable(self, Segment seg) except -1:
        if seg._arena is not self:
            raise ValueError("the segment does not belong to this BufferPool")
        if seg._root is not None:
            raise ValueError("a slice (or readonly() view) cannot be released; release the segment "
                             "acquire() returned")
        return 0

    cdef int _release(self, Segment seg) except -1:
        self._check_releasable(seg)
        cdef Py_ssize_t i = self._index_of(seg)
        cdef Py_ssize_t exports = 0
        cdef int outcome
        with cython.critical_section(self):  # no Python code inside: the errors are made after
            outcome = self._give_back(seg, i, &exports)
        if outcome != RELEASED:
            raise_outcome(self, outcome, exports, i)
        return 0

    cdef int _give_back(self, Segment seg, Py_ssize_t i, Py_ssize_t* exports) noexcept:
        """Put buffer ``i``, ``seg``'s, back on the free stack (in the pool's critical section);
        what was found, changing nothing unless RELEASED."""
        if not self._open:
            return POOL_CLOSED
        if seg._freed == SEG_FREED:
            return SEG_RELEASED_ALREADY
        if seg._generation != self._lifetime.generation:
            return SEG_STALE
        # Accesses of this buffer under way end first; new ones wait, then find it released.
        if not free_begin(&self._lifetime, seg, NULL):
            return SEG_RELEASED_ALREADY
        exports[0] = count_read(&seg._exports)
        if exports[0]:
            free_end(seg, False)
            return SEG_EXPORTED
        # At the buffer's start, or, for a part of an incrementally lent buffer, inside it.
        cdef size_t offset = <size_t>(seg._ptr - (self._base + <size_t>i * self._stride))
        if ((offset and (self._books.parts == NULL or offset > <size_t>self._buffer_size
                         or i >= self._books.touched or self._books.state[i] != DELIVERED))
                or not books_give_back(&self._books, i, self._lender, self._lender_take)):
            free_end(seg, False)
            return SEG_NOT_IN_USE
        free_end(seg, True)
        return RELEASED

    cdef Py_ssize_t _index_of(self, Segment seg) except -1:
        # By the root's address: an empty slice at a buffer's end points at the next buffer.
        cdef char* ptr = seg._owner_segment()._ptr
        cdef size_t offset = <size_t>(ptr - self._base)
        if ptr < self._base or offset >= self._stride * <size_t>self._count:
            raise ValueError("the segment is not in this BufferPool's region")
        return <Py_ssize_t>(offset / self._stride)

    def reset(self):
        """Release every acquired buffer at once: each of their segments is dead from now on.

        Raises BufferError, changing nothing, while a buffer export of a segment is alive or an
        io_uring Ring has the buffers registered (a reset could hand a buffer whose fixed read is
        still under way to a new owner)."""
        cdef Py_ssize_t exports = 0
        cdef Py_ssize_t registrations = 0
        cdef bint is_open
        # One critical section, nothing nested inside: on a free-threaded build a second section
        # on the same object suspends the first (another thread could act in between).
        with cython.critical_section(self):
            is_open = self._open
            if is_open:
                exclusive_begin(&self._lifetime)  # accesses under way end first
                exports = count_read(&self._lifetime.exports)
                registrations = self._registrations
                if not exports and not registrations:
                    self._lifetime.generation += 1
                    books_reset(&self._books)
                exclusive_end(&self._lifetime)
        if not is_open:
            raise_closed()
        refuse_if_pinned("cannot reset BufferPool", exports, registrations)

    def allocate(self, size, *, zero=True, align=None):
        """Not supported: a BufferPool hands out its fixed buffers with acquire()."""
        raise UnsupportedOperation("a BufferPool hands out fixed buffers: use acquire()")

    # -- registration ----------------------------------------------------------------------------

    def index(self, segment):
        """Index of the buffer ``segment`` (or a slice of it) lies in: its io_uring fixed-buffer index
        when the pool is registered with ``iovecs()`` or ``Ring.register_pool()``.  ArenaClosedError for
        a dead segment."""
        if type(segment) is not Segment:
            raise TypeError(f"index() takes a Segment, not {type(segment).__name__}")
        cdef Segment seg = <Segment>segment
        if seg._arena is not self:
            raise ValueError("the segment does not belong to this BufferPool")
        seg._check()
        return self._index_of(seg)

    cdef int _check_open(self) except -1:
        """ArenaClosedError once closed.  Never call it inside the pool's critical section: one
        nested on the same object suspends the outer one on a free-threaded build."""
        cdef bint is_open
        with cython.critical_section(self):
            is_open = self._open
        if not is_open:
            raise_closed()
        return 0

    @property
    def address(self):
        """Address of the region (of buffer 0), as an int."""
        self._check_open()
        return <size_t>self._base

    @property
    def nbytes(self):
        """Size of the region in bytes: ``stride * len(pool)``."""
        return self._stride * <size_t>self._count

    def region(self):
        """The whole region as one ``(address, length)`` pair (to register it as one buffer)."""
        result = (<size_t>self._base, self._stride * <size_t>self._count)
        self._check_open()  # after making the result: that may start a GC that closes the pool
        return result

    def iovecs(self):
        """``[(address, buffer_size), ...]``, one pair per buffer in index order (struct iovec's
        fields): the form io_uring_register_buffers wants, so buffer i is fixed-buffer index i."""
        cdef Py_ssize_t i
        result = [(<size_t>(self._base + <size_t>i * self._stride), self._buffer_size)
                  for i in range(self._count)]
        self._check_open()  # after making the result: that may start a GC that closes the pool
        return result

    def raw_views(self):
        """One writable memoryview per buffer (``buffer_size`` bytes, index order), for clients that
        accept only memoryviews and keep them for good, such as liburing's ``Iovec``.

        The views are not Segments and pin nothing but the region: they do not check which buffers
        are acquired, are not counted as exports, and do not block release(), reset() or close().
        They keep the region's memory allocated for as long as they live, so a late write through
        one never lands in freed memory; but once the buffer is released and acquired again, it
        lands in the buffer's next owner.  A client that hands one to the kernel must keep that
        buffer's Segment acquired (not released, its pool not reset) from the request's submission
        until its completion is reaped, cancelled requests included, and read the data through that
        Segment.  arenalib.Ring refuses raw views (TypeError): give it the Segment."""
        cdef _Region region
        with cython.critical_section(self):
            region = self._region  # held here: a GC in the loop below may close the pool
        if region is None:
            raise_closed()
        return region_views(region, self._base, self._stride, self._buffer_size, self._count)

    # -- figures ---------------------------------------------------------------------------------

    def __len__(self):
        return self._count

    @property
    def buffer_size(self):
        """Size of each buffer (and of each acquired Segment) in bytes."""
        return self._buffer_size

    @property
    def stride(self):
        """Distance in bytes between the starts of two neighbouring buffers."""
        return self._stride

    @property
    def align(self):
        """Alignment of every buffer's address."""
        return self._align

    @property
    def zero(self):
        """True when acquire() hands out zero-filled buffers."""
        return bool(self._zero)

    @property
    def available(self):
        """Number of free buffers (0 once closed)."""
        cdef Py_ssize_t n
        with cython.critical_section(self):
            n = books_available(&self._books, self._count) if self._open else 0
        return n

    def stats(self):
        """Figures of the pool and its region: live_bytes (the region's size; 0 once closed),
        resident (bytes of the region in RAM now), exports (live buffer exports of its segments),
        closed, buffers, buffer_size, in_use, available, acquisitions (acquire()/try_acquire()
        calls served), high_water (most buffers in use at once), exhausted (such calls that found
        no free buffer) and lent (buffers lent to a Ring by Ring.provide(), counted in in_use,
        those a completion delivered included until their segments are released, even once the
        lending ended).
        The figures are of one moment (in_use + available == buffers while open),
        read in one critical section with nothing else inside."""
        cdef size_t nbytes = self._stride * <size_t>self._count
        # Made first: this may start a GC that closes the pool, which the reads below must see.
        cdef bytearray vector = bytearray(region_pages(self._base, nbytes))
        cdef unsigned char* flags = vector
        cdef bint is_open
        cdef Py_ssize_t in_use = 0, available = 0, exports, high_water, exhausted, lent
        cdef size_t acquisitions, resident = 0
        with cython.critical_section(self):  # C only inside: nothing can suspend the section
            is_open = self._open
            if is_open:
                in_use = self._books.in_use
                available = books_available(&self._books, self._count)
                resident = region_resident(self._base, nbytes, flags)
            exports = count_read(&self._lifetime.exports)
            acquisitions = self._books.acquisitions
            high_water = self._books.high_water
            exhausted = self._books.exhausted
            lent = self._books.lent
        return {"live_bytes": nbytes if is_open else 0,
                "resident": resident, "exports": exports, "closed": not is_open,
                "buffers": self._count, "buffer_size": self._buffer_size, "in_use": in_use,
                "available": available, "acquisitions": acquisitions, "high_water": high_water,
                "exhausted": exhausted, "lent": lent}

    def __repr__(self):
        if not self._open:
            return "<arenalib.BufferPool closed>"
        return (f"<arenalib.BufferPool {self._books.in_use}/{self._count} buffers of {self._buffer_size} "
                f"bytes in use, at {<size_t>self._base:#x}>")
