# The retention policy: what an idle slot keeps warm, and what goes back to the OS.
#
# An idle slot keeps the pages its last users dirtied, so the next scope on it takes no page faults
# (a 16 MiB scope that starts cold takes ~4,100).  An arena that allocated more than PURGE_LIMIT is
# a big scope: its slot is reset and kept warm when what it allocated is at most the allowance,
# min(retain limit, max(PURGE_LIMIT, 2 x the recent big scopes' size)), and wiped (reset and
# purged: the pages go back to the OS at once) otherwise, so a one-off huge scope never stays
# pinned.  The recent size follows each big close and fades by a quarter per close.  Across all
# idle slots, what they may hold (the most each slot's arena had allocated at once since its last
# purge) stays under the retain limit (32 MiB unless set_retention() says otherwise): the coldest go
# first.  A slot that drops out of the WARM_SLOTS most recently used ones is wiped too.  While the
# program is idle, jemalloc's background thread (one, started with the first arena) hands back what
# stays dirty past dirty_decay_ms, in open arenas as in idle slots: see _start_idle_decay().
# slot_stats()["wipes"] counts each rule that handed warm pages back.

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from arenalib._abi cimport PURGE_LIMIT, load_ssize

# of the recent big scopes it adapts to.
cdef size_t DEFAULT_RETAIN_LIMIT = 32 << 20
cdef size_t _retain_limit = DEFAULT_RETAIN_LIMIT
cdef size_t _recent_big_scope = 0
# jemalloc's background thread: wanted unless the user's ARENALIB_JE_MALLOC_CONF sets it, and
# started with the first arena (see _start_idle_decay).
cdef bint _idle_decay_wanted = True
cdef bint _idle_decay_started = False
# When the thread could not be started (no thread to be had: RLIMIT_NPROC, a cgroup's pids.max, no
# address space for its stack), the next try: one a second at most, with the next arena.
cdef uint64_t _idle_decay_retry_ns = 0
cdef uint64_t IDLE_DECAY_RETRY_NS = 1_000_000_000
# An arena nothing ever allocates from, reset only to wait for the background thread (see
# _background_thread_barrier()); 0 (an automatic arena, never reset) until made.
cdef unsigned _barrier_arena = 0


cdef uint64_t monotonic_ns() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return <uint64_t>now.tv_sec * 1_000_000_000 + <uint64_t>now.tv_nsec


cdef void _stop_idle_decay() noexcept nogil:
    """Stop jemalloc's background thread and wait for its end (_start_idle_decay() starts it)."""
    global _idle_decay_started
    cdef unsigned char off = 0
    je_mallctl(b"background_thread", NULL, NULL, &off, sizeof(off))
    _idle_decay_started = False


cdef void _start_idle_decay() noexcept nogil:
    """Start jemalloc's background thread, once (a start that failed, a later call tries again):
    what an open arena freed and what idle slots keep goes back to the OS after dirty_decay_ms (one
    second) even while the program makes no call.

    One thread (max_background_threads 1), started with the first arena rather than at import, so
    that importing arenalib starts nothing.  It only decays and purges arenas (under jemalloc's own
    locks), never flushes a thread cache another thread is using.  Sleeping until the next page is
    due, and without a timeout once nothing is dirty: an idle program with nothing to hand back
    gets no wake-ups.  jemalloc stops it in a fork's child, where _after_fork_in_child() restarts
    it.  Users who set background_thread in ARENALIB_JE_MALLOC_CONF decide for themselves."""
    global _idle_decay_started, _barrier_arena, _idle_decay_retry_ns
    if _idle_decay_started or not _idle_decay_wanted:
        return
    if headless:
        thread_exit_arm()  # the thread that starts it stops it at its end, if it is the last armed
    if _idle_decay_retry_ns and monotonic_ns() < _idle_decay_retry_ns:
        return
    cdef size_t one = 1
    cdef unsigned char on = 1  # a C bool
    cdef unsigned char off = 0
    je_mallctl(b"max_background_threads", NULL, NULL, &one, sizeof(size_t))
    cdef uint64_t runs = _background_runs()
    if je_mallctl(b"background_thread", NULL, NULL, &on, sizeof(on)) != 0:
        # jemalloc stays "enabled" with no thread, and takes a later write of true for a no-op:
        # off first, so that the next try starts one.
        je_mallctl(b"background_thread", NULL, NULL, &off, sizeof(off))
        _idle_decay_retry_ns = monotonic_ns() + IDLE_DECAY_RETRY_NS
        return
    _idle_decay_started = True
    _idle_decay_retry_ns = 0
    # Wait for the thread's first pass (a few hundred microseconds, once a process): it allocates
    # its thread-local data then, which glibc allocates for a dlopen'ed library at a thread's first
    # touch and, when malloc fails, ends the process ("cannot allocate memory for thread-local
    # data").  Now, rather than at the first moment the program runs out of memory.
    cdef int i
    for i in range(4000 if runs != NO_RUNS else 0):  # (at most ~0.2 s)
        if _background_runs() != runs:
            break
        arenalib_sleep_us(50)
    if _barrier_arena == 0 and _mallctl_read_unsigned(b"arenas.create", &_barrier_arena) != 0:
        _barrier_arena = 0


