"""A minimal io_uring client over the raw syscalls, for arenalib's examples, tests and benchmark, until
arenalib gets a ring of its own.  No dependency but the standard library (ctypes, mmap, struct).

    with Ring(8) as ring:
        seg = pool.acquire()
        ring.prep_read(fd, seg.address, len(seg), offset, user_data=pool.index(seg))
        ring.submit()
        for user_data, res in ring.wait(1):
            n = check(res)  # OSError for a failed request (res is -errno)
            data = seg[:n]
        pool.release(seg)

It calls io_uring_setup (syscall 425), io_uring_enter (426) and io_uring_register (427) through
ctypes and maps the rings with mmap: 64-byte submission entries (SQEs), 16-byte completion entries
(CQEs).  The ring heads and tails are read and written as aligned 32-bit loads and stores with no
barrier, which is correct on x86-64 (total store order: the SQE and the SQ array are written before
the tail that publishes them, the kernel's CQ tail is read before the CQEs it covers); elsewhere
Ring() raises Unavailable.  One thread at a time per ring.  Linux 5.6 or newer (IORING_OP_READ).

Memory safety is the caller's: the requests take addresses (ints), not buffers.  The kernel writes
into ``address`` until the completion of the request arrives, so keep the memory alive until then:
an arenalib segment acquired (not released, its pool or arena not closed) until its completion has
been returned by wait().  close() does not wait for requests in flight.  Registered buffers
(register_buffers) are pinned by the kernel and read_fixed/write_fixed go to those pages whatever
the process did with them since: unregister_buffers() (or close the ring) before closing the pool
that holds them.  An address the process has not mapped fails the request with -EFAULT; an address
that is mapped but belongs to something else is written to.

``liburing_wheel_usable()`` says, by a probe in a child interpreter, whether the ``liburing`` package
from PyPI can run here (its 2026.3.30 wheel dies with SIGILL on x86-64 CPUs without AVX-512).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import platform
import signal
import struct
import subprocess
import sys
import textwrap
from collections.abc import Sequence

__all__ = ["Iovec", "Ring", "Unavailable", "check", "iovec_array", "liburing_wheel_usable", "probe"]

SYS_IO_URING_SETUP, SYS_IO_URING_ENTER, SYS_IO_URING_REGISTER = 425, 426, 427
IORING_OFF_SQ_RING, IORING_OFF_CQ_RING, IORING_OFF_SQES = 0, 0x8000000, 0x10000000
IORING_FEAT_SINGLE_MMAP = 1 << 0
IORING_ENTER_GETEVENTS = 1 << 0
IORING_REGISTER_BUFFERS, IORING_UNREGISTER_BUFFERS = 0, 1
OP_NOP, OP_READV, OP_WRITEV, OP_READ_FIXED, OP_WRITE_FIXED, OP_READ, OP_WRITE = 0, 1, 2, 4, 5, 22, 23

# struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len, rw_flags, user_data, buf_index,
# personality, splice_fd_in, addr3, pad.  Native order and alignment: every field is aligned.
SQE = struct.Struct("BBHiQQIIQHHiQQ")
CQE = struct.Struct("QiI")  # struct io_uring_cqe: user_data, res, flags
U64_MASK = (1 << 64) - 1
U32 = struct.Struct("I")  # a native, aligned 32-bit load or store (struct copies it with memcpy)
assert SQE.size == 64 and CQE.size == 16


def _u32_fields(names: str) -> list[tuple[str, type]]:
    return [(name, ctypes.c_uint32) for name in names.split()]


class _SqOffsets(ctypes.Structure):
    _fields_ = _u32_fields("head tail ring_mask ring_entries flags dropped array resv1")
    _fields_ += [("user_addr", ctypes.c_uint64)]


class _CqOffsets(ctypes.Structure):
    _fields_ = _u32_fields("head tail ring_mask ring_entries overflow cqes flags resv1")
    _fields_ += [("user_addr", ctypes.c_uint64)]


class _Params(ctypes.Structure):  # struct io_uring_params
    _fields_ = _u32_fields("sq_entries cq_entries flags sq_thread_cpu sq_thread_idle features wq_fd")
    _fields_ += [("resv", ctypes.c_uint32 * 3), ("sq_off", _SqOffsets), ("cq_off", _CqOffsets)]


class Iovec(ctypes.Structure):  # struct iovec
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


assert ctypes.sizeof(_Params) == 120

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: int) -> int:
    """A syscall with integer arguments (passed as longs); OSError on failure."""
    while True:
        rc = _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
        if rc >= 0:
            return rc
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))


class Unavailable(OSError):
    """io_uring cannot be used here: the kernel lacks it or refuses it (ENOSYS, EPERM), or the CPU is
    not x86-64."""


def check(res: int) -> int:
    """A completion's result: returned when it is >= 0, raised as OSError when it is -errno."""
    if res < 0:
        raise OSError(-res, os.strerror(-res))
    return res


