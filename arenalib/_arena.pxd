# cython: language_level=3
# Declarations of arenalib's arenas and segments, for arenalib's other Cython modules and for
# extensions that cimport arenalib (the public surface is arenalib/__init__.pxd).  No jemalloc type
# appears here: consumers need no jemalloc header and link nothing.

from libc.stdint cimport uint64_t
from libc.string cimport memset


# Result codes of the nogil functions; arena_raise() turns one into the matching Python exception.
cdef enum:
    ARENA_OK = 0
    ARENA_ENOMEM = 1          # MemoryError: jemalloc could not get the memory
    ARENA_ELIMIT = 2          # MemoryError: max_bytes would be exceeded
    ARENA_ECLOSED = 3         # ArenaClosedError
    ARENA_EWRONGTHREAD = 4    # WrongThreadError: a confined arena used from another thread
    ARENA_EINVAL = 5          # ValueError: alignment not a power of two up to 1 GiB
    ARENA_EEXPORTED = 6       # BufferError: buffer exports of segments are alive
    ARENA_EBUSY = 7           # ArenaError: a SlicingArena used by two threads at once
    ARENA_EUNSUPPORTED = 8    # UnsupportedOperation: per-segment free of a SlicingArena

cdef enum:
    # tracemalloc domain of the memory handed out through the Python API ("ARNA").
    TRACE_DOMAIN = 0x41524E41

cdef extern from "Python.h":
    # Both return -2 at once when tracemalloc is not tracing: the cost when it is off.
    int PyTraceMalloc_Track(unsigned int domain, size_t ptr, size_t size) noexcept
    int PyTraceMalloc_Untrack(unsigned int domain, size_t ptr) noexcept

cdef enum:
    ARENA_KIND_SHARED = 0     # Arena
    ARENA_KIND_CONFINED = 1   # ConfinedArena
    ARENA_KIND_SLICING = 2    # SlicingArena
    ARENA_KIND_POOL = 3       # BufferPool's region

cdef enum:
    # Size classes of the confined free-block cache: 16-byte steps up to 1 KiB, then jemalloc's four
    # classes per doubling up to 64 KiB.
    CACHE_BINS = 89
    CACHE_MAX_SIZE = 65536
    CACHE_MAX_BYTES = 1 << 20     # free blocks one cache keeps for reuse
    CACHE_MAX_PER_BIN = 64
    # An arena that allocated more than this hands its pages back to the OS at close.
    PURGE_LIMIT = 4 << 20
    SLICE_DEFAULT_ALIGN = 16      # malloc's guarantee on x86-64 (max_align_t)
    # A confined arena remembers its first few allocations: when those are all it holds at close,
    # they go back to the slot's free-block cache instead of waiting for a bulk reset.
    RECENT_MAX = 4


cdef struct FreeBlocks:
    # Freed blocks kept for reuse by one thread, per size class: singly linked lists threaded
    # through the blocks themselves.  A pop or push is a few instructions and no lock.  The block
    # freed last is held apart (hot, of class hot_bin - 1; 0: none): the next allocation of its
    # class takes it without reading a next pointer out of the block just written, and without
    # touching the counters (cache_held_bytes() counts it).
    size_t cached_bytes       # bytes in the lists
    void* hot
    int hot_bin
    void* heads[CACHE_BINS]
    unsigned char counts[CACHE_BINS]


cdef struct ArenaSlot:
    # One jemalloc explicit arena with the explicit tcache that serves it and a cache of free blocks,
    # pooled across arena objects: creating a jemalloc arena costs ~50 us, destroying one leaks.
    unsigned arena_index
    unsigned tcache_index
    size_t stale_bytes    # allocations left behind by closed arena objects, dropped by a reset
    size_t churn_bytes    # bytes allocated since the last purge: what may sit dirty in the arena
    FreeBlocks cache      # used by confined arenas (one owner thread at a time)
    ThreadCache* threads  # shared arenas' per-thread caches, kept warm with the slot
    int thread_count
    void* threads_lock


cdef struct ThreadCache:
    # A shared Arena's per-thread state: its own jemalloc tcache (no lock on the common path) and
    # its own counters (no cache line bounced between threads).
    ThreadCache* next
    unsigned long thread
    unsigned tcache_index
    Py_ssize_t live_bytes
    Py_ssize_t live_segments
    size_t allocated_total
    FreeBlocks cache


