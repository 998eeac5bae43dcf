# cython: language_level=3, boundscheck=False, wraparound=False
"""nogil io_uring loops over liburing, the C peers of arenalib.Ring in bench/uring.py.

They link the liburing that arenalib links (2.3, built from the same wrap and overlay:
bench/native/subprojects is a link to the project's subprojects/), statically, into this module.
Each loop sets up a ring of its own (untimed), times itself with CLOCK_MONOTONIC and returns the
nanoseconds of the timed part, so no Python call is measured.  The buffers are given as addresses
(the caller keeps them alive: a BufferPool's acquired segments, held until the call returns)."""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from arenalib._liburing cimport (
    IORING_CQE_BUFFER_SHIFT, IORING_CQE_F_BUFFER, IORING_CQE_F_MORE, IORING_SETUP_CQSIZE,
    IOSQE_BUFFER_SELECT, io_uring, io_uring_buf, io_uring_buf_reg, io_uring_buf_ring, io_uring_buf_ring_add,
    io_uring_buf_ring_advance, io_uring_buf_ring_init, io_uring_buf_ring_mask, io_uring_cq_advance,
    io_uring_cqe, io_uring_get_sqe, io_uring_params, io_uring_peek_batch_cqe, io_uring_prep_nop,
    io_uring_prep_read, io_uring_prep_read_fixed, io_uring_prep_recv_multishot, io_uring_queue_exit,
    io_uring_queue_init, io_uring_queue_init_params, io_uring_register_buf_ring, io_uring_register_buffers,
    io_uring_sqe, io_uring_sqe_set_data64, io_uring_submit_and_wait, iovec,
)

import os

cdef extern from *:
    """
    #include <time.h>
    static inline long long arenalib_uring_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    static inline long long arenalib_uring_thread_cpu(void) {
        struct timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    """
    long long now_ns "arenalib_uring_now"() noexcept nogil
    long long thread_cpu_ns "arenalib_uring_thread_cpu"() noexcept nogil


cdef int _setup(io_uring* ring, unsigned entries) except -1:
    cdef int ret = io_uring_queue_init(entries, ring, 0)
    if ret < 0:
        raise OSError(-ret, f"io_uring_queue_init: {os.strerror(-ret)}")
    return 0


cdef inline void _queue_read(io_uring* ring, bint fixed, int fd, iovec* iov, unsigned i, unsigned block,
                             uint64_t nth) noexcept nogil:
    """Queue the read of the file's block ``nth`` into buffer ``i`` (READ_FIXED when ``fixed``); the
    user data says both (nth << 16 | i)."""
    cdef io_uring_sqe* sqe = io_uring_get_sqe(ring)
    if fixed:
        io_uring_prep_read_fixed(sqe, fd, iov[i].iov_base, block, nth * block, <int>i)
    else:
        io_uring_prep_read(sqe, fd, iov[i].iov_base, block, nth * block)
    io_uring_sqe_set_data64(sqe, (nth << 16) | i)


