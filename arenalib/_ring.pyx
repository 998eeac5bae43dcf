# cython: language_level=3
"""Ring: an io_uring instance of arenalib's own, over liburing (built from its release source and
linked privately into this extension), whose requests pin the memory they target.

THE PROMISE: the kernel never writes into memory that someone else now owns.  Each request acquires a
buffer export (PyObject_GetBuffer) of every buffer it names and keeps it, with a strong reference,
until its completion is reaped by wait() or close().  A Segment with a live export refuses free(),
release to its pool, its arena's reset() and close() with BufferError and changes nothing; a
bytearray refuses to resize, an mmap to close.  Registering a BufferPool counts as a pin of the pool:
its close() and reset() raise BufferError until unregister_pool() or close().

Each method converts its arguments and acquires the buffers first (all that can run Python code),
then checks the ring, then fills the submission queue with C only (STYLE.md: convert, then check,
then touch).  Completions are matched to requests by an id of the ring's own in the CQE's user_data
(an index into the request table); the caller's user_data is kept in the table and handed back as
given.  At most cq_entries requests are in flight or reaped-and-not-returned at once, so the
completion queue (twice the submission queue) can never overflow and no completion is lost.

Sections that run Python code while the ring's state is half updated (releasing pins, which may run
finalizers) set _busy: a call into the ring from there raises RuntimeError instead of seeing it.  Python
code may also fork: after every place that runs it (a release, a signal handler) the fork count is
checked again before the ring's queues are touched, since a fork child has no mapping of them.

The request table's Python objects (user_data, the buffers' exporters, the completions not yet
returned) are visited by the garbage collector (_ring_traverse), and a ring found in a garbage cycle
is closed as an unclosed ring is when it is collected (_ring_finalize, before anything of the cycle
is cleared): cancel, reap, unpin, and a ResourceWarning.
"""

cimport cython
from cpython.buffer cimport (
    PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer,
)
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.number cimport PyNumber_Index
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject, PyTypeObject
from libc.errno cimport EBUSY, EINTR, EINVAL
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset

