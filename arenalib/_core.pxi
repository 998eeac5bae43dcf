# The nogil core of every arena: allocate, free and reset on an ArenaCore.  The Python classes and the
# C-level API (arenalib/__init__.pxd) both call these, so there is one implementation of each rule.
#
#   ConfinedArena  one owner thread; the slot's explicit tcache plus a cache of free blocks threaded
#                  through the blocks themselves, which confinement lets us keep without any lock.
#   Arena          any thread; each thread gets its own explicit tcache and counters (ThreadCache),
#                  found through a small thread-local table, so two threads never share a lock or a
#                  cache line on the common path.
#   SlicingArena   bump-pointer carving of chunks.  The thread that carved last keeps the arena
#                  (biased ownership) and carves without any atomic instruction; any other thread
#                  takes the busy lock and the arena over, or gets ARENA_EBUSY while it is in use.

from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.string cimport memset

from arenalib._jemalloc cimport (
    MALLOCX_ARENA, MALLOCX_LG_ALIGN, MALLOCX_TCACHE_NONE, MALLOCX_ZERO, je_dallocx, je_mallocx,
)


cdef extern from *:
    """
    #include <stdint.h>
    /* A direct-mapped cache: arena serial -> this thread's ThreadCache of that (shared) arena. */
    typedef struct { uint64_t serial; void *cache; } arenalib_tls_entry;
    static __thread arenalib_tls_entry arenalib_tls_cache[8];
    static inline void *arenalib_tls_get(uint64_t serial) {
        arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
        return e->serial == serial ? e->cache : NULL;
    }
    static inline void arenalib_tls_set(uint64_t serial, void *cache) {
        arenalib_tls_entry *e = &arenalib_tls_cache[serial & 7];
        e->serial = serial;
        e->cache = cache;
    }
    #define arenalib_atomic_add(p, v) __atomic_add_fetch((p), (v), __ATOMIC_RELAXED)
    /* Add size to *counter unless that would take it past limit; 0 (nothing added) when it would. */
    static inline int arenalib_reserve(Py_ssize_t *counter, size_t size, Py_ssize_t limit) {
        Py_ssize_t live = __atomic_load_n(counter, __ATOMIC_RELAXED);
        do {
            if (live > limit || size > (size_t)(limit - live))
                return 0;
        } while (!__atomic_compare_exchange_n(counter, &live, live + (Py_ssize_t)size, 1,
                                              __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return 1;
    }
    #define arenalib_ctz(x) __builtin_ctzll(x)
    """
    void* arenalib_tls_get(uint64_t serial) noexcept nogil
    void arenalib_tls_set(uint64_t serial, void* cache) noexcept nogil
    Py_ssize_t arenalib_atomic_add(Py_ssize_t* counter, Py_ssize_t value) noexcept nogil
    bint arenalib_reserve(Py_ssize_t* counter, size_t size, Py_ssize_t limit) noexcept nogil
    int arenalib_ctz(unsigned long long x) noexcept nogil

# Largest alignment accepted: huge pages (2 MiB) and well beyond, far below what would make
# jemalloc's size arithmetic overflow.
cdef size_t MAX_ALIGN = 1 << 30
cdef size_t MAX_SIZE = <size_t>PY_SSIZE_T_MAX
cdef size_t PAGE = 4096
cdef size_t EAGER_ZERO_LIMIT = 4 << 20  # zero=True blocks up to this size are zeroed by memset
cdef int MAX_THREAD_CACHES = 8         # per slot, kept warm across shared arenas
cdef size_t DEFAULT_CHUNK_SIZE = 256 * 1024
cdef uint64_t _next_serial = 1