def read_file(int fd, uint64_t size, unsigned block, list addresses, bint fixed):
    """Read ``size`` bytes of ``fd`` in ``block``-byte reads, len(addresses) of them in flight: buffer
    i (``addresses[i]``, ``block`` bytes) is read into, and read into again at the next offset as
    soon as its completion is reaped.  ``fixed``: the buffers are registered and read with
    READ_FIXED; else plain READ.  Returns the ns of the loop (registration untimed); OSError for a
    failed or short read."""
    cdef unsigned depth = len(addresses)
    cdef io_uring ring
    cdef iovec* iov = <iovec*>malloc(depth * sizeof(iovec))
    if iov == NULL:
        raise MemoryError()
    cdef unsigned i
    for i in range(depth):
        iov[i].iov_base = <void*><size_t>addresses[i]
        iov[i].iov_len = block
    cdef uint64_t nblocks = (size + block - 1) // block
    cdef uint64_t issued = 0, reaped = 0, offset
    cdef io_uring_cqe* cqe
    cdef unsigned want
    cdef int ret = 0, bad = 0
    cdef uint64_t bad_offset = 0
    cdef long long t0
    try:
        _setup(&ring, depth)
        try:
            if fixed:
                ret = io_uring_register_buffers(&ring, iov, depth)
                if ret < 0:
                    raise OSError(-ret, f"io_uring_register_buffers: {os.strerror(-ret)}")
            with nogil:
                t0 = now_ns()
                while issued < nblocks and issued < depth:
                    _queue_read(&ring, fixed, fd, iov, <unsigned>issued, block, issued)
                    issued += 1
                while reaped < issued:
                    ret = io_uring_submit_and_wait(&ring, 1)
                    if ret < 0 and ret != -4:  # -EINTR: again
                        break
                    ret = 0
                    while io_uring_peek_batch_cqe(&ring, &cqe, 1):
                        i = <unsigned>(cqe.user_data & 0xFFFF)
                        offset = (cqe.user_data >> 16) * block
                        want = <unsigned>(size - offset if size - offset < block else block)
                        if cqe.res != <int>want and not bad:
                            bad = cqe.res if cqe.res < 0 else -5  # -EIO for a short read
                            bad_offset = offset
                        io_uring_cq_advance(&ring, 1)
                        reaped += 1
                        if issued < nblocks and not bad:  # after a failure: drain, issue no more
                            _queue_read(&ring, fixed, fd, iov, i, block, issued)
                            issued += 1
                t0 = now_ns() - t0
            if ret < 0:
                raise OSError(-ret, f"io_uring_submit_and_wait: {os.strerror(-ret)}")
            if bad:
                raise OSError(-bad, f"read at offset {bad_offset}: {os.strerror(-bad)}")
        finally:
            io_uring_queue_exit(&ring)  # (unregisters the buffers too)
    finally:
        free(iov)
    return t0


def nop_loop(unsigned depth, Py_ssize_t batches):
    """``batches`` times: queue ``depth`` NOPs, submit them and wait for their ``depth`` completions
    (one io_uring_enter), reap them.  Returns the ns of the loop."""
    cdef io_uring ring
    cdef io_uring_sqe* sqe
    cdef io_uring_cqe* cqe
    cdef Py_ssize_t _b
    cdef unsigned i, got
    cdef int ret = 0
    cdef long long t0
    _setup(&ring, depth)
    try:
        with nogil:
            t0 = now_ns()
            for _b in range(batches):
                for i in range(depth):
                    sqe = io_uring_get_sqe(&ring)
                    io_uring_prep_nop(sqe)
                    io_uring_sqe_set_data64(sqe, i)
                ret = io_uring_submit_and_wait(&ring, depth)
                if ret < 0:
                    break
                got = 0
                while got < depth:
                    if io_uring_peek_batch_cqe(&ring, &cqe, 1):
                        io_uring_cq_advance(&ring, 1)
                        got += 1
            t0 = now_ns() - t0
        if ret < 0:
            raise OSError(-ret, f"io_uring_submit_and_wait: {os.strerror(-ret)}")
    finally:
        io_uring_queue_exit(&ring)
    return t0


cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void* buf, size_t n, int flags)
    int MSG_DONTWAIT

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    void* MAP_FAILED
    int PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS


cdef inline void _arm_multishot(io_uring* ring, int fd) noexcept nogil:
    cdef io_uring_sqe* sqe = io_uring_get_sqe(ring)
    io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0)
    sqe.flags |= IOSQE_BUFFER_SELECT
    sqe.buf_group = 0
    io_uring_sqe_set_data64(sqe, 1)


