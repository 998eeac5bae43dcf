# What a BufferPool call found, and the error that says so.  The pool's critical section holds C
# only, so a call carries the outcome out of it and raises here, after: making an exception runs
# Python code, which on a free-threaded build would suspend the section (another thread could act in
# the middle).

cdef enum:  # what BufferPool._take() and _give_back() found
    TAKEN
    RELEASED
    POOL_CLOSED
    POOL_EXHAUSTED
    SEG_RELEASED_ALREADY
    SEG_STALE
    SEG_EXPORTED
    SEG_NOT_IN_USE


cdef int raise_closed() except -1:
    raise ArenaClosedError("BufferPool is closed")


cdef int raise_outcome(BufferPool pool, int outcome, Py_ssize_t exports, Py_ssize_t index) except -1:
    """Raise what ``outcome`` (neither TAKEN nor RELEASED) found of buffer ``index``, with
    ``exports`` live exports of its segment."""
    if outcome == POOL_CLOSED:
        raise_closed()
    if outcome == POOL_EXHAUSTED:
        raise PoolExhaustedError(
            f"all {pool._count} buffers of {pool._buffer_size} bytes of the BufferPool are in use")
    if outcome == SEG_RELEASED_ALREADY:
        raise ArenaClosedError("the segment was already released")
    if outcome == SEG_STALE:
        raise ArenaClosedError("the segment is stale: the BufferPool was reset since it was acquired")
    if outcome == SEG_EXPORTED:
        raise BufferError(
            f"cannot release a buffer while {exports} buffer export(s) of it (memoryview, "
            "NumPy array, io_uring request in flight ...) are alive; release them first")
    raise ArenaError(f"internal error: buffer {index} of the BufferPool is not in use")


cdef int refuse_if_pinned(str context, Py_ssize_t exports, Py_ssize_t registrations) except -1:
    """BufferError for a close() or reset() while something holds the buffers."""
    if exports:
        raise BufferError(f"{context}: {exports} buffer export(s) of its segments (memoryview, "
                          "NumPy array, io_uring request in flight ...) are alive; release them first")
    if registrations:
        # The kernel holds the region's pages and writes to them for fixed-buffer requests.
        raise BufferError(f"{context}: its buffers are registered with or provided to {registrations} "
                          "io_uring Ring(s); unregister_pool() or withdraw() them, or close the ring, first")
    return 0