from arenalib._arena cimport Segment
from arenalib._abi cimport thread_ident
from arenalib._liburing cimport (
    IORING_ASYNC_CANCEL_ALL, IORING_ASYNC_CANCEL_ANY, IORING_SETUP_CLAMP, IORING_SETUP_COOP_TASKRUN,
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

from arenalib._errors import WrongThreadError
from arenalib._pool import _PoolBufferView

cdef extern from "Python.h":
    int PyObject_AsFileDescriptor(object o) except -1

cdef extern from "<unistd.h>" nogil:
    int c_close "close"(int fd)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<sys/socket.h>":
    int MSG_ZEROCOPY

cdef extern from "Python.h":
    # The garbage collector's slots, declared here as C calls (cpython.object's carry except -1).
    ctypedef int (*visitproc)(PyObject*, void*) noexcept
    ctypedef int (*traverseproc)(PyObject*, visitproc, void*) noexcept
    ctypedef int (*inquiry)(PyObject*) noexcept
    ctypedef void (*destructor)(PyObject*) noexcept

cdef extern from *:
    """
    /* The exporter at the end of a chain of memoryviews (a memoryview of a memoryview, a slice, a
       cast all name the first exporter, but an exporter may itself hand out a memoryview's buffer):
       whether it is of type ``raw`` (BufferPool's raw views).  C only: nothing here calls back. */
    static int arenalib_ring_exported_by(PyObject *obj, PyObject *raw) {
        int depth;
        for (depth = 0; obj != NULL && depth < 64; depth++) {
            if ((PyObject *)Py_TYPE(obj) == raw)
                return 1;
            if (!PyMemoryView_Check(obj))
                return 0;
            obj = PyMemoryView_GET_BUFFER(obj)->obj;
        }
        return 0;
    }
    /* The exception state, kept across a finalizer (PyErr_Fetch is deprecated from 3.12 on). */
    typedef struct { PyObject *type, *value, *tb; } arenalib_ring_exc;
    static void arenalib_ring_exc_save(arenalib_ring_exc *e) {
    #if PY_VERSION_HEX >= 0x030C0000
        e->type = NULL; e->tb = NULL; e->value = PyErr_GetRaisedException();
    #else
        PyErr_Fetch(&e->type, &e->value, &e->tb);
    #endif
    }
    static void arenalib_ring_exc_restore(arenalib_ring_exc *e) {
    #if PY_VERSION_HEX >= 0x030C0000
        PyErr_SetRaisedException(e->value);
    #else
        PyErr_Restore(e->type, e->value, e->tb);
    #endif
    }
    static PyObject *arenalib_ring_buffer_obj(Py_buffer *view) { return view->obj; }  /* no new ref */
    static void arenalib_ring_set_gc(PyTypeObject *type, traverseproc traverse, inquiry clear,
                                     destructor finalize, traverseproc *base) {
        *base = type->tp_traverse;
        type->tp_traverse = traverse;
        type->tp_clear = clear;
        type->tp_finalize = finalize;
    }
    """
    bint exported_by "arenalib_ring_exported_by"(PyObject* obj, PyObject* raw) noexcept
    PyObject* buffer_obj "arenalib_ring_buffer_obj"(Py_buffer* view) noexcept
    ctypedef struct saved_exc "arenalib_ring_exc":
        pass
    void exc_save "arenalib_ring_exc_save"(saved_exc* e) noexcept
    void exc_restore "arenalib_ring_exc_restore"(saved_exc* e) noexcept
    void ring_set_gc "arenalib_ring_set_gc"(
        PyTypeObject* type, traverseproc traverse, inquiry clear, destructor finalize,
        traverseproc* base) noexcept

cdef extern from *:
    """
    #include <pthread.h>
    /* Forks seen by this process's children: a ring remembers the count it was made at, so a fork
       child finds it changed with no system call (glibc's getpid() is one). */
    static unsigned long arenalib_ring_forks = 0;
    static void arenalib_ring_in_child(void) { arenalib_ring_forks++; }
    static int arenalib_ring_atfork(void) { return pthread_atfork(NULL, NULL, arenalib_ring_in_child); }
    """
    unsigned long ring_forks "arenalib_ring_forks"
    int ring_atfork "arenalib_ring_atfork"() noexcept

cdef str FORK_CHILD = ("this Ring was made by the parent of this forked process: a fork child cannot "
                       "use it (close() it and make a new one)")
cdef str BUSY = "the Ring is in the middle of wait() or close(): a finalizer or signal handler may not {} it"

# The exporter type of BufferPool.raw_views(): refused as a request's buffer (see _acquire).
cdef object RAW_VIEW = _PoolBufferView

# Tests set it (_use_per_request_cancel) to run close()'s fallback for kernels before 5.19 here.
cdef bint per_request_cancel = False


def _use_per_request_cancel(bint on):
    """Make close() cancel request by request, as it does on a kernel without CANCEL_ANY (tests)."""
    global per_request_cancel
    per_request_cancel = on


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
cdef Py_ssize_t MAX_IOVECS = 1024      # IOV_MAX: what readv(2) takes
cdef Py_ssize_t MAX_TRANSFER = 0x7ffff000  # MAX_RW_COUNT: what one read(2)/write(2) moves at most
cdef uint64_t CANCEL_ID = 0xFFFFFFFFFFFFFFFF  # the user_data of the ring's own cancel requests

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


ctypedef struct Request:
    PyObject* user_data      # the caller's, owned while the request is in the table; NULL: free slot
    Py_buffer view           # the buffer of a one-buffer request (nviews == 1, views == NULL)
    Py_buffer* views         # readv/writev: their nviews buffers (PyMem), else NULL
    iovec* iov               # readv/writev: the iovecs the kernel reads (PyMem), else NULL
    Py_ssize_t nviews        # buffers held: 0 (nop), 1 or the vector's length
    bint fixed               # a read_fixed/write_fixed: the registration must outlive it
    bint cancelling          # close() has sent a cancel for it (the per-request fallback)


ctypedef struct Completion:
    PyObject* user_data      # owned
    int result


cdef inline void _request_init(Request* req) noexcept:
    memset(req, 0, sizeof(Request))


cdef void _request_release(Request* req) noexcept:
    """Let go of the request's pins (may run Python code: finalizers of what the buffers held)."""
    cdef Py_ssize_t i
    cdef Py_buffer* views = req.views
    cdef Py_ssize_t n = req.nviews
    cdef iovec* iov = req.iov
    req.views = NULL
    req.iov = NULL
    req.nviews = 0
    PyMem_Free(iov)
    if views == NULL:
        if n == 1:
            PyBuffer_Release(&req.view)
        return
    for i in range(n):
        PyBuffer_Release(&views[i])
    PyMem_Free(views)


cdef int _fd(object fd) except -1:
    """A file descriptor from an int or an object with fileno() (a socket, a file)."""
    return PyObject_AsFileDescriptor(fd)


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


cdef enum:  # the requests on one buffer (Ring._queue_one)
    OP_READ
    OP_WRITE
    OP_RECV
    OP_SEND


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


def check(result):
    """A completion's result: returned when it is >= 0; -errno is raised as the matching OSError
    (FileNotFoundError for -ENOENT, BlockingIOError for -EAGAIN ...)."""
    cdef int res = result
    if res < 0:
        raise OSError(-res, os.strerror(-res))
    return result


@cython.final
@cython.no_gc_clear  # not Cython's clear (it would drop _pool, still counted): _ring_clear is installed
cdef class Ring:
    """An io_uring instance whose requests pin the memory they target until their completion is reaped.

    Ring(entries=64, *, flags=0): ``entries`` submission slots (1 to 32768; the kernel rounds up to a
    power of two), a completion queue twice as large; ``flags`` adds SETUP_* flags of this module.

    Requests (read, write, readv, writev, read_fixed, write_fixed, recv, send, nop) are queued, sent
    to the kernel by submit() or wait(), and complete as ``(user_data, result)`` pairs from wait():
    result is what the system call would return, or -errno (``check(result)`` raises it as OSError).
    While a request is in flight, each buffer it names is held by a buffer export, so a Segment's
    memory cannot be freed, released, reset or closed with its arena or pool (BufferError), nor a
    bytearray resized.  A raw view of a BufferPool buffer (``pool.raw_views()``, or a memoryview
    or slice of one) pins no buffer and is refused with TypeError: pass the acquired Segment.  At
    most ``cq_entries`` requests may be in flight and not yet returned by wait(): one more raises
    OSError(EBUSY) (the completion queue never overflows).  ``user_data`` may be any object: the
    ring holds it until wait() returns it or close() drops it, in the garbage collector's sight: a
    reference cycle through the ring (a user_data or a buffer that refers to it) is collected as an
    unclosed ring is.

    One thread owns a ring: its creator.  Any use from another thread raises WrongThreadError.  A
    fork child cannot use its parent's rings (their memory is not mapped in the child, and their
    requests are the parent's): every call raises RuntimeError except close(), which lets go of the
    child's copy of the pins and of the ring's descriptor.

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
    cdef unsigned _capacity          # requests in flight + completions not returned, at most
    cdef Request* _requests          # _capacity slots, indexed by the id in the CQE's user_data
    cdef unsigned* _free_ids         # a stack of free slots
    cdef unsigned _nfree
    cdef unsigned _fixed_in_flight
    cdef Completion* _done           # reaped, not yet returned by wait()
    cdef unsigned _ndone
    cdef unsigned _cancels           # the ring's own cancel requests in flight
    cdef int _cancel_result
    cdef BufferPool _pool            # the registered pool, or None

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
        self._capacity = params.cq_entries
        self._requests = <Request*>PyMem_Malloc(self._capacity * sizeof(Request))
        self._free_ids = <unsigned*>PyMem_Malloc(self._capacity * sizeof(unsigned))
        self._done = <Completion*>PyMem_Malloc(self._capacity * sizeof(Completion))
        if self._requests == NULL or self._free_ids == NULL or self._done == NULL:
            self._free_tables()
            io_uring_queue_exit(&self._ring)
            self._open = False
            raise MemoryError(f"cannot allocate the request table of {self._capacity} entries")
        cdef unsigned i
        for i in range(self._capacity):
            _request_init(&self._requests[i])
            self._free_ids[i] = self._capacity - 1 - i
        self._nfree = self._capacity

    cdef void _free_tables(self) noexcept:
        PyMem_Free(self._requests)
        PyMem_Free(self._free_ids)
        PyMem_Free(self._done)
        self._requests = NULL
        self._free_ids = NULL
        self._done = NULL

    # -- the checks ------------------------------------------------------------------------------

    cdef int _check_thread(self) except -1:
        if self._owner != thread_ident():
            raise WrongThreadError(f"this Ring belongs to thread {self._owner}; thread {thread_ident()} "
                                   "may not use it")
        return 0

    cdef int _check_usable(self) except -1:
        self._check_thread()
        self._check_not_forked()
        if not self._open:
            raise ValueError("the Ring is closed")
        if self._busy:
            raise RuntimeError(BUSY.format("use"))
        return 0

    cdef inline bint _forked(self) noexcept:
        """True in a fork child of the ring's maker, where its queues are not mapped."""
        return self._forks != ring_forks

    cdef inline int _check_not_forked(self) except -1:
        """Where Python code has run since the last check (a release's finalizer, a signal handler:
        either may have forked), before the queues are touched again."""
        if self._forks != ring_forks:
            raise RuntimeError(FORK_CHILD)
        return 0

    cdef inline unsigned _in_flight(self) noexcept:
        return self._capacity - self._nfree

    # -- queueing --------------------------------------------------------------------------------

    cdef io_uring_sqe* _sqe(self) except NULL:
        """A free submission slot (the queue submitted first when it is full).  Only C below, apart
        from the submit with the GIL released (no other thread may use the ring meanwhile)."""
        cdef io_uring_sqe* sqe = io_uring_get_sqe(&self._ring)
        cdef int ret
        while sqe == NULL:
            with nogil:
                ret = self._submit_for_room()
            if ret == -EINTR:
                continue
            if ret < 0:
                raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
            sqe = io_uring_get_sqe(&self._ring)
            if sqe == NULL and ret == 0:
                raise OSError(EBUSY, "io_uring: the kernel took no request from a full submission queue")
        return sqe

    cdef io_uring_sqe* _begin(self, Request* req) except NULL:
        """After the conversions and the buffer acquisitions: check the ring, then give a submission
        slot.  On error the request's pins are let go."""
        try:
            self._check_usable()
            if self._in_flight() + self._ndone >= self._capacity:
                raise OSError(EBUSY, f"{self._capacity} requests are in flight or completed and not yet "
                              "returned by wait(), as many as the completion queue holds: wait() first")
            return self._sqe()
        except BaseException:
            _request_release(req)
            raise

    cdef void _commit(self, io_uring_sqe* sqe, Request* req, object user_data) noexcept:
        """File the request under a free id, named in the SQE (C only: nothing can fail)."""
        self._nfree -= 1
        cdef unsigned rid = self._free_ids[self._nfree]
        Py_INCREF(user_data)
        req.user_data = <PyObject*>user_data
        self._requests[rid] = req[0]  # the exports move with the struct: the table owns them now
        if req.fixed:
            self._fixed_in_flight += 1
        io_uring_sqe_set_data64(sqe, rid)

    def nop(self, *, user_data=0):
        """Queue a request that does nothing; it completes with result 0."""
        cdef Request req
        _request_init(&req)
        cdef io_uring_sqe* sqe = self._begin(&req)
        io_uring_prep_nop(sqe)
        self._commit(sqe, &req, user_data)

    def read(self, fd, buf, offset=-1, *, user_data=0):
        """Queue a read of up to len(buf) bytes from ``fd`` at ``offset`` (-1: the file position) into
        ``buf`` (a writable buffer: Segment, bytearray, memoryview ...), pinned until it completes;
        the result is the number of bytes read."""
        self._queue_one(OP_READ, fd, buf, offset, user_data)

    def write(self, fd, buf, offset=-1, *, user_data=0):
        """Queue a write of ``buf`` (any bytes-like object, pinned until it completes) to ``fd`` at
        ``offset`` (-1: the file position); the result is the number of bytes written."""
        self._queue_one(OP_WRITE, fd, buf, offset, user_data)

    cdef int _queue_one(self, int op, object fd, object buf, object where, object user_data) except -1:
        """A request on one buffer: read or write at offset ``where``, recv or send with MSG_* flags
        ``where``.  Conversions and the buffer's export first, then the ring (see _begin)."""
        cdef int cfd = _fd(fd)
        cdef uint64_t off = 0
        cdef int cflags = 0
        if op == OP_READ or op == OP_WRITE:
            off = _offset(where)
        else:
            cflags = where
            if op == OP_SEND and cflags & MSG_ZEROCOPY:
                raise ValueError(
                    "send() refuses MSG_ZEROCOPY: the kernel reads the pages until the zerocopy "
                    "notification arrives on the socket's error queue, after the send's completion, "
                    "when the buffer may be someone else's (send without it copies)")
        cdef Request req
        _request_init(&req)
        _acquire(buf, &req.view, op == OP_READ or op == OP_RECV)
        req.nviews = 1
        cdef io_uring_sqe* sqe = self._begin(&req)
        cdef unsigned length = _length(req.view.len)
        if op == OP_READ:
            io_uring_prep_read(sqe, cfd, req.view.buf, length, off)
        elif op == OP_WRITE:
            io_uring_prep_write(sqe, cfd, req.view.buf, length, off)
        elif op == OP_RECV:
            io_uring_prep_recv(sqe, cfd, req.view.buf, length, cflags)
        else:
            io_uring_prep_send(sqe, cfd, req.view.buf, length, cflags)
        self._commit(sqe, &req, user_data)
        return 0

    def readv(self, fd, bufs, offset=-1, *, user_data=0):
        """Queue a vectored read (preadv(2)) into the writable buffers ``bufs`` (a sequence of at most
        1024), each pinned until it completes."""
        self._vector(fd, bufs, offset, user_data, True)

    def writev(self, fd, bufs, offset=-1, *, user_data=0):
        """Queue a vectored write (pwritev(2)) of the buffers ``bufs`` (a sequence of at most 1024),
        each pinned until it completes."""
        self._vector(fd, bufs, offset, user_data, False)

    cdef int _vector(self, object fd, object bufs, object offset, object user_data,
                     bint reading) except -1:
        cdef int cfd = _fd(fd)
        cdef uint64_t off = _offset(offset)
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
        cdef io_uring_sqe* sqe = self._begin(&req)
        if reading:
            io_uring_prep_readv(sqe, cfd, req.iov, <unsigned>n, off)
        else:
            io_uring_prep_writev(sqe, cfd, req.iov, <unsigned>n, off)
        self._commit(sqe, &req, user_data)
        return 0

    def read_fixed(self, fd, segment, offset=-1, *, user_data=0):
        """Queue a read into ``segment``, a live Segment (or slice of one) of the registered pool,
        through the kernel's registration of its buffer (no page pinning per request)."""
        self._fixed(fd, segment, offset, user_data, True)

    def write_fixed(self, fd, segment, offset=-1, *, user_data=0):
        """Queue a write of ``segment``, a live Segment (or slice of one) of the registered pool,
        through the kernel's registration of its buffer."""
        self._fixed(fd, segment, offset, user_data, False)

    cdef int _fixed(self, object fd, object segment, object offset, object user_data,
                    bint reading) except -1:
        cdef int cfd = _fd(fd)
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
        cdef Py_ssize_t index
        try:
            # After the acquisition, which may have run Python code: the registration as it is now.
            if self._pool is None:
                raise ValueError("no BufferPool is registered with this Ring: register_pool() first")
            if seg._arena is not self._pool:
                raise ValueError("the segment is not from the BufferPool registered with this Ring")
            index = self._pool._index_of(seg)
        except BaseException:
            _request_release(&req)
            raise
        cdef io_uring_sqe* sqe = self._begin(&req)
        if reading:
            io_uring_prep_read_fixed(sqe, cfd, req.view.buf, _length(req.view.len), off, <int>index)
        else:
            io_uring_prep_write_fixed(sqe, cfd, req.view.buf, _length(req.view.len), off, <int>index)
        self._commit(sqe, &req, user_data)
        return 0

    def recv(self, sock, buf, *, flags=0, user_data=0):
        """Queue a recv(2) from the socket ``sock`` (a socket or its descriptor) into the writable
        ``buf``, pinned until it completes; ``flags`` are recv(2)'s MSG_* flags."""
        self._queue_one(OP_RECV, sock, buf, flags, user_data)

    def send(self, sock, buf, *, flags=0, user_data=0):
        """Queue a send(2) of ``buf`` on the socket ``sock``, pinned until it completes; ``flags``
        are send(2)'s MSG_* flags, except MSG_ZEROCOPY (ValueError, before anything is queued): with
        it the kernel goes on reading the pages after the completion, until a notification on the
        socket's error queue, which the pin does not wait for."""
        self._queue_one(OP_SEND, sock, buf, flags, user_data)

    # -- submitting and reaping ------------------------------------------------------------------

    def submit(self):
        """Send the queued requests to the kernel (without the GIL); returns how many it took."""
        self._check_usable()
        cdef int ret
        while True:
            with nogil:
                ret = io_uring_submit(&self._ring)
            if ret != -EINTR:
                break
        if ret < 0:
            raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
        return ret

    def wait(self, n=1):
        """Submit what is queued, wait (without the GIL) until at least ``n`` completions are there,
        and return every completion reaped, as ``[(user_data, result), ...]``; wait(0) does not block.

        Each request's pins are released as its completion is reaped.  ValueError when ``n`` is more
        than the requests in flight and reaped could ever give (the wait would never end)."""
        cdef Py_ssize_t want = n
        self._check_usable()
        if want < 0:
            raise ValueError(f"n must be >= 0, not {n!r}")
        if <size_t>want > self._in_flight() + self._ndone:
            raise ValueError(f"cannot wait for {want} completions: {self._in_flight()} requests are in "
                             f"flight and {self._ndone} completed")
        cdef int ret
        cdef unsigned need
        self._busy = True
        try:
            self._reap()
            while True:
                need = <unsigned>(want - self._ndone) if <size_t>want > self._ndone else 0
                if need == 0 and self._ring.sq.sqe_head == self._ring.sq.sqe_tail:
                    break  # enough completions, and nothing queued
                # The releases of the last reap and the signal handlers of the last round ran Python
                # code, which may have forked.
                self._check_not_forked()
                with nogil:
                    ret = io_uring_submit_and_wait(&self._ring, need)
                if ret < 0 and ret != -EINTR:
                    raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
                self._reap()
                # A signal may have cut the wait short even when the call reports what it submitted
                # (and not -EINTR): its handler runs now; an exception from it leaves the reaped
                # completions for the next wait().
                PyErr_CheckSignals()
            return self._take_done()
        finally:
            self._busy = False

    cdef int _reap(self) except -1:
        """Move every completion in the CQ into _done, releasing its request's pins (with _busy set:
        the releases may run Python code).  RuntimeError in a fork child (a release's finalizer may
        have forked: the CQ is not mapped there)."""
        cdef io_uring_cqe* cqe
        cdef uint64_t rid
        cdef int res
        cdef Request req
        while True:
            self._check_not_forked()  # before each look at the CQ: the last release ran Python code
            if not io_uring_peek_batch_cqe(&self._ring, &cqe, 1):
                break
            rid = cqe.user_data
            res = cqe.res
            io_uring_cq_advance(&self._ring, 1)
            if rid == CANCEL_ID:
                self._cancels -= 1
                self._cancel_result = res
                continue
            if rid >= self._capacity or self._requests[rid].user_data == NULL:
                continue  # not a request of this ring's (cannot happen: the ids are its own)
            # The table first (the slot free, the completion filed), then the pins, whose release
            # may run Python code.
            req = self._requests[rid]
            _request_init(&self._requests[rid])
            self._free_ids[self._nfree] = <unsigned>rid
            self._nfree += 1
            if req.fixed:
                self._fixed_in_flight -= 1
            self._done[self._ndone].user_data = req.user_data
            self._done[self._ndone].result = res
            self._ndone += 1
            _request_release(&req)
        return 0

    cdef list _take_done(self):
        cdef unsigned i, n = self._ndone
        # Sized at once (no append's reallocation), and full from the start: making a tuple may run
        # the collector, whose finalizers can reach this list through gc.get_objects().
        cdef list result = [None] * n
        for i in range(n):  # a MemoryError here keeps them all for the next wait()
            result[i] = (<object>self._done[i].user_data, self._done[i].result)
        self._drop_done()
        return result

    cdef void _drop_done(self) noexcept:
        cdef unsigned i, n = self._ndone
        self._ndone = 0
        for i in range(n):
            Py_DECREF(<object>self._done[i].user_data)

    # -- registered buffers ----------------------------------------------------------------------

    def register_pool(self, pool):
        """Register every buffer of the BufferPool ``pool`` with the kernel (buffer i is fixed buffer
        i) for read_fixed/write_fixed.  While registered, the pool's close() and reset() raise
        BufferError.  One pool per ring."""
        if type(pool) is not BufferPool:
            raise TypeError(f"register_pool() takes a BufferPool, not {type(pool).__name__}")
        cdef BufferPool bp = <BufferPool>pool
        self._check_usable()
        if self._pool is not None:
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
                ret = io_uring_register_buffers(&self._ring, iov, <unsigned>n)
            if ret < 0:
                bp._registered(-1)
                raise OSError(-ret, f"io_uring_register_buffers: {os.strerror(-ret)}")
        finally:
            PyMem_Free(iov)
        self._pool = bp

    def unregister_pool(self):
        """Undo register_pool() (nothing when no pool is registered); the pool may close again.

        Raises BufferError, changing nothing, while a fixed-buffer request is in flight."""
        self._check_usable()
        if self._pool is None:
            return
        self._busy = True
        try:
            self._reap()  # completed fixed requests do not hold the registration
        finally:
            self._busy = False
        if self._fixed_in_flight:
            raise BufferError(f"cannot unregister the BufferPool: {self._fixed_in_flight} fixed-buffer "
                              "request(s) are in flight; wait() for them first")
        cdef int ret
        with nogil:
            ret = io_uring_unregister_buffers(&self._ring)
        if ret < 0:
            raise OSError(-ret, f"io_uring_unregister_buffers: {os.strerror(-ret)}")
        cdef BufferPool pool = self._pool
        self._pool = None
        pool._registered(-1)

    @property
    def pool(self):
        """The registered BufferPool, or None."""
        self._check_thread()
        return self._pool

    # -- closing ---------------------------------------------------------------------------------

    def close(self):
        """Cancel every request in flight, wait for all their completions, release their pins and the
        pool's registration, and close the ring; idempotent.  Queued requests not yet submitted never
        reach the kernel; completions not yet returned by wait() are dropped."""
        if not self._open:
            return
        self._check_thread()
        if self._busy:
            raise RuntimeError(BUSY.format("close"))
        self._shutdown()

    cdef void _shutdown(self) noexcept:
        """Close: cancel, reap every completion, and only then release the pins (or, in a fork child,
        where the kernel writes nothing for these requests, release them at once).  A fork made by
        Python code the cancels' reaps ran (a finalizer) makes the child's close a fork child's."""
        cdef unsigned i
        cdef Request req
        cdef BufferPool pool
        self._busy = True
        if not self._forked():
            if not self._cancel_all() and not self._forked():
                # The kernel would not say when the requests end: their memory stays pinned for good
                # (a leak, never a write into memory someone else owns).
                self._requests = NULL
                self._nfree = self._capacity
        # Checked again: the reaps ran finalizers, and a fork child has no mapping of the queues.
        if not self._forked():
            if self._pool is not None:
                io_uring_unregister_buffers(&self._ring)
            io_uring_queue_exit(&self._ring)
        else:
            # The child has the descriptor but not the mapping (MADV_DONTFORK): unmapping what may
            # be other memory by now would be wrong, closing the descriptor is all.
            c_close(self._ring.ring_fd)
        self._open = False
        for i in range(self._capacity if self._requests != NULL else 0):
            if self._requests[i].user_data != NULL:
                req = self._requests[i]
                _request_init(&self._requests[i])
                Py_DECREF(<object>req.user_data)
                _request_release(&req)
        self._nfree = self._capacity
        self._fixed_in_flight = 0
        self._drop_done()
        self._free_tables()
        if self._pool is not None:
            pool = self._pool
            self._pool = None
            pool._registered(-1)
        self._busy = False

    cdef bint _cancel_all(self) noexcept:
        """Drop the queued requests, cancel those in flight, and reap until none is left; False if
        the kernel keeps failing to say (the pins must then stay), or at once in a fork child made by
        a finalizer a reap ran (the caller checks _forked())."""
        cdef unsigned head = self._ring.sq.sqe_head
        cdef io_uring_sqe* sqe
        cdef uint64_t rid
        cdef int ret
        cdef bint sent_any = False
        # A kernel older than 5.19 knows no CANCEL_ANY (EINVAL): one cancel per request, by its id.
        cdef bint per_request = per_request_cancel
        cdef int failures = 0
        # Queued, not submitted: turned into NOPs, which complete at once and touch no memory.
        while head != self._ring.sq.sqe_tail:
            sqe = &self._ring.sq.sqes[head & self._ring.sq.ring_mask]
            rid = sqe.user_data
            io_uring_prep_nop(sqe)
            io_uring_sqe_set_data64(sqe, rid)
            head += 1
        cdef unsigned unsent, unsent_before = 0
        cdef int stalls = 0                # rounds in a row that left requests without a cancel
        while self._in_flight():
            if per_request:
                unsent = self._cancel_each()
            else:
                if not sent_any:
                    sqe = self._sqe_or_null()
                    if sqe != NULL:
                        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ALL | IORING_ASYNC_CANCEL_ANY)
                        io_uring_sqe_set_data64(sqe, CANCEL_ID)
                        self._cancels += 1
                        sent_any = True
                unsent = 0 if sent_any else self._in_flight()
            # Block for a completion only once every request has its cancel: a request without one
            # may never complete (a read from a silent pipe).  Else submit, reap, and try again.
            with nogil:
                ret = io_uring_submit_and_wait(&self._ring, 0 if unsent else 1)
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
                self._reap()
            except BaseException:  # a MemoryError (nothing is lost by it), or the fork check
                pass
            if self._forked():     # a finalizer run by the reap forked: the queues are not ours
                return False
            if sent_any and not self._cancels and self._cancel_result == -EINVAL:
                per_request = True
                sent_any = False
        while self._cancels:  # the cancel requests' own completions
            with nogil:
                ret = io_uring_submit_and_wait(&self._ring, 1)
            if ret < 0 and ret != -EINTR:
                failures += 1
                if failures > 1000:
                    break  # they pin nothing
            try:
                self._reap()
            except BaseException:
                pass
            if self._forked():
                return False
        return True

    cdef unsigned _cancel_each(self) noexcept:
        """Queue a cancel for every request in flight that has none yet, as far as the submission
        queue takes them; how many are left without one (for the next call)."""
        cdef unsigned i, unsent = 0
        cdef io_uring_sqe* sqe
        for i in range(self._capacity):
            if self._requests[i].user_data != NULL and not self._requests[i].cancelling:
                sqe = self._sqe_or_null() if not unsent else NULL
                if sqe == NULL:
                    unsent += 1
                    continue
                io_uring_prep_cancel64(sqe, i, 0)
                io_uring_sqe_set_data64(sqe, CANCEL_ID)
                self._requests[i].cancelling = True
                self._cancels += 1
        return unsent

    cdef io_uring_sqe* _sqe_or_null(self) noexcept:
        """A submission slot for close's cancels (the queue submitted first when full), or NULL."""
        cdef io_uring_sqe* sqe = io_uring_get_sqe(&self._ring)
        if sqe == NULL:
            with nogil:
                self._submit_for_room()
            sqe = io_uring_get_sqe(&self._ring)
        return sqe

    cdef int _submit_for_room(self) noexcept nogil:
        """Submit the queue (to make room in it); io_uring_submit's result, or -errno.  With SQPOLL,
        where submitting only hands the entries to the kernel's polling thread, also wait until that
        thread has taken some: a full queue stays full until it does."""
        cdef int ret = io_uring_submit(&self._ring)
        cdef int waited
        if ret >= 0 and self._flags & IORING_SETUP_SQPOLL:
            waited = io_uring_sqring_wait(&self._ring)
            if waited == -EINVAL:  # a kernel before 5.10 cannot wait for room: let the thread run
                sched_yield()
            elif waited < 0:
                return waited
        return ret

    def __dealloc__(self):
        if not self._open:
            self._free_tables()
            return
        self._close_unclosed()

    cdef void _close_unclosed(self) noexcept:
        """Close a ring found open by the collector (__dealloc__, or _ring_finalize for a ring in a
        garbage cycle), with a ResourceWarning."""
        message = f"unclosed {self!r}"
        self._shutdown()
        if warnings is not None:  # None while the interpreter is tearing modules down
            warnings.warn(message, ResourceWarning, stacklevel=2)

    # -- figures ---------------------------------------------------------------------------------

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
        return self._capacity

    @property
    def in_flight(self):
        """Requests queued or in the kernel whose completions are not reaped yet."""
        self._check_thread()
        return self._in_flight() if self._open else 0

    def features(self):
        """What the kernel offers this ring: ``{"features": [IORING_FEAT_* names], "opcodes":
        [supported IORING_OP_* names], "setup_flags": [the ring's IORING_SETUP_* names], "sq_entries",
        "cq_entries"}`` (names without their prefix; bits and opcodes newer than liburing 2.3's header
        are given as "bit N" and "op N")."""
        self._check_usable()
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
                "sq_entries": self._sq_entries, "cq_entries": self._capacity}

    def __enter__(self):
        self._check_usable()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __reduce__(self):
        raise TypeError("a Ring is a kernel object and cannot be pickled")

    def __repr__(self):
        if not self._open:
            return "<arenalib.Ring closed>"
        return (f"<arenalib.Ring {self._sq_entries} entries, {self._in_flight()} in flight, "
                f"fd {self._ring.ring_fd}>")


