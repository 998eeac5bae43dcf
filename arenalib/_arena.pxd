# cython: language_level=3
# The classes of arenalib._arena, and the functions arenalib's other modules (_pool) cimport.
# The C ABI that extensions compile in is arenalib/_capi.pxd; the public cimport surface is
# arenalib/__init__.pxd.

from libc.stdint cimport uint64_t

from arenalib._capi cimport ArenaCore, Books, Lifetime

cdef enum:
    # tracemalloc domain of the memory handed out through the Python API ("ARNA").
    TRACE_DOMAIN = 0x41524E41

cdef extern from "Python.h":
    # Both return -2 at once when tracemalloc is not tracing: the cost when it is off.
    int PyTraceMalloc_Track(unsigned int domain, size_t ptr, size_t size) noexcept
    int PyTraceMalloc_Untrack(unsigned int domain, size_t ptr) noexcept


cdef class SegmentOwner:
    cdef:
        Lifetime* _life         # what this owner's segments check (in its core, or its own)
        object __weakref__

    cdef bint _is_open(self) noexcept
    cdef int _free_segment(self, Segment seg) except -1


cdef class Segment:
    cdef:
        char* _ptr
        Py_ssize_t _size
        SegmentOwner _arena     # owns the memory (an arena or a BufferPool)
        Lifetime* _life         # _arena's Lifetime, kept here: one load less per check
        Segment _root           # the segment that owns the memory; None when this one does
        uint64_t _generation    # the owner's generation when allocated: stale after a reset/close
        Py_ssize_t _exports     # live buffer exports and pins; counted on the root only
        bint _freed

    cdef int _check(self) except -1
    cdef int _pin(self) except -1
    cdef void _unpin(self) noexcept
    cdef Segment _owner_segment(self)


cdef class ArenaBase(SegmentOwner):
    cdef:
        ArenaCore _core
        object _created_at      # creation stack in debug mode, else None
        set _traced             # addresses reported to tracemalloc and not yet untracked

    cdef int _open(self, int kind, object max_bytes, size_t chunk_size=*) except -1
    cdef Segment _allocate(self, Py_ssize_t size, bint zero, size_t align)
    cdef int _raise(self, int code, str context) except -1
    cdef int _close(self) except -1
    cdef int _check_usable(self) except -1
    cdef void _untrack_all(self) noexcept


cdef class Arena(ArenaBase):
    pass


cdef class ConfinedArena(ArenaBase):
    pass


cdef class SlicingArena(ArenaBase):
    pass


# -- for arenalib's other modules ----------------------------------------------------------------

cdef Segment make_segment(SegmentOwner arena, Py_ssize_t size)
cdef Py_ssize_t parse_size(object size, str name) except -1
cdef size_t parse_align(object align) except 0
cdef void* region_allocate(size_t size, size_t align, bint zero) noexcept nogil
cdef void region_free(void* ptr) noexcept nogil
cdef void count_open_pools(int delta) noexcept
