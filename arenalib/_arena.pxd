# cython: language_level=3
# Declarations of arenalib's arenas and segments, for arenalib's other Cython modules and for
# extensions that cimport arenalib (the public surface is arenalib/__init__.pxd).  No jemalloc type
# appears here: consumers need no jemalloc header and link nothing.

from libc.stdint cimport uint64_t


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
    # A confined arena remembers its first few allocations: when those are all it holds at close,
    # they go back to the slot's free-block cache instead of waiting for a bulk reset.
    RECENT_MAX = 4


cdef struct FreeBlocks:
    # Freed blocks kept for reuse by one thread, per size class: singly linked lists threaded
    # through the blocks themselves.  A pop or push is a few instructions and no lock.
    size_t cached_bytes
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


cdef struct ArenaCore:
    int kind
    bint open
    int busy                  # SlicingArena: a thread is carving right now
    ArenaSlot* slot
    unsigned long owner       # owning thread ident; 0 when any thread may use the arena
    uint64_t generation       # bumped by reset and close: every older segment is dead
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
    size_t offset             # next free byte in the current chunk
    size_t chunk_bytes


cdef class Segment:
    cdef:
        char* _ptr
        Py_ssize_t _size
        ArenaBase _arena
        Segment _root           # the segment that owns the memory; None when this one does
        uint64_t _generation    # the arena's generation when allocated: stale after a reset/close
        Py_ssize_t _exports     # live buffer exports; counted on the root only
        bint _freed

    cdef int _check(self) except -1
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

cdef int arena_open(ArenaCore* core, int kind, Py_ssize_t max_bytes, size_t chunk_size) except -1
cdef int arena_close(ArenaCore* core) except -1
cdef ArenaCore* arena_core(object arena) except NULL
cdef int arena_allocate(ArenaCore* core, size_t size, size_t align, bint zero,
                        void** out) noexcept nogil
cdef int arena_free(ArenaCore* core, void* ptr, size_t size) noexcept nogil
cdef int arena_reset(ArenaCore* core) noexcept nogil
cdef int arena_raise(int code) except -1
cdef Segment make_segment(ArenaBase arena, char* ptr, Py_ssize_t size)
cdef Py_ssize_t parse_size(object size, str name) except -1
cdef size_t parse_align(object align) except 0
cdef void region_free(void* ptr) noexcept nogil