cdef enum:
    CARVER_RECORDS = 256


cdef struct CarverRecord:
    # One thread's flag for the biased SlicingArena path: the arena it is carving right now (NULL:
    # none).  Only its own thread writes ``carving``; a thread taking the arena over reads it.
    # Keyed by thread ident (a thread that reuses a dead one's ident takes its record over); one
    # per cache line, so that threads carving at once never share a line.
    unsigned long thread
    void* carving
    char padding[48]


cdef struct InlineState:
    # What arenalib shares with the inline functions below, in every module that cimports them.
    # The slot given back last (``parked``), which the next arena takes without touching the pool;
    # an arena that takes it only clears parked_idle (the pointer stays), so the next scope finds
    # its slot without waiting on a store just made.  Opens and closes are counted apart: one
    # counter both add to and subtract from would chain every scope to the one before through
    # memory.  Those fields are used with the GIL held; the carver records without it.
    ArenaSlot* parked
    bint parked_idle
    Py_ssize_t arenas_opened
    Py_ssize_t arenas_closed
    char padding[32]          # the records start on a cache line of their own (64-byte aligned)
    CarverRecord carvers[CARVER_RECORDS]


cdef struct ArenaCore:
    # The thread allowed on the inline fast path below: a ConfinedArena's owner, 0 when the arena is
    # closed, limited by max_bytes or of another kind.
    unsigned long fast_owner
    int kind
    bint open
    int busy                  # SlicingArena: a thread holds the slow path's lock
    # SlicingArena: the thread allowed to carve without the lock (0: none) and its CarverRecord.
    unsigned long carve_owner
    CarverRecord* carve_record
    ArenaSlot* slot
    unsigned long owner       # owning thread ident; 0 when any thread may use the arena
    uint64_t generation       # bumped by open, reset and close, never lowered: older segments are dead
    uint64_t serial           # unique per arena object, never reused (keys the per-thread caches)
    Py_ssize_t live_bytes     # shared arenas: bytes reserved against max_bytes only
    Py_ssize_t peak_bytes
    Py_ssize_t live_segments
    Py_ssize_t exports
    Py_ssize_t max_bytes      # -1: no limit
    size_t allocated_total
    int recent_count          # allocations remembered in recent; RECENT_MAX + 1: too many
    void* recent[RECENT_MAX]  # NULL once freed
    size_t recent_sizes[RECENT_MAX]
    # SlicingArena
    size_t chunk_size
    char** chunks
    size_t* chunk_sizes
    Py_ssize_t nchunks
    Py_ssize_t chunks_capacity
    Py_ssize_t current        # chunk being carved
    size_t cursor             # address of the next free byte in the current chunk (0: no chunk)
    size_t cursor_end         # address of the current chunk's end
    size_t chunk_bytes


cdef class Segment:
    cdef:
        char* _ptr
        Py_ssize_t _size
        ArenaBase _arena
        Segment _root           # the segment that owns the memory; None when this one does
        uint64_t _generation    # the arena's generation when allocated: stale after a reset/close
        Py_ssize_t _exports     # live buffer exports and pins; counted on the root only
        bint _freed

    cdef int _check(self) except -1
    cdef int _pin(self) except -1
    cdef void _unpin(self) noexcept
    cdef Segment _owner_segment(self)


cdef class ArenaBase:
    cdef:
        ArenaCore _core
        object _created_at      # creation stack in debug mode, else None
        set _traced             # addresses reported to tracemalloc and not yet untracked
        object __weakref__

    cdef int _open(self, int kind, object max_bytes) except -1
    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align)
    cdef void _update_shared_peak(self) noexcept
    cdef int _free_segment(self, Segment seg) except -1
    cdef int _raise(self, int code, str context) except -1
    cdef Py_ssize_t _live_bytes(self) noexcept
    cdef int _close(self) except -1
    cdef int _check_usable(self) except -1
    cdef void _release_memory(self) noexcept
    cdef void _untrack_all(self) noexcept


cdef class Arena(ArenaBase):
    pass


cdef class ConfinedArena(ArenaBase):
    pass


cdef class SlicingArena(ArenaBase):
    pass


# -- C-level API (re-exported by arenalib/__init__.pxd) -------------------------------------------

