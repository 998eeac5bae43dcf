# cython: language_level=3
# arenalib's C ABI: everything a module that cimports arenalib compiles into itself, and nothing else.
# The structs the inline fast paths read, the constants and error codes they bake in, the inline
# functions, and the table of arenalib's entry points they fall back on.  The public names are
# re-exported by arenalib/__init__.pxd; abi_fingerprint() at the bottom digests this whole surface.
#
# No jemalloc type appears here and no cimport of an arenalib module: a consumer needs no jemalloc
# header and links nothing, and reaches arenalib's functions through the ArenaFunctions table of the
# capsule arenalib._arena._C_API (as numpy.random's bit generators do).

from cpython.pycapsule cimport PyCapsule_Import
from libc.stdint cimport uint64_t
from libc.string cimport memset


# Result codes of the nogil functions; arena_raise() turns one into the matching Python exception
# (the table is ERROR_TABLE in arenalib/_errors.pxi, shared by the Python and the C entry points).
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
    ARENA_ERROR_CODES = 9

cdef enum:
    ARENA_KIND_SHARED = 0     # Arena
    ARENA_KIND_CONFINED = 1   # ConfinedArena
    ARENA_KIND_SLICING = 2    # SlicingArena

cdef enum:
    # Size classes of the free-block cache: 16-byte steps up to 1 KiB, then jemalloc's four classes
    # per doubling up to 64 KiB.
    CACHE_BINS = 89
    CACHE_MAX_SIZE = 65536
    CACHE_MAX_BYTES = 1 << 20     # free blocks one cache keeps for reuse
    CACHE_MAX_PER_BIN = 64
    NO_HOT_BLOCK = 0              # FreeBlocks.hot_tag when no block is held apart
    # An arena that allocated more than this hands its pages back to the OS at close.
    PURGE_LIMIT = 4 << 20
    SLICE_DEFAULT_ALIGN = 16      # malloc's guarantee on x86-64 (max_align_t)
    # A confined arena remembers its first few allocations: when those are all it holds at close,
    # they go back to the slot's free-block cache instead of waiting for a bulk reset.
    RECENT_MAX = 4
    CARVER_RECORDS = 256


# -- what segments check ---------------------------------------------------------------------------

cdef struct Lifetime:
    # What a segment checks before each access, kept by whatever hands segments out (an arena's
    # core, a BufferPool).  A segment is alive while its generation is the current one.
    uint64_t generation       # bumped by open, reset and close, never lowered
    Py_ssize_t exports        # live buffer exports and pins of the segments: reset/close refuse
    unsigned long owner       # the one thread allowed (a ConfinedArena's); 0: any thread
    int busy                  # free-threaded builds: a reset or close is at work (_access.pxi)


cdef struct Books:
    # Accounting of the sizes asked for; changed by books_add()/books_remove() only (peak_bytes by
    # books_note_peak(), for books that are the arena's own and not one thread's share of it).
    Py_ssize_t live_bytes
    Py_ssize_t live_segments
    Py_ssize_t peak_bytes
    size_t allocated_total


# -- the free-block cache and the pooled jemalloc slot ---------------------------------------------

cdef struct FreeBlocks:
    # Freed blocks kept for reuse by one thread, per size class: singly linked lists threaded
    # through the blocks themselves.  A pop or push is a few instructions and no lock.  The block
    # freed last is held apart (``hot``, of class ``hot_tag - 1``; NO_HOT_BLOCK: none, so that a
    # zeroed cache is empty): the next allocation of its class takes it without reading a next
    # pointer out of the block just written (cache_held_bytes() counts it).
    size_t cached_bytes       # bytes in the lists
    void* hot
    int hot_tag
    void* heads[CACHE_BINS]
    unsigned char counts[CACHE_BINS]


cdef struct ArenaSlot:
    # One jemalloc explicit arena with the explicit tcache that serves it and a cache of free blocks,
    # pooled across arena objects (see _slots.pxi for why they are pooled).
    unsigned arena_index
    unsigned tcache_index
    size_t stale_bytes    # allocations left behind by closed arena objects, dropped by a reset
    size_t churn_bytes    # the most allocated at once since the last purge: what may sit dirty
    FreeBlocks cache      # used by confined arenas (one owner thread at a time)
    ThreadCache* threads  # shared arenas' per-thread caches, kept warm with the slot
    int thread_count
    void* threads_lock