cdef inline void* _jemalloc_allocate(int flags, size_t size, size_t align, bint zero) noexcept nogil:
    cdef bint memset_here = zero and CACHE_MAX_SIZE < size <= EAGER_ZERO_LIMIT
    if zero and not memset_here:
        flags |= MALLOCX_ZERO
    if align > 1:
        flags |= MALLOCX_LG_ALIGN(arenalib_ctz(align))
    cdef void* ptr = je_mallocx(size, flags)
    if memset_here and ptr != NULL:
        # jemalloc zeroes a reused large extent by purging it (madvise), which moves the cost to
        # a page fault per page at first touch: 1 MiB zeroed then filled measured 418 us that way,
        # against ~7 us unzeroed.  Up to EAGER_ZERO_LIMIT a memset is far cheaper; beyond it,
        # jemalloc's lazily zeroed fresh pages keep huge untouched allocations out of RSS.
        memset(ptr, 0, size)
    return ptr


# -- the free-block cache -----------------------------------------------------------------------

cdef inline void* _cached_allocate(FreeBlocks* cache, int flags, size_t size, size_t align,
                                   bint zero) noexcept nogil:
    """A block from ``cache`` when one of the size class is there (and no special alignment is
    asked), else a new one from jemalloc; NULL when memory cannot be had."""
    cdef void* ptr
    if size > CACHE_MAX_SIZE:
        return _jemalloc_allocate(flags, size, align, zero)
    if align <= 16:
        ptr = cache_pop(cache, size)
        if ptr != NULL:
            if zero:
                memset(ptr, 0, size)
            return ptr
    # A whole size class, so the block can go to its bin when freed.
    return _jemalloc_allocate(flags, cache_bin_size(cache_bin(size)), align, zero)


cdef inline void _cached_free(FreeBlocks* cache, int flags, void* ptr, size_t size) noexcept nogil:
    """Keep a freed block for reuse, or give it to jemalloc when the cache is full."""
    if size > CACHE_MAX_SIZE or not cache_push(cache, ptr, size):
        je_dallocx(ptr, flags)


# -- ConfinedArena ---------------------------------------------------------------------------------

cdef inline int _confined_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                                   void** out) noexcept nogil:
    if core.owner != thread_ident():
        return ARENA_EWRONGTHREAD
    if core.max_bytes >= 0 and <Py_ssize_t>size > core.max_bytes - core.live_bytes:
        return ARENA_ELIMIT
    cdef void* ptr = _cached_allocate(&core.slot.cache, _slot_flags(core.slot), size, align, zero)
    if ptr == NULL:
        return ARENA_ENOMEM
    confined_count_allocation(core, ptr, size)
    out[0] = ptr
    return ARENA_OK


cdef inline int _confined_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    if core.owner != thread_ident():
        return ARENA_EWRONGTHREAD
    _cached_free(&core.slot.cache, _slot_flags(core.slot), ptr, size)
    confined_count_free(core, ptr, size)
    return ARENA_OK


# -- Arena (shared) --------------------------------------------------------------------------------

cdef ThreadCache* _thread_cache(ArenaCore* core) noexcept nogil:
    """The calling thread's ThreadCache of a shared arena, made on its first use; NULL: no memory."""
    cdef ThreadCache* tc = <ThreadCache*>arenalib_tls_get(core.serial)
    if tc != NULL:
        return tc
    cdef unsigned long me = thread_ident()
    cdef ArenaSlot* slot = core.slot
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL and tc.thread != me:
        tc = tc.next
    if tc == NULL:
        tc = <ThreadCache*>PyMem_RawCalloc(1, sizeof(ThreadCache))
        if tc != NULL:
            _tcache_take(&tc.tcache_index)  # NO_TCACHE when none can be had: slower, still right
            tc.thread = me
            tc.next = slot.threads
            slot.threads = tc
            slot.thread_count += 1
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)
    if tc != NULL:
        arenalib_tls_set(core.serial, tc)
    return tc


cdef inline int _shared_flags(ArenaCore* core, ThreadCache* tc) noexcept nogil:
    return MALLOCX_ARENA(core.slot.arena_index) | _tcache_flag(tc.tcache_index)


