"""BufferPool: the contract, then proof with real I/O clients (os.preadv/pwritev, readinto, sockets,
O_DIRECT, io_uring through examples/raw_uring.py, the liburing package where it works).  Its
hypothesis state machine is in tests/test_stateful.py, its tracemalloc trace in
tests/test_tracemalloc.py."""

from __future__ import annotations

import ctypes
import errno
import gc
import hashlib
import importlib
import os
import pickle
import socket
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, assert_ok, run_python, switching_every

import arenalib
from arenalib import (
    ArenaClosedError,
    ArenaError,
    BufferPool,
    PoolExhaustedError,
    UnsupportedOperation,
)

EXAMPLES = str(ROOT / "examples")
sys.path.insert(0, EXAMPLES)
import raw_uring  # noqa: E402  (examples/raw_uring.py: io_uring over raw syscalls, stdlib only)

PAGE = 4096
DIRECT_DIR = "/var/tmp"  # a disk filesystem (not tmpfs), where O_DIRECT is normally accepted


@pytest.fixture
def pool():
    p = BufferPool(1000, 4)
    yield p
    p.close()


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


# -- construction ----------------------------------------------------------------------------------


def test_is_exported_and_not_an_arena():
    """A BufferPool owns segments without being an arena: it takes no pooled jemalloc arena, and
    counts as an open pool, not an open arena."""
    assert "BufferPool" in arenalib.__all__
    assert not issubclass(BufferPool, arenalib.ArenaBase)
    assert issubclass(PoolExhaustedError, ArenaError)
    before, slots = arenalib.live_objects(), arenalib.pool_stats()["slots_created"]
    pools = [BufferPool(4096, 4) for _ in range(20)]
    during = arenalib.live_objects()
    assert during["open_pools"] == before["open_pools"] + 20
    assert during["open_arenas"] == before["open_arenas"]
    assert arenalib.pool_stats()["slots_created"] == slots
    for pool in pools:
        pool.close()
    assert arenalib.live_objects()["open_pools"] == before["open_pools"]
    assert not hasattr(pools[0], "purge") and not hasattr(pools[0], "max_bytes")


@pytest.mark.parametrize(
    ("buffer_size", "count", "align", "stride"),
    [(1, 1, 1, 1), (1000, 4, 4096, 4096), (4096, 3, 4096, 4096), (4097, 2, 4096, 8192),
     (100, 5, 64, 128), (65536, 8, 4096, 65536), (10, 3, 1 << 21, 1 << 21)],
)
def test_layout(buffer_size, count, align, stride):
    with BufferPool(buffer_size, count, align=align) as p:
        assert len(p) == count
        assert p.buffer_size == buffer_size
        assert p.stride == stride
        assert p.align == align
        assert p.nbytes == stride * count
        assert p.available == count
        assert p.address % max(align, PAGE) == 0
        assert p.region() == (p.address, stride * count)
        iovecs = p.iovecs()
        assert iovecs == [(p.address + i * stride, buffer_size) for i in range(count)]
        segs = [p.acquire() for _ in range(count)]
        for seg in segs:
            assert len(seg) == seg.nbytes == buffer_size
            assert seg.address % align == 0
            assert (seg.address, len(seg)) == iovecs[p.index(seg)]
        assert sorted(p.index(s) for s in segs) == list(range(count))
        assert p.available == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "exc"),
    [((0, 1), {}, ValueError), ((1, 0), {}, ValueError), ((-1, 1), {}, ValueError),
     ((1, -5), {}, ValueError), ((1, 1), {"align": 3}, ValueError), ((1, 1), {"align": 0}, ValueError),
     ((1, 1), {"align": 1 << 31}, ValueError), ((1, 1), {"align": -4096}, ValueError),
     ((1.5, 1), {}, TypeError), ((1, "2"), {}, TypeError), ((1, 1), {"align": 4096.0}, TypeError),
     ((1 << 70, 1), {}, MemoryError), ((1 << 40, 1 << 40), {}, MemoryError),
     ((1 << 62, 1), {}, MemoryError), ((1,), {}, TypeError)],
)
def test_bad_arguments(args, kwargs, exc):
    before = arenalib.live_objects()
    with pytest.raises(exc):
        BufferPool(*args, **kwargs)
    # nothing left open (and no ResourceWarning from a half-made pool)
    gc.collect()
    after = arenalib.live_objects()
    assert (after["open_arenas"], after["open_pools"]) == (before["open_arenas"], before["open_pools"])


