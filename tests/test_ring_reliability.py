"""arenalib.Ring under attack (issue 23): a fork from Python code the ring runs mid-operation, a send
whose pages the kernel reads after its completion (MSG_ZEROCOPY), a raw view of a pool buffer as a
request's buffer, and reference cycles through the ring's request table.

Whatever can crash or hang the interpreter (a fork child that touches the parent's unmapped ring)
runs in a child interpreter with a timeout (support.run_python): a failure is a failed test with the
child's output, never a dead session."""

from __future__ import annotations

import gc
import os
import socket
import sys

import pytest
from support import assert_ok, run_python

from arenalib import Arena, BufferPool, Ring

try:
    Ring(1).close()
except OSError as exc:  # ENOSYS, EPERM: a kernel or sandbox without io_uring
    pytest.skip(f"io_uring is not available here: {exc}", allow_module_level=True)

# Linux's values (the socket module names neither).
MSG_ZEROCOPY = 0x4000000
SO_ZEROCOPY = 60


def ring_fd(ring) -> int:
    """The ring's descriptor, as its repr shows it."""
    return int(repr(ring).rsplit("fd ", 1)[1].rstrip(">"))


def is_io_uring(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[io_uring]"
    except OSError:
        return False


# -- a fork from Python code run mid-operation (item 3) --------------------------------------------
#
# The ring's memory is MADV_DONTFORK: a fork child that goes on with the parent's wait(), close() or
# unregister_pool() and touches the ring's queues dies with SIGSEGV.  Each scenario forks in Python
# code the ring itself runs (a signal handler run by wait(), a finalizer run by releasing a pin); the
# child must get the documented RuntimeError (or, in close(), the fork child's close), and exit 0.

FORK_PRELUDE = """
import ctypes, gc, os, signal, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
from arenalib import Arena, BufferPool, Ring
PARENT = os.getpid()
children = []
libc = ctypes.CDLL(None)

def in_child():
    return os.getpid() != PARENT

def fork_here():
    pid = os.fork()
    if pid:
        children.append(pid)
    else:  # PR_SET_PDEATHSIG: a child that hangs dies with its parent, killed by the timeout
        libc.prctl(1, signal.SIGKILL)
    return pid

def child_status():
    [pid] = children
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

class Doomed(bytearray):
    # The ring's export is its last reference: the release of the pin runs this, and forks.
    def __del__(self):
        fork_here()
"""

FORK_IN_A_SIGNAL_HANDLER_RUN_BY_WAIT = FORK_PRELUDE + """
ring = Ring(4)
arena = Arena()
seg = arena.allocate(16)
r, w = os.pipe()
ring.read(r, seg, user_data="read")   # waits for data that only the parent writes

def handler(signum, frame):
    if fork_here():
        os.write(w, b"parent!")       # the parent's read completes; the child's wait() goes on

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.1)
try:
    done = ring.wait(1)
except RuntimeError as exc:
    assert in_child()
    print("child:", "fork child" in str(exc), flush=True)
    ring.close()
    seg.free()
    print("child: closed, freed", flush=True)
    os._exit(0)
assert not in_child()
print("parent:", done, bytes(seg[:7]), "child exit", child_status(), flush=True)
ring.close()
arena.close()
"""

FORK_IN_A_FINALIZER_RUN_BY_WAIT = FORK_PRELUDE + """
ring = Ring(4)
r, w = os.pipe()
ring.write(w, Doomed(b"abcd"), user_data="write")
try:
    done = ring.wait(1)               # reaps the write, releases its pin: the finalizer forks
except RuntimeError as exc:
    assert in_child()
    print("child:", "fork child" in str(exc), flush=True)
    ring.close()
    print("child: closed", flush=True)
    os._exit(0)
assert not in_child()
print("parent:", done, os.read(r, 10), "child exit", child_status(), flush=True)
ring.close()
"""

FORK_IN_A_FINALIZER_RUN_BY_CLOSE = FORK_PRELUDE + """
import mmap
HOW, WHERE = sys.argv[1:]
maps = []

class Mapper(bytearray):
    def __del__(self):
        if not fork_here():
            # The child maps pages: they land in the holes its unmapped copy of the ring left, which
            # the parent's close would unmap again (io_uring_queue_exit) if it went on in the child.
            maps.extend(mmap.mmap(-1, 4096) for _ in range(64))
            for m in maps:
                m[0] = 1

ring = Ring(8)
arena = Arena()
segs = [arena.allocate(16) for _ in range(4)]
r, w = os.pipe()
doomed = [Mapper(16)]
for i, seg in enumerate(segs):                 # all stay in flight: the pipe stays silent
    if (WHERE == "first" and i == 0) or (WHERE == "last" and i == 3):
        ring.read(r, doomed.pop(), user_data="doomed")
    ring.read(r, seg, user_data=i)
ring.submit()
warnings.simplefilter("ignore", ResourceWarning)
if HOW == "close":
    ring.close()                      # cancels them, reaps them: a release runs the finalizer
else:
    del ring                          # the same, from the collector
    gc.collect()
if in_child():
    assert all(m[0] == 1 for m in maps)  # still mapped
    for seg in segs:
        seg.free()                    # the child's copies of the pins were let go
    print("child: closed, freed", flush=True)
    os._exit(0)
for seg in segs:
    seg.free()
print("parent: closed, freed, child exit", child_status(), flush=True)
arena.close()
"""

FORK_IN_A_FINALIZER_RUN_BY_UNREGISTER = FORK_PRELUDE + """
ring = Ring(4)
pool = BufferPool(4096, 2)
ring.register_pool(pool)
r, w = os.pipe()
ring.write(w, Doomed(b"abcd"), user_data="write")
ring.submit()
while True:                           # the write's completion is in the completion queue
    try:
        ring.unregister_pool()        # reaps it first, releases its pin: the finalizer forks
        break
    except RuntimeError as exc:
        assert in_child()
        print("child:", "fork child" in str(exc), flush=True)
        ring.close()                  # the fork child's close: the parent's registration stays
        print("child: closed", flush=True)
        os._exit(0)
assert not in_child()
status = child_status()
print("parent:", ring.pool is None, ring.wait(1), "child exit", status, flush=True)
ring.close()
pool.close()
"""


def test_a_fork_in_a_signal_handler_run_by_wait_gives_the_child_runtime_error():
    out = assert_ok(run_python(FORK_IN_A_SIGNAL_HANDLER_RUN_BY_WAIT, timeout=60))
    assert sorted(out.splitlines()) == sorted([
        "child: True", "child: closed, freed", "parent: [('read', 7)] b'parent!' child exit 0"])


def test_a_fork_in_a_finalizer_run_by_wait_gives_the_child_runtime_error():
    out = assert_ok(run_python(FORK_IN_A_FINALIZER_RUN_BY_WAIT, timeout=60))
    assert sorted(out.splitlines()) == sorted([
        "child: True", "child: closed", "parent: [('write', 4)] b'abcd' child exit 0"])


@pytest.mark.parametrize("where", ["first", "last"])  # of the requests the close cancels
@pytest.mark.parametrize("how", ["close", "collect"])
def test_a_fork_in_a_finalizer_run_by_close_closes_as_a_fork_child(how, where):
    out = assert_ok(run_python(FORK_IN_A_FINALIZER_RUN_BY_CLOSE, how, where, timeout=60))
    assert sorted(out.splitlines()) == sorted([
        "child: closed, freed", "parent: closed, freed, child exit 0"])


def test_a_fork_in_a_finalizer_run_by_unregister_pool_gives_the_child_runtime_error():
    out = assert_ok(run_python(FORK_IN_A_FINALIZER_RUN_BY_UNREGISTER, timeout=60))
    assert sorted(out.splitlines()) == sorted([
        "child: True", "child: closed", "parent: True [('write', 4)] child exit 0"])


# -- memory the kernel uses after the completion (item 4) ------------------------------------------


def test_send_refuses_msg_zerocopy_before_anything_is_queued():
    # With SO_ZEROCOPY, a MSG_ZEROCOPY send completes while the kernel still reads the pages, until
    # a notification on the socket's error queue: a peer whose window is full would receive the
    # bytes of whoever owns the buffer next.  The ring refuses the flag.
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client, Arena() as arena, \
            Ring(4) as ring:
        peer, _ = server.accept()
        with peer:
            try:
                client.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)
            except OSError:
                pass  # refused whether the socket would do zerocopy or not
            seg = arena.allocate(4096).fill(7)
            for flags in (MSG_ZEROCOPY, MSG_ZEROCOPY | socket.MSG_DONTWAIT):
                with pytest.raises(ValueError, match="MSG_ZEROCOPY"):
                    ring.send(client, seg, flags=flags, user_data="zerocopy")
            assert ring.in_flight == 0 and seg.exports == 0
            ring.send(client, seg, flags=socket.MSG_DONTWAIT, user_data="copied")  # other flags work
            assert ring.wait(1) == [("copied", 4096)]
            assert seg.exports == 0