cdef inline int _shared_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                                 void** out) noexcept nogil:
    cdef ThreadCache* tc = _thread_cache(core)
    if tc == NULL:
        return ARENA_ENOMEM
    # Only a limited arena pays for a counter shared by all threads; compare-and-swap, so that
    # neither a huge size nor threads reserving at once can take it past the limit.
    if core.max_bytes >= 0 and not arenalib_reserve(&core.live_bytes, size, core.max_bytes):
        return ARENA_ELIMIT
    cdef void* ptr = _cached_allocate(&tc.cache, _shared_flags(core, tc), size, align, zero)
    if ptr == NULL:
        if core.max_bytes >= 0:
            arenalib_atomic_add(&core.live_bytes, -<Py_ssize_t>size)
        return ARENA_ENOMEM
    tc.live_bytes += size
    tc.live_segments += 1
    tc.allocated_total += size
    out[0] = ptr
    return ARENA_OK


cdef inline int _shared_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    cdef ThreadCache* tc = _thread_cache(core)
    if tc == NULL:
        # No memory for this thread's cache: free without one, and count it on a thread that
        # allocated (there is one: ptr came from this arena), so the totals stay right.
        je_dallocx(ptr, MALLOCX_TCACHE_NONE)
        tc = core.slot.threads
    else:
        _cached_free(&tc.cache, _shared_flags(core, tc), ptr, size)
    if tc != NULL:
        tc.live_bytes -= size
        tc.live_segments -= 1
    if core.max_bytes >= 0:
        arenalib_atomic_add(&core.live_bytes, -<Py_ssize_t>size)
    return ARENA_OK


cdef void _shared_totals(ArenaCore* core, Py_ssize_t* live, Py_ssize_t* segments,
                         size_t* total, size_t* cached=NULL) noexcept nogil:
    cdef ThreadCache* tc
    live[0] = 0
    segments[0] = 0
    total[0] = 0
    PyThread_acquire_lock(<PyThread_type_lock>core.slot.threads_lock, WAIT_LOCK)
    tc = core.slot.threads
    while tc != NULL:
        live[0] += tc.live_bytes
        segments[0] += tc.live_segments
        total[0] += tc.allocated_total
        if cached != NULL:
            cached[0] += cache_held_bytes(&tc.cache)
        tc = tc.next
    PyThread_release_lock(<PyThread_type_lock>core.slot.threads_lock)


cdef void _shared_start(ArenaSlot* slot) noexcept nogil:
    """A shared arena opens on a slot: the threads' caches stay warm, their counts start at 0."""
    cdef ThreadCache* tc
    PyThread_acquire_lock(<PyThread_type_lock>slot.threads_lock, WAIT_LOCK)
    tc = slot.threads
    while tc != NULL:
        tc.live_bytes = 0
        tc.live_segments = 0
        tc.allocated_total = 0
        tc = tc.next
    PyThread_release_lock(<PyThread_type_lock>slot.threads_lock)


# -- SlicingArena ----------------------------------------------------------------------------------

cdef int _slicing_next_chunk(ArenaCore* core, size_t size, size_t align) noexcept nogil:
    """Make core.current a chunk that can hold ``size`` bytes at ``align`` from its start."""
    cdef Py_ssize_t i = core.current + 1 if core.nchunks else 0
    while i < core.nchunks:  # chunks kept warm by reset()
        if (<size_t>core.chunks[i] & (align - 1)) == 0 and core.chunk_sizes[i] >= size:
            _slicing_use_chunk(core, i)
            return ARENA_OK
        i += 1
    cdef size_t chunk_size = core.chunk_size
    if size > chunk_size:
        chunk_size = (size + PAGE - 1) & ~(PAGE - 1)
    cdef Py_ssize_t capacity
    if core.nchunks == core.chunks_capacity:
        capacity = core.chunks_capacity * 2 + 4
        if not (_grow(<void**>&core.chunks, capacity * sizeof(char*))
                and _grow(<void**>&core.chunk_sizes, capacity * sizeof(size_t))):
            return ARENA_ENOMEM
        core.chunks_capacity = capacity
    # Not zeroed: a chunk is mostly reused dirty memory, and zeroing all of it would cost more than
    # zeroing the zero=True segments carved from it.
    cdef char* chunk = <char*>_jemalloc_allocate(
        _slot_flags(core.slot), chunk_size, align if align > PAGE else PAGE, False)
    if chunk == NULL:
        return ARENA_ENOMEM
    core.chunks[core.nchunks] = chunk
    core.chunk_sizes[core.nchunks] = chunk_size
    core.nchunks += 1
    core.chunk_bytes += chunk_size
    _slicing_use_chunk(core, core.nchunks - 1)
    return ARENA_OK