cdef int arena_open_slow(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                         size_t chunk_size) except -1
cdef int arena_close_slow(ArenaCore* core) except -1
cdef InlineState* arena_inline_state() noexcept nogil
cdef void arena_slot_free(ArenaSlot* slot, void* ptr) noexcept nogil
cdef ArenaCore* arena_core_checked(object arena) except NULL
cdef int arena_abi_check(uint64_t fingerprint) except -1
cdef int arena_allocate_slow(ArenaCore* core, size_t size, size_t align, bint zero,
                             void** out) noexcept nogil
cdef int arena_free_slow(ArenaCore* core, void* ptr, size_t size) noexcept nogil
cdef int arena_reset(ArenaCore* core) noexcept nogil
cdef int arena_raise(int code) except -1
cdef Segment make_segment(ArenaBase arena, Py_ssize_t size)
cdef Py_ssize_t parse_size(object size, str name) except -1
cdef size_t parse_align(object align) except 0
cdef int region_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                         void** out) noexcept nogil
cdef void region_free(void* ptr) noexcept nogil


# -- the inline fast paths ---------------------------------------------------------------------------
# Compiled into every module that cimports them, arenalib's own included: the common case of a
# ConfinedArena (a block from its own free list) and of a SlicingArena (a carve in the current chunk)
# costs no call across modules.  Anything else goes to the *_slow functions, which hold every rule.

cdef extern from *:
    """
    #include <pthread.h>
    /* The calling thread's identity, equal to PyThread_get_thread_ident() (pthread_self()); read
       straight from the thread control block where glibc keeps it, as pthread_self() does. */
    static inline unsigned long arenalib_thread_ident(void) {
    #if defined(__x86_64__) && defined(__GLIBC__)
        unsigned long self;
        __asm__("movq %%fs:16, %0" : "=r"(self));
        return self;
    #else
        return (unsigned long)pthread_self();
    #endif
    }
    #define arenalib_clz(x) __builtin_clzll(x)
    #define arenalib_try_lock(p) (__atomic_exchange_n((p), 1, __ATOMIC_ACQUIRE) == 0)
    #define arenalib_unlock(p) __atomic_store_n((p), 0, __ATOMIC_RELEASE)
    #define arenalib_load_owner(p) __atomic_load_n((p), __ATOMIC_RELAXED)
    #define arenalib_store_owner(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    #define arenalib_load_carving(p) __atomic_load_n((p), __ATOMIC_RELAXED)
    #define arenalib_set_carving(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
    #define arenalib_clear_carving(p) __atomic_store_n((p), (void *)0, __ATOMIC_RELEASE)
    /* Orders this thread's own accesses for the compiler only: the thread that revokes a biased
       arena issues membarrier(), which makes that enough (asymmetric fences). */
    #define arenalib_compiler_fence() __atomic_signal_fence(__ATOMIC_SEQ_CST)
    /* This module's pointer to arenalib's InlineState, fetched on first use, and whether arenalib
       accepted the layouts this module was compiled with. */
    static void *arenalib_inline_state_ptr = 0;
    static int arenalib_abi_accepted = 0;
    """
    unsigned long thread_ident "arenalib_thread_ident"() noexcept nogil
    int arenalib_clz(unsigned long long x) noexcept nogil
    bint arenalib_try_lock(int* flag) noexcept nogil
    void arenalib_unlock(int* flag) noexcept nogil
    void* arenalib_inline_state_ptr
    bint arenalib_abi_accepted
    unsigned long arenalib_load_owner(unsigned long* owner) noexcept nogil
    void arenalib_store_owner(unsigned long* owner, unsigned long value) noexcept nogil
    void* arenalib_load_carving(void** flag) noexcept nogil
    void arenalib_set_carving(void** flag, void* arena) noexcept nogil
    void arenalib_clear_carving(void** flag) noexcept nogil
    void arenalib_compiler_fence() noexcept nogil


cdef inline int cache_bin(size_t size) noexcept nogil:
    """The free-block cache's size class of ``size`` (1 .. CACHE_MAX_SIZE; 0 shares bin 0)."""
    if size <= 1024:
        return <int>((size + 15) >> 4)
    cdef int k = 63 - arenalib_clz(size - 1)          # size is in (2**k, 2**(k+1)]
    return 65 + (k - 10) * 4 + <int>(((size - 1) >> (k - 2)) & 3)