# -- raw views of a pool's buffers (item 5) --------------------------------------------------------


def _raw_forms(pool):
    raw = pool.raw_views()[0]
    return {"raw view": raw, "memoryview of it": memoryview(raw), "slice": raw[16:32],
            "cast": raw.cast("B", (len(raw),)), "slice of a memoryview": memoryview(raw)[1:][2:]}


@pytest.mark.parametrize("op", ["read", "write", "readv", "writev", "recv", "send"])
def test_a_raw_view_is_refused_as_a_request_buffer(pipe, op):
    r, w = pipe
    left, right = socket.socketpair()
    with left, right, BufferPool(4096, 2) as pool, Ring(4) as ring:
        fd = {"read": r, "write": w, "readv": r, "writev": w, "recv": left, "send": left}[op]
        vector = op in ("readv", "writev")
        for name, view in _raw_forms(pool).items():
            arg = [bytearray(4), view] if vector else view
            with pytest.raises(TypeError, match="raw view") as info:
                getattr(ring, op)(fd, arg, user_data=name)
            assert "acquired Segment" in str(info.value), name
        assert ring.in_flight == 0
        seg = pool.acquire()
        getattr(ring, op)(fd, [seg] if vector else seg, user_data="segment")  # the way
        ring.submit()
        if op in ("read", "readv"):
            os.write(w, b"x")
        elif op == "recv":
            right.send(b"x")
        assert ring.wait(1)[0][0] == "segment"
        assert seg.exports == 0
        pool.release(seg)


