# cython: language_level=3, freethreading_compatible=True
"""A test-only consumer of arenalib's C-level API (issue 11; built by tests/cython/meson.build): the
inline fast paths' argument checks and copies of a core (tests/test_capi.py), and closing and
re-opening an arena object's core from C (tests/test_safety.py)."""

from arenalib.fast cimport (
    ARENA_EBUSY, ARENA_ECLOSED, ARENA_EEXPORTED, ARENA_EINVAL, ARENA_KIND_CONFINED, ARENA_KIND_SHARED,
    ARENA_KIND_SLICING, ARENA_OK, ArenaCore, ArenaMark, arena_allocate, arena_close, arena_core,
    arena_core_init, arena_free, arena_mark, arena_open, arena_raise, arena_reset, arena_rewind,
)

cdef extern from *:
    """
    static int safety_consumer_stop = 0;
    #define safety_consumer_stopped() __atomic_load_n(&safety_consumer_stop, __ATOMIC_RELAXED)
    #define safety_consumer_set_stop(v) __atomic_store_n(&safety_consumer_stop, (v), __ATOMIC_RELAXED)
    """
    bint carving_stopped "safety_consumer_stopped"() noexcept nogil
    void set_carving_stop "safety_consumer_set_stop"(int value) noexcept nogil

cdef extern from *:
    """
    /* rewind_then_scribble()'s stage, for a test that holds the GIL meanwhile: 1 waiting for the
       go, 2 gone, 3 rewound and scribbled. */
    static int safety_consumer_stage = 0;
    #define safety_consumer_get_stage() __atomic_load_n(&safety_consumer_stage, __ATOMIC_ACQUIRE)
    #define safety_consumer_set_stage(v) __atomic_store_n(&safety_consumer_stage, (v), __ATOMIC_RELEASE)
    """
    int get_stage "safety_consumer_get_stage"() noexcept nogil
    void set_stage "safety_consumer_set_stage"(int value) noexcept nogil

from libc.string cimport memcpy, memset

from arenalib import ArenaClosedError

ECLOSED = ARENA_ECLOSED
EINVAL = ARENA_EINVAL
OK = ARENA_OK
KINDS = {"Arena": ARENA_KIND_SHARED, "ConfinedArena": ARENA_KIND_CONFINED,
         "SlicingArena": ARENA_KIND_SLICING}


def allocate_aligned(arena, size_t size, size_t align):
    """The result code of arena_allocate(core, size, align) with the fast path warmed first: a block
    of ``size`` allocated and freed (a ConfinedArena's free list then holds one), or carved (a
    SlicingArena is then biased to this thread).  A block allocated is given back when the kind
    allows it."""
    cdef ArenaCore* core = arena_core(arena)
    cdef void* ptr = NULL
    cdef int err = arena_allocate(core, size, 0, False, &ptr)
    arena_raise(err)
    if core.kind != ARENA_KIND_SLICING:
        arena_raise(arena_free(core, ptr, size))
    err = arena_allocate(core, size, align, False, &ptr)
    if err == ARENA_OK and core.kind != ARENA_KIND_SLICING:
        arena_raise(arena_free(core, ptr, size))
    return err


def close_and_reopen(arena, int kind):
    """Close the arena object's own core through the C API, then open it again (kind: ARENA_KIND_*,
    no limit, the default chunk size)."""
    cdef ArenaCore* core = arena_core(arena)
    arena_close(core)
    arena_open(core, kind, -1, 0)


def core_address(arena):
    """The address of the arena object's ArenaCore (arena_core()), for another module to use."""
    return <size_t>arena_core(arena)


def raise_code(int code):
    """arena_raise(code): the C API's exception for an error code."""
    arena_raise(code)


def close_core(arena):
    """arena_close() on the arena object's own core: the C API's close path."""
    arena_close(arena_core(arena))


def close_a_copy_of(arena):
    """arena_close() on a copy of the arena object's core (a struct assignment, which the C API
    forbids): the copy must count as closed and leave the object alone."""
    cdef ArenaCore copy = arena_core(arena)[0]
    arena_close(&copy)


def open_core_at(size_t address, int kind):
    """arena_open() on the core at ``address`` (from core_address(), the arena closed since)."""
    arena_open(<ArenaCore*>address, kind, -1, 0)


def reset_core_without_the_gil(arena):
    """arena_reset() on the arena object's own core, without the GIL."""
    cdef ArenaCore* core = arena_core(arena)
    cdef int err
    with nogil:
        err = arena_reset(core)
    arena_raise(err)


def copied_core(int kind):
    """Error codes of a copy of an open stack core (a struct assignment, which the C API forbids):
    an allocate from the copy while the original is open, then after the original's close an
    allocate, a free of the block the original allocated (Arena and ConfinedArena), and a close.
    The fast paths are warm when the copy is made (a block in the free list, a biased carve).
    Every one must be refused: a copy that could allocate would hand out the slot's memory after
    the original gave it back, aliasing the next scope's blocks."""
    cdef ArenaCore core
    cdef ArenaCore copy
    cdef void* ptr = NULL
    cdef void* block = NULL
    arena_core_init(&core)
    arena_open(&core, kind, -1, 0)
    arena_raise(arena_allocate(&core, 64, 0, False, &ptr))
    if kind != ARENA_KIND_SLICING:
        arena_raise(arena_free(&core, ptr, 64))
        arena_raise(arena_allocate(&core, 64, 0, False, &ptr))
    copy = core
    codes = {"allocate while open": arena_allocate(&copy, 64, 0, False, &block)}
    arena_close(&core)
    codes["allocate after close"] = arena_allocate(&copy, 64, 0, False, &block)
    if kind != ARENA_KIND_SLICING:
        codes["free after close"] = arena_free(&copy, ptr, 64)
    try:
        arena_close(&copy)
        codes["close"] = OK
    except ArenaClosedError:
        codes["close"] = ECLOSED
    return codes


