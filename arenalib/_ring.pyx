# cython: language_level=3
"""Ring: an io_uring instance of arenalib's own, over liburing (built from its release source and
linked privately into this extension), whose requests pin the memory they target.

THE PROMISE: the kernel never writes into memory that someone else now owns.  Each request acquires a
buffer export (PyObject_GetBuffer) of every buffer it names and keeps it, with a strong reference,
until its completion is reaped by wait() or close().  A Segment with a live export refuses free(),
release to its pool, its arena's reset() and close() with BufferError and changes nothing; a
bytearray refuses to resize, an mmap to close.  Registering a BufferPool counts as a pin of the pool:
its close() and reset() raise BufferError until unregister_pool() or close().  So does lending its
buffers to the kernel (provide(): a provided-buffer ring, _ring_provide.pxi), until withdraw() or
close(); a lent buffer is out of the pool's hands, and a Segment exists over it only once the kernel
has filled it and a completion handed it over (recv_multishot()); releasing that Segment puts the
buffer back into the kernel's ring.

Each method converts its arguments and acquires the buffers first (all that can run Python code),
then checks the ring, then fills the submission queue with C only ("convert, then check, then
touch": nothing between the check and the queue can call back into Python).  Completions are matched
to requests by an id of the ring's own in the CQE's user_data (an index into the request table); the
caller's user_data is kept in the table and handed back as given.  At most cq_entries requests are in
flight or reaped-and-not-returned at once, so the completion queue (twice the submission queue) can
never overflow and no completion is lost.

Sections that run Python code while the ring's state is half updated (releasing pins, which may run
finalizers) set _busy: a call into the ring from there raises RuntimeError instead of seeing it.  Python
code may also fork: after every place that runs it (a release, a signal handler) the fork count is
checked again before the ring's queues are touched, since a fork child has no mapping of them.

The request table's Python objects (user_data, the buffers' exporters, the completions not yet
returned) are visited by the garbage collector (_ring_traverse), and a ring found in a garbage cycle
is closed as an unclosed ring is when it is collected (_ring_finalize, before anything of the cycle
is cleared): cancel, reap, unpin, and a ResourceWarning.

The class and its docstrings are here; each method's work is a C function of the topic's file:
_ring_table.pxi (the request table), _ring_check.pxi (the checks every call makes), _ring_submit.pxi
(queueing: conversions, pins, the requests on one buffer and on a vector), _ring_fixed.pxi (registered
buffers and their requests), _ring_provide.pxi (provided buffers, multishot receive), _ring_wait.pxi
(submit, wait, reap), _ring_close.pxi (close's cancel protocol), _ring_gc.pxi (the collector's view);
the C that Cython has no words for is src/ring.h.
"""

cimport cython
from cpython.buffer cimport (
    PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer,
)
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.number cimport PyNumber_Index
from cpython.ref cimport Py_DECREF, Py_INCREF, Py_XDECREF, PyObject, PyTypeObject
from libc.errno cimport EBUSY, EINTR, EINVAL, EOPNOTSUPP
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset

from arenalib._arena cimport Segment, make_segment
from arenalib._abi cimport thread_ident
from arenalib._liburing cimport (
    IORING_ASYNC_CANCEL_ALL, IORING_ASYNC_CANCEL_ANY, IORING_CQE_BUFFER_SHIFT, IORING_CQE_F_BUFFER,
    IORING_CQE_F_MORE, IORING_SETUP_CLAMP, IOSQE_BUFFER_SELECT, io_uring_buf, io_uring_buf_reg,
    io_uring_buf_ring, io_uring_buf_ring_add, io_uring_buf_ring_advance, io_uring_buf_ring_init,
    io_uring_buf_ring_mask, io_uring_prep_recv_multishot, io_uring_register_buf_ring,
    io_uring_unregister_buf_ring, IORING_SETUP_COOP_TASKRUN,
    IORING_SETUP_CQSIZE, IORING_SETUP_IOPOLL, IORING_SETUP_SQPOLL, IORING_SETUP_SUBMIT_ALL,
    IORING_SETUP_TASKRUN_FLAG, io_uring, io_uring_cq_advance, io_uring_cqe, io_uring_free_probe,
    io_uring_get_probe_ring, io_uring_get_sqe, io_uring_opcode_supported, io_uring_params,
    io_uring_peek_batch_cqe, io_uring_prep_cancel64, io_uring_prep_nop, io_uring_prep_read,
    io_uring_prep_read_fixed, io_uring_prep_readv, io_uring_prep_recv, io_uring_prep_send,
    io_uring_prep_write, io_uring_prep_write_fixed, io_uring_prep_writev, io_uring_probe,
    io_uring_queue_exit, io_uring_queue_init_params, io_uring_register_buffers, io_uring_ring_dontfork,
    io_uring_sqe, io_uring_sqe_set_data64, io_uring_sqring_wait, io_uring_submit, io_uring_submit_and_wait,
    io_uring_unregister_buffers, iovec,
)
from arenalib._pool cimport BufferPool

