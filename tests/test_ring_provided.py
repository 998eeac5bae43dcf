"""Provided buffers and multishot receive (issue 30): Ring.provide(pool, group) lends a BufferPool's
buffers to the kernel, Ring.recv_multishot(sock, group) receives into the buffer the kernel picks, and
each completion hands out a live Segment that gives its buffer back to the ring when released.

Over loopback TCP (127.0.0.1, ::1 where it exists); every loop is bounded and ends by itself.  What
can crash or hang the interpreter (a fork child touching the parent's ring) runs in a child
interpreter with a timeout."""

from __future__ import annotations

import errno
import gc
import os
import random
import socket
import sys
import threading
import time
import warnings
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import assert_ok, run_python

import arenalib
from arenalib import ArenaClosedError, BufferPool, PoolExhaustedError, Received, Ring, _ring

try:
    Ring(1).close()
except OSError as exc:  # ENOSYS, EPERM: a kernel or sandbox without io_uring
    pytest.skip(f"io_uring is not available here: {exc}", allow_module_level=True)


def _multishot_works() -> str | None:
    try:
        with Ring(2) as ring, BufferPool(64, 1) as pool:
            ring.provide(pool, 0)
            ring.withdraw(0)
    except OSError as exc:
        return str(exc)
    return None


_reason = _multishot_works()
if _reason is not None:
    pytest.skip(f"provided-buffer rings are not available here: {_reason}", allow_module_level=True)

GROUP = 7


@contextmanager
def tcp_pairs(n: int, family=socket.AF_INET):
    """``n`` connected (server side, client side) TCP pairs over loopback."""
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    pairs = []
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.bind((host, 0))
        listener.listen(n)
        try:
            for _ in range(n):
                client = socket.create_connection(listener.getsockname()[:2])
                server, _ = listener.accept()
                pairs.append((server, client))
            yield pairs
        finally:
            for server, client in pairs:
                server.close()
                client.close()


@contextmanager
def provided(buffer_size=4096, count=8, entries=32, group=GROUP, incremental=False):
    pool = BufferPool(buffer_size, count)
    ring = Ring(entries)
    try:
        ring.provide(pool, group, incremental=incremental)
        yield ring, pool
    finally:
        ring.close()
        pool.close()


def receive(ring, n=1):
    """wait(n)'s Received completions (asserting there are only those)."""
    out = ring.wait(n)
    for _, r in out:
        assert type(r) is Received
    return out


def drain_until(ring, predicate, limit=2000):
    """wait(1) until ``predicate(completions so far)``; bounded."""
    got = []
    for _ in range(limit):
        got += receive(ring, 1)
        if predicate(got):
            return got
    raise AssertionError(f"not reached after {limit} waits: {got[-5:]}")


# -- the basics -------------------------------------------------------------------------------------

def test_code_run_by_the_group_argument_cannot_hand_a_receive_another_connection():
    """The socket's descriptor was read before the group's __index__, which could close the socket
    and put another connection at its number: the receive took that connection's bytes."""
    with provided() as (ring, pool), tcp_pairs(2) as [(mine, _), (other, other_client)]:
        other_client.sendall(b"for the other connection only")
        taken = []

        class Group:
            def __index__(self):
                number = mine.fileno()
                mine.close()
                taken.append(os.dup2(other.fileno(), number))
                return GROUP

        try:
            with pytest.raises(ValueError, match="negative"):  # (a closed socket's fileno() is -1)
                ring.recv_multishot(mine, Group())
            assert ring.in_flight == 0 and ring.wait(0) == []
            assert pool.stats()["lent"] == 8  # no buffer was filled
            assert other.recv(64) == b"for the other connection only"
        finally:
            os.close(taken[0])


def test_a_completion_carries_a_live_segment_over_exactly_the_bytes_received():
    with provided() as (ring, pool), tcp_pairs(1) as [(server, client)]:
        assert pool.stats()["lent"] == 8 and pool.available == 0
        ring.recv_multishot(server, GROUP, user_data="conn")
        client.sendall(b"hello, ring")
        [(ud, r)] = receive(ring)
        assert ud == "conn" and r.result == 11 and r.more
        assert isinstance(r.segment, arenalib.Segment) and len(r.segment) == 11
        assert bytes(r.segment) == b"hello, ring"
        assert r.segment.arena is pool
        assert pool.index(r.segment) in range(8)
        assert "result=11" in repr(r)
        r.segment.free()


def test_a_delivered_segment_behaves_as_a_pool_segment():
    with provided(count=2) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        client.sendall(b"0123456789")
        [(_, r)] = receive(ring)
        seg = r.segment
        part = seg.slice(2, 3)
        assert bytes(part) == b"234" and bytes(seg.readonly()) == b"0123456789"
        with pytest.raises(arenalib.UnsupportedOperation):
            seg.resize(20)
        with pytest.raises(ValueError, match="slice"):
            pool.release(part)
        with BufferPool(64, 1) as other, pytest.raises(ValueError):
            other.release(seg)
        seg[0] = 0x41  # the user's now: writable
        assert bytes(seg[:2]) == b"A1"
        seg.free()
        with pytest.raises(ArenaClosedError):
            bytes(part)  # the slices die with it


def test_process_wide_operations_leave_lent_buffers_alone():
    """trim(), set_retention() and an arena's purge() between receives: every byte still arrives."""
    retention = arenalib.get_retention()
    with provided(buffer_size=1000, count=4) as (ring, _), tcp_pairs(1) as [(server, client)], \
            arenalib.Arena() as arena:
        ring.recv_multishot(server, GROUP)
        sent, got = bytearray(), bytearray()

        def take():
            for _, r in ring.wait(1):
                if r.segment is not None:
                    got.extend(r.segment)
                    r.segment.free()
                if not r.more:
                    ring.recv_multishot(server, GROUP)

        try:
            for i in range(20):
                msg = bytes([i]) * (100 + i * 37)
                client.sendall(msg)
                sent += msg
                arena.allocate(1 << 20).fill(i)
                arena.purge()
                arenalib.trim()
                arenalib.set_retention(0 if i % 2 else 1 << 20)
                take()
        finally:
            arenalib.set_retention(retention)
        for _ in range(100):
            if got == sent:
                break
            take()
        assert got == sent


def test_received_is_made_by_wait_only():
    with pytest.raises(TypeError):
        Received()
    with provided() as (ring, _), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        client.sendall(b"x")
        [(_, r)] = receive(ring)
        with pytest.raises(TypeError):
            import pickle
            pickle.dumps(r)
        r.segment.free()


def test_other_requests_keep_their_completion_shape():
    with provided() as (ring, _), tcp_pairs(1) as [(server, client)]:
        ring.nop(user_data="nop")
        assert ring.wait(1) == [("nop", 0)]
        buf = bytearray(8)
        client.sendall(b"12345678")
        ring.recv(server, buf, user_data="recv")
        assert ring.wait(1) == [("recv", 8)]


def _incremental_works() -> bool:
    try:
        with BufferPool(64, 1) as pool, Ring(2) as ring:
            ring.provide(pool, 0, incremental=True)
    except OSError:
        return False
    return True


