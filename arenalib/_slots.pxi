# The pool of jemalloc arenas and explicit thread caches behind arenalib's arena objects, and the
# calls that allocate from them (jemalloc_allocate, and the free-block cache in front of it).
#
# Why a pool: creating a jemalloc arena is slow and destroying one leaks metadata, and only ~4000 can
# exist at once (DESIGN.md has the figures).  So jemalloc arenas are never destroyed: a closed arena
# object hands its slot back here.
#
# Why deferred resets: a jemalloc arena reset costs far more than a small scope's whole budget.  A
# closed arena's allocations are garbage nobody can reach (its segments check the arena object, never
# jemalloc), so a slot goes back warm with that garbage counted as stale_bytes, and is reset in bulk
# once the garbage passes STALE_LIMIT.
#
# What stays warm (the retention policy): an idle slot keeps the pages its last users dirtied, so the
# next scope on it takes no page faults (a 16 MiB scope that starts cold takes ~4,100).  An arena
# that allocated more than PURGE_LIMIT is a big scope: its slot is reset and kept warm when what it
# allocated is at most the allowance, min(retain limit, max(PURGE_LIMIT, 2 x the recent big scopes'
# size)), and wiped (reset and purged: the pages go back to the OS at once) otherwise, so a one-off
# huge scope never stays pinned.  The recent size follows each big close and fades by a quarter per
# close.  Across all idle slots, what they may hold (the most each slot's arena had allocated at
# once since its last purge) stays under the retain limit (32 MiB unless set_retention() says
# otherwise): the coldest go first.  A slot that drops out of the WARM_SLOTS most recently used ones
# is wiped too.  While the program is idle, jemalloc's background thread (one, started with the
# first arena) hands back what stays dirty past dirty_decay_ms, in open arenas as in idle slots: see
# _start_idle_decay().
#
# The slot pool is used with the GIL held on a GIL build; on a free-threaded build it is under
# pool_lock() (taken by slot_acquire, slot_release, trim and pool_stats, never while anything can
# run Python code).  The spare tcaches of shared arenas are taken from nogil code too, so they have
# a lock of their own.

from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawRealloc
from cpython.pythread cimport (
    PyThread_acquire_lock, PyThread_allocate_lock, PyThread_free_lock, PyThread_release_lock,
    PyThread_type_lock, WAIT_LOCK,
)
from libc.string cimport memcpy, memset

import os

from arenalib._capi cimport (
    CACHE_BINS, CACHE_MAX_BYTES, CACHE_MAX_PER_BIN, CACHE_MAX_SIZE, NO_HOT_BLOCK, PURGE_LIMIT, ArenaSlot,
    FreeBlocks, InlineState, ThreadCache, arenalib_compiler_fence, cache_bin, cache_bin_size,
    cache_held_bytes, cache_pop, cache_push,
)
from arenalib._jemalloc cimport (
    MALLOCX_ARENA, MALLOCX_LG_ALIGN, MALLOCX_TCACHE, MALLOCX_TCACHE_NONE, MALLOCX_ZERO, je_dallocx,
    je_mallctl, je_mallctlbymib, je_mallctlnametomib, je_mallocx,
)

cdef extern from *:
    """
    #define arenalib_ctz(x) __builtin_ctzll(x)
    #include <time.h>
    static void arenalib_sleep_us(long us) {
        struct timespec ts = {0, us * 1000L};
        nanosleep(&ts, NULL);
    }
    #if ARENALIB_FREE_THREADED
    #include <pthread.h>
    static pthread_mutex_t arenalib_pool_mutex = PTHREAD_MUTEX_INITIALIZER;
    #define arenalib_pool_lock() pthread_mutex_lock(&arenalib_pool_mutex)
    #define arenalib_pool_unlock() pthread_mutex_unlock(&arenalib_pool_mutex)
    #define arenalib_pool_lock_reinit() pthread_mutex_init(&arenalib_pool_mutex, NULL)
    #else  /* the GIL serialises the slot pool */
    #define arenalib_pool_lock() ((void)0)
    #define arenalib_pool_unlock() ((void)0)
    #define arenalib_pool_lock_reinit() ((void)0)
    #endif
    """
    int arenalib_ctz(unsigned long long x) noexcept nogil
    void arenalib_sleep_us(long us) noexcept nogil
    void pool_lock "arenalib_pool_lock"() noexcept nogil
    void pool_unlock "arenalib_pool_unlock"() noexcept nogil
    void pool_lock_reinit "arenalib_pool_lock_reinit"() noexcept nogil

