# Queueing a Ring's requests (included by _ring.pyx, after the class): the conversions, the buffer
# exports that pin a request's memory, a submission slot, and the requests on one buffer (read,
# write, recv, send) and on a vector of them (readv, writev).  The fixed-buffer requests are in
# _ring_fixed.pxi.
#
# Each request converts its arguments and acquires its buffers first (all that can run Python code),
# then _begin checks the ring and takes a slot, then the SQE is filled and the request filed with C
# only: nothing between the check and _commit can call back into Python.

cdef extern from "Python.h":
    int PyObject_AsFileDescriptor(object o) except -1

cdef extern from "<sys/socket.h>":
    int MSG_ZEROCOPY

cdef Py_ssize_t MAX_IOVECS = 1024      # IOV_MAX: what readv(2) takes
cdef Py_ssize_t MAX_TRANSFER = 0x7ffff000  # MAX_RW_COUNT: what one read(2)/write(2) moves at most

# The exporter type of BufferPool.raw_views(): refused as a request's buffer (see _acquire).
cdef object RAW_VIEW = _PoolBufferView


cdef enum:  # the requests on one buffer (_queue_one)
    OP_READ
    OP_WRITE
    OP_RECV
    OP_SEND


cdef int _fd(object fd) except -1:
    """A file descriptor from an int or an object with fileno() (a socket, a file).  Read after
    every other conversion and acquisition of the request (see _request_fd): code they run could
    close the file, and the next file opened would get its number."""
    return PyObject_AsFileDescriptor(fd)


cdef int _request_fd(Request* req, object fd) except -1:
    """_fd(fd) for a request whose buffers are acquired, holding ``fd`` (see _hold_file) with them;
    on error the request's pins are let go.  The last step that can run Python code."""
    cdef int cfd
    try:
        cfd = _fd(fd)
    except BaseException:
        _request_release(req)
        raise
    _hold_file(req, fd)
    return cfd


cdef uint64_t _offset(object offset) except? 0xFFFFFFFFFFFFFFFE:
    """A file offset: >= 0, or -1 for the file's current position (as read(2) without an offset)."""
    # An int as it is (the common case: no new reference, C comparisons); anything else by __index__.
    cdef object index = offset if type(offset) is int else PyNumber_Index(offset)
    cdef int64_t value
    try:
        value = index
    except OverflowError:
        raise ValueError(f"offset {offset!r} is out of range") from None
    if value == -1:
        return <uint64_t>-1
    if value < 0:
        raise ValueError(f"offset must be >= 0 or -1 (the current position), not {offset!r}")
    return <uint64_t>value


cdef inline unsigned _length(Py_ssize_t n) noexcept:
    # One request moves at most MAX_RW_COUNT bytes, as one read(2) does: a larger buffer gets a short
    # transfer, which the result says.
    return <unsigned>(n if n < MAX_TRANSFER else MAX_TRANSFER)