INCREMENTAL = _incremental_works()
needs_incremental = pytest.mark.skipif(not INCREMENTAL, reason="IOU_PBUF_RING_INC needs Linux 6.12")


@pytest.mark.parametrize("family,incremental", [
    (socket.AF_INET, False), (socket.AF_INET6, False),
    pytest.param(socket.AF_INET, True, marks=needs_incremental)])
def test_data_integrity_across_many_connections_and_buffers(family, incremental):
    """40 connections, random messages (1 byte to 3x a buffer), an 11-buffer pool of odd-sized
    buffers: every byte arrives, in order, per connection; ENOBUFS re-armed after releases."""
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6")
    rng = random.Random(30)
    try:
        ctx = tcp_pairs(40, family)
        pairs = ctx.__enter__()
    except OSError as exc:
        pytest.skip(f"loopback {family!r} unavailable: {exc}")
    try:
        with provided(buffer_size=3001, count=11, entries=64, incremental=incremental) as (ring, pool):
            expected = {i: bytearray() for i in range(len(pairs))}
            got = {i: bytearray() for i in range(len(pairs))}
            for i, (server, _) in enumerate(pairs):
                ring.recv_multishot(server, GROUP, user_data=i)
            armed = set(range(len(pairs)))
            enobufs = 0
            for _ in range(300):
                i = rng.randrange(len(pairs))
                data = rng.randbytes(rng.randint(1, 9000))
                expected[i] += data
                pairs[i][1].sendall(data)
                while True:  # take what is there without blocking
                    done = ring.wait(0)
                    if not done:
                        break
                    for conn, r in done:
                        if r.segment is not None:
                            got[conn] += r.segment
                            r.segment.free()
                        if not r.more:
                            armed.discard(conn)
                            if r.result == -errno.ENOBUFS:
                                enobufs += 1
                            else:
                                assert r.result > 0, r
                    for conn in list(set(range(len(pairs))) - armed):
                        ring.recv_multishot(pairs[conn][0], GROUP, user_data=conn)
                        armed.add(conn)
            for _ in range(5000):
                if all(got[i] == expected[i] for i in got):
                    break
                for conn, r in ring.wait(1):
                    if r.segment is not None:
                        got[conn] += r.segment
                        r.segment.free()
                    if not r.more:
                        ring.recv_multishot(pairs[conn][0], GROUP, user_data=conn)
            assert all(got[i] == expected[i] for i in got)
            assert pool.stats()["lent"] == 11
    finally:
        ctx.__exit__(None, None, None)


# -- giving buffers back ----------------------------------------------------------------------------

def _one(ring, client, data=b"abc"):
    client.sendall(data)
    [(_, r)] = receive(ring)
    return r


def test_free_gives_the_buffer_back_to_the_ring_not_to_the_pool():
    with provided(count=2) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        first = _one(ring, client).segment
        index = pool.index(first)
        # The pool's free list stays empty: the buffer went back into the ring.
        first.free()
        assert pool.available == 0 and pool.try_acquire() is None
        with pytest.raises(ArenaClosedError):
            first[0]
        # Both buffers come round again; the old handle stays dead when its buffer is reused.
        seen = set()
        for _ in range(4):
            seg = _one(ring, client, b"xyz").segment
            seen.add(pool.index(seg))
            seg.free()
        assert index in seen
        with pytest.raises(ArenaClosedError):
            bytes(first)
        with pytest.raises(ArenaClosedError):
            first.free()


def test_release_and_deferred_release_give_it_back():
    with provided(count=1) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        seg = _one(ring, client).segment
        pool.release(seg)  # the pool's own release: back to the ring as well
        seg = _one(ring, client, b"second").segment
        view = memoryview(seg)
        with pytest.raises(BufferError):
            seg.free()
        seg.free(deferred=True)  # alive while the view is
        assert bytes(view) == b"second"
        client.sendall(b"third")
        # The only buffer is out: the receive ends with ENOBUFS ...
        [(_, r)] = receive(ring)
        assert r.result == -errno.ENOBUFS and not r.more and r.segment is None
        view.release()  # ... the deferred release gives it back ...
        with pytest.raises(ArenaClosedError):
            seg[0]
        ring.recv_multishot(server, GROUP)  # ... and the re-armed receive gets the waiting bytes
        [(_, r)] = receive(ring)
        assert bytes(r.segment) == b"third" and r.more
        r.segment.free()


def test_a_lent_buffer_is_never_reachable_from_python():
    with provided(count=4) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        assert pool.try_acquire() is None
        with pytest.raises(PoolExhaustedError):
            pool.acquire()
        ring.recv_multishot(server, GROUP)
        seg = _one(ring, client).segment
        # Only what the kernel filled, only while delivered.
        assert len(seg) == 3
        with pytest.raises(IndexError):
            seg[3]
        seg.free()
        assert pool.try_acquire() is None


def test_buffers_acquired_before_provide_go_back_to_the_pool():
    pool = BufferPool(1024, 4)
    mine = pool.acquire()
    with Ring(8) as ring:
        ring.provide(pool, GROUP)
        assert pool.stats()["lent"] == 3
        mine.free()
        assert pool.available == 1
        ring.withdraw(GROUP)
    assert pool.available == 4
    pool.close()


def test_enobufs_and_recovery_after_rearm():
    with provided(buffer_size=512, count=3) as (ring, _), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP, user_data="c")
        held = []
        ended = None
        for _ in range(10):
            client.sendall(b"m" * 100)
            [(_, r)] = receive(ring)
            if r.segment is not None:
                held.append(r.segment)
            if not r.more:
                ended = r
                break
        assert ended is not None and ended.result == -errno.ENOBUFS and ended.segment is None
        assert len(held) == 3
        with pytest.raises(OSError) as info:
            arenalib.check(ended.result)
        assert info.value.errno == errno.ENOBUFS
        for seg in held:
            seg.free()
        ring.recv_multishot(server, GROUP, user_data="c")
        [(_, r)] = receive(ring)
        assert r.more and bytes(r.segment) == b"m" * 100  # the message that found no buffer
        r.segment.free()


def test_end_of_stream_and_socket_errors_end_the_receive():
    with provided() as (ring, _), tcp_pairs(2) as [(s1, c1), _]:
        ring.recv_multishot(s1, GROUP, user_data=1)
        c1.sendall(b"last words")
        c1.close()
        got = drain_until(ring, lambda g: not g[-1][1].more)
        assert b"".join(bytes(r.segment) for _, r in got if r.segment) == b"last words"
        assert got[-1][1].result == 0 and got[-1][1].segment is None
        for _, r in got:
            if r.segment is not None:
                r.segment.free()
        ring.recv_multishot(12345, GROUP, user_data=2)  # not a descriptor
        [(_, r)] = receive(ring)
        assert r.result == -errno.EBADF and not r.more


