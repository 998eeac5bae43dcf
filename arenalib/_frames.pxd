# cython: language_level=3
# A SlicingArena's marks and frames, their inline rule: push a mark, rewind to one, and the O(1)
# liveness test of a segment carved under a mark.  The rest (the stack's blocks, the locks around
# these, the Python Mark and Frame, arenalib.frame()) is arenalib/_frames.pxi.
#
# The stack: a mark pushes level d (1 = outermost), which records where carving stood, the books
# then, and the stamp that segments carved in it get, (serial << FRAME_DEPTH_BITS) | d; a segment
# carved with no mark open gets stamp 0.  The mark holds that stamp too: it is valid while level d
# is pushed and still has it.  A rewind to the mark of level d renews the stamps of levels d and
# above (their segments and marks die: an O(1) test each, no list of segments anywhere), pops them
# and puts the cursor back: the mark is used up, and so is every mark made after it.  A frame
# (`with arena.frame():`) is a mark that only the innermost open frame may rewind to, at its exit;
# a frame whose exit is refused is abandoned, and goes with the next rewind below it (or, once
# nothing above it is open and none of its segments is exported, with the next mark).  A segment's
# stamp is read before its carve and the stack's serial after it: a mark or rewind in between (of
# another thread, or through the C API without the GIL) makes the carve's level unknown, and the
# caller carves again.
#
# Two paths: frames_mark_fast() and frames_rewind_fast() are straight-line code for the common case
# (the calling thread is the one the arena is biased to; a push with the level's block made and no
# abandoned frame; a rewind to the innermost level, of the kind asked for, nothing of it exported,
# carving in the chunk it was made in), each thing computed once.  Everything else, and every refusal,
# is the general frames_push() and frames_rewind(), under the busy lock (_frames.pxi).

from libc.stdint cimport uint64_t

from arenalib._abi cimport (
    FRAME_BLOCK_LEVELS, FRAME_BLOCK_SHIFT, FRAME_DEPTH_BITS, FRAME_MAX_DEPTH, FREE_THREADED, ArenaCore,
    CarverRecord, FrameLevel, FrameStack, Lifetime, SlicingState, load_frames, load_life_owner,
    load_ssize, load_u64, store_ssize, store_u64,
)
from arenalib._slicing cimport biased_begin, biased_end
from arenalib._table cimport (
    ARENA_EEXPORTED, ARENA_ELIMIT, ARENA_EORDER, ARENA_ESTALEMARK, ARENA_OK, ArenaMark,
)

cdef extern from "arenalib/platform.h":
    # The depth is read by other threads (a carve's stamp): published with release, read with
    # acquire (a level's block is made before the depth reaches it).
    Py_ssize_t load_depth "arenalib_load_acquire"(Py_ssize_t* depth) noexcept nogil
    void store_depth "arenalib_store_release"(Py_ssize_t* depth, Py_ssize_t value) noexcept nogil
    # The stack's serial, its version: stored last by every mark and rewind, with release, and read
    # first by a carve, with acquire, so that a carve that reads the new version reads the depth
    # and stamps that go with it.  (Stored before the depth, a carve read the new version with the
    # old depth, took the stamp of the level below the new mark, and its check after the carve
    # passed: the segment outlived that mark's rewind, and the next carve overwrote it.)
    uint64_t load_version "arenalib_load_acquire"(uint64_t* serial) noexcept nogil
    void store_version "arenalib_store_release"(uint64_t* serial, uint64_t value) noexcept nogil

cdef enum:
    FRAME_NEEDS_BLOCK = -1    # frames_push(): the level's block is not made yet (the slow path makes it)
    FRAME_SLOW = -1           # frames_mark_fast(), frames_rewind_fast(): take the locked path
    # frames_rewind(), frames_push() on a GIL build: it would kill Python-level carves, and the
    # caller may not hold the GIL (see FrameLevel)
    FRAME_NEEDS_GIL = -2
    # frames_push() with the GIL off: it would let abandoned frames go, which waits for other
    # threads' accesses as a rewind does
    FRAME_NEEDS_EXCLUSIVE = -3


