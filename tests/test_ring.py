"""arenalib.Ring: io_uring requests over segments, pool buffers and any buffer, with the memory they
target pinned while they are in flight.

The pinning tests make the kernel write late: a read from a pipe stays in flight until the test
writes into the pipe, after the release attempts.  The state machine at the end checks, by content,
that no completion ever lands in a buffer released meanwhile (a released pool buffer is acquired again
and filled with a canary that must survive)."""

from __future__ import annotations

import errno
import gc
import mmap
import os
import signal
import socket
import sys
import threading
import time

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import assert_ok, run_python

import arenalib
from arenalib import Arena, ArenaClosedError, BufferPool, ConfinedArena, Ring, WrongThreadError, check

try:
    Ring(1).close()
except OSError as exc:  # ENOSYS, EPERM: a kernel or sandbox without io_uring
    pytest.skip(f"io_uring is not available here: {exc}", allow_module_level=True)


@pytest.fixture
def ring():
    with Ring(8) as r:
        yield r


@pytest.fixture
def data_file(tmp_path):
    data = os.urandom(256 * 1024)
    path = tmp_path / "data"
    path.write_bytes(data)
    return path, data


def one(ring, n=1):
    """The completions of ``n`` requests, submitted and waited for, as a dict user_data -> result."""
    done = {}
    while len(done) < n:
        done.update(ring.wait(1))
    return done


# -- reading and writing ---------------------------------------------------------------------------


def test_read_into_a_segment_and_a_bytearray_equals_the_file(ring, data_file):
    path, data = data_file
    with Arena() as arena, open(path, "rb") as f:
        seg = arena.allocate(4096, zero=False)
        ba = bytearray(1000)
        ring.read(f, seg, 8192, user_data="seg")
        ring.read(f.fileno(), ba, Offset(100), user_data="ba")  # any __index__ is an offset
        assert one(ring, 2) == {"seg": 4096, "ba": 1000}
        assert seg.tobytes() == data[8192:8192 + 4096]
        assert ba == data[100:1100]


class Offset:
    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def test_read_at_the_file_position(ring, data_file):
    path, data = data_file
    with open(path, "rb") as f:
        f.seek(12345)
        buf = bytearray(100)
        ring.read(f.fileno(), buf)  # offset -1: the file position, which the read advances
        assert one(ring) == {0: 100}
        assert buf == data[12345:12445]
        assert os.lseek(f.fileno(), 0, os.SEEK_CUR) == 12445


def test_readv_fills_every_buffer_in_order(ring, data_file):
    path, data = data_file
    with Arena() as arena, open(path, "rb") as f:
        segs = [arena.allocate(n, zero=False) for n in (10, 4096, 333)]
        view = memoryview(bytearray(50))
        ring.readv(f, [*segs, view], 7, user_data=1)
        assert one(ring) == {1: 10 + 4096 + 333 + 50}
        got = b"".join(s.tobytes() for s in segs) + view.tobytes()
        assert got == data[7:7 + len(got)]
        view.release()  # (the ring let go of its export when the completion was reaped)


def test_read_fixed_with_a_registered_pool(ring, data_file):
    path, data = data_file
    with BufferPool(65536, 4) as pool, open(path, "rb") as f:
        ring.register_pool(pool)
        segs = [pool.acquire() for _ in range(4)]
        for i, seg in enumerate(segs):
            ring.read_fixed(f, seg, i * 65536, user_data=i)
        assert one(ring, 4) == {i: 65536 for i in range(4)}
        for i, seg in enumerate(segs):
            assert seg.tobytes() == data[i * 65536:(i + 1) * 65536]
        part = segs[1].slice(100, 50)  # a slice names its buffer's registration too
        ring.read_fixed(f, part, 3, user_data="slice")
        assert one(ring) == {"slice": 50}
        assert segs[1][100:150] == data[3:53]
        ring.unregister_pool()


def _open_direct(path):
    try:
        return os.open(path, os.O_RDWR | os.O_DIRECT)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            pytest.skip(f"the file system of {path} refuses O_DIRECT")
        raise


@pytest.mark.parametrize("fixed", [False, True], ids=["read", "read_fixed"])
def test_o_direct_read_with_an_aligned_pool(ring, data_file, fixed):
    path, data = data_file
    fd = _open_direct(path)
    try:
        with BufferPool(65536, 2, align=4096) as pool:
            if fixed:
                ring.register_pool(pool)
            seg = pool.acquire()
            (ring.read_fixed if fixed else ring.read)(fd, seg, 65536, user_data="direct")
            result = one(ring)["direct"]
            if result == -errno.EINVAL:
                pytest.skip("the file system refuses this O_DIRECT read")
            assert check(result) == 65536
            assert seg.tobytes() == data[65536:131072]
            if fixed:
                pool.release(seg)
                ring.unregister_pool()
    finally:
        os.close(fd)