def iovec_array(pairs: Sequence[tuple[int, int]]) -> ctypes.Array:
    """A C array of struct iovec from ``(address, length)`` pairs (``pool.iovecs()``,
    ``[(seg.address, len(seg))]``), for prep_readv/prep_writev when the same array serves many
    requests."""
    return (Iovec * len(pairs))(*(Iovec(address, length) for address, length in pairs))


class Ring:
    """An io_uring instance with ``entries`` submission slots (the kernel rounds up to a power of two;
    the completion queue has twice as many).  A context manager; close() is idempotent."""

    def __init__(self, entries: int = 32):
        if platform.machine() not in ("x86_64", "AMD64"):
            why = f"raw_uring relies on x86-64's memory order, not {platform.machine()}'s"
            raise Unavailable(errno.ENOTSUP, why)
        p = _Params()
        try:
            self.fd = _syscall(SYS_IO_URING_SETUP, entries, ctypes.addressof(p))
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES):
                raise Unavailable(e.errno, f"io_uring_setup: {e.strerror}") from None
            raise
        self._maps: list[mmap.mmap] = []
        try:
            self.sq_entries, self.cq_entries, self.features = p.sq_entries, p.cq_entries, p.features
            so, co = p.sq_off, p.cq_off
            sq_size = so.array + p.sq_entries * 4
            cq_size = co.cqes + p.cq_entries * CQE.size
            if p.features & IORING_FEAT_SINGLE_MMAP:  # one mapping holds both rings (Linux 5.4+)
                self._sq = self._cq = self._map(max(sq_size, cq_size), IORING_OFF_SQ_RING)
            else:
                self._sq = self._map(sq_size, IORING_OFF_SQ_RING)
                self._cq = self._map(cq_size, IORING_OFF_CQ_RING)
            self._sqes = self._map(p.sq_entries * SQE.size, IORING_OFF_SQES)
        except BaseException:
            self.close()
            raise
        self._sq_head, self._sq_tail, self._sq_array = so.head, so.tail, so.array
        self._sq_mask = U32.unpack_from(self._sq, so.ring_mask)[0]
        self._cq_head, self._cq_tail, self._cqes = co.head, co.tail, co.cqes
        self._cq_mask = U32.unpack_from(self._cq, co.ring_mask)[0]
        self._tail = U32.unpack_from(self._sq, so.tail)[0]  # the next SQE slot, published by submit()
        self._keep: list[ctypes.Array] = []  # iovec arrays made for prepared SQEs, until submitted
        self.inflight = 0  # submitted requests whose completion wait() has not returned yet

    def _map(self, size: int, offset: int) -> mmap.mmap:
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        m = mmap.mmap(self.fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
        self._maps.append(m)
        return m

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Unmap the rings and close the ring's fd (the kernel then unregisters its buffers and
        cancels what is in flight, asynchronously: it does not wait for the completions)."""
        for m in self._maps:
            m.close()
        self._maps.clear()
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()

    @property
    def pending(self) -> int:
        """SQEs prepared and not yet submitted."""
        return (self._tail - U32.unpack_from(self._sq, self._sq_tail)[0]) & 0xFFFFFFFF

    # -- submission ---------------------------------------------------------------------------------

    def _prep(
        self, opcode: int, fd: int, address: int, length: int, offset: int, user_data: int, buf_index: int = 0
    ) -> None:
        if self.closed:
            raise ValueError("the ring is closed")
        if not 0 <= user_data <= U64_MASK:
            raise ValueError(f"user_data {user_data} is not a 64-bit unsigned integer")
        head = U32.unpack_from(self._sq, self._sq_head)[0]
        if (self._tail - head) & 0xFFFFFFFF >= self.sq_entries:
            raise BlockingIOError(errno.EAGAIN, "the submission queue is full: submit() first")
        index = self._tail & self._sq_mask
        sqe = (opcode, 0, 0, fd, offset & U64_MASK, address, length, 0, user_data, buf_index, 0, 0, 0, 0)
        SQE.pack_into(self._sqes, index * SQE.size, *sqe)  # every field written: the slot is reused
        U32.pack_into(self._sq, self._sq_array + 4 * index, index)
        self._tail = (self._tail + 1) & 0xFFFFFFFF

    def prep_nop(self, user_data: int = 0) -> None:
        self._prep(OP_NOP, -1, 0, 0, 0, user_data)

    def prep_read(self, fd: int, address: int, length: int, offset: int, user_data: int = 0) -> None:
        """Read ``length`` bytes at file ``offset`` (-1: the file position) into memory at ``address``."""
        self._prep(OP_READ, fd, address, length, offset, user_data)

    def prep_write(self, fd: int, address: int, length: int, offset: int, user_data: int = 0) -> None:
        self._prep(OP_WRITE, fd, address, length, offset, user_data)

    def prep_readv(
        self, fd: int, iovecs: Sequence[tuple[int, int]] | ctypes.Array, offset: int, user_data: int = 0
    ) -> None:
        """Read into the buffers ``iovecs``: ``(address, length)`` pairs, or an iovec_array() (which
        the caller keeps alive until submit() returns)."""
        self._prep_vector(OP_READV, fd, iovecs, offset, user_data)

    def prep_writev(
        self, fd: int, iovecs: Sequence[tuple[int, int]] | ctypes.Array, offset: int, user_data: int = 0
    ) -> None:
        self._prep_vector(OP_WRITEV, fd, iovecs, offset, user_data)

    def _prep_vector(self, opcode: int, fd: int, iovecs, offset: int, user_data: int) -> None:
        array = iovecs if isinstance(iovecs, ctypes.Array) else iovec_array(iovecs)
        self._prep(opcode, fd, ctypes.addressof(array), len(array), offset, user_data)
        if array is not iovecs:
            self._keep.append(array)  # the kernel reads it when the SQE is submitted

    def prep_read_fixed(
        self, fd: int, address: int, length: int, offset: int, buf_index: int, user_data: int = 0
    ) -> None:
        """Read into registered buffer ``buf_index``: [address, address + length) must lie inside it,
        else the request fails with -EFAULT."""
        self._prep(OP_READ_FIXED, fd, address, length, offset, user_data, buf_index)

    def prep_write_fixed(
        self, fd: int, address: int, length: int, offset: int, buf_index: int, user_data: int = 0
    ) -> None:
        self._prep(OP_WRITE_FIXED, fd, address, length, offset, user_data, buf_index)

    def submit(self) -> int:
        """Hand the prepared SQEs to the kernel; returns how many it took."""
        if self.closed:
            raise ValueError("the ring is closed")
        U32.pack_into(self._sq, self._sq_tail, self._tail)  # publishes the SQEs written before
        to_submit = (self._tail - U32.unpack_from(self._sq, self._sq_head)[0]) & 0xFFFFFFFF
        done = _syscall(SYS_IO_URING_ENTER, self.fd, to_submit, 0, 0, 0, 0) if to_submit else 0
        self.inflight += done
        if done == to_submit:
            self._keep.clear()
        return done

    # -- completion ---------------------------------------------------------------------------------

    def wait(self, min_complete: int = 1) -> list[tuple[int, int]]:
        """Block until at least ``min_complete`` completions are there (0: do not block), then return
        every completion ready, in order, as ``(user_data, res)``: res is -errno for a failure."""
        if self.closed:
            raise ValueError("the ring is closed")
        if min_complete > self.inflight:
            raise ValueError(f"waiting for {min_complete} completions with {self.inflight} in flight")
        out = self._reap()
        while len(out) < min_complete:
            _syscall(SYS_IO_URING_ENTER, self.fd, 0, min_complete - len(out), IORING_ENTER_GETEVENTS, 0, 0)
            out += self._reap()
        return out

    def _reap(self) -> list[tuple[int, int]]:
        head = U32.unpack_from(self._cq, self._cq_head)[0]
        tail = U32.unpack_from(self._cq, self._cq_tail)[0]  # read before the CQEs it covers
        out = []
        while head != tail:
            user_data, res, _flags = CQE.unpack_from(self._cq, self._cqes + (head & self._cq_mask) * CQE.size)
            out.append((user_data, res))
            head = (head + 1) & 0xFFFFFFFF
        U32.pack_into(self._cq, self._cq_head, head)  # the slots are free for the kernel again
        self.inflight -= len(out)
        return out

    # -- registered buffers -------------------------------------------------------------------------

    def register_buffers(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Register ``(address, length)`` pairs (``pool.iovecs()``): pair i is fixed buffer i.  The
        kernel pins their pages until unregister_buffers() or close()."""
        array = iovec_array(pairs)
        _syscall(SYS_IO_URING_REGISTER, self.fd, IORING_REGISTER_BUFFERS, ctypes.addressof(array), len(array))

    def unregister_buffers(self) -> None:
        _syscall(SYS_IO_URING_REGISTER, self.fd, IORING_UNREGISTER_BUFFERS, 0, 0)