cdef struct ThreadCache:
    # A shared Arena's per-thread state: its own jemalloc tcache (no lock on the common path) and
    # its own books (no cache line bounced between threads).
    ThreadCache* next
    unsigned long thread
    unsigned tcache_index
    Py_ssize_t high_water     # the most books.live_bytes has been: see shared_update_peak()
    # The fields above are read by other threads, the ones below written on every call: apart, so
    # that they never share a cache line.
    char line_apart[64]
    Books books
    FreeBlocks cache


cdef struct CarverRecord:
    # One thread's flag for the biased SlicingArena path: the arena it is carving right now (NULL:
    # none).  Only its own thread writes ``carving``; a thread taking the arena over reads it.
    # Keyed by thread ident (a thread that reuses a dead one's ident takes its record over); one
    # per cache line, so that threads carving at once never share a line.
    unsigned long thread
    void* carving
    char padding[48]


# -- each kind's own fields ------------------------------------------------------------------------

cdef struct ConfinedState:
    # ConfinedArena: its first allocations, remembered for a close without a bulk reset.
    int recent_count
    bint recent_overflowed    # more than RECENT_MAX allocations: recent[] is not all it holds
    void* recent[RECENT_MAX]  # NULL once freed
    size_t recent_sizes[RECENT_MAX]


cdef struct SharedState:
    # Arena: bytes reserved against max_bytes by all threads (compare-and-swap; unlimited arenas
    # never touch it, their books are per thread).
    Py_ssize_t reserved_bytes
    # The ThreadCache of the first thread to allocate from this open (unlimited) Arena: that
    # thread's allocations and frees take the inline fast path, without a thread-local lookup.
    # Written once per open and cleared by close, so threads taking turns never bounce its line.
    ThreadCache* first_cache


cdef struct SlicingState:
    # SlicingArena: the chunks carved by bump pointer, and who may carve without the lock.
    int busy                  # a thread holds the slow path's lock
    CarverRecord* carve_record  # the biased thread's record (NULL: not biased)
    size_t chunk_size
    char** chunks
    size_t* chunk_sizes
    Py_ssize_t nchunks
    Py_ssize_t chunks_capacity
    Py_ssize_t current        # chunk being carved
    size_t cursor             # address of the next free byte in the current chunk (0: no chunk)
    size_t cursor_end         # address of the current chunk's end
    size_t chunk_bytes


cdef struct ArenaCore:
    # arenalib's InlineState, set by every open: a core handed to another module carries arenalib's
    # function table with it.  First, so that a module of any layout finds it at the same place.
    InlineState* state
    # The core's own address, set by every open: a copy (or a moved core) is not at that address,
    # and every path treats it as closed, so a copy kept past a close can never reach the slot's
    # memory (the C API forbids copies; this is how it tells).
    ArenaCore* self
    # Permits of the inline fast paths: the thread that may take the ConfinedArena
    # path, and the thread a SlicingArena is biased to (0: nobody).  They are permits, not state:
    # ``open`` alone says whether the arena is open; close revokes both.
    unsigned long fast_owner
    unsigned long carve_owner
    Lifetime life
    int kind                  # ARENA_KIND_*
    bint open
    ArenaSlot* slot           # the pooled jemalloc arena behind it (NULL while closed)
    uint64_t serial           # unique per open, never reused (keys the per-thread caches)
    Py_ssize_t max_bytes      # -1: no limit
    Books books               # confined and slicing (a SlicingArena's folded in at reset/close)
    ConfinedState confined
    SharedState shared
    SlicingState slicing


# -- arenalib's entry points -----------------------------------------------------------------------

ctypedef int (*open_fn)(ArenaCore* core, int kind, Py_ssize_t max_bytes, size_t chunk_size) except -1
ctypedef int (*close_fn)(ArenaCore* core) except -1
ctypedef int (*allocate_fn)(ArenaCore* core, size_t size, size_t align, bint zero,
                            void** out) noexcept nogil