# A slot or thread without an explicit tcache (none could be had: jemalloc allows ~4094, and after a
# fork the parent's are unusable) allocates with MALLOCX_TCACHE_NONE: slower, never wrong.
cdef unsigned NO_TCACHE = <unsigned>-1

# jemalloc 5.3.0 allows ~4094 arenas, but arenas.create reads out of bounds near that limit (seen
# under AddressSanitizer: a crash in ctl_arena_init): arenalib stops short of it.
cdef Py_ssize_t MAX_SLOTS = 4000
cdef size_t STALE_LIMIT = 1 << 20
cdef Py_ssize_t WARM_SLOTS = 4
# The retention policy (see the top of this file): the cap on what idle slots may hold, and the size
# of the recent big scopes it adapts to.
cdef size_t DEFAULT_RETAIN_LIMIT = 32 << 20
cdef size_t _retain_limit = DEFAULT_RETAIN_LIMIT
cdef size_t _recent_big_scope = 0
# jemalloc's background thread: wanted unless the user's ARENALIB_JE_MALLOC_CONF speaks of it, and
# started with the first arena (see _start_idle_decay).
cdef bint _idle_decay_wanted = True
cdef bint _idle_decay_started = False

cdef ArenaSlot** _free_slots = NULL
cdef Py_ssize_t _free_count = 0
cdef Py_ssize_t _free_capacity = 0
cdef Py_ssize_t _slots_created = 0
cdef Py_ssize_t _resets = 0
cdef Py_ssize_t _purges = 0

cdef extern from *:
    """
    #include <stdlib.h>
    #include <string.h>
    /* Zeroed memory on a cache-line boundary (NULL: none), never freed. */
    static void *arenalib_cache_aligned(size_t size) {
        void *p = NULL;
        if (posix_memalign(&p, 64, size) != 0)
            return NULL;
        return memset(p, 0, size);
    }
    """
    void* arenalib_cache_aligned(size_t size) noexcept nogil

# The slot given back last is parked here, outside _free_slots, where the inline arena_open() of any
# module can take it without a call; the SlicingArena carver records and the C API's function table
# live here too (see InlineState in _capi.pxd).  Allocated by slots_init().
cdef InlineState* _inline_state = NULL

cdef unsigned* _spare_tcaches = NULL
cdef Py_ssize_t _spare_tcache_count = 0
cdef Py_ssize_t _spare_tcache_capacity = 0
cdef PyThread_type_lock _spare_tcache_lock = NULL

# Management interfaces translated to MIBs once; a copy gets the arena index patched in per call.
cdef size_t _mib_reset[3]
cdef size_t _mib_purge[3]
cdef size_t _mib_tcache_flush[2]
cdef size_t _mib_reset_len = 3
cdef size_t _mib_purge_len = 3
cdef size_t _mib_tcache_flush_len = 2
cdef size_t _mib_batch_alloc[2]
cdef size_t _mib_batch_alloc_len = 2
cdef size_t _mib_pdirty[4]
cdef size_t _mib_pdirty_len = 4