def test_repr_pickle_allocate(pool):
    seg = pool.acquire()
    assert "1/4 buffers of 1000 bytes in use" in repr(pool)
    assert "BufferPool" in repr(seg)
    with pytest.raises(TypeError):
        pickle.dumps(pool)
    with pytest.raises(UnsupportedOperation):
        pool.allocate(10)
    pool.release(seg)
    pool.close()
    assert repr(pool) == "<arenalib.BufferPool closed>"


def test_arena_methods_do_not_apply_to_a_pool():
    """ArenaBase.allocate called on a BufferPool would allocate outside the pool's region: a pool is
    not an arena, so the unbound method refuses it (TypeError) and nothing is allocated."""
    with BufferPool(4096, 2) as pool:
        before = pool.stats()
        segments_before = arenalib.live_objects()["segments"]
        for call in (lambda: arenalib.ArenaBase.allocate(pool, 100),
                     lambda: arenalib.ArenaBase.allocate(pool, 4096, zero=False, align=64),
                     lambda: arenalib.ArenaBase.reset(pool), lambda: arenalib.ArenaBase.close(pool)):
            with pytest.raises(TypeError):
                call()
        assert pool.stats() == before
        assert arenalib.live_objects()["segments"] == segments_before
        assert pool.available == 2 and not pool.closed


def test_stats_describe_the_region():
    """stats() reports the region: its size while open, and how much of it is in RAM (mincore),
    which grows as buffers are written; nothing once closed."""
    count, size = 64, 65536
    pool = BufferPool(size, count)
    stats = pool.stats()
    assert stats["live_bytes"] == pool.nbytes == count * size
    assert 0 <= stats["resident"] <= pool.nbytes
    segments = [pool.acquire() for _ in range(count)]
    for seg in segments:
        seg.fill(0xA5)
    stats = pool.stats()
    assert stats["resident"] == pool.nbytes
    assert (stats["in_use"], stats["available"], stats["exports"]) == (count, 0, 0)
    view = memoryview(segments[0])
    assert pool.stats()["exports"] == 1
    view.release()
    for seg in segments:
        seg.free()
    pool.close()
    stats = pool.stats()
    assert (stats["live_bytes"], stats["resident"], stats["closed"]) == (0, 0, True)
    # A region smaller than a page counts only its own bytes.
    with BufferPool(100, 3, align=64) as small:
        small.acquire().fill(1)
        assert small.stats()["resident"] == small.nbytes == 384


# -- acquire / release -----------------------------------------------------------------------------


def test_exhaustion_and_stats():
    with BufferPool(512, 3) as p:
        a, b, c = p.acquire(), p.acquire(), p.acquire()
        assert p.available == 0
        with pytest.raises(PoolExhaustedError, match="all 3 buffers"):
            p.acquire()
        assert p.try_acquire() is None
        b_address = b.address
        p.release(b)
        d = p.try_acquire()
        assert d is not None and d.address == b_address  # LIFO: the warm buffer comes back first
        p.release(a)
        stats = p.stats()
        assert stats["acquisitions"] == 4
        assert stats["high_water"] == 3
        assert stats["exhausted"] == 2
        assert stats["in_use"] == 2
        assert stats["available"] == 1
        assert stats["buffers"] == 3 and stats["buffer_size"] == 512
        assert stats["live_bytes"] == p.nbytes
        assert not stats["closed"]
        for s in (c, d):
            s.free()  # Segment.free() of a pool segment releases it
        assert p.available == 3
        assert p.stats()["in_use"] == 0


