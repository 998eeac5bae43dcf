# cython: language_level=3
"""Arenas of native memory over jemalloc's explicit arenas and thread caches.

ArenaBase holds what all arenas share (the pooled jemalloc slot, accounting, the lifecycle);
Arena, ConfinedArena and SlicingArena differ in who may use them and how they carve memory.
Segment (in _segment.pxi) is the user's handle on a block of that memory.
"""

cimport cython
from cpython.exc cimport PyErr_Clear
from cpython.long cimport PyLong_AsSsize_t
from cpython.mem cimport PyMem_RawFree, PyMem_RawRealloc
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport uint64_t

from arenalib._jemalloc cimport (
    JEMALLOC_VERSION, MALLOCX_LG_ALIGN, MALLOCX_ZERO, je_dallocx, je_mallctl, je_mallocx,
)

import warnings

from arenalib._errors import ArenaClosedError, UnsupportedOperation, WrongThreadError

include "_slots.pxi"
include "_segment.pxi"

cdef extern from *:
    int __builtin_ctzll(unsigned long long) nogil

# Largest alignment accepted: huge pages (2 MiB) and well beyond, while still far below what would
# make jemalloc's size arithmetic overflow.
cdef Py_ssize_t MAX_ALIGN = 1 << 30
cdef Py_ssize_t DEFAULT_CHUNK_SIZE = 256 * 1024
cdef size_t SLICE_DEFAULT_ALIGN = 16   # malloc's guarantee on x86-64 (max_align_t)
cdef size_t PAGE = 4096

# Debug mode: arenas record where they were created, for the ResourceWarning of an unclosed arena.
cdef bint _debug = False


def set_debug(bint enabled):
    """Record each arena's creation stack so an unclosed arena's ResourceWarning names it."""
    global _debug
    _debug = enabled


def jemalloc_version():
    """Version of the private jemalloc linked into arenalib."""
    return JEMALLOC_VERSION.decode()


cdef inline Py_ssize_t _parse_size(object size, str name) except -1:
    cdef Py_ssize_t n
    if type(size) is int:  # the common case, without the cost of a try block
        n = PyLong_AsSsize_t(size)
        if n >= 0:
            return n
        PyErr_Clear()
    return _parse_size_slow(size, name)


cdef Py_ssize_t _parse_size_slow(object size, str name) except -1:
    cdef Py_ssize_t n
    try:
        n = size
    except OverflowError:
        if size < 0:
            raise ValueError(f"{name} must be >= 0, not {size!r}") from None
        raise MemoryError(f"cannot allocate {size!r} bytes: larger than any address space") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, not {n}")
    return n


cdef size_t _parse_align(object align) except 0:
    """``align`` as a power of two; 1 when it is None (no constraint beyond malloc's)."""
    if align is None:
        return 1
    cdef Py_ssize_t n
    try:
        n = align
    except OverflowError:
        n = -1
    if n <= 0 or n & (n - 1) or n > MAX_ALIGN:
        raise ValueError(f"align must be a power of two from 1 to {MAX_ALIGN}, not {align!r}")
    return <size_t>n


cdef inline int _lg(size_t power_of_two) noexcept nogil:
    return __builtin_ctzll(power_of_two)


cdef Py_ssize_t _parse_max_bytes(object max_bytes) except -2:
    if max_bytes is None:
        return -1
    try:
        return _parse_size(max_bytes, "max_bytes")
    except MemoryError:
        return -1  # a limit beyond any address space is no limit