def test_o_direct_read_into_an_unaligned_buffer_fails_with_einval(ring, data_file):
    path, _ = data_file
    fd = _open_direct(path)
    try:
        with BufferPool(8192, 1, align=4096) as pool:
            seg = pool.acquire()
            probe = seg.slice(0, 4096)
            ring.read(fd, probe, 0, user_data="aligned")
            if one(ring)["aligned"] < 0:
                pytest.skip("the file system refuses O_DIRECT reads")
            ring.read(fd, seg.slice(1, 4096), 0, user_data="unaligned")
            result = one(ring)["unaligned"]
            assert result == -errno.EINVAL
            with pytest.raises(OSError) as info:
                check(result)
            assert info.value.errno == errno.EINVAL
    finally:
        os.close(fd)


def test_write_writev_and_write_fixed(ring, tmp_path):
    path = tmp_path / "out"
    with open(path, "wb+") as f, BufferPool(4096, 2) as pool, Arena() as arena:
        a = arena.allocate(100, zero=False).fill(ord("a"))
        ring.write(f, a, 0, user_data="write")
        ring.writev(f, [b"bb", bytearray(b"ccc"), memoryview(b"dddd")], 100, user_data="writev")
        ring.register_pool(pool)
        seg = pool.acquire().fill(ord("e"))
        ring.write_fixed(f, seg.slice(0, 10), 109, user_data="fixed")
        assert one(ring, 3) == {"write": 100, "writev": 9, "fixed": 10}
        assert path.read_bytes() == b"a" * 100 + b"bbcccdddd" + b"e" * 10
        ring.unregister_pool()


def test_recv_and_send_over_a_socketpair(ring):
    left, right = socket.socketpair()
    with left, right, Arena() as arena:
        out = arena.allocate(5, zero=False)
        out[:] = b"hello"
        inbox = arena.allocate(64)
        ring.recv(right, inbox, user_data="recv")  # in flight until the send arrives
        ring.submit()
        ring.send(left, out, user_data="send")
        assert one(ring, 2) == {"send": 5, "recv": 5}
        assert inbox[:5] == b"hello"
        left.sendall(b"more")
        ring.recv(right.fileno(), inbox, flags=socket.MSG_PEEK, user_data="peek")
        assert one(ring) == {"peek": 4}
        assert right.recv(10) == b"more"  # MSG_PEEK left it there
        # Flags as socket.recv() takes them: any object with __index__ (an IntFlag, a NumPy integer)
        left.sendall(b"again")
        ring.recv(right, inbox, flags=Index(int(socket.MSG_PEEK)), user_data="index")
        assert one(ring) == {"index": 5}
        with pytest.raises(TypeError):
            ring.recv(right, inbox, flags=1.0)
        assert right.recv(10) == b"again"


class Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_nop_and_user_data_come_back_as_given(ring):
    token = object()
    ring.nop(user_data=token)
    ring.nop()
    got = ring.wait(2)
    assert sorted(got, key=lambda pair: pair[0] is token) == [(0, 0), (token, 0)]
    assert got[0][0] is token or got[1][0] is token


@pytest.mark.parametrize("flags", ["SQPOLL", "COOP_TASKRUN", "COOP_TASKRUN TASKRUN_FLAG", "CLAMP"])
def test_setup_flags(flags, pipe):
    r, w = pipe
    value = 0
    for name in flags.split():
        value |= getattr(arenalib._ring, f"SETUP_{name}")
    with Ring(4, flags=value) as ring, Arena() as arena:
        assert set(flags.split()) <= set(ring.features()["setup_flags"])
        seg = arena.allocate(8)
        ring.read(r, seg, user_data="pipe")
        for i in range(6):
            ring.nop(user_data=i)
        assert sorted(ring.wait(6)) == [(i, 0) for i in range(6)]
        os.write(w, b"abc")
        assert ring.wait(1) == [("pipe", 3)]
        assert seg[:3] == b"abc"


def test_a_full_submission_queue_is_submitted_first():
    with Ring(2) as ring:
        assert ring.sq_entries == 2 and ring.cq_entries == 4
        for i in range(4):  # twice the submission queue: the third nop submits the first two
            ring.nop(user_data=i)
        assert sorted(one(ring, 4).items()) == [(i, 0) for i in range(4)]


def test_at_most_cq_entries_requests_are_outstanding():
    with Ring(1) as ring:
        ring.nop(user_data=1)
        ring.nop(user_data=2)
        with pytest.raises(OSError) as info:
            ring.nop(user_data=3)
        assert info.value.errno == errno.EBUSY
        assert ring.in_flight == 2
        assert sorted(ring.wait(2)) == [(1, 0), (2, 0)]
        ring.nop(user_data=3)
        assert ring.wait(1) == [(3, 0)]


def test_wait_refuses_to_wait_for_more_than_can_come(ring):
    with pytest.raises(ValueError):
        ring.wait(1)
    ring.nop()
    with pytest.raises(ValueError):
        ring.wait(2)
    with pytest.raises(ValueError):
        ring.wait(-1)
    assert ring.wait(1) == [(0, 0)]
    assert ring.wait(0) == []


def test_wait_releases_the_gil(ring, pipe):
    r, w = pipe
    # The writer can run only while wait() has let go of the GIL: otherwise this would never end.
    writer = threading.Thread(target=lambda: (time.sleep(0.05), os.write(w, b"from a thread")))
    ring.read(r, bytearray(64), user_data="threaded")
    writer.start()
    assert ring.wait(1) == [("threaded", 13)]
    writer.join()


