# Submitting a Ring's queue and reaping its completions (included by _ring.pyx, after the class):
# submit(), wait() and the reap they and close() share.
#
# A reap releases pins, which may run finalizers, so it runs with the ring's _busy set (a call into
# the ring from such a finalizer raises RuntimeError), and it checks the fork count before each look
# at the completion queue: a finalizer may have forked, and a fork child has no mapping of it.

cdef int _submit(Ring ring) except -1:
    _check_usable(ring)
    cdef int ret
    while True:
        with nogil:
            ret = io_uring_submit(&ring._ring)
        if ret != -EINTR:
            break
    if ret < 0:
        raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
    return ret


cdef list _wait(Ring ring, object n):
    cdef Py_ssize_t want = n
    _check_usable(ring)
    cdef RequestTable* t = &ring._table
    if want < 0:
        raise ValueError(f"n must be >= 0, not {n!r}")
    if <size_t>want > _table_in_flight(t) + t.ndone:
        raise ValueError(f"cannot wait for {want} completions: {_table_in_flight(t)} requests are in "
                         f"flight and {t.ndone} completed")
    cdef int ret
    cdef unsigned need
    ring._busy = True
    try:
        _reap(ring)
        while True:
            need = <unsigned>(want - t.ndone) if <size_t>want > t.ndone else 0
            if need == 0 and ring._ring.sq.sqe_head == ring._ring.sq.sqe_tail:
                break  # enough completions, and nothing queued
            # The releases of the last reap and the signal handlers of the last round ran Python
            # code, which may have forked.
            _check_not_forked(ring)
            with nogil:
                ret = io_uring_submit_and_wait(&ring._ring, need)
            if ret < 0 and ret != -EINTR:
                raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
            _reap(ring)
            # A signal may have cut the wait short even when the call reports what it submitted
            # (and not -EINTR): its handler runs now; an exception from it leaves the reaped
            # completions for the next wait().
            PyErr_CheckSignals()
        return _table_take_done(t)
    finally:
        ring._busy = False


cdef int _reap(Ring ring) except -1:
    """Move every completion in the CQ into the table's done list, releasing its request's pins (the
    caller sets _busy: the releases may run Python code).  RuntimeError in a fork child (a release's
    finalizer may have forked: the CQ is not mapped there).

    A completion that carries a provided buffer gets the Segment its group made ready (the group's
    spare, made here before the CQE is consumed: making it may run the collector, so the CQ is looked
    at again afterwards).  MemoryError leaves the completion in the CQ for the next reap."""
    cdef io_uring_cqe* cqe
    cdef uint64_t rid
    cdef int res
    cdef unsigned flags
    cdef RequestTable* t = &ring._table
    cdef Provision* prov
    cdef object segment
    cdef bint keep = not ring._closing  # close() drops what it reaps, and makes no segments
    while True:
        _check_not_forked(ring)  # before each look at the CQ: the last release ran Python code
        if not io_uring_peek_batch_cqe(&ring._ring, &cqe, 1):
            break
        rid = cqe.user_data
        res = cqe.res
        flags = cqe.flags
        if rid == CANCEL_ID:
            io_uring_cq_advance(&ring._ring, 1)
            ring._cancels -= 1
            ring._cancel_result = res
            continue
        if rid >= t.capacity or t.requests[rid].user_data == NULL:
            io_uring_cq_advance(&ring._ring, 1)  # not a request of this ring's (cannot happen)
            continue
        if keep and not _table_done_room(t):
            raise MemoryError("cannot grow the Ring's list of completions; they stay queued")
        prov = t.requests[rid].prov
        segment = None
        if keep and prov != NULL and flags & IORING_CQE_F_BUFFER:
            if prov.spare == NULL:
                _provision_spare(prov)  # may run Python code: look at the CQ again
                continue
            segment = _provision_deliver(prov, flags >> IORING_CQE_BUFFER_SHIFT, res,
                                         flags & IORING_CQE_F_BUF_MORE)
        io_uring_cq_advance(&ring._ring, 1)
        _table_complete(t, rid, res, segment, prov != NULL and flags & IORING_CQE_F_MORE, keep)
    return 0