cdef inline size_t cache_bin_size(int b) noexcept nogil:
    """The block size of size class ``b``: what is allocated, so any block of the class fits."""
    if b <= 64:
        return 16 if b == 0 else <size_t>b * 16
    b -= 65
    return <size_t>(5 + (b & 3)) << (8 + (b >> 2))


cdef inline void* cache_pop(FreeBlocks* cache, size_t size) noexcept nogil:
    """A cached free block for ``size`` bytes (<= CACHE_MAX_SIZE), or NULL."""
    cdef int b = cache_bin(size)
    cdef void* ptr
    if cache.hot_bin == b + 1:
        cache.hot_bin = 0
        return cache.hot
    ptr = cache.heads[b]
    if ptr != NULL:
        cache.heads[b] = (<void**>ptr)[0]
        cache.counts[b] -= 1
        cache.cached_bytes -= cache_bin_size(b)
    return ptr


cdef inline bint cache_push(FreeBlocks* cache, void* ptr, size_t size) noexcept nogil:
    """Keep a freed block of ``size`` bytes (<= CACHE_MAX_SIZE); False when the cache is full."""
    cdef int b = cache_bin(size)
    cdef int old_bin = cache.hot_bin - 1
    cdef void* old = cache.hot
    cdef size_t block
    if old_bin >= 0:
        # The hot block moves to its list, if the list has room; else the new block is refused.
        block = cache_bin_size(old_bin)
        if (cache.counts[old_bin] >= CACHE_MAX_PER_BIN
                or cache.cached_bytes + block > CACHE_MAX_BYTES):
            return False
        (<void**>old)[0] = cache.heads[old_bin]
        cache.heads[old_bin] = old
        cache.counts[old_bin] += 1
        cache.cached_bytes += block
    cache.hot = ptr
    cache.hot_bin = b + 1
    return True


cdef inline size_t cache_held_bytes(FreeBlocks* cache) noexcept nogil:
    """Bytes of all the blocks the cache holds."""
    if cache.hot_bin:
        return cache.cached_bytes + cache_bin_size(cache.hot_bin - 1)
    return cache.cached_bytes


cdef inline bint small_align(size_t align) noexcept nogil:
    """``align`` is 0 or a power of two up to 16, which every block of the fast paths meets."""
    return align <= 16 and (align & (align - 1)) == 0


cdef inline void confined_count_allocation(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """A ConfinedArena's books for a new block: the first few are remembered for close."""
    if core.recent_count < RECENT_MAX:
        core.recent[core.recent_count] = ptr
        core.recent_sizes[core.recent_count] = size
        core.recent_count += 1
    else:
        core.recent_count = RECENT_MAX + 1
    core.live_bytes += size
    core.live_segments += 1
    core.allocated_total += size
    if core.live_bytes > core.peak_bytes:
        core.peak_bytes = core.live_bytes


cdef inline void confined_count_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    cdef int i
    if core.recent_count <= RECENT_MAX:
        for i in range(core.recent_count):
            if core.recent[i] == ptr:
                core.recent[i] = NULL
                break
    core.live_bytes -= size
    core.live_segments -= 1


cdef inline void* slicing_carve_current(ArenaCore* core, size_t size, size_t align,
                                        bint zero) noexcept nogil:
    """``size`` bytes carved from the current chunk at ``align`` (>= 16), or NULL when they do
    not fit or there is no chunk.  The caller holds core.busy or the arena's bias."""
    cdef size_t start = (core.cursor + align - 1) & ~(align - 1)
    if start > core.cursor_end or size > core.cursor_end - start or start == 0:
        return NULL
    core.cursor = start + size
    # Nothing is freed between resets, so peak_bytes and allocated_total are brought up to date
    # from live_bytes at reset and close (slicing_settle) instead of on every carve.
    core.live_bytes += size
    core.live_segments += 1
    if zero:
        memset(<void*>start, 0, size)
    return <void*>start


cdef inline void slicing_settle(ArenaCore* core) noexcept nogil:
    """Fold a SlicingArena's live bytes into peak_bytes and allocated_total, before they go."""
    if core.live_bytes > core.peak_bytes:
        core.peak_bytes = core.live_bytes
    core.allocated_total += <size_t>core.live_bytes


cdef inline int arena_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                               void** out) noexcept nogil:
    """Allocate ``size`` bytes aligned to ``align`` (0 or a power of two up to 1 GiB), zeroed if
    ``zero``; the address goes to ``*out``.  Returns ARENA_OK or an error code."""
    cdef void* ptr
    cdef unsigned long me = thread_ident()
    cdef CarverRecord* record
    if core.fast_owner == me and small_align(align) and size <= CACHE_MAX_SIZE:
        ptr = cache_pop(&core.slot.cache, size)
        if ptr != NULL:
            if zero:
                memset(ptr, 0, size)
            confined_count_allocation(core, ptr, size)
            out[0] = ptr
            return ARENA_OK
    elif arenalib_load_owner(&core.carve_owner) == me and small_align(align):
        # The SlicingArena is biased to this thread: announce the carve in this thread's own
        # record, then check that the arena was not taken over meanwhile (a thread taking it over
        # clears carve_owner, runs membarrier(), then reads the record: one of the two sees the
        # other).  No atomic read-modify-write, no fence instruction.
        record = core.carve_record
        arenalib_set_carving(&record.carving, core)
        arenalib_compiler_fence()
        ptr = NULL
        if arenalib_load_owner(&core.carve_owner) == me:
            ptr = slicing_carve_current(core, size, SLICE_DEFAULT_ALIGN, zero)
        arenalib_clear_carving(&record.carving)
        if ptr != NULL:
            out[0] = ptr
            return ARENA_OK
    return arena_allocate_slow(core, size, align, zero, out)


