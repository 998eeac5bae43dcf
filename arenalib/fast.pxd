# cython: language_level=3
# The C-level API of arenalib with its inline fast paths compiled in: the names of arenalib's
# table-only API (arenalib/__init__.pxd, whose notes on threads and on cores of your own hold here
# too), cimported from arenalib.fast instead:
#
#     from arenalib.fast cimport ArenaCore, arena_core, arena_allocate, arena_free, arena_raise
#
# The common cases run in your module without a call: a ConfinedArena's allocate and free from its
# free list, a shared Arena's on its first thread, a SlicingArena's carve (no atomic instruction
# while one thread keeps carving), a confined scope's open and close.  They read arenalib's structs
# (arenalib/_abi.pxd), so a module must be rebuilt against the arenalib it runs with: one whose C
# ABI fingerprint differs (a digest of every declaration it compiled in, tools/abi_fingerprint.py,
# and of whether the interpreter is free-threaded) gets ImportError from arena_core() or
# arena_open(), never a wrong layout.  The inline code includes arenalib/platform.h: build with
# `-I` arenalib.get_c_include() besides `-I` arenalib.get_include() for Cython.  Consumers need no
# jemalloc header and link nothing: anything the inline paths do not cover goes to arenalib's own
# functions through the function table of the capsule arenalib._arena._C_API.

from libc.string cimport memset

from arenalib._arena cimport (  # noqa: F401  (the classes, for modules that type their arguments)
    Arena, ArenaBase, ConfinedArena, Segment, SlicingArena,
)
from arenalib._abi cimport (
    CACHE_MAX_SIZE, INLINE_PARKING, SLICE_DEFAULT_ALIGN, ArenaCore, CarverRecord, FreeBlocks,
    InlineState, ThreadCache, abi_check, allocate_fn, arenalib_abi_unaccepted, arenalib_allocate_slow_fn,
    arenalib_free_slow_fn, arenalib_inline_state_ptr, arenalib_load_owner, books_remove, core_state,
    free_fn, inline_ident, load_first_cache,
)
from arenalib._blocks cimport cache_pop, cache_push, small_align
from arenalib._confined cimport close_small_scope, confined_count_allocation, confined_count_free
from arenalib._dispatch cimport open_parked
from arenalib._frames cimport frames_mark_fast, frames_rewind_fast
from arenalib._shared cimport shared_count_allocation
from arenalib._slicing cimport biased_begin, biased_end, slicing_carve_current
from arenalib._table cimport (  # noqa: F401  (the same names as arenalib's table-only API)
    ARENA_EBUSY,
    ARENA_ECLOSED,
    ARENA_EEXPORTED,
    ARENA_EINVAL,
    ARENA_ELIMIT,
    ARENA_ENOMEM,
    ARENA_EUNSUPPORTED,
    ARENA_EWRONGTHREAD,
    ARENA_KIND_CONFINED,
    ARENA_KIND_SHARED,
    ARENA_KIND_SLICING,
    ARENA_ESTALEMARK,
    ARENA_EORDER,
    ARENA_OK,
    ArenaMark,
)


