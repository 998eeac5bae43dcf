# A Ring's registered buffers (included by _ring.pyx, after the class): register_pool(),
# unregister_pool() and the requests through the registration (read_fixed, write_fixed).
#
# A registered BufferPool is pinned by a count in the pool (_registered()), which its close() and
# reset() check next to the exports; a fixed-buffer request also pins its Segment by an export, and
# the registration may not go while one is in flight (_table.fixed_in_flight).

cdef int _queue_fixed(Ring ring, object fd, object segment, object offset, object user_data,
                      bint reading) except -1:
    cdef uint64_t off = _offset(offset)
    if type(segment) is not Segment:
        raise TypeError(f"a fixed-buffer request takes a Segment of the registered BufferPool, "
                        f"not {type(segment).__name__}")
    cdef Segment seg = <Segment>segment
    cdef Request req
    _request_init(&req)
    _acquire(seg, &req.view, reading)  # pins it; ArenaClosedError for a dead segment
    req.nviews = 1
    req.fixed = True
    cdef int cfd = _request_fd(&req, fd)
    cdef Py_ssize_t index
    try:
        # After the acquisition, which may have run Python code: the ring and its registration as
        # they are now (a closed ring says so, not that it has no pool).
        _check_usable(ring)
        if ring._pool is None:
            raise ValueError("no BufferPool is registered with this Ring: register_pool() first")
        if seg._arena is not ring._pool:
            raise ValueError("the segment is not from the BufferPool registered with this Ring")
        index = ring._pool._index_of(seg)
    except BaseException:
        _request_release(&req)
        raise
    cdef io_uring_sqe* sqe = _begin(ring, &req)
    if reading:
        io_uring_prep_read_fixed(sqe, cfd, req.view.buf, _length(req.view.len), off, <int>index)
    else:
        io_uring_prep_write_fixed(sqe, cfd, req.view.buf, _length(req.view.len), off, <int>index)
    _commit(ring, sqe, &req, user_data)
    return 0


cdef int _register_pool(Ring ring, object pool) except -1:
    if type(pool) is not BufferPool:
        raise TypeError(f"register_pool() takes a BufferPool, not {type(pool).__name__}")
    cdef BufferPool bp = <BufferPool>pool
    _check_usable(ring)
    if ring._pool is not None:
        raise ValueError("a BufferPool is registered with this Ring already: unregister_pool() first")
    cdef Py_ssize_t n = bp._count
    cdef iovec* iov = <iovec*>PyMem_Malloc(<size_t>n * sizeof(iovec))
    if iov == NULL:
        raise MemoryError(f"cannot allocate {n} iovecs")
    cdef Py_ssize_t i
    cdef int ret
    try:
        bp._registered(1)  # the pool can no longer close: its region stays while registered
        for i in range(n):
            iov[i].iov_base = bp._base + <size_t>i * bp._stride
            iov[i].iov_len = <size_t>bp._buffer_size
        with nogil:
            ret = io_uring_register_buffers(&ring._ring, iov, <unsigned>n)
        if ret < 0:
            bp._registered(-1)
            raise OSError(-ret, f"io_uring_register_buffers: {os.strerror(-ret)}")
    finally:
        PyMem_Free(iov)
    ring._pool = bp
    return 0


cdef int _unregister_pool(Ring ring) except -1:
    _check_usable(ring)
    if ring._pool is None:
        return 0
    ring._busy = True
    try:
        _reap(ring)  # completed fixed requests do not hold the registration
    finally:
        ring._busy = False
    if ring._table.fixed_in_flight:
        raise BufferError(f"cannot unregister the BufferPool: {ring._table.fixed_in_flight} fixed-buffer "
                          "request(s) are in flight; wait() for them first")
    cdef int ret
    with nogil:
        ret = io_uring_unregister_buffers(&ring._ring)
    if ret < 0:
        raise OSError(-ret, f"io_uring_unregister_buffers: {os.strerror(-ret)}")
    cdef BufferPool pool = ring._pool
    ring._pool = None
    pool._registered(-1)
    return 0
