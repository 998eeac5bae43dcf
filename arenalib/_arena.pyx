# cython: language_level=3
"""Arenas of native memory over jemalloc's explicit arenas and thread caches.

The one extension that links the private jemalloc.  Its parts, in the order they are included:

    _error_table.pxi  error code -> exception and message, for Python and the C API alike
    _convert.pxi      argument conversion (the first step of "convert, then check, then touch")
    _blocks.pxi       allocating from jemalloc, and the free-block cache in front of it
    _slots.pxi        the pool of jemalloc arenas and tcaches behind every arena object
    _retention.pxi    what idle slots keep warm, and what goes back to the OS
    _access.pxi       accessing-now records: no free, reset or close under another thread's access
    _dispatch.pxi     every operation's entry point: check once, switch once on the kind
    _segment.pxi      Segment, and SegmentOwner (what segments need of whoever hands them out)
    _segment_ops.pxi  what Segment's indexing, slice assignment and slice() do
    _segment_helpers.pxi  the Panama-style helpers: allocate_from, copy, mismatch, ==, hex, readonly
    (this file)       ArenaBase: the lifecycle, stats and Python API every arena kind shares
    _auto.pxi         AutoArena and arenalib.allocate(): segments freed when they become garbage
    _confined.pxi     ConfinedArena: its rule and class (its inline rule: _confined.pxd)
    _shared.pxi       Arena: likewise (_shared.pxd)
    _slicing.pxi      SlicingArena: likewise (_slicing.pxd)
    _frames.pxi       a SlicingArena's marks and frames, and each thread's frame arena (_frames.pxd)
    _with.pxi         `with arena:` without a garbage-collected method object per call
    _numpy.pxi        `with arena.numpy():`, NumPy arrays allocated from an arena (NEP 49's handler)
    _stats.pxi        live_objects(), slot_stats(), jemalloc's figures for stats()
    _c_api.pxi        the C API's function tables and capsules

The structs the inline fast paths read are arenalib/_abi.pxd; the fast paths themselves are
arenalib/fast.pxd, compiled in here as in every module that cimports them.  The start-up steps
run in one place, _module_init(), at the bottom.
"""

cimport cython
from cpython.pycapsule cimport PyCapsule_New  # noqa: F401  (used by _c_api.pxi)
from libc.stdint cimport uint64_t
from libc.string cimport memcpy

import warnings

from arenalib._abi cimport (
    FREE_THREADED, ArenaCore, ArenaSlot, Books, FrameLevel, InlineState, Lifetime, load_u64,
    owned_by_another, store_flag,
)
from arenalib._jemalloc cimport JEMALLOC_VERSION, je_dallocx
from arenalib._frames cimport (
    FRAME_NEEDS_EXCLUSIVE, FRAME_NEEDS_GIL, frame_level_now, frame_level_of, frame_stamp_alive,
    frame_stamp_depth, frame_stamp_now, frames_version,
)
from arenalib._table cimport ARENA_EBUSY, ARENA_EEXPORTED, ARENA_EORDER, ARENA_OK, ArenaMark
from arenalib.fast cimport arena_allocate, arena_free, arena_open

cdef extern from "Python.h":
    int PyType_HasFeature(type t, unsigned long feature)
    unsigned long Py_TPFLAGS_HEAPTYPE

cdef extern from "src/tracemalloc.h":
    # Whether tracemalloc traces, and its calls made only when it does: a load of CPython's flag.
    void tracemalloc_flag_init "arenalib_tracemalloc_flag_init"() noexcept
    bint tracemalloc_tracing "arenalib_tracemalloc_tracing"(unsigned int domain) noexcept nogil
    void trace_track "arenalib_trace_track"(unsigned int domain, size_t ptr, size_t size) noexcept nogil
    void trace_untrack "arenalib_trace_untrack"(unsigned int domain, size_t ptr) noexcept nogil

cdef extern from "src/dealloc.h":
    void clear_weakrefs_in_dealloc "arenalib_clear_weakrefs_in_dealloc"(object owner) noexcept


include "_error_table.pxi"
include "_convert.pxi"
include "_blocks.pxi"
include "_slots.pxi"
include "_retention.pxi"
include "_access.pxi"
include "_dispatch.pxi"
include "_segment.pxi"
include "_segment_ops.pxi"
include "_segment_helpers.pxi"

# Debug mode: arenas record where they were created, for the ResourceWarning of an unclosed arena.
cdef bint _debug = False
# Debug mode was on at some time: blocks allocated then may have entries whose exports count (every
# export of such a block, whatever the mode is now: else an export taken in debug mode and released
# out of it stayed counted, and one taken out of it and released in it hid a real one).
cdef bint _debug_entries = False

# tracemalloc domain of the memory that arenalib's Python API hands out ("ARNA"): filter a snapshot
# with tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN).
TRACEMALLOC_DOMAIN = TRACE_DOMAIN


