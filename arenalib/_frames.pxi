# Marks and frames of a SlicingArena: the stack's blocks, mark() and rewind() under the arena's
# lock, the Python Mark and Frame, and each thread's own frame arena (arenalib.frame()).  The rule
# itself (what a mark records, what a rewind kills, a segment's O(1) test) is arenalib/_frames.pxd.

from libc.stdlib cimport calloc, free
from posix.types cimport pid_t
from cpython.pystate cimport PyThreadState, PyThreadState_Get

from arenalib._abi cimport (
    FRAME_BLOCK_LEVELS, FRAME_BLOCKS, FRAME_MAX_DEPTH, FrameLevel, FrameStack, store_frames,
    life_generation, load_frames, load_life_owner, load_ssize, load_u64, owned_by_another,
    store_life_owner, store_ssize, thread_ident,
)
from arenalib._frames cimport (
    FRAME_NEEDS_BLOCK, frame_level, frames_abandon, frames_check_mark, frames_limit, frames_mark_fast,
    frames_pop_to, frames_push, frames_rewind, frames_rewind_fast, load_depth, store_depth,
)
from arenalib._table cimport ARENA_EORDER, ARENA_ESTALEMARK, ArenaMark


# -- the stack ---------------------------------------------------------------------------------------

cdef extern from "arenalib/platform.h":
    void store_frames_block "arenalib_store_release"(FrameLevel** p, FrameLevel* levels) noexcept nogil


cdef FrameStack* _stack_of(ArenaCore* core) noexcept nogil:
    """The core's stack of marks, made on its first mark (NULL without memory).  The caller holds
    the busy lock; a stack, once published, stays until close.  (libc's calloc() here and for the
    blocks: tracemalloc's hook of PyMem_RawCalloc() takes the GIL, which a Python thread waiting
    for the busy lock may hold.)"""
    cdef FrameStack* stack = core.life.frames
    if stack == NULL:
        stack = <FrameStack*>calloc(1, sizeof(FrameStack))
        if stack != NULL:
            store_frames(&core.life.frames, stack)
    return stack


cdef bint _grow_stack(FrameStack* stack) noexcept nogil:
    """Make the block of the next level (never moved: segments read levels without a lock)."""
    cdef Py_ssize_t block = stack.levels // FRAME_BLOCK_LEVELS
    cdef FrameLevel* levels = <FrameLevel*>calloc(FRAME_BLOCK_LEVELS, sizeof(FrameLevel))
    if levels == NULL:
        return False
    store_frames_block(&stack.blocks[block], levels)
    stack.levels += FRAME_BLOCK_LEVELS
    frames_limit(stack)
    return True


cdef void frames_forget(ArenaCore* core) noexcept nogil:
    """At reset (the new generation made every mark and segment stale): no mark is open, and the
    levels' stamps are new (tracemalloc's books see their segments dead)."""
    cdef FrameStack* stack = core.life.frames
    if stack != NULL and stack.depth:
        frames_pop_to(core, stack, 1)


cdef void frames_close(Lifetime* life, bint holding) noexcept nogil:
    """At close (after the generation moved on, so no announced liveness test reads the stack
    again): no mark is open.  The stack stays until the arena object goes (frames_free) when
    ``holding`` (buffer exports are alive, whose releases count on their segments' levels) or when
    the arena belongs to one thread (a thread's frame arena): another thread's liveness test of its
    segment, refused in the end, takes no access record, and may read the stack as the close runs."""
    cdef FrameStack* stack = life.frames
    if stack == NULL:
        return
    if not holding and load_life_owner(&life.owner) == 0:
        frames_free(life)
        return
    cdef Py_ssize_t d
    # No frame stays abandoned either: an arena_open() of the core once the exports are gone
    # pushes on this stack from depth 0 (an abandoned count left would pop below level 1).
    for d in range(1, stack.depth + 1):
        frame_level(stack, d).abandoned = False
    stack.abandoned = 0
    stack.push_limit = 0  # (a closed arena pushes nothing; the general push checks open first)
    store_ssize(&stack.top_frame, 0)
    store_depth(&stack.depth, 0)


cdef void frames_free(Lifetime* life) noexcept nogil:
    """Free the stack: at a close with no export alive, or when the arena object goes."""
    cdef FrameStack* stack = life.frames
    if stack == NULL:
        return
    store_frames(&life.frames, NULL)
    cdef int i
    for i in range(FRAME_BLOCKS):
        free(stack.blocks[i])
    free(stack)