cdef int slots_init() except -1:
    """The slot pool's start-up: the shared state, the lock of the spare tcaches, the MIBs, and
    the fork handler."""
    global _inline_state, _spare_tcache_lock, _all_slots_lock, _pid, _idle_decay_wanted
    _inline_state = <InlineState*>arenalib_cache_aligned(sizeof(InlineState))
    _spare_tcache_lock = PyThread_allocate_lock()
    _all_slots_lock = PyThread_allocate_lock()
    if arenalib_records_init() != 0 or arenalib_thread_exit_init(_thread_exit) != 0:
        raise MemoryError("cannot create the thread key of arenalib's access records")
    if _inline_state == NULL or _spare_tcache_lock == NULL or _all_slots_lock == NULL:
        raise ImportError("arenalib: cannot allocate its shared state")
    _inline_state.parked_headroom = _retain_limit
    if (je_mallctlnametomib(b"arena.0.reset", _mib_reset, &_mib_reset_len)
            or je_mallctlnametomib(b"arena.0.purge", _mib_purge, &_mib_purge_len)
            or je_mallctlnametomib(b"tcache.flush", _mib_tcache_flush, &_mib_tcache_flush_len)
            or je_mallctlnametomib(b"experimental.batch_alloc", _mib_batch_alloc,
                                   &_mib_batch_alloc_len)
            or je_mallctlnametomib(b"stats.arenas.0.pdirty", _mib_pdirty, &_mib_pdirty_len)):
        raise ImportError("arenalib: the private jemalloc did not answer mallctlnametomib")
    _pid = os.getpid()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _idle_decay_wanted = "background_thread" not in os.environ.get("ARENALIB_JE_MALLOC_CONF", "")
    return 0


cdef void _start_idle_decay() noexcept nogil:
    """Start jemalloc's background thread, once: what an open arena freed and what idle slots keep
    goes back to the OS after dirty_decay_ms (one second) even while the program makes no call.

    One thread (max_background_threads 1), started with the first arena rather than at import, so
    that importing arenalib starts nothing.  It only decays and purges arenas (under jemalloc's own
    locks), never flushes a thread cache another thread is using.  Sleeping until the next page is
    due, and without a timeout once nothing is dirty: an idle program with nothing to hand back
    gets no wake-ups.  jemalloc stops it in a fork's child, where _after_fork_in_child() restarts
    it.  Users who set background_thread in ARENALIB_JE_MALLOC_CONF decide for themselves."""
    global _idle_decay_started
    if _idle_decay_started or not _idle_decay_wanted:
        return
    _idle_decay_started = True
    cdef size_t one = 1
    cdef unsigned char on = 1  # a C bool
    je_mallctl(b"max_background_threads", NULL, NULL, &one, sizeof(size_t))
    je_mallctl(b"background_thread", NULL, NULL, &on, sizeof(on))


def _idle_decay_running():
    """Whether jemalloc's background thread is on (for pool_stats() and the tests)."""
    cdef unsigned char on = 0
    cdef size_t size = sizeof(on)
    if je_mallctl(b"background_thread", &on, &size, NULL, 0) != 0:
        return False
    return bool(on)


cdef int _mallctl_read_unsigned(const char* name, unsigned* out) noexcept nogil:
    cdef size_t size = sizeof(unsigned)
    return je_mallctl(name, out, &size, NULL, 0)


cdef void _arena_ctl(size_t* mib_template, size_t mib_len, unsigned arena_index) noexcept nogil:
    cdef size_t mib[3]
    memcpy(mib, mib_template, mib_len * sizeof(size_t))
    mib[1] = arena_index
    je_mallctlbymib(mib, mib_len, NULL, NULL, NULL, 0)


cdef void _flush_tcache(unsigned tcache_index) noexcept nogil:
    if tcache_index == NO_TCACHE:
        return
    je_mallctlbymib(_mib_tcache_flush, _mib_tcache_flush_len, NULL, NULL,
                    &tcache_index, sizeof(unsigned))


cdef uint64_t _next_serial = 1