def set_debug(bint enabled):
    """Record where each arena and each of its segments was made, so that an unclosed arena's
    ResourceWarning, and a BufferError of a close, reset or rewind that live exports refuse,
    name them."""
    global _debug, _debug_entries
    if enabled:
        # Imported here, on the thread that turns debug mode on: a first import inside an arena's
        # construction, racing os.fork() on another thread, left the child waiting for ever on the
        # module lock the parent's importing thread held at the fork.
        import traceback  # noqa: F401
    _debug = enabled
    _debug_entries = _debug_entries or enabled


cdef enum:
    DEBUG_SHOWN = 3  # exported segments a BufferError names


cdef void _add_note(object exc, str note) noexcept:
    """BaseException.add_note() (3.11+), or the __notes__ it fills on 3.10."""
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:
            exc.__notes__ = [*getattr(exc, "__notes__", ()), note]
    except Exception:
        pass  # an exception that refuses notes keeps propagating as it is


cdef int _debug_note_allocation(ArenaBase arena, size_t address, Py_ssize_t size,
                                uint64_t stamp) except -1:
    """Debug mode: remember where the segment at ``address`` was allocated ([size, stack, exports,
    the frame stamp it was carved under])."""
    import traceback
    if arena._debug_blocks is None:
        # Made once and then only cleared, never dropped: other threads read the field unlocked
        # (3.13t), and a dict dropped under one of them would be freed in its hands.
        with cython.critical_section(arena):
            if arena._debug_blocks is None:
                arena._debug_blocks = {}
                store_flag(&arena._core.object_books, True)
    # Called from C: the innermost Python frame is the one that allocated.
    arena._debug_blocks[address] = [size, "".join(traceback.format_stack()), 0, stamp]
    return 0


cdef int _note_block(ArenaBase arena, size_t address, size_t size, uint64_t stamp,
                     uint64_t generation) except -1:
    """tracemalloc's and debug mode's books of a block just bound to its segment.  Diagnostics: a
    block they cannot note (no memory for a table entry, the recursion limit reached by
    format_stack()) goes unnoted rather than fail the allocation or resize (a raise here lost the
    block bound to a segment the caller never got, counted until close, and a resized segment:
    PyTraceMalloc_Track()'s callers ignore its failure too)."""
    try:
        if arena._traced is not None:
            arena._trace(address, size, True, stamp, generation)
        if _debug:
            _debug_note_allocation(arena, address, size, stamp)
    except (MemoryError, RecursionError):
        pass
    return 0


cdef int _note_block_gone(ArenaBase arena, size_t address) except -1:
    """tracemalloc's and debug mode's books of a block freed or moved away: after the fact, so a
    failure (no memory for the address as a key) leaves an entry rather than raising for a free or
    resize that was done (harmless: the address noted again replaces it, a close untracks it)."""
    try:
        if arena._traced is not None:
            arena._trace(address, 0, False)
        if arena._debug_blocks is not None:
            arena._debug_blocks.pop(address, None)
    except MemoryError:
        pass
    return 0


cdef int debug_note_export(Segment root, Py_ssize_t delta) except -1:
    """An export of ``root`` begins (1) or ends (-1): counted in its entry, if it was allocated in
    debug mode."""
    if not isinstance(root._arena, ArenaBase):
        return 0
    cdef dict blocks = (<ArenaBase>root._arena)._debug_blocks
    entry = blocks.get(<size_t>root._ptr) if blocks is not None else None
    if entry is not None:
        entry[2] += delta
    return 0


cdef str exported_segments(ArenaBase arena, Py_ssize_t depth=-1):
    """The exported segments of ``arena``, named for an error message (debug mode only); with a
    ``depth``, only those carved under a mark of that depth or deeper (what a rewind to it kills)."""
    cdef str unnamed = " (arenalib.set_debug(True) names the segments)"
    if not arena._debug_blocks:
        return unnamed
    # A copy, made in one call: other threads allocate and free meanwhile (and a dict changed
    # under its iterator raises).
    shown = [f"\n  a segment of {size} bytes at {address:#x} ({exports} export(s)), allocated at:\n"
             f"{stack}" for address, (size, stack, exports, stamp) in arena._debug_blocks.copy().items()
             if exports > 0 and (depth < 0 or (stamp != 0 and frame_stamp_depth(stamp) >= depth))]
    if not shown:  # (allocated before debug mode was on)
        return unnamed
    more = len(shown) - DEBUG_SHOWN
    return "".join(shown[:DEBUG_SHOWN]) + (f"\n  and {more} more" if more > 0 else "")


cdef str _segment_named(ArenaBase arena, Segment seg):
    """``seg`` named for an error message: its size and address, and in debug mode where it was
    allocated."""
    name = f"a segment of {seg._size} bytes at {<size_t>seg._ptr:#x}"
    entry = arena._debug_blocks.get(<size_t>seg._ptr) if arena._debug_blocks is not None else None
    return name + (f", allocated at:\n{entry[1]}\n" if entry is not None else "")


