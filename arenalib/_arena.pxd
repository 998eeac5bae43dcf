# cython: language_level=3
# Declarations of arenalib's arena and segment classes, for other Cython modules of arenalib and for
# extensions that cimport arenalib (see arenalib/__init__.pxd).  No jemalloc type appears here.

from libc.stdint cimport uint64_t


cdef struct ArenaSlot:
    # One jemalloc explicit arena with the explicit thread cache that serves it; pooled across
    # arena objects because creating an arena costs ~50 us and destroying one leaks metadata.
    unsigned arena_index
    unsigned tcache_index
    size_t stale_bytes    # allocations left behind by closed arena objects, dropped by the next reset
    size_t churn_bytes    # bytes allocated since the last purge: what may sit dirty in the arena


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
        ArenaSlot _slot
        bint _has_slot          # False once closed: the slot went back to the pool
        int _mallocx_flags      # MALLOCX_ARENA | MALLOCX_TCACHE of the slot
        unsigned long _owner    # owning thread ident; 0 when any thread may use the arena
        uint64_t _generation    # bumped by reset() and close(): every older segment is dead
        Py_ssize_t _live_bytes
        Py_ssize_t _peak_bytes
        Py_ssize_t _live_segments
        Py_ssize_t _exports
        Py_ssize_t _max_bytes   # -1: no limit
        size_t _allocated_total
        object _created_at      # creation traceback in debug mode, else None
        object __weakref__

    cdef int _open(self, object max_bytes) except -1
    cdef int _check_usable(self) except -1
    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align)
    cdef int _free_segment(self, Segment seg) except -1
    cdef int _reserve(self, Py_ssize_t size) except -1
    cdef void _account(self, Py_ssize_t size) noexcept
    cdef int _close(self) except -1
    cdef int _refuse_if_exported(self, str action) except -1
    cdef void _release_memory(self) noexcept


cdef class Arena(ArenaBase):
    pass


cdef class ConfinedArena(ArenaBase):
    pass


cdef class SlicingArena(ArenaBase):
    cdef:
        Py_ssize_t _chunk_size
        char** _chunks
        size_t* _chunk_sizes
        size_t* _chunk_zero_from  # bytes of a chunk at or past this offset are known to be zero
        Py_ssize_t _nchunks
        Py_ssize_t _chunks_capacity
        Py_ssize_t _current       # chunk being carved
        size_t _offset            # next free byte in the current chunk
        size_t _chunk_bytes

    cdef int _next_chunk(self, size_t size, size_t align) except -1


cdef Segment make_segment(ArenaBase arena, char* ptr, Py_ssize_t size)
