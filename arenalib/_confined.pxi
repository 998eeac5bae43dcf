# ConfinedArena: one owner thread.  Confinement is what lets it skip every lock: allocations come
# from the slot's explicit tcache and from a cache of free blocks threaded through the blocks
# themselves (FreeBlocks).  Its fields: the shared Books of the core plus ConfinedState (its first
# few allocations, so that a small scope's close hands them back to the cache instead of waiting
# for a bulk reset).  Its inline rule (its open, a block from the cache, a small scope's close) is
# _confined.pxd; what is here is everything else.

cimport cython

from arenalib._abi cimport ArenaCore, ConfinedState, books_note_peak, books_resize
from arenalib._confined cimport confined_count_allocation, confined_count_free, recent_blocks_to_cache
from arenalib._table cimport ARENA_ELIMIT, ARENA_ENOMEM, ARENA_KIND_CONFINED, ARENA_OK


cdef inline int confined_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                                  void** out) noexcept nogil:
    if over_limit(core, size):
        return ARENA_ELIMIT
    cdef void* ptr = cached_allocate(&core.slot.cache, slot_flags(core.slot), size, align, zero)
    if ptr == NULL:
        return ARENA_ENOMEM
    confined_count_allocation(core, ptr, size)
    out[0] = ptr
    return ARENA_OK


cdef inline int confined_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    cached_free(&core.slot.cache, slot_flags(core.slot), ptr, size)
    confined_count_free(core, ptr, size)
    return ARENA_OK


cdef inline int confined_resize(ArenaCore* core, void* ptr, size_t old, size_t new, size_t align,
                                bint zero, void** out) noexcept nogil:
    if new > old and over_limit(core, new - old):
        return ARENA_ELIMIT
    cdef int done = cached_resize(&core.slot.cache, slot_flags(core.slot), ptr, old, new, align,
                                  zero, out)
    if done == RESIZE_FAILED:
        return ARENA_ENOMEM
    # The block stays the one remembered for close, at its new place and size (a free and a new
    # allocation would take a second entry of the few there are).
    cdef ConfinedState* confined = &core.confined
    cdef int i
    if not confined.recent_overflowed:
        for i in range(confined.recent_count):
            if confined.recent[i] == ptr:
                confined.recent[i] = out[0]
                confined.recent_sizes[i] = new
                break
    books_resize(&core.books, old, new, done == RESIZE_MOVED)
    books_note_peak(&core.books)
    return ARENA_OK


cdef void confined_reset(ArenaCore* core) noexcept nogil:
    """Every allocation goes at once: the slot's whole jemalloc arena is reset."""
    slot_reset(core.slot)
    core_forget_live(core)
    core.confined.recent_count = 0
    core.confined.recent_overflowed = False


cdef inline void confined_close(ArenaCore* core, size_t* stale, size_t* churn, bint holding) noexcept:
    """What a closing ConfinedArena leaves to its slot: ``stale`` bytes still allocated, ``churn``
    bytes allocated in all.  ``holding``: exports are alive, no block goes back (not even to the
    cache, which frees what it cannot keep)."""
    churn[0] = core.books.allocated_total
    if core.confined.recent_overflowed or holding:
        stale[0] = <size_t>core.books.live_bytes  # dropped in bulk by a reset of the slot
    else:
        # A small scope: its few blocks go straight back to the slot's cache, warm for the next
        # scope, and no reset is ever needed for them.
        recent_blocks_to_cache(core)
        stale[0] = 0


@cython.final
cdef class ConfinedArena(ArenaBase):
    """ConfinedArena(*, max_bytes=None)\n--\n\nAn arena that only its creating thread may use, nor its
    segments (WrongThreadError).

    ConfinedArena(*, max_bytes=None).  Confinement is what lets it skip all locking."""

    def __cinit__(self, _positional=_NOT_GIVEN, *, max_bytes=None):
        if _positional is not _NOT_GIVEN:
            _no_positional(self, "max_bytes=")
        self._open(ARENA_KIND_CONFINED, max_bytes)

    @property
    def owner_thread(self):
        """threading.get_ident() of the thread that owns this arena; 0 once it is closed (a closed
        arena is no thread's: every thread is told it is closed)."""
        return load_life_owner(&self._core.life.owner)