def recv_multishot_loop(int server_fd, int client_fd, list addresses, unsigned buf_len,
                        const unsigned char[::1] payload, Py_ssize_t rounds):
    """bench/bufring.py's C peer of a Ring's multishot receive: a ring of len(addresses) entries (a
    completion queue twice that), a provided-buffer ring (group 0) over the buffers at ``addresses``
    (``buf_len`` bytes each), one multishot receive on ``server_fd``.  ``rounds`` times: send
    ``payload`` on ``client_fd`` without blocking, as far as the socket takes it, and reap, putting
    each buffer back into the ring at once and re-arming the receive when it ends, until the payload
    has arrived.  Returns (ns, completions, cpu_ns) of the loop (cpu_ns: this thread's CPU time,
    CLOCK_THREAD_CPUTIME_ID, which the receives' kernel work run as task work counts in); OSError
    for a failed receive."""
    cdef unsigned n = len(addresses)
    cdef unsigned entries = 1
    while entries < n:
        entries *= 2
    cdef uint64_t* addr = <uint64_t*>malloc(n * sizeof(uint64_t))
    if addr == NULL:
        raise MemoryError()
    cdef unsigned i
    for i in range(n):
        addr[i] = <uint64_t><size_t>addresses[i]
    cdef io_uring ring
    cdef io_uring_params params
    memset(&params, 0, sizeof(params))
    params.flags = IORING_SETUP_CQSIZE
    params.cq_entries = 2 * n
    cdef size_t nbytes = (entries * sizeof(io_uring_buf) + 4095) & ~(<size_t>4095)
    cdef io_uring_buf_ring* br = NULL
    cdef io_uring_buf_reg reg
    cdef io_uring_cqe* cqe
    cdef const unsigned char* p = &payload[0]
    cdef size_t total = payload.shape[0], sent, got
    cdef ssize_t k
    cdef Py_ssize_t _r
    cdef long long t0, c0
    cdef long long completions = 0
    cdef int ret = 0, bad = 0
    cdef unsigned flags, bid
    cdef int mask = io_uring_buf_ring_mask(entries)
    ret = io_uring_queue_init_params(n, &ring, &params)
    if ret < 0:
        free(addr)
        raise OSError(-ret, f"io_uring_queue_init_params: {os.strerror(-ret)}")
    try:
        br = <io_uring_buf_ring*>mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                      -1, 0)
        if <void*>br == MAP_FAILED:
            raise MemoryError()
        io_uring_buf_ring_init(br)
        memset(&reg, 0, sizeof(reg))
        reg.ring_addr = <uint64_t><size_t>br
        reg.ring_entries = entries
        reg.bgid = 0
        ret = io_uring_register_buf_ring(&ring, &reg, 0)
        if ret < 0:
            raise OSError(-ret, f"io_uring_register_buf_ring: {os.strerror(-ret)}")
        for i in range(n):
            io_uring_buf_ring_add(br, <void*><size_t>addr[i], buf_len, <unsigned short>i, mask, <int>i)
        io_uring_buf_ring_advance(br, <int>n)
        with nogil:
            _arm_multishot(&ring, server_fd)
            c0 = thread_cpu_ns()
            t0 = now_ns()
            for _r in range(rounds):
                sent = 0
                got = 0
                while got < total and not bad:
                    if sent < total:
                        k = send(client_fd, p + sent, total - sent, MSG_DONTWAIT)
                        if k > 0:
                            sent += <size_t>k
                    ret = io_uring_submit_and_wait(&ring, 1 if sent >= total else 0)
                    if ret < 0 and ret != -4:
                        bad = ret
                        break
                    while io_uring_peek_batch_cqe(&ring, &cqe, 1):
                        flags = cqe.flags
                        completions += 1
                        if flags & IORING_CQE_F_BUFFER:
                            bid = flags >> IORING_CQE_BUFFER_SHIFT
                            got += <size_t>cqe.res
                            io_uring_buf_ring_add(br, <void*><size_t>addr[bid], buf_len, <unsigned short>bid,
                                                  mask, 0)
                            io_uring_buf_ring_advance(br, 1)
                        if not flags & IORING_CQE_F_MORE:
                            if cqe.res < 0 and cqe.res != -105:  # -ENOBUFS: re-armed below
                                bad = cqe.res
                            _arm_multishot(&ring, server_fd)
                        io_uring_cq_advance(&ring, 1)
            t0 = now_ns() - t0
            c0 = thread_cpu_ns() - c0
        if bad:
            raise OSError(-bad, f"multishot receive: {os.strerror(-bad)}")
    finally:
        io_uring_queue_exit(&ring)
        if br != NULL and <void*>br != MAP_FAILED:
            munmap(br, nbytes)
        free(addr)
    return t0, completions, c0