cdef bint frames_open(Lifetime* life) noexcept nogil:
    """Whether a mark is open (its chunks must stay where the marks say).  The caller keeps a
    close out (the stack goes with it)."""
    return life.frames != NULL and life.frames.depth != 0


cdef Py_ssize_t frames_depth(Lifetime* life) noexcept nogil:
    """The marks open (stats()), read inside an access: no close frees the stack meanwhile."""
    cdef void* token = access_enter(life)
    cdef FrameStack* stack = life.frames
    cdef Py_ssize_t depth = load_depth(&stack.depth) if stack != NULL else 0
    access_exit(token)
    return depth


cdef Py_ssize_t frames_abandoned(Lifetime* life, Py_ssize_t* held, Py_ssize_t* outermost) noexcept nogil:
    """The abandoned frames on the stack; in ``held`` how many of them exports hold, and in
    ``outermost`` the depth of the outermost of those (0: none), for the error at the depth limit;
    read inside an access."""
    cdef void* token = access_enter(life)
    cdef FrameStack* stack = life.frames
    cdef Py_ssize_t count = stack.abandoned if stack != NULL else 0
    cdef Py_ssize_t d
    held[0] = outermost[0] = 0
    for d in range(1, (load_depth(&stack.depth) if count else 0) + 1):
        if frame_level(stack, d).abandoned and load_ssize(&frame_level(stack, d).exports):
            held[0] += 1
            if not outermost[0]:
                outermost[0] = d
    access_exit(token)
    return count


# -- mark and rewind under the lock (every caller: the C API's slow path and the Python methods) ---

cdef int slicing_mark(ArenaCore* core, bint frame, ArenaMark* out, bint exclusive) noexcept nogil:
    """Push a mark (``frame``: a frame's level) in ``out``: ARENA_OK or an error code (see
    frames_push for ``exclusive``)."""
    cdef int err = slicing_lock(core)
    if err:
        return err
    cdef FrameStack* stack = _stack_of(core)
    err = ARENA_ENOMEM if stack == NULL else frames_push(core, stack, frame, out, exclusive)
    if err == FRAME_NEEDS_BLOCK:
        err = frames_push(core, stack, frame, out, exclusive) if _grow_stack(stack) else ARENA_ENOMEM
    slicing_unlock(core)
    return err


cdef int slicing_rewind(ArenaCore* core, const ArenaMark* mark, bint exit_frame,
                        bint with_gil) noexcept nogil:
    """Rewind to ``mark`` (see frames_rewind); a frame whose exit the rule refuses is abandoned.
    The caller keeps other threads' accesses out (exclusive_begin)."""
    cdef int err = slicing_lock(core)
    if err:
        return err
    cdef FrameStack* stack = core.life.frames
    err = frames_rewind(core, stack, mark, exit_frame, with_gil)
    if (exit_frame and (err == ARENA_EORDER or err == ARENA_EEXPORTED)):
        frames_abandon(stack, mark.depth)
    slicing_unlock(core)
    return err


# -- Python ------------------------------------------------------------------------------------------

cdef str _MARK_PROBLEMS = (
    "it is of another arena, or used up by a rewind to it or to an earlier mark, a reset or a close")