@cython.no_gc  # holds no object that could lead back to it: no cycles, no GC tracking cost
cdef class ArenaBase:
    """What every arena shares: allocate(), reset(), purge(), close(), stats(), the with-block.

    Not instantiable; use Arena, ConfinedArena or SlicingArena."""

    def __cinit__(self):
        # A no-argument __cinit__ is called whatever the constructor's arguments are.
        if type(self) is ArenaBase:
            raise TypeError("ArenaBase is abstract; use Arena, ConfinedArena or SlicingArena")

    cdef int _open(self, object max_bytes) except -1:
        """Take a jemalloc slot from the pool; called once by each concrete class's __cinit__."""
        self._generation = 1
        self._max_bytes = _parse_max_bytes(max_bytes)
        _slot_acquire(&self._slot)
        self._has_slot = True
        self._mallocx_flags = _slot_flags(&self._slot)
        if _debug:
            import traceback
            stack = traceback.format_stack()
            self._created_at = "".join(stack[:len(stack) - 1])
        return 0

    # -- checks ----------------------------------------------------------------------------------

    cdef int _check_usable(self) except -1:
        if not self._has_slot:
            raise ArenaClosedError(f"{type(self).__name__} is closed")
        if self._owner and self._owner != PyThread_get_thread_ident():
            raise _wrong_thread_error(self)
        return 0

    cdef int _refuse_if_exported(self, str action) except -1:
        if self._exports:
            raise BufferError(
                f"cannot {action} {type(self).__name__}: {self._exports} buffer export(s) of its "
                "segments (memoryview, NumPy array ...) are alive; release them first")
        return 0

    cdef int _reserve(self, Py_ssize_t size) except -1:
        if self._max_bytes >= 0 and size > self._max_bytes - self._live_bytes:
            raise MemoryError(
                f"allocating {size} bytes would exceed max_bytes={self._max_bytes} of "
                f"{type(self).__name__} ({self._live_bytes} bytes in use)")
        return 0

    cdef void _account(self, Py_ssize_t size) noexcept:
        self._live_bytes += size
        self._live_segments += 1
        self._allocated_total += <size_t>size
        if self._live_bytes > self._peak_bytes:
            self._peak_bytes = self._live_bytes

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, size, *, bint zero=True, align=None):
        """A new Segment of ``size`` bytes.

        zero: True for zero-filled memory (no memset where jemalloc knows the pages are zero),
        False for memory with whatever it held.  align: a power of two the address is a multiple
        of (up to 1 GiB).  Raises MemoryError when the memory cannot be had or max_bytes would be
        exceeded."""
        return self._allocate(_parse_size(size, "size"), zero, _parse_align(align))

    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align):
        self._check_usable()
        self._reserve(size)
        cdef int flags = self._mallocx_flags
        if zero:
            flags |= MALLOCX_ZERO
        if align > 1:
            flags |= MALLOCX_LG_ALIGN(_lg(align))
        # jemalloc's mallocx does not take size 0: a 0-byte segment still gets a distinct address.
        cdef char* ptr = <char*>je_mallocx(<size_t>size if size else 1, flags)
        if ptr == NULL:
            raise MemoryError(f"cannot allocate {size} bytes (align={align})")
        self._account(size)
        return make_segment(self, ptr, size)

    cdef int _free_segment(self, Segment seg) except -1:
        je_dallocx(seg._ptr, self._mallocx_flags)
        seg._freed = True
        self._live_bytes -= seg._size
        self._live_segments -= 1
        return 0

    # -- lifecycle -------------------------------------------------------------------------------

    def reset(self):
        """Free every segment at once and keep the arena open; its pages stay warm for reuse.

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        self._check_usable()
        self._refuse_if_exported("reset")
        self._generation += 1
        _slot_reset(&self._slot)
        self._live_bytes = 0
        self._live_segments = 0

    def purge(self):
        """Hand the arena's unused dirty pages back to the OS now (live segments stay)."""
        self._check_usable()
        _slot_purge(&self._slot)

    def close(self):
        """Free every segment and give the memory back; idempotent.

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        self._close()

    cdef int _close(self) except -1:
        if not self._has_slot:
            return 0
        self._check_usable()
        self._refuse_if_exported("close")
        self._release_memory()
        return 0

    cdef void _release_memory(self) noexcept:
        if not self._has_slot:
            return
        self._generation += 1
        self._has_slot = False
        # The live segments are not freed one by one: their bytes become the slot's stale garbage,
        # dropped in bulk by a jemalloc arena reset (see _slots.pxi).
        _slot_release(&self._slot, <size_t>self._live_bytes, self._allocated_total)
        self._live_bytes = 0
        self._live_segments = 0

    @property
    def closed(self):
        """True once close() was called (or the with-block ended)."""
        return not self._has_slot

    @property
    def max_bytes(self):
        """The limit on live bytes given at creation, or None."""
        return None if self._max_bytes < 0 else self._max_bytes

    def __enter__(self):
        self._check_usable()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._close()
        return False

    def stats(self):
        """Accounting of this arena and jemalloc's figures for the arena behind it.

        live_bytes/live_segments/peak_bytes count the sizes asked for; resident, mapped, active and
        dirty are jemalloc's byte counts for the underlying jemalloc arena (0 once closed)."""
        result = {
            "live_bytes": self._live_bytes,
            "live_segments": self._live_segments,
            "peak_bytes": self._peak_bytes,
            "allocated_total": self._allocated_total,
            "exports": self._exports,
            "max_bytes": self.max_bytes,
            "closed": not self._has_slot,
        }
        result.update(_jemalloc_arena_stats(self._slot.arena_index if self._has_slot else -1))
        return result

    def __repr__(self):
        if not self._has_slot:
            return f"<arenalib.{type(self).__name__} closed>"
        state = f"{self._live_segments} segments, {self._live_bytes} bytes"
        return f"<arenalib.{type(self).__name__} {state}>"

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} owns native memory and cannot be pickled")

    def __del__(self):
        # As an unclosed file does: free the memory and say so with a ResourceWarning.
        if not self._has_slot:
            return
        message = f"unclosed {self!r}"
        if self._created_at is not None:
            message += f", created at:\n{self._created_at}"
        self._release_memory()
        if warnings is not None:  # None while the interpreter is tearing modules down
            warnings.warn(message, ResourceWarning, stacklevel=2, source=self)

    def __dealloc__(self):
        self._release_memory()