cdef inline void _slicing_use_chunk(ArenaCore* core, Py_ssize_t i) noexcept nogil:
    """Carve from chunk ``i`` on, from its start (no chunk at all when ``i`` is -1)."""
    core.current = i if i >= 0 else 0
    core.cursor = <size_t>core.chunks[i] if i >= 0 else 0
    core.cursor_end = core.cursor + core.chunk_sizes[i] if i >= 0 else 0


cdef inline int _slicing_carve(ArenaCore* core, size_t size, size_t align, bint zero,
                               void** out) noexcept nogil:
    if core.max_bytes >= 0 and <Py_ssize_t>size > core.max_bytes - core.live_bytes:
        return ARENA_ELIMIT
    if align < SLICE_DEFAULT_ALIGN:
        align = SLICE_DEFAULT_ALIGN
    cdef void* ptr = slicing_carve_current(core, size, align, zero)
    cdef int err
    if ptr == NULL:
        err = _slicing_next_chunk(core, size, align)
        if err:
            return err
        ptr = slicing_carve_current(core, size, align, zero)  # fits the chunk just chosen
    out[0] = ptr
    return ARENA_OK


cdef extern from *:
    """
    #include <unistd.h>
    #include <sys/syscall.h>
    #if defined(__linux__) && defined(SYS_membarrier)
    #include <linux/membarrier.h>
    static int arenalib_membarrier_register(void) {
        return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0);
    }
    /* A full memory barrier on every running thread of this process. */
    static int arenalib_membarrier(void) {
        if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
            return 0;
        return (int)syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0);
    }
    #else
    static int arenalib_membarrier_register(void) { return -1; }
    static int arenalib_membarrier(void) { return -1; }
    #endif
    #define arenalib_claim_record(p, me) \
        __atomic_compare_exchange_n((p), &(unsigned long){0}, (me), 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)
    """
    int arenalib_membarrier_register() noexcept nogil
    int arenalib_membarrier() noexcept nogil
    bint arenalib_claim_record(unsigned long* thread, unsigned long me) noexcept nogil

# Biased carving needs membarrier(); without it (not Linux, or refused by a sandbox) every carve
# takes the busy lock.
cdef bint _biased_carving = arenalib_membarrier_register() == 0


cdef void _carvers_after_fork() noexcept nogil:
    """In a fork's child only this thread is left: no other thread is carving, and the records
    of the others are free for the child's new threads."""
    global _biased_carving
    cdef unsigned long me = thread_ident()
    cdef int i
    for i in range(CARVER_RECORDS):
        _inline_state.carvers[i].carving = NULL
        if _inline_state.carvers[i].thread != me:
            _inline_state.carvers[i].thread = 0
    _biased_carving = _biased_carving and arenalib_membarrier_register() == 0


cdef CarverRecord* _carver_record(unsigned long me) noexcept nogil:
    """The calling thread's CarverRecord, or NULL when its place in the table is another live
    thread's (that thread then carves through the lock: slower, never wrong)."""
    cdef CarverRecord* record = &_inline_state.carvers[
        ((me >> 12) * <unsigned long>0x9E3779B97F4A7C15) >> 56]
    if record.thread == me or arenalib_claim_record(&record.thread, me):
        return record
    return NULL