def test_a_signal_handler_that_raises_interrupts_wait_and_loses_nothing(ring, pipe):
    r, w = pipe

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        ring.read(r, bytearray(8), user_data="interrupted")
        ring.nop(user_data="done")
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            ring.wait(2)  # the nop completes, the read waits for data that comes too late
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    os.write(w, b"late")
    assert dict(ring.wait(2)) == {"done": 0, "interrupted": 4}


# -- errors ----------------------------------------------------------------------------------------


def test_errors_come_back_as_results_and_check_raises_them(ring):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    ring.read(r, bytearray(10), user_data="closed fd")
    assert one(ring) == {"closed fd": -errno.EBADF}
    with pytest.raises(OSError) as info:
        check(-errno.EBADF)
    assert info.value.errno == errno.EBADF
    assert info.value.strerror == os.strerror(errno.EBADF)
    with pytest.raises(FileNotFoundError):
        check(-errno.ENOENT)
    with pytest.raises(BlockingIOError):
        check(-errno.EAGAIN)
    assert check(0) == 0 and check(7) == 7
    with pytest.raises(TypeError):
        check(2.7)  # not an int (it came back unchanged), as os.strerror(2.7) refuses it
    assert check(True) == 1  # an int, as os.strerror(True) takes it


def test_the_setup_flags_and_received_fields_are_public_and_documented():
    assert arenalib.SETUP_CLAMP == arenalib._ring.SETUP_CLAMP and "READ" in arenalib.OPCODES
    assert "SETUP_SQPOLL" in arenalib.__all__ and "arenalib.SETUP_" in arenalib.Ring.__doc__
    for name in ("segment", "result", "more"):
        assert getattr(arenalib.Received, name).__doc__


def test_bad_arguments_raise_before_anything_is_queued(ring):
    with pytest.raises(TypeError):
        ring.read(0, b"read-only")  # a read needs a writable buffer
    with pytest.raises(TypeError):
        ring.write(0, 42)
    for offset in (-2, -(1 << 63), -(1 << 64), 1 << 63, 1 << 64):  # int64 and beyond, both ways
        with pytest.raises(ValueError):
            ring.read(0, bytearray(1), offset)
    with pytest.raises(TypeError):
        ring.read(0, bytearray(1), 1.0)
    with pytest.raises(TypeError):
        ring.read("not a file", bytearray(1))
    with pytest.raises(ValueError):
        ring.readv(0, [bytearray(1)] * 1025)
    for single in (bytearray(4), b"abc"):  # one buffer, not a sequence of them: it said "not int"
        with pytest.raises(TypeError, match=r"takes a sequence of buffers, not one .*: pass \[buffer\]"):
            (ring.readv if type(single) is bytearray else ring.writev)(0, single)
    with pytest.raises(ValueError):
        Ring(0)
    with pytest.raises(ValueError):
        Ring(8, flags=1 << 30)
    assert ring.in_flight == 0


@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_file_object_is_held_until_its_request_completes(ring, tmp_path):
    """A request on a file object kept only its fd number: the object collected before the
    request was submitted closed the fd, and the next open took the number, so the read read
    (and a write wrote) another file."""
    (tmp_path / "mine").write_bytes(b"mine" * 4)
    (tmp_path / "other").write_bytes(b"OTHER" * 4)
    into = bytearray(4)
    ring.read(open(tmp_path / "mine", "rb"), into, 0, user_data="read")
    ring.write(open(tmp_path / "out", "wb"), b"data", 0, user_data="write")
    gc.collect()
    with open(tmp_path / "other", "rb") as other, open(tmp_path / "other", "r+b") as another:
        assert one(ring, 2) == {"read": 4, "write": 4}
        assert other.read() == another.read() == b"OTHER" * 4
    assert into == b"mine" and (tmp_path / "out").read_bytes() == b"data"


class _NumberTaker:
    """Code a request's other arguments run (an __index__, an __iter__, a __buffer__): it closes the
    request's file and puts another file, or another connection, at the same descriptor number."""

    def __init__(self, victim, replacement_fd):
        self.victim, self.replacement_fd = victim, replacement_fd

    def take(self):
        number = self.victim.fileno()
        self.victim.close()
        os.dup2(self.replacement_fd, number)  # what the next open() would be given
        self.taken = number

    def __index__(self):
        self.take()
        return 0

    def __iter__(self):
        self.take()
        return iter([bytearray(8)])


class _NumberTakingBuffer(_NumberTaker):
    def __buffer__(self, flags):  # (from Python 3.12)
        self.take()
        return memoryview(b"not yours")


@pytest.mark.parametrize("op", ["read", "write", "readv", "read_fixed", "write_fixed", pytest.param(
    "write_buffer", marks=pytest.mark.skipif(sys.version_info < (3, 12), reason="__buffer__ is 3.12's"))])