def test_the_kernel_ending_the_receive_on_a_full_completion_queue():
    """A ring of 1 entry (a completion queue of 2) and many separate messages not reaped: the kernel
    keeps the completions past the queue (NODROP) and may end the receive; every byte still
    arrives, and a re-armed receive goes on."""
    with provided(buffer_size=256, count=32, entries=1) as (ring, _), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        ring.submit()
        sent = bytearray()
        for i in range(20):
            msg = bytes([65 + i]) * 50
            client.sendall(msg)
            sent += msg
            os.sched_yield()
        got = bytearray()
        ends = 0
        batches = []
        for _ in range(200):
            if got == sent:
                break
            done = ring.wait(1)
            batches.append(len(done))
            for _, r in done:
                if r.segment is not None:
                    got += r.segment
                    r.segment.free()
                if not r.more:
                    ends += 1
                    assert r.result >= 0 or r.result == -errno.ENOBUFS, r
                    ring.recv_multishot(server, GROUP)
        assert got == sent
        # Twenty completions for a queue of two: the kernel ended the receive, and the completions it
        # kept past the queue came back in one wait(), more than cq_entries of them.
        assert ends >= 1 and max(batches) > ring.cq_entries
        ring.nop(user_data="still usable")  # the completions that carried buffers took no slot


# -- withdraw, close, the pool's pins ---------------------------------------------------------------

def test_the_pool_is_pinned_until_withdraw():
    pool = BufferPool(1024, 4)
    with Ring(8) as ring:
        ring.provide(pool, GROUP)
        with pytest.raises(BufferError, match="withdraw"):
            pool.close()
        with pytest.raises(BufferError):
            pool.reset()
        ring.withdraw(GROUP)
        pool.reset()
        assert pool.available == 4 and pool.stats()["lent"] == 0
        ring.provide(pool, GROUP)  # again
    assert pool.available == 4  # close() withdrew it
    pool.close()


def test_withdraw_cancels_armed_receives_and_keeps_their_completions():
    with provided(count=4) as (ring, pool), tcp_pairs(2) as [(s1, c1), (s2, _)]:
        ring.recv_multishot(s1, GROUP, user_data=1)
        ring.recv_multishot(s2, GROUP, user_data=2)
        c1.sendall(b"before")
        ring.submit()
        ring.withdraw(GROUP)
        assert ring.in_flight == 0
        got = ring.wait(0)
        ends = {ud: r for ud, r in got if not r.more}
        assert set(ends) == {1, 2}
        assert all(r.result in (-errno.ECANCELED, 0) or r.result > 0 for r in ends.values())
        data = b"".join(bytes(r.segment) for _, r in got if r.segment is not None)
        assert data in (b"", b"before")
        # Delivered segments outlive the group; released, they go to the pool's free list.
        for _, r in got:
            if r.segment is not None:
                r.segment.free()
        assert pool.available == 4 and pool.stats()["lent"] == 0
        with pytest.raises(ValueError, match="not provided"):
            ring.recv_multishot(s1, GROUP)
        with pytest.raises(ValueError, match="not provided"):
            ring.withdraw(GROUP)


def test_segments_delivered_before_withdraw_die_with_the_pool():
    pool = BufferPool(1024, 2)
    with Ring(8) as ring, tcp_pairs(1) as [(server, client)]:
        ring.provide(pool, GROUP)
        ring.recv_multishot(server, GROUP)
        seg = _one(ring, client).segment
        ring.withdraw(GROUP)
        pool.close()  # allowed: nothing pins it, the segment is simply dead
        with pytest.raises(ArenaClosedError):
            bytes(seg)
        with pytest.raises(ArenaClosedError):
            seg.free()


def test_close_with_armed_receives_and_unreturned_completions():
    pool = BufferPool(1024, 4)
    ring = Ring(8)
    with tcp_pairs(3) as pairs:
        ring.provide(pool, GROUP)
        for i, (server, client) in enumerate(pairs):
            ring.recv_multishot(server, GROUP, user_data=i)
            client.sendall(b"data %d" % i)
        ring.submit()
        ring.close()  # cancels, reaps, releases the unreturned segments, withdraws
        assert pool.available == 4 and pool.stats()["lent"] == 0 and pool.stats()["in_use"] == 0
        pool.close()
    assert arenalib.live_objects()["exports"] == 0


def test_close_while_the_segments_are_held():
    pool = BufferPool(1024, 2)
    with tcp_pairs(1) as [(server, client)]:
        ring = Ring(8)
        ring.provide(pool, GROUP)
        ring.recv_multishot(server, GROUP)
        seg = _one(ring, client).segment
        view = memoryview(seg)
        ring.close()
        assert bytes(view) == b"abc"  # still the user's
        with pytest.raises(BufferError):
            pool.close()
        view.release()
        seg.free()  # to the pool's free list now
        assert pool.available == 2
        pool.close()


def test_provide_refusals():
    pool = BufferPool(1024, 2)
    ring = Ring(4)
    try:
        with pytest.raises(TypeError):
            ring.provide(bytearray(10), 0)
        with pytest.raises(ValueError, match="group"):
            ring.provide(pool, 65536)
        with pytest.raises(ValueError, match="group"):
            ring.provide(pool, -1)
        ring.provide(pool, 3)
        with BufferPool(64, 1) as other_pool, pytest.raises(ValueError, match="provided already"):
            ring.provide(other_pool, 3)
        with pytest.raises(ValueError, match="provided to a Ring already"):
            ring.provide(pool, 4)
        with Ring(4) as other, pytest.raises(ValueError, match="provided to a Ring already"):
            other.provide(pool, 3)
        empty = BufferPool(64, 1)
        held = empty.acquire()
        with pytest.raises(ValueError, match="no free buffer"):
            ring.provide(empty, 5)
        held.free()
        empty.close()
        empty.close()
        with pytest.raises(ArenaClosedError):
            ring.provide(empty, 5)
        with BufferPool(64, 32769, align=64) as big, pytest.raises(ValueError, match="at most 32768"):
            ring.provide(big, 6)
        with pytest.raises(ValueError, match="group"):
            ring.recv_multishot(0, 70000)
        with pytest.raises(ValueError, match="not provided"):
            ring.recv_multishot(0, 9)
    finally:
        ring.close()
        pool.close()
    with pytest.raises(ArenaClosedError):
        ring.provide(pool, 1)
    with pytest.raises(ArenaClosedError):
        ring.withdraw(1)
    with pytest.raises(ArenaClosedError):
        ring.recv_multishot(0, 1)


def test_an_older_kernel_gets_a_clear_error():
    try:
        _ring._pretend_kernel((5, 15))
        with Ring(2) as ring, BufferPool(64, 2) as pool:
            with pytest.raises(OSError, match=r"5\.19") as info:
                ring.provide(pool, 0)
            assert info.value.errno == errno.EOPNOTSUPP
            assert pool.available == 2
        _ring._pretend_kernel((5, 19))
        with Ring(2) as ring, BufferPool(64, 2) as pool:
            ring.provide(pool, 0)
            with pytest.raises(OSError, match=r"6\.0") as info:
                ring.recv_multishot(0, 0)
            assert info.value.errno == errno.EOPNOTSUPP
            ring.withdraw(0)
        _ring._pretend_kernel((6, 6))
        with Ring(2) as ring, BufferPool(64, 2) as pool:
            with pytest.raises(OSError, match=r"6\.12") as info:
                ring.provide(pool, 0, incremental=True)
            assert info.value.errno == errno.EOPNOTSUPP and pool.available == 2
    finally:
        _ring._pretend_kernel(None)


# -- incremental consumption (IOU_PBUF_RING_INC) ------------------------------------------------------

