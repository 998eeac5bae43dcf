# A Ring's provided buffers (included by _ring.pyx, after the class): provide(), withdraw(),
# recv_multishot(), and what a completion that carries a buffer becomes.
#
# provide(pool, group) lends every free buffer of a BufferPool to the kernel through a provided-buffer
# ring (IORING_REGISTER_PBUF_RING, Linux 5.19): a ring of (address, length, id) entries this process
# fills and publishes by its tail, from which the kernel picks a buffer per receive.  The buffer id is
# the pool's buffer index.  The pool's books mark the lent buffers (LENT: the kernel may write them,
# so nothing of Python can reach them), and the pool is pinned as a registration is (_registered:
# its close() and reset() refuse).
#
# A multishot receive's completion names the buffer the kernel filled; the reap binds the group's
# spare Segment to it (the pool marks it DELIVERED) over exactly the bytes received.  Releasing that
# Segment (free(), pool.release(), a deferred release when its last export goes) puts the buffer back
# into the ring through _provision_take, in the pool's critical section: the pushes of all threads
# are serialised there, and the kernel reads the entries only up to the tail they publish.  A
# released Segment stays dead (the pool marks it freed for good): the next completion over the same
# buffer gets a new Segment.
#
# withdraw() cancels the group's receives and reaps them to the end before the kernel forgets the
# ring and the pool takes its lent buffers back; close() does the same for every group once its
# cancel protocol has reaped every request.  In a fork child nothing of the kernel's is touched (the
# entries are not mapped there, MADV_DONTFORK): a release there gives the buffer to the child's pool.

from libc.stdlib cimport calloc, free

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int madvise(void* addr, size_t length, int advice)
    void* MAP_FAILED
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MADV_DONTFORK

cdef extern from "<unistd.h>" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE

cdef unsigned MAX_GROUP = 0xFFFF         # a buffer group id is 16 bits
# Newer than liburing 2.3's header (Linux 6.12): a ring whose buffers the kernel consumes in parts,
# and the completion flag that says the kernel will fill more of the buffer it names.
cdef unsigned short IOU_PBUF_RING_INC = 2
cdef unsigned IORING_CQE_F_BUF_MORE = 1 << 4
cdef Py_ssize_t MAX_PROVIDED = 32768     # entries of a provided-buffer ring, at most (and 16-bit ids)


def _kernel_version():
    """(major, minor) of the running kernel, from uname(2)'s release ("6.18.0-1-amd64")."""
    parts = os.uname().release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


_kernel = _kernel_version()


def _pretend_kernel(version):
    """Make provide() and recv_multishot() judge the kernel as ``version`` (a (major, minor) tuple;
    None: the real one): tests of the refusal an older kernel gets."""
    global _kernel
    _kernel = _kernel_version() if version is None else tuple(version)


cdef int _need_kernel(tuple version, str what) except -1:
    if _kernel < version:
        raise OSError(EOPNOTSUPP, f"{what} needs Linux {version[0]}.{version[1]} or later; this kernel is "
                      f"{_kernel[0]}.{_kernel[1]} (use recv() into buffers of your own)")
    return 0


cdef bint _provision_take(void* lender, Py_ssize_t index) noexcept nogil:
    """Put buffer ``index`` into the group's ring (the pool's callback, in its critical section);
    False in a fork child, where the ring is not mapped: the buffer goes to the pool's free list."""
    cdef Provision* p = <Provision*>lender
    if p.forks != ring_forks:
        return False
    io_uring_buf_ring_add(p.br, p.base + <size_t>index * p.stride, p.buffer_len, <unsigned short>index,
                          p.mask, 0)
    io_uring_buf_ring_advance(p.br, 1)  # a release store of the tail: the entry is whole before
    return True


cdef Provision* _find_provision(Ring ring, unsigned group) noexcept:
    cdef Provision* p = ring._provisions
    while p != NULL and p.group != group:
        p = <Provision*>p.next
    return p


cdef unsigned _group(object group) except? 0xFFFFFFFF:
    cdef object g = PyNumber_Index(group)
    if not 0 <= g <= MAX_GROUP:
        raise ValueError(f"group must be in 0..{MAX_GROUP}, not {group!r}")
    return <unsigned>g


cdef int _provision_spare(Provision* p) except -1:
    """Make the group's next Segment ahead (dead until _provision_deliver binds it): making it may run
    the collector, which must not happen between a CQE's look and its consumption."""
    cdef Segment seg = make_segment(<BufferPool>p.pool, 0)
    if p.spare == NULL:  # (the collector's finalizers cannot reach p: the ring is busy)
        Py_INCREF(seg)
        p.spare = <PyObject*>seg
    return 0


