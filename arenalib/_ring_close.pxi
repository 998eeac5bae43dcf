# Closing a Ring (included by _ring.pyx, after the class): close()'s cancel protocol, shared with the
# collector's close of an unclosed ring (__dealloc__, and _ring_gc.pxi for a ring in a cycle).
#
# No pin is released before the kernel has said that its request ended.  Queued, unsubmitted SQEs are
# rewritten as NOPs; the requests in flight get one IORING_OP_ASYNC_CANCEL with CANCEL_ANY | CANCEL_ALL,
# or, on a kernel before 5.19 (which answers that with -EINVAL), a cancel each by its id; close()
# blocks for a completion only once every request has its cancel (a request without one may never
# complete).  If the kernel keeps failing to answer, the pins are leaked on purpose.

cdef extern from "<unistd.h>" nogil:
    int c_close "close"(int fd)

cdef uint64_t CANCEL_ID = 0xFFFFFFFFFFFFFFFF  # the user_data of the ring's own cancel requests

# Tests set it (_use_per_request_cancel) to run close()'s fallback for kernels before 5.19 here.
cdef bint per_request_cancel = False


def _use_per_request_cancel(bint on):
    """Make close() cancel request by request, as it does on a kernel without CANCEL_ANY (tests)."""
    global per_request_cancel
    per_request_cancel = on


cdef void _shutdown(Ring ring) noexcept:
    """Close: cancel, reap every completion, and only then release the pins (or, in a fork child,
    where the kernel writes nothing for these requests, release them at once).  A fork made by
    Python code the cancels' reaps ran (a finalizer) makes the child's close a fork child's."""
    cdef BufferPool pool
    cdef bint leaked = False
    ring._busy = True
    ring._closing = True
    if not _forked(ring):
        if not _cancel_all(ring) and not _forked(ring):
            # The kernel would not say when the requests end: their memory stays pinned for good
            # (a leak, never a write into memory someone else owns).
            _table_leak(&ring._table)
            leaked = True
    # The provided buffers: those of completions never returned go back, then every group ends
    # (the kernel has no request left that could pick one).
    _free_unreturned(ring)
    _provisions_close(ring, leaked)
    # Checked again: the reaps ran finalizers, and a fork child has no mapping of the queues.
    if not _forked(ring):
        if ring._pool is not None:
            io_uring_unregister_buffers(&ring._ring)
        io_uring_queue_exit(&ring._ring)
    else:
        # The child has the descriptor but not the mapping (MADV_DONTFORK): unmapping what may
        # be other memory by now would be wrong, closing the descriptor is all.
        c_close(ring._ring.ring_fd)
    ring._open = False
    _table_clear(&ring._table)
    if ring._pool is not None:
        pool = ring._pool
        ring._pool = None
        pool._registered(-1)
    ring._closing = False
    ring._busy = False


cdef bint _cancel_all(Ring ring) noexcept:
    """Drop the queued requests, cancel those in flight, and reap until none is left; False if
    the kernel keeps failing to say (the pins must then stay), or at once in a fork child made by
    a finalizer a reap ran (the caller checks _forked())."""
    cdef io_uring* uring = &ring._ring
    cdef RequestTable* t = &ring._table
    cdef unsigned head = uring.sq.sqe_head
    cdef io_uring_sqe* sqe
    cdef uint64_t rid
    cdef int ret
    cdef bint sent_any = False
    # A kernel older than 5.19 knows no CANCEL_ANY (EINVAL): one cancel per request, by its id.
    cdef bint per_request = per_request_cancel
    cdef int failures = 0
    # Queued, not submitted: turned into NOPs, which complete at once and touch no memory.
    while head != uring.sq.sqe_tail:
        sqe = &uring.sq.sqes[head & uring.sq.ring_mask]
        rid = sqe.user_data
        io_uring_prep_nop(sqe)
        io_uring_sqe_set_data64(sqe, rid)
        head += 1
    cdef unsigned unsent, unsent_before = 0
    cdef int stalls = 0                # rounds in a row that left requests without a cancel
    while _table_in_flight(t):
        if per_request:
            unsent = _cancel_each(ring)
        else:
            if not sent_any:
                sqe = _sqe_or_null(ring)
                if sqe != NULL:
                    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ALL | IORING_ASYNC_CANCEL_ANY)
                    io_uring_sqe_set_data64(sqe, CANCEL_ID)
                    ring._cancels += 1
                    sent_any = True
            unsent = 0 if sent_any else _table_in_flight(t)
        # Block for a completion only once every request has its cancel: a request without one
        # may never complete (a read from a silent pipe).  Else submit, reap, and try again.
        with nogil:
            ret = io_uring_submit_and_wait(uring, 0 if unsent else 1)
            if unsent:
                sched_yield()
        if ret < 0 and ret != -EINTR:
            failures += 1
            if failures > 1000:
                return False
        if unsent and unsent >= unsent_before:
            stalls += 1
            if stalls > 100000:
                return False  # the kernel takes no cancel: the pins stay (see _shutdown)
        else:
            stalls = 0        # progress: a cancel went out
        unsent_before = unsent
        try:
            _reap(ring)
        except BaseException:  # a MemoryError (nothing is lost by it), or the fork check
            pass
        if _forked(ring):      # a finalizer run by the reap forked: the queues are not ours
            return False
        if sent_any and not ring._cancels and ring._cancel_result == -EINVAL:
            per_request = True
            sent_any = False
    while ring._cancels:  # the cancel requests' own completions
        with nogil:
            ret = io_uring_submit_and_wait(uring, 1)
        if ret < 0 and ret != -EINTR:
            failures += 1
            if failures > 1000:
                break  # they pin nothing
        try:
            _reap(ring)
        except BaseException:
            pass
        if _forked(ring):
            return False
    return True


cdef unsigned _cancel_each(Ring ring) noexcept:
    """Queue a cancel for every request in flight that has none yet, as far as the submission
    queue takes them; how many are left without one (for the next call)."""
    cdef RequestTable* t = &ring._table
    cdef unsigned i, unsent = 0
    cdef io_uring_sqe* sqe
    for i in range(t.capacity):
        if t.requests[i].user_data != NULL and not t.requests[i].cancelling:
            sqe = _sqe_or_null(ring) if not unsent else NULL
            if sqe == NULL:
                unsent += 1
                continue
            io_uring_prep_cancel64(sqe, i, 0)
            io_uring_sqe_set_data64(sqe, CANCEL_ID)
            t.requests[i].cancelling = True
            ring._cancels += 1
    return unsent


cdef io_uring_sqe* _sqe_or_null(Ring ring) noexcept:
    """A submission slot for close's cancels (the queue submitted first when full), or NULL."""
    cdef io_uring_sqe* sqe = io_uring_get_sqe(&ring._ring)
    if sqe == NULL:
        with nogil:
            _submit_for_room(&ring._ring, ring._flags)
        sqe = io_uring_get_sqe(&ring._ring)
    return sqe


cdef void _close_unclosed(Ring ring) noexcept:
    """Close a ring found open by the collector (__dealloc__, or _ring_finalize for a ring in a
    garbage cycle), with a ResourceWarning."""
    message = f"unclosed {ring!r}"
    _shutdown(ring)
    if warnings is not None:  # None while the interpreter is tearing modules down
        warnings.warn(message, ResourceWarning, stacklevel=2)