def test_code_run_by_a_request_s_arguments_cannot_hand_it_another_file(ring, tmp_path, op):
    """The descriptor was read first, and an __index__ or __iter__ run after it could close the
    file and open another under the same number: the request read or wrote that other file."""
    (tmp_path / "mine").write_bytes(b"mine" * 4)
    (tmp_path / "other").write_bytes(b"OTHER" * 4)
    mine = open(tmp_path / "mine", "r+b")
    other = os.open(tmp_path / "other", os.O_RDWR)
    taker = (_NumberTakingBuffer if op == "write_buffer" else _NumberTaker)(mine, other)
    with BufferPool(4096, 1) as pool:
        if op.endswith("_fixed"):
            ring.register_pool(pool)
        seg = pool.acquire()
        calls = {"read": lambda: ring.read(mine, seg, taker),
                 "write": lambda: ring.write(mine, b"not yours", taker),
                 "readv": lambda: ring.readv(mine, taker, 0),
                 "write_buffer": lambda: ring.write(mine, taker, 0),
                 "read_fixed": lambda: ring.read_fixed(mine, seg, taker),
                 "write_fixed": lambda: ring.write_fixed(mine, seg, taker)}
        try:
            with pytest.raises(ValueError, match="closed file"):
                calls[op]()
            assert ring.in_flight == 0 and ring.wait(0) == []
            assert seg.exports == 0
            assert (tmp_path / "other").read_bytes() == b"OTHER" * 4
            assert (tmp_path / "mine").read_bytes() == b"mine" * 4
        finally:
            os.close(taker.taken)
            os.close(other)
            pool.release(seg)
            if op.endswith("_fixed"):
                ring.unregister_pool()


@pytest.mark.parametrize("op", ["recv", "send"])  # recv_multishot: test_ring_provided.py
def test_code_run_by_a_request_s_arguments_cannot_hand_it_another_connection(ring, op):
    mine, mine_peer = socket.socketpair()
    other, other_peer = socket.socketpair()
    taker = _NumberTaker(mine, other.fileno())
    other_peer.sendall(b"for the other connection only")
    try:
        with pytest.raises(ValueError, match="negative"):  # (a closed socket's fileno() is -1)
            if op == "recv":
                ring.recv(mine, bytearray(64), flags=taker)
            else:
                ring.send(mine, b"not yours", flags=taker)
        assert ring.in_flight == 0 and ring.wait(0) == []
        assert other.recv(64) == b"for the other connection only"  # nobody took them
        other_peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            other_peer.recv(64)  # and nothing was sent on it
    finally:
        os.close(taker.taken)
        for s in (mine_peer, other, other_peer):
            s.close()


def test_fixed_requests_take_a_live_segment_of_the_registered_pool(ring):
    with BufferPool(4096, 2) as pool, BufferPool(4096, 1) as other, Arena() as arena:
        seg = pool.acquire()
        with pytest.raises(ValueError, match="register_pool"):
            ring.read_fixed(0, seg)
        ring.register_pool(pool)
        with pytest.raises(TypeError):
            ring.read_fixed(0, bytearray(10))
        with pytest.raises(TypeError):
            ring.read_fixed(0, 0)  # never a bare index
        with pytest.raises(ValueError):
            ring.read_fixed(0, other.acquire())
        with pytest.raises(ValueError):
            ring.read_fixed(0, arena.allocate(10))
        with pytest.raises(ValueError):
            ring.register_pool(other)  # one pool per ring
        pool.release(seg)
        with pytest.raises(ArenaClosedError):
            ring.read_fixed(0, seg)
        assert ring.in_flight == 0
        assert seg.exports == 0
        ring.unregister_pool()


def test_registration_pins_the_pool(ring):
    pool = BufferPool(4096, 2)
    seg = pool.acquire()
    ring.register_pool(pool)
    assert ring.pool is pool
    for attempt in (pool.close, pool.reset):
        with pytest.raises(BufferError, match="registered"):
            attempt()
    assert not pool.closed and seg.alive
    pool.release(seg)  # releasing a buffer is fine: only requests in flight pin segments
    ring.unregister_pool()
    assert ring.pool is None
    pool.reset()
    ring.register_pool(pool)
    ring.close()  # closing the ring unregisters too
    pool.close()
    with Ring(1) as other, pytest.raises(ArenaClosedError):
        other.register_pool(pool)


def test_a_registration_the_kernel_refuses_leaves_the_pool_free(ring):
    with BufferPool(1, 16385, align=1) as pool:  # more buffers than io_uring registers (16384)
        with pytest.raises(OSError) as info:
            ring.register_pool(pool)
        assert info.value.errno == errno.EINVAL
        assert ring.pool is None
        pool.reset()  # not pinned


def test_unregister_reaps_completed_fixed_requests_first(ring, pipe):
    _, w = pipe
    pool = BufferPool(64, 1)
    ring.register_pool(pool)
    seg = pool.acquire().fill(ord("z"))
    ring.write_fixed(w, seg.slice(0, 3), user_data="done already")
    ring.submit()  # a pipe write completes at once; its completion waits in the queue
    ring.unregister_pool()
    assert ring.wait(1) == [("done already", 3)]
    pool.release(seg)
    pool.close()