# -- the garbage collector's view of a ring ---------------------------------------------------------
#
# Cython's own slots see only _pool; the Python objects in the C tables (each request's user_data and
# the exporters its buffer exports hold, the user_data of completions reaped and not yet returned)
# are visited here, so that a cycle through them (user_data=self.on_read, where self holds the ring)
# is found.  The traversal runs no Python code and touches no reference count: ``self`` is borrowed,
# and the tables are read as they are (every entry filed in them owns its references).
#
# A ring in a garbage cycle is closed by _ring_finalize (tp_finalize, PEP 442), which the collector
# runs on every object of the cycle before it clears any of them: the requests are cancelled and
# reaped while the objects their buffers come from are whole (a memoryview's managed buffer, cleared,
# releases its exporter: a read in flight would then write into memory its owner may free).
# _ring_clear (tp_clear) does the same for a ring still open after that.  Neither is a Python method
# (a __del__ called by hand from another thread could close a ring under its owner); an ordinary
# deallocation is __dealloc__'s, as before.

cdef traverseproc base_traverse = NULL  # Cython's (_pool, and the type of a heap type)


cdef int _ring_traverse(Ring self, visitproc visit, void* arg) noexcept:
    cdef int ret = base_traverse(<PyObject*>self, visit, arg) if base_traverse != NULL else 0
    if ret:
        return ret
    cdef unsigned i
    cdef Py_ssize_t j
    cdef Request* req
    cdef PyObject* obj
    if self._requests != NULL and self._nfree != self._capacity:
        for i in range(self._capacity):
            req = &self._requests[i]
            if req.user_data == NULL:
                continue
            ret = visit(req.user_data, arg)
            if ret:
                return ret
            for j in range(req.nviews):
                obj = buffer_obj(&req.views[j] if req.views != NULL else &req.view)
                if obj != NULL:
                    ret = visit(obj, arg)
                    if ret:
                        return ret
    if self._done != NULL:
        for i in range(self._ndone):
            ret = visit(self._done[i].user_data, arg)
            if ret:
                return ret
    return 0


cdef void _ring_finalize(Ring self) noexcept:
    """A ring in a garbage cycle: closed as an unclosed ring is at collection (cancel, reap, unpin,
    ResourceWarning), which drops every reference of its tables.  A busy ring is in use by a call
    under way, so never garbage; it is left alone.  The exception state is kept (tp_finalize's rule)."""
    cdef saved_exc exc
    if self._open and not self._busy:
        exc_save(&exc)
        self._close_unclosed()
        exc_restore(&exc)


cdef int _ring_clear(Ring self) noexcept:
    _ring_finalize(self)
    return 0


ring_set_gc(<PyTypeObject*>Ring, <traverseproc>_ring_traverse, <inquiry>_ring_clear,
            <destructor>_ring_finalize, &base_traverse)

if ring_atfork() != 0:
    raise OSError("pthread_atfork failed")