@needs_incremental
def test_incremental_parts_share_a_buffer():
    with provided(buffer_size=256, count=4, incremental=True) as (ring, pool), \
            tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        parts = [_one(ring, client, bytes([65 + i]) * 100).segment for i in range(2)]
        first, second = parts
        assert pool.index(first) == pool.index(second)
        assert second.address == first.address + 100  # the next part of the same buffer
        assert bytes(first) == b"A" * 100 and bytes(second) == b"B" * 100
        for seg in parts:
            seg.free()


@needs_incremental
def test_incremental_buffer_comes_back_once_done_and_every_part_released():
    with provided(buffer_size=256, count=2, incremental=True) as (ring, pool), \
            tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        a = [_one(ring, client, b"a" * n).segment for n in (100, 100, 56)]  # fills buffer A
        assert {pool.index(s) for s in a} == {pool.index(a[0])}
        a[0].free()
        a[1].free()
        b = _one(ring, client, b"b" * 256).segment                           # fills buffer B
        client.sendall(b"c")
        [(_, r)] = receive(ring)
        assert r.result == -errno.ENOBUFS and not r.more  # A's last part still holds A
        a[2].free()
        b.free()
        ring.recv_multishot(server, GROUP)
        [(_, r)] = receive(ring)
        assert bytes(r.segment) == b"c"
        assert (r.segment.address - pool.address) % pool.stride == 0  # a buffer's start: a fresh one
        r.segment.free()


@needs_incremental
def test_incremental_withdraw_frees_part_filled_buffers():
    with provided(buffer_size=256, count=2, incremental=True) as (ring, pool), \
            tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        held = _one(ring, client, b"x" * 10).segment
        again = _one(ring, client, b"y" * 10).segment
        again.free()
        ring.withdraw(GROUP)
        [(_, end)] = ring.wait(0)
        assert end.result == -errno.ECANCELED and not end.more
        assert pool.available == 1  # the other buffer; the part-filled one waits for its last part
        held.free()
        assert pool.available == 2 and pool.stats()["lent"] == 0
        # Again, provided anew before the part is released: it goes to the new group.
        ring.provide(pool, GROUP, incremental=True)
        ring.recv_multishot(server, GROUP)
        held = _one(ring, client, b"z" * 10).segment
        ring.withdraw(GROUP)
        ring.wait(0)
        ring.provide(pool, GROUP)
        assert pool.available == 0 and pool.stats()["lent"] == 2
        held.free()
        ring.withdraw(GROUP)
        assert pool.available == 2 and pool.stats()["lent"] == 0


def test_many_groups_on_one_ring():
    pools = [BufferPool(256, 2) for _ in range(3)]
    with Ring(16) as ring, tcp_pairs(3) as pairs:
        for g, pool in enumerate(pools):
            ring.provide(pool, g)
        for g, (server, client) in enumerate(pairs):
            ring.recv_multishot(server, g, user_data=g)
            client.sendall(b"group %d" % g)
        got = drain_until(ring, lambda got: len(got) == 3)
        for g, r in got:
            assert r.segment.arena is pools[g] and bytes(r.segment) == b"group %d" % g
            r.segment.free()
        ring.withdraw(1)
    for pool in pools:
        assert pool.available == 2
        pool.close()


# -- the collector ----------------------------------------------------------------------------------

def test_gc_of_a_ring_with_an_armed_receive():
    pool = BufferPool(1024, 2)
    with tcp_pairs(1) as [(server, client)]:
        ring = Ring(4)
        ring.provide(pool, GROUP)
        ring.recv_multishot(server, GROUP)
        client.sendall(b"pending")
        ring.submit()
        with pytest.warns(ResourceWarning, match="unclosed"):
            del ring
            gc.collect()
    assert pool.available == 2
    pool.close()


def test_gc_of_a_ring_in_a_cycle_through_its_user_data():
    pool = BufferPool(1024, 2)
    with tcp_pairs(1) as [(server, client)]:

        class Conn:
            pass

        conn = Conn()
        conn.ring = Ring(4)
        conn.ring.provide(pool, GROUP)
        conn.ring.recv_multishot(server, GROUP, user_data=conn)
        client.sendall(b"x")
        conn.ring.submit()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del conn
            gc.collect()
        assert any(issubclass(w.category, ResourceWarning) for w in caught)
    assert pool.available == 2
    pool.close()


# -- re-entrancy -------------------------------------------------------------------------------------

def test_index_that_closes_the_ring_mid_call():
    pool = BufferPool(64, 2)
    ring = Ring(4)

    class Closer:
        def __index__(self):
            ring.close()
            return GROUP

    with pytest.raises(ArenaClosedError):
        ring.provide(pool, Closer())
    assert pool.available == 2
    ring = Ring(4)
    ring.provide(pool, GROUP)
    with pytest.raises(ArenaClosedError):
        ring.recv_multishot(0, Closer())
    assert pool.available == 2
    ring = Ring(4)
    ring.provide(pool, GROUP)
    with pytest.raises(ArenaClosedError):
        ring.withdraw(Closer())
    pool.close()


def test_index_that_closes_the_pool_mid_provide():
    pool = BufferPool(64, 2)

    class Closer:
        def __index__(self):
            pool.close()
            return GROUP

    with Ring(4) as ring:
        with pytest.raises(ArenaClosedError):
            ring.provide(pool, Closer())
        with pytest.raises(ValueError, match="not provided"):
            ring.withdraw(GROUP)


class Finalizer:
    """Garbage in a cycle whose finalizer runs ``action`` when collected."""

    def __init__(self, action):
        self.cycle = self
        self.action = action

    def __del__(self):
        self.action()


def test_signal_handlers_and_finalizers_that_close_or_release_during_wait():
    """wait() runs a signal handler (a thread signals the main thread while wait() blocks, then
    sends the bytes) while the ring is busy; the handler closes the ring (RuntimeError), closes the
    pool (BufferError: it is lent), frees a delivered Segment (its buffer goes back), and collects a
    cycle whose finalizer does the same.  Nothing of the ring is harmed and every byte arrives.
    A signal handled between two waits (a loaded machine: the thread's sleep is no promise) finds
    the ring idle, where submit() works: it only frees two segments then (the ring's close would
    succeed)."""
    import signal

    pool = BufferPool(512, 4)
    ring = Ring(16)
    ring.provide(pool, GROUP)
    errors = []
    held = []
    hits = []

    def attack():
        for action in (ring.close, pool.close, lambda: held and held.pop().free()):
            try:
                action()
            except Exception as exc:
                errors.append(type(exc))

    def handler(signum, frame):
        try:
            ring.submit()  # harmless while idle; RuntimeError inside wait()
        except RuntimeError:
            hits.append(signum)
        else:
            for _ in range(2):  # what the attack would have given back
                if held:
                    held.pop().free()
            return
        attack()
        Finalizer(attack)
        gc.collect()

    sent = bytearray()
    got = bytearray()
    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.get_ident()
    try:
        with tcp_pairs(1) as [(server, client)]:
            ring.recv_multishot(server, GROUP)
            for i in range(12):
                msg = b"%03d" % i

                def later(msg=msg):
                    time.sleep(0.05)  # the main thread is blocked in wait() by then
                    signal.pthread_kill(main, signal.SIGUSR1)
                    time.sleep(0.02)
                    client.sendall(msg)

                sender = threading.Thread(target=later)
                sender.start()
                sent += msg
                for _ in range(50):  # until this message is in (the signal may end a wait early)
                    for _, r in ring.wait(1):
                        if r.segment is not None:
                            got += r.segment
                            held.append(r.segment)
                        if not r.more:
                            ring.recv_multishot(server, GROUP)
                    if got == sent:
                        break
                sender.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert got == sent
    assert hits, "no signal was handled inside wait()"
    assert errors.count(RuntimeError) >= 2 * len(hits) and errors.count(BufferError) >= 2 * len(hits)
    for seg in held:
        seg.free()
    ring.close()
    assert pool.available == 4
    pool.close()