cdef int _slicing_lock(ArenaCore* core) noexcept nogil:
    """Take a SlicingArena's busy lock and its bias (from whichever thread holds it), for a carve
    that needs the slow path, a reset or a purge.  ARENA_EBUSY: another thread is using it."""
    global _biased_carving
    cdef unsigned long me = thread_ident()
    cdef unsigned long owner
    if not arenalib_try_lock(&core.busy):
        return ARENA_EBUSY
    owner = arenalib_load_owner(&core.carve_owner)
    if owner == me or core.carve_record == NULL:
        return ARENA_OK   # no other thread may be carving without the lock
    if owner != 0:
        arenalib_store_owner(&core.carve_owner, 0)
        # After this, the owner either sees carve_owner == 0 before carving, or its record shows
        # the carve it started.
        if arenalib_membarrier() != 0:
            # Cannot take it over safely: the owner keeps it, and no arena is biased from now on.
            _biased_carving = False
            arenalib_store_owner(&core.carve_owner, owner)
            arenalib_unlock(&core.busy)
            return ARENA_EBUSY
    if arenalib_load_carving(&core.carve_record.carving) == <void*>core:
        arenalib_unlock(&core.busy)
        return ARENA_EBUSY   # the former owner is in the middle of a carve
    core.carve_record = NULL
    return ARENA_OK


cdef void _slicing_drop_bias(ArenaCore* core) noexcept nogil:
    """At close: no thread may carve without the lock any more (a carve racing with close is the
    caller's error, as the C API says; this only makes sure later carves see the arena closed)."""
    if arenalib_load_owner(&core.carve_owner) not in (0, thread_ident()):
        arenalib_store_owner(&core.carve_owner, 0)
        arenalib_membarrier()
    arenalib_store_owner(&core.carve_owner, 0)
    core.carve_record = NULL


cdef void _slicing_unlock(ArenaCore* core, bint bias) noexcept nogil:
    """Release the busy lock; with ``bias``, leave the arena biased to the calling thread."""
    cdef unsigned long me = thread_ident()
    cdef CarverRecord* record
    if (bias and _biased_carving and core.max_bytes < 0 and core.open
            and arenalib_load_owner(&core.carve_owner) != me):
        record = _carver_record(me)
        if record != NULL:
            core.carve_record = record
            arenalib_store_owner(&core.carve_owner, me)
    arenalib_unlock(&core.busy)


cdef bint _grow(void** array, size_t nbytes) noexcept nogil:
    cdef void* grown = PyMem_RawRealloc(array[0], nbytes)
    if grown == NULL:
        return False
    array[0] = grown
    return True


cdef void _slicing_free_chunks(ArenaCore* core, Py_ssize_t keep) noexcept nogil:
    """Give back the chunks from index ``keep`` on (they hold no live segment)."""
    cdef Py_ssize_t i
    for i in range(keep, core.nchunks):
        je_dallocx(core.chunks[i], _slot_flags(core.slot))
        core.chunk_bytes -= core.chunk_sizes[i]
    if keep < core.nchunks:
        core.nchunks = keep


# -- BufferPool's region ------------------------------------------------------------------------

cdef int region_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                         void** out) noexcept nogil:
    """A pool's region: one block outside the slot's arena, so that no bulk reset can take it while
    raw views handed to the kernel may still point into it; region_free() gives it back.  Only
    BufferPool calls it: arena_allocate() refuses a pool's core."""
    if core.max_bytes >= 0 and <Py_ssize_t>size > core.max_bytes - core.live_bytes:
        return ARENA_ELIMIT
    cdef void* ptr = _jemalloc_allocate(MALLOCX_TCACHE_NONE, size if size else 1, align, zero)
    if ptr == NULL:
        return ARENA_ENOMEM
    core.live_bytes += size
    core.live_segments += 1
    core.allocated_total += size
    if core.live_bytes > core.peak_bytes:
        core.peak_bytes = core.live_bytes
    out[0] = ptr
    return ARENA_OK


