# The figures arenalib reports: live_objects(), slot_stats() (the slot pool and its retention), and
# jemalloc's own figures of one arena for stats().

from arenalib._blocks cimport cache_held_bytes
from arenalib._jemalloc cimport je_mallctl, je_mallctlbymib, je_mallctlnametomib


def live_objects():
    """Counts of open arenas and pools, arenas closed deferred whose memory buffer exports still
    hold, Segment objects, buffer exports and threads' anchors (what a free-threaded build's
    segments hold in a shared Arena's place) and arena-backed NumPy arrays (numpy() scopes') alive
    now (for leak checks).  The AutoArena, open for the process's life once made, is no open arena
    here, nor are threads' anchors of it; its segments count."""
    return {"open_arenas": count_read(&_inline_state.arenas_opened)
            - count_read(&_inline_state.arenas_closed) - (_auto is not None),
            "closing_arenas": count_read(&_closing_arenas),
            "open_pools": count_read(&_open_pools),
            "segments": shard_sum(LIVE_SEGMENTS), "exports": shard_sum(LIVE_EXPORTS),
            "anchors": shard_sum(LIVE_ANCHORS), "numpy_arrays": shard_sum(LIVE_NUMPY)}


cdef Py_ssize_t _open_pools = 0


cdef void count_open_pools(int delta) noexcept:
    """BufferPool's open and close, for live_objects()."""
    count_add(&_open_pools, delta)


cdef dict _wipe_counts():
    cdef int i
    return {_WIPE_NAMES[i]: _wipes[i] for i in range(<int>WIPE_REASONS)}


cdef size_t _purged_bytes() noexcept:
    """The bytes jemalloc has purged from all its arenas, by decay and by purges (a statistic)."""
    cdef uint64_t epoch = 1
    cdef uint64_t pages = 0
    cdef size_t page = 0
    cdef size_t size = sizeof(uint64_t)
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    if je_mallctl(b"stats.arenas.4096.dirty_purged", &pages, &size, NULL, 0):
        return 0
    size = sizeof(size_t)
    je_mallctl(b"arenas.page", &page, &size, NULL, 0)
    return <size_t>pages * page


def slot_stats():
    """Figures of the pool of jemalloc arenas ("slots") behind all arena objects, and of what they
    keep warm (for tests and tuning).  pool_stats() is the same function, under its old name."""
    cdef Py_ssize_t i
    cdef size_t stale = 0, cached = 0
    cdef Py_ssize_t idle
    pool_lock()
    cdef ArenaSlot* parked = _inline_state.parked if _inline_state.parked_idle else NULL
    if parked != NULL:
        stale += parked.stale_bytes
        cached += cache_held_bytes(&parked.cache)
    for i in range(_free_count):
        stale += _free_slots[i].stale_bytes
        cached += cache_held_bytes(&_free_slots[i].cache)
    idle = _free_count + (parked != NULL)
    cdef size_t warm = _free_slots_warm_bytes() + (_warm_bytes(parked) if parked != NULL else 0)
    pool_unlock()
    return {
        "slots_created": _slots_created,
        "slots_idle": idle,
        "stale_bytes": stale,
        "cached_bytes": cached,
        "spare_tcaches": _spare_tcache_count,
        "resets": _resets,
        "purges": _purges,
        "stale_limit": STALE_LIMIT,
        "purge_limit": PURGE_LIMIT,
        "warm_slots": WARM_SLOTS,
        "retain_limit": _retain_limit,
        "warm_bytes": warm,
        "idle_decay": _idle_decay_running(),
        # Why warm pages went: each rule that wiped an idle slot, and what jemalloc purged in all
        # (its decay of idle and open arenas, and every purge; faults with no wipe are decay's).
        "wipes": _wipe_counts(),
        "purged_bytes": _purged_bytes(),
    }


# The old name of slot_stats(): it counts jemalloc slots, not BufferPools.
pool_stats = slot_stats


# -- jemalloc's figures for stats() ----------------------------------------------------------------

# jemalloc's per-arena figures that stats() reports: (key, mallctl name, counted in pages).
_ARENA_FIGURES = (
    ("resident", b"stats.arenas.0.resident", False),
    ("mapped", b"stats.arenas.0.mapped", False),
    ("active", b"stats.arenas.0.pactive", True),
    ("dirty", b"stats.arenas.0.pdirty", True),
)
cdef size_t _mib_figures[4][4]
cdef size_t _mib_figures_len[4]
cdef bint _figure_in_pages[4]
cdef size_t _page_size = 0


cdef int _figures_init() except -1:
    global _page_size
    cdef size_t size = sizeof(size_t)
    cdef int i
    for i, (_, name, pages) in enumerate(_ARENA_FIGURES):
        _figure_in_pages[i] = pages
        _mib_figures_len[i] = 4
        if je_mallctlnametomib(name, _mib_figures[i], &_mib_figures_len[i]):
            raise ImportError(f"arenalib: the private jemalloc does not know {name.decode()}")
    je_mallctl(b"arenas.page", &_page_size, &size, NULL, 0)
    return 0


cdef void jemalloc_arena_figures(ArenaCore* core, size_t* figures) noexcept:
    """jemalloc's figures (_ARENA_FIGURES, in bytes) for the arena behind ``core``; 0 once closed."""
    cdef uint64_t epoch = 1
    cdef size_t mib[4]
    cdef size_t size
    cdef int i
    for i in range(4):
        figures[i] = 0
    # Read once: a ConfinedArena's owner may close it while another thread asks (slots are never
    # freed, so the one read stays valid).
    cdef ArenaSlot* slot = core.slot
    if not core.open or slot == NULL:
        return
    # Statistics are snapshots: advancing the epoch refreshes them.
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    for i in range(4):
        memcpy(mib, _mib_figures[i], _mib_figures_len[i] * sizeof(size_t))
        mib[2] = slot.arena_index
        size = sizeof(size_t)
        if je_mallctlbymib(mib, _mib_figures_len[i], &figures[i], &size, NULL, 0):
            figures[i] = 0
        elif _figure_in_pages[i]:
            figures[i] *= _page_size
