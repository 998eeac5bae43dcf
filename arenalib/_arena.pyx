# cython: language_level=3
"""Arenas of native memory over jemalloc's explicit arenas and thread caches.

ArenaBase holds what all arenas share (the pooled jemalloc slot in an ArenaCore, accounting, the
lifecycle); Arena, ConfinedArena and SlicingArena differ in who may use them and how they carve
memory (the nogil rules live in _core.pxi).  Segment (_segment.pxi) is the user's handle on a block.
"""

cimport cython
from cpython.exc cimport PyErr_Clear
from cpython.number cimport PyNumber_Index
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

import warnings

from arenalib._errors import ArenaClosedError, ArenaError, UnsupportedOperation, WrongThreadError

from arenalib._jemalloc cimport JEMALLOC_VERSION, je_mallctl, je_mallctlbymib, je_mallctlnametomib

cdef extern from "Python.h":
    int PyType_HasFeature(type t, unsigned long feature)
    unsigned long Py_TPFLAGS_HEAPTYPE
    # Declared without an exception value: the fast paths inspect the result itself.
    Py_ssize_t _long_as_ssize "PyLong_AsSsize_t"(object value) noexcept


include "_slots.pxi"
include "_core.pxi"
include "_segment.pxi"

# Debug mode: arenas record where they were created, for the ResourceWarning of an unclosed arena.
cdef bint _debug = False

# tracemalloc domain of the memory that arenalib's Python API hands out ("ARNA"): filter a snapshot
# with tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN).
TRACEMALLOC_DOMAIN = TRACE_DOMAIN

_ERRORS = {
    ARENA_ENOMEM: (MemoryError, "out of memory"),
    ARENA_ELIMIT: (MemoryError, "the arena's max_bytes would be exceeded"),
    ARENA_ECLOSED: (ArenaClosedError, "the arena is closed"),
    ARENA_EWRONGTHREAD: (WrongThreadError, "a confined arena was used from another thread"),
    ARENA_EINVAL: (ValueError, "align must be a power of two from 1 to 1 GiB"),
    ARENA_EEXPORTED: (BufferError, "buffer exports of the arena's segments are alive"),
    ARENA_EBUSY: (ArenaError, "the SlicingArena is in use by another thread"),
    ARENA_EUNSUPPORTED: (UnsupportedOperation, "not supported by this kind of arena"),
}


def set_debug(bint enabled):
    """Record each arena's creation stack so an unclosed arena's ResourceWarning names it."""
    global _debug
    _debug = enabled


def jemalloc_version():
    """Version of the private jemalloc linked into arenalib."""
    return JEMALLOC_VERSION.decode()


def live_objects():
    """Counts of open arenas, Segment objects and buffer exports alive now (for leak checks)."""
    return {"open_arenas": _inline_state.arenas_opened - _inline_state.arenas_closed,
            "segments": _live_segment_objects, "exports": _live_exports}


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


