# cython: language_level=3
# arenalib's C ABI: the structs and constants its inline fast paths read, the per-module state
# they keep, and the table of arenalib's entry points they fall back on (ArenaFunctions, in the
# capsule arenalib._arena._C_API).  Compiled into arenalib's own modules and into every module
# that cimports arenalib.fast; ABI_FINGERPRINT (tools/abi_fingerprint.py) digests this file with
# the others those modules compile in, and a module of another fingerprint is refused.
#
# No jemalloc type appears here: a consumer needs no jemalloc header and links nothing.  Each
# kind's inline rule is in its own .pxd (_confined, _shared, _slicing), the free-block cache's in
# _blocks.pxd, and the public inline functions in fast.pxd.

from cpython.pycapsule cimport PyCapsule_Import
from libc.stdint cimport uint64_t

from arenalib._fingerprints cimport ABI_FINGERPRINT
from arenalib._table cimport ArenaMark


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
    # A SlicingArena's stack of marks (FrameStack) grows by blocks of FRAME_BLOCK_LEVELS levels,
    # never moved once made (segments read them without a lock): FRAME_MAX_DEPTH marks at most.
    FRAME_BLOCK_SHIFT = 8         # a level's block is its index >> FRAME_BLOCK_SHIFT
    FRAME_BLOCK_LEVELS = 1 << FRAME_BLOCK_SHIFT
    FRAME_BLOCKS = 64
    FRAME_MAX_DEPTH = FRAME_BLOCK_LEVELS * FRAME_BLOCKS
    FRAME_DEPTH_BITS = 16         # a frame stamp: (serial << FRAME_DEPTH_BITS) | depth


# -- what segments check ---------------------------------------------------------------------------

cdef struct Lifetime:
    # What a segment checks before each access, kept by whatever hands segments out (an arena's
    # core, a BufferPool).  A segment is alive while its generation is the current one.
    uint64_t generation       # bumped by open, reset and close, never lowered
    Py_ssize_t exports        # live buffer exports and pins of the segments: reset/close refuse
    unsigned long owner       # the one thread allowed (a ConfinedArena's); 0: any thread
    int busy                  # free-threaded builds: a reset or close is at work (_access.pxi)
    int release_pending       # closed while exports were alive: the last one's release frees it
    # A SlicingArena's marks (NULL until its first): a segment carved under a mark is alive also
    # only while the mark's level still has the stamp the segment was given.
    FrameStack* frames


cdef struct FrameLevel:
    # One level of the stack of marks: where carving stood when its mark was made, and the stamp
    # of the segments carved in it since (renewed when a rewind kills them).
    # (serial << FRAME_DEPTH_BITS) | depth, read by segments (relaxed); a mark of the level holds
    # the stamp it had when pushed
    uint64_t stamp
    Py_ssize_t chunk          # the chunk being carved at the mark
    size_t cursor             # ... and where in it (0: no chunk yet)
    Py_ssize_t live_bytes     # the books at the mark
    Py_ssize_t live_segments
    Py_ssize_t exports        # buffer exports and pins of this level's segments (0 when popped)
    Py_ssize_t outer_frame    # a frame's level: the depth of the frame it was entered in; -1: not a frame
    bint abandoned            # a frame whose exit was refused: a rewind below it pops it
    # A Python-level carve was made (or about to be) in it: on a GIL build a C-level rewind that
    # kills it takes the GIL, as the Python threads' accesses of its segments hold it (_dispatch.pxi)
    bint python_carved


cdef struct FrameStack:
    # A SlicingArena's marks and frames, innermost last (see arenalib/_frames.pxd).
    Py_ssize_t depth          # levels pushed (0: none)
    Py_ssize_t top_frame      # the depth of the innermost open frame (0: none)
    # A push takes the straight-line path while depth < push_limit: the levels whose blocks are
    # made, or 0 while an abandoned frame is on the stack (the general push lets it go first).
    Py_ssize_t push_limit
    Py_ssize_t levels         # levels whose blocks are made (blocks are made in order)
    Py_ssize_t abandoned      # abandoned frames on the stack
    # The last serial given to a stamp: every push and pop takes new ones, so it is also the
    # stack's version (read by other threads: relaxed), unchanged across a carve that no mark or
    # rewind came between.
    uint64_t serial
    Py_ssize_t rewinds        # rewinds so far (tracemalloc's books follow them)
    FrameLevel* blocks[FRAME_BLOCKS]


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
    # Bytes the threads' books count as live that nothing holds: the blocks the NumPy handler keeps
    # for reuse (GIL builds: the GIL guards it; arenalib/_numpy.pxi).  0 at open and after a reset.
    Py_ssize_t idle_bytes
    # The kept blocks' bytes handed out again since the open: allocations the threads' books miss
    # (shared_totals adds them).
    size_t reused_bytes


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
    # The most chunk_bytes since the open or the last purge (reset() frees the chunks made for one
    # request, whose pages stay dirty in the slot: the close counts them).
    size_t chunk_bytes_peak


