# The entry points of every operation, and the only kind switches of arenalib's own code: each
# operation checks its arguments and the core once, then switches once on the kind to that kind's
# rule (_confined.pxi, _shared.pxi, _slicing.pxi).  The Python classes and the C API (the function
# tables of arenalib._arena._C_API and _C_TABLE) both call these, so each rule is written once.  The
# inline fast paths' one switch, their open, is arenalib/_dispatch.pxd.

from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.stdint cimport uint64_t

from arenalib._abi cimport (
    FREE_THREADED, ArenaCore, ArenaSlot, Books, core_init, life_next_generation,
    load_flag, owned_by_another, store_flag, store_life_owner,
)
from arenalib._confined cimport close_small_scope, confined_init
from arenalib._slicing cimport slicing_books
from arenalib._table cimport ArenaMark
from arenalib._table cimport (
    ARENA_ECLOSED, ARENA_EEXPORTED, ARENA_EINVAL, ARENA_ENOMEM, ARENA_EUNSUPPORTED, ARENA_EWRONGTHREAD,
    ARENA_KIND_CONFINED, ARENA_KIND_SHARED, ARENA_KIND_SLICING, ARENA_OK,
)

# Largest alignment accepted: huge pages (2 MiB) and well beyond, far below what would make
# jemalloc's size arithmetic overflow.
cdef size_t MAX_ALIGN = 1 << 30
cdef size_t MAX_SIZE = <size_t>PY_SSIZE_T_MAX
cdef size_t PAGE = 4096


cdef inline bint over_limit(ArenaCore* core, size_t size) noexcept nogil:
    """``size`` more bytes would take an arena counted in core.books past its max_bytes (a shared
    arena reserves against the limit with compare-and-swap instead: see _shared.pxi)."""
    return core.max_bytes >= 0 and <Py_ssize_t>size > core.max_bytes - core.books.live_bytes


cdef inline void core_forget_live(ArenaCore* core) noexcept nogil:
    """Every segment of the core is dead: a new generation, nothing live in the books."""
    life_next_generation(&core.life)
    core.books.live_bytes = 0
    core.books.live_segments = 0


cdef inline int _usable(ArenaCore* core) noexcept nogil:
    """ARENA_OK when the calling thread may use the open ``core``; a copy of a core is closed."""
    if owned_by_another(&core.life):  # first: see Segment._status
        return ARENA_EWRONGTHREAD
    if not core.open or core.self != core:
        return ARENA_ECLOSED
    return ARENA_OK


# -- allocate and free -----------------------------------------------------------------------------

cdef int arena_allocate_slow(ArenaCore* core, size_t size, size_t align, bint zero,
                             void** out) noexcept nogil:
    """arena_allocate() for every kind and case (the inline fast path calls it)."""
    cdef int err = _usable(core)
    if err:
        return err
    if align & (align - 1) or align > MAX_ALIGN:
        return ARENA_EINVAL
    if size > MAX_SIZE:
        return ARENA_ENOMEM
    # Shared first: its every call comes here, where a confined arena's common case stays inline.
    if core.kind == ARENA_KIND_SHARED:
        return shared_allocate(core, size, align, zero, out)
    if core.kind == ARENA_KIND_CONFINED:
        return confined_allocate(core, size, align, zero, out)
    return slicing_allocate(core, size, align, zero, out)


cdef inline bint note_allocation(ArenaCore* core, void** anchor) noexcept nogil:
    """After a Python-level allocate: bring the arena's peak_bytes up to date (confined arenas do
    so as they count, SlicingArenas when they settle; a shared one sums its threads), and say
    whether the new segment may hold the calling thread's anchor in the arena's place: True for a
    shared Arena on a free-threaded build, with anchor[0] the thread's anchor (NULL: none yet)."""
    if core.kind == ARENA_KIND_SHARED:
        shared_update_peak(core)
        anchor[0] = arenalib_tls_anchor(core.serial)
        return FREE_THREADED
    return False


cdef inline void note_growth(ArenaCore* core) noexcept nogil:
    """After a Python-level resize that grew a block: peak_bytes up to date, as after an allocate
    (note_allocation)."""
    if core.kind == ARENA_KIND_SHARED:
        shared_update_peak(core)