cdef inline int arena_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                               void** out) noexcept nogil:
    """Allocate ``size`` bytes aligned to ``align`` (0 or a power of two up to 1 GiB), zeroed if
    ``zero``; the address goes to ``*out``.  Returns ARENA_OK or an error code."""
    # One free-block pop for both kinds that have one, and the slow dispatch apart: a compiler
    # inlines this function only while it stays small (with a pop per kind GCC at -O3 called it out
    # of line, and a C-level scope took 14.5 ns against 9.8 inlined).
    cdef void* ptr
    cdef unsigned long me = inline_ident()
    cdef FreeBlocks* cache = NULL
    cdef ThreadCache* tc = NULL
    cdef CarverRecord* record
    # Until this module accepted arenalib's C ABI (arena_core(), arena_open(), or a handed core
    # judged by core_state() on the slow path), no fast path reads the core: under another ABI
    # its pointers may lie where this module's layout puts other fields.
    if (not arenalib_abi_unaccepted and core.self == core
            and small_align(align)):  # (a copy: the slow path says it is closed)
        if core.fast_owner == me:
            cache = &core.slot.cache
        else:
            tc = load_first_cache(&core.shared.first_cache)
            if tc == NULL:
                # A SlicingArena biased to this thread carves with no atomic read-modify-write and
                # no fence instruction (see biased_record).
                record = biased_begin(core, me)
                if record != NULL:
                    ptr = slicing_carve_current(core, size, SLICE_DEFAULT_ALIGN, zero)
                    biased_end(record)
                    if ptr != NULL:
                        out[0] = ptr
                        return ARENA_OK
            elif arenalib_load_owner(&tc.thread) == me:
                cache = &tc.cache  # a shared Arena's permit: the cache of its first thread, on it
        if cache != NULL and size <= CACHE_MAX_SIZE:
            ptr = cache_pop(cache, size)
            if ptr != NULL:
                if zero:
                    memset(ptr, 0, size)
                if tc == NULL:
                    confined_count_allocation(core, ptr, size)
                else:
                    shared_count_allocation(tc, size)
                out[0] = ptr
                return ARENA_OK
    return _arena_allocate_slow(core, size, align, zero, out)


cdef inline int _arena_allocate_slow(ArenaCore* core, size_t size, size_t align, bint zero,
                                     void** out) noexcept nogil:
    """What arena_allocate()'s inline cases do not cover: arenalib's own function."""
    cdef InlineState* state
    if arenalib_allocate_slow_fn != NULL:
        return (<allocate_fn>arenalib_allocate_slow_fn)(core, size, align, zero, out)
    state = core_state(core)  # a core handed to a module that never called abi_check()
    if state == NULL:
        return ARENA_ECLOSED  # never opened, or by an arenalib of another C ABI
    return state.functions.allocate_slow(core, size, align, zero, out)


cdef inline int arena_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """Give back one allocation of Arena or ConfinedArena; ``size`` must be the size allocated.
    A NULL ``ptr`` does nothing (as free(NULL))."""
    cdef InlineState* state
    cdef ThreadCache* tc
    cdef unsigned long me = inline_ident()
    if ptr == NULL:
        return ARENA_OK
    # (No fast path before the C ABI is accepted: see arena_allocate.)  A copy of the core: the slow
    # path says it is closed.
    if not arenalib_abi_unaccepted and size <= CACHE_MAX_SIZE and core.self == core:
        if core.fast_owner == me:
            if cache_push(&core.slot.cache, ptr, size):
                confined_count_free(core, ptr, size)
                return ARENA_OK
        else:
            tc = load_first_cache(&core.shared.first_cache)  # a shared Arena's permit
            if (tc != NULL and arenalib_load_owner(&tc.thread) == me
                    and cache_push(&tc.cache, ptr, size)):
                books_remove(&tc.books, size)
                return ARENA_OK
    if arenalib_free_slow_fn != NULL:
        return (<free_fn>arenalib_free_slow_fn)(core, ptr, size)
    state = core_state(core)
    if state == NULL:
        return ARENA_ECLOSED
    return state.functions.free_slow(core, ptr, size)


cdef inline int arena_reset(ArenaCore* core) noexcept nogil:
    """Free every allocation at once and keep the arena open (no other thread may use it now).  An
    arena object's core takes the GIL for a moment if tracemalloc traces its segments."""
    cdef InlineState* state = core_state(core)
    if state == NULL:
        return ARENA_ECLOSED
    return state.functions.reset(core)