def test_a_readv_into_a_raw_view_cannot_land_in_the_next_owner_s_buffer(pipe):
    """The attack: a raw view does not pin its buffer, so it was released and handed on while the
    kernel still had the read; the data landed in the next owner's buffer."""
    r, w = pipe
    with BufferPool(4096, 1) as pool, Ring(4) as ring:
        seg = pool.acquire()
        raw = pool.raw_views()[0]
        with pytest.raises(TypeError, match="raw view"):
            ring.readv(r, [raw], user_data="late")
        ring.submit()
        pool.release(seg)             # allowed: nothing pins it
        owner = pool.acquire().fill(0x5A)
        os.write(w, b"late data")
        assert ring.in_flight == 0
        assert owner.tobytes() == b"\x5a" * 4096
        pool.release(owner)


# -- reference cycles through the request table (item 7) -------------------------------------------


class Reader:
    """A caller that holds its ring and hands it its own bound method as user_data."""

    def __init__(self, ring):
        self.ring = ring

    def on_read(self, result):
        return result


class HeldBuffer(bytearray):
    """A buffer that refers to the ring reading into it."""


def _cycle(kind, ring, r, seg):
    """Queue a request whose user_data (or buffer) refers back to ``ring``."""
    if kind == "bound method":
        ring.read(r, seg, user_data=Reader(ring).on_read)
    elif kind == "tuple":  # a tuple has no tp_clear: only the ring can break this cycle
        ring.read(r, seg, user_data=(ring, "tuple"))
    elif kind == "buffer":
        buf = HeldBuffer(16)
        buf.ring = ring
        ring.readv(r, [seg, buf], user_data="buffer")
    elif kind == "completion":  # reaped, not yet returned by wait()
        pool = BufferPool(4096, 1)
        ring.register_pool(pool)
        ring.nop(user_data=[ring])
        ring.submit()
        ring.unregister_pool()  # reaps the nop into the ring's completions
        pool.close()
        ring.read(r, seg, user_data="plain")
    ring.submit()


@pytest.mark.parametrize("kind", ["bound method", "tuple", "buffer", "completion"])
def test_a_cycle_through_the_request_table_is_collected_like_an_unclosed_ring(pipe, kind):
    r, w = pipe
    arena = Arena()
    seg = arena.allocate(16).fill(1)
    ring = Ring(4)
    fd = ring_fd(ring)
    _cycle(kind, ring, r, seg)
    assert ring.in_flight == 1 and seg.exports == 1 and is_io_uring(fd)
    del ring
    with pytest.warns(ResourceWarning, match="unclosed"):
        gc.collect()
    assert not is_io_uring(fd)        # the ring's descriptor is closed
    assert seg.exports == 0           # its requests were cancelled and reaped, then unpinned
    seg.free()
    arena.close()
    os.write(w, b"later")             # the cancelled read took nothing
    assert os.read(r, 100) == b"later"


def test_the_collector_sees_user_data_and_buffers_in_flight(pipe):
    r, _ = pipe
    token, buf, done = object(), bytearray(8), object()
    with Ring(4) as ring:
        ring.read(r, buf, user_data=token)
        ring.nop(user_data=done)
        ring.submit()
        referents = gc.get_referents(ring)
        assert any(x is token for x in referents) and any(x is buf for x in referents)
        assert ring.wait(1) == [(done, 0)]
    assert gc.get_referents(ring) == [None]  # its pool (none): the tables are gone


