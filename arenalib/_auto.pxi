# The automatic arena: segments without a scope, freed when they become garbage (issue 27; Java's
# Arena.ofAuto()).
#
#   seg = arenalib.allocate(4096)      # freed when the last reference (and export, and slice) goes
#
# Where the memory comes from: one shared Arena for the whole process, made by the first
# allocate() of any thread.  A segment becomes garbage on whichever thread drops its last
# reference, and only a shared Arena frees from any thread; its per-thread caches (_shared.pxi)
# keep the threads off each other's cache lines, as for any Arena.  An arena per thread would need
# a remote free for every segment handed to another thread, and would outlive its thread.
#
# What it means for a segment: seg.arena is the AutoArena; seg.free() frees it at once (and
# free(deferred=True) as for any Arena); resize() returns another automatic segment; `with seg:`
# frees it at the block's end.  The AutoArena itself is never closed or reset (UnsupportedOperation:
# either would kill segments that other code holds), takes no part in `with`, never warns, and is
# not counted by live_objects()["open_arenas"] (it is no scope anybody left open).
#
# How a segment is freed as garbage: Segment's tp_dealloc (src/segment.h) calls tp_finalize,
# _free_garbage() below, for a segment of this arena (one compare for every other segment).  Its
# buffer exports and slices hold references to it, so when it is garbage nothing can be using its
# memory: the free cannot meet an export, and a slice frees nothing (its root does).

from arenalib._table cimport ARENA_KIND_SHARED

cdef object _AUTO_TOKEN = object()  # what makes AutoArena.__cinit__ accept (no user constructs one)
cdef object _auto_guard = object()  # the critical section of the one-time publication
cdef ArenaBase _auto = None         # the AutoArena, once made (never replaced while it lives)

cdef extern from "src/segment.h":
    void set_auto_free "arenalib_set_auto_free"(void (*free)(object) noexcept) noexcept
    void set_auto_owner "arenalib_set_auto_owner"(object owner) noexcept
    void forget_auto_owner "arenalib_forget_auto_owner"(object owner) noexcept


@cython.final
cdef class AutoArena(ArenaBase):
    """The process's automatic arena (Panama's Arena.ofAuto()): its segments are freed when they
    become garbage, from whichever thread drops them.  Made by the first arenalib.allocate() or
    auto_arena(); not instantiable.

    allocate(), allocate_from() and allocate_string() as any arena's; seg.free() frees a segment
    early.  close(), reset() and `with` raise UnsupportedOperation: the arena lives as long as the
    process, as others' segments of it do."""

    def __cinit__(self, token=None):
        if token is not _AUTO_TOKEN:
            raise TypeError("AutoArena cannot be instantiated: use arenalib.allocate() or "
                            "arenalib.auto_arena()")
        self._open(ARENA_KIND_SHARED, None)

    cdef int _close(self, bint deferred=False) except -1:
        # close(), close(deferred=True) and a direct __exit__() call all come here.
        raise UnsupportedOperation(
            "the automatic arena is never closed: each of its segments is freed when it becomes "
            "garbage, by seg.free(), or at the end of `with seg:`")

    def reset(self):
        """Refused (UnsupportedOperation): a reset would kill segments that other code holds."""
        self._reset()

    cdef int _reset(self) except -1:
        # reset() and ArenaBase.reset(auto) both come here.
        raise UnsupportedOperation(
            "the automatic arena cannot be reset: its segments belong to whoever holds them; "
            "use a ConfinedArena or SlicingArena for memory freed all at once")

    def __enter__(self):
        raise UnsupportedOperation(
            "the automatic arena is not a scope: `with arenalib.allocate(n) as seg:` frees one "
            "segment at the block's end, `with arenalib.ConfinedArena() as a:` all of a scope's")

    def __dealloc__(self):
        # Only at the interpreter's exit (or when its module lets go of it): no segment of it is
        # left, each held a reference.  Closed here, without ArenaBase's ResourceWarning.
        forget_auto_owner(self)
        if self._core.open:
            core_close(&self._core)
            self._untrack_all()


cdef void _free_garbage(object o) noexcept:
    """tp_finalize of an automatic segment (src/segment.h): free its memory, unless it is a slice
    (its root frees) or dead already (freed, resized).  Errors cannot be raised from here."""
    cdef Segment seg = <Segment>o
    if seg._root is not None or state_read(&seg._freed) != SEG_ALIVE:
        return
    try:
        (<ArenaBase>seg._arena)._free_segment(seg)
    except BaseException:
        pass  # dead since (the interpreter's exit closed the arena): nothing to free


cdef int auto_init() except -1:
    """At the module's start: Segment's dealloc hook learns what frees an automatic segment."""
    set_auto_free(_free_garbage)
    return 0


cdef ArenaBase auto_arena_now():
    """The AutoArena, made on first use (by any thread: the first one published wins)."""
    global _auto
    cdef ArenaBase arena = _auto
    if arena is not None:
        return arena
    cdef ArenaBase made = AutoArena.__new__(AutoArena, _AUTO_TOKEN)
    with cython.critical_section(_auto_guard):
        if _auto is None:
            set_auto_owner(made)
            _auto = made
        arena = _auto
    return arena  # (another thread's published first: ``made`` goes unused, closed by its dealloc)


def auto_arena():
    """The process's AutoArena, whose segments are freed when they become garbage (made on first
    use).  arenalib.allocate(n) is auto_arena().allocate(n)."""
    return auto_arena_now()


def allocate(size, *, zero=True, align=None):
    """A new Segment of ``size`` bytes, freed when it becomes garbage: no arena, no scope, no
    ResourceWarning (Panama's Arena.ofAuto().allocate; in Python, bytearray(size)).

    zero and align as ArenaBase.allocate().  The memory comes from the process's AutoArena, and goes
    back when the last reference to the segment, its slices and its buffer exports is gone, from
    whichever thread drops it; seg.free() or ``with seg:`` give it back earlier."""
    cdef bint fill = parse_flag(zero, "zero")  # (the flags first, as ArenaBase.allocate())
    cdef size_t alignment = 1 if align is None else parse_align(align)
    return auto_arena_now()._allocate(_parse_size(size, "size"), fill, alignment, NULL, NULL, -1)