import os
import warnings

from arenalib._errors import ArenaClosedError, WrongThreadError
from arenalib._pool import _PoolBufferView

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "Python.h":
    # The garbage collector's slots, declared here as C calls (cpython.object's carry except -1).
    ctypedef int (*visitproc)(PyObject*, void*) noexcept
    ctypedef int (*traverseproc)(PyObject*, visitproc, void*) noexcept
    ctypedef int (*inquiry)(PyObject*) noexcept
    ctypedef void (*destructor)(PyObject*) noexcept

cdef extern from "src/ring.h":
    bint exported_by "arenalib_ring_exported_by"(PyObject* obj, PyObject* raw) noexcept
    PyObject* buffer_obj "arenalib_ring_buffer_obj"(Py_buffer* view) noexcept
    ctypedef struct saved_exc "arenalib_ring_exc":
        pass
    void exc_save "arenalib_ring_exc_save"(saved_exc* e) noexcept
    void exc_restore "arenalib_ring_exc_restore"(saved_exc* e) noexcept
    void ring_set_gc "arenalib_ring_set_gc"(
        PyTypeObject* type, traverseproc traverse, inquiry clear, destructor finalize,
        traverseproc* base) noexcept
    unsigned long ring_forks "arenalib_ring_forks"
    int ring_atfork "arenalib_ring_atfork"() noexcept

# The setup flags a caller may add (module constants SETUP_*).  Left out: those that would break this
# class's rules (SINGLE_ISSUER and DEFER_TASKRUN refuse a close from the thread that collects the
# garbage; R_DISABLED, ATTACH_WQ, CQSIZE, SQE128/CQE32 are the ring's own business).
SETUP_IOPOLL = IORING_SETUP_IOPOLL
SETUP_SQPOLL = IORING_SETUP_SQPOLL
SETUP_CLAMP = IORING_SETUP_CLAMP
SETUP_SUBMIT_ALL = IORING_SETUP_SUBMIT_ALL
SETUP_COOP_TASKRUN = IORING_SETUP_COOP_TASKRUN
SETUP_TASKRUN_FLAG = IORING_SETUP_TASKRUN_FLAG
cdef unsigned ALLOWED_FLAGS = (IORING_SETUP_IOPOLL | IORING_SETUP_SQPOLL | IORING_SETUP_CLAMP
                               | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN
                               | IORING_SETUP_TASKRUN_FLAG)

cdef unsigned MAX_ENTRIES = 32768      # the kernel's IORING_MAX_ENTRIES

# Names of the opcodes and feature bits liburing 2.3's header knows (newer kernels may report more).
OPCODES = (
    "NOP", "READV", "WRITEV", "FSYNC", "READ_FIXED", "WRITE_FIXED", "POLL_ADD", "POLL_REMOVE",
    "SYNC_FILE_RANGE", "SENDMSG", "RECVMSG", "TIMEOUT", "TIMEOUT_REMOVE", "ACCEPT", "ASYNC_CANCEL",
    "LINK_TIMEOUT", "CONNECT", "FALLOCATE", "OPENAT", "CLOSE", "FILES_UPDATE", "STATX", "READ", "WRITE",
    "FADVISE", "MADVISE", "SEND", "RECV", "OPENAT2", "EPOLL_CTL", "SPLICE", "PROVIDE_BUFFERS",
    "REMOVE_BUFFERS", "TEE", "SHUTDOWN", "RENAMEAT", "UNLINKAT", "MKDIRAT", "SYMLINKAT", "LINKAT",
    "MSG_RING", "FSETXATTR", "SETXATTR", "FGETXATTR", "GETXATTR", "SOCKET", "URING_CMD", "SEND_ZC",
    "SENDMSG_ZC",
)
FEATURES = (
    "SINGLE_MMAP", "NODROP", "SUBMIT_STABLE", "RW_CUR_POS", "CUR_PERSONALITY", "FAST_POLL",
    "POLL_32BITS", "SQPOLL_NONFIXED", "EXT_ARG", "NATIVE_WORKERS", "RSRC_TAGS", "CQE_SKIP",
    "LINKED_FILE",
)
_SETUP_NAMES = {IORING_SETUP_IOPOLL: "IOPOLL", IORING_SETUP_SQPOLL: "SQPOLL", IORING_SETUP_CQSIZE: "CQSIZE",
                IORING_SETUP_CLAMP: "CLAMP", IORING_SETUP_SUBMIT_ALL: "SUBMIT_ALL",
                IORING_SETUP_COOP_TASKRUN: "COOP_TASKRUN", IORING_SETUP_TASKRUN_FLAG: "TASKRUN_FLAG"}