cdef inline int arena_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """Give back one allocation of Arena or ConfinedArena; ``size`` must be the size allocated."""
    if (core.fast_owner == thread_ident() and size <= CACHE_MAX_SIZE
            and cache_push(&core.slot.cache, ptr, size)):
        confined_count_free(core, ptr, size)
        return ARENA_OK
    return arena_free_slow(core, ptr, size)


cdef inline InlineState* inline_state() noexcept nogil:
    global arenalib_inline_state_ptr
    if arenalib_inline_state_ptr == NULL:
        arenalib_inline_state_ptr = arena_inline_state()
    return <InlineState*>arenalib_inline_state_ptr


cdef inline void core_init(ArenaCore* core, ArenaSlot* slot, int kind, Py_ssize_t max_bytes,
                           size_t chunk_size, uint64_t serial) noexcept nogil:
    """Open ``core`` on ``slot``.  Field by field, not memset: a scope's whole budget is a few ns,
    and a memset of the struct (rep stos) took most of it.  recent[] needs no clearing."""
    core.slot = slot
    core.kind = kind
    core.carve_owner = 0      # every kind stays off the inline slicing path until a carve
    core.max_bytes = max_bytes if max_bytes >= 0 else -1
    core.owner = thread_ident() if kind == ARENA_KIND_CONFINED else 0
    core.fast_owner = core.owner if max_bytes < 0 else 0
    # Never back: a segment of this core from before a close must stay dead after a re-open.
    core.generation += 1
    core.serial = serial
    core.live_bytes = 0
    core.peak_bytes = 0
    core.live_segments = 0
    core.exports = 0
    core.allocated_total = 0
    core.recent_count = 0
    if kind == ARENA_KIND_SLICING:  # the chunk fields are read for a SlicingArena only
        core.busy = 0
        core.carve_record = NULL
        core.chunk_size = chunk_size
        core.cursor = 0
        core.cursor_end = 0
        core.chunks = NULL
        core.chunk_sizes = NULL
        core.nchunks = 0
        core.chunks_capacity = 0
        core.current = 0
        core.chunk_bytes = 0
    core.open = True


cdef inline void arena_core_init(ArenaCore* core) noexcept nogil:
    """Prepare an ArenaCore of your own (on the stack, in a struct) for arena_open(): closed."""
    memset(core, 0, sizeof(ArenaCore))


cdef inline void recent_blocks_to_cache(ArenaCore* core) noexcept nogil:
    """Give a confined arena's remembered live blocks (all it holds) back to its slot's cache."""
    cdef ArenaSlot* slot = core.slot
    cdef void* ptr
    cdef size_t size
    cdef int i
    for i in range(core.recent_count):
        ptr = core.recent[i]
        size = core.recent_sizes[i]
        if ptr != NULL and not (size <= CACHE_MAX_SIZE and cache_push(&slot.cache, ptr, size)):
            arena_slot_free(slot, ptr)