cdef int _raise_mark_error(SlicingArena arena, int err, str doing, Py_ssize_t depth=-1) except -1:
    """Raise for error ``err`` of a mark, rewind or frame; ``depth``: the level a rewind's mark is
    of, whose exported segments debug mode names."""
    if err == ARENA_ESTALEMARK:
        raise ValueError(f"cannot {doing}: {_MARK_PROBLEMS}")
    # A frame whose exit is refused is left all the same, with nothing rewound (_frame_leave).
    left = "leave the frame" == doing
    if err == ARENA_EORDER:
        raise ValueError(
            f"cannot {doing}: a frame entered after it is still open (frames must be left in the "
            "reverse order they were entered, which interleaved tasks on one thread break)"
            + ("; it is left with nothing rewound, and its segments die when that frame is left"
               if left else ""))
    cdef Py_ssize_t abandoned, held, outermost
    if err == ARENA_ELIMIT:
        abandoned = frames_abandoned(&arena._core.life, &held, &outermost)
        why = ""
        if held:
            why = (f"; {held} of them are frames whose exit was refused, kept until the buffer exports "
                   f"of their segments are released (the outermost held at depth {outermost}): "
                   "release those memoryviews, NumPy arrays ..., then leave or rewind below them")
        if abandoned > held:
            why += (f"; {abandoned - held} {'more' if held else 'of them'} are frames whose exit was "
                    "refused (left out of order, or held before), kept until the frames above them go")
        raise MemoryError(f"cannot {doing}: {FRAME_MAX_DEPTH} marks are open, the most a "
                          f"SlicingArena keeps{why}")
    if err == ARENA_EEXPORTED:
        raise BufferError(
            f"cannot {doing}: a buffer export (memoryview, NumPy array ...) of a segment it would "
            "kill is alive; " + ("it is left with nothing rewound, and its segments die at the first "
                                 "mark, rewind or frame exit after the export is released" if left
                                 else "release it first")
            + (exported_segments(arena, depth) if depth >= 0 else ""))
    return arena._raise(err, f"cannot {doing}")


cdef int _mark_checked(SlicingArena arena, bint frame, ArenaMark* out) noexcept:
    """A mark pushed as an access of the arena (as _allocate carves): another thread's close
    waits for it, and frees neither the stack it pushes on nor the carver record it holds under
    it (with the GIL off, a mark racing a close crashed).  Its error code."""
    cdef void* token = access_enter(&arena._core.life)  # (nothing for a thread's own arena)
    if frames_mark_fast(&arena._core, frame, out, thread_ident()) == ARENA_OK:
        access_exit(token)
        return ARENA_OK  # the common case: the arena is biased to this thread (no lock)
    # (With the GIL held, a push may let abandoned frames go: no Python access is under way.)
    cdef int err = arena_mark_checked(&arena._core, frame, out, not FREE_THREADED)
    while ((err == ARENA_EBUSY and not slicing_busy_for_good(&arena._core))
           or err == FRAME_NEEDS_EXCLUSIVE):
        # Another thread is carving: microseconds (as _allocate waits), out of the access so that
        # a close waiting for it goes first (it is then seen closed).  Or the push would let
        # abandoned frames go, which waits for other threads' accesses, as a rewind does: out of
        # this thread's own access too.
        access_exit(token)
        if err == FRAME_NEEDS_EXCLUSIVE:
            err = arena_mark_exclusive(&arena._core, frame, out)
            token = access_enter(&arena._core.life)
            continue
        arenalib_yield()
        token = access_enter(&arena._core.life)
        err = arena_mark_checked(&arena._core, frame, out, not FREE_THREADED)
    access_exit(token)
    return err


cdef int _rewind_checked(SlicingArena arena, const ArenaMark* mark, bint exit_frame) noexcept:
    """A rewind with no other thread's access of the arena's memory under way: its error code."""
    if frames_rewind_fast(&arena._core, mark, exit_frame, thread_ident(), True) == ARENA_OK:
        return ARENA_OK
    cdef int err = arena_rewind_checked(&arena._core, mark, exit_frame, True)
    while err == ARENA_EBUSY and not slicing_busy_for_good(&arena._core):  # (as _mark_checked)
        arenalib_yield()
        err = arena_rewind_checked(&arena._core, mark, exit_frame, True)
    return err


@cython.final
@cython.no_gc  # holds its arena only
cdef class Mark:
    """A carve position of a SlicingArena, from ``arena.mark()``, for ``arena.rewind(mark)``.

    Used up by the rewind to it, a rewind to an earlier mark, a reset or a close of its arena."""
    cdef ArenaMark _mark
    cdef SlicingArena _arena

    def __init__(self, *args, **kwargs):
        raise TypeError("Mark cannot be constructed directly; use SlicingArena.mark()")

    @property
    def arena(self):
        """The SlicingArena this mark belongs to."""
        return self._arena

    @property
    def valid(self):
        """True while ``arena.rewind(self)`` would be accepted as far as the mark goes."""
        if self._arena is None:  # made by Mark.__new__(Mark), not by a mark(): names no position
            return False
        cdef ArenaCore* core = &self._arena._core
        cdef void* token = access_enter(&core.life)
        cdef bint valid = core.open and frames_check_mark(core, core.life.frames, &self._mark) == ARENA_OK
        access_exit(token)
        return valid

    def __repr__(self):
        state = "valid" if self.valid else "used up"
        return f"<arenalib.Mark at depth {self._mark.depth} of SlicingArena {id(self._arena):#x}, {state}>"

    def __reduce__(self):
        raise TypeError("a Mark names a position in native memory and cannot be pickled")