ctypedef int (*free_fn)(ArenaCore* core, void* ptr, size_t size) noexcept nogil
ctypedef int (*reset_fn)(ArenaCore* core) noexcept nogil
ctypedef int (*raise_fn)(int code) except -1
ctypedef ArenaCore* (*core_of_fn)(object arena) except NULL
ctypedef void (*slot_free_fn)(ArenaSlot* slot, void* ptr) noexcept nogil


cdef struct ArenaFunctions:
    # What the inline functions call when the fast path does not apply; each holds every rule.
    open_fn open_slow
    close_fn close_slow
    allocate_fn allocate_slow
    free_fn free_slow
    reset_fn reset
    raise_fn raise_error
    core_of_fn core_of
    slot_free_fn slot_free


cdef struct InlineState:
    # What arenalib shares with the inline functions of every module that cimports them.
    # abi_fingerprint comes first: a module checks it before it reads anything else.
    #
    # The slot given back last (``parked``) is taken by the next arena without touching the pool;
    # an arena that takes it only clears parked_idle (the pointer stays), so the next scope finds its
    # slot without waiting on a store just made.  Opens and closes are counted apart: one counter
    # both add to and subtract from would chain every scope to the one before through memory.  With
    # the GIL, the inline functions use those fields holding it; on a free-threaded interpreter they
    # leave them to arenalib's own functions (INLINE_PARKING is 0).  The carver records are used
    # without the GIL: only their own thread writes them.
    uint64_t abi_fingerprint
    ArenaFunctions functions
    ArenaSlot* parked
    bint parked_idle
    size_t parked_headroom    # the churn the parked slot may reach idle, within the retain limit
    Py_ssize_t arenas_opened
    Py_ssize_t arenas_closed
    char padding[16]          # the records start on a cache line of their own (offset 128)
    CarverRecord carvers[CARVER_RECORDS]


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
    #define arenalib_load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    #define arenalib_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    #define arenalib_store_owner(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    #define arenalib_load_carving(p) __atomic_load_n((p), __ATOMIC_RELAXED)
    #define arenalib_set_carving(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
    #define arenalib_clear_carving(p) __atomic_store_n((p), (void *)0, __ATOMIC_RELEASE)
    /* Orders this thread's own accesses for the compiler only: the thread that revokes a biased
       arena issues membarrier(), which makes that enough (asymmetric fences). */
    #define arenalib_compiler_fence() __atomic_signal_fence(__ATOMIC_SEQ_CST)
    #ifdef Py_GIL_DISABLED
    #define ARENALIB_FREE_THREADED 1
    #else
    #define ARENALIB_FREE_THREADED 0
    #endif
    /* Counters one thread writes and others read (a shared Arena's per-thread books): relaxed
       atomics where threads run at once (plain moves on x86-64), plain elsewhere. */
    #if ARENALIB_FREE_THREADED
    #define arenalib_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
    #define arenalib_load_relaxed(p) __atomic_load_n((p), __ATOMIC_RELAXED)
    #else
    #define arenalib_store_relaxed(p, v) (*(p) = (v))
    #define arenalib_load_relaxed(p) (*(p))
    #endif
    /* Whether inline code takes and parks the shared parked slot: only where the GIL serialises it. */
    #define ARENALIB_INLINE_PARKING (!ARENALIB_FREE_THREADED)

    /* This module's pointer to arenalib's InlineState, set by abi_check() (with the GIL) once the
       layouts this module was compiled with are accepted; and the verdict on arenalib's C ABI for
       cores handed to this module (0: not judged yet, 1: same as ours, -1: another). */
    static void *arenalib_inline_state_ptr = 0;
    static int arenalib_abi_verdict = 0;
    /* The two slow paths the fast paths fall to most, copied out of the table by abi_check(): one
       load to reach them, as a cimported function would take. */
    static void *arenalib_allocate_slow_fn = 0;
    static void *arenalib_free_slow_fn = 0;
    """
    unsigned long thread_ident "arenalib_thread_ident"() noexcept nogil
    int arenalib_clz(unsigned long long x) noexcept nogil
    bint arenalib_try_lock(int* flag) noexcept nogil
    void arenalib_unlock(int* flag) noexcept nogil
    void* arenalib_inline_state_ptr
    int arenalib_abi_verdict
    void* arenalib_allocate_slow_fn
    void* arenalib_free_slow_fn
    unsigned long arenalib_load_owner(unsigned long* owner) noexcept nogil
    ThreadCache* load_first_cache "arenalib_load_acquire"(ThreadCache** p) noexcept nogil
    void store_first_cache "arenalib_store_release"(ThreadCache** p, ThreadCache* tc) noexcept nogil
    void arenalib_store_owner(unsigned long* owner, unsigned long value) noexcept nogil
    void* arenalib_load_carving(void** flag) noexcept nogil
    void arenalib_set_carving(void** flag, void* arena) noexcept nogil
    void arenalib_clear_carving(void** flag) noexcept nogil
    void arenalib_compiler_fence() noexcept nogil
    int ARENALIB_FREE_THREADED
    bint FREE_THREADED "ARENALIB_FREE_THREADED"
    void store_ssize "arenalib_store_relaxed"(Py_ssize_t* counter, Py_ssize_t value) noexcept nogil
    void store_size "arenalib_store_relaxed"(size_t* counter, size_t value) noexcept nogil
    Py_ssize_t load_ssize "arenalib_load_relaxed"(Py_ssize_t* counter) noexcept nogil
    size_t load_size "arenalib_load_relaxed"(size_t* counter) noexcept nogil
    bint INLINE_PARKING "ARENALIB_INLINE_PARKING"


# -- the inline fast paths ---------------------------------------------------------------------------
# Compiled into every module that cimports them, arenalib's own included: the common case of a
# ConfinedArena (a block from its own free list) and of a SlicingArena (a carve in the current chunk)
# costs no call across modules.  Anything else goes to arenalib's functions, which hold every rule.

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
    if cache.hot_tag == b + 1:
        cache.hot_tag = NO_HOT_BLOCK
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
    cdef int old_bin = cache.hot_tag - 1
    cdef void* old = cache.hot
    cdef size_t block
    if cache.hot_tag != NO_HOT_BLOCK:
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
    cache.hot_tag = b + 1
    return True


cdef inline size_t cache_held_bytes(FreeBlocks* cache) noexcept nogil:
    """Bytes of all the blocks the cache holds."""
    if cache.hot_tag != NO_HOT_BLOCK:
        return cache.cached_bytes + cache_bin_size(cache.hot_tag - 1)
    return cache.cached_bytes


cdef inline bint small_align(size_t align) noexcept nogil:
    """``align`` is 0 or a power of two up to 16, which every block of the fast paths meets."""
    return align <= 16 and (align & (align - 1)) == 0


cdef inline void books_add(Books* books, size_t size) noexcept nogil:
    """Count one allocation of ``size`` bytes (read by other threads: see store_ssize)."""
    store_ssize(&books.live_bytes, books.live_bytes + <Py_ssize_t>size)
    store_ssize(&books.live_segments, books.live_segments + 1)
    store_size(&books.allocated_total, books.allocated_total + size)


cdef inline void books_note_peak(Books* books) noexcept nogil:
    """Bring peak_bytes up to live_bytes."""
    if books.live_bytes > books.peak_bytes:
        books.peak_bytes = books.live_bytes


cdef inline void books_remove(Books* books, size_t size) noexcept nogil:
    """Count one allocation of ``size`` bytes given back."""
    store_ssize(&books.live_bytes, books.live_bytes - <Py_ssize_t>size)
    store_ssize(&books.live_segments, books.live_segments - 1)


cdef inline void shared_count_allocation(ThreadCache* tc, size_t size) noexcept nogil:
    """A shared Arena's books for a new block, on the allocating thread's share (the arena's
    peak is shared_update_peak()'s)."""
    books_add(&tc.books, size)
    if tc.books.live_bytes > tc.high_water:
        store_ssize(&tc.high_water, tc.books.live_bytes)


cdef inline void books_clear(Books* books) noexcept nogil:
    books.live_bytes = 0
    books.live_segments = 0
    books.peak_bytes = 0
    books.allocated_total = 0


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


cdef inline void* slicing_carve_current(ArenaCore* core, size_t size, size_t align,
                                        bint zero) noexcept nogil:
    """``size`` bytes carved from the current chunk at ``align`` (>= 16), or NULL when they do
    not fit or there is no chunk.  The caller holds the busy lock or the arena's bias."""
    cdef SlicingState* slicing = &core.slicing
    cdef size_t start = (slicing.cursor + align - 1) & ~(align - 1)
    if start > slicing.cursor_end or size > slicing.cursor_end - start or start == 0:
        return NULL
    slicing.cursor = start + size
    # Nothing is freed between resets, so peak_bytes and allocated_total are brought up to date
    # from live_bytes at reset and close (slicing_settle) instead of on every carve: the one
    # kind whose books are not kept by books_add(), for the carve's sake.
    core.books.live_bytes += size
    core.books.live_segments += 1
    if zero:
        memset(<void*>start, 0, size)
    return <void*>start


cdef inline void slicing_settle(ArenaCore* core) noexcept nogil:
    """Fold a SlicingArena's live bytes into peak_bytes and allocated_total, before they go."""
    if core.books.live_bytes > core.books.peak_bytes:
        core.books.peak_bytes = core.books.live_bytes
    core.books.allocated_total += <size_t>core.books.live_bytes


cdef inline InlineState* core_state(ArenaCore* core) noexcept nogil:
    """arenalib's InlineState through ``core``; NULL when the core was never opened or arenalib has
    another C ABI than this module was compiled with (judged once per module, without the GIL)."""
    global arenalib_abi_verdict
    cdef InlineState* state = core.state
    if state == NULL or arenalib_abi_verdict == 1:
        return state
    if arenalib_abi_verdict == 0:
        arenalib_abi_verdict = 1 if state.abi_fingerprint == abi_fingerprint(state) else -1
    return state if arenalib_abi_verdict == 1 else NULL


cdef inline int arena_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                               void** out) noexcept nogil:
    """Allocate ``size`` bytes aligned to ``align`` (0 or a power of two up to 1 GiB), zeroed if
    ``zero``; the address goes to ``*out``.  Returns ARENA_OK or an error code."""
    cdef void* ptr
    cdef unsigned long me = thread_ident()
    cdef CarverRecord* record
    cdef ThreadCache* tc
    cdef InlineState* state
    if core.self != core:
        pass  # a copy: the slow path says it is closed
    elif core.fast_owner == me and small_align(align) and size <= CACHE_MAX_SIZE:
        ptr = cache_pop(&core.slot.cache, size)
        if ptr != NULL:
            if zero:
                memset(ptr, 0, size)
            confined_count_allocation(core, ptr, size)
            out[0] = ptr
            return ARENA_OK
    elif core.kind == ARENA_KIND_SHARED:
        tc = load_first_cache(&core.shared.first_cache)
        if (tc != NULL and arenalib_load_owner(&tc.thread) == me and small_align(align)
                and size <= CACHE_MAX_SIZE):
            ptr = cache_pop(&tc.cache, size)
            if ptr != NULL:
                if zero:
                    memset(ptr, 0, size)
                shared_count_allocation(tc, size)
                out[0] = ptr
                return ARENA_OK
    elif arenalib_load_owner(&core.carve_owner) == me and small_align(align):
        # The SlicingArena is biased to this thread: announce the carve in this thread's own
        # record, then check that the arena was not taken over meanwhile (a thread taking it over
        # clears carve_owner, runs membarrier(), then reads the record: one of the two sees the
        # other).  No atomic read-modify-write, no fence instruction.
        # The record read here may already be the next owner's (or none): a thread only ever
        # announces a carve in its own record, else it takes the slow path.
        record = core.slicing.carve_record
        if record != NULL and record.thread == me:
            arenalib_set_carving(&record.carving, core)
            arenalib_compiler_fence()
            ptr = NULL
            if arenalib_load_owner(&core.carve_owner) == me:
                ptr = slicing_carve_current(core, size, SLICE_DEFAULT_ALIGN, zero)
            arenalib_clear_carving(&record.carving)
            if ptr != NULL:
                out[0] = ptr
                return ARENA_OK
    if arenalib_allocate_slow_fn != NULL:
        return (<allocate_fn>arenalib_allocate_slow_fn)(core, size, align, zero, out)
    state = core_state(core)  # a core handed to a module that never called abi_check()
    if state == NULL:
        return ARENA_ECLOSED  # never opened, or by an arenalib of another C ABI
    return state.functions.allocate_slow(core, size, align, zero, out)