@cython.final
@cython.freelist(64)
@cython.no_gc  # holds a Segment (never part of a cycle) and ints
cdef class Received:
    """One completion of Ring.recv_multishot(), as wait() returns it: ``(user_data, Received)``.

    ``segment``: a live Segment of the provided BufferPool over exactly the ``result`` bytes received,
    in the buffer the kernel chose, or None (end of stream, an error).  Release it (``free()``,
    ``pool.release()``, or deferred while exports live) to give the buffer back to the ring.
    ``result``: the bytes received (> 0), 0 at the end of the stream, or -errno (-ENOBUFS: every
    buffer of the group was out).  ``more``: the receive is still armed; when False it has ended and
    another recv_multishot() re-arms it (after releasing segments, for -ENOBUFS)."""

    cdef object _segment
    cdef int _result
    cdef bint _more

    def __init__(self, *args, **kwargs):
        raise TypeError("Received is made by Ring.wait(), not constructed")

    @property
    def segment(self):
        """The Segment over the bytes received (release it to give the buffer back), or None."""
        return self._segment

    @property
    def result(self):
        """The bytes received (> 0), 0 at the end of the stream, or -errno."""
        return self._result

    @property
    def more(self):
        """Whether the receive is still armed (False: recv_multishot() again to re-arm it)."""
        return self._more

    def __repr__(self):
        return f"<arenalib.Received result={self._result} more={self._more} segment={self._segment!r}>"

    def __reduce__(self):
        raise TypeError("a Received holds a live Segment and cannot be pickled")


cdef Received _make_received(PyObject* segment, int result, bint more):
    cdef Received r = Received.__new__(Received)
    r._segment = <object>segment if segment != NULL else None
    r._result = result
    r._more = more
    return r


include "_ring_table.pxi"


def check(result):
    """A completion's result: returned when it is >= 0; -errno is raised as the matching OSError
    (FileNotFoundError for -ENOENT, BlockingIOError for -EAGAIN ...)."""
    if type(result) is not int:
        result = PyNumber_Index(result)  # (as os.strerror(): a float is a TypeError)
    cdef int res = result
    if res < 0:
        raise OSError(-res, os.strerror(-res))
    return result


