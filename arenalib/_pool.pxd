# cython: language_level=3
# BufferPool, for arenalib's other Cython modules and for extensions that cimport it.

from arenalib._arena cimport Segment, SegmentOwner
from arenalib._abi cimport Lifetime


cdef class _Region:
    cdef void* ptr                  # freed when the last holder (pool or raw view) lets go

    @staticmethod
    cdef _Region allocate(size_t size, size_t align, bint zero)


# A buffer a ring lends incrementally (IOU_PBUF_RING_INC): the kernel fills it in parts, one
# completion each, so several segments may lie over it (_pool_buffers.pxi).
cdef struct PartUse:
    Py_ssize_t consumed         # bytes the kernel has filled and handed out, from the buffer's start
    Py_ssize_t segments         # delivered segments over it not yet released
    bint done                   # the kernel is done with it (its last part had no IORING_CQE_F_BUF_MORE)


# Which of a pool's buffers are free and what each free one holds (_pool_buffers.pxi); read and
# written in the pool's critical section only.
cdef struct PoolBooks:
    Py_ssize_t* free_stack      # indices of the released buffers; the top is taken next
    Py_ssize_t nstack           # entries on the free stack
    Py_ssize_t next_fresh       # every buffer from here up is free (taken in order once the stack
    #                             is empty; 0 after a reset)
    Py_ssize_t touched          # buffers ever handed out: state is written below this only
    unsigned char* state        # per buffer: free and zero, in use, or free and dirty
    unsigned char fresh_state   # the state of a buffer never handed out (zero or dirty)
    Py_ssize_t in_use
    Py_ssize_t high_water
    Py_ssize_t exhausted
    size_t acquisitions
    Py_ssize_t lent             # buffers lent to a ring: in its provided-buffer ring, or delivered
    PartUse* parts              # per buffer, once a lending was incremental (else NULL)


# A provided-buffer ring a pool's buffers are lent to (arenalib._ring's, Ring.provide()): ``take``
# puts buffer ``index`` back into it and says True, or False when it cannot (a fork child: the ring's
# memory is not mapped there), so the buffer goes to the pool's free list.  Called in the pool's
# critical section, C only.
ctypedef bint (*lender_take_fn)(void* lender, Py_ssize_t index) noexcept nogil


cdef class BufferPool(SegmentOwner):
    cdef:
        Lifetime _lifetime          # what its segments check (SegmentOwner._life points here)
        bint _open
        bint _traced                # the region is reported to tracemalloc
        _Region _region
        char* _base                 # the region: one jemalloc block of _stride * _count bytes
        size_t _stride              # distance between buffers: _buffer_size rounded up to _align
        size_t _align
        Py_ssize_t _buffer_size
        Py_ssize_t _count
        bint _zero
        PoolBooks _books
        Py_ssize_t _registrations   # io_uring rings that registered or lent the region (arenalib._ring)
        void* _lender               # the provided-buffer ring the free buffers are lent to, or NULL
        lender_take_fn _lender_take

    cdef Segment _acquire(self, bint raise_exhausted)
    cdef int _take(self, Segment seg) noexcept
    cdef int _check_releasable(self, Segment seg) except -1
    cdef int _release(self, Segment seg) except -1
    cdef int _give_back(self, Segment seg, Py_ssize_t i, Py_ssize_t* exports) noexcept
    cdef Py_ssize_t _index_of(self, Segment seg) except -1
    cdef int _check_open(self) except -1
    cdef void _close_now(self) noexcept
    cdef int _registered(self, int delta) except -1
    cdef Py_ssize_t _lend(self, void* lender, lender_take_fn take, bint incremental) except -1
    cdef Py_ssize_t _unlend(self, void* lender) noexcept
    cdef bint _deliver(self, Segment seg, Py_ssize_t index, Py_ssize_t nbytes, bint more) noexcept