cdef dict _jemalloc_arena_stats(long arena_index):
    cdef uint64_t epoch = 1
    cdef size_t value = 0, page = 0, size = sizeof(size_t)
    cdef dict figures = {"resident": 0, "mapped": 0, "active": 0, "dirty": 0}
    if arena_index < 0:
        return figures
    # Statistics are snapshots: advancing the epoch refreshes them.
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    je_mallctl(b"arenas.page", &page, &size, NULL, 0)
    for key, name, pages in (("resident", "resident", False), ("mapped", "mapped", False),
                             ("active", "pactive", True), ("dirty", "pdirty", True)):
        size = sizeof(size_t)
        if je_mallctl(f"stats.arenas.{arena_index}.{name}".encode(), &value, &size, NULL, 0) == 0:
            figures[key] = value * page if pages else value
    return figures


@cython.final
@cython.freelist(8)
cdef class Arena(ArenaBase):
    """An arena any thread may allocate from, free into and close.

    Arena(*, max_bytes=None).  Every segment's memory is freed at once by close() (or the end of a
    with-block); seg.free() gives one segment back early."""

    def __cinit__(self, *, max_bytes=None):
        self._open(max_bytes)


@cython.final
@cython.freelist(8)
cdef class ConfinedArena(ArenaBase):
    """An arena that only its creating thread may use, nor its segments (WrongThreadError).

    ConfinedArena(*, max_bytes=None).  Confinement is what lets it skip all locking."""

    def __cinit__(self, *, max_bytes=None):
        self._open(max_bytes)
        self._owner = PyThread_get_thread_ident()

    @property
    def owner_thread(self):
        """threading.get_ident() of the thread that owns this arena."""
        return self._owner