cdef Mark arena_mark_object(SlicingArena arena):
    """SlicingArena.mark()."""
    cdef Mark mark = Mark.__new__(Mark)
    mark._arena = arena
    cdef int err = _mark_checked(arena, False, &mark._mark)
    if err:
        _raise_mark_error(arena, err, "mark")
    if arena._traced is not None:
        _sync_after_push(arena, &mark._mark, NULL)
    return mark


cdef int _sync_after_push(SlicingArena arena, const ArenaMark* mark, Py_ssize_t* frame_state) except -1:
    """Untrack the blocks of the abandoned frames a push let go of.  Should that fail (MemoryError),
    the push is undone before the error propagates: its caller gets no mark, or no frame to leave
    (``frame_state``: the frame's, then left)."""
    try:
        arena._sync_traced()
    except BaseException:
        _rewind_checked(arena, mark, frame_state != NULL)
        if frame_state != NULL:
            store_frame_state(frame_state, FRAME_LEFT)
        raise
    return 0


cdef int arena_rewind_object(SlicingArena arena, object mark) except -1:
    """SlicingArena.rewind(mark)."""
    if not isinstance(mark, Mark):
        raise TypeError(f"rewind() takes a Mark from SlicingArena.mark(), not {type(mark).__name__}")
    cdef Mark m = <Mark>mark
    if m._arena is not arena:
        raise ValueError("cannot rewind: the mark is of another arena")
    cdef int err = _rewind_checked(arena, &m._mark, False)
    if err == ARENA_ESTALEMARK:
        # (A mark of this arena, told apart by its generation: the one it was made in, or not.)
        raise ValueError("cannot rewind: the mark is used up, by " + (
            "a rewind to it or to an earlier mark" if m._mark.generation == life_generation(&arena._core.life)
            else "a reset or close of its arena"))
    if err:
        _raise_mark_error(arena, err, "rewind", m._mark.depth)
    arena._sync_traced()
    return 0


cdef enum:
    FRAME_NEW = 0
    FRAME_ENTERED = 1
    FRAME_LEFT = 2
    FRAME_BUSY = 3      # being entered or left by one thread: no other may enter or leave it now

cdef extern from "arenalib/platform.h":
    # A frame's state is published with release once its mark is written, and read with acquire.
    Py_ssize_t load_frame_state "arenalib_load_acquire"(Py_ssize_t* state) noexcept nogil
    void store_frame_state "arenalib_store_release"(Py_ssize_t* state, Py_ssize_t value) noexcept nogil


cdef inline bint _frame_claim(Frame frame, Py_ssize_t expected) noexcept:
    """Move ``frame`` from ``expected`` to FRAME_BUSY, for one thread only (two threads entering
    one frame at once on a free-threaded build both pushed a level, one left on the stack)."""
    cdef bint claimed
    with cython.critical_section(frame):
        claimed = load_frame_state(&frame._state) == expected
        if claimed:
            store_frame_state(&frame._state, FRAME_BUSY)
    return claimed