@cython.final
@cython.no_gc_clear  # not Cython's clear (it would drop _pool, still counted): _ring_clear is installed
cdef class Ring:
    """Ring(entries=64, *, flags=0)\n--\n\nAn io_uring instance whose requests pin the memory they target
    until their completion is reaped.

    Ring(entries=64, *, flags=0): ``entries`` submission slots (1 to 32768; the kernel rounds up to a
    power of two), a completion queue twice as large; ``flags`` adds SETUP_* flags
    (arenalib.SETUP_SQPOLL ...).

    Requests (read, write, readv, writev, read_fixed, write_fixed, recv, send, nop) are queued, sent
    to the kernel by submit() or wait(), and complete as ``(user_data, result)`` pairs from wait()
    (recv_multishot()'s as ``(user_data, Received)``, into buffers lent by provide()):
    result is what the system call would return, or -errno (``check(result)`` raises it as OSError).
    While a request is in flight, each buffer it names is held by a buffer export, so a Segment's
    memory cannot be freed, released, reset or closed with its arena or pool (BufferError), nor a
    bytearray resized; a file or socket given for ``fd`` (an object with fileno()) is held too, so
    that its collection cannot close the fd under the request, and its number is read after every
    other argument.  The kernel gets the number when the request is submitted: a file closed before
    then leaves it to whatever is opened next, as os.read(fd) after a close would; close files after
    their requests complete.  A raw view of a BufferPool buffer
    (``pool.raw_views()``, or a memoryview or slice of one) pins no buffer and is refused with
    TypeError: pass the acquired Segment.  At
    most ``cq_entries`` requests may be in flight and not yet returned by wait(): one more raises
    OSError(EBUSY) (the completion queue never overflows).  ``user_data`` may be any object: the
    ring holds it until wait() returns it or close() drops it, in the garbage collector's sight: a
    reference cycle through the ring (a user_data or a buffer that refers to it) is collected as an
    unclosed ring is.

    One thread owns a ring: its creator.  Any use from another thread raises WrongThreadError.  A
    fork child cannot use its parent's rings (their memory is not mapped in the child, and their
    requests are the parent's): every call raises RuntimeError except close(), which lets go of the
    child's copy of the pins and of the ring's descriptor.  A closed ring raises ArenaClosedError (a
    ValueError) from every call but close() (idempotent) and its properties.

    close() (or the end of a with-block) cancels every request in flight and waits for all their
    completions before releasing the pins; a ring garbage-collected while open (alone or in a
    reference cycle) does the same and emits ResourceWarning.  A fork child that goes on with a
    call of its parent's (a fork in a signal handler or finalizer run by wait(), close() or
    unregister_pool()) gets the same RuntimeError, or from close() the fork child's close.
    """

    cdef io_uring _ring
    cdef bint _open
    cdef bint _busy
    cdef unsigned long _owner
    cdef unsigned long _forks
    cdef unsigned _flags
    cdef unsigned _features
    cdef unsigned _sq_entries
    cdef RequestTable _table         # the requests in flight and the completions not returned
    cdef unsigned _cancels           # the ring's own cancel requests in flight
    cdef int _cancel_result
    cdef BufferPool _pool            # the registered pool, or None
    cdef Provision* _provisions      # the provided-buffer groups (_ring_provide.pxi), a list
    cdef bint _closing               # close() is reaping: completions are dropped, no segments made

    def __cinit__(self, entries=64, *, flags=0):
        self._owner = thread_ident()
        self._forks = ring_forks
        cdef object n = PyNumber_Index(entries)
        if not 1 <= n <= MAX_ENTRIES:
            raise ValueError(f"entries must be in 1..{MAX_ENTRIES}, not {entries!r}")
        cdef object f = PyNumber_Index(flags)
        if f < 0 or f & ~ALLOWED_FLAGS:
            raise ValueError(f"flags must be a combination of the SETUP_* constants, not {flags!r}")
        cdef io_uring_params params
        cdef unsigned want = <unsigned>f | IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL
        cdef int ret
        while True:
            memset(&params, 0, sizeof(params))
            params.flags = want
            params.cq_entries = 2 * <unsigned>n
            ret = io_uring_queue_init_params(<unsigned>n, &self._ring, &params)
            # SUBMIT_ALL (Linux 5.18) only spares a failed SQE's followers a second submit: do without
            # it on an older kernel, unless the caller asked for it.
            if ret == -EINVAL and want & IORING_SETUP_SUBMIT_ALL and not f & IORING_SETUP_SUBMIT_ALL:
                want &= ~IORING_SETUP_SUBMIT_ALL
                continue
            break
        if ret < 0:
            raise OSError(-ret, f"io_uring_setup: {os.strerror(-ret)}")
        # The ring's memory is not mapped in a fork child: the child cannot touch the parent's queues.
        io_uring_ring_dontfork(&self._ring)
        self._open = True
        self._flags = params.flags
        self._features = params.features
        self._sq_entries = params.sq_entries
        if not _table_alloc(&self._table, params.cq_entries):
            io_uring_queue_exit(&self._ring)
            self._open = False
            raise MemoryError(f"cannot allocate the request table of {params.cq_entries} entries")

    # -- queueing (_ring_submit.pxi, _ring_fixed.pxi) -----------------------------------------------

    def nop(self, *, user_data=0):
        """Queue a request that does nothing; it completes with result 0."""
        _queue_nop(self, user_data)

    def read(self, fd, buf, offset=-1, *, user_data=0):
        """Queue a read of up to len(buf) bytes from ``fd`` at ``offset`` (-1: the file position) into
        ``buf`` (a writable buffer: Segment, bytearray, memoryview ...), pinned until it completes;
        the result is the number of bytes read."""
        _queue_one(self, OP_READ, fd, buf, offset, user_data)

    def write(self, fd, buf, offset=-1, *, user_data=0):
        """Queue a write of ``buf`` (any bytes-like object, pinned until it completes) to ``fd`` at
        ``offset`` (-1: the file position); the result is the number of bytes written."""
        _queue_one(self, OP_WRITE, fd, buf, offset, user_data)

    def readv(self, fd, bufs, offset=-1, *, user_data=0):
        """Queue a vectored read (preadv(2)) into the writable buffers ``bufs`` (a sequence of at most
        1024), each pinned until it completes."""
        _queue_vector(self, fd, bufs, offset, user_data, True)

    def writev(self, fd, bufs, offset=-1, *, user_data=0):
        """Queue a vectored write (pwritev(2)) of the buffers ``bufs`` (a sequence of at most 1024),
        each pinned until it completes."""
        _queue_vector(self, fd, bufs, offset, user_data, False)

    def read_fixed(self, fd, segment, offset=-1, *, user_data=0):
        """Queue a read into ``segment``, a live Segment (or slice of one) of the registered pool,
        through the kernel's registration of its buffer (no page pinning per request)."""
        _queue_fixed(self, fd, segment, offset, user_data, True)

    def write_fixed(self, fd, segment, offset=-1, *, user_data=0):
        """Queue a write of ``segment``, a live Segment (or slice of one) of the registered pool,
        through the kernel's registration of its buffer."""
        _queue_fixed(self, fd, segment, offset, user_data, False)

    def recv(self, sock, buf, *, flags=0, user_data=0):
        """Queue a recv(2) from the socket ``sock`` (a socket or its descriptor) into the writable
        ``buf``, pinned until it completes; ``flags`` are recv(2)'s MSG_* flags."""
        _queue_one(self, OP_RECV, sock, buf, flags, user_data)

    def send(self, sock, buf, *, flags=0, user_data=0):
        """Queue a send(2) of ``buf`` on the socket ``sock``, pinned until it completes; ``flags``
        are send(2)'s MSG_* flags, except MSG_ZEROCOPY (ValueError, before anything is queued): with
        it the kernel goes on reading the pages after the completion, until a notification on the
        socket's error queue, which the pin does not wait for."""
        _queue_one(self, OP_SEND, sock, buf, flags, user_data)

    # -- submitting and reaping (_ring_wait.pxi) ----------------------------------------------------

    def submit(self):
        """Send the queued requests to the kernel (without the GIL); returns how many it took."""
        return _submit(self)

    def wait(self, n=1):
        """Submit what is queued, wait (without the GIL) until at least ``n`` completions are there,
        and return every completion reaped, as ``[(user_data, result), ...]``; wait(0) does not block.

        Each request's pins are released as its completion is reaped.  ValueError when ``n`` is more
        than the requests in flight and reaped could ever give (the wait would never end)."""
        return _wait(self, n)

    # -- registered buffers (_ring_fixed.pxi) -------------------------------------------------------

    def register_pool(self, pool):
        """Register every buffer of the BufferPool ``pool`` with the kernel (buffer i is fixed buffer
        i) for read_fixed/write_fixed.  While registered, the pool's close() and reset() raise
        BufferError.  One pool per ring."""
        _register_pool(self, pool)

    def unregister_pool(self):
        """Undo register_pool() (nothing when no pool is registered); the pool may close again.

        Raises BufferError, changing nothing, while a fixed-buffer request is in flight."""
        _unregister_pool(self)

    @property
    def pool(self):
        """The registered BufferPool, or None."""
        _check_thread(self)
        return self._pool

    # -- provided buffers and multishot receive (_ring_provide.pxi) ----------------------------------

    def provide(self, pool, group, *, incremental=False):
        """Lend every free buffer of the BufferPool ``pool`` to the kernel as buffer group ``group``
        (0..65535), a provided-buffer ring (Linux 5.19) that recv_multishot() receives into.

        Until withdraw(group) or close(), the pool's close() and reset() raise BufferError, and a
        buffer the kernel may write is out of the pool (acquire() cannot hand it out).  A pool lends
        to one group at a time.  incremental=True (Linux 6.12, IOU_PBUF_RING_INC): the kernel fills
        a buffer in parts, each completion a Segment over the next part of it; the buffer goes back
        once the kernel is done with it and all its parts are released.  OSError(EOPNOTSUPP) on an
        older kernel.

        The kernel takes a group's buffers in ring order, so every buffer lent cycles through the
        cache: lend what the data in flight needs, not more (bench/bufring.py: 64 KiB messages over
        16 connections ran ~10% faster from 16 buffers of 64 KiB than from 64)."""
        _provide(self, pool, group, incremental)

    def withdraw(self, group):
        """Undo provide(): cancel the group's receives and wait for their end (their completions stay
        for wait()), then give the buffers the kernel holds back to the pool; segments delivered
        and not yet released return to the pool's free list when released."""
        _withdraw(self, group)

    def recv_multishot(self, sock, group, user_data=None):
        """Arm a receive on the socket ``sock`` that goes on until it ends: each completion wait()
        returns is ``(user_data, Received)`` with a live Segment over the bytes received into a
        buffer of ``group``, and whether the receive is still armed (``more``).

        Re-arm it when a completion says ``more=False`` with a result other than 0 (the end of the
        stream) or a socket error: after -ENOBUFS (every buffer out: release some segments first),
        or when the kernel ended it (a full completion queue, -ECANCELED from withdraw()).  Linux 6.0
        or later (OSError(EOPNOTSUPP) before)."""
        _queue_recv_multishot(self, sock, group, user_data)

    # -- closing (_ring_close.pxi) ------------------------------------------------------------------

    def close(self):
        """Cancel every request in flight, wait for all their completions, release their pins and the
        pool's registration, and close the ring; idempotent.  Queued requests not yet submitted never
        reach the kernel; completions not yet returned by wait() are dropped."""
        if not self._open:
            return
        if not _owner_left_behind(self):  # (else the child's one thread closes it: no one else can)
            _check_thread(self)
            if self._busy:
                raise RuntimeError(BUSY.format("close"))
        _shutdown(self)

    def __dealloc__(self):
        if not self._open:
            _table_free(&self._table)
            return
        _close_unclosed(self)

    # -- figures ------------------------------------------------------------------------------------

    @property
    def closed(self):
        """True once close() was called (or the with-block ended)."""
        return not self._open

    @property
    def sq_entries(self):
        """Slots of the submission queue."""
        return self._sq_entries

    @property
    def cq_entries(self):
        """Slots of the completion queue: also the most requests in flight and not returned at once."""
        return self._table.capacity

    @property
    def in_flight(self):
        """Requests queued or in the kernel whose completions are not reaped yet."""
        _check_thread(self)
        return _table_in_flight(&self._table) if self._open else 0

    def features(self):
        """What the kernel offers this ring: ``{"features": [IORING_FEAT_* names], "opcodes":
        [supported IORING_OP_* names], "setup_flags": [the ring's IORING_SETUP_* names], "sq_entries",
        "cq_entries"}`` (names without their prefix; bits and opcodes newer than liburing 2.3's header
        are given as "bit N" and "op N")."""
        _check_usable(self)
        cdef io_uring_probe* probe = io_uring_get_probe_ring(&self._ring)
        cdef list opcodes = []
        cdef int op
        if probe != NULL:
            try:
                for op in range(probe.ops_len):
                    if io_uring_opcode_supported(probe, op):
                        opcodes.append(OPCODES[op] if op < len(OPCODES) else f"op {op}")
            finally:
                io_uring_free_probe(probe)
        cdef int bit
        features = [FEATURES[bit] if bit < len(FEATURES) else f"bit {bit}"
                    for bit in range(32) if self._features & (<unsigned>1 << bit)]
        setup = [name for flag, name in _SETUP_NAMES.items() if self._flags & flag]
        return {"features": features, "opcodes": opcodes, "setup_flags": setup,
                "sq_entries": self._sq_entries, "cq_entries": self._table.capacity}

    def __enter__(self):
        _check_usable(self)
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __reduce__(self):
        raise TypeError("a Ring is a kernel object and cannot be pickled")

    def __repr__(self):
        if not self._open:
            return "<arenalib.Ring closed>"
        return (f"<arenalib.Ring {self._sq_entries} entries, {_table_in_flight(&self._table)} in flight, "
                f"fd {self._ring.ring_fd}>")


# -- what the class's methods call, one topic per file (after the class: they take a Ring) ----------

include "_ring_check.pxi"
include "_ring_submit.pxi"
include "_ring_fixed.pxi"
include "_ring_provide.pxi"
include "_ring_wait.pxi"
include "_ring_close.pxi"
include "_ring_gc.pxi"

ring_set_gc(<PyTypeObject*>Ring, <traverseproc>_ring_traverse, <inquiry>_ring_clear,
            <destructor>_ring_finalize, &base_traverse)

if ring_atfork() != 0:
    raise OSError("pthread_atfork failed")
