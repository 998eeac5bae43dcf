# cython: language_level=3
# The one kind switch of the inline fast paths (their open); the library's own, one per operation,
# are in arenalib/_dispatch.pxi.  Every other inline path goes by permits (fast_owner, a shared
# arena's first_cache, carve_owner), which an open grants and a close revokes, never by kind.

from arenalib._abi cimport ArenaCore, InlineState, core_init
from arenalib._confined cimport confined_init
from arenalib._table cimport ARENA_KIND_CONFINED


cdef inline bint open_parked(ArenaCore* core, InlineState* state, int kind,
                             Py_ssize_t max_bytes) noexcept nogil:
    """Open ``core`` on the idle parked slot when this open can be done inline (an unlimited
    ConfinedArena: no pool, no lock); False (nothing done) otherwise.  With the GIL held."""
    if (kind != ARENA_KIND_CONFINED or max_bytes >= 0 or not state.parked_idle
            or core.life.release_pending  # (closed deferred: arena_open_slow refuses it)
            or (core.arena_object != NULL and core.kind != kind)):  # (another class's: refused too)
        return False
    state.parked_idle = False
    core_init(core, state, state.parked, kind, -1, 0)
    confined_init(core)
    core.open = True
    state.arenas_opened += 1
    return True
