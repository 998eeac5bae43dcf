# cython: language_level=3, boundscheck=False, wraparound=False
"""nogil io_uring loops over liburing, the C peers of arenalib.Ring in bench/uring.py.

They link the liburing that arenalib links (2.3, built from the same wrap and overlay:
bench/native/subprojects is a link to the project's subprojects/), statically, into this module.
Each loop sets up a ring of its own (untimed), times itself with CLOCK_MONOTONIC and returns the
nanoseconds of the timed part, so no Python call is measured.  The buffers are given as addresses
(the caller keeps them alive: a BufferPool's acquired segments, held until the call returns)."""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc

from arenalib._liburing cimport (
    io_uring, io_uring_cq_advance, io_uring_cqe, io_uring_get_sqe, io_uring_peek_batch_cqe,
    io_uring_prep_nop, io_uring_prep_read, io_uring_prep_read_fixed, io_uring_queue_exit,
    io_uring_queue_init, io_uring_register_buffers, io_uring_sqe, io_uring_sqe_set_data64,
    io_uring_submit_and_wait, iovec,
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
    """
    long long now_ns "arenalib_uring_now"() noexcept nogil


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