# -- fork --------------------------------------------------------------------------------------------

FORK_CHILD = """
import errno, os, signal, socket, sys, ctypes
from arenalib import BufferPool, Ring
pool = BufferPool(1024, 4)
ring = Ring(8)
ring.provide(pool, 1)
a, b = socket.socketpair()  # a pair of our own, no network
ring.recv_multishot(a, 1)
b.sendall(b"before fork")
[(_, r)] = ring.wait(1)
seg = r.segment
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    try:
        ring.wait(0)
        print("wait worked in the child")
    except RuntimeError:
        pass
    try:
        ring.recv_multishot(a, 1)
        print("recv_multishot worked in the child")
    except RuntimeError:
        pass
    assert bytes(seg) == b"before fork"
    seg.free()                       # the child's pool takes it (the ring is not mapped here)
    assert pool.available == 1, pool.stats()
    ring.close()
    assert pool.available == 4, pool.stats()
    pool.close()
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
seg.free()                           # the parent's ring takes it back
b.sendall(b"after fork")
[(_, r)] = ring.wait(1)
assert bytes(r.segment) == b"after fork"
r.segment.free()
ring.close()
assert pool.available == 4
pool.close()
print("ok")
"""


def test_fork_child():
    assert assert_ok(run_python(FORK_CHILD, timeout=60)).strip() == "ok"


FORK_FROM_ANOTHER_THREAD = """
import os, signal, socket, threading, time, warnings, ctypes
from arenalib import BufferPool, Ring, WrongThreadError
warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
pool = BufferPool(1024, 4)
ring = Ring(8)
ring.provide(pool, 1)
a, b = socket.socketpair()
ring.recv_multishot(a, 1)
waiting = threading.Event()

def fork_while_the_owner_waits():
    waiting.wait()
    time.sleep(0.2)  # the owner is in wait(1), without the GIL
    pid = os.fork()
    if pid == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        try:
            try:
                ring.wait(0)
                print("wait worked in the child")
            except RuntimeError as exc:  # the fork child's refusal, not another thread's
                assert "fork" in str(exc), exc
            ring.close()                 # the owner did not come along: this thread closes it
            assert ring.closed and pool.available == 4, pool.stats()
            pool.close()                 # no longer lent to the ring
        except BaseException as exc:
            print("child:", repr(exc), flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
    b.sendall(b"after fork")

t = threading.Thread(target=fork_while_the_owner_waits)
t.start()
waiting.set()
[(_, r)] = ring.wait(1)
t.join()
assert bytes(r.segment) == b"after fork"
r.segment.free()                     # the parent's ring is untouched by the child's close
errors = []
def close_elsewhere():
    try:
        ring.close()
    except WrongThreadError as exc:
        errors.append(exc)
closer = threading.Thread(target=close_elsewhere)
closer.start()
closer.join()
assert len(errors) == 1 and not ring.closed  # outside a fork child, the owner's alone to close
ring.close()
pool.close()
print("ok")
"""


def test_a_fork_child_made_by_another_thread_closes_the_ring_its_owner_left_behind():
    """In a fork child made by a thread other than the Ring's owner, the owner is not there: every
    use is refused as a fork child's (RuntimeError), and close() works from the child's thread, so
    the pool it provides to can close.  close() said WrongThreadError, forever, and the pool stayed
    pinned."""
    assert assert_ok(run_python(FORK_FROM_ANOTHER_THREAD, timeout=60)).split() == ["child", "0", "ok"]


# -- threads -----------------------------------------------------------------------------------------