cdef ArenaSlot* slot_acquire(uint64_t* serial) except NULL:
    """A warm pooled slot, or a new jemalloc arena with its tcache; ``serial`` gets the arena's
    serial number (unique for the process's life)."""
    global _next_serial
    cdef int err = 0
    pool_lock()
    cdef ArenaSlot* slot = _slot_take(&err)
    serial[0] = _next_serial
    _next_serial += 1
    _start_idle_decay()
    pool_unlock()
    if slot != NULL:
        return slot
    if err == -1:
        raise MemoryError(
            f"{_slots_created} arenas are open, the most arenalib opens at once; "
            "close arenas that are no longer needed")
    if err == -2:
        raise MemoryError("cannot allocate an arena slot")
    raise MemoryError(
        f"jemalloc cannot create another arena (error {err}): {_slots_created} are in use; "
        "close arenas that are no longer needed")


cdef ArenaSlot* _slot_take(int* err) noexcept:
    """slot_acquire() under the pool lock: NULL with ``err`` -1 at MAX_SLOTS, -2 without memory,
    else jemalloc's error."""
    global _free_count, _slots_created
    if _inline_state.parked_idle:
        _inline_state.parked_idle = False
        return _inline_state.parked
    if _free_count:
        _free_count -= 1
        return _free_slots[_free_count]
    cdef unsigned arena_index, tcache_index
    if _slots_created >= MAX_SLOTS:
        err[0] = -1
        return NULL
    err[0] = _mallctl_read_unsigned(b"arenas.create", &arena_index)
    if err[0]:
        return NULL
    if tcache_take(&tcache_index) != 0:
        tcache_index = NO_TCACHE
    cdef ArenaSlot* slot = <ArenaSlot*>PyMem_RawCalloc(1, sizeof(ArenaSlot))
    if slot != NULL:
        slot.threads_lock = PyThread_allocate_lock()
    # Remembered last: the fork handler walks every remembered slot and its lock.
    if slot == NULL or slot.threads_lock == NULL or not _remember_slot(slot):
        # The new arena stays unused: destroying it would leak metadata and free an index that a
        # stale reference could alias.
        if slot != NULL and slot.threads_lock != NULL:
            PyThread_free_lock(<PyThread_type_lock>slot.threads_lock)
        PyMem_RawFree(slot)
        err[0] = -2
        return NULL
    slot.arena_index = arena_index
    slot.tcache_index = tcache_index
    _slots_created += 1
    return slot


cdef inline int tcache_flag(unsigned tcache_index) noexcept nogil:
    return MALLOCX_TCACHE_NONE if tcache_index == NO_TCACHE else MALLOCX_TCACHE(tcache_index)


cdef inline int slot_flags(ArenaSlot* slot) noexcept nogil:
    return MALLOCX_ARENA(slot.arena_index) | tcache_flag(slot.tcache_index)


cdef ArenaSlot** _all_slots = NULL   # every slot ever made, idle or in use (for fork)
cdef Py_ssize_t _all_slots_count = 0
# Guards _all_slots against its growth: a thread that ends walks it without the GIL or the pool
# lock (see shared_thread_exit), and the pool lock is no lock at all on a GIL build.
cdef PyThread_type_lock _all_slots_lock = NULL


cdef bint _remember_slot(ArenaSlot* slot) noexcept nogil:
    global _all_slots, _all_slots_count
    PyThread_acquire_lock(_all_slots_lock, WAIT_LOCK)
    cdef ArenaSlot** grown = <ArenaSlot**>PyMem_RawRealloc(
        _all_slots, <size_t>(_all_slots_count + 1) * sizeof(ArenaSlot*))
    if grown != NULL:
        _all_slots = grown
        _all_slots[_all_slots_count] = slot
        _all_slots_count += 1
    PyThread_release_lock(_all_slots_lock)
    return grown != NULL


cdef unsigned _fresh_tcache() noexcept nogil:
    cdef unsigned tcache_index
    if _mallctl_read_unsigned(b"tcache.create", &tcache_index) != 0:
        return NO_TCACHE
    return tcache_index


cdef object _pid = None  # the process slots_init() ran in (set by it)