def test_a_confined_segment_of_another_thread_is_refused(ring):
    made, used = threading.Event(), threading.Event()
    holder = {}

    def owner():
        with ConfinedArena() as arena:
            holder["seg"] = arena.allocate(8)
            made.set()
            used.wait()

    thread = threading.Thread(target=owner)
    thread.start()
    made.wait()
    try:
        with pytest.raises(WrongThreadError):
            ring.read(0, holder["seg"])  # the segment's own rule, at the buffer acquisition
        assert ring.in_flight == 0
    finally:
        used.set()
        thread.join()


def test_a_ring_is_used_by_its_creating_thread_only(ring):
    errors = []

    def other():
        for call in (ring.nop, ring.submit, ring.close, lambda: ring.wait(0)):
            try:
                call()
            except WrongThreadError as exc:
                errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 4
    assert ring.in_flight == 0 and not ring.closed


def test_a_fork_child_cannot_use_its_parents_ring():
    out = assert_ok(run_python("""
        import os, warnings
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
        from arenalib import Arena, Ring
        ring = Ring(4)
        arena = Arena()
        seg = arena.allocate(10)
        r, w = os.pipe()
        ring.read(r, seg, user_data="parent")
        ring.submit()
        pid = os.fork()
        if pid == 0:
            try:
                ring.nop()
            except RuntimeError as exc:
                print("child:", "fork child" in str(exc))
            ring.close()  # lets go of the child's copy of the pins
            seg.free()
            print("child freed", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        os.write(w, b"parent!")
        print("parent:", ring.wait(1), seg[:7])
        ring.close()
        arena.close()
    """))
    assert out.splitlines() == ["child: True", "child freed", "parent: [('parent', 7)] b'parent!'"]


# -- pinning ---------------------------------------------------------------------------------------


def _refused(*attempts):
    for attempt in attempts:
        with pytest.raises(BufferError):
            attempt()


@pytest.mark.parametrize("kind", [Arena, ConfinedArena])
def test_a_read_in_flight_pins_an_arena_segment(ring, pipe, kind):
    r, w = pipe
    arena = kind()
    seg = arena.allocate(16).fill(ord("."))
    ring.read(r, seg, user_data="late")
    ring.submit()
    assert ring.wait(0) == []  # nothing in the pipe yet: still in flight
    assert seg.exports == 1
    _refused(seg.free, arena.reset, arena.close)
    assert seg.alive and not arena.closed
    os.write(w, b"arrived late")
    assert one(ring) == {"late": 12}
    assert seg.tobytes() == b"arrived late...."  # the kernel wrote into the segment, still ours
    assert seg.exports == 0
    seg.free()
    arena.close()


def test_a_read_in_flight_pins_a_pool_segment(ring, pipe):
    r, w = pipe
    pool = BufferPool(64, 2)
    seg = pool.acquire().fill(0)
    ring.read(r, seg, user_data="late")
    ring.submit()
    _refused(lambda: pool.release(seg), seg.free, pool.reset, pool.close)
    assert seg.alive and pool.available == 1
    os.write(w, b"x" * 10)
    assert one(ring) == {"late": 10}
    assert seg[:11] == b"x" * 10 + b"\0"
    pool.release(seg)
    pool.close()


def test_a_fixed_read_in_flight_pins_its_segment_and_the_registration(ring, pipe):
    r, w = pipe
    pool = BufferPool(64, 2)
    ring.register_pool(pool)
    seg = pool.acquire().fill(0)
    ring.read_fixed(r, seg, user_data="fixed")
    ring.submit()
    _refused(lambda: pool.release(seg), pool.reset, pool.close, ring.unregister_pool)
    assert ring.pool is pool
    os.write(w, b"fixed data")
    assert one(ring) == {"fixed": 10}
    assert seg[:10] == b"fixed data"
    ring.unregister_pool()
    pool.release(seg)
    pool.close()


def test_a_bytearray_in_flight_cannot_be_resized(ring, pipe):
    r, w = pipe
    buf = bytearray(8)
    ring.read(r, buf, user_data=1)
    ring.submit()
    with pytest.raises(BufferError):
        buf.extend(b"more")
    os.write(w, b"abc")
    assert one(ring) == {1: 3}
    buf.extend(b"more")
    assert buf == b"abc\0\0\0\0\0more"


def test_close_cancels_what_is_in_flight_and_unpins(pipe):
    r, w = pipe
    ring = Ring(4)
    pool = BufferPool(64, 2)
    ring.register_pool(pool)
    with Arena() as arena:
        seg = arena.allocate(16).fill(1)
        fixed = pool.acquire().fill(2)
        ring.read(r, seg, user_data="a")
        ring.read_fixed(r, fixed, user_data="b")
        ring.submit()
        ring.nop(user_data="queued, never submitted")
        ring.close()
        assert ring.closed and ring.in_flight == 0 and ring.pool is None
        assert seg.exports == 0 and fixed.exports == 0
        seg.free()
        pool.release(fixed)
        pool.close()
        os.write(w, b"after close")
        assert os.read(r, 100) == b"after close"  # no cancelled read took it
    with pytest.raises(ValueError, match="closed"):
        ring.nop()
    ring.close()  # idempotent