# -- the PyPI liburing package ----------------------------------------------------------------------

# Run in a child interpreter: set up a ring with the package, complete one NOP, tear it down.
_PROBE = textwrap.dedent("""
    import importlib
    liburing = importlib.import_module("liburing")
    ring = liburing.Ring()
    liburing.io_uring_queue_init(1, ring)
    sqe = liburing.io_uring_get_sqe(ring)
    liburing.io_uring_prep_nop(sqe)
    sqe.user_data = 7
    assert liburing.io_uring_submit(ring) == 1
    cqe = liburing.Cqe()
    liburing.io_uring_wait_cqe(ring, cqe)
    assert cqe[0].user_data == 7 and cqe[0].res == 0
    liburing.io_uring_cqe_seen(ring, cqe[0])
    liburing.io_uring_queue_exit(ring)
    print("usable")
""")


def probe(code: str, timeout: float = 60) -> tuple[bool, str]:
    """Run ``code`` in a child interpreter: ``(True, "")`` if it printed "usable" and exited 0, else
    ``(False, why)``: the signal that killed it, or the last line it wrote to stderr."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"no answer in {timeout:.0f} s"
    if proc.returncode == 0 and proc.stdout.split() == ["usable"]:
        return True, ""
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode)
        return False, f"killed by {sig.name} ({signal.strsignal(sig)})"
    lines = proc.stderr.strip().splitlines()
    return False, lines[-1] if lines else f"exit status {proc.returncode}"


@functools.cache
def liburing_wheel_usable() -> tuple[bool, str]:
    """Whether the ``liburing`` package can set up a ring and complete a NOP here, tried in a child
    interpreter: its 2026.3.30 wheel executes AVX-512 instructions in ``liburing.Ring()``, which kill
    the process on an x86-64 CPU without them.  ``(True, "")`` or ``(False, reason)``; the verdict is
    cached for the process.  Import liburing in-process only after a True."""
    usable, why = probe(_PROBE)
    if usable:
        return True, ""
    if why.startswith("killed by"):
        return False, f"liburing wheel dies on this CPU: {why}"
    return False, f"liburing wheel unusable: {why}"