cdef inline FrameLevel* frame_level(FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """Level ``depth`` (from 1) of the stack; its block must exist."""
    # Unsigned shift and mask, whatever cdivision the including module compiles with: signed
    # division costs a dozen instructions per level, on every mark, rewind and liveness check.
    cdef size_t index = <size_t>(depth - 1)
    return &stack.blocks[index >> FRAME_BLOCK_SHIFT][index & (FRAME_BLOCK_LEVELS - 1)]


cdef inline FrameLevel* frame_level_now(Lifetime* life, uint64_t* version) noexcept nogil:
    """The level a segment carved now lands in (the innermost, NULL with no mark open), and in
    ``version`` the stack's serial, to compare with frames_version() after the carve."""
    cdef FrameStack* stack = load_frames(&life.frames)
    if stack == NULL:
        version[0] = 0
        return NULL
    version[0] = load_version(&stack.serial)
    cdef Py_ssize_t depth = load_depth(&stack.depth)
    return frame_level(stack, depth) if depth else NULL


cdef inline uint64_t frame_stamp_now(Lifetime* life, uint64_t* version) noexcept nogil:
    """The stamp of a segment carved now (its level's, 0 with no mark open): frame_level_now()."""
    cdef FrameLevel* level = frame_level_now(life, version)
    return load_u64(&level.stamp) if level != NULL else 0


cdef inline uint64_t frames_version(Lifetime* life) noexcept nogil:
    """Moved by every mark and rewind: unchanged across a carve, the stamp read before it holds."""
    cdef FrameStack* stack = load_frames(&life.frames)
    return load_version(&stack.serial) if stack != NULL else 0


cdef inline Py_ssize_t frame_stamp_depth(uint64_t stamp) noexcept nogil:
    """The depth of the level a stamp is of."""
    return <Py_ssize_t>(stamp & ((1 << FRAME_DEPTH_BITS) - 1))


cdef inline bint frame_stamp_alive(Lifetime* life, uint64_t stamp) noexcept nogil:
    """Whether a segment of ``stamp`` (whose arena's generation is still its own) is alive."""
    if stamp == 0:
        return True
    cdef FrameStack* stack = load_frames(&life.frames)
    return stack != NULL and load_u64(&frame_level(stack, frame_stamp_depth(stamp)).stamp) == stamp


cdef inline FrameLevel* frame_level_of(Lifetime* life, uint64_t stamp) noexcept nogil:
    """The level a segment of ``stamp`` was carved in (NULL for stamp 0): where its exports count.
    The stack outlives every segment's exports (a close while they live keeps it: _frames.pxi)."""
    if stamp == 0:
        return NULL
    return frame_level(life.frames, frame_stamp_depth(stamp))


# -- push ------------------------------------------------------------------------------------------

cdef inline void _push(ArenaCore* core, FrameStack* stack, bint frame, ArenaMark* out) noexcept nogil:
    """Push level depth + 1, whose block exists, and describe its mark in ``out``.  A level comes
    to a push with no export and not abandoned (a pop needs both: frames_pop_to)."""
    cdef Py_ssize_t depth = stack.depth + 1
    cdef FrameLevel* level = frame_level(stack, depth)
    cdef uint64_t serial = stack.serial + 1
    cdef uint64_t stamp = (serial << FRAME_DEPTH_BITS) | <uint64_t>depth
    store_u64(&level.stamp, stamp)
    level.chunk = core.slicing.current
    level.cursor = core.slicing.cursor
    level.live_bytes = core.books.live_bytes
    level.live_segments = core.books.live_segments
    level.python_carved = False
    if frame:
        level.outer_frame = stack.top_frame
        store_ssize(&stack.top_frame, depth)  # read unlocked by frame_is_innermost
    else:
        level.outer_frame = -1
    store_depth(&stack.depth, depth)
    store_version(&stack.serial, serial)  # (last: see store_version)
    out.arena = core.serial
    out.generation = core.life.generation
    out.serial = stamp
    out.depth = depth


cdef inline int frames_mark_fast(ArenaCore* core, bint frame, ArenaMark* out,
                                 unsigned long me) noexcept nogil:
    """Push a mark (``frame``: a frame's) in ``out`` with no lock and no atomic instruction: ARENA_OK,
    or FRAME_SLOW when the case is not the common one (the arena not biased to this thread, no
    stack yet, the level's block not made, an abandoned frame kept): the caller takes the locked
    path, which judges every refusal.  ``me``: the calling thread's identity (inline_ident() in a
    module of the C API)."""
    if core.self != core:
        return FRAME_SLOW  # a copy: the slow path says it is closed
    cdef CarverRecord* record = biased_begin(core, me)
    if record == NULL:
        return FRAME_SLOW
    cdef FrameStack* stack = core.life.frames
    cdef int err = FRAME_SLOW
    if stack != NULL and stack.depth < stack.push_limit:
        _push(core, stack, frame, out)
        err = ARENA_OK
    biased_end(record)
    return err


# -- rewind ----------------------------------------------------------------------------------------

cdef inline void frames_limit(FrameStack* stack) noexcept nogil:
    """Bring push_limit up to date (after a block was made, a frame abandoned or a pop)."""
    stack.push_limit = 0 if stack.abandoned else stack.levels


cdef inline void _carve_from(SlicingState* slicing, Py_ssize_t chunk, size_t cursor) noexcept nogil:
    """Put the carve position back where a mark found it (cursor 0: before any chunk, so from the
    start of the first one, made after the mark)."""
    if cursor == 0:
        chunk = 0
        cursor = <size_t>slicing.chunks[0] if slicing.nchunks else 0
    slicing.current = chunk
    slicing.cursor = cursor
    slicing.cursor_end = (<size_t>slicing.chunks[chunk] + slicing.chunk_sizes[chunk]
                          if slicing.nchunks else 0)


cdef inline void _settle_rewind(ArenaCore* core, FrameLevel* level) noexcept nogil:
    """The books back to the mark's; what was carved since folds into the totals (see
    slicing_settle)."""
    cdef Py_ssize_t live = core.books.live_bytes
    if live > core.books.peak_bytes:
        core.books.peak_bytes = live
    core.books.allocated_total += <size_t>(live - level.live_bytes)
    core.books.live_bytes = level.live_bytes
    core.books.live_segments = level.live_segments


cdef inline void frames_pop_to(ArenaCore* core, FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """Pop levels ``depth`` and above (their segments die), carving again from level ``depth``'s
    mark.  None of them may hold an export."""
    cdef FrameLevel* level = frame_level(stack, depth)
    cdef FrameLevel* popped
    cdef uint64_t serial = stack.serial
    cdef Py_ssize_t d
    for d in range(depth, stack.depth + 1):
        popped = frame_level(stack, d)
        serial += 1
        store_u64(&popped.stamp, (serial << FRAME_DEPTH_BITS) | <uint64_t>d)
        if popped.abandoned:
            popped.abandoned = False
            stack.abandoned -= 1
    _settle_rewind(core, level)
    _carve_from(&core.slicing, level.chunk, level.cursor)
    while stack.top_frame >= depth:  # the frames popped (its own, abandoned ones above it)
        store_ssize(&stack.top_frame, frame_level(stack, stack.top_frame).outer_frame)
    stack.rewinds += 1
    frames_limit(stack)
    store_depth(&stack.depth, depth - 1)
    store_version(&stack.serial, serial)


cdef inline int frames_rewind_fast(ArenaCore* core, const ArenaMark* mark, bint exit_frame,
                                   unsigned long me, bint with_gil) noexcept nogil:
    """Rewind to ``mark`` (``exit_frame``: a frame's, at its exit) with no lock and no atomic
    instruction: ARENA_OK, or FRAME_SLOW when the case is not the common one (see the top of this
    file): the caller takes the locked path, which judges every refusal.  With the GIL off, a
    rewind of an arena any thread may use waits for their accesses: always the locked path.  On a
    GIL build, so does one of a level Python carved in from a caller that may not hold the GIL
    (``with_gil`` false: the C API)."""
    if core.self != core or (FREE_THREADED and load_life_owner(&core.life.owner) == 0):
        return FRAME_SLOW
    cdef CarverRecord* record = biased_begin(core, me)
    if record == NULL:
        return FRAME_SLOW
    cdef FrameStack* stack = core.life.frames
    cdef Py_ssize_t depth
    cdef FrameLevel* level
    cdef uint64_t serial
    cdef int err = FRAME_SLOW
    # The mark is of this open arena and generation (frames_check_mark()'s test, in another
    # order), its level is the innermost (so no frame is open above it) and still has the stamp the
    # mark holds, and is a frame's for exit_frame and no frame's otherwise (so not abandoned).
    if (stack != NULL and mark.depth == stack.depth and mark.depth != 0
            and mark.arena == core.serial and mark.generation == core.life.generation):
        depth = mark.depth
        level = frame_level(stack, depth)
        if (level.stamp == mark.serial and (stack.top_frame == depth) == exit_frame
                and load_ssize(&level.exports) == 0
                and (FREE_THREADED or with_gil or not (level.python_carved or stack.abandoned))
                and ((level.cursor != 0 and level.chunk == core.slicing.current)
                     or level.cursor == core.slicing.cursor)):  # (nothing carved since)
            serial = stack.serial + 1
            store_u64(&level.stamp, (serial << FRAME_DEPTH_BITS) | <uint64_t>depth)
            _settle_rewind(core, level)
            core.slicing.cursor = level.cursor  # (the chunk and its end are the mark's)
            if exit_frame:
                store_ssize(&stack.top_frame, level.outer_frame)
            stack.rewinds += 1
            store_depth(&stack.depth, depth - 1)
            store_version(&stack.serial, serial)
            if stack.abandoned:
                _pop_abandoned(core, stack)  # (as frames_rewind() does: refused frames under it)
            err = ARENA_OK
    biased_end(record)
    return err


# -- the general rule (under the busy lock or the bias: _frames.pxi) --------------------------------

cdef inline bint _exported_from(FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """Whether a segment of level ``depth`` or above is exported (a release may run meanwhile)."""
    cdef Py_ssize_t d
    for d in range(depth, stack.depth + 1):
        if load_ssize(&frame_level(stack, d).exports):
            return True
    return False


cdef inline int _abandoned_to_pop(FrameStack* stack) noexcept nogil:
    """What _pop_abandoned() would let go: 0 nothing, 1 levels of C's carves alone, 2 a level a
    Python-level carve was made in."""
    cdef Py_ssize_t d = stack.depth
    cdef Py_ssize_t top = stack.top_frame
    cdef FrameLevel* level
    cdef int found = 0
    while stack.abandoned and top == d and d > 0:
        level = frame_level(stack, d)
        if not level.abandoned or load_ssize(&level.exports):
            break
        if level.python_carved:
            return 2
        found = 1
        top = level.outer_frame
        d -= 1
    return found


cdef inline void _pop_abandoned(ArenaCore* core, FrameStack* stack) noexcept nogil:
    """Let go of abandoned frames that nothing open lies above and no export holds."""
    cdef FrameLevel* level
    while stack.abandoned and stack.top_frame == stack.depth:
        level = frame_level(stack, stack.depth)
        if not level.abandoned or load_ssize(&level.exports):
            return
        frames_pop_to(core, stack, stack.depth)


cdef inline int frames_push(ArenaCore* core, FrameStack* stack, bint frame, ArenaMark* out,
                            bint exclusive) noexcept nogil:
    """Mark the carve position in ``out`` (``frame``: a frame's mark), letting the abandoned frames
    on top go first.  A pop kills segments, as a rewind does: without ``exclusive`` (the GIL held
    on a GIL build, other threads' accesses waited out with it off) a push that would pop is
    refused with FRAME_NEEDS_GIL or FRAME_NEEDS_EXCLUSIVE (levels of C's carves alone pop on a GIL
    build).  The caller holds the arena's busy lock or bias."""
    cdef int pops
    if stack.abandoned and not exclusive:
        pops = _abandoned_to_pop(stack)
        if FREE_THREADED and pops:
            return FRAME_NEEDS_EXCLUSIVE
        if not FREE_THREADED and pops == 2:
            return FRAME_NEEDS_GIL
    _pop_abandoned(core, stack)
    if stack.depth == FRAME_MAX_DEPTH:
        return ARENA_ELIMIT
    if stack.depth >= stack.levels:  # (blocks are made in order)
        return FRAME_NEEDS_BLOCK
    _push(core, stack, frame, out)
    return ARENA_OK


cdef inline int frames_check_mark(ArenaCore* core, FrameStack* stack,
                                  const ArenaMark* mark) noexcept nogil:
    """ARENA_OK when ``mark`` is one of this open arena's that no reset, close or rewind (to it or
    to an earlier mark) has used up."""
    if (stack == NULL or mark.arena != core.serial or mark.generation != core.life.generation
            or mark.depth < 1 or mark.depth > stack.depth
            or frame_level(stack, mark.depth).stamp != mark.serial):
        return ARENA_ESTALEMARK
    return ARENA_OK


cdef inline Py_ssize_t _open_frame_above(FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """The depth of the innermost frame above ``depth`` that is open and not abandoned (0: none)."""
    cdef Py_ssize_t top = stack.top_frame
    while top > depth:
        if not frame_level(stack, top).abandoned:
            return top
        top = frame_level(stack, top).outer_frame
    return 0


cdef inline bint _python_carved_from(FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """Whether a Python-level carve was made in level ``depth`` or above, or in an abandoned frame's
    level below it (which the rewind may let go too)."""
    cdef Py_ssize_t d
    cdef FrameLevel* level
    for d in range(1 if stack.abandoned else depth, stack.depth + 1):
        level = frame_level(stack, d)
        if level.python_carved and (d >= depth or level.abandoned):
            return True
    return False


cdef inline int frames_rewind(ArenaCore* core, FrameStack* stack, const ArenaMark* mark,
                              bint exit_frame, bint with_gil) noexcept nogil:
    """Kill every segment carved since ``mark`` and carve from there again; the mark and those
    after it are used up.  ``exit_frame``: the mark must be a frame's.  Changes nothing when it
    refuses: a stale mark, a frame entered after the mark still open (ARENA_EORDER), a live export
    of a segment it would kill; FRAME_NEEDS_GIL on a GIL build without ``with_gil`` when it would
    kill a Python-level carve.  The caller holds the arena's busy lock or bias and (with the GIL
    off) keeps other threads' accesses out."""
    cdef int err = frames_check_mark(core, stack, mark)
    if err:
        return err
    if exit_frame and frame_level(stack, mark.depth).outer_frame < 0:
        return ARENA_ESTALEMARK  # not a frame's mark
    if _open_frame_above(stack, mark.depth):
        return ARENA_EORDER
    if not FREE_THREADED and not with_gil and _python_carved_from(stack, mark.depth):
        return FRAME_NEEDS_GIL  # (before the exports: a Python read's pin counts as one)
    if _exported_from(stack, mark.depth):
        return ARENA_EEXPORTED
    frames_pop_to(core, stack, mark.depth)
    # Frames under it whose exits were refused while it was open go with it: left already, they are
    # the innermost now, and a carve made with no frame open would land in their level (and die
    # when the next mark popped them).
    _pop_abandoned(core, stack)
    return ARENA_OK


cdef inline void frames_abandon(FrameStack* stack, Py_ssize_t depth) noexcept nogil:
    """The frame of level ``depth`` had its exit refused: a rewind below it pops it."""
    cdef FrameLevel* level = frame_level(stack, depth)
    if not level.abandoned:
        level.abandoned = True
        stack.abandoned += 1
        frames_limit(stack)