cdef inline int arena_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil:
    """Give back one allocation of Arena or ConfinedArena; ``size`` must be the size allocated."""
    cdef InlineState* state
    cdef ThreadCache* tc
    cdef unsigned long me = thread_ident()
    if size <= CACHE_MAX_SIZE and core.self == core:  # a copy: the slow path says it is closed
        if core.fast_owner == me:
            if cache_push(&core.slot.cache, ptr, size):
                confined_count_free(core, ptr, size)
                return ARENA_OK
        elif core.kind == ARENA_KIND_SHARED:
            tc = load_first_cache(&core.shared.first_cache)
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
    """Free every allocation at once and keep the arena open (no other thread may use it now)."""
    cdef InlineState* state = core_state(core)
    if state == NULL:
        return ARENA_ECLOSED
    return state.functions.reset(core)


cdef inline void core_init(ArenaCore* core, InlineState* state, ArenaSlot* slot, int kind,
                           Py_ssize_t max_bytes, size_t chunk_size, uint64_t serial) noexcept nogil:
    """Open ``core`` on ``slot``.  Field by field, not memset: a scope's whole budget is a few ns
    (see DESIGN.md).  recent[] needs no clearing."""
    core.state = state
    core.self = core
    core.slot = slot
    core.kind = kind
    core.carve_owner = 0      # every kind stays off the inline slicing path until a carve
    core.max_bytes = max_bytes if max_bytes >= 0 else -1
    core.life.owner = thread_ident() if kind == ARENA_KIND_CONFINED else 0
    core.fast_owner = core.life.owner if max_bytes < 0 else 0
    # Never back: a segment of this core from before a close must stay dead after a re-open.
    core.life.generation += 1
    core.life.exports = 0
    core.serial = serial
    books_clear(&core.books)
    core.confined.recent_count = 0
    core.confined.recent_overflowed = False
    if kind == ARENA_KIND_SHARED:
        core.shared.reserved_bytes = 0
        core.shared.first_cache = NULL
    elif kind == ARENA_KIND_SLICING:
        memset(&core.slicing, 0, sizeof(SlicingState))
        core.slicing.chunk_size = chunk_size
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
    for i in range(core.confined.recent_count):
        ptr = core.confined.recent[i]
        size = core.confined.recent_sizes[i]
        if ptr != NULL and not (size <= CACHE_MAX_SIZE and cache_push(&slot.cache, ptr, size)):
            core.state.functions.slot_free(slot, ptr)