def jemalloc_version():
    """Version of the private jemalloc linked into arenalib."""
    return JEMALLOC_VERSION.decode()


cdef bint _carve_alive(Lifetime* life, uint64_t stamp, uint64_t generation) noexcept:
    """Whether a block carved at ``generation`` under mark stamp ``stamp`` is alive still."""
    cdef void* token = access_enter(life)  # no close frees the stack meanwhile
    cdef bint alive = life_generation(life) == generation and frame_stamp_alive(life, stamp)
    access_exit(token)
    return alive


# -- ArenaBase ---------------------------------------------------------------------------------------

@cython.no_gc  # holds no object that could lead back to it: no cycles, no GC tracking cost
cdef class ArenaBase(SegmentOwner):
    """What every arena shares: allocate(), reset(), purge(), close(), stats(), the with-block.

    Not instantiable; use Arena, ConfinedArena or SlicingArena."""

    def __cinit__(self):
        self._life = &self._core.life
        self._core.arena_object = <void*>self  # (borrowed: the core is part of self)
        # The kind every open of this core takes (arena_open() of the C API refuses another).
        self._core.kind = (ARENA_KIND_CONFINED if type(self) is ConfinedArena
                           else ARENA_KIND_SLICING if type(self) is SlicingArena else ARENA_KIND_SHARED)
        # A no-argument __cinit__ is called whatever the constructor's arguments are.  Python
        # subclasses (heap types) would get an arena they cannot open: refuse them too.
        if type(self) is ArenaBase or PyType_HasFeature(type(self), Py_TPFLAGS_HEAPTYPE):
            raise TypeError(f"{type(self).__name__}: ArenaBase cannot be instantiated or subclassed"
                            " in Python; use Arena, ConfinedArena or SlicingArena")

    cdef int _open(self, int kind, object max_bytes, size_t chunk_size=0) except -1:
        """Open the core; called once by each concrete class's __cinit__."""
        arena_open(&self._core, kind, _parse_max_bytes(max_bytes), chunk_size)
        if _debug:
            import traceback
            # Called from C: the innermost Python frame is the one that made the arena.
            self._created_at = "".join(traceback.format_stack())
            self._debug_blocks = {}  # now, while no other thread can see the arena
            store_flag(&self._core.object_books, True)
        return 0

    cdef bint _is_open(self) noexcept:
        return self._core.open

    # -- allocation ------------------------------------------------------------------------------

    def allocate(self, size, *, zero=True, align=None):
        """A new Segment of ``size`` bytes.

        zero: True for zero-filled memory (no memset where jemalloc knows the pages are zero),
        False for memory with whatever it held (a bool, or an int).  align: a power of two the
        address is a multiple of (up to 1 GiB).  Raises MemoryError when the memory cannot be had
        or max_bytes would be exceeded."""
        # The flags first: a bad one is a ValueError or TypeError whatever the size (a size past
        # any address space is a MemoryError).
        cdef bint fill = parse_flag(zero, "zero")
        cdef size_t alignment = 1 if align is None else parse_align(align)
        return self._allocate(_parse_size(size, "size"), fill, alignment, NULL, NULL, -1)

    def allocate_from(self, data, *, align=None):
        """A new Segment holding a copy of ``data`` (any bytes-like object; a strided one is
        copied in C order).  Panama's SegmentAllocator.allocateFrom; in Python, bytearray(data)."""
        return _allocate_from(self, data, align)

    def allocate_string(self, s, encoding="utf-8", nul=True):
        """A new Segment holding ``s`` encoded (``s.encode(encoding)``), then a NUL character when
        ``nul`` is true (a C string): one byte, two in UTF-16, four in UTF-32.  Panama's
        SegmentAllocator.allocateFrom(String, Charset)."""
        return _allocate_string(self, s, encoding, nul)

    @cython.final
    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align,
                           const ArenaMark* frame, const char* contents, Py_ssize_t copied):
        # Objects first (each may start a GC, whose finalizers may reset or close this arena),
        # then the memory, then the segment bound to it with nothing in between that calls back.
        # ``copied`` >= 0: the block starts with that many bytes of ``contents`` (memory the caller
        # holds), the rest zeroed, written before another thread's reset or close can run (the
        # allocating helpers need no pin of the new segment after, whose check costs as much).
        if self._traced is None and tracemalloc_tracing(TRACE_DOMAIN):
            self._start_tracing()
        # A thread that does not own this object keeps it through an anchor where the kind has
        # one (see _shared.pxi), chosen below: no reference taken on it meanwhile.
        cdef bint owned = owned_here(self)
        cdef Segment seg = new_segment(self, size, owned)
        if align > 1:
            seg._lg_align = <unsigned char>arenalib_ctz(align)
        cdef void* ptr
        cdef void* anchor = NULL
        # Another thread's reset or close waits until the segment is bound to this generation.
        cdef Lifetime* life = &self._core.life
        cdef void* token = access_enter(life)
        cdef uint64_t version
        cdef FrameLevel* level
        cdef int err = ARENA_OK
        cdef bint foreign = owned_by_another(life)
        cdef Py_ssize_t tail
        while True:
            if foreign:
                # Before anything else of another thread's arena is read (its marks, as it moves
                # them with no lock), as Segment._status does.
                err = ARENA_EWRONGTHREAD
                break
            # The level of marks the carve lands in: read before it, and true if no mark or rewind
            # (another thread's, or the C API's without the GIL) ran meanwhile (_frames.pxd).  Read
            # before the innermost check too: a frame pushed after the check moves the version.
            level = frame_level_now(life, &version)
            seg._frame_stamp = load_u64(&level.stamp) if level != NULL else 0
            if not FREE_THREADED and level != NULL and load_life_owner(&life.owner) == 0:
                # Before the carve (a C-level rewind after it sees this: see FrameLevel); a level
                # that moves meanwhile is marked again by the carve made again.
                level.python_carved = True
            if frame != NULL and not frame_is_innermost(life, frame):
                # Frame.allocate() of a frame that is not the innermost, unless the arena closed
                # (ArenaClosedError, as every use after close: helper 52).
                err = _usable(&self._core)
                if not err:
                    err = ARENA_EORDER
                break
            err = arena_allocate(&self._core, <size_t>size, align, zero, &ptr)
            if err == ARENA_EBUSY and not slicing_busy_for_good(&self._core):
                # Another thread is carving from this SlicingArena (with the GIL off, Python
                # threads meet here; with it, a C caller without the GIL, which needs no GIL to
                # finish): wait for the carve (microseconds) rather than raise.
                arenalib_yield()
                continue
            if err or frames_version(life) == version:
                break
            # Carved at a level now unknown: the block stays carved, dead, until a rewind or reset.
        if err:
            access_exit(token)
            if err == ARENA_EORDER and frame.generation != life_generation(life):
                raise ValueError("allocate() of a frame whose arena was reset since it was entered "
                                 "(everything carved in it died)")
            if err == ARENA_EORDER:
                raise ValueError("allocate() of a frame that is not the innermost one open (a frame "
                                 "or mark made after it is open, or a frame whose exit was refused "
                                 "is kept above it, or it was left)")
            self._raise(err, f"cannot allocate {size} bytes (align={align})")
        cdef bint anchored = note_allocation(&self._core, &anchor)
        if not owned:
            seg._keeper = <object>anchor if anchor != NULL else self  # a reference, no call back
        seg._ptr = <char*>ptr
        seg._generation = life.generation
        if copied >= 0:
            user_bytes_begin()
            memcpy(ptr, contents, <size_t>copied)
            # The rest: nothing (allocate_from) or a NUL of 1-4 bytes (allocate_string), written
            # here rather than by a call to memset (16 instructions of ~300 for one byte).
            tail = size - copied
            if tail <= 8:
                while tail:
                    tail -= 1
                    (<char*>ptr)[copied + tail] = 0
            else:
                memset(<char*>ptr + copied, 0, <size_t>tail)
            user_bytes_end()
        access_exit(token)
        if anchored and anchor == NULL and not owned:
            shared_make_anchor(self)  # for this thread's next segments
        if self._traced is not None or _debug:
            _note_block(self, <size_t>ptr, <size_t>size, seg._frame_stamp, seg._generation)
        return seg

    cdef int _free_segment(self, Segment seg) except -1:
        # Segment.free() checked the segment; another thread may have freed it, or reset or closed
        # the arena, since: judged again once no reset or close can run (see _access.pxi).
        cdef Lifetime* life = &self._core.life
        # The segment first (waiting for its accesses holds nothing), then the arena against reset
        # and close: a thread waiting never holds what another waits for.
        if not free_begin(life, seg, NULL):
            return seg._raise_status(SEGMENT_DEAD)
        cdef void* token = access_enter(life)
        if life.generation != seg._generation:
            free_end(seg, False)
            access_exit(token)
            return seg._raise_status(SEGMENT_DEAD)
        cdef Py_ssize_t exports = count_read(&seg._exports)
        cdef int err = ARENA_EEXPORTED if exports else arena_free(&self._core, seg._ptr, <size_t>seg._size)
        free_end(seg, err == ARENA_OK)
        access_exit(token)
        if err == ARENA_EEXPORTED:
            raise BufferError(
                f"cannot free {_segment_named(self, seg)} while {exports} buffer export(s) of it "
                "(memoryview, NumPy array, io_uring request in flight ...) are alive; release them "
                "first, or free(deferred=True) to free it with the last")
        if err:
            self._raise(err, "cannot free this segment")
        if self._traced is not None or self._debug_blocks is not None:
            _note_block_gone(self, <size_t>seg._ptr)
        return 0

    cdef Segment _resize_segment(self, Segment seg, Py_ssize_t size, bint zero):
        # As _free_segment(): the new segment object first (it may start a GC), then the segment
        # is claimed against its accesses and the arena against reset and close, judged again,
        # and resized with nothing in between that calls back.
        if self._traced is None and tracemalloc_tracing(TRACE_DOMAIN):
            self._start_tracing()
        cdef Segment resized = make_segment(self, size, False)
        resized._keeper = seg._keeper  # what keeps the arena alive for seg (no call back)
        resized._lg_align = seg._lg_align
        resized._frame_stamp = seg._frame_stamp  # a resize never moves a carve to another level
        cdef Lifetime* life = &self._core.life
        if not free_begin(life, seg, NULL):
            seg._raise_status(SEGMENT_DEAD)
        cdef void* token = access_enter(life)
        if not seg._current():
            free_end(seg, False)
            access_exit(token)
            seg._raise_status(SEGMENT_DEAD)
        cdef size_t old_size = <size_t>seg._size
        cdef void* ptr = NULL
        cdef Py_ssize_t exports = count_read(&seg._exports)
        cdef int err = ARENA_EEXPORTED if exports else ARENA_OK
        while not err:
            err = arena_resize_checked(&self._core, seg._ptr, old_size, <size_t>size,
                                       <size_t>1 << seg._lg_align, zero, seg._frame_stamp, &ptr)
            if err == ARENA_EBUSY and not slicing_busy_for_good(&self._core):
                arenalib_yield()  # another thread is carving from this SlicingArena (see _allocate)
                err = ARENA_OK
                continue
            break
        if not err:
            resized._ptr = <char*>ptr
            resized._generation = seg._generation
            seg._resized = True
            if <size_t>size > old_size:
                note_growth(&self._core)
        free_end(seg, err == ARENA_OK)  # resized: the old handle (and its slices) die
        access_exit(token)
        if err == ARENA_EEXPORTED:
            raise BufferError(
                f"cannot resize {_segment_named(self, seg)} while {exports} buffer export(s) of it "
                "or of its slices (memoryview, NumPy array, io_uring request in flight ...) are alive; "
                "release them first")
        if err == ARENA_EINVAL:
            raise ValueError("cannot grow this SlicingArena segment: it would move into a mark or frame "
                             "opened after it was carved, and die at its rewind; resize it there")
        if err:
            self._raise(err, f"cannot resize a segment of {old_size} bytes to {size}")
        if self._traced is not None or self._debug_blocks is not None:
            _note_block_gone(self, <size_t>seg._ptr)
        if self._traced is not None or _debug:
            _note_block(self, <size_t>ptr, <size_t>size, resized._frame_stamp, resized._generation)
        return resized

    cdef void _start_tracing(self) noexcept:
        traced, framed = {}, {}  # (made first: making them may start a GC, whose finalizer may reset)
        with cython.critical_section(self):  # several threads may allocate at once
            if self._traced is None:
                self._traced = traced
                self._traced_framed = framed
                self._traced_rewinds = -1
                store_flag(&self._core.object_books, True)  # a C-level reset comes to _untrack_all()

    cdef int _trace(self, size_t address, size_t size, bint track, uint64_t stamp=0,
                    uint64_t generation=0) except -1:
        """Report a block to tracemalloc (track: carved at ``generation``) or its end (not track),
        and remember which; a block carved under a mark is remembered with its stamp, for
        _sync_traced()."""
        with cython.critical_section(self):  # _untrack_all() of another thread may drop the dicts
            if self._traced is None:
                return 0
            if track:
                self._sync_traced_locked()  # a rewind through the C API is told here
                # Read again: the sync may start a GC whose finalizer resets or closes the arena
                # (which untracks everything, and may trace anew), or rewinds past the block (the
                # rewind's own sync ran before the block was in the table): then it is dead, and a
                # trace of it would stay, or later untrack a live block carved at its address.
                table = self._traced_framed if stamp else self._traced
                if table is None or not _carve_alive(&self._core.life, stamp, generation):
                    return 0
                # The table's entry first: one it cannot make (MemoryError) leaves tracemalloc
                # told nothing, where a trace without an entry would outlive the block's close.
                key = address
                table[key] = stamp
                if PyTraceMalloc_Track(TRACE_DOMAIN, address, size) != 0:
                    del table[key]
            else:
                PyTraceMalloc_Untrack(TRACE_DOMAIN, address)
                self._traced.pop(address, None)
                self._traced_framed.pop(address, None)
        return 0

    cdef int _sync_traced(self) except -1:
        """Untrack the blocks rewinds killed (after a Python-level rewind)."""
        if self._traced is None:
            return 0  # not tracing (as _allocate reads it): no lock for the common case
        with cython.critical_section(self):
            self._sync_traced_locked()
        return 0

    cdef int _sync_traced_locked(self) except -1:
        cdef dict framed = self._traced_framed
        if not framed:
            return 0
        cdef Lifetime* life = &self._core.life
        cdef void* token = access_enter(life)  # no close frees the stack meanwhile
        cdef Py_ssize_t rewinds = life.frames.rewinds if life.frames != NULL else -1
        access_exit(token)
        if rewinds == self._traced_rewinds:
            return 0
        self._traced_rewinds = rewinds
        # Every object made before the look (any may start a GC, whose finalizer may trace, rewind
        # or reset on this arena): none while the stamps are read, and the dict changed meanwhile
        # is read tolerantly after.
        cdef list stamps = list(framed.items())
        cdef bytearray dead = bytearray(len(stamps))
        cdef unsigned char* flags = dead
        cdef Py_ssize_t i
        token = access_enter(life)
        for i in range(len(stamps)):
            flags[i] = not frame_stamp_alive(life, <uint64_t>(<tuple>stamps[i])[1])
        access_exit(token)
        if self._traced_framed is not framed:
            # A finalizer reset or closed the arena meanwhile (untracking all it traced) and may
            # trace anew: a block now at one of these addresses is another one, alive.
            return 0
        for i in range(len(stamps)):
            if flags[i]:
                address = (<tuple>stamps[i])[0]
                if framed.pop(address, None) is not None:
                    PyTraceMalloc_Untrack(TRACE_DOMAIN, <size_t>address)
        return 0

    cdef int _raise(self, int code, str context) except -1:
        """Raise the exception for ``code`` with a message that names this arena."""
        return raise_error(code, self, context)

    # -- lifecycle -------------------------------------------------------------------------------

    def reset(self):
        """Free every segment at once and keep the arena open (its pages stay warm for reuse).

        Raises BufferError, changing nothing, while a segment's buffer export is alive."""
        self._reset()

    cdef int _reset(self) except -1:
        # reset() of every kind (AutoArena refuses it here, where ArenaBase.reset(auto) comes too).
        cdef int err = arena_reset_checked(&self._core)
        if err:
            self._raise(err, f"cannot reset {type(self).__name__}")
        self._untrack_all()
        return 0

    def purge(self):
        """Hand the arena's unused dirty pages back to the OS now (live segments stay)."""
        # It flushes the thread caches of a shared arena's threads: none may allocate meanwhile.
        numpy_cache_flush(self)
        exclusive_begin(&self._core.life)
        cdef int err = _usable(&self._core)
        cdef ArenaSlot* slot = self._core.slot
        if not err:
            slot_purge_open(slot)
        exclusive_end(&self._core.life)
        if err:
            self._raise(err, None)
        with nogil:
            slot_purge_settle(slot)

    def close(self, *, bint deferred=False):
        """Free every segment and give the memory back; idempotent.

        While a buffer export (memoryview, NumPy array ...) of a segment is alive, raises
        BufferError and changes nothing, as mmap.close() does; with deferred=True it closes
        anyway: every segment dies now (its use raises ArenaClosedError), and the memory goes
        back when the last export is released, from whichever thread releases it.  The
        with-statement's exit closes so."""
        self._close(deferred)

    cdef int _close(self, bint deferred=False) except -1:
        # The blocks the NumPy handler keeps are out of the books, so a close would leave them in
        # the slot as garbage nothing counts (a slot is reset by what it counts): they go back first.
        if self._numpy.cache != NULL:  # (every scope's close reads it: no call for the others)
            numpy_cache_flush(self)
        cdef int err = arena_close_checked(&self._core, deferred)
        if err:
            self._raise(err, f"cannot close {type(self).__name__} (close(deferred=True) closes it now and "
                             "frees the memory when the last export goes)"
                        if err == ARENA_EEXPORTED else f"cannot close {type(self).__name__}")
        if self._traced is not None or self._debug_blocks is not None:  # (no call for the others)
            self._untrack_all()
        if FREE_THREADED:
            shared_drop_anchor(self)
        return 0

    cdef void _exports_released(self) noexcept:
        core_release_held(&self._core)

    cdef int _check_usable(self) except -1:
        cdef void* token = access_enter(&self._core.life)  # no close half done meanwhile
        cdef int err = _usable(&self._core)
        access_exit(token)
        if err:
            self._raise(err, None)
        return 0

    cdef void _untrack_all(self) noexcept:
        """Tell tracemalloc (and debug mode's books) that every traced block of the arena is gone."""
        cdef dict blocks = self._debug_blocks
        if blocks is not None:
            blocks.clear()  # not dropped: see _debug_note_allocation()
        if self._traced is None:
            return
        cdef dict traced, framed
        with cython.critical_section(self):
            # Taken out before the walk: a GC the walk starts may run a finalizer that traces or
            # untracks (a reset, a close) on this arena.
            traced, framed = self._traced, self._traced_framed
            self._traced = None
            self._traced_framed = None
            store_flag(&self._core.object_books, blocks is not None)
        for table in (traced, framed):
            if table is not None:
                for address in table:
                    PyTraceMalloc_Untrack(TRACE_DOMAIN, <size_t>address)

    def numpy(self):
        """A with-statement in which NumPy allocates the data of the arrays created in the block (in
        this context, and the asyncio tasks created in it) from this Arena (arenalib/_numpy.pxi).

        The arrays outlive the block; while one lives, close() and reset() raise BufferError, and
        the end of `with arena:` closes deferred (the last array's free gives the memory back).
        An allocation after the arena closed comes from NumPy's default handler (stats()'s
        numpy_fallbacks).  Arena only: UnsupportedOperation for a ConfinedArena or a SlicingArena;
        ImportError without NumPy 1.22 or newer."""
        return numpy_scope(self)

    @property
    def closed(self):
        """True once close() was called (or the with-block ended)."""
        return not open_now(self)

    @property
    def max_bytes(self):
        """The limit on live bytes given at creation, or None."""
        return None if self._core.max_bytes < 0 else self._core.max_bytes

    def __enter__(self):
        self._check_usable()
        return self

    def __exit__(self, exc_type, exc, tb):
        # Deferred: a buffer export still alive (a NumPy array returned from the block) holds the
        # memory, and neither the block's return value nor its exception is lost to a BufferError.
        if exc is None:
            self._close(True)
            return False
        try:
            self._close(True)
        except Exception as close_error:
            if isinstance(exc, GeneratorExit):
                raise  # a generator's close() swallows GeneratorExit, and a note on it with it
            # The block's exception propagates unchanged; the close's failure is noted on it.
            _add_note(exc, f"and closing {type(self).__name__} failed: {close_error!r}")
        return False

    def stats(self):
        """Accounting of this arena and jemalloc's figures for the arena behind it.

        live_bytes/live_segments/peak_bytes count the sizes asked for (NumPy arrays' blocks included);
        numpy_arrays/numpy_bytes count the arrays of numpy() scopes alive now, numpy_fallbacks the
        allocations NumPy's default handler served after the close, numpy_cached_bytes the small
        blocks of dead arrays the handler keeps for reuse (not in live_bytes); resident, mapped, active and
        dirty are jemalloc's byte counts for the underlying jemalloc arena (0 once closed)."""
        cdef Books books
        cdef size_t figures[4]
        cdef int i
        result = {}  # made first: the GC it may start can close the arena, which the reads must see
        cdef void* token = access_enter(&self._core.life)  # no close meanwhile
        cdef Py_ssize_t cached_bytes = numpy_read_books(self, &books)
        jemalloc_arena_figures(&self._core, figures)
        cdef Py_ssize_t exports = segment_exports(self)  # NumPy arrays, exports too, come apart
        cdef Py_ssize_t arrays, array_bytes
        numpy_figures(self, &arrays, &array_bytes)
        cdef bint closed = not self._core.open
        cdef bint held = closed and state_read(&self._core.life.release_pending)
        cdef Py_ssize_t held_bytes = self._core.held.live_bytes if held else 0
        access_exit(token)
        result["live_bytes"] = books.live_bytes
        result["live_segments"] = books.live_segments
        result["peak_bytes"] = books.peak_bytes
        result["allocated_total"] = books.allocated_total
        result["exports"] = exports
        result["max_bytes"] = None if self._core.max_bytes < 0 else self._core.max_bytes
        result["closed"] = closed
        # Closed deferred: the memory stays until the last export goes (how many, and how many
        # bytes the arena had live when it closed).
        result["held_by_exports"] = exports if held else 0
        result["held_bytes"] = held_bytes
        result["numpy_arrays"] = arrays
        result["numpy_bytes"] = array_bytes
        result["numpy_fallbacks"] = count_read(&self._numpy.fallbacks)
        result["numpy_cached_bytes"] = cached_bytes
        for i in range(4):
            result[_ARENA_FIGURES[i][0]] = figures[i]
        return result

    def __repr__(self):
        name = type(self).__name__
        if not self._core.open:
            if state_read(&self._core.life.release_pending):
                return (f"<arenalib.{name} closed, {self._core.held.live_bytes} bytes held by "
                        f"{exports_in_words(self)}>")
            return f"<arenalib.{name} closed>"
        # The arena's own books: jemalloc's statistics cost milliseconds once arenas are many.
        cdef Books books
        cdef void* token = access_enter(&self._core.life)
        numpy_read_books(self, &books)
        access_exit(token)
        return f"<arenalib.{name} {books.live_segments} segments, {books.live_bytes} bytes>"

    def __reduce__(self):
        raise TypeError(f"{type(self).__name__} owns native memory and cannot be pickled")

    def __dealloc__(self):
        # As an unclosed file does: free the memory and say so with a ResourceWarning.  Done here
        # rather than in __del__, which would cost every arena's deallocation (see DESIGN.md).
        if not self._core.open:
            numpy_books_free(&self._numpy)  # (its blocks are the arena's, which went with it)
            frames_free(&self._core.life)  # kept by a close (see frames_close)
            return
        clear_weakrefs_in_dealloc(self)  # (before any object is made here: a GC may start)
        message = f"unclosed {self!r}"
        if self._created_at is not None:
            message += f", created at:\n{self._created_at}"
        numpy_cache_flush(self)  # (as _close() does)
        numpy_books_free(&self._numpy)
        core_close(&self._core)
        frames_free(&self._core.life)
        self._untrack_all()
        if warnings is not None:  # None while the interpreter is tearing modules down
            warnings.warn(message, ResourceWarning, stacklevel=2)