@cython.final
@cython.freelist(64)  # a frame per operation: made and dropped as often as its segments
@cython.no_gc  # holds its arena only
cdef class Frame:
    """``with arena.frame() as f:`` marks on entry and rewinds on exit: every segment carved in the
    frame dies (its use raises ArenaClosedError), the memory is carved again.  Frames nest; only the
    innermost may be left (an exit out of order, or while an export of one of its segments lives,
    is refused and leaves the frame abandoned: it goes with a later rewind below it, or with the
    next mark or frame exit once nothing holds it).  A frame is entered once.  ``f.allocate()``
    allocates in the frame."""
    cdef ArenaMark _mark
    cdef SlicingArena _arena
    # FRAME_NEW, FRAME_ENTERED, FRAME_LEFT, FRAME_BUSY: read and set atomically, as a Frame object
    # may be in other threads' hands (3.13t) while its thread enters or leaves it.
    cdef Py_ssize_t _state

    def __init__(self, *args, **kwargs):
        raise TypeError("Frame cannot be constructed directly; use SlicingArena.frame()")

    @property
    def arena(self):
        """The SlicingArena the frame carves from."""
        return self._arena

    def __enter__(self):
        """Push the frame's mark on its arena's stack: ValueError for a frame entered before."""
        if self._arena is None:  # made by Frame.__new__(Frame): every other method needs an entry
            raise TypeError("this Frame belongs to no arena; make frames with SlicingArena.frame()")
        if not _frame_claim(self, FRAME_NEW):
            raise ValueError("a frame is entered once; make a new one with arena.frame()")
        cdef int err = _mark_checked(self._arena, True, &self._mark)
        store_frame_state(&self._state, FRAME_NEW if err else FRAME_ENTERED)
        if err:
            _raise_mark_error(self._arena, err, "enter a frame")
        if self._arena._traced is not None:
            _sync_after_push(self._arena, &self._mark, &self._state)
        return self

    def __exit__(self, exc_type, exc, tb):
        """Leave the frame: rewind to its mark.  An exception of the block propagates unchanged,
        with a refused exit noted on it; with none, the refusal raises."""
        # The with statement's call (three positional arguments) goes to _frame_exit() straight
        # (src/entries.h); this wrapper serves every other call.
        return _frame_exit(self, exc)

    def __repr__(self):
        if self._arena is None:
            return "<arenalib.Frame of no arena>"
        cdef Py_ssize_t state = load_frame_state(&self._state)
        # (Being entered, its depth is not written yet.)
        where = f" at depth {self._mark.depth}" if state == FRAME_ENTERED or state == FRAME_LEFT else ""
        said = {FRAME_NEW: "not entered", FRAME_ENTERED: "open", FRAME_LEFT: "left"}.get(
            state, "being entered or left")
        return f"<arenalib.Frame{where} of SlicingArena {id(self._arena):#x}, {said}>"

    def allocate(self, size, *, zero=True, align=None):
        """A new Segment in this frame (as SlicingArena.allocate()); the frame must be the
        innermost level of marks: no frame or mark made after it open."""
        # allocate(size) and allocate(size, zero=z) go to _frame_allocate() straight (src/entries.h).
        return self._allocate(size, zero, align)

    cdef Segment _allocate(self, size, zero, align):
        if load_frame_state(&self._state) != FRAME_ENTERED:
            raise ValueError("allocate() of a frame that is not open")
        cdef bint fill = parse_flag(zero, "zero")  # (the flags first, as ArenaBase.allocate())
        cdef size_t alignment = 1 if align is None else parse_align(align)
        return self._arena._allocate(_parse_size(size, "size"), fill, alignment, &self._mark, NULL, -1)

    def __reduce__(self):
        raise TypeError("a Frame cannot be pickled")


cdef enum:
    FRAME_NOT_OPEN = -1000  # _frame_leave(): the frame was never entered, or was left


cdef object _frame_exit(object obj, object exc):
    """Frame.__exit__(): leave the frame (_frame_leave).  A refusal raises, unless the block
    raises already: its exception then propagates with the refusal noted on it (as Segment's and
    ArenaBase's __exit__ do with a failed free or close)."""
    cdef Frame self = <Frame>obj
    cdef int err = _frame_leave(self)
    if err:
        return _frame_exit_refused(self, err, exc)
    self._arena._sync_traced()
    return False


cdef object _frame_exit_refused(Frame self, int err, object exc):
    """_frame_exit() of a refused exit (out of the common path: its try block costs there)."""
    if not isinstance(exc, BaseException) or isinstance(exc, GeneratorExit):
        # No exception of the block (or a call by hand with something else), or a generator's
        # close(), which swallows GeneratorExit and its notes.
        _raise_leave_error(self, err)
    try:
        _raise_leave_error(self, err)
    except Exception as leave_error:
        _add_note(exc, f"and leaving the frame failed: {leave_error!r}")
    return False