@cython.freelist(16)
@cython.no_gc  # holds no object that could lead back to it: no cycles, no GC tracking cost
cdef class ArenaBase:
    """What every arena shares: allocate(), reset(), purge(), close(), stats(), the with-block.

    Not instantiable; use Arena, ConfinedArena or SlicingArena."""

    def __cinit__(self):
        # A no-argument __cinit__ is called whatever the constructor's arguments are.  Python
        # subclasses (heap types) would get an arena they cannot open: refuse them too.
        if type(self) is ArenaBase or PyType_HasFeature(type(self), Py_TPFLAGS_HEAPTYPE):
            raise TypeError(f"{type(self).__name__}: ArenaBase cannot be instantiated or subclassed"
                            " in Python; use Arena, ConfinedArena or SlicingArena")

    cdef int _open(self, int kind, object max_bytes) except -1:
        """Open the core; called once by each concrete class's __cinit__."""
        arena_open(&self._core, kind, _parse_max_bytes(max_bytes), self._core.chunk_size)
        if _debug:
            import traceback
            # Called from C: the innermost Python frame is the one that made the arena.
            self._created_at = "".join(traceback.format_stack())
        return 0

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, size, *, bint zero=True, align=None):
        """A new Segment of ``size`` bytes.

        zero: True for zero-filled memory (no memset where jemalloc knows the pages are zero),
        False for memory with whatever it held.  align: a power of two the address is a multiple
        of (up to 1 GiB).  Raises MemoryError when the memory cannot be had or max_bytes would be
        exceeded."""
        return self._allocate(_parse_size(size, "size"), zero, parse_align(align))

    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align):
        # Objects first (each may start a GC, whose finalizers may reset or close this arena),
        # then the memory, then the segment bound to it with nothing in between that calls back.
        # Untracking address 0 tells whether tracemalloc is tracing (-2 when it is not).
        if self._traced is None and PyTraceMalloc_Untrack(TRACE_DOMAIN, 0) == 0:
            self._traced = set()
        cdef Segment seg = make_segment(self, size)
        cdef void* ptr
        cdef int err = arena_allocate(&self._core, <size_t>size, align, zero, &ptr)
        if err:
            self._raise(err, f"cannot allocate {size} bytes (align={align})")
        if self._core.kind == ARENA_KIND_SHARED:
            self._update_shared_peak()
        if self._traced is not None and PyTraceMalloc_Track(TRACE_DOMAIN, <size_t>ptr, <size_t>size) == 0:
            self._traced.add(<size_t>ptr)
        seg._ptr = <char*>ptr
        seg._generation = self._core.generation
        return seg

    cdef void _update_shared_peak(self) noexcept:
        # Walked without the lock: nodes are only freed by close(), which needs the GIL we hold,
        # and a node a nogil thread is adding right now is missed at worst.
        cdef Py_ssize_t live = 0
        cdef ThreadCache* tc = self._core.slot.threads
        while tc != NULL:
            live += tc.live_bytes
            tc = tc.next
        if live > self._core.peak_bytes:
            self._core.peak_bytes = live

    cdef int _free_segment(self, Segment seg) except -1:
        cdef int err = arena_free(&self._core, seg._ptr, <size_t>seg._size)
        if err:
            self._raise(err, "cannot free this segment")
        seg._freed = True
        if self._traced is not None:
            PyTraceMalloc_Untrack(TRACE_DOMAIN, <size_t>seg._ptr)
            self._traced.discard(<size_t>seg._ptr)
        return 0

    cdef int _raise(self, int code, str context) except -1:
        """Raise the exception for ``code`` with a message that names this arena."""
        name = type(self).__name__
        if code == ARENA_ECLOSED:
            raise ArenaClosedError(f"{name} is closed")
        if code == ARENA_EWRONGTHREAD:
            raise _wrong_thread_error(self)
        if code == ARENA_ELIMIT:
            raise MemoryError(f"{context}: max_bytes={self._core.max_bytes} of {name} would be "
                              f"exceeded ({self._live_bytes()} bytes in use)")
        if code == ARENA_EEXPORTED:
            raise BufferError(
                f"{context}: {self._core.exports} buffer export(s) of its segments (memoryview, "
                "NumPy array ...) are alive; release them first")
        if code == ARENA_EUNSUPPORTED and self._core.kind == ARENA_KIND_SLICING:
            raise UnsupportedOperation(
                "SlicingArena segments cannot be freed one by one; use reset() or close()")
        if code == ARENA_EUNSUPPORTED and self._core.kind == ARENA_KIND_POOL:
            raise UnsupportedOperation(f"{context}: a BufferPool hands out fixed buffers: use acquire()")
        exc_type, message = _ERRORS[code]
        raise exc_type(f"{context}: {message}")

    cdef Py_ssize_t _live_bytes(self) noexcept:
        cdef Py_ssize_t live, segments
        cdef size_t total
        if self._core.kind == ARENA_KIND_SHARED and self._core.open:
            _shared_totals(&self._core, &live, &segments, &total)
            return live
        return self._core.live_bytes

    # -- lifecycle -------------------------------------------------------------------------------

    def reset(self):
        """Free every segment at once and keep the arena open (its pages stay warm for reuse).

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        cdef int err = arena_reset(&self._core)
        if err:
            self._raise(err, f"cannot reset {type(self).__name__}")
        self._untrack_all()

    def purge(self):
        """Hand the arena's unused dirty pages back to the OS now (live segments stay)."""
        self._check_usable()
        _slot_purge(self._core.slot)

    def close(self):
        """Free every segment and give the memory back; idempotent.

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        self._close()

    cdef int _close(self) except -1:
        if not self._core.open:
            return 0
        self._check_usable()
        if self._core.exports:
            self._raise(ARENA_EEXPORTED, f"cannot close {type(self).__name__}")
        self._release_memory()
        return 0

    cdef int _check_usable(self) except -1:
        if not self._core.open:
            raise ArenaClosedError(f"{type(self).__name__} is closed")
        if self._core.owner and self._core.owner != thread_ident():
            raise _wrong_thread_error(self)
        return 0

    cdef void _release_memory(self) noexcept:
        _core_close(&self._core)
        self._untrack_all()

    cdef void _untrack_all(self) noexcept:
        """Tell tracemalloc that every traced block of the arena is gone."""
        if self._traced is None:
            return
        for address in self._traced:
            PyTraceMalloc_Untrack(TRACE_DOMAIN, <size_t>address)
        self._traced = None

    @property
    def closed(self):
        """True once close() was called (or the with-block ended)."""
        return not self._core.open

    @property
    def max_bytes(self):
        """The limit on live bytes given at creation, or None."""
        return None if self._core.max_bytes < 0 else self._core.max_bytes

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
        cdef ArenaCore* core = &self._core
        cdef Py_ssize_t live = 0, segments = 0, peak
        cdef size_t total
        cdef size_t figures[4]
        cdef bint is_open
        cdef int i
        result = {}  # made first: the GC it may start can close the arena, which the reads must see
        is_open = core.open
        peak = core.peak_bytes
        total = core.allocated_total
        if core.kind == ARENA_KIND_SHARED and is_open:
            _shared_totals(core, &live, &segments, &total)
        elif is_open:  # a closed core's live counts are stale (a scope's close skips them)
            live = core.live_bytes
            segments = core.live_segments
            if core.kind == ARENA_KIND_SLICING:  # not settled yet (see slicing_settle)
                peak = max(peak, live)
                total += <size_t>live
        _jemalloc_arena_figures(core, figures)
        result["live_bytes"] = live
        result["live_segments"] = segments
        result["peak_bytes"] = peak
        result["allocated_total"] = total
        result["exports"] = core.exports
        result["max_bytes"] = None if core.max_bytes < 0 else core.max_bytes
        result["closed"] = not is_open
        for i in range(4):
            result[_ARENA_FIGURES[i][0]] = figures[i]
        return result

    def __repr__(self):
        name = type(self).__name__
        if not self._core.open:
            return f"<arenalib.{name} closed>"
        # The arena's own counters: jemalloc's statistics cost milliseconds once arenas are many.
        cdef Py_ssize_t live = self._core.live_bytes, segments = self._core.live_segments
        cdef size_t total
        if self._core.kind == ARENA_KIND_SHARED:
            _shared_totals(&self._core, &live, &segments, &total)
        return f"<arenalib.{name} {segments} segments, {live} bytes>"

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} owns native memory and cannot be pickled")

    def __dealloc__(self):
        # As an unclosed file does: free the memory and say so with a ResourceWarning.  Done here
        # rather than in __del__: a finalizer would cost every arena ~10 ns at deallocation.
        if not self._core.open:
            return
        message = f"unclosed {self!r}"
        if self._created_at is not None:
            message += f", created at:\n{self._created_at}"
        # Not the virtual _release_memory(): a subclass's own fields are already torn down here.
        _core_close(&self._core)
        self._untrack_all()
        if warnings is not None:  # None while the interpreter is tearing modules down
            warnings.warn(message, ResourceWarning, stacklevel=2)


# jemalloc's per-arena figures that stats() reports: (key, mallctl name, counted in pages).
_ARENA_FIGURES = (
    ("resident", b"stats.arenas.0.resident", False),
    ("mapped", b"stats.arenas.0.mapped", False),
    ("active", b"stats.arenas.0.pactive", True),
    ("dirty", b"stats.arenas.0.pdirty", True),
)
cdef size_t _mib_figures[4][4]
cdef size_t _mib_figures_len[4]
cdef bint _figure_in_pages[4]
cdef size_t _page_size = 0


cdef int _init_figure_mibs() except -1:
    global _page_size
    cdef size_t size = sizeof(size_t)
    cdef int i
    for i, (_, name, pages) in enumerate(_ARENA_FIGURES):
        _figure_in_pages[i] = pages
        _mib_figures_len[i] = 4
        if je_mallctlnametomib(name, _mib_figures[i], &_mib_figures_len[i]):
            raise ImportError(f"arenalib: the private jemalloc does not know {name.decode()}")
    je_mallctl(b"arenas.page", &_page_size, &size, NULL, 0)
    return 0


_init_figure_mibs()


cdef void _jemalloc_arena_figures(ArenaCore* core, size_t* figures) noexcept:
    """jemalloc's figures (_ARENA_FIGURES, in bytes) for the arena behind ``core``; 0 once closed."""
    cdef uint64_t epoch = 1
    cdef size_t mib[4]
    cdef size_t size
    cdef int i
    for i in range(4):
        figures[i] = 0
    if not core.open:
        return
    # Statistics are snapshots: advancing the epoch refreshes them.
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    for i in range(4):
        memcpy(mib, _mib_figures[i], _mib_figures_len[i] * sizeof(size_t))
        mib[2] = core.slot.arena_index
        size = sizeof(size_t)
        if je_mallctlbymib(mib, _mib_figures_len[i], &figures[i], &size, NULL, 0):
            figures[i] = 0
        elif _figure_in_pages[i]:
            figures[i] *= _page_size