@contextmanager
def releasers(n=4):
    """``n`` threads that take ``(segment, its bytes when delivered)`` from the queue yielded, check
    that the segment still holds those bytes (else the bytes go to the list yielded) and release it."""
    import queue

    work: queue.Queue = queue.Queue()
    mismatches: list[bytes] = []

    def release():
        while (item := work.get()) is not None:
            seg, copy = item
            if bytes(seg) != copy:
                mismatches.append(copy)
            seg.free()
            work.task_done()
        work.task_done()

    threads = [threading.Thread(target=release) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield work, mismatches
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()


def hand_over(done, got, work):
    """wait()'s completions: each one's bytes added to ``got[its user_data]`` and its segment put on
    the releasers' queue with them; the user_data of the receives that ended."""
    ended = []
    for conn, r in done:
        if r.segment is not None:
            copy = bytes(r.segment)
            got[conn] += copy
            work.put((r.segment, copy))
        if not r.more:
            ended.append(conn)
    return ended


def test_segments_released_by_other_threads():
    """The ring's thread receives; four threads read and release the segments it hands them (on
    3.13t in parallel with the receives and with each other): each reads what the ring's thread
    read, every byte arrives in order, every buffer comes back to the ring."""
    n_conn, n_msgs = 8, 40
    with provided(buffer_size=700, count=16, entries=64) as (ring, pool), tcp_pairs(n_conn) as pairs, \
            releasers() as (work, mismatches):
        expected = [bytearray() for _ in range(n_conn)]
        got = [bytearray() for _ in range(n_conn)]

        def take(done):
            for conn in hand_over(done, got, work):
                ring.recv_multishot(pairs[conn][0], GROUP, user_data=conn)

        try:
            for i, (server, _) in enumerate(pairs):
                ring.recv_multishot(server, GROUP, user_data=i)
            rng = random.Random(5)
            for _ in range(n_msgs):
                for i, (_, client) in enumerate(pairs):
                    msg = rng.randbytes(rng.randint(1, 1500))
                    expected[i] += msg
                    client.sendall(msg)
                take(ring.wait(0))
            deadline = time.monotonic() + 60  # (ENOBUFS re-arms spin while the releasers lag)
            while got != expected and time.monotonic() < deadline:
                take(ring.wait(1))
        finally:
            work.join()  # every segment released
        assert got == expected
        assert not mismatches
        assert pool.stats()["lent"] == 16 and pool.available == 0


# -- a state machine ----------------------------------------------------------------------------------

class ProvidedMachine(RuleBasedStateMachine):
    """Random sends, waits, releases (immediate, through the pool, deferred behind a view), re-arms,
    withdraw and provide again, against a model of each connection's bytes and the pool's buffers."""

    N = 3
    BUFFERS = 4
    INCREMENTAL = False

    def __init__(self):
        super().__init__()
        self._pairs_ctx = tcp_pairs(self.N)
        self.pairs = self._pairs_ctx.__enter__()
        self.pool = BufferPool(300, self.BUFFERS)
        self.ring = Ring(8)
        self.ring.provide(self.pool, GROUP, incremental=self.INCREMENTAL)
        self.provided = True
        self.sent = [bytearray() for _ in range(self.N)]
        self.got = [bytearray() for _ in range(self.N)]
        self.armed = [False] * self.N
        self.held = []        # delivered segments not yet released
        self.views = []       # (segment, view) released deferred behind a live view
        self.dead = []        # released segments: their handles must stay dead

    def _take(self, done):
        for conn, r in done:
            assert type(r) is Received
            if r.segment is not None:
                assert r.result == len(r.segment) > 0
                self.got[conn] += r.segment
                self.held.append(r.segment)
            if not r.more:
                self.armed[conn] = False
                assert r.result >= 0 or r.result in (-errno.ENOBUFS, -errno.ECANCELED), r

    @rule(conn=st.integers(0, N - 1))
    @precondition(lambda self: self.provided)
    def arm(self, conn):
        if not self.armed[conn]:
            self.ring.recv_multishot(self.pairs[conn][0], GROUP, user_data=conn)
            self.armed[conn] = True

    @rule(conn=st.integers(0, N - 1), size=st.integers(1, 700))
    def send(self, conn, size):
        data = bytes([conn + 1]) * size
        self.pairs[conn][1].sendall(data)
        self.sent[conn] += data

    @rule()
    def wait_nonblocking(self):
        self._take(self.ring.wait(0))

    @rule(i=st.integers(0, 100), how=st.sampled_from(["free", "release", "deferred"]))
    @precondition(lambda self: self.held)
    def release(self, i, how):
        seg = self.held.pop(i % len(self.held))
        if how == "free":
            seg.free()
            self.dead.append(seg)
        elif how == "release":
            self.pool.release(seg)
            self.dead.append(seg)
        else:
            view = memoryview(seg)
            seg.free(deferred=True)
            self.views.append((seg, view))

    @rule()
    @precondition(lambda self: self.views)
    def drop_view(self):
        seg, view = self.views.pop(0)
        view.release()
        self.dead.append(seg)

    @rule()
    @precondition(lambda self: self.provided)
    def withdraw(self):
        self.ring.withdraw(GROUP)
        self.provided = False
        self._take(self.ring.wait(0))
        assert not any(self.armed)

    @rule()
    @precondition(lambda self: not self.provided)
    def provide_again(self):
        if self.pool.available == 0:  # every buffer delivered and held: nothing to lend
            with pytest.raises(ValueError, match="no free buffer"):
                self.ring.provide(self.pool, GROUP)
            return
        self.ring.provide(self.pool, GROUP, incremental=self.INCREMENTAL)
        self.provided = True

    @invariant()
    def books(self):
        stats = self.pool.stats()
        out = len(self.held) + len(self.views)  # segments out (several may share a buffer: INCREMENTAL)
        if self.provided:
            assert stats["in_use"] == self.BUFFERS
            assert self.INCREMENTAL or stats["lent"] >= out
        elif self.INCREMENTAL:
            assert stats["lent"] <= out
        else:
            assert stats["lent"] == out
        assert stats["in_use"] + stats["available"] == self.BUFFERS

    @invariant()
    def order(self):
        for conn in range(self.N):
            assert self.sent[conn].startswith(self.got[conn])

    @invariant()
    def dead_stay_dead(self):
        for seg in self.dead[-3:]:
            with pytest.raises(ArenaClosedError):
                seg[0]

    def teardown(self):
        try:
            for _, view in self.views:
                view.release()
            for seg in self.held:
                seg.free()
            self.ring.close()
            assert self.pool.available == self.BUFFERS
            self.pool.close()
        finally:
            self._pairs_ctx.__exit__(None, None, None)


TestProvidedMachine = ProvidedMachine.TestCase
TestProvidedMachine.settings = settings(max_examples=25, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])


class IncrementalMachine(ProvidedMachine):
    """The same against a ring that fills its buffers in parts (IOU_PBUF_RING_INC)."""

    INCREMENTAL = True


TestIncrementalMachine = needs_incremental(IncrementalMachine.TestCase)
TestIncrementalMachine.settings = TestProvidedMachine.settings


# -- aio.RingFrameReader ------------------------------------------------------------------------------

def _frames_through_ring(chunks: list[bytes], buffer_size=100, count=4, **reader_options):
    """Send ``chunks`` (one sendall each) through a ring receive into a RingFrameReader; the frames
    it delivered (as bytes), the reader, and the pool's stats after."""
    from arenalib.aio import RingFrameReader

    arena = arenalib.Arena()
    frames = []

    def on_frame(seg):
        frames.append(bytes(seg))
        seg.free()

    reader = RingFrameReader(on_frame, arena=arena, **reader_options)
    with provided(buffer_size=buffer_size, count=count) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        for chunk in chunks:
            client.sendall(chunk)
            for _ in range(1000):  # this chunk in, the buffers all back
                for _, r in ring.wait(0) or ring.wait(1):
                    if not reader.feed(r) and not reader.eof:
                        ring.recv_multishot(server, GROUP)
                if pool.stats()["lent"] == count and not ring.wait(0):
                    break
        client.shutdown(socket.SHUT_WR)
        for _ in range(1000):
            if reader.eof:
                break
            for _, r in ring.wait(1):
                if not reader.feed(r) and not reader.eof:
                    ring.recv_multishot(server, GROUP)
        stats = pool.stats()
    assert arena.stats()["live_segments"] == 0
    arena.close()
    return frames, reader, stats


def test_ring_frame_reader_frames_across_buffers():
    from arenalib.aio import frame_header

    rng = random.Random(7)
    bodies = [b"", b"x", rng.randbytes(99), rng.randbytes(100), rng.randbytes(101), rng.randbytes(1000),
              rng.randbytes(5)]
    stream = b"".join(frame_header(len(b)) + b for b in bodies)
    # Cut anywhere, the length prefixes included.
    cuts = sorted(rng.sample(range(1, len(stream)), 12))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    frames, reader, stats = _frames_through_ring(chunks)
    assert frames == bodies and reader.frames == len(bodies)
    assert reader.eof and reader.error is None
    assert stats["lent"] == 4 and stats["available"] == 0  # every buffer back in the ring


def test_ring_frame_reader_errors():
    from arenalib.aio import FrameError, frame_header

    frames, reader, _ = _frames_through_ring([frame_header(10) + b"12345"])
    assert frames == [] and reader.eof and isinstance(reader.error, FrameError)
    frames, reader, _ = _frames_through_ring([frame_header(3) + b"abc" + frame_header(500) + b"zz"],
                                             max_frame_size=100)
    assert frames == [b"abc"] and isinstance(reader.error, FrameError)
    assert "max_frame_size" in str(reader.error)


def test_ring_frame_reader_passes_enobufs_and_reports_errors():
    from arenalib.aio import RingFrameReader

    reader = RingFrameReader(lambda seg: None)

    class Fake:
        segment = None
        more = False

        def __init__(self, result):
            self.result = result

    assert reader.feed(Fake(-errno.ENOBUFS)) is False and reader.error is None and not reader.eof
    assert reader.feed(Fake(-errno.ECONNRESET)) is False
    assert isinstance(reader.error, ConnectionResetError)