cdef int _frame_leave(Frame self) noexcept:
    """Rewind to the frame's mark: ARENA_OK, or an error code (FRAME_NOT_OPEN ...).  A frame whose
    exit the rule refuses is left abandoned (see _frames.pxd)."""
    if load_frame_state(&self._state) != FRAME_ENTERED:  # (never, for a Frame of no arena)
        return FRAME_NOT_OPEN
    cdef ArenaCore* core = &self._arena._core
    cdef int err = ARENA_OK
    if owned_by_another(&core.life):
        return ARENA_EWRONGTHREAD  # before reading what its owner moves with no lock
    if not _frame_claim(self, FRAME_ENTERED):  # (another thread is leaving it, or left it)
        return FRAME_NOT_OPEN
    # A reset or close since made everything in it dead already: nothing to rewind.  So does one
    # of another thread that lands as the rewind runs (with the GIL off), which then finds the
    # mark used up or the arena closed.
    if core.open and self._mark.generation == life_generation(&core.life):
        err = _rewind_checked(self._arena, &self._mark, True)
        if ((err == ARENA_ESTALEMARK or err == ARENA_ECLOSED)
                and (not core.open or self._mark.generation != life_generation(&core.life))):
            err = ARENA_OK
    # Left unless the call could not judge it (another thread's confined arena, ...): a frame
    # the rule refused is abandoned, and goes with the next rewind below it.
    if err == ARENA_OK or err == ARENA_EORDER or err == ARENA_EEXPORTED or err == ARENA_ESTALEMARK:
        store_frame_state(&self._state, FRAME_LEFT)
    else:
        store_frame_state(&self._state, FRAME_ENTERED)
    return err


cdef int _raise_leave_error(Frame self, int err) except -1:
    if err == FRAME_NOT_OPEN:
        raise ValueError("this frame is not open")
    if err == ARENA_EWRONGTHREAD:
        raise _wrong_thread_error(self._arena)
    return _raise_mark_error(self._arena, err, "leave the frame", self._mark.depth)


cdef object _frame_allocate(object obj, object size, object zero):
    """Frame.allocate(size) and Frame.allocate(size, zero=z)."""
    return (<Frame>obj)._allocate(size, zero, None)


cdef bint frame_is_innermost(Lifetime* life, const ArenaMark* frame) noexcept nogil:
    """Whether ``frame``'s level is the innermost level of marks (Frame.allocate() carves there: a
    carve under a plain mark made after the frame would die at that mark's rewind).  Read
    with no lock, while another thread may push or pop on a shared arena: the caller read the
    stack's version before, and carves again if it moved (SlicingArena._allocate)."""
    cdef FrameStack* stack = load_frames(&life.frames)
    return (stack != NULL and frame.generation == life_generation(life)
            and load_ssize(&stack.top_frame) == frame.depth
            and frame.depth == load_depth(&stack.depth)
            and load_u64(&frame_level(stack, frame.depth).stamp) == frame.serial)


cdef Frame arena_frame_object(SlicingArena arena):
    """SlicingArena.frame(): a frame, entered by its with-statement."""
    cdef Frame frame = Frame.__new__(Frame)
    frame._arena = arena
    return frame


# -- each thread's frame arena -----------------------------------------------------------------------

cdef str _FRAMES_KEY = "arenalib._frames"
cdef size_t FRAME_CHUNK_SIZE = 64 * 1024


cdef extern from "Python.h":
    # Unique in the interpreter (a Cython module loads into one interpreter of a process only).
    uint64_t PyThreadState_GetID(PyThreadState* state) noexcept nogil

# With the GIL: the thread state that last asked for its frame arena (by its id: an address may
# be reused by the next thread's state), and its holder (borrowed: the holder forgets itself here
# as it goes), so that a thread's frames after the first skip the dict lookup.
cdef uint64_t _last_thread_state = 0
cdef PyObject* _last_frames = NULL