FINALIZED_BEFORE_CLEARED = """
import gc, os, warnings
from arenalib import Arena, Ring
r, w = os.pipe()
os.set_blocking(r, False)

def make_garbage():
    arena = Arena()                   # held by its segment only: freed with it, unclosed
    mv = memoryview(arena.allocate(64))
    # The managed buffer behind mv was made before the ring: the collector clears it first, which
    # releases the segment (and frees the arena) whether a read into mv is in flight or not.
    ring = Ring(4)
    ring.read(r, mv, user_data=[ring])   # a cycle: ring -> user_data -> ring; ring -> mv -> segment
    ring.submit()

def showwarning(message, category, *args, **kwargs):
    if "Arena" in str(message):       # the arena's memory is gone: data arrives now
        os.write(w, b"late")

make_garbage()
with warnings.catch_warnings():
    warnings.simplefilter("always")
    warnings.showwarning = showwarning
    gc.collect()
# The ring was closed (its read cancelled) before anything of the cycle was cleared: the data that
# arrived once the memory was freed is still in the pipe.
print(os.read(r, 100))
"""


def test_a_ring_in_a_cycle_is_closed_before_the_cycle_is_cleared():
    assert assert_ok(run_python(FINALIZED_BEFORE_CLEARED, timeout=60)).strip() == "b'late'"


GC_STRESS = """
import gc, os, socket, sys, warnings
from arenalib import Arena, BufferPool, Ring
gc.set_threshold(1)                   # a collection at (nearly) every allocation, mid-operation too

class Reader:
    def __init__(self, ring):
        self.ring = ring
        self.seen = []
    def on_done(self, result):
        self.seen.append(result)

def fd_of(ring):
    return int(repr(ring).rsplit("fd ", 1)[1].rstrip(">"))

arena = Arena()
pool = BufferPool(4096, 4)
r, w = os.pipe()                      # the reads: this pipe stays silent
sink_r, sink_w = os.pipe()            # the writes
left, right = socket.socketpair()
leaked_fds = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", ResourceWarning)
    for round in range(30):
        ring = Ring(8)
        reader = Reader(ring)
        ring.register_pool(pool)
        segs = [pool.acquire() for _ in range(2)]
        a = arena.allocate(64).fill(round)
        ring.write(sink_w, a, user_data=reader.on_done)
        ring.read_fixed(r, segs[0], user_data=(ring, segs[0]))
        ring.readv(r, [bytearray(4), segs[1]], user_data=[ring])
        ring.send(left, a, user_data=reader.on_done)
        ring.recv(right, arena.allocate(64), user_data=reader.on_done)
        ring.nop(user_data=reader)
        done = ring.wait(4)           # the write, the send, the recv and the nop; the reads stay
        assert sorted(type(u).__name__ for u, _ in done) == ["Reader", "method", "method", "method"]
        assert all(res in (0, 64) for _, res in done), done
        leaked_fds.append(fd_of(ring))
        if round % 3 == 0:
            ring.close()              # closed: nothing left to collect
        elif round % 3 == 1:
            try:
                ring.unregister_pool()
            except BufferError:       # refused: a fixed read is in flight
                pass
            else:
                raise AssertionError("unregister_pool() with a fixed read in flight")
        os.read(sink_r, 100)
        del ring, reader, done
        gc.collect()
        for seg in segs:
            assert seg.exports == 0, round
            pool.release(seg)
        a.free()
    os.write(w, b"x" * 64)
    assert os.read(r, 1000) == b"x" * 64  # nothing of any ring read it
unclosed = [w for w in caught if issubclass(w.category, ResourceWarning) and "unclosed" in str(w.message)]
still_open = [fd for fd in leaked_fds
              if os.path.exists(f"/proc/self/fd/{fd}")
              and os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[io_uring]"]
pool.close()
arena.close()
print(len(unclosed), still_open)
"""


def test_cycles_are_collected_with_a_collection_at_every_allocation():
    result = run_python(GC_STRESS, timeout=120)
    out = assert_ok(result)
    assert out.split() == ["20", "[]"], result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_a_cycle_collected_in_a_fork_child_closes_as_a_fork_child():
    out = assert_ok(run_python("""
        import ctypes, gc, os, signal, warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        from arenalib import Arena, Ring
        ring = Ring(4)
        arena = Arena()
        seg = arena.allocate(16)
        r, w = os.pipe()
        ring.read(r, seg, user_data=[ring])
        ring.submit()
        del ring
        pid = os.fork()
        if pid == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # dies with its parent (PR_SET_PDEATHSIG)
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()              # the child's copy of the cycle: the fork child's close
            seg.free()
            print("child freed", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        os.write(w, b"parent")
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()                  # the parent's: cancelled (the read may also have completed)
        seg.free()
        arena.close()
        print("parent freed")
    """, timeout=60))
    assert out.splitlines() == ["child freed", "parent freed"]