cdef inline bint close_small_scope(ArenaCore* core) noexcept nogil:
    """Close a ConfinedArena of the calling thread that holds at most RECENT_MAX blocks and was
    opened on the parked slot: its blocks go to the slot's cache and the slot is idle again, warm
    for the next arena.  False (nothing done) in any other case.  The caller holds the GIL."""
    cdef InlineState* state = inline_state()
    cdef ArenaSlot* slot = core.slot
    if (core.fast_owner != thread_ident() or core.recent_count > RECENT_MAX or core.exports
            or core.allocated_total > PURGE_LIMIT or state.parked != slot):
        return False
    recent_blocks_to_cache(core)
    slot.churn_bytes += core.allocated_total
    state.parked_idle = True
    state.arenas_closed += 1
    core.fast_owner = 0
    core.open = False
    core.generation += 1
    core.slot = NULL
    return True


cdef extern from *:
    """
    #ifdef Py_GIL_DISABLED
    #define ARENALIB_FREE_THREADED 1
    #else
    #define ARENALIB_FREE_THREADED 0
    #endif
    """
    int ARENALIB_FREE_THREADED


cdef inline uint64_t _abi_mix(uint64_t h, uint64_t value) noexcept nogil:
    return (h ^ value) * <uint64_t>1099511628211ULL  # FNV-1a, a word at a time


cdef inline uint64_t abi_fingerprint() noexcept nogil:
    """A digest of all that the inline functions above bake into a module that cimports them: the
    size and field offsets of every struct they touch, the constants and error codes, the size-class
    and alignment rules, and whether the interpreter is free-threaded.  arenalib refuses a module
    whose digest differs from its own (abi_check), so no change to that surface can go unnoticed;
    nobody has to remember to bump a number."""
    cdef ArenaCore core
    cdef ArenaSlot slot
    cdef FreeBlocks blocks
    cdef InlineState state
    cdef CarverRecord record
    cdef uint64_t h = <uint64_t>14695981039346656037ULL
    cdef size_t size
    cdef int b
    h = _abi_mix(h, sizeof(ArenaCore))
    h = _abi_mix(h, <size_t>(<char*>&core.fast_owner - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.kind - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.open - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.busy - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.carve_owner - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.carve_record - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.slot - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.owner - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.generation - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.serial - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.live_bytes - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.peak_bytes - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.live_segments - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.exports - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.max_bytes - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.allocated_total - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.recent_count - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.recent - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.recent_sizes - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.chunk_size - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.chunks - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.chunk_sizes - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.nchunks - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.chunks_capacity - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.current - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.cursor - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.cursor_end - <char*>&core))
    h = _abi_mix(h, <size_t>(<char*>&core.chunk_bytes - <char*>&core))
    h = _abi_mix(h, sizeof(ArenaSlot))
    h = _abi_mix(h, <size_t>(<char*>&slot.stale_bytes - <char*>&slot))
    h = _abi_mix(h, <size_t>(<char*>&slot.churn_bytes - <char*>&slot))
    h = _abi_mix(h, <size_t>(<char*>&slot.cache - <char*>&slot))
    h = _abi_mix(h, sizeof(FreeBlocks))
    h = _abi_mix(h, <size_t>(<char*>&blocks.cached_bytes - <char*>&blocks))
    h = _abi_mix(h, <size_t>(<char*>&blocks.hot - <char*>&blocks))
    h = _abi_mix(h, <size_t>(<char*>&blocks.hot_bin - <char*>&blocks))
    h = _abi_mix(h, <size_t>(<char*>&blocks.heads - <char*>&blocks))
    h = _abi_mix(h, <size_t>(<char*>&blocks.counts - <char*>&blocks))
    h = _abi_mix(h, sizeof(InlineState))
    h = _abi_mix(h, <size_t>(<char*>&state.parked - <char*>&state))
    h = _abi_mix(h, <size_t>(<char*>&state.parked_idle - <char*>&state))
    h = _abi_mix(h, <size_t>(<char*>&state.arenas_opened - <char*>&state))
    h = _abi_mix(h, <size_t>(<char*>&state.arenas_closed - <char*>&state))
    h = _abi_mix(h, <size_t>(<char*>&state.carvers - <char*>&state))
    h = _abi_mix(h, sizeof(CarverRecord))
    h = _abi_mix(h, <size_t>(<char*>&record.thread - <char*>&record))
    h = _abi_mix(h, <size_t>(<char*>&record.carving - <char*>&record))
    h = _abi_mix(h, <uint64_t>CACHE_BINS)
    h = _abi_mix(h, <uint64_t>CACHE_MAX_SIZE)
    h = _abi_mix(h, <uint64_t>CACHE_MAX_BYTES)
    h = _abi_mix(h, <uint64_t>CACHE_MAX_PER_BIN)
    h = _abi_mix(h, <uint64_t>PURGE_LIMIT)
    h = _abi_mix(h, <uint64_t>SLICE_DEFAULT_ALIGN)
    h = _abi_mix(h, <uint64_t>RECENT_MAX)
    h = _abi_mix(h, <uint64_t>CARVER_RECORDS)
    h = _abi_mix(h, <uint64_t>ARENA_KIND_SHARED)
    h = _abi_mix(h, <uint64_t>ARENA_KIND_CONFINED)
    h = _abi_mix(h, <uint64_t>ARENA_KIND_SLICING)
    h = _abi_mix(h, <uint64_t>ARENA_KIND_POOL)
    h = _abi_mix(h, <uint64_t>ARENA_OK)
    h = _abi_mix(h, <uint64_t>ARENA_ENOMEM)
    h = _abi_mix(h, <uint64_t>ARENA_ELIMIT)
    h = _abi_mix(h, <uint64_t>ARENA_ECLOSED)
    h = _abi_mix(h, <uint64_t>ARENA_EWRONGTHREAD)
    h = _abi_mix(h, <uint64_t>ARENA_EINVAL)
    h = _abi_mix(h, <uint64_t>ARENA_EEXPORTED)
    h = _abi_mix(h, <uint64_t>ARENA_EBUSY)
    h = _abi_mix(h, <uint64_t>ARENA_EUNSUPPORTED)
    h = _abi_mix(h, <uint64_t>ARENALIB_FREE_THREADED)
    for b in range(CACHE_BINS):
        h = _abi_mix(h, cache_bin_size(b))
    for size in range(0, CACHE_MAX_SIZE + 1, 8):
        h = _abi_mix(h, <uint64_t>cache_bin(size))
    for size in range(65):
        h = _abi_mix(h, <uint64_t>small_align(size))
    return h