cdef object _provision_deliver(Provision* p, unsigned bid, int res, bint more):
    """The spare Segment bound to buffer ``bid`` over the ``res`` bytes the kernel wrote into it (C
    only: nothing can fail or call back; ``more``: an incremental ring's buffer the kernel fills
    more of); None when the pool did not lend that buffer."""
    cdef Segment seg = <Segment>p.spare
    Py_DECREF(seg)  # the reference p.spare owned is now seg's
    p.spare = NULL
    if not (<BufferPool>p.pool)._deliver(seg, bid, res if res > 0 else 0, more and p.incremental):
        return None
    return seg


cdef int _provide(Ring ring, object pool, object group, bint incremental) except -1:
    if type(pool) is not BufferPool:
        raise TypeError(f"provide() takes a BufferPool, not {type(pool).__name__}")
    cdef BufferPool bp = <BufferPool>pool
    cdef unsigned g = _group(group)
    _check_usable(ring)
    _need_kernel((5, 19), "Ring.provide() (a provided-buffer ring, IORING_REGISTER_PBUF_RING)")
    if incremental:
        _need_kernel((6, 12), "Ring.provide(incremental=True) (IOU_PBUF_RING_INC)")
    if _find_provision(ring, g) != NULL:
        raise ValueError(f"buffer group {g} is provided already: withdraw({g}) first")
    if bp._count > MAX_PROVIDED:
        raise ValueError(f"a provided-buffer ring holds at most {MAX_PROVIDED} buffers; the BufferPool "
                         f"has {bp._count}")
    if <size_t>bp._buffer_size > 0xFFFFFFFF:
        raise ValueError(f"a provided buffer is at most 4 GiB - 1 bytes; the BufferPool's are "
                         f"{bp._buffer_size}")
    cdef unsigned entries = 1
    while entries < <unsigned>bp._count:
        entries *= 2
    cdef size_t page = <size_t>sysconf(_SC_PAGESIZE)
    cdef size_t nbytes = (entries * sizeof(io_uring_buf) + page - 1) & ~(page - 1)
    cdef Provision* p = <Provision*>calloc(1, sizeof(Provision))
    if p == NULL:
        raise MemoryError("cannot allocate a provided-buffer group")
    # Page-aligned, as the kernel wants it, and not mapped in a fork child (whose pool must not
    # push into the parent's ring: _provision_take checks the fork count, this makes sure).
    cdef void* mem = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if mem == MAP_FAILED:
        free(p)
        raise MemoryError(f"cannot map a provided-buffer ring of {entries} entries")
    madvise(mem, nbytes, MADV_DONTFORK)
    p.br = <io_uring_buf_ring*>mem
    p.br_bytes = nbytes
    p.mask = io_uring_buf_ring_mask(entries)
    p.group = g
    p.forks = ring_forks
    p.base = bp._base
    p.stride = bp._stride
    p.buffer_len = <unsigned>bp._buffer_size
    p.incremental = incremental
    io_uring_buf_ring_init(p.br)
    cdef io_uring_buf_reg reg
    memset(&reg, 0, sizeof(reg))
    reg.ring_addr = <uint64_t><size_t>mem
    reg.ring_entries = entries
    reg.bgid = <unsigned short>g
    reg.pad = IOU_PBUF_RING_INC if incremental else 0  # the kernel's ``flags`` field
    cdef int ret = 0
    cdef bint pinned = False
    try:
        bp._registered(1)  # ArenaClosedError for a closed pool; from now on it cannot close
        pinned = True
        # The entries are written before the kernel knows the ring (it reads them up to the tail
        # only when it picks a buffer): what can fail, and raising, which may run the collector's
        # finalizers (one may close this ring), come before the kernel is touched, and nothing after.
        if bp._lend(p, _provision_take, incremental) == 0:
            bp._unlend(p)
            raise ValueError("the BufferPool has no free buffer to provide: release some first")
        ret = io_uring_register_buf_ring(&ring._ring, &reg, 0)
        if ret < 0:
            bp._unlend(p)
            raise OSError(-ret, f"io_uring_register(IORING_REGISTER_PBUF_RING): {os.strerror(-ret)}")
    except BaseException:
        if pinned:
            bp._registered(-1)
        munmap(mem, nbytes)
        free(p)
        raise
    Py_INCREF(bp)
    p.pool = <PyObject*>bp
    p.next = ring._provisions
    ring._provisions = p
    return 0


cdef int _withdraw(Ring ring, object group) except -1:
    cdef unsigned g = _group(group)
    _check_usable(ring)
    cdef Provision* p = _find_provision(ring, g)
    if p == NULL:
        raise ValueError(f"buffer group {g} is not provided by this Ring")
    _cancel_group(ring, p)
    cdef int ret = io_uring_unregister_buf_ring(&ring._ring, <int>g)
    if ret < 0:
        raise OSError(-ret, f"io_uring_register(IORING_UNREGISTER_PBUF_RING): {os.strerror(-ret)}")
    _provision_unlink(ring, p)
    _provision_end(p, True)
    return 0