# -- found in review (issue 30's attack list) ----------------------------------------------------------

@needs_incremental
def test_a_buffer_delivered_whole_comes_back_after_an_incremental_provide():
    """A Segment delivered by a group that lends whole buffers, released once the pool lends to an
    incremental group: its buffer goes into the new group's ring (it was kept out for good, its
    part count gone negative, when the incremental books were made after it was delivered)."""
    with provided(count=2) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        held = _one(ring, client, b"whole").segment
        ring.withdraw(GROUP)
        ring.wait(0)
        ring.provide(pool, GROUP + 1, incremental=True)
        assert pool.stats()["lent"] == 2 and pool.available == 0
        held.free()  # into the incremental group's ring
        ring.withdraw(GROUP + 1)
        assert pool.stats()["lent"] == 0 and pool.available == 2
        ring.provide(pool, GROUP + 1, incremental=True)
        ring.recv_multishot(server, GROUP + 1)
        parts = [_one(ring, client, bytes([65 + i]) * 50).segment for i in range(3)]
        assert [bytes(p) for p in parts] == [bytes([65 + i]) * 50 for i in range(3)]
        for part in parts:
            part.free()


@needs_incremental
def test_a_refused_incremental_provide_leaves_the_lending_books_alone():
    """Another Ring's provide(pool, incremental=True), refused because the pool lends already, made
    the part books all the same: the segments the first ring had delivered then kept their buffers
    out for good when released."""
    with provided(count=2) as (ring, pool), tcp_pairs(1) as [(server, client)]:
        ring.recv_multishot(server, GROUP)
        held = _one(ring, client, b"held").segment
        with Ring(4) as other, pytest.raises(ValueError, match="provided to a Ring already"):
            other.provide(pool, GROUP, incremental=True)
        held.free()
        again = _one(ring, client, b"next").segment
        again.free()
        ring.withdraw(GROUP)
        ring.wait(0)
        assert pool.available == 2 and pool.stats()["lent"] == 0


def test_a_dropped_segment_keeps_its_buffer_until_reset():
    """What the README says of a delivered Segment dropped without release: its buffer stays out
    (the pool cannot know that nothing reads it) through withdraw() and close(), until reset()."""
    pool = BufferPool(256, 2)
    with Ring(8) as ring, tcp_pairs(1) as [(server, client)]:
        ring.provide(pool, GROUP)
        ring.recv_multishot(server, GROUP)
        client.sendall(b"dropped")
        assert receive(ring)[0][1].result == 7  # the Received and its Segment dropped here
        gc.collect()
        ring.withdraw(GROUP)
        ring.wait(0)
        assert pool.available == 1 and pool.stats()["lent"] == 1
    assert pool.available == 1
    pool.reset()
    assert pool.available == 2 and pool.stats()["lent"] == 0
    pool.close()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 the collector runs at the next "
                    "bytecode boundary, never inside provide()")
def test_a_failed_provide_leaves_a_ring_its_finalizer_made_alone():
    """provide() refused (no free buffer) while the collector runs a finalizer that closes the ring
    and provides the same group on a new Ring, which gets the closed ring's descriptor number: the
    refusal must not touch the kernel after that (it unregistered the new ring's group, whose
    receive then ended with -ENOBUFS and whose withdraw() failed)."""
    hits = 0
    full = BufferPool(64, 1)
    held = full.acquire()
    other = BufferPool(64, 2)
    for _ in range(20):
        ring = Ring(4)
        made = []

        def close_and_remake(ring=ring, other=other, made=made):
            if made or ring.closed:
                return
            ring.close()
            again = Ring(4)
            again.provide(other, GROUP)
            made.append(again)

        Finalizer(close_and_remake)
        gc.set_threshold(1)
        try:
            ring.provide(full, GROUP)
        except ArenaClosedError:
            pass  # collected before provide() checked the ring: not the window
        except ValueError:
            hits += bool(made)  # refused with the finalizer run inside
        finally:
            gc.set_threshold(700)
        if made:
            [again] = made
            with tcp_pairs(1) as [(server, client)]:
                again.recv_multishot(server, GROUP)
                r = _one(again, client, b"intact")
                assert r.result == 6 and bytes(r.segment) == b"intact", r
                r.segment.free()
            again.withdraw(GROUP)
            again.close()
        ring.close()
        if hits >= 3:
            break
    gc.collect()
    held.free()
    full.close()
    other.close()
    assert hits, "the finalizer never ran inside provide()"


def test_withdraw_and_provide_again_while_other_threads_release():
    """The ring's thread withdraws the group and provides it again (whole buffers and, where the
    kernel has it, incremental, by turns) while four threads release the segments it delivered (on
    3.13t in parallel with withdraw()'s unlending and provide()'s lending): no delivered segment's
    bytes change before its release, every byte arrives in order, and at the end every buffer is
    back in the pool, none lent."""
    n_conn, count = 4, 8
    pool = BufferPool(600, count)
    ring = Ring(32)
    rng = random.Random(11)
    with tcp_pairs(n_conn) as pairs, releasers() as (work, mismatches):
        expected = [bytearray() for _ in range(n_conn)]
        got = [bytearray() for _ in range(n_conn)]
        armed = [False] * n_conn

        def take(done):
            for conn in hand_over(done, got, work):
                armed[conn] = False

        try:
            def provide(incremental=False):
                for _ in range(2000):  # until a releaser has given a buffer back
                    try:
                        return ring.provide(pool, GROUP, incremental=incremental)
                    except ValueError:  # no free buffer: every one is delivered, held by the queue
                        time.sleep(0.001)
                raise AssertionError("the releasers gave no buffer back")

            for rnd in range(12):
                provide(INCREMENTAL and rnd % 2 == 1)
                for conn in range(n_conn):
                    ring.recv_multishot(pairs[conn][0], GROUP, user_data=conn)
                    armed[conn] = True
                for _ in range(10):
                    conn = rng.randrange(n_conn)
                    msg = rng.randbytes(rng.randint(1, 1500))
                    expected[conn] += msg
                    pairs[conn][1].sendall(msg)
                    take(ring.wait(0))
                    for c in range(n_conn):
                        if not armed[c]:
                            ring.recv_multishot(pairs[c][0], GROUP, user_data=c)
                            armed[c] = True
                ring.withdraw(GROUP)  # the releasers run on meanwhile
                take(ring.wait(0))
                assert not any(armed)
            provide()
            for conn in range(n_conn):
                ring.recv_multishot(pairs[conn][0], GROUP, user_data=conn)
                armed[conn] = True
            deadline = time.monotonic() + 60
            while got != expected and time.monotonic() < deadline:
                take(ring.wait(1))
                for c in range(n_conn):
                    if not armed[c]:
                        ring.recv_multishot(pairs[c][0], GROUP, user_data=c)
                        armed[c] = True
            ring.withdraw(GROUP)
            take(ring.wait(0))
            work.join()  # every segment released
        finally:
            ring.close()
    assert got == expected
    assert not mismatches
    assert pool.available == count and pool.stats()["lent"] == 0 and pool.stats()["in_use"] == 0
    pool.close()


