# cython: language_level=3
# ConfinedArena's inline rule: its open on the parked slot, the books of its first few blocks,
# and the close of a small scope that gives them back to the slot's cache.  The rest of the kind
# is arenalib/_confined.pxi.

from arenalib._abi cimport (
    CACHE_MAX_SIZE, INLINE_PARKING, PURGE_LIMIT, RECENT_MAX, ArenaCore, ArenaSlot, ConfinedState,
    InlineState, books_add, books_note_peak, books_remove, life_next_generation, store_flag, store_life_owner,
    thread_ident,
)
from arenalib._blocks cimport cache_push


cdef inline void confined_init(ArenaCore* core) noexcept nogil:
    """A ConfinedArena's fields at open: its owner (and, unlimited, the inline path's permit)."""
    core.life.owner = thread_ident()
    core.fast_owner = core.life.owner if core.max_bytes < 0 else 0
    core.confined.recent_count = 0
    core.confined.recent_overflowed = False


cdef inline void confined_count_allocation(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """A ConfinedArena's books for a new block: the first few are remembered for close."""
    cdef ConfinedState* confined = &core.confined
    if confined.recent_count < RECENT_MAX:
        confined.recent[confined.recent_count] = ptr
        confined.recent_sizes[confined.recent_count] = size
        confined.recent_count += 1
    else:
        confined.recent_overflowed = True
    books_add(&core.books, size)
    books_note_peak(&core.books)


cdef inline void confined_count_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    cdef ConfinedState* confined = &core.confined
    cdef int i
    if not confined.recent_overflowed:
        for i in range(confined.recent_count):
            if confined.recent[i] == ptr:
                confined.recent[i] = NULL
                break
    books_remove(&core.books, size)


cdef inline void recent_blocks_to_cache(ArenaCore* core) noexcept nogil:
    """Give a confined arena's remembered live blocks (all it holds) back to its slot's cache."""
    cdef ArenaSlot* slot = core.slot
    cdef void* ptr
    cdef size_t size
    cdef int i
    for i in range(core.confined.recent_count):
        ptr = core.confined.recent[i]
        size = core.confined.recent_sizes[i]
        if ptr != NULL and not (size <= CACHE_MAX_SIZE and cache_push(&slot.cache, ptr, size)):
            core.state.functions.slot_free(slot, ptr)


cdef inline bint close_small_scope(ArenaCore* core, InlineState* state) noexcept nogil:
    """Close a ConfinedArena of the calling thread that holds at most RECENT_MAX blocks and was
    opened on the parked slot: its blocks go to the slot's cache and the slot is idle again, warm
    for the next arena.  False (nothing done) in any other case, such as an arena object that keeps
    tables of its blocks (object_books: its close() ends them).  The caller holds the GIL.
    ``state`` is the module's own pointer (arena_close() has made sure of it), not core.state,
    which the open has only just stored."""
    cdef ArenaSlot* slot = core.slot
    if (not INLINE_PARKING or core.self != core or core.fast_owner != thread_ident()
            or core.confined.recent_overflowed or core.object_books
            or core.life.exports or core.books.allocated_total > PURGE_LIMIT
            or state.parked != slot):
        return False
    cdef size_t held = max(slot.churn_bytes, slot.stale_bytes + core.books.allocated_total)
    if held > state.parked_headroom:
        return False
    recent_blocks_to_cache(core)
    # The most the arena had allocated at once, as _slot_give_back counts it (no sum: the blocks
    # go back to the cache, and the next scope takes them again).
    slot.churn_bytes = held
    state.parked_idle = True
    state.arenas_closed += 1
    core.fast_owner = 0
    store_flag(&core.open, False)
    life_next_generation(&core.life)
    store_life_owner(&core.life.owner, 0)  # after the generation: see _core_shut
    core.slot = NULL
    return True