def test_every_call_of_a_closed_ring_raises_arena_closed_error(pipe):
    r, w = pipe
    a, b = socket.socketpair()
    pool = BufferPool(64, 2)
    seg = pool.acquire()
    buf = bytearray(8)
    ring = Ring(4)
    ring.close()
    # Arguments a live ring would take: what is refused is the closed ring, after the conversions.
    calls = {
        "nop": lambda: ring.nop(),
        "read": lambda: ring.read(r, buf),
        "write": lambda: ring.write(w, b"x"),
        "readv": lambda: ring.readv(r, [buf]),
        "writev": lambda: ring.writev(w, [b"x"]),
        "read_fixed": lambda: ring.read_fixed(r, seg),
        "write_fixed": lambda: ring.write_fixed(w, seg),
        "recv": lambda: ring.recv(a, buf),
        "send": lambda: ring.send(a, b"x"),
        "submit": lambda: ring.submit(),
        "wait": lambda: ring.wait(0),
        "register_pool": lambda: ring.register_pool(pool),
        "unregister_pool": lambda: ring.unregister_pool(),
        "provide": lambda: ring.provide(pool, 1),
        "withdraw": lambda: ring.withdraw(1),
        "recv_multishot": lambda: ring.recv_multishot(a, 1),
        "features": lambda: ring.features(),
        "__enter__": lambda: ring.__enter__(),
    }
    # Every public method but close() (idempotent): one added later must be added here.
    public = {name for name in dir(Ring) if not name.startswith("_") and callable(getattr(Ring, name))}
    assert public - {"close"} == set(calls) - {"__enter__"}
    for name, call in calls.items():
        with pytest.raises(ArenaClosedError, match="closed") as caught:
            call()
        assert isinstance(caught.value, ValueError), name  # old `except ValueError` still catches it
    with pytest.raises(ArenaClosedError):
        with ring:
            pass
    # Nothing was pinned on the way: the buffers are free to go.
    assert seg.exports == 0
    buf.extend(b"resizable")
    pool.release(seg)
    pool.close()
    a.close()
    b.close()
    ring.close()  # still idempotent
    assert ring.closed and ring.in_flight == 0 and ring.pool is None


CLOSE_WITH_A_FULL_QUEUE = """
    import os, sys
    import arenalib._ring
    from arenalib import Arena, BufferPool, Ring
    arenalib._ring._use_per_request_cancel(sys.argv[1] == "per-request")
    r, w = os.pipe()
    pool = BufferPool(64, 4)
    with Arena() as arena:
        ring = Ring(2)  # 2 submission slots for 4 requests: the cancels go in turns
        assert ring.sq_entries == 2 and ring.cq_entries == 4
        ring.register_pool(pool)
        segs = [arena.allocate(16).fill(1), arena.allocate(16).fill(2)]
        fixed = [pool.acquire().fill(3), pool.acquire().fill(4)]
        ring.read(r, segs[0], user_data="a")
        ring.read_fixed(r, fixed[0], user_data="b")
        ring.submit()
        os.write(w, b"xyz")          # one read completes: its completion waits unreaped
        ring.read(r, segs[1], user_data="c")
        ring.read_fixed(r, fixed[1], user_data="d")
        ring.submit()
        ring.close()
        assert ring.in_flight == 0 and all(seg.exports == 0 for seg in segs + fixed)
        for seg in segs:
            seg.free()
        for seg in fixed:
            pool.release(seg)
        pool.close()
        os.write(w, b"after close")
        assert os.read(r, 100) == b"after close"  # no cancelled read took it
    print("closed")
"""


@pytest.mark.parametrize("how", ["cancel-any", "per-request"])
def test_close_cancels_more_requests_than_the_submission_queue_holds(how):
    """close() with four reads in flight (one completed, not reaped) and two submission slots, by
    CANCEL_ANY and by the per-request fallback of kernels before 5.19; in a child, so that a close
    that never returns fails the test instead of hanging it."""
    assert assert_ok(run_python(CLOSE_WITH_A_FULL_QUEUE, how, timeout=60)).strip() == "closed"


CLOSE_SQPOLL_RINGS = """
    import errno, os, sys
    import arenalib._ring
    from arenalib import Ring
    from arenalib._ring import SETUP_SQPOLL
    arenalib._ring._use_per_request_cancel(sys.argv[1] == "per-request")
    r, w = os.pipe()
    try:
        Ring(2, flags=SETUP_SQPOLL).close()
    except PermissionError:
        print("no SQPOLL for this user"); sys.exit()
    for entries in (2, 2, 2, 2, 2, 2, 2, 2, 8, 64):
        ring = Ring(entries, flags=SETUP_SQPOLL)
        bufs = [bytearray(16) for _ in range(ring.cq_entries)]
        for i, buf in enumerate(bufs):  # more than the submission queue holds: queued in turns
            ring.read(r, buf, user_data=i)
        ring.submit()
        ring.close()                    # right away: the polling thread may not have taken them yet
        assert ring.in_flight == 0
        bufs[0].extend(b"resizable again")
    os.write(w, b"after close")
    assert os.read(r, 100) == b"after close"
    print("closed")
"""