cdef uint64_t NO_RUNS = <uint64_t>1 << 63


cdef uint64_t _background_runs() noexcept nogil:
    """The passes jemalloc's background threads have made (NO_RUNS when it cannot say)."""
    cdef uint64_t epoch = 1
    cdef uint64_t runs = 0
    cdef size_t size = sizeof(uint64_t)
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    if je_mallctl(b"stats.background_thread.num_runs", &runs, &size, NULL, 0) != 0:
        return NO_RUNS
    return runs


cdef void _background_thread_barrier() noexcept nogil:
    """Return once jemalloc's background thread has finished the work at hand: it sleeps, or (woken
    during an earlier pause) is about to start a new pass, which a purge made before this call
    was not skipped for.

    An arena reset pauses the thread first, and pausing takes the lock the thread holds while it
    works; resetting an arena that holds nothing changes nothing else.  With one background
    thread (_start_idle_decay() asks for one) that thread serves every arena."""
    if _barrier_arena != 0:
        _arena_ctl(_mib_reset, _mib_reset_len, _barrier_arena)


def _idle_decay_running():
    """Whether jemalloc's background thread is on (for pool_stats() and the tests)."""
    cdef unsigned char on = 0
    cdef size_t size = sizeof(on)
    if je_mallctl(b"background_thread", &on, &size, NULL, 0) != 0:
        return False
    return bool(on)


cdef void slot_reset(ArenaSlot* slot) noexcept nogil:
    """Discard every allocation of the slot's arena at once (pages stay warm)."""
    # jemalloc requires every tcache that touched the arena to be flushed before a reset.
    _flush_tcache(slot.tcache_index)
    slot_flush_threads(slot, FLUSH_AND_FORGET)
    _cache_forget(&slot.cache)
    _arena_ctl(_mib_reset, _mib_reset_len, slot.arena_index)
    slot.stale_bytes = 0
    count_add(&_resets, 1)


cdef void slot_purge(ArenaSlot* slot) noexcept nogil:
    """Hand the arena's unused dirty pages back to the OS now, the free blocks cached for it
    (the slot's and each thread's) included."""
    cache_drain(&slot.cache)
    _flush_tcache(slot.tcache_index)
    slot_flush_threads(slot, FLUSH_AND_DRAIN)
    _arena_ctl(_mib_purge, _mib_purge_len, slot.arena_index)
    slot.churn_bytes = 0
    count_add(&_purges, 1)


# How long an explicit purge waits for jemalloc's background thread to finish the portion of the
# same arena it is purging (it purges a large arena in portions of ~ms each).
cdef long PURGE_WAIT_US = 20000
cdef long PURGE_ROUND_US = 100
# Up to this many jemalloc arenas, the wait reads the arena's dirty pages (jemalloc's statistics
# refresh visits every arena: ~20-60 us each); with more, it purges again a few times, blind.
cdef Py_ssize_t PURGE_CHECK_MAX_SLOTS = 64
cdef int PURGE_BLIND_ROUNDS = 2