def _after_fork_in_child():
    """jemalloc's child forgets the explicit tcaches made before the fork (flushing one would
    corrupt it): give every slot and thread cache a new one, never touch the old ones again, and
    replace locks another thread of the parent may have held.  A no-op in a process that did not
    fork since the last call (the function is reachable from Python)."""
    global _spare_tcache_count, _spare_tcache_lock, _all_slots_lock, _pid, _idle_decay_started
    if os.getpid() == _pid:
        return
    _pid = os.getpid()
    if _idle_decay_started:  # jemalloc stopped its background thread in this child
        _idle_decay_started = False
        _start_idle_decay()
    cdef Py_ssize_t i
    cdef ArenaSlot* slot
    cdef ThreadCache* tc
    _spare_tcache_count = 0
    _spare_tcache_lock = PyThread_allocate_lock()
    _all_slots_lock = PyThread_allocate_lock()
    pool_lock_reinit()
    arenalib_records_after_fork()
    slicing_after_fork()
    for i in range(_all_slots_count):
        slot = _all_slots[i]
        slot.tcache_index = _fresh_tcache()
        slot.threads_lock = PyThread_allocate_lock()
        tc = slot.threads
        while tc != NULL:
            tc.tcache_index = _fresh_tcache()
            if tc.thread != thread_ident():
                tc.thread = 0  # its thread is not in the child: the child's threads take it over
            tc = tc.next


cdef extern from *:
    """
    /* A thread-specific value with a destructor: arenalib's per-thread state goes back when a
       thread that has some ends (see _thread_exit).  Set once per thread. */
    #include <pthread.h>
    static pthread_key_t arenalib_thread_exit_key;
    static __thread int arenalib_thread_exit_armed;
    static int arenalib_thread_exit_init(void (*on_exit)(void *)) {
        return pthread_key_create(&arenalib_thread_exit_key, on_exit);
    }
    static inline void arenalib_thread_exit_arm(void) {
        if (!arenalib_thread_exit_armed) {
            arenalib_thread_exit_armed = 1;
            pthread_setspecific(arenalib_thread_exit_key, (void *)1);
        }
    }
    """
    int arenalib_thread_exit_init(void (*on_exit)(void*) noexcept nogil) noexcept nogil
    void thread_exit_arm "arenalib_thread_exit_arm"() noexcept nogil


cdef void _thread_exit(void* unused) noexcept nogil:
    """A thread that holds per-thread state of arenalib (armed by thread_exit_arm()) ends: its
    shared Arenas' caches and its SlicingArena carver record go back.  Without this, threads that
    come and go would each keep up to CACHE_MAX_BYTES of free blocks (plus jemalloc's tcache) until
    the arena closed, and their records would stay taken.  Runs after the thread's Python state is
    gone: no Python code, only C and locks."""
    shared_thread_exit()
    slicing_thread_exit()


cdef void _cache_forget(FreeBlocks* cache) noexcept nogil:
    """Forget the cached free blocks (the caller resets the arena, which frees them in bulk)."""
    memset(cache, 0, sizeof(FreeBlocks))


cdef void cache_drain(FreeBlocks* cache) noexcept nogil:
    """Give every cached free block back to jemalloc (before a purge, which can then hand their
    pages to the OS, or when the thread that kept them ends), and empty the cache.

    The cache is emptied first and its blocks freed from a copy: a fork made by another thread
    meanwhile gives the child either the whole cache, none of it freed (jemalloc's fork handlers
    wait for a free under way), or an empty one, never lists of blocks jemalloc has taken back
    (a child thread taking the cache over was handed blocks twice)."""
    cdef FreeBlocks blocks = cache[0]
    cdef int b
    cdef void* ptr
    cdef void* next_ptr
    _cache_forget(cache)
    arenalib_compiler_fence()
    if blocks.hot_tag != NO_HOT_BLOCK:
        je_dallocx(blocks.hot, MALLOCX_TCACHE_NONE)
    for b in range(CACHE_BINS):
        ptr = blocks.heads[b]
        while ptr != NULL:
            next_ptr = (<void**>ptr)[0]
            je_dallocx(ptr, MALLOCX_TCACHE_NONE)
            ptr = next_ptr