def test_stale_handle_never_aliases_the_new_owner():
    with BufferPool(64, 1) as p:
        old = p.acquire()
        old.fill(1)
        address = old.address
        p.release(old)
        new = p.acquire()
        assert new.address == address  # the same buffer, a new handle
        new.fill(2)
        assert not old.alive and new.alive
        for use in (old.tobytes, lambda: old[0], lambda: old.fill(3), lambda: memoryview(old),
                    lambda: old.address, lambda: old.slice(0, 1), lambda: p.index(old),
                    lambda: old.__setitem__(0, 9), old.free):
            with pytest.raises(ArenaClosedError):
                use()
        with pytest.raises(ArenaClosedError, match="already released"):
            p.release(old)
        assert new.tobytes() == b"\x02" * 64
        p.release(new)


def test_release_errors_change_nothing(pool):
    other = BufferPool(1000, 4)
    arena = arenalib.ConfinedArena()
    try:
        seg = pool.acquire()
        seg.fill(5)
        foreign = other.acquire()
        plain = arena.allocate(1000)
        before = pool.stats()

        def unchanged():
            assert seg.alive and seg.tobytes() == b"\x05" * 1000
            after = pool.stats()
            for key in ("in_use", "available", "acquisitions", "exports"):
                assert after[key] == before[key]

        with pytest.raises(TypeError):
            pool.release(bytearray(1000))
        with pytest.raises(TypeError):
            pool.release(None)
        with pytest.raises(ValueError, match="does not belong"):
            pool.release(foreign)
        with pytest.raises(ValueError, match="does not belong"):
            pool.release(plain)
        with pytest.raises(ValueError, match="slice"):
            pool.release(seg.slice(0, 10))
        with pytest.raises(ValueError, match=r"slice \(or readonly\(\) view\)"):
            pool.release(seg.readonly())
        with pytest.raises(UnsupportedOperation):
            seg.slice(0, 10).free()
        unchanged()
        with memoryview(seg) as view:
            with pytest.raises(BufferError):
                pool.release(seg)
            with pytest.raises(BufferError):
                seg.free()
            with pytest.raises(BufferError):
                pool.close()
            with pytest.raises(BufferError):
                pool.reset()
            view[0] = 6
        sl = seg.slice(10, 10)
        with memoryview(sl):  # an export of a slice counts toward its segment
            with pytest.raises(BufferError):
                pool.release(seg)
        assert pool.stats()["in_use"] == 1
        pool.release(seg)
        assert not sl.alive
        with pytest.raises(ArenaClosedError):
            pool.release(seg)
        with pytest.raises(ValueError):
            pool.index(foreign)
        with pytest.raises(TypeError):
            pool.index(b"x")
        assert other.index(foreign) == 0
        other.release(foreign)
    finally:
        other.close()
        arena.close()


def test_index_of_slices(pool):
    segs = [pool.acquire() for _ in range(4)]
    for i, seg in enumerate(segs):
        assert pool.index(seg) == i
        assert pool.index(seg.slice(999, 1)) == i
    for seg in segs:
        pool.release(seg)


def test_pool_index_of_an_empty_slice_at_a_buffers_end_is_that_buffers():
    with BufferPool(4096, 3) as pool:
        segs = [pool.acquire() for _ in range(3)]
        for seg in segs:
            i = pool.index(seg)
            assert pool.index(seg.slice(4096, 0)) == i
            assert pool.index(seg.slice(4095, 1)) == i
        for seg in segs:
            pool.release(seg)


def test_zero_semantics():
    with BufferPool(300, 2, zero=True) as p:
        assert p.zero
        a = p.acquire()
        assert a.tobytes() == bytes(300)
        a.fill(0xAB)
        p.release(a)
        b = p.acquire()
        assert b.address == a_address(p, 0)
        assert b.tobytes() == bytes(300)  # zeroed again at acquire
        p.release(b)
    with BufferPool(300, 2, zero=False) as p:
        assert not p.zero
        a = p.acquire()
        a.fill(0xAB)
        p.release(a)
        b = p.acquire()
        assert b.tobytes() == b"\xab" * 300  # as the previous user left it
        p.release(b)


def a_address(p: BufferPool, i: int) -> int:
    return p.iovecs()[i][0]