@cython.final
@cython.no_gc
cdef class _ThreadFrames:
    """The value of a thread-state dict's _FRAMES_KEY: the thread's frame arena, closed with it."""
    cdef SlicingArena arena
    cdef pid_t pid  # the process that made it: in a fork's child, its thread is gone

    def __dealloc__(self):
        global _last_thread_state, _last_frames
        if _last_frames == <PyObject*>self:
            _last_frames = NULL
            _last_thread_state = 0
        cdef SlicingArena arena = self.arena
        # The thread is ending, or its state is cleared by another thread (in a fork's child, or at
        # the interpreter's exit, where the thread no longer runs): its arena closes, deferred while
        # an export of one of its segments is alive (the last one's release frees the memory).
        if arena is None or not arena._core.open:
            return
        if load_life_owner(&arena._core.life.owner) != thread_ident():
            if self.pid == getpid() and not interpreter_finalizing():
                # Its thread may still run (its state cleared, or this object handed over, by code
                # of its own): only the owner may close an arena it may be touching, with no export
                # counted for that (Segment._pin).  Closing here let a free-threaded owner write
                # into memory another arena had been given (helper 55).  Left to the owner's own
                # close, or to the arena's last reference (a ResourceWarning then, as unclosed).
                return
            # From a thread that no longer runs, taken over to be closed: from one owner to another,
            # every other thread is refused all along.
            store_life_owner(&arena._core.life.owner, thread_ident())
        # The close makes the arena no thread's, last (_core_shut): a thread that cleared the owner
        # first let another thread, spinning on one of its segments, read the owner in its access
        # announcement (no record: the close did not wait for it) and 0 in its check, and write
        # into the memory as the close freed it.
        if arena_close_checked(&arena._core, True) == ARENA_OK:
            arena._untrack_all()


cdef SlicingArena _thread_frame_arena(object chunk_size):
    """The calling thread's frame arena, made on first use (or after its close)."""
    cdef SlicingArena arena
    cdef Py_ssize_t size = -1  # (none asked for)
    if chunk_size is not None:
        # First: its __index__ may use (or close) this thread's frame arena.
        size = _parse_size(chunk_size, "chunk_size")
    elif (not FREE_THREADED and _last_frames != NULL
            and _last_thread_state == PyThreadState_GetID(PyThreadState_Get())):
        arena = (<_ThreadFrames>_last_frames).arena
        if arena._core.open:
            return arena
    cdef PyObject* state_dict = PyThreadState_GetDict()
    if state_dict == NULL or arenalib_thread_state_ending():
        raise RuntimeError("this thread has no thread state to keep a frame arena in")
    cdef dict state = <dict>state_dict
    cdef _ThreadFrames frames = state.get(_FRAMES_KEY)
    if frames is not None and frames.arena._core.open:
        return _kept_frame_arena(frames, size)
    arena = SlicingArena(chunk_size=FRAME_CHUNK_SIZE if size < 0 else size)
    arena._core.life.owner = thread_ident()  # confined: only this thread uses it or its segments
    if frames is None:
        frames = _ThreadFrames.__new__(_ThreadFrames)
        frames.pid = getpid()
    # The objects made above may have started a GC whose finalizer asked for this thread's frame
    # arena: the one that call made stands (replacing it would close it under its segments).
    cdef _ThreadFrames made = state.get(_FRAMES_KEY)
    if made is not None and made.arena is not None and made.arena._core.open:
        arena.close()
        return _kept_frame_arena(made, size)
    state[_FRAMES_KEY] = frames
    frames.arena = arena
    _remember_frames(frames)
    return arena


cdef SlicingArena _kept_frame_arena(_ThreadFrames frames, Py_ssize_t size):
    """The thread's open frame arena in ``frames``, if ``size`` (-1: any) is its chunk size."""
    cdef SlicingArena arena = frames.arena
    if size >= 0 and size != <Py_ssize_t>arena._core.slicing.chunk_size:
        raise ValueError(
            f"this thread's frame arena has chunk_size={arena._core.slicing.chunk_size} already "
            "(it is chosen by the call that makes the arena: the thread's first, or the first after "
            "its close)")
    _remember_frames(frames)
    return arena


cdef inline void _remember_frames(_ThreadFrames frames) noexcept:
    global _last_thread_state, _last_frames
    if not FREE_THREADED:
        _last_thread_state = PyThreadState_GetID(PyThreadState_Get())
        _last_frames = <PyObject*>frames


def frame_arena(*, chunk_size=None):
    """The calling thread's frame arena: a SlicingArena confined to the thread, made on first use
    (or the first after its close) with ``chunk_size`` (default 64 KiB; a later call asking for
    another raises ValueError), closed when the thread ends.  arenalib.frame() pushes frames on it."""
    return _thread_frame_arena(chunk_size)


def frame():
    """A frame of the calling thread's frame arena: ``with arenalib.frame() as f:
    buf = f.allocate(64, zero=False)``; every segment of it dies at the with-block's end."""
    return _frame_new(None)


cdef object _frame_new(object module):
    """frame(); called by src/entries.h's twin of it (what start-up puts in its place)."""
    return arena_frame_object(_thread_frame_arena(None))