cdef inline bint close_small_scope(ArenaCore* core, InlineState* state) noexcept nogil:
    """Close a ConfinedArena of the calling thread that holds at most RECENT_MAX blocks and was
    opened on the parked slot: its blocks go to the slot's cache and the slot is idle again, warm
    for the next arena.  False (nothing done) in any other case.  The caller holds the GIL.
    ``state`` is the module's own pointer (arena_close() has made sure of it), not core.state,
    which the open has only just stored."""
    cdef ArenaSlot* slot = core.slot
    if (not INLINE_PARKING or core.self != core or core.fast_owner != thread_ident()
            or core.confined.recent_overflowed
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
    core.open = False
    core.life.generation += 1
    core.slot = NULL
    return True


cdef inline uint64_t _abi_mix(uint64_t h, uint64_t value) noexcept nogil:
    return (h ^ value) * <uint64_t>1099511628211ULL  # FNV-1a, a word at a time


cdef inline uint64_t _abi_offsets(uint64_t h, void* base, void** fields, int count) noexcept nogil:
    """``h`` mixed with the offset of each of ``count`` fields from the start of their struct."""
    cdef int i
    for i in range(count):
        h = _abi_mix(h, <uint64_t>(<char*>fields[i] - <char*>base))
    return h


cdef inline uint64_t abi_fingerprint(InlineState* st) noexcept nogil:
    """A digest of all that this file bakes into a module that cimports it: the size and field
    offsets of every struct, the constants and error codes, the size-class and alignment rules, and
    whether the interpreter is free-threaded.  A module whose digest differs from arenalib's own is
    refused (abi_check), so no change to this surface goes unnoticed; nobody bumps a number.

    ``st`` is arenalib's InlineState (only the place of its fields is read): the offsets of its
    16 KiB of carver records are taken from it, not from a copy on the stack."""
    cdef ArenaCore c
    cdef ArenaSlot s
    cdef FreeBlocks* f = &s.cache
    cdef CarverRecord* r = &st.carvers[0]
    cdef ThreadCache t
    cdef void* c_fields[33]
    cdef void* s_fields[8]
    cdef void* t_fields[6]
    cdef void* f_fields[5]
    cdef void* st_fields[15]
    cdef void* r_fields[2]
    cdef uint64_t constants[24]
    cdef uint64_t h = <uint64_t>14695981039346656037ULL
    cdef size_t size
    cdef int b
    h = _abi_mix(h, sizeof(ArenaCore))
    c_fields[:] = [
        <void*>&c.state, <void*>&c.self, <void*>&c.fast_owner, <void*>&c.carve_owner,
        <void*>&c.life.generation,
        <void*>&c.life.exports, <void*>&c.life.owner, <void*>&c.kind, <void*>&c.open,
        <void*>&c.slot, <void*>&c.serial, <void*>&c.max_bytes, <void*>&c.books.live_bytes,
        <void*>&c.books.live_segments, <void*>&c.books.peak_bytes, <void*>&c.books.allocated_total,
        <void*>&c.confined.recent_count, <void*>&c.confined.recent_overflowed,
        <void*>&c.confined.recent, <void*>&c.confined.recent_sizes, <void*>&c.shared.reserved_bytes,
        <void*>&c.shared.first_cache,
        <void*>&c.slicing.busy, <void*>&c.slicing.carve_record, <void*>&c.slicing.chunk_size,
        <void*>&c.slicing.chunks, <void*>&c.slicing.chunk_sizes, <void*>&c.slicing.nchunks,
        <void*>&c.slicing.chunks_capacity, <void*>&c.slicing.current, <void*>&c.slicing.cursor,
        <void*>&c.slicing.cursor_end, <void*>&c.slicing.chunk_bytes]
    h = _abi_offsets(h, &c, c_fields, 33)
    h = _abi_mix(h, sizeof(ArenaSlot))
    s_fields[:] = [
        <void*>&s.arena_index, <void*>&s.tcache_index, <void*>&s.stale_bytes, <void*>&s.churn_bytes,
        <void*>&s.cache, <void*>&s.threads, <void*>&s.thread_count, <void*>&s.threads_lock]
    h = _abi_offsets(h, &s, s_fields, 8)
    h = _abi_mix(h, sizeof(ThreadCache))
    t_fields[:] = [
        <void*>&t.next, <void*>&t.thread, <void*>&t.tcache_index, <void*>&t.high_water,
        <void*>&t.books, <void*>&t.cache]
    h = _abi_offsets(h, &t, t_fields, 6)
    h = _abi_mix(h, sizeof(FreeBlocks))
    f_fields[:] = [
        <void*>&f.cached_bytes, <void*>&f.hot, <void*>&f.hot_tag, <void*>&f.heads, <void*>&f.counts]
    h = _abi_offsets(h, f, f_fields, 5)
    h = _abi_mix(h, sizeof(InlineState))
    st_fields[:] = [
        <void*>&st.abi_fingerprint, <void*>&st.functions.open_slow, <void*>&st.functions.close_slow,
        <void*>&st.functions.allocate_slow, <void*>&st.functions.free_slow,
        <void*>&st.functions.reset, <void*>&st.functions.raise_error, <void*>&st.functions.core_of,
        <void*>&st.functions.slot_free, <void*>&st.parked, <void*>&st.parked_idle,
        <void*>&st.parked_headroom, <void*>&st.arenas_opened, <void*>&st.arenas_closed,
        <void*>&st.carvers]
    h = _abi_offsets(h, st, st_fields, 15)
    h = _abi_mix(h, sizeof(CarverRecord))
    r_fields[:] = [
        <void*>&r.thread, <void*>&r.carving]
    h = _abi_offsets(h, r, r_fields, 2)
    constants[:] = [
        CACHE_BINS, CACHE_MAX_SIZE, CACHE_MAX_BYTES, CACHE_MAX_PER_BIN, NO_HOT_BLOCK, PURGE_LIMIT,
        SLICE_DEFAULT_ALIGN, RECENT_MAX, CARVER_RECORDS, ARENA_KIND_SHARED, ARENA_KIND_CONFINED,
        ARENA_KIND_SLICING, ARENA_OK, ARENA_ENOMEM, ARENA_ELIMIT, ARENA_ECLOSED,
        ARENA_EWRONGTHREAD, ARENA_EINVAL, ARENA_EEXPORTED, ARENA_EBUSY, ARENA_EUNSUPPORTED,
        ARENA_ERROR_CODES, ARENALIB_FREE_THREADED, INLINE_PARKING]
    for b in range(24):
        h = _abi_mix(h, constants[b])
    for b in range(CACHE_BINS):
        h = _abi_mix(h, cache_bin_size(b))
    for size in range(0, CACHE_MAX_SIZE + 1, 8):
        h = _abi_mix(h, <uint64_t>cache_bin(size))
    for size in range(65):
        h = _abi_mix(h, <uint64_t>small_align(size))
    return h


cdef inline void adopt_inline_state(InlineState* state) noexcept nogil:
    """Make ``state`` this module's (once its fingerprint is accepted)."""
    global arenalib_inline_state_ptr, arenalib_abi_verdict
    global arenalib_allocate_slow_fn, arenalib_free_slow_fn
    arenalib_allocate_slow_fn = <void*>state.functions.allocate_slow
    arenalib_free_slow_fn = <void*>state.functions.free_slow
    arenalib_abi_verdict = 1
    arenalib_inline_state_ptr = state


cdef inline int abi_check() except -1:
    """Once per module, with the GIL: find arenalib's InlineState (importing arenalib), and raise
    ImportError if this module was compiled against another arenalib's C ABI."""
    global arenalib_abi_verdict
    if arenalib_inline_state_ptr != NULL:
        return 0
    cdef InlineState* state = <InlineState*>PyCapsule_Import(b"arenalib._arena._C_API", 0)
    # The fingerprint is the state's first word: readable whatever the rest of the layout is.
    cdef uint64_t ours = abi_fingerprint(state)
    if state.abi_fingerprint != ours:
        arenalib_abi_verdict = -1
        raise ImportError(
            f"a Cython extension was compiled against another arenalib C ABI (fingerprint "
            f"{ours:#018x}; this arenalib has {state.abi_fingerprint:#018x}): rebuild "
            "the extension against the arenalib it runs with")
    adopt_inline_state(state)
    return 0


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
    arena_close() undoes it."""
    cdef InlineState* state
    if arenalib_inline_state_ptr == NULL:  # the first time only (abi_check() is not small)
        abi_check()
    state = <InlineState*>arenalib_inline_state_ptr
    if INLINE_PARKING and kind == ARENA_KIND_CONFINED and max_bytes < 0 and not core.open:
        if state.parked_idle:
            state.parked_idle = False
            core_init(core, state, state.parked, kind, -1, 0, 0)
            state.arenas_opened += 1
            return 0
    return state.functions.open_slow(core, kind, max_bytes, chunk_size)


cdef inline int arena_close(ArenaCore* core) except -1:
    """Free every allocation at once and give the memory back (GIL held); idempotent.  Raises
    WrongThreadError for a confined arena of another thread, BufferError while exports live."""
    if not core.open:
        return 0
    if arenalib_inline_state_ptr == NULL:
        abi_check()
    if close_small_scope(core, <InlineState*>arenalib_inline_state_ptr):
        return 0
    return core.state.functions.close_slow(core)