@pytest.mark.parametrize("how", ["cancel-any", "per-request"])
def test_close_of_an_sqpoll_ring_with_a_full_queue_returns(how):
    """With SETUP_SQPOLL, submitting hands the queue to the kernel's polling thread, which takes the
    entries later: a full queue right after submit() has no room for close()'s cancels until it
    does (close() used to wait for completions then, and a read from a silent pipe never comes)."""
    out = assert_ok(run_python(CLOSE_SQPOLL_RINGS, how, timeout=60)).strip()
    if out == "no SQPOLL for this user":
        pytest.skip(out)
    assert out == "closed"


WAIT_WITH_A_FINALIZER_SEARCHING_LISTS = """
    import gc
    from arenalib import Ring
    N = 64
    armed = False

    class Trap:
        def __init__(self):
            self.cycle = self          # cyclic garbage: only the collector frees it, running __del__
        def __del__(self):
            if armed:                  # every list of N items, each item read (a NULL one crashes)
                for o in gc.get_objects():
                    if type(o) is list and len(o) == N:
                        for item in o:
                            type(item)

    ring = Ring(N)
    for i in range(N):
        ring.nop(user_data=i)
    ring.submit()
    hold = [(i, i) for i in range(5000)]   # no free 2-tuples left: each new one is a GC allocation
    traps = [Trap() for _ in range(50)]
    del traps
    gc.set_threshold(1)
    armed = True
    done = ring.wait(N)
    armed = False
    gc.set_threshold(700)
    assert sorted(done) == [(i, 0) for i in range(N)]
    print("ok")
"""


def test_wait_builds_its_list_whole_for_finalizers_run_meanwhile():
    """The collector may run while wait() makes its result tuples, and a finalizer may find the
    result list through gc.get_objects(): every item of it must already be an object."""
    assert assert_ok(run_python(WAIT_WITH_A_FINALIZER_SEARCHING_LISTS)).strip() == "ok"


def test_a_ring_collected_with_requests_in_flight_cancels_them(pipe):
    r, w = pipe
    arena = Arena()
    seg = arena.allocate(16).fill(1)
    ring = Ring(4)
    ring.read(r, seg, user_data="orphan")
    ring.readv(r, [bytearray(4), arena.allocate(4)])
    ring.submit()
    with pytest.warns(ResourceWarning, match="unclosed"):
        del ring
        gc.collect()
    assert seg.exports == 0
    arena.close()
    os.write(w, b"later")
    assert os.read(r, 100) == b"later"


def test_user_data_referring_to_the_ring_is_let_go_at_close(pipe):
    r, _ = pipe
    arena = Arena()
    seg = arena.allocate(16)
    ring = Ring(2)
    holder = [ring]
    ring.read(r, seg, user_data=holder)  # ring -> its request table -> holder -> ring
    ring.submit()
    ring.close()  # cancels, drops the table: the cycle is gone
    assert holder[0] is ring
    del ring, holder
    gc.collect()
    arena.close()


def test_an_mmap_in_flight_cannot_be_closed(ring, pipe):
    r, w = pipe
    m = mmap.mmap(-1, 4096)
    ring.read(r, m, user_data="map")
    ring.submit()
    with pytest.raises(BufferError):
        m.close()
    os.write(w, b"mapped")
    assert one(ring) == {"map": 6}
    assert m[:6] == b"mapped"
    m.close()


def test_many_more_requests_than_slots_flow_through(ring, data_file):
    path, data = data_file
    with BufferPool(4096, 8) as pool, open(path, "rb") as f:
        ring.register_pool(pool)
        segs = [pool.acquire() for _ in range(8)]
        offsets = list(range(0, len(data), 4096)) * 4  # 256 reads through 16 completion slots
        done = 0
        while offsets or ring.in_flight:
            for seg in [s for s in segs if s.exports == 0]:  # one request per buffer at a time
                if offsets:
                    offset = offsets.pop()
                    read = ring.read_fixed if offset % 8192 else ring.read
                    read(f, seg, offset, user_data=(seg, offset))
            for (seg, offset), result in ring.wait(1):
                assert result == 4096 and seg.tobytes() == data[offset:offset + 4096]
                done += 1
        assert done == 4 * len(data) // 4096
        ring.unregister_pool()


def test_a_finalizer_run_by_a_released_pin_cannot_reenter_the_ring(ring, pipe):
    _, w = pipe
    seen = []

    class Doomed(bytearray):
        def __del__(self):
            try:
                ring.nop()
            except RuntimeError as exc:
                seen.append(str(exc))

    ring.write(w, Doomed(b"abcd"), user_data="w")  # the ring's export is the last reference
    assert ring.wait(1) == [("w", 4)]
    assert len(seen) == 1 and "finalizer" in seen[0]
    assert ring.in_flight == 0
    ring.nop(user_data="after")  # usable again once wait() is done
    assert ring.wait(1) == [("after", 0)]