cdef struct HeldMemory:
    # An arena closed while buffer exports of its segments were alive (a deferred close): what it
    # leaves to its slot, which goes back to the pool when the last export is released.
    ArenaSlot* slot           # NULL: nothing held
    size_t stale
    size_t churn
    Py_ssize_t live_bytes     # the arena's live bytes and segments when it closed (stats())
    Py_ssize_t live_segments


cdef struct ArenaCore:
    # arenalib's InlineState, set by every open: a core handed to another module carries arenalib's
    # function table with it.  First, so that a module of any layout finds it at the same place.
    InlineState* state
    # The core's own address, set by every open: a copy (or a moved core) is not at that address,
    # and every path treats it as closed, so a copy kept past a close can never reach the slot's
    # memory (the C API forbids copies; this is how it tells).
    ArenaCore* self
    # The ArenaBase this core is part of (borrowed; NULL for a core of C's own): the C API's close
    # of an arena object's core is the object's close() (which ends what the object keeps: the
    # NumPy handler's cache, the traces), and its reset tells the object when
    # ``object_books`` says it keeps tables of the blocks (tracemalloc's, set_debug()'s; the
    # inline small-scope close then leaves the close to the object).  Set before the first open;
    # no open or close changes them.
    void* arena_object
    bint object_books         # written by Python threads, read by a C-level reset: load_flag/store_flag
    # Permits of the inline fast paths: the thread that may take the ConfinedArena
    # path, and the thread a SlicingArena is biased to (0: nobody).  They are permits, not state:
    # ``open`` alone says whether the arena is open; close revokes both.
    unsigned long fast_owner
    unsigned long carve_owner
    Lifetime life
    int kind                  # ARENA_KIND_* (an arena object's: its class's, from its creation on)
    bint open
    ArenaSlot* slot           # the pooled jemalloc arena behind it (NULL while closed)
    uint64_t serial           # unique per open, never reused (keys the per-thread caches)
    Py_ssize_t max_bytes      # -1: no limit
    Books books               # confined and slicing (a SlicingArena's folded in at reset/close)
    ConfinedState confined
    SharedState shared
    SlicingState slicing
    HeldMemory held           # a deferred close's memory, until its last export goes


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
ctypedef int (*mark_fn)(ArenaCore* core, ArenaMark* out) noexcept nogil
ctypedef int (*rewind_fn)(ArenaCore* core, const ArenaMark* mark) noexcept nogil


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
    mark_fn mark_slow
    rewind_fn rewind_slow


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
    Py_ssize_t arenas_closed  # (the fields above end at offset 128: the records start on a line of their own)
    CarverRecord carvers[CARVER_RECORDS]