cdef size_t _dirty_pages(unsigned arena_index) noexcept nogil:
    """The arena's dirty pages, as of now (the statistics are snapshots: the epoch refreshes them)."""
    cdef uint64_t epoch = 1
    cdef size_t mib[4]
    cdef size_t pages = 0
    cdef size_t size = sizeof(size_t)
    je_mallctl(b"epoch", NULL, NULL, &epoch, sizeof(epoch))
    memcpy(mib, _mib_pdirty, _mib_pdirty_len * sizeof(size_t))
    mib[2] = arena_index
    if je_mallctlbymib(mib, _mib_pdirty_len, &pages, &size, NULL, 0):
        return 0
    return pages


cdef void slot_purge_open(ArenaSlot* slot) noexcept nogil:
    """slot_purge() for an arena in use, which no reset may clear first (see slot_wipe()); the
    caller then waits for what jemalloc's background thread holds back (slot_purge_settle())."""
    slot_purge(slot)
    # jemalloc keeps the thread caches' own memory in its automatic arena 0 (flushing an explicit
    # tcache, as above, frees it there): 200 threads that came and went left ~13 MiB dirty.
    _arena_ctl(_mib_purge, _mib_purge_len, 0)


cdef void slot_purge_settle(ArenaSlot* slot) noexcept nogil:
    """After slot_purge_open(): while jemalloc's background thread purges the same arena (in
    portions), an explicit purge returns at once having purged nothing (pac_decay_to_limit skips
    a decay that is ``purging``).  So the purge is repeated once the background thread is done
    (_background_thread_barrier()), and then, until no dirty page is left, for at most ~20 ms
    (other threads may be freeing into it all the while).  Only the arena's purge is repeated,
    safe beside any allocation: callers run it without the GIL.  (Turning the background thread
    off for the purge, as before, deadlocked jemalloc 5.3.0: disabling joins the thread, which may
    be waiting for the lock the disabling thread holds, after an arena reset paused it.)  Whether
    pages are left is read from jemalloc's statistics, whose refresh visits every arena: with more
    than PURGE_CHECK_MAX_SLOTS arenas, where one read costs milliseconds, the wait and the purge
    are repeated PURGE_BLIND_ROUNDS times instead (the 2 ms of blind purges this replaced left
    80-120 MiB of 128 resident in 1 purge of ~15 after a reset of a 128 MiB SlicingArena)."""
    cdef long waited = 0
    cdef int rounds
    if not _idle_decay_started:
        return
    if load_ssize(&_slots_created) > PURGE_CHECK_MAX_SLOTS:  # read without the slots' mutex
        for rounds in range(PURGE_BLIND_ROUNDS):
            _purge_behind_background_thread(slot)
        return
    _purge_behind_background_thread(slot)
    while waited < PURGE_WAIT_US and _dirty_pages(slot.arena_index) != 0:
        arenalib_sleep_us(PURGE_ROUND_US)
        waited += PURGE_ROUND_US
        _purge_behind_background_thread(slot)


cdef void _purge_behind_background_thread(ArenaSlot* slot) noexcept nogil:
    """Purge the slot's arena once jemalloc's background thread has finished the work at hand: a
    purge is skipped while that thread purges the same arena."""
    _background_thread_barrier()
    _arena_ctl(_mib_purge, _mib_purge_len, slot.arena_index)


# Why an idle slot's warm pages were handed back (pool_stats()["wipes"] counts each).
cdef enum WipeReason:
    WIPE_OVER_ALLOWANCE      # a big scope larger than the allowance closed
    WIPE_OVER_RETAIN_LIMIT   # idle slots held more than the retain limit: the coldest went
    WIPE_OUT_OF_WARM_SLOTS   # the slot fell out of the WARM_SLOTS most recently used
    WIPE_TRIM                # arenalib.trim()
    WIPE_NO_MEMORY           # no memory to keep the slot in the pool
    WIPE_REASONS

cdef Py_ssize_t _wipes[<int>WIPE_REASONS]
_WIPE_NAMES = ("over_allowance", "over_retain_limit", "out_of_warm_slots", "trim", "no_memory")