@cython.final
@cython.freelist(8)
cdef class SlicingArena(ArenaBase):
    """Bump-pointer allocation inside chunks taken from jemalloc (Panama's slicingAllocator).

    SlicingArena(*, chunk_size=None, max_bytes=None).  No per-segment free: reset() invalidates every
    segment and keeps the chunks for reuse; close() gives them back.  Requests larger than a chunk
    get a chunk of their own."""

    def __cinit__(self, *, chunk_size=None, max_bytes=None):
        cdef Py_ssize_t size = DEFAULT_CHUNK_SIZE
        if chunk_size is not None:
            size = _parse_size(chunk_size, "chunk_size")
            if size < PAGE:
                raise ValueError(f"chunk_size must be at least {PAGE}, not {chunk_size!r}")
        self._chunk_size = size
        self._open(max_bytes)

    @property
    def chunk_size(self):
        """Size of the chunks carved by allocate()."""
        return self._chunk_size

    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align):
        self._check_usable()
        self._reserve(size)
        if align < SLICE_DEFAULT_ALIGN:
            align = SLICE_DEFAULT_ALIGN
        cdef size_t base, start
        if self._nchunks:
            base = <size_t>self._chunks[self._current]
            start = (base + self._offset + align - 1) & ~(align - 1)
            if start + <size_t>size > base + self._chunk_sizes[self._current]:
                self._next_chunk(<size_t>size, align)
                base = <size_t>self._chunks[self._current]
                start = (base + align - 1) & ~(align - 1)
        else:
            self._next_chunk(<size_t>size, align)
            base = <size_t>self._chunks[self._current]
            start = (base + align - 1) & ~(align - 1)
        cdef size_t begin = start - base, end = begin + <size_t>size
        cdef size_t zero_from = self._chunk_zero_from[self._current]
        if zero and begin < zero_from:
            # Only bytes handed out before (since the chunk came from jemalloc) can be dirty.
            memset(<char*>start, 0, (end if end < zero_from else zero_from) - begin)
        if end > zero_from:
            self._chunk_zero_from[self._current] = end
        self._offset = end
        self._account(size)
        return make_segment(self, <char*>start, size)

    cdef int _next_chunk(self, size_t size, size_t align) except -1:
        """Make self._current a chunk that can hold ``size`` bytes at ``align`` from its start."""
        cdef Py_ssize_t i = self._current + 1 if self._nchunks else 0
        while i < self._nchunks:  # chunks kept warm by reset()
            if (<size_t>self._chunks[i] & (align - 1)) == 0 and self._chunk_sizes[i] >= size:
                self._current = i
                self._offset = 0
                return 0
            i += 1
        cdef size_t chunk_size = <size_t>self._chunk_size
        if size > chunk_size:
            chunk_size = (size + PAGE - 1) & ~(PAGE - 1)
        cdef size_t chunk_align = align if align > PAGE else PAGE
        cdef Py_ssize_t capacity
        if self._nchunks == self._chunks_capacity:
            capacity = self._chunks_capacity * 2 + 4
            if not (_grow(<void**>&self._chunks, capacity * sizeof(char*))
                    and _grow(<void**>&self._chunk_sizes, capacity * sizeof(size_t))
                    and _grow(<void**>&self._chunk_zero_from, capacity * sizeof(size_t))):
                raise MemoryError("cannot grow SlicingArena's chunk table")
            self._chunks_capacity = capacity
        # Chunks come zeroed (free of cost for fresh pages), so zero=True segments carved from
        # never-used chunk space need no memset.
        cdef char* chunk = <char*>je_mallocx(
            chunk_size, self._mallocx_flags | MALLOCX_ZERO | MALLOCX_LG_ALIGN(_lg(chunk_align)))
        if chunk == NULL:
            raise MemoryError(f"cannot allocate a chunk of {chunk_size} bytes")
        self._chunks[self._nchunks] = chunk
        self._chunk_sizes[self._nchunks] = chunk_size
        self._chunk_zero_from[self._nchunks] = 0
        self._current = self._nchunks
        self._nchunks += 1
        self._offset = 0
        self._chunk_bytes += chunk_size
        return 0

    cdef int _free_segment(self, Segment seg) except -1:
        raise UnsupportedOperation(
            "SlicingArena segments cannot be freed one by one; use reset() or close()")

    def reset(self):
        """Invalidate every segment and start carving again from the first chunk (chunks are kept).

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        self._check_usable()
        self._refuse_if_exported("reset")
        self._generation += 1
        self._current = 0
        self._offset = 0
        self._live_bytes = 0
        self._live_segments = 0

    def purge(self):
        """Give back the chunks not in use (those past the current one) and purge dirty pages."""
        self._check_usable()
        cdef Py_ssize_t i
        for i in range(self._current + 1, self._nchunks):
            je_dallocx(self._chunks[i], self._mallocx_flags)
            self._chunk_bytes -= self._chunk_sizes[i]
        if self._nchunks:
            self._nchunks = self._current + 1
        _slot_purge(&self._slot)

    cdef void _release_memory(self) noexcept:
        if not self._has_slot:
            return
        # The chunks are the slot's stale garbage now, dropped by the next bulk reset.
        self._live_bytes = <Py_ssize_t>self._chunk_bytes
        self._chunk_bytes = 0
        self._nchunks = 0
        ArenaBase._release_memory(self)

    def stats(self):
        """As ArenaBase.stats(), plus the chunks held."""
        result = ArenaBase.stats(self)
        result["chunks"] = self._nchunks
        result["chunk_bytes"] = self._chunk_bytes
        return result

    def __dealloc__(self):
        PyMem_RawFree(self._chunks)
        PyMem_RawFree(self._chunk_sizes)
        PyMem_RawFree(self._chunk_zero_from)


cdef bint _grow(void** array, size_t nbytes) noexcept:
    cdef void* grown = PyMem_RawRealloc(array[0], nbytes)
    if grown == NULL:
        return False
    array[0] = grown
    return True