cdef inline int abi_check() except -1:
    """Once per module: ImportError if it was compiled against another arenalib's C ABI."""
    global arenalib_abi_accepted
    if not arenalib_abi_accepted:
        arena_abi_check(abi_fingerprint())
        arenalib_abi_accepted = True
    return 0


cdef inline ArenaCore* arena_core(object arena) except NULL:
    """The C handle of an open Arena, ConfinedArena or SlicingArena (keep a reference to it)."""
    abi_check()
    return arena_core_checked(arena)


cdef inline int arena_open(ArenaCore* core, int kind, Py_ssize_t max_bytes,
                           size_t chunk_size) except -1:
    """Open an arena in an ArenaCore the caller owns (an arena object's, or a C struct on the
    stack for a nogil scope).  kind: ARENA_KIND_*; max_bytes: -1 for no limit; chunk_size: the
    SlicingArena chunk size (0 for the default).  Needs the GIL; arena_close() undoes it."""
    cdef InlineState* state
    abi_check()
    if kind == ARENA_KIND_CONFINED and max_bytes < 0 and not core.open:
        state = inline_state()
        if state.parked_idle:
            state.parked_idle = False
            core_init(core, state.parked, kind, -1, 0, 0)
            state.arenas_opened += 1
            return 0
    return arena_open_slow(core, kind, max_bytes, chunk_size)


cdef inline int arena_close(ArenaCore* core) except -1:
    """Free every allocation at once and give the memory back (GIL held); idempotent.  Raises
    WrongThreadError for a confined arena of another thread, BufferError while exports live."""
    if close_small_scope(core):
        return 0
    return arena_close_slow(core)