def test_reset_kills_every_segment():
    with BufferPool(128, 3, zero=True) as p:
        segs = [p.acquire() for _ in range(3)]
        for s in segs:
            s.fill(7)
        p.reset()
        assert p.available == 3 and p.stats()["in_use"] == 0
        for s in segs:
            assert not s.alive
            with pytest.raises(ArenaClosedError):
                s.tobytes()
            with pytest.raises(ArenaClosedError, match="stale"):
                p.release(s)
        again = [p.acquire() for _ in range(3)]
        assert all(s.tobytes() == bytes(128) for s in again)
        for s in again:
            p.release(s)


def test_close_and_lifecycle():
    p = BufferPool(256, 2)
    seg = p.acquire()
    sl = seg.slice(0, 8)
    with p as same:
        assert same is p
    assert p.closed
    p.close()  # idempotent
    for use in (seg.tobytes, sl.tobytes, p.acquire, p.try_acquire, p.reset, p.iovecs, p.region,
                p.raw_views, lambda: p.address, lambda: p.release(seg), lambda: p.index(seg)):
        with pytest.raises(ArenaClosedError):
            use()
    assert p.available == 0
    assert len(p) == 2 and p.nbytes == 2 * PAGE
    stats = p.stats()
    assert stats["closed"] and stats["in_use"] == 0
    with pytest.raises(ArenaClosedError):
        with p:
            pass


def test_unclosed_pool_warns():
    p = BufferPool(64, 2)
    p.acquire()
    with pytest.warns(ResourceWarning, match="unclosed.*BufferPool"):
        del p
        gc.collect()