cdef void slot_wipe(ArenaSlot* slot, WipeReason reason) noexcept nogil:
    """Drop the slot's garbage and cached blocks and hand its pages back to the OS."""
    count_add(&_wipes[<int>reason], 1)
    # With jemalloc's background thread on, a purge returns at once, purging nothing, while that
    # thread is purging the same arena (it does so in portions: pac_decay_to_limit's
    # ``decay->purging``), which left a big close's pages resident for up to a second (1 close in ~6
    # of a 128 MiB arena freed segment by segment).  A reset pauses the thread once its work at
    # hand is done, and the purge follows; but the thread, woken meanwhile, may start on the arena
    # again first (a CI run: 107 of 256 MiB left), and the slot, its churn counted as purged, then
    # kept them past trim().  So a big scope's purge is repeated once the thread is done (what a
    # small one leaves decays within dirty_decay_ms), and trim() purges every idle slot again after
    # the thread, whatever its books say (once for all: _wipe_idle_slots).
    cdef size_t churn = slot.churn_bytes
    if slot.stale_bytes or cache_held_bytes(&slot.cache) or _idle_decay_started:
        slot_reset(slot)
    if churn:
        slot_purge(slot)
    if churn > PURGE_LIMIT and reason != WIPE_TRIM and _idle_decay_started:
        _purge_behind_background_thread(slot)


cdef void slot_release(ArenaSlot* slot, size_t stale, size_t churn) noexcept nogil:
    """Give a slot back to the pool; ``stale`` bytes of it were left allocated by its last user,
    which allocated ``churn`` bytes in all."""
    pool_lock()
    _slot_give_back(slot, stale, churn)
    _keep_within_retain_limit()
    pool_unlock()


cdef void _slot_give_back(ArenaSlot* slot, size_t stale, size_t churn) noexcept nogil:
    global _free_slots, _free_count, _free_capacity
    cdef ArenaSlot** grown
    # What the slot may hold (see _warm_bytes) is the most its arena had allocated at once since its
    # last purge, not the sum of its users' churn: jemalloc hands freed pages out again before new
    # ones, so this user added at most what it allocated on top of the garbage left before it.
    # Summed, a repeated 4 MiB scope (reset for its garbage, not a big scope) passed the retain
    # limit at every 9th close and was wiped: 1,024 faults for the next scope, 128 a scope on average.
    slot.churn_bytes = max(slot.churn_bytes, slot.stale_bytes + churn)
    slot.stale_bytes += stale
    if churn > PURGE_LIMIT:
        _big_scope_closed(slot, churn)
    elif slot.stale_bytes > STALE_LIMIT:
        slot_reset(slot)         # garbage of many small scopes: drop it, keep the pages warm
    # Last in, first out: the slot given back now is parked, an idle one parked before joins the
    # pool (one in use stops being the parked slot: it comes back through here).
    cdef bint displaced = _inline_state.parked_idle and _inline_state.parked != slot
    slot, _inline_state.parked = _inline_state.parked, slot
    _inline_state.parked_idle = True
    if not displaced:
        return
    if _free_count == _free_capacity:
        grown = <ArenaSlot**>realloc(  # (libc's: see _slots.pxi)
            _free_slots, <size_t>(_free_capacity * 2 + 16) * sizeof(ArenaSlot*))
        if grown == NULL:
            slot_wipe(slot, WIPE_NO_MEMORY)
            return  # no memory for bookkeeping: the slot stays unused (and empty), never unsafe
        _free_slots = grown
        _free_capacity = _free_capacity * 2 + 16
    _free_slots[_free_count] = slot
    _free_count += 1
    # Slots are taken LIFO: the one now falling out of the warm window may idle for long.
    if _free_count > WARM_SLOTS:
        slot_wipe(_free_slots[_free_count - 1 - WARM_SLOTS], WIPE_OUT_OF_WARM_SLOTS)