cdef bint open_now(ArenaBase arena) noexcept:
    """Whether ``arena`` is open, read against another thread's close."""
    cdef void* token = access_enter(&arena._core.life)  # no close half done meanwhile
    cdef bint is_open = arena._core.open
    access_exit(token)
    return is_open


include "_auto.pxi"
include "_confined.pxi"
include "_shared.pxi"
include "_slicing.pxi"
include "_frames.pxi"
include "_with.pxi"
include "_numpy.pxi"
include "_stats.pxi"
include "_c_api.pxi"


# -- arena objects kept for the next one ------------------------------------------------------------

cdef extern from "src/arena_freelist.h":
    void arenalib_arena_freelist_for(type t) noexcept


# -- the hottest calls made the common way: past Cython's argument parsing (src/entries.h) -------------

cdef extern from "src/entries.h":
    ctypedef object (*arenalib_size_zero_fn)(object self, object size, object zero)
    ctypedef object (*arenalib_one_fn)(object self, object arg)
    ctypedef object (*arenalib_self_fn)(object self)
    int arenalib_arena_entries_install(type arena_type, arenalib_size_zero_fn allocate,
                                       arenalib_one_fn allocate_from,
                                       arenalib_one_fn allocate_string) except -1
    int arenalib_frame_entries_install(type frame_type, arenalib_size_zero_fn allocate,
                                       arenalib_one_fn exit_frame) except -1
    int arenalib_segment_entries_install(type segment_type, arenalib_one_fn fill) except -1
    int arenalib_frame_function_install(dict globals, arenalib_self_fn impl) except -1
    int arenalib_arena_frame_install(type arena_type, arenalib_self_fn impl) except -1