cdef int arena_free_slow(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """arena_free() for every kind and case (the inline fast path calls it)."""
    cdef int err = _usable(core)
    if err:
        return err
    if core.kind == ARENA_KIND_SHARED:
        return shared_free(core, ptr, size)
    if core.kind == ARENA_KIND_CONFINED:
        return confined_free(core, ptr, size)
    return ARENA_EUNSUPPORTED


cdef int arena_resize_checked(ArenaCore* core, void* ptr, size_t old, size_t new, size_t align,
                              bint zero, uint64_t stamp, void** out) noexcept nogil:
    """Resize the live allocation ``ptr`` of ``old`` bytes, made at ``align`` (and, in a
    SlicingArena, under the level of marks of ``stamp``), to ``new`` bytes; out[0]: where it is
    now (``ptr`` when resized in place).  The caller keeps reset, close and other accesses out."""
    cdef int err = _usable(core)
    if err:
        return err
    if new > MAX_SIZE:
        return ARENA_ENOMEM
    if core.kind == ARENA_KIND_SHARED:
        return shared_resize(core, ptr, old, new, align, zero, out)
    if core.kind == ARENA_KIND_CONFINED:
        return confined_resize(core, ptr, old, new, align, zero, out)
    return slicing_resize(core, ptr, old, new, align, zero, stamp, out)


# -- reset -------------------------------------------------------------------------------------------

cdef int arena_reset_checked(ArenaCore* core) noexcept nogil:
    """Free every allocation at once and keep the arena open, once no other thread's Python-level
    access of it is under way (see _access.pxi)."""
    exclusive_begin(&core.life)
    cdef int err = _reset(core)
    exclusive_end(&core.life)
    return err


cdef int _reset(ArenaCore* core) noexcept nogil:
    cdef int err = _usable(core)
    if err:
        return err
    if count_read(&core.life.exports):
        return ARENA_EEXPORTED
    if core.kind == ARENA_KIND_SLICING:
        return slicing_reset(core)  # takes the busy lock: may refuse with ARENA_EBUSY
    if core.kind == ARENA_KIND_SHARED:
        shared_reset(core)
    else:
        confined_reset(core)
    return ARENA_OK


# -- marks -------------------------------------------------------------------------------------------

cdef int arena_mark_checked(ArenaCore* core, bint frame, ArenaMark* out, bint exclusive) noexcept nogil:
    """Push a mark (``frame``: a frame's): a SlicingArena's only.  ``exclusive``: the caller holds
    the GIL on a GIL build, or has other threads' accesses waited out with it off, so the push may
    let abandoned frames go (else FRAME_NEEDS_GIL or FRAME_NEEDS_EXCLUSIVE: see frames_push)."""
    cdef int err = _usable(core)
    if err:
        return err
    if core.kind != ARENA_KIND_SLICING:
        return ARENA_EUNSUPPORTED
    return slicing_mark(core, frame, out, exclusive)


cdef int arena_mark_exclusive(ArenaCore* core, bint frame, ArenaMark* out) noexcept nogil:
    """arena_mark_checked() once no other thread's Python-level access of the arena's memory is
    under way (as a rewind waits: the push lets abandoned frames go)."""
    exclusive_begin(&core.life)
    cdef int err = arena_mark_checked(core, frame, out, True)
    exclusive_end(&core.life)
    return err


cdef int arena_rewind_checked(ArenaCore* core, const ArenaMark* mark, bint exit_frame,
                              bint with_gil) noexcept nogil:
    """Rewind to ``mark`` (``exit_frame``: and pop the frame it is), once no other thread's
    Python-level access of the arena's memory is under way (see _access.pxi; ``with_gil``: the
    caller holds the GIL, else FRAME_NEEDS_GIL from a rewind that would kill a Python-level carve
    on a GIL build)."""
    exclusive_begin(&core.life)
    cdef int err = _usable(core)
    if not err:
        err = (slicing_rewind(core, mark, exit_frame, with_gil) if core.kind == ARENA_KIND_SLICING
               else ARENA_EUNSUPPORTED)
    exclusive_end(&core.life)
    return err


cdef int arena_mark_slow(ArenaCore* core, ArenaMark* out) noexcept nogil:
    """arena_mark() of the C API (the inline fast path calls it).  A push lets abandoned frames go
    (their segments die), which waits for other threads' accesses with the GIL off, and takes the
    GIL on a GIL build when Python carved in them, as arena_rewind_slow() does (helper 63: a C
    mark let a Python-carved frame go inside a Python read, which returned the next carve's bytes)."""
    cdef int err = arena_mark_checked(core, False, out, False)
    if err == FRAME_NEEDS_EXCLUSIVE:
        err = arena_mark_exclusive(core, False, out)
    elif err == FRAME_NEEDS_GIL:
        err = _mark_with_gil(core, out)
    return err


cdef int _mark_with_gil(ArenaCore* core, ArenaMark* out) noexcept nogil:
    cdef int err
    with gil:
        err = arena_mark_checked(core, False, out, True)
    return err


cdef int arena_rewind_slow(ArenaCore* core, const ArenaMark* mark) noexcept nogil:
    """arena_rewind() of the C API (the inline fast path calls it).  On a GIL build a Python thread
    holds the GIL alone while it uses a segment (access_enter is nothing there), so a rewind that
    kills segments carved from Python takes the GIL first, as arena_reset_slow() does for an Arena:
    without it, a rewind from a thread without the GIL landed inside a Python read, which returned
    the next carve's bytes (helper 62: 1-2 reads in 20,000 on 3.11).  Carves made in C alone (the
    levels no Python-level carve was made in) take no GIL."""
    cdef int err = arena_rewind_checked(core, mark, False, False)
    if err == FRAME_NEEDS_GIL:
        err = _rewind_with_gil(core, mark)
    return err


cdef int _rewind_with_gil(ArenaCore* core, const ArenaMark* mark) noexcept nogil:
    cdef int err
    with gil:
        err = arena_rewind_checked(core, mark, False, True)
    return err


# -- open and close ----------------------------------------------------------------------------------

cdef dict _KIND_NAMES = {ARENA_KIND_SHARED: "ARENA_KIND_SHARED", ARENA_KIND_CONFINED: "ARENA_KIND_CONFINED",
                         ARENA_KIND_SLICING: "ARENA_KIND_SLICING"}


cdef int arena_open_slow(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                         size_t chunk_size) except -1:
    """arena_open() for every kind and case (the inline fast path calls it)."""
    if core.open:
        raise ValueError("this ArenaCore is open already")
    if state_read(&core.life.release_pending) or count_read(&core.life.exports):
        # Closed deferred: its last open's memory is held by live exports, whose releases count
        # down this core's exports and then free that memory (core_release_held).
        raise BufferError(f"cannot open this ArenaCore: {count_read(&core.life.exports)} buffer "
                          "export(s) of its last open (closed deferred) are alive; release them first")
    if kind != ARENA_KIND_SHARED and kind != ARENA_KIND_CONFINED and kind != ARENA_KIND_SLICING:
        raise ValueError(f"kind must be one of ARENA_KIND_SHARED, _CONFINED, _SLICING, not {kind}")
    if core.arena_object != NULL and kind != core.kind:
        # An arena object's core opens again as its class only (the kind its __cinit__ set): its
        # methods, segments and NumPy scopes keep that kind's rules (a ConfinedArena opened shared
        # would hand its segments to other threads).
        raise ValueError(f"this ArenaCore is a {type(<object>core.arena_object).__name__}'s: it opens "
                         f"as {_KIND_NAMES[core.kind]} only, not {_KIND_NAMES[kind]}")
    cdef uint64_t serial
    cdef ArenaSlot* slot = slot_acquire(&serial)
    core_init(core, _inline_state, slot, kind, max_bytes, serial)
    if kind == ARENA_KIND_SHARED:
        shared_open(core)
    elif kind == ARENA_KIND_CONFINED:
        confined_init(core)
    else:
        slicing_open(core, chunk_size if chunk_size else DEFAULT_CHUNK_SIZE)
    core.open = True
    count_add(&_inline_state.arenas_opened, 1)
    return 0


cdef int arena_close_checked(ArenaCore* core, bint deferred=False) noexcept:
    """Close ``core`` if the calling thread may; an error code otherwise.  The one close path of
    the Python classes and of the C API.  While a buffer export is alive it refuses
    (ARENA_EEXPORTED), or with ``deferred`` closes holding the memory until the last export's
    release (core_close_holding).  On a free-threaded build it waits for other threads'
    Python-level accesses to end (see _access.pxi)."""
    if not load_flag(&core.open):  # unlocked: a rival close may be storing it
        return ARENA_OK
    # Decided once: the close makes an owned arena no thread's, and an end decided again after it
    # would let go of a lock this close never took (another thread's, on the closed arena).
    cdef bint exclusive = _any_thread(&core.life)
    if exclusive:
        exclusive_begin(&core.life)
    cdef int err = ARENA_OK
    cdef bint holding = False
    if core.open:  # a rival close may have won
        err = _usable(core)
        if not err and count_read(&core.life.exports):
            if deferred:
                core_close_holding(core)
                holding = True
            else:
                err = ARENA_EEXPORTED
        elif not err:
            core_close(core)
    if exclusive:
        exclusive_end(&core.life)
    if holding:
        core_release_held(core)  # the last export may have gone meanwhile, from another thread
    return err


cdef void _core_shut(ArenaCore* core, size_t* stale, size_t* churn, bint holding) noexcept:
    """Close's first half: no segment is alive, nothing may allocate; each kind says what its live
    memory becomes (``stale`` bytes of garbage left to the slot, of ``churn`` allocated in all).
    ``holding``: exports are alive, so no block goes back to jemalloc now."""
    core.fast_owner = 0
    store_flag(&core.open, False)
    life_next_generation(&core.life)
    count_add(&_inline_state.arenas_closed, 1)
    if core.kind == ARENA_KIND_CONFINED:
        confined_close(core, stale, churn, holding)
    elif core.kind == ARENA_KIND_SHARED:
        shared_close(core, stale, churn)
    else:
        slicing_close(core, stale, churn, holding)
    # A closed arena is no thread's: every thread is told it is closed.  Last, with a release store:
    # another thread reads the owner first (Segment._status), and one that reads 0 then sees the
    # new generation; one that reads the owner reads nothing else (see frames_close).
    store_life_owner(&core.life.owner, 0)


cdef void core_close(ArenaCore* core) noexcept:
    """Close without checks: every allocation goes back at once (also for an arena collected while
    open).  Each kind says what its live memory becomes: the slot's stale garbage, dropped later in
    bulk by a jemalloc arena reset (see _slots.pxi), or blocks handed back now."""
    if not core.open or close_small_scope(core, _inline_state):
        return
    cdef size_t stale, churn
    _core_shut(core, &stale, &churn, False)
    slot_release(core.slot, stale, churn)
    core.slot = NULL
    core.books.live_bytes = 0
    core.books.live_segments = 0


cdef Py_ssize_t _closing_arenas = 0  # closed deferred, their memory held by exports (live_objects())


cdef void core_close_holding(ArenaCore* core) noexcept:
    """A deferred close (exports alive): every segment dies now, as at close, but the slot, and
    with it every block, stays out of the pool until core_release_held() (the last export's
    release, from any thread).  The caller keeps other threads' accesses out."""
    cdef Books books
    read_books(core, &books)
    core.held.live_bytes = books.live_bytes
    core.held.live_segments = books.live_segments
    _core_shut(core, &core.held.stale, &core.held.churn, True)
    core.held.slot = core.slot
    core.slot = NULL
    core.books.live_bytes = 0
    core.books.live_segments = 0
    count_add(&_closing_arenas, 1)
    # After the books: a release that sees the flag finds them complete.  The flag first, then the
    # count (core_release_held); a release drops the count, then reads the flag: of the closer and
    # the last release, one sees the other, and one claims the flag.
    flag_set(&core.life.release_pending)


cdef void core_release_held(ArenaCore* core) noexcept:
    """Give a deferred close's memory back once no export is alive (once, whoever calls first)."""
    if count_read(&core.life.exports) or not flag_claim(&core.life.release_pending):
        return
    cdef ArenaSlot* slot = core.held.slot
    core.held.slot = NULL
    count_add(&_closing_arenas, -1)
    slot_release(slot, core.held.stale, core.held.churn)


cdef int arena_close_slow(ArenaCore* core) except -1:
    """arena_close() of the C API (the inline fast path calls it).  An arena object's core closes
    as its close() does: the NumPy handler's kept blocks go back and its traces end too."""
    if core.arena_object != NULL and core.self == core:  # (a copy's object may be gone: closed)
        return (<ArenaBase>core.arena_object)._close(False)
    return arena_raise(arena_close_checked(core))


cdef int arena_reset_slow(ArenaCore* core) noexcept nogil:
    """arena_reset() of the C API: an arena object's core resets as its reset() does, the GIL
    taken for the traces of its segments, if any (tracemalloc's, set_debug()'s), and, for an
    Arena's on a GIL build, for the reset itself.  Any thread may use an Arena, and on a GIL build
    its Python-level users announce their accesses by holding the GIL alone (access_enter is
    nothing there), so a reset without it ran inside them: an allocate(), fill() and free() loop
    on one thread and arena_reset() without the GIL on another crashed in jemalloc within seconds,
    and so did NumPy's small arrays (the handler's kept blocks; attacks of 2026-12-06)."""
    cdef int err
    if not FREE_THREADED and core.arena_object != NULL and core.kind == ARENA_KIND_SHARED:
        err = _reset_with_gil(core)
    else:
        err = arena_reset_checked(core)
    # (A copy of a core is not ARENA_OK.)
    if err == ARENA_OK and core.arena_object != NULL and load_flag(&core.object_books):
        _untrack_all_with_gil(core.arena_object)
    return err


cdef int _reset_with_gil(ArenaCore* core) noexcept nogil:
    with gil:
        return arena_reset_checked(core)


cdef void _untrack_all_with_gil(void* arena) noexcept nogil:
    with gil:
        (<ArenaBase>arena)._untrack_all()


# -- the books ---------------------------------------------------------------------------------------

cdef void read_books(ArenaCore* core, Books* books) noexcept:
    """The arena's books as stats() reports them: summed over the threads of a shared arena, with
    a SlicingArena's carves folded in, and no live bytes once closed."""
    if not core.open:  # a closed core's live counts are stale (a scope's close skips them)
        books[0] = core.books
        books.live_bytes = 0
        books.live_segments = 0
    elif core.kind == ARENA_KIND_SHARED:
        shared_totals(core, books)
    elif core.kind == ARENA_KIND_SLICING:
        slicing_books(core, books)  # not settled yet (see slicing_settle)
    else:
        books[0] = core.books