cdef int _acquire(object buf, Py_buffer* view, bint writable) except -1:
    """A contiguous buffer export of ``buf``, held until the request's completion is reaped."""
    if not PyObject_CheckBuffer(buf):
        kind = "a writable bytes-like object" if writable else "a bytes-like object"
        raise TypeError(f"the buffer must be {kind} (Segment, bytearray, memoryview ...), "
                        f"not {type(buf).__name__}")
    try:
        PyObject_GetBuffer(buf, view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
    except BufferError:
        if writable and _read_only(buf):  # a wrong argument, not a pin
            raise TypeError(f"a read needs a writable buffer; {type(buf).__name__} is read-only") from None
        raise
    if exported_by(buffer_obj(view), <PyObject*>RAW_VIEW):
        # A raw view's export pins the pool's region, not its buffer: the pool may hand the buffer
        # to a new owner while the kernel still reads or writes it.
        PyBuffer_Release(view)
        raise TypeError("a raw view of a BufferPool buffer (BufferPool.raw_views(), or a memoryview or "
                        "slice of one) does not pin the buffer, which its pool may hand to a new owner "
                        "while the request is in flight: pass the acquired Segment instead")
    return 0


cdef bint _read_only(object buf):
    cdef Py_buffer probe
    try:
        PyObject_GetBuffer(buf, &probe, PyBUF_SIMPLE)
    except Exception:
        return False
    cdef bint readonly = probe.readonly
    PyBuffer_Release(&probe)
    return readonly


cdef int _submit_for_room(io_uring* ring, unsigned flags) noexcept nogil:
    """Submit the queue (to make room in it); io_uring_submit's result, or -errno.  With SQPOLL,
    where submitting only hands the entries to the kernel's polling thread, also wait until that
    thread has taken some: a full queue stays full until it does."""
    cdef int ret = io_uring_submit(ring)
    cdef int waited
    if ret >= 0 and flags & IORING_SETUP_SQPOLL:
        waited = io_uring_sqring_wait(ring)
        if waited == -EINVAL:  # a kernel before 5.10 cannot wait for room: let the thread run
            sched_yield()
        elif waited < 0:
            return waited
    return ret


cdef io_uring_sqe* _sqe(Ring ring) except NULL:
    """A free submission slot (the queue submitted first when it is full).  Only C below, apart
    from the submit with the GIL released (no other thread may use the ring meanwhile)."""
    cdef io_uring_sqe* sqe = io_uring_get_sqe(&ring._ring)
    cdef int ret
    while sqe == NULL:
        with nogil:
            ret = _submit_for_room(&ring._ring, ring._flags)
        if ret == -EINTR:
            continue
        if ret < 0:
            raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
        sqe = io_uring_get_sqe(&ring._ring)
        if sqe == NULL and ret == 0:
            raise OSError(EBUSY, "io_uring: the kernel took no request from a full submission queue")
    return sqe


cdef io_uring_sqe* _begin(Ring ring, Request* req) except NULL:
    """After the conversions and the buffer acquisitions: check the ring, then give a submission
    slot.  On error the request's pins are let go."""
    cdef RequestTable* t = &ring._table
    try:
        _check_usable(ring)
        if _table_in_flight(t) + t.ndone - t.ndone_buffers >= t.capacity:
            raise OSError(EBUSY, f"{t.capacity} requests are in flight or completed and not yet "
                          "returned by wait(), as many as the completion queue holds: wait() first")
        return _sqe(ring)
    except BaseException:
        _request_release(req)
        raise


cdef inline void _commit(Ring ring, io_uring_sqe* sqe, Request* req, object user_data) noexcept:
    """File the request and name its id in the SQE (C only: nothing can fail)."""
    io_uring_sqe_set_data64(sqe, _table_file(&ring._table, req, user_data))


cdef int _queue_nop(Ring ring, object user_data) except -1:
    cdef Request req
    _request_init(&req)
    cdef io_uring_sqe* sqe = _begin(ring, &req)
    io_uring_prep_nop(sqe)
    _commit(ring, sqe, &req, user_data)
    return 0


cdef int _queue_one(Ring ring, int op, object fd, object buf, object where, object user_data) except -1:
    """A request on one buffer: read or write at offset ``where``, recv or send with MSG_* flags
    ``where``.  Conversions and the buffer's export first, then the ring (see _begin)."""
    cdef uint64_t off = 0
    cdef int cflags = 0
    if op == OP_READ or op == OP_WRITE:
        off = _offset(where)
    else:
        cflags = where if type(where) is int else PyNumber_Index(where)  # (as socket.recv takes it)
        if op == OP_SEND and cflags & MSG_ZEROCOPY:
            raise ValueError(
                "send() refuses MSG_ZEROCOPY: the kernel reads the pages until the zerocopy "
                "notification arrives on the socket's error queue, after the send's completion, "
                "when the buffer may be someone else's (send without it copies)")
    cdef Request req
    _request_init(&req)
    _acquire(buf, &req.view, op == OP_READ or op == OP_RECV)
    req.nviews = 1
    cdef int cfd = _request_fd(&req, fd)
    cdef io_uring_sqe* sqe = _begin(ring, &req)
    cdef unsigned length = _length(req.view.len)
    if op == OP_READ:
        io_uring_prep_read(sqe, cfd, req.view.buf, length, off)
    elif op == OP_WRITE:
        io_uring_prep_write(sqe, cfd, req.view.buf, length, off)
    elif op == OP_RECV:
        io_uring_prep_recv(sqe, cfd, req.view.buf, length, cflags)
    else:
        io_uring_prep_send(sqe, cfd, req.view.buf, length, cflags)
    _commit(ring, sqe, &req, user_data)
    return 0


cdef int _queue_vector(Ring ring, object fd, object bufs, object offset, object user_data,
                       bint reading) except -1:
    """readv (``reading``) or writev: every buffer of ``bufs`` pinned by an export of its own."""
    cdef uint64_t off = _offset(offset)
    if PyObject_CheckBuffer(bufs):  # (a bytes-like object is a sequence of ints)
        raise TypeError(f"{'readv' if reading else 'writev'}() takes a sequence of buffers, not one "
                        f"{type(bufs).__name__}: pass [buffer]")
    # A copy: acquiring a buffer may run Python code, which must not change the list under us.
    cdef tuple items = tuple(bufs)
    cdef Py_ssize_t n = len(items)
    if n > MAX_IOVECS:
        raise ValueError(f"at most {MAX_IOVECS} buffers per request, not {n}")
    cdef Request req
    _request_init(&req)
    req.views = <Py_buffer*>PyMem_Malloc(max(n, 1) * sizeof(Py_buffer))
    req.iov = <iovec*>PyMem_Malloc(max(n, 1) * sizeof(iovec))
    if req.views == NULL or req.iov == NULL:
        _request_release(&req)
        raise MemoryError(f"cannot allocate the vector of {n} buffers")
    cdef Py_ssize_t i
    try:
        for i in range(n):
            _acquire(items[i], &req.views[i], reading)
            req.nviews = i + 1
            req.iov[i].iov_base = req.views[i].buf
            req.iov[i].iov_len = <size_t>req.views[i].len
    except BaseException:
        _request_release(&req)
        raise
    cdef int cfd = _request_fd(&req, fd)
    cdef io_uring_sqe* sqe = _begin(ring, &req)
    if reading:
        io_uring_prep_readv(sqe, cfd, req.iov, <unsigned>n, off)
    else:
        io_uring_prep_writev(sqe, cfd, req.iov, <unsigned>n, off)
    _commit(ring, sqe, &req, user_data)
    return 0