def free_null(arena, size_t size):
    """arena_free(core, NULL, size)'s code after a block of ``size`` was allocated and freed (the
    free-block cache's path warmed), then the addresses of two blocks of ``size`` allocated (and
    freed): a NULL taken in by the cache would come back as one of them."""
    cdef ArenaCore* core = arena_core(arena)
    cdef void* first = NULL
    cdef void* second = NULL
    arena_raise(arena_allocate(core, size, 0, False, &first))
    arena_raise(arena_free(core, first, size))
    cdef int err = arena_free(core, NULL, size)
    arena_raise(arena_allocate(core, size, 0, False, &first))
    arena_raise(arena_allocate(core, size, 0, False, &second))
    arena_raise(arena_free(core, second, size))
    arena_raise(arena_free(core, first, size))
    return err, <size_t>first, <size_t>second


def carve_until_stopped(arena, size_t size, Py_ssize_t limit, bint marks):
    """Carve ``size`` bytes from a SlicingArena's core without the GIL, until stop_carving() or
    ``limit`` carves, each under a mark rewound at once if ``marks`` (nothing piles up): what two
    threads of a C library sharing the arena do (one carving at a time: the other gets
    ARENA_EBUSY, and tries again).  The number of carves made."""
    cdef ArenaCore* core = arena_core(arena)
    cdef ArenaMark mark
    cdef void* ptr = NULL
    cdef Py_ssize_t carves = 0
    with nogil:
        while carves < limit and not carving_stopped():
            if marks and arena_mark(core, &mark) != ARENA_OK:
                continue
            if arena_allocate(core, size, 0, False, &ptr) == ARENA_OK:
                carves += 1
            while marks and arena_rewind(core, &mark) == ARENA_EBUSY:
                pass
    return carves


def stop_carving(bint stop=True):
    """Stop (or, with False, allow again) every carve_until_stopped()."""
    set_carving_stop(stop)


def mark_bytes(arena):
    """arena_mark() of ``arena``'s core: the mark's bytes (for rewind_then_scribble)."""
    cdef ArenaMark mark
    arena_raise(arena_mark(arena_core(arena), &mark))
    return (<char*>&mark)[:sizeof(ArenaMark)]


def rewind_then_scribble(arena, bytes mark, size_t size, unsigned char pattern, bint on_go=False):
    """Without the GIL: arena_rewind() to ``mark`` (tried again while it is busy or exported), then
    a carve of ``size`` bytes filled with ``pattern`` (what a C library does next); its error code.
    ``on_go``: wait for go() first (stage() 1, then 2; 3 once done)."""
    cdef ArenaMark m
    cdef ArenaCore* core = arena_core(arena)
    cdef int err
    _mark_from(mark, &m)
    with nogil:
        _wait_for_go(on_go)
        err = arena_rewind(core, &m)
        while err == ARENA_EBUSY or err == ARENA_EEXPORTED:
            err = arena_rewind(core, &m)
        _scribble_then_done(core, err, size, pattern, on_go)
    return err


cdef void _wait_for_go(bint on_go) noexcept nogil:
    if on_go:
        set_stage(1)
        while get_stage() != 2:
            pass


cdef void _scribble_then_done(ArenaCore* core, int err, size_t size, unsigned char pattern,
                              bint on_go) noexcept nogil:
    """After a rewind or mark that succeeded: what a C library does next, a carve it fills."""
    cdef void* ptr = NULL
    if err == ARENA_OK:
        while arena_allocate(core, size, 0, False, &ptr) == ARENA_EBUSY:
            pass
        memset(ptr, pattern, size)
    if on_go:
        set_stage(3)


def mark_then_scribble(arena, size_t size, unsigned char pattern, bint on_go=False):
    """Without the GIL: arena_mark() (tried again while busy), then a carve of ``size`` bytes filled
    with ``pattern``; (its error code, the mark's bytes).  ``on_go`` as rewind_then_scribble()."""
    cdef ArenaMark m
    cdef ArenaCore* core = arena_core(arena)
    cdef int err
    with nogil:
        _wait_for_go(on_go)
        err = arena_mark(core, &m)
        while err == ARENA_EBUSY:
            err = arena_mark(core, &m)
        _scribble_then_done(core, err, size, pattern, on_go)
    return err, (<char*>&m)[:sizeof(ArenaMark)]


def rewind_once(arena, bytes mark):
    """One arena_rewind() to ``mark`` without the GIL: its error code."""
    cdef ArenaMark m
    cdef ArenaCore* core = arena_core(arena)
    cdef int err
    _mark_from(mark, &m)
    with nogil:
        err = arena_rewind(core, &m)
    return err


cdef int _mark_from(bytes mark, ArenaMark* out) except -1:
    if len(mark) != sizeof(ArenaMark):
        raise ValueError("not a mark of mark_bytes()")
    memcpy(out, <const char*>mark, sizeof(ArenaMark))
    return 0


def stage():
    """rewind_then_scribble(on_go=True)'s stage (read with no GIL needed)."""
    return get_stage()


def go():
    """Let a rewind_then_scribble(on_go=True) waiting for it go (without releasing the GIL)."""
    set_stage(2)


def reset_stage():
    set_stage(0)