cdef void region_free(void* ptr) noexcept nogil:
    """Give back a block from a pool kind's arena_allocate()."""
    je_dallocx(ptr, MALLOCX_TCACHE_NONE)


# -- the C-level API -------------------------------------------------------------------------------

cdef int arena_allocate_slow(ArenaCore* core, size_t size, size_t align, bint zero,
                             void** out) noexcept nogil:
    """arena_allocate() for every kind and case (the inline fast path in _arena.pxd calls it)."""
    cdef int err
    if not core.open:
        return ARENA_ECLOSED
    if align & (align - 1) or align > MAX_ALIGN:
        return ARENA_EINVAL
    if size > MAX_SIZE:
        return ARENA_ENOMEM
    if core.kind == ARENA_KIND_CONFINED:
        return _confined_allocate(core, size, align, zero, out)
    if core.kind == ARENA_KIND_SHARED:
        return _shared_allocate(core, size, align, zero, out)
    if core.kind == ARENA_KIND_SLICING:
        err = _slicing_lock(core)
        if err:
            return err
        err = _slicing_carve(core, size, align, zero, out)
        _slicing_unlock(core, err == ARENA_OK)
        return err
    return ARENA_EUNSUPPORTED  # a BufferPool's core: its buffers come from acquire()


cdef int arena_free_slow(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """arena_free() for every kind and case (the inline fast path in _arena.pxd calls it)."""
    if not core.open:
        return ARENA_ECLOSED
    if core.kind == ARENA_KIND_CONFINED:
        return _confined_free(core, ptr, size)
    if core.kind == ARENA_KIND_SHARED:
        return _shared_free(core, ptr, size)
    return ARENA_EUNSUPPORTED


cdef int arena_reset(ArenaCore* core) noexcept nogil:
    """Free every allocation at once and keep the arena open (no other thread may use it now)."""
    if not core.open:
        return ARENA_ECLOSED
    if core.kind == ARENA_KIND_CONFINED and core.owner != thread_ident():
        return ARENA_EWRONGTHREAD
    if core.exports:
        return ARENA_EEXPORTED
    cdef int err
    if core.kind == ARENA_KIND_SLICING:
        err = _slicing_lock(core)
        if err:
            return err
        _slicing_use_chunk(core, 0 if core.nchunks else -1)
        slicing_settle(core)
    elif core.kind == ARENA_KIND_SHARED or core.kind == ARENA_KIND_CONFINED:
        _slot_reset(core.slot)
    else:
        return ARENA_EUNSUPPORTED
    core.generation += 1
    core.live_bytes = 0
    core.live_segments = 0
    core.recent_count = 0
    if core.kind == ARENA_KIND_SLICING:
        _slicing_unlock(core, True)
    return ARENA_OK


cdef int arena_open_slow(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                         size_t chunk_size) except -1:
    """arena_open() for every kind and case (the inline fast path in _arena.pxd calls it)."""
    global _next_serial
    if core.open:
        raise ValueError("this ArenaCore is open already")
    cdef ArenaSlot* slot = _slot_acquire()
    if kind == ARENA_KIND_SHARED:
        _shared_start(slot)
    core_init(core, slot, kind, max_bytes, chunk_size if chunk_size else DEFAULT_CHUNK_SIZE,
              _next_serial)
    _next_serial += 1
    _inline_state.arenas_opened += 1
    return 0


cdef void _core_close(ArenaCore* core) noexcept:
    """Close without checks: every allocation becomes the slot's garbage, dropped in bulk."""
    if not core.open or close_small_scope(core):
        return
    core.fast_owner = 0
    core.open = False
    core.generation += 1
    _inline_state.arenas_closed += 1
    cdef Py_ssize_t stale = core.live_bytes, segments
    cdef size_t churn = core.allocated_total
    if core.kind == ARENA_KIND_SHARED:
        _shared_totals(core, &stale, &segments, &churn)
        core.allocated_total = churn  # the per-thread counters belong to the next user now
        if core.slot.thread_count > MAX_THREAD_CACHES:
            # Threads come and go: do not let a slot collect caches of threads long gone.
            stale += <Py_ssize_t>_slot_flush_threads(core.slot, False, True)
    elif core.kind == ARENA_KIND_POOL:
        stale = 0  # the region is not in the slot's arena: its owner frees it (region_free)
        churn = 0
    elif core.kind == ARENA_KIND_SLICING:
        _slicing_drop_bias(core)
        slicing_settle(core)
        churn = core.chunk_bytes
        if core.nchunks <= RECENT_MAX:
            # A few chunks go straight back to jemalloc, warm for the next arena's chunks.
            _slicing_free_chunks(core, 0)
        # Otherwise the chunks (holding every segment) are the slot's stale garbage now.
        stale = <Py_ssize_t>core.chunk_bytes
        core.nchunks = 0
        _slicing_use_chunk(core, -1)
        core.chunks_capacity = 0
        core.chunk_bytes = 0
        PyMem_RawFree(core.chunks)
        PyMem_RawFree(core.chunk_sizes)
        core.chunks = NULL
        core.chunk_sizes = NULL
    if core.kind == ARENA_KIND_CONFINED and core.recent_count <= RECENT_MAX:
        # A small scope: its few blocks go straight back to the slot's cache, warm for the next
        # scope, and no reset is ever needed for them.
        recent_blocks_to_cache(core)
        stale = 0
    # Otherwise the live segments are not freed one by one: their bytes become the slot's stale
    # garbage, dropped in bulk by a jemalloc arena reset (see _slots.pxi).
    _slot_release(core.slot, <size_t>stale, churn)
    core.slot = NULL
    core.live_bytes = 0
    core.live_segments = 0


cdef int arena_close_slow(ArenaCore* core) except -1:
    """arena_close() for every kind and case (the inline fast path in _arena.pxd calls it)."""
    if not core.open:
        return 0
    if core.kind == ARENA_KIND_CONFINED and core.owner != thread_ident():
        arena_raise(ARENA_EWRONGTHREAD)
    if core.exports:
        arena_raise(ARENA_EEXPORTED)
    _core_close(core)
    return 0


cdef void arena_slot_free(ArenaSlot* slot, void* ptr) noexcept nogil:
    """Give a block of the slot's arena back to jemalloc."""
    je_dallocx(ptr, _slot_flags(slot))


cdef uint64_t _abi_fingerprint = abi_fingerprint()  # arenalib's own, computed once


cdef int arena_abi_check(uint64_t fingerprint) except -1:
    """Refuse a module compiled against another C ABI (see abi_fingerprint() in _arena.pxd)."""
    if fingerprint != _abi_fingerprint:
        raise ImportError(
            f"a Cython extension was compiled against another arenalib C ABI (fingerprint "
            f"{fingerprint:#018x}; this arenalib has {_abi_fingerprint:#018x}): rebuild the "
            "extension against the arenalib it runs with")
    return 0


cdef ArenaCore* arena_core_checked(object arena) except NULL:
    """arena_core() once the caller's layouts are accepted (see abi_check() in _arena.pxd)."""
    if not isinstance(arena, ArenaBase) or (<ArenaBase>arena)._core.kind == ARENA_KIND_POOL:
        raise TypeError(f"expected Arena, ConfinedArena or SlicingArena, not {type(arena).__name__}")
    cdef ArenaBase base = arena
    if not base._core.open:
        raise ArenaClosedError(f"{type(arena).__name__} is closed")
    return &base._core


cdef int arena_raise(int code) except -1:
    """Raise the Python exception for an error code of the nogil functions (with the GIL held)."""
    if code == ARENA_OK:
        return 0
    exc_type, message = _ERRORS.get(code, (ArenaError, f"unknown arenalib error code {code}"))
    raise exc_type(message)