def test_armed_receives_fill_the_request_table_and_single_shot_completions_survive_a_full_cq():
    """A ring of 2 entries (cq_entries 4): two multishot receives and two single-shot recv()s take
    the four request slots (a fifth request: EBUSY), then the receives' buffer completions fill the
    completion queue before the recv()s complete.  The kernel keeps what the queue cannot hold and
    ends a receive rather than drop its completion: the recv()s' completions arrive, every byte of
    the receives arrives, and the slots come back."""
    pool = BufferPool(128, 64)
    with Ring(2) as ring, tcp_pairs(4) as pairs:
        assert ring.cq_entries == 4
        ring.provide(pool, GROUP)
        for i in range(2):
            ring.recv_multishot(pairs[i][0], GROUP, user_data=("multishot", i))
        bufs = [bytearray(10) for _ in range(2)]
        for i in range(2):
            ring.recv(pairs[2 + i][0], bufs[i], user_data=("recv", i))
        with pytest.raises(OSError) as info:
            ring.nop()
        assert info.value.errno == errno.EBUSY
        ring.submit()
        sent = [bytearray(), bytearray()]
        for k in range(12):
            for i in range(2):
                msg = bytes([65 + k]) * 30
                pairs[i][1].sendall(msg)
                sent[i] += msg
                os.sched_yield()
        for i in range(2):
            pairs[2 + i][1].sendall(b"single %d" % i)
        got = [bytearray(), bytearray()]
        singles = {}
        for _ in range(500):
            if len(singles) == 2 and got == sent:
                break
            for (kind, i), r in ring.wait(1):
                if kind == "recv":
                    singles[i] = r
                    continue
                if r.segment is not None:
                    got[i] += r.segment
                    r.segment.free()
                if not r.more:
                    assert r.result > 0 or r.result == -errno.ENOBUFS, r
                    ring.recv_multishot(pairs[i][0], GROUP, user_data=("multishot", i))
        assert singles == {0: 8, 1: 8} and [bytes(b[:8]) for b in bufs] == [b"single 0", b"single 1"]
        assert got == sent
        ring.nop(user_data="room")
        ring.withdraw(GROUP)
        assert ("room", 0) in ring.wait(0)
    assert pool.available == 64
    pool.close()


def test_a_socket_error_ends_every_rearmed_receive_at_once():
    """Why the README's loop re-arms only after data or -ENOBUFS (it re-armed on every result but 0,
    so a socket error made it re-arm for ever): a receive on a socket never connected ends with
    -ENOTCONN each time it is armed."""
    with provided() as (ring, _), socket.socket() as lonely:
        for _ in range(3):
            ring.recv_multishot(lonely, GROUP)
            [(_, r)] = receive(ring)
            assert r.result == -errno.ENOTCONN and not r.more and r.segment is None


class Chunk:
    """What Ring.wait() gives a RingFrameReader for a multishot receive: ``data`` in a segment of
    ``arena``."""

    more = True

    def __init__(self, arena, data):
        self.segment = arena.allocate(len(data))
        self.segment[:] = data
        self.result = len(data)


def test_ring_frame_reader_drops_the_stream_when_on_frame_raises():
    """on_frame raising in the middle of a buffer: the buffer went back with the next frame's first
    bytes unread, so the reader must not go on (it read the rest of that frame as a length prefix:
    a garbage size, up to max_frame_size allocated, and every frame after it shifted)."""
    from arenalib.aio import RingFrameReader, frame_header

    frames = []

    def on_frame(seg):
        frames.append(bytes(seg))
        seg.free()
        if len(frames) == 1:
            raise KeyError("the consumer failed")

    stream = frame_header(3) + b"abc" + frame_header(5) + b"hello" + frame_header(2) + b"xy"
    with arenalib.Arena() as arena:
        reader = RingFrameReader(on_frame, arena=arena)
        with pytest.raises(KeyError):
            reader.feed(Chunk(arena, stream[:20]))
        assert isinstance(reader.error, KeyError)
        assert reader.feed(Chunk(arena, stream[20:])) is True
        assert frames == [b"abc"] and isinstance(reader.error, KeyError)
        assert arena.stats()["live_segments"] == 0


def test_ring_frame_reader_drops_the_stream_when_a_frame_cannot_be_allocated():
    """A frame its arena cannot hold: the MemoryError left feed() with the reader looking healthy,
    and the next buffer's bytes (the middle of that frame) were read as length prefixes: a body
    holding what looks like frames came out as thousands of frames, the real next frame lost."""
    from arenalib.aio import RingFrameReader, frame_header

    frames = []

    def on_frame(seg):
        frames.append(bytes(seg))
        seg.free()

    body = (frame_header(5) + b"SMUGL") * 2000  # 26,000 bytes that look like frames
    stream = frame_header(len(body)) + body + frame_header(5) + b"hello"
    with arenalib.Arena() as source, arenalib.Arena(max_bytes=1 << 14) as small:
        reader = RingFrameReader(on_frame, arena=small)
        with pytest.raises(MemoryError):
            reader.feed(Chunk(source, stream[:4096]))
        assert isinstance(reader.error, MemoryError)
        for start in range(4096, len(stream), 4096):
            assert reader.feed(Chunk(source, stream[start:start + 4096])) is True  # given back, unread
        assert frames == [] and small.stats()["live_segments"] == 0
        assert source.stats()["live_segments"] == 0


def test_ring_frame_reader_closed_by_on_frame_reads_no_further():
    """close() from on_frame (a "quit" frame): the rest of the completion went on being parsed,
    every later frame delivered and a frame begun after it allocated (up to max_frame_size)."""
    from arenalib.aio import RingFrameReader, frame_header

    delivered = []

    def on_frame(seg):
        delivered.append(bytes(seg))
        seg.free()
        reader.close()

    stream = b"".join(frame_header(4) + w for w in (b"quit", b"evil")) + frame_header(1 << 20) + b"x"
    with arenalib.Arena() as source, arenalib.Arena() as arena:
        reader = RingFrameReader(on_frame, arena=arena)
        assert reader.feed(Chunk(source, stream)) is True
        assert reader.feed(Chunk(source, b"more")) is True  # later completions: given back
        assert delivered == [b"quit"] and arena.stats()["live_bytes"] == 0
        assert source.stats()["live_segments"] == 0


def test_ring_frame_reader_refuses_a_feed_from_inside_on_frame():
    """feed() from on_frame was accepted, and its frames came out ahead of the rest of the outer
    completion: out of order, with no error."""
    from arenalib.aio import RingFrameReader, frame_header

    delivered, pending = [], []

    def on_frame(seg):
        delivered.append(bytes(seg))
        seg.free()
        while pending:
            reader.feed(pending.pop(0))

    with arenalib.Arena() as source, arenalib.Arena() as arena:
        reader = RingFrameReader(on_frame, arena=arena)
        pending.append(Chunk(source, frame_header(4) + b"thr."))
        with pytest.raises(RuntimeError, match="called again from inside on_frame"):
            reader.feed(Chunk(source, frame_header(4) + b"one." + frame_header(4) + b"two."))
        assert delivered == [b"one."] and isinstance(reader.error, RuntimeError)
        assert source.stats()["live_segments"] == 0 and arena.stats()["live_bytes"] == 0