# The constructors take keyword arguments only; a positional one is caught by this default (cheaper
# than *args) to name the class and its keywords in the error.
cdef object _NOT_GIVEN = object()


cdef int _no_positional(ArenaBase arena, str keywords) except -1:
    name = type(arena).__name__
    raise TypeError(f"{name}() takes keyword arguments only: {name}({keywords}...)")


@cython.final
cdef class Arena(ArenaBase):
    """An arena any thread may allocate from, free into and close.

    Arena(*, max_bytes=None).  Every segment's memory is freed at once by close() (or the end of a
    with-block); seg.free() gives one segment back early.  Each thread allocates through its own
    jemalloc thread cache, so threads do not contend on a lock."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "max_bytes=")
        self._open(ARENA_KIND_SHARED, max_bytes)


@cython.final
cdef class ConfinedArena(ArenaBase):
    """An arena that only its creating thread may use, nor its segments (WrongThreadError).

    ConfinedArena(*, max_bytes=None).  Confinement is what lets it skip all locking."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "max_bytes=")
        self._open(ARENA_KIND_CONFINED, max_bytes)

    @property
    def owner_thread(self):
        """threading.get_ident() of the thread that owns this arena."""
        return self._core.owner


@cython.final
cdef class SlicingArena(ArenaBase):
    """Bump-pointer allocation inside chunks taken from jemalloc (Panama's slicingAllocator).

    SlicingArena(*, chunk_size=None, max_bytes=None).  No per-segment free: reset() invalidates every
    segment and keeps the chunks for reuse; close() gives them back.  Requests larger than a chunk
    get a chunk of their own.  Any thread may use it; the thread that used it last carves without
    atomic instructions, and another thread taking it over pays a few microseconds."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, chunk_size=None, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "chunk_size=, max_bytes=")
        cdef Py_ssize_t size = <Py_ssize_t>DEFAULT_CHUNK_SIZE
        if chunk_size is not None:
            size = _parse_size(chunk_size, "chunk_size")
            if <size_t>size < PAGE:
                raise ValueError(f"chunk_size must be at least {PAGE}, not {chunk_size!r}")
        self._core.chunk_size = <size_t>size
        self._open(ARENA_KIND_SLICING, max_bytes)

    @property
    def chunk_size(self):
        """Size of the chunks carved by allocate()."""
        return self._core.chunk_size

    def purge(self):
        """Give back the chunks not in use (those past the current one) and purge dirty pages."""
        self._check_usable()
        if _slicing_lock(&self._core):
            self._raise(ARENA_EBUSY, "cannot purge")
        _slicing_free_chunks(&self._core, self._core.current + 1 if self._core.nchunks else 0)
        _slicing_unlock(&self._core, True)
        _slot_purge(self._core.slot)

    def stats(self):
        """As ArenaBase.stats(), plus the chunks held."""
        result = ArenaBase.stats(self)
        result["chunks"] = self._core.nchunks
        result["chunk_bytes"] = self._core.chunk_bytes
        return result