cdef object _arena_allocate(object arena, object size, object zero):
    """ArenaBase.allocate(size) and allocate(size, zero=z)."""
    cdef bint fill = parse_flag(zero, "zero")  # (the flag first, as allocate() parses them)
    return (<ArenaBase>arena)._allocate(_parse_size(size, "size"), fill, 1, NULL, NULL, -1)


cdef object _arena_allocate_from(object arena, object data):
    """ArenaBase.allocate_from(data)."""
    return _allocate_from(<ArenaBase>arena, data, None)


cdef object _arena_allocate_string(object arena, object text):
    """ArenaBase.allocate_string(s): an ASCII str straight (_allocate_string's frame and checks
    cost ~40 instructions of ~650 a call)."""
    if type(text) is str and PyUnicode_IS_COMPACT_ASCII(text):
        return allocate_ascii(<ArenaBase>arena, text, 1)
    return _allocate_string(<ArenaBase>arena, text, "utf-8", True)


cdef object _arena_frame(object arena):
    """SlicingArena.frame() (its descriptor has checked the type of ``arena``)."""
    return arena_frame_object(<SlicingArena>arena)


cdef int _entries_init() except -1:
    """The C entries, before _with.pxi binds __enter__ and __exit__ (it wraps Frame.__exit__'s
    method descriptor, whose entry must be in place by then)."""
    arenalib_arena_entries_install(ArenaBase, _arena_allocate, _arena_allocate_from,
                                   _arena_allocate_string)
    arenalib_frame_entries_install(Frame, _frame_allocate, _frame_exit)
    arenalib_segment_entries_install(Segment, _segment_fill)
    arenalib_frame_function_install(globals(), _frame_new)
    arenalib_arena_frame_install(SlicingArena, _arena_frame)
    return 0


# -- start-up ----------------------------------------------------------------------------------------

cdef int _module_init() except -1:
    """The start-up steps, in the order they depend on each other."""
    tracemalloc_flag_init()  # (before anything is allocated)
    segment_dealloc_init()
    auto_init()        # (after the hook: what it calls for an automatic segment)
    for kind in (Arena, ConfinedArena, SlicingArena):
        arenalib_arena_freelist_for(kind)
    _entries_init()
    fast_with_init(ArenaBase)
    fast_with_init(Frame)
    fast_with_init(Segment)
    slots_init()       # the shared state and the jemalloc control names (every arena needs them)
    slicing_init()     # biased carving, if membarrier() is there
    _figures_init()    # stats() names
    _capi_init()       # last: publishes what the steps above made
    return 0


_module_init()