cdef extern from "arenalib/platform.h":
    unsigned long thread_ident "arenalib_thread_ident"() noexcept nogil
    int arenalib_clz(unsigned long long x) noexcept nogil
    bint arenalib_try_lock(int* flag) noexcept nogil
    void arenalib_unlock(int* flag) noexcept nogil
    void* arenalib_inline_state_ptr
    int arenalib_abi_verdict
    unsigned long arenalib_abi_unaccepted
    void* arenalib_allocate_slow_fn
    void* arenalib_free_slow_fn
    unsigned long arenalib_load_owner(unsigned long* owner) noexcept nogil
    # Lifetime.owner, which goes from a thread to 0 (no thread's) last in a close, after the close
    # killed every segment: read before the generation, a 0 then orders the close's new generation
    # before the reader's check of it (Segment._status, _core_shut).
    unsigned long load_life_owner "arenalib_load_acquire"(unsigned long* owner) noexcept nogil
    void store_life_owner "arenalib_store_release"(unsigned long* owner, unsigned long value) noexcept nogil
    ThreadCache* load_first_cache "arenalib_load_acquire"(ThreadCache** p) noexcept nogil
    void store_first_cache "arenalib_store_release"(ThreadCache** p, ThreadCache* tc) noexcept nogil
    void arenalib_store_owner(unsigned long* owner, unsigned long value) noexcept nogil
    void* arenalib_load_carving(void** flag) noexcept nogil
    # The biased thread's record: read by that thread on the inline path while a thread taking the
    # arena over clears it (after membarrier(), which ThreadSanitizer cannot see): relaxed atomics.
    CarverRecord* load_carve_record "arenalib_load_owner"(CarverRecord** p) noexcept nogil
    void store_carve_record "arenalib_store_owner"(CarverRecord** p, CarverRecord* r) noexcept nogil
    void arenalib_set_carving(void** flag, void* arena) noexcept nogil
    void arenalib_clear_carving(void** flag) noexcept nogil
    void arenalib_compiler_fence() noexcept nogil
    int ARENALIB_FREE_THREADED
    bint FREE_THREADED "ARENALIB_FREE_THREADED"
    void store_ssize "arenalib_store_relaxed"(Py_ssize_t* counter, Py_ssize_t value) noexcept nogil
    void store_size "arenalib_store_relaxed"(size_t* counter, size_t value) noexcept nogil
    Py_ssize_t load_ssize "arenalib_load_relaxed"(Py_ssize_t* counter) noexcept nogil
    size_t load_size "arenalib_load_relaxed"(size_t* counter) noexcept nogil
    void store_u64 "arenalib_store_relaxed"(uint64_t* counter, uint64_t value) noexcept nogil
    uint64_t load_u64 "arenalib_load_relaxed"(uint64_t* counter) noexcept nogil
    # ArenaCore.open, where a close may be under way in another thread (arena_close_checked).
    bint load_flag "arenalib_load_relaxed"(bint* flag) noexcept nogil
    void store_flag "arenalib_store_relaxed"(bint* flag, bint value) noexcept nogil
    FrameStack* load_frames "arenalib_load_acquire"(FrameStack** p) noexcept nogil
    void store_frames "arenalib_store_release"(FrameStack** p, FrameStack* frames) noexcept nogil
    bint INLINE_PARKING "ARENALIB_INLINE_PARKING"


cdef inline bint owned_by_another(Lifetime* life) noexcept nogil:
    """Whether ``life`` belongs to a thread other than the caller (a ConfinedArena's owner).  Read
    before anything else of ``life``: the owner's close clears it last, after the new generation,
    so an owner read as 0 orders the reader after that close (see load_life_owner)."""
    cdef unsigned long owner = load_life_owner(&life.owner)
    return owner != 0 and owner != thread_ident()


cdef inline uint64_t life_generation(Lifetime* life) noexcept nogil:
    """``life``'s generation, as any thread may read it: a thread that owns an arena renews it with
    no lock (a reset, a close) while other threads ask whether a segment is alive."""
    return load_u64(&life.generation)


cdef inline void life_next_generation(Lifetime* life) noexcept nogil:
    """Kill every segment of ``life`` at once: a new generation, never an earlier one."""
    store_u64(&life.generation, life.generation + 1)


# -- the books every kind keeps -------------------------------------------------------------------

cdef inline void books_add(Books* books, size_t size) noexcept nogil:
    """Count one allocation of ``size`` bytes (read by other threads: see store_ssize)."""
    store_ssize(&books.live_bytes, books.live_bytes + <Py_ssize_t>size)
    store_ssize(&books.live_segments, books.live_segments + 1)
    store_size(&books.allocated_total, books.allocated_total + size)


cdef inline void books_resize(Books* books, size_t old, size_t new, bint moved) noexcept nogil:
    """Count one allocation of ``old`` bytes resized to ``new`` (``moved``: into a new block)."""
    store_ssize(&books.live_bytes, books.live_bytes + <Py_ssize_t>new - <Py_ssize_t>old)
    store_size(&books.allocated_total, books.allocated_total + (new if moved else new - min(old, new)))


cdef inline void books_note_peak(Books* books) noexcept nogil:
    """Bring peak_bytes up to live_bytes."""
    if books.live_bytes > books.peak_bytes:
        books.peak_bytes = books.live_bytes