# What slot_flush_threads() does besides flushing each thread's jemalloc tcache.
cdef enum FlushMode:
    FLUSH_AND_DRAIN      # before a purge: the cached blocks go back to jemalloc
    FLUSH_AND_FORGET     # before a reset: their books and cached blocks go too
    FLUSH_AND_GIVE_BACK  # threads long gone: their tcaches go back to the spares, the caches go


cdef size_t slot_flush_threads(ArenaSlot* slot, FlushMode mode) noexcept nogil:
    """Flush the jemalloc tcache of every thread that used the slot through a shared arena, and
    more as ``mode`` says.  Returns the bytes the caches given back held (garbage from now on)."""
    cdef ThreadCache* tc
    cdef ThreadCache* next_tc
    cdef size_t dropped = 0
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL:
        next_tc = tc.next
        if mode == FLUSH_AND_DRAIN:
            cache_drain(&tc.cache)
        _flush_tcache(tc.tcache_index)
        if mode == FLUSH_AND_FORGET:
            tc.books.live_bytes = 0   # what it allocated in all still counts
            tc.books.live_segments = 0
            _cache_forget(&tc.cache)
        if mode == FLUSH_AND_GIVE_BACK:
            dropped += cache_held_bytes(&tc.cache)
            tcache_give_back(tc.tcache_index)
            PyMem_RawFree(tc)
        tc = next_tc
    if mode == FLUSH_AND_GIVE_BACK:
        slot.threads = NULL
        slot.thread_count = 0
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)
    return dropped


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
cdef int PURGE_BLIND_ROUNDS = 4
cdef long PURGE_BLIND_ROUND_US = 500


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
    a decay that is ``purging``), so the arena is purged again until no dirty page is left, for
    at most ~20 ms (other threads may be freeing into it all the while).  Only the arena's purge
    is repeated, safe beside any allocation: callers run it without the GIL.  (Turning the
    background thread off for the purge, as before, deadlocked jemalloc 5.3.0: disabling joins
    the thread, which may be waiting for the lock the disabling thread holds, after an arena
    reset paused it.)  Whether pages are left is read from jemalloc's statistics, whose refresh
    visits every arena: with more than PURGE_CHECK_MAX_SLOTS arenas, where one read costs
    milliseconds, the purge is repeated PURGE_BLIND_ROUNDS times over ~2 ms instead."""
    cdef long waited = 0
    cdef int rounds
    if not _idle_decay_started:
        return
    if _slots_created > PURGE_CHECK_MAX_SLOTS:
        for rounds in range(PURGE_BLIND_ROUNDS):
            arenalib_sleep_us(PURGE_BLIND_ROUND_US)
            _arena_ctl(_mib_purge, _mib_purge_len, slot.arena_index)
        return
    while waited < PURGE_WAIT_US and _dirty_pages(slot.arena_index) != 0:
        arenalib_sleep_us(PURGE_ROUND_US)
        waited += PURGE_ROUND_US
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
    # With jemalloc's background thread on, the reset also lines the purge up behind it: a purge
    # returns at once, purging nothing, while that thread is purging the same arena (it does so in
    # portions: pac_decay_to_limit's ``decay->purging``), which left a big close's pages resident
    # for up to a second (1 close in ~6 of a 128 MiB arena freed segment by segment).  A reset
    # pauses the thread once its work at hand is done, and the purge follows at once.
    if slot.stale_bytes or cache_held_bytes(&slot.cache) or _idle_decay_started:
        slot_reset(slot)
    if slot.churn_bytes:
        slot_purge(slot)


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
        grown = <ArenaSlot**>PyMem_RawRealloc(
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
    tell the inline close (close_small_scope in _capi.pxd) how far the parked slot may grow idle."""
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
    (slower scopes, the smallest footprint).  Idle slots above the new limit are wiped now."""
    global _retain_limit
    cdef Py_ssize_t limit = parse_size(max_bytes, "max_bytes")
    pool_lock()
    _retain_limit = <size_t>limit
    _keep_within_retain_limit()
    pool_unlock()


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


def get_retention():
    """The most bytes of freed pages closed arenas keep warm (see set_retention())."""
    return _retain_limit


cdef int tcache_take(unsigned* out) noexcept nogil:
    """A spare explicit tcache (for a shared arena's thread), or a new one; 0 on success."""
    global _spare_tcache_count
    PyThread_acquire_lock(_spare_tcache_lock, WAIT_LOCK)
    if _spare_tcache_count:
        _spare_tcache_count -= 1
        out[0] = _spare_tcaches[_spare_tcache_count]
        PyThread_release_lock(_spare_tcache_lock)
        return 0
    PyThread_release_lock(_spare_tcache_lock)
    out[0] = _fresh_tcache()
    return 0 if out[0] != NO_TCACHE else -1


cdef void tcache_give_back(unsigned tcache_index) noexcept nogil:
    """Keep a flushed tcache for the next shared arena's thread (tcaches are never destroyed)."""
    global _spare_tcaches, _spare_tcache_count, _spare_tcache_capacity
    cdef unsigned* grown
    if tcache_index == NO_TCACHE:
        return
    PyThread_acquire_lock(_spare_tcache_lock, WAIT_LOCK)
    if _spare_tcache_count == _spare_tcache_capacity:
        grown = <unsigned*>PyMem_RawRealloc(
            _spare_tcaches, <size_t>(_spare_tcache_capacity * 2 + 16) * sizeof(unsigned))
        if grown == NULL:
            PyThread_release_lock(_spare_tcache_lock)
            return
        _spare_tcaches = grown
        _spare_tcache_capacity = _spare_tcache_capacity * 2 + 16
    _spare_tcaches[_spare_tcache_count] = tcache_index
    _spare_tcache_count += 1
    PyThread_release_lock(_spare_tcache_lock)


def trim():
    """Reset and purge every idle pooled jemalloc arena: all memory not held by an open arena goes
    back to the OS (open arenas are not touched; see their purge())."""
    if FREE_THREADED:
        with nogil:
            _wipe_idle_slots()
    else:
        # With the GIL, the GIL is the slot pool's lock: the inline open of any module takes the
        # parked slot holding it, so the wipe keeps it (a few ms at most: idle slots hold at most
        # the retain limit).
        _wipe_idle_slots()


cdef void _wipe_idle_slots() noexcept nogil:
    cdef Py_ssize_t i
    pool_lock()
    if _inline_state.parked_idle:
        slot_wipe(_inline_state.parked, WIPE_TRIM)
    for i in range(_free_count):
        slot_wipe(_free_slots[i], WIPE_TRIM)
    pool_unlock()


def pool_stats():
    """Figures of the pool of jemalloc arenas shared by all arena objects (for tests and tuning)."""
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


# -- allocating from jemalloc ------------------------------------------------------------------------

# zero=True blocks up to this size are zeroed by memset, not by jemalloc (see DESIGN.md).
cdef size_t EAGER_ZERO_LIMIT = 4 << 20


cdef inline void* jemalloc_allocate(int flags, size_t size, size_t align, bint zero) noexcept nogil:
    """``size`` bytes from jemalloc with ``flags`` (arena, tcache) at ``align``; NULL: no memory."""
    cdef bint memset_here = zero and CACHE_MAX_SIZE < size <= EAGER_ZERO_LIMIT
    if zero and not memset_here:
        flags |= MALLOCX_ZERO
    if align > 1:
        flags |= MALLOCX_LG_ALIGN(arenalib_ctz(align))
    cdef void* ptr = je_mallocx(size, flags)
    if memset_here and ptr != NULL:
        # jemalloc would zero a reused large extent by purging it, which moves the cost to a page
        # fault per page at first touch: a memset is far cheaper up to EAGER_ZERO_LIMIT.
        memset(ptr, 0, size)
    return ptr


# -- the free-block cache (confined arenas and each thread of a shared one) -----------------------

cdef enum:
    # A cache miss for a block up to REFILL_MAX_SIZE takes REFILL_BLOCKS blocks of its class in one
    # call into jemalloc, the rest kept in the cache for the next allocations: a scope of many
    # small blocks pays jemalloc's entry (~130 instructions a mallocx) once per REFILL_BLOCKS.
    # Larger blocks are few enough per scope that the prefetch would only hold memory.
    REFILL_MAX_SIZE = 4096
    REFILL_BLOCKS = 16


cdef struct BatchRequest:
    # jemalloc's batch_alloc_packet_t (src/ctl.c), written to experimental.batch_alloc.
    void** ptrs
    size_t num
    size_t size
    int flags


cdef void* _cache_refill(FreeBlocks* cache, int flags, int b) noexcept nogil:
    """A new block of size class ``b``, with up to REFILL_BLOCKS - 1 more of the class put in the
    cache's list (as many as the cache has room for), all from one call into jemalloc; NULL when
    jemalloc gave none."""
    cdef size_t block = cache_bin_size(b)
    cdef size_t room = min(<size_t>(CACHE_MAX_PER_BIN - cache.counts[b]),
                           (CACHE_MAX_BYTES - cache.cached_bytes) // block)
    cdef void* blocks[REFILL_BLOCKS]
    cdef BatchRequest request
    request.ptrs = blocks
    request.num = min(<size_t>REFILL_BLOCKS, room + 1)
    request.size = block
    request.flags = flags
    cdef size_t filled = 0
    cdef size_t filled_len = sizeof(size_t)
    if je_mallctlbymib(_mib_batch_alloc, _mib_batch_alloc_len, &filled, &filled_len,
                       &request, sizeof(request)) or filled == 0:
        return NULL
    cdef size_t i
    for i in range(1, filled):
        (<void**>blocks[i])[0] = cache.heads[b]
        cache.heads[b] = blocks[i]
    cache.counts[b] += <unsigned char>(filled - 1)
    cache.cached_bytes += (filled - 1) * block
    return blocks[0]


cdef inline void* cached_allocate(FreeBlocks* cache, int flags, size_t size, size_t align,
                                  bint zero) noexcept nogil:
    """A block from ``cache`` when one of the size class is there (and no special alignment is
    asked), else a new one from jemalloc; NULL when memory cannot be had."""
    cdef void* ptr
    if size > CACHE_MAX_SIZE:
        return jemalloc_allocate(flags, size, align, zero)
    if align <= 16:
        ptr = cache_pop(cache, size)
        if ptr == NULL and size <= REFILL_MAX_SIZE:
            ptr = _cache_refill(cache, flags, cache_bin(size))
        if ptr != NULL:
            if zero:
                memset(ptr, 0, size)
            return ptr
    # A whole size class, so the block can go to its bin when freed.
    return jemalloc_allocate(flags, cache_bin_size(cache_bin(size)), align, zero)


cdef inline void cached_free(FreeBlocks* cache, int flags, void* ptr, size_t size) noexcept nogil:
    """Keep a freed block for reuse, or give it to jemalloc when the cache is full."""
    if size > CACHE_MAX_SIZE or not cache_push(cache, ptr, size):
        je_dallocx(ptr, flags)


cdef void* region_allocate(size_t size, size_t align, bint zero) noexcept nogil:
    """A BufferPool's region: one block outside every slot's arena, so that no bulk reset can take
    it while raw views handed to the kernel may still point into it; NULL: no memory."""
    return jemalloc_allocate(MALLOCX_TCACHE_NONE, size if size else 1, align, zero)


cdef void region_free(void* ptr) noexcept nogil:
    """Give back a block from region_allocate()."""
    je_dallocx(ptr, MALLOCX_TCACHE_NONE)