def test_features_report_the_kernel(ring):
    report = ring.features()
    assert {"NOP", "READ", "WRITE", "READV", "READ_FIXED", "RECV", "SEND", "ASYNC_CANCEL"} <= set(
        report["opcodes"])
    assert "NODROP" in report["features"]
    assert "CQSIZE" in report["setup_flags"]
    assert report["cq_entries"] == 2 * report["sq_entries"]


def test_the_ring_is_exported_from_the_package():
    assert arenalib.Ring is Ring and arenalib.check is check
    assert "Ring" in arenalib.__all__ and "check" in arenalib.__all__


# -- the state machine -----------------------------------------------------------------------------

CANARY = 0xCC


class RingMachine(RuleBasedStateMachine):
    """Reads from pipes into pool buffers (plain or fixed) and arena segments, fed late, against
    release / free / reset of what they target and close of the ring: memory in flight refuses to go;
    memory released is handed out again (the pool's buffer, jemalloc's block) and filled with a
    canary, which no later completion may touch; every completion lands in its own buffer with the
    data its pipe was fed."""

    def __init__(self):
        super().__init__()
        self.pool = BufferPool(32, 4)
        self.arena = Arena()
        self.ring = Ring(4)
        self.ring.register_pool(self.pool)
        self.held = {}  # id(seg) -> [seg, expected bytes, or a set of possible ones after a close]
        self.flight = {}  # request number -> (seg, read end, write end, data fed or None)
        self.number = 0

    def _busy(self):
        return {id(entry[0]) for entry in self.flight.values()}

    def _idle(self):
        busy = self._busy()
        return [key for key in self.held if key not in busy]

    def _from_pool(self, seg):
        return seg.arena is self.pool

    def _keep(self, seg):
        self.held[id(seg)] = [seg.fill(CANARY), bytes([CANARY]) * 32]

    @precondition(lambda self: sum(self._from_pool(e[0]) for e in self.held.values()) < 4)
    @rule()
    def acquire(self):
        self._keep(self.pool.acquire())

    @precondition(lambda self: len(self.held) < 8)
    @rule()
    def allocate(self):
        self._keep(self.arena.allocate(32, zero=False))

    @precondition(lambda self: self._idle() and len(self.flight) < 4)
    @rule(pick=st.integers(0, 7), fixed=st.booleans())
    def start_read(self, pick, fixed):
        key = self._idle()[pick % len(self._idle())]
        seg = self.held[key][0]
        r, w = os.pipe()
        self.number += 1
        fixed = fixed and self._from_pool(seg)
        (self.ring.read_fixed if fixed else self.ring.read)(r, seg, user_data=self.number)
        self.ring.submit()
        self.flight[self.number] = (seg, r, w, None)

    @precondition(lambda self: any(entry[3] is None for entry in self.flight.values()))
    @rule(pick=st.integers(0, 3), data=st.binary(min_size=1, max_size=32))
    def feed(self, pick, data):
        waiting = [n for n, entry in self.flight.items() if entry[3] is None]
        n = waiting[pick % len(waiting)]
        seg, r, w, _ = self.flight[n]
        os.write(w, data)
        self.flight[n] = (seg, r, w, data)

    @precondition(lambda self: any(entry[3] is not None for entry in self.flight.values()))
    @rule()
    def reap(self):
        for number, result in self.ring.wait(1):
            seg, r, w, data = self.flight.pop(number)
            os.close(r)
            os.close(w)
            assert result == len(data)
            entry = self.held[id(seg)]
            entry[1] = data + entry[1][len(data):]
            assert seg.tobytes() == entry[1]

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 7), via_free=st.booleans())
    def release(self, pick, via_free):
        keys = list(self.held)
        key = keys[pick % len(keys)]
        seg = self.held[key][0]
        give_back = seg.free if via_free or not self._from_pool(seg) else lambda: self.pool.release(seg)
        if key in self._busy():
            with pytest.raises(BufferError):
                give_back()
            assert seg.alive
            return
        give_back()
        del self.held[key]

    @rule()
    def reset_arena(self):
        in_flight = any(not self._from_pool(entry[0]) for entry in self.flight.values())
        if in_flight:
            with pytest.raises(BufferError):
                self.arena.reset()
            return
        self.arena.reset()
        self.held = {key: entry for key, entry in self.held.items() if self._from_pool(entry[0])}

    @rule()
    def close_ring(self):
        self.ring.close()
        for seg, r, w, data in self.flight.values():
            os.close(r)
            os.close(w)
            entry = self.held[id(seg)]
            if data is not None:  # fed: it may have completed before the cancel
                entry[1] = {entry[1], data + entry[1][len(data):]}
        self.flight.clear()
        self.ring = Ring(4)
        self.ring.register_pool(self.pool)

    @invariant()
    def idle_buffers_hold_what_they_should(self):
        for key in self._idle():
            seg, expected = self.held[key]
            content = seg.tobytes()
            if isinstance(expected, set):
                assert content in expected
                self.held[key][1] = content
            else:
                assert content == expected

    def teardown(self):
        self.ring.close()
        for _, r, w, _ in self.flight.values():
            os.close(r)
            os.close(w)
        self.pool.close()
        self.arena.close()


TestRingMachine = RingMachine.TestCase