cdef void _big_scope_closed(ArenaSlot* slot, size_t size) noexcept nogil:
    """A slot whose arena allocated ``size`` > PURGE_LIMIT bytes comes back: kept warm (reset, its
    pages dirty for the next scope) when ``size`` is within the allowance, else wiped."""
    global _recent_big_scope
    cdef size_t allowance = max(<size_t>PURGE_LIMIT, 2 * _recent_big_scope)
    allowance = min(allowance, _retain_limit)
    _recent_big_scope = max(size, _recent_big_scope - _recent_big_scope // 4)
    if size > allowance:
        slot_wipe(slot, WIPE_OVER_ALLOWANCE)          # one-off or too big: its memory goes back to the OS now
        return
    slot_reset(slot)
    # What the slot holds dirty now: about one scope's pages, which the next scope reuses (what it
    # had dirty before this scope, jemalloc handed out again first; the rest decays, see above).
    slot.churn_bytes = size


cdef size_t _warm_bytes(ArenaSlot* slot) noexcept nogil:
    """What an idle slot (nothing live in it) may hold in RAM: the most its arena had allocated at
    once since the last purge (see _slot_give_back)."""
    return slot.churn_bytes


cdef size_t _free_slots_warm_bytes() noexcept nogil:
    """What the free slots may hold: only the WARM_SLOTS newest can hold anything (the others
    were wiped as they dropped out).  The parked slot comes on top."""
    cdef size_t total = 0
    cdef Py_ssize_t i
    for i in range(max(0, _free_count - WARM_SLOTS), _free_count):
        total += _warm_bytes(_free_slots[i])
    return total


cdef void _keep_within_retain_limit() noexcept nogil:
    """Wipe idle slots, coldest first, until what they may hold is within the retain limit, and
    tell the inline close (close_small_scope in _confined.pxd) how far the parked slot may grow idle."""
    cdef size_t total = _free_slots_warm_bytes()
    cdef size_t parked = _warm_bytes(_inline_state.parked) if _inline_state.parked_idle else 0
    cdef Py_ssize_t i = max(0, _free_count - WARM_SLOTS)
    while total + parked > _retain_limit and i < _free_count:
        if _warm_bytes(_free_slots[i]):
            total -= _warm_bytes(_free_slots[i])
            slot_wipe(_free_slots[i], WIPE_OVER_RETAIN_LIMIT)
        i += 1
    if total + parked > _retain_limit:
        slot_wipe(_inline_state.parked, WIPE_OVER_RETAIN_LIMIT)
    # The parked slot's headroom (also when it is in use: it comes back through the inline close).
    _inline_state.parked_headroom = _retain_limit - total


def set_retention(max_bytes):
    """Set the most bytes of freed pages that closed arenas keep in RAM, warm for the next arenas
    (default 32 MiB, across all threads).  0: every close hands its pages back to the OS at once
    (slower scopes, the smallest footprint); a limit beyond any address space is no limit
    (get_retention() then says sys.maxsize).  Idle slots above the new limit are wiped now."""
    global _retain_limit
    cdef Py_ssize_t limit
    try:
        limit = parse_size(max_bytes, "max_bytes")
    except MemoryError:  # (parse_size's for a size no allocation could have, as max_bytes= takes it)
        limit = PY_SSIZE_T_MAX
    pool_lock()
    _retain_limit = <size_t>limit
    _keep_within_retain_limit()
    pool_unlock()


def get_retention():
    """The most bytes of freed pages closed arenas keep warm (see set_retention())."""
    return _retain_limit


def trim():
    """Reset and purge every idle pooled jemalloc arena: all memory not held by an open arena goes
    back to the OS (open arenas are not touched; see their purge())."""
    if FREE_THREADED:
        with nogil:
            _wipe_idle_slots()
    else:
        # With the GIL, the GIL is the slot pool's lock: the inline open of any module takes the
        # parked slot holding it, so the wipe keeps it (a few ms for hundreds of idle slots: a
        # reset and a purge or two each; what they hold is at most the retain limit).
        _wipe_idle_slots()


cdef void _wipe_idle_slots() noexcept nogil:
    cdef Py_ssize_t i
    pool_lock()
    if _inline_state.parked_idle:
        slot_wipe(_inline_state.parked, WIPE_TRIM)
    for i in range(_free_count):
        slot_wipe(_free_slots[i], WIPE_TRIM)
    if _idle_decay_started:  # each purge again, once jemalloc's background thread is done (slot_wipe)
        _background_thread_barrier()
        if _inline_state.parked_idle:
            _arena_ctl(_mib_purge, _mib_purge_len, _inline_state.parked.arena_index)
        for i in range(_free_count):
            _arena_ctl(_mib_purge, _mib_purge_len, _free_slots[i].arena_index)
    pool_unlock()