cdef inline int arena_mark(ArenaCore* core, ArenaMark* out) noexcept nogil:
    """Mark a SlicingArena's carve position in ``out`` (storage the caller keeps) for
    arena_rewind().  Marks nest, one stack per arena.  ARENA_EUNSUPPORTED for the other kinds.  A
    mark lets the frames go whose exits were refused (Python's), which takes the GIL for a moment
    on a GIL build, as arena_rewind() does."""
    if not arenalib_abi_unaccepted and frames_mark_fast(core, False, out, inline_ident()) == ARENA_OK:
        return ARENA_OK  # (no fast path before the C ABI is accepted: see arena_allocate)
    cdef InlineState* state = core_state(core)
    if state == NULL:
        return ARENA_ECLOSED
    return state.functions.mark_slow(core, out)


cdef inline int arena_rewind(ArenaCore* core, const ArenaMark* mark) noexcept nogil:
    """Rewind a SlicingArena to ``mark``: what was carved since is dead (its Segments raise) and is
    carved again; the mark and later ones are used up.  ARENA_ESTALEMARK for a mark of another
    arena or used up (by a rewind to it or to an earlier mark, a reset, a close); ARENA_EEXPORTED
    while a buffer export of a segment it would kill is alive; ARENA_EORDER while a frame entered
    after the mark is open.  No other thread may use what it kills meanwhile; on a GIL build, a
    rewind that kills segments carved from Python takes the GIL for a moment (their Python users
    hold it while they touch them), and one of C's carves alone does not: hold no lock here that
    a thread holding the GIL may wait for."""
    if (not arenalib_abi_unaccepted
            and frames_rewind_fast(core, mark, False, inline_ident(), False) == ARENA_OK):
        return ARENA_OK  # (see arena_mark)
    cdef InlineState* state = core_state(core)
    if state == NULL:
        return ARENA_ECLOSED
    return state.functions.rewind_slow(core, mark)


cdef inline void arena_core_init(ArenaCore* core) noexcept nogil:
    """Prepare an ArenaCore of your own (on the stack, in a struct) for arena_open(): closed."""
    memset(core, 0, sizeof(ArenaCore))


cdef inline ArenaCore* arena_core(object arena) except NULL:
    """The C handle of an open Arena, ConfinedArena or SlicingArena (keep a reference to it)."""
    if arenalib_inline_state_ptr == NULL:
        abi_check()
    return (<InlineState*>arenalib_inline_state_ptr).functions.core_of(arena)


cdef inline int arena_raise(int code) except -1:
    """Raise the Python exception for an error code of the nogil functions (with the GIL held)."""
    if code == ARENA_OK:
        return 0
    if arenalib_inline_state_ptr == NULL:
        abi_check()
    return (<InlineState*>arenalib_inline_state_ptr).functions.raise_error(code)


cdef inline int arena_open(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                           size_t chunk_size) except -1:
    """Open an arena in an ArenaCore the caller owns (an arena object's, or a C struct on the
    stack for a nogil scope, prepared by arena_core_init()).  kind: ARENA_KIND_*; max_bytes: -1 for
    no limit; chunk_size: the SlicingArena chunk size (0 for the default).  Needs the GIL;
    arena_close() undoes it.  BufferError while exports of the core's last open, closed deferred,
    are alive."""
    cdef InlineState* state
    if arenalib_inline_state_ptr == NULL:  # the first time only (abi_check() is not small)
        abi_check()
    state = <InlineState*>arenalib_inline_state_ptr
    if INLINE_PARKING and not core.open and open_parked(core, state, kind, max_bytes):
        return 0
    return state.functions.open_slow(core, kind, max_bytes, chunk_size)


cdef inline int arena_close(ArenaCore* core) except -1:
    """Free every allocation at once and give the memory back (GIL held); idempotent.  Raises
    WrongThreadError for a confined arena of another thread, BufferError while exports live."""
    if arenalib_inline_state_ptr == NULL:  # (before any field is read: see arena_allocate)
        abi_check()
    if not core.open:
        return 0
    if close_small_scope(core, <InlineState*>arenalib_inline_state_ptr):
        return 0
    return core.state.functions.close_slow(core)