def test_threads_never_share_a_buffer():
    nthreads, rounds = 4, 2000
    with BufferPool(64, 6) as p:
        errors: list[BaseException] = []
        served = [0] * nthreads

        def worker(k: int) -> None:
            try:
                mine = bytes([k + 1]) * 64
                for _ in range(rounds):
                    seg = p.try_acquire()
                    if seg is None:
                        continue
                    seg[:] = mine
                    os.sched_yield()
                    # another thread given the same buffer would have overwritten it
                    assert seg.tobytes() == mine
                    p.release(seg)
                    served[k] += 1
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        with switching_every(1e-6):
            threads = [threading.Thread(target=worker, args=(k,)) for k in range(nthreads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert not errors, errors[0]
        stats = p.stats()
        assert stats["in_use"] == 0 and p.available == 6
        assert stats["acquisitions"] == sum(served)
        assert stats["high_water"] <= 6


# -- real clients: os, files, sockets, numpy -------------------------------------------------------


@pytest.fixture
def data_file():
    data = os.urandom(8 * 65536 + 123)
    fd, path = tempfile.mkstemp(dir=DIRECT_DIR, prefix="arenalib-pool-")
    os.write(fd, data)
    os.close(fd)
    yield path, data
    os.unlink(path)


def test_preadv_pwritev(data_file):
    path, data = data_file
    with BufferPool(65536, 4) as p:
        segs = [p.acquire() for _ in range(4)]
        fd = os.open(path, os.O_RDWR)
        try:
            assert os.preadv(fd, segs, 65536) == 4 * 65536
            for i, seg in enumerate(segs):
                assert seg.tobytes() == data[(i + 1) * 65536:(i + 2) * 65536]
            assert all(s.exports == 0 for s in segs)  # os.preadv released its buffer views
            segs[0].fill(0x5A)
            assert os.pwritev(fd, segs[:1], 0) == 65536
            assert os.pread(fd, 65536, 0) == b"\x5a" * 65536
        finally:
            os.close(fd)
        for s in segs:
            p.release(s)


def test_readinto_and_numpy(data_file):
    path, data = data_file
    with BufferPool(65536, 2) as p:
        with open(path, "rb", buffering=0) as f:
            out = b""
            while True:
                seg = p.acquire()
                n = f.readinto(seg)
                out += seg[:n]
                arr = np.frombuffer(seg, dtype=np.uint8, count=n)
                assert bytes(arr) == seg[:n]
                del arr
                p.release(seg)
                if n < 65536:
                    break
        assert out == data
        assert p.stats()["high_water"] == 1


def test_socketpair_recv_into():
    with BufferPool(4096, 2) as p:
        a, b = socket.socketpair()
        with a, b:
            payload = pattern(3000, 9)
            a.sendall(payload)
            seg = p.acquire()
            got = 0
            while got < len(payload):
                with memoryview(seg) as view:
                    got += b.recv_into(view[got:])
            assert seg[:got] == payload
            b.sendall(seg.slice(0, 3000))
            assert a.recv(4096) == payload
            p.release(seg)


def test_iovecs_are_struct_iovec(data_file):
    """iovecs() pairs are struct iovec's fields: libc's preadv takes them as they are."""
    path, data = data_file

    class Iovec(ctypes.Structure):
        _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.preadv.argtypes = [ctypes.c_int, ctypes.POINTER(Iovec), ctypes.c_int, ctypes.c_long]
    libc.preadv.restype = ctypes.c_ssize_t
    with BufferPool(5000, 3) as p:
        segs = [p.acquire() for _ in range(3)]
        iov = (Iovec * 3)(*(Iovec(a, n) for a, n in p.iovecs()))
        fd = os.open(path, os.O_RDONLY)
        try:
            assert libc.preadv(fd, iov, 3, 0) == 15000
        finally:
            os.close(fd)
        assert b"".join(s.tobytes() for s in segs) == data[:15000]
        for s in segs:
            p.release(s)


def test_raw_views(pool):
    views = pool.raw_views()
    assert [(ctypes.addressof(ctypes.c_char.from_buffer(v)), v.nbytes) for v in views] == pool.iovecs()
    seg = pool.acquire()
    views[pool.index(seg)][:3] = b"abc"
    assert seg[:3] == b"abc"
    # not exports of the pool (liburing never lets go of them): they keep the region itself alive
    assert seg.exports == 0 and pool.stats()["exports"] == 0
    pool.release(seg)
    pool.close()
    views[0][:3] = b"xyz"  # harmless after close: the memory is still the region's, unused
    assert bytes(views[0][:3]) == b"xyz"
    with pytest.raises(arenalib.ArenaClosedError):
        seg.tobytes()
    for v in views:
        v.release()


# -- O_DIRECT --------------------------------------------------------------------------------------


def test_o_direct(data_file):
    path, data = data_file
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("os.O_DIRECT is not available on this platform")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        pytest.skip(f"the filesystem of {DIRECT_DIR} refuses O_DIRECT: {e}")
    try:
        raw = bytearray(65536 + 1)
        with memoryview(raw) as whole, whole[1:] as unaligned:
            try:
                os.preadv(fd, [unaligned], 0)
            except OSError as e:
                assert e.errno == errno.EINVAL
            else:
                pytest.skip(f"the filesystem of {DIRECT_DIR} accepts unaligned O_DIRECT buffers")
        with BufferPool(65536, 4, align=4096) as p:
            segs = [p.acquire() for _ in range(4)]
            assert os.preadv(fd, segs, 65536) == 4 * 65536
            for i, seg in enumerate(segs):
                assert seg.tobytes() == data[(i + 1) * 65536:(i + 2) * 65536]
            # block by block, recycling one buffer
            for s in segs:
                p.release(s)
            for block in range(8):
                seg = p.acquire()
                assert os.preadv(fd, [seg], block * 65536) == 65536
                assert seg.tobytes() == data[block * 65536:(block + 1) * 65536]
                p.release(seg)
    finally:
        os.close(fd)


# -- io_uring (examples/raw_uring.py: raw syscalls, standard library) ------------------------------

@pytest.fixture
def ring():
    try:
        r = raw_uring.Ring(32)
    except raw_uring.Unavailable as e:
        pytest.skip(f"io_uring is unavailable here: {e}")
    yield r
    r.close()


def completions(r: raw_uring.Ring, n: int) -> dict[int, int]:
    """Wait for ``n`` completions: {user_data: result}, the result -errno on failure."""
    done: dict[int, int] = {}
    while len(done) < n:
        for key, res in r.wait(n - len(done)):
            assert key not in done
            done[key] = res
    return done


def test_raw_uring_results_and_errors(ring, data_file):
    """Completions carry the request's user_data and result; a failure is a negative errno, which
    check() raises as OSError; misuse that would hang or corrupt the ring raises instead."""
    path, data = data_file
    assert ring.sq_entries == 32 and ring.cq_entries == 64
    buf = ctypes.create_string_buffer(100)
    fd = os.open(path, os.O_RDONLY)
    try:
        ring.prep_nop(user_data=(1 << 64) - 1)
        ring.prep_read(fd, ctypes.addressof(buf), 100, 1000, user_data=1)
        ring.prep_read(fd, ctypes.addressof(buf), 100, len(data), user_data=2)  # at the end: 0 bytes
        ring.prep_read(999_999, ctypes.addressof(buf), 100, 0, user_data=3)  # no such descriptor
        ring.prep_read(fd, 8, 100, 0, user_data=4)  # an address nothing is mapped at
        assert ring.pending == 5
        assert ring.submit() == 5
        assert ring.pending == 0 and ring.inflight == 5
        results = completions(ring, 5)
        assert results == {(1 << 64) - 1: 0, 1: 100, 2: 0, 3: -errno.EBADF, 4: -errno.EFAULT}
        assert buf.raw == data[1000:1100]
        assert raw_uring.check(results[1]) == 100
        with pytest.raises(OSError) as info:
            raw_uring.check(results[3])
        assert info.value.errno == errno.EBADF
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="0 in flight"):
        ring.wait(1)  # would block for good
    assert ring.wait(0) == []
    with pytest.raises(ValueError):
        ring.prep_nop(user_data=1 << 64)
    for k in range(32):
        ring.prep_nop(user_data=k)
    with pytest.raises(BlockingIOError):
        ring.prep_nop(user_data=32)  # the submission queue is full
    assert ring.submit() == 32
    assert completions(ring, 32) == dict.fromkeys(range(32), 0)
    ring.close()
    ring.close()
    assert ring.closed
    for use in (ring.prep_nop, ring.submit, ring.wait):
        with pytest.raises(ValueError, match="closed"):
            use()


def test_io_uring_readv(ring, data_file):
    """The pattern: one iovec array per buffer index, built once from pool.iovecs(); each request
    acquires a segment, reads with readv into iovs[pool.index(seg)], and uses the data through the
    segment once the completion has arrived."""
    path, data = data_file
    with BufferPool(65536, 4) as p:
        iovs = [raw_uring.iovec_array([pair]) for pair in p.iovecs()]
        fd = os.open(path, os.O_RDONLY)
        try:
            out = {}
            offset = 0
            while offset < len(data):
                inflight = {}
                while offset < len(data) and (seg := p.try_acquire()) is not None:
                    i = p.index(seg)
                    ring.prep_readv(fd, iovs[i], offset, user_data=i)
                    inflight[i] = (seg, offset)
                    offset += 65536
                assert ring.submit() == len(inflight)
                for i, res in completions(ring, len(inflight)).items():
                    seg, off = inflight.pop(i)
                    assert res == min(65536, len(data) - off)
                    out[off] = seg[:res]
                    p.release(seg)
            assert b"".join(out[k] for k in sorted(out)) == data
            assert p.stats()["high_water"] == 4
            assert p.stats()["exports"] == 0
        finally:
            os.close(fd)


def test_io_uring_read_write_segment_addresses(ring, data_file, tmp_path):
    """read/write/readv by address: a segment's own (seg.address, len(seg)), slices included."""
    path, data = data_file
    with BufferPool(65536, 4) as p:
        segs = [p.acquire() for _ in range(4)]
        fd = os.open(path, os.O_RDONLY)
        try:
            ring.prep_read(fd, segs[0].address, len(segs[0]), 3 * 65536, user_data=0)
            ring.prep_readv(fd, [(segs[1].address, 1000), (segs[2].address, 5000)], 7, user_data=1)
            half = segs[3].slice(32768, 32768)
            ring.prep_read(fd, half.address, len(half), 65536, user_data=3)
            ring.submit()
            assert completions(ring, 3) == {0: 65536, 1: 6000, 3: 32768}
        finally:
            os.close(fd)
        assert segs[0].tobytes() == data[3 * 65536:4 * 65536]
        assert segs[1][:1000] == data[7:1007] and segs[2][:5000] == data[1007:6007]
        assert half.tobytes() == data[65536:98304]
        out = tmp_path / "out.bin"
        fd = os.open(out, os.O_WRONLY | os.O_CREAT)
        try:
            ring.prep_write(fd, segs[0].address, 65536, 0, user_data=10)
            ring.prep_writev(fd, [(segs[1].address, 1000), (half.address, 10)], 65536, user_data=11)
            ring.submit()
            assert completions(ring, 2) == {10: 65536, 11: 1010}
        finally:
            os.close(fd)
        assert out.read_bytes() == data[3 * 65536:4 * 65536] + data[7:1007] + data[65536:65546]
        for seg in segs:
            p.release(seg)


def test_io_uring_registered_buffers(ring, data_file, tmp_path):
    """Fixed buffers: register pool.iovecs() so buffer i is fixed buffer i, then read_fixed into a
    segment by its address and index.  The kernel refuses (-EFAULT, nothing written) a range that is
    not inside the named registered buffer: memory outside the region, another buffer's, one byte
    past the end, an index beyond the registered ones, any index once unregistered."""
    path, data = data_file
    with BufferPool(65536, 4) as p, arenalib.ConfinedArena() as arena:
        outside = arena.allocate(65536)
        segs = [p.acquire() for _ in range(4)]
        ring.register_buffers(p.iovecs())
        fd = os.open(path, os.O_RDONLY)
        try:
            for seg in segs:
                i = p.index(seg)
                ring.prep_read_fixed(fd, seg.address, len(seg), (3 - i) * 65536, i, user_data=i)
            ring.submit()
            assert completions(ring, 4) == dict.fromkeys(range(4), 65536)
            for seg in segs:
                i = p.index(seg)
                assert seg.tobytes() == data[(3 - i) * 65536:(4 - i) * 65536]
            before = [seg.tobytes() for seg in segs]
            a, b = segs[0], segs[1]
            ia, ib = p.index(a), p.index(b)
            ring.prep_read_fixed(fd, b.address + 1000, 100, 5, ib, user_data=10)  # part of a buffer
            ring.prep_read_fixed(fd, outside.address, 4096, 0, 0, user_data=20)
            ring.prep_read_fixed(fd, b.address, 4096, 0, ia, user_data=21)
            ring.prep_read_fixed(fd, a.address + 1, 65536, 0, ia, user_data=22)
            ring.prep_read_fixed(fd, a.address, 4096, 0, 4, user_data=23)
            ring.submit()
            efault = -errno.EFAULT
            assert completions(ring, 5) == {10: 100, 20: efault, 21: efault, 22: efault, 23: efault}
            expected = before[1][:1000] + data[5:105] + before[1][1100:]
            assert b.tobytes() == expected
            assert [seg.tobytes() for seg in segs[::2] + segs[3:]] == before[::2] + before[3:]
            assert outside.tobytes() == bytes(65536)

            out = tmp_path / "out.bin"
            wfd = os.open(out, os.O_WRONLY | os.O_CREAT)
            try:
                ring.prep_write_fixed(wfd, b.address, 65536, 0, ib, user_data=30)
                ring.submit()
                assert completions(ring, 1) == {30: 65536}
            finally:
                os.close(wfd)
            assert out.read_bytes() == expected
        finally:
            ring.unregister_buffers()  # before the pool closes: the kernel pins the pages until then
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            ring.prep_read_fixed(fd, a.address, 4096, 0, ia, user_data=40)
            ring.submit()
            assert completions(ring, 1) == {40: efault}
        finally:
            os.close(fd)
        for seg in segs:
            p.release(seg)


@pytest.mark.parametrize("mode", [[], ["--fixed"]], ids=["readv", "read_fixed"])
def test_io_uring_example_runs(data_file, mode):
    path, data = data_file
    result = run_python(Path(EXAMPLES, "io_uring_read.py"), path, *mode)
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stderr
    assert f"read {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}" in result.stdout
    assert "9 reads, high water 8 buffers" in result.stdout


def test_io_uring_example_without_io_uring(data_file):
    """Where io_uring_setup fails with ENOSYS (a kernel without io_uring; EPERM where it is disabled),
    the example exits with status 77 and says why."""
    path, _ = data_file
    example = os.path.join(EXAMPLES, "io_uring_read.py")
    result = run_python(f"""
        import runpy, sys
        sys.path.insert(0, {EXAMPLES!r})
        import raw_uring
        raw_uring.SYS_IO_URING_SETUP = 100_000  # no such syscall: ENOSYS
        sys.argv = [{example!r}, {path!r}]
        runpy.run_path({example!r}, run_name="__main__")
    """)
    assert result.returncode == 77, result.stderr
    why = f"[Errno {errno.ENOSYS}] io_uring_setup: {os.strerror(errno.ENOSYS)}"
    assert result.stdout.strip() == f"io_uring is unavailable here: {why}"


# -- the liburing package from PyPI, behind a probe in a child interpreter ----------------------------


def test_probe_reports_a_dying_child():
    """The probe that guards liburing: a child killed by a signal or failing is a verdict, not a
    crash of this process."""
    assert raw_uring.probe("print('usable')") == (True, "")
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    assert raw_uring.probe(kill) == (False, "killed by SIGILL (Illegal instruction)")
    assert raw_uring.probe("raise ImportError('no liburing')") == (False, "ImportError: no liburing")
    usable, why = raw_uring.liburing_wheel_usable()
    assert usable is (why == "")


@pytest.fixture
def liburing_ring():
    """(the liburing module, a ring of 32 entries), once the probe says the package works here (its
    2026.3.30 wheel dies with SIGILL in liburing.Ring() on x86-64 CPUs without AVX-512)."""
    usable, why = raw_uring.liburing_wheel_usable()
    if not usable:
        pytest.skip(why)
    liburing = importlib.import_module("liburing")  # only now: it may kill the interpreter
    r = liburing.Ring()
    liburing.io_uring_queue_init(32, r)
    yield liburing, r
    liburing.io_uring_queue_exit(r)


def test_liburing_package_quirks(liburing_ring):
    """What the package accepts: Iovec takes bytes, bytearray and memoryview only (not a Segment);
    io_uring_prep_read(_fixed) takes only a bytearray."""
    liburing, r = liburing_ring
    with BufferPool(4096, 1) as p:
        seg = p.acquire()
        with pytest.raises(TypeError):
            liburing.Iovec([seg])
        sqe = liburing.io_uring_get_sqe(r)
        with pytest.raises(TypeError):
            liburing.io_uring_prep_read(sqe, 0, seg, 0)
        with pytest.raises(TypeError):
            liburing.io_uring_prep_read(sqe, 0, p.raw_views()[0], 0)
        liburing.io_uring_prep_nop(sqe)
        sqe.user_data = 5
        liburing.io_uring_submit(r)
        cqe = liburing.Cqe()
        liburing.io_uring_wait_cqe(r, cqe)
        assert (cqe[0].user_data, cqe[0].res) == (5, 0)
        liburing.io_uring_cqe_seen(r, cqe[0])
        p.release(seg)


def test_liburing_memoryview_of_segment_is_pinned_for_good(liburing_ring):
    """liburing.Iovec([memoryview(seg)]) keeps the export alive for good: the segment can never be
    released nor the pool closed (run in a child process, as the export never goes away)."""
    out = assert_ok(run_python("""
        import gc, importlib, arenalib
        liburing = importlib.import_module("liburing")
        p = arenalib.BufferPool(4096, 1)
        seg = p.acquire()
        iov = liburing.Iovec([memoryview(seg)])
        del iov; gc.collect()
        print(seg.exports)
        for op in (lambda: p.release(seg), p.close):
            try:
                op()
            except BufferError:
                print("BufferError")
    """, options=("-W", "ignore"))).split()
    assert out == ["1", "BufferError", "BufferError"]