cdef int _cancel_group(Ring ring, Provision* p) except -1:
    """Cancel the group's receives and reap until none is left (their completions, and the buffers
    they carry, stay for wait()).  OSError, the group unchanged, if the kernel will not end them."""
    cdef RequestTable* t = &ring._table
    cdef unsigned i
    cdef int ret, rounds = 0
    cdef io_uring_sqe* sqe
    ring._busy = True
    try:
        while p.armed:
            rounds += 1
            if rounds > 10000:
                raise OSError(EBUSY, f"the kernel did not end the receives of buffer group {p.group}")
            if not ring._cancels:  # (again after a round: a cancel may find its request ending)
                for i in range(t.capacity):
                    if t.requests[i].user_data != NULL and t.requests[i].prov == p:
                        sqe = _sqe(ring)
                        io_uring_prep_cancel64(sqe, i, 0)
                        io_uring_sqe_set_data64(sqe, CANCEL_ID)
                        ring._cancels += 1
            _check_not_forked(ring)
            with nogil:
                ret = io_uring_submit_and_wait(&ring._ring, 1)
            if ret < 0 and ret != -EINTR:
                raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
            _reap(ring)
    finally:
        ring._busy = False
    return 0


cdef void _provision_unlink(Ring ring, Provision* p) noexcept:
    cdef Provision** link = &ring._provisions
    while link[0] != NULL and link[0] != p:
        link = <Provision**>&link[0].next
    if link[0] == p:
        link[0] = <Provision*>p.next


cdef void _provision_end(Provision* p, bint mapped) noexcept:
    """The kernel picks from the group no more: the pool takes its lent buffers back and is let go,
    the entries unmapped (``mapped``: not in a fork child, which has no mapping of them)."""
    cdef BufferPool pool = <BufferPool>p.pool
    Py_DECREF(pool)  # pool keeps it
    pool._unlend(p)
    pool._registered(-1)
    if mapped:
        munmap(p.br, p.br_bytes)
    cdef PyObject* spare = p.spare
    free(p)
    if spare != NULL:
        Py_DECREF(<object>spare)


cdef void _provisions_close(Ring ring, bint leaked) noexcept:
    """close()'s end of every group, after every request is reaped (or, ``leaked``, never will be:
    then the pools stay lent and pinned for good, as the requests' pins do)."""
    cdef Provision* p
    cdef bint forked = _forked(ring)
    while ring._provisions != NULL:
        p = ring._provisions
        ring._provisions = <Provision*>p.next
        if leaked:
            continue
        if not forked:
            io_uring_unregister_buf_ring(&ring._ring, <int>p.group)
        _provision_end(p, not forked)


cdef void _free_unreturned(Ring ring) noexcept:
    """close(): the Segments of completions never returned by wait() are released (back to their
    group, which close() then ends) rather than dropped with their buffers still out."""
    cdef RequestTable* t = &ring._table
    cdef unsigned i
    cdef Segment seg
    for i in range(t.ndone if t.done != NULL else 0):
        if t.done[i].segment != NULL:
            seg = <Segment>t.done[i].segment
            try:
                seg._arena._free_segment(seg)
            except BaseException:
                pass


cdef int _queue_recv_multishot(Ring ring, object sock, object group, object user_data) except -1:
    cdef unsigned g = _group(group)
    cdef int cfd = _fd(sock)  # after the group's conversion (see _fd), before the provision's lookup
    _need_kernel((6, 0), "Ring.recv_multishot() (multishot receive)")
    _check_usable(ring)
    cdef Provision* p = _find_provision(ring, g)
    if p == NULL:
        raise ValueError(f"buffer group {g} is not provided by this Ring: provide(pool, {g}) first")
    cdef Request req
    _request_init(&req)
    req.prov = p
    _hold_file(&req, sock)
    cdef io_uring_sqe* sqe = _begin(ring, &req)
    io_uring_prep_recv_multishot(sqe, cfd, NULL, 0, 0)
    sqe.flags |= IOSQE_BUFFER_SELECT
    sqe.buf_group = <unsigned short>g
    p.armed += 1
    _commit(ring, sqe, &req, user_data)
    return 0


cdef int _provisions_traverse(Ring ring, visitproc visit, void* arg) noexcept:
    cdef Provision* p = ring._provisions
    cdef int ret
    while p != NULL:
        ret = visit(p.pool, arg)
        if ret:
            return ret
        if p.spare != NULL:
            ret = visit(p.spare, arg)
            if ret:
                return ret
        p = <Provision*>p.next
    return 0