cdef inline void books_remove(Books* books, size_t size) noexcept nogil:
    """Count one allocation of ``size`` bytes given back."""
    store_ssize(&books.live_bytes, books.live_bytes - <Py_ssize_t>size)
    store_ssize(&books.live_segments, books.live_segments - 1)


cdef inline void books_clear(Books* books) noexcept nogil:
    books.live_bytes = 0
    books.live_segments = 0
    books.peak_bytes = 0
    books.allocated_total = 0


cdef inline void core_init(ArenaCore* core, InlineState* state, ArenaSlot* slot, int kind,
                           Py_ssize_t max_bytes, uint64_t serial) noexcept nogil:
    """The fields every kind sets at open, without permits; the kind's own open (_dispatch.pxi)
    comes next, and then ``open``.  Field by field, not memset: a scope's whole budget is a few ns
    (see DESIGN.md)."""
    core.state = state
    core.self = core
    core.slot = slot
    core.kind = kind
    core.fast_owner = 0       # permits: each kind's open grants its own
    core.carve_owner = 0
    core.shared.first_cache = NULL
    core.max_bytes = max_bytes if max_bytes >= 0 else -1
    core.life.owner = 0
    # Never back: a segment of this core from before a close must stay dead after a re-open.
    life_next_generation(&core.life)
    core.life.exports = 0
    core.serial = serial
    books_clear(&core.books)


cdef inline uint64_t abi_fingerprint() noexcept nogil:
    """The fingerprint of the C ABI this module was compiled with: the digest of the declarations
    (ABI_FINGERPRINT) and whether the interpreter is free-threaded."""
    return ABI_FINGERPRINT ^ <uint64_t>ARENALIB_FREE_THREADED


cdef inline InlineState* core_state(ArenaCore* core) noexcept nogil:
    """arenalib's InlineState through ``core``; NULL when the core was never opened or arenalib has
    another C ABI than this module was compiled with (judged once per module, without the GIL)."""
    global arenalib_abi_verdict, arenalib_abi_unaccepted
    cdef InlineState* state = core.state
    if state == NULL or arenalib_abi_verdict == 1:
        return state
    if arenalib_abi_verdict == 0:
        arenalib_abi_verdict = 1 if state.abi_fingerprint == abi_fingerprint() else -1
        arenalib_abi_unaccepted = arenalib_abi_verdict != 1
    return state if arenalib_abi_verdict == 1 else NULL


cdef inline unsigned long inline_ident() noexcept nogil:
    """The calling thread's identity as this module's inline fast paths compare it with a core's
    permits: one that matches none until the module has accepted arenalib's C ABI."""
    return thread_ident() | arenalib_abi_unaccepted


cdef inline void adopt_inline_state(InlineState* state) noexcept nogil:
    """Make ``state`` this module's (once its fingerprint is accepted)."""
    global arenalib_inline_state_ptr, arenalib_abi_verdict, arenalib_abi_unaccepted
    global arenalib_allocate_slow_fn, arenalib_free_slow_fn
    arenalib_allocate_slow_fn = <void*>state.functions.allocate_slow
    arenalib_free_slow_fn = <void*>state.functions.free_slow
    arenalib_abi_verdict = 1
    arenalib_abi_unaccepted = 0
    arenalib_inline_state_ptr = state


cdef inline int abi_check() except -1:
    """Once per module, with the GIL: find arenalib's InlineState (importing arenalib), and raise
    ImportError if this module was compiled against another arenalib's C ABI."""
    global arenalib_abi_verdict
    if arenalib_inline_state_ptr != NULL:
        return 0
    cdef InlineState* state = <InlineState*>PyCapsule_Import(b"arenalib._arena._C_API", 0)
    # The fingerprint is the state's first word: readable whatever the rest of the layout is.
    cdef uint64_t ours = abi_fingerprint()
    if state.abi_fingerprint != ours:
        arenalib_abi_verdict = -1
        raise ImportError(
            f"a Cython extension was compiled against another arenalib C ABI (fingerprint "
            f"{ours:#018x}; this arenalib has {state.abi_fingerprint:#018x}): rebuild "
            "the extension against the arenalib it runs with")
    adopt_inline_state(state)
    return 0
