"""FrameReader under attack (issue 23): a server's memory is bounded by what is in flight, not by the
connections it has seen (item 8: thousands of idle connections, each of which used to take an arena
slot and a 64 KiB staging buffer); connection_lost always reports the loss (item 12); and a
connection that cannot have an arena, or a frame that cannot be allocated, is reported, never
dropped silently (item 14b).  The scenarios with thousands of sockets run in a child interpreter."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket

import pytest
from support import SANITIZED, assert_ok, run_python
from test_aio import uvloop_usable

import arenalib
import arenalib.aio
from arenalib import Arena, ConfinedArena, SlicingArena
from arenalib.aio import FrameReader, frame_header


@pytest.fixture(scope="module", autouse=True)
def _shared_arena_first():
    """The shared Arena of readers without arena= lives as long as the process: made before the
    leak check of conftest counts the open arenas, so it is not taken for a test's leak."""
    arenalib.aio._shared_arena()


def feed(reader: FrameReader, data: bytes, step: int = 1 << 30) -> None:
    """What a transport does: get_buffer, fill part of it, buffer_updated while still holding it."""
    pos = 0
    while pos < len(data):
        buf = reader.get_buffer(-1)
        n = min(len(buf), len(data) - pos, step)
        buf[:n] = data[pos:pos + n]
        reader.buffer_updated(n)
        buf.release()
        pos += n


def wire(*frames: bytes) -> bytes:
    return b"".join(frame_header(len(f)) + f for f in frames)


# -- item 8: idle connections ---------------------------------------------------------------------------

IDLE = r"""
import asyncio, gc, json, os, resource, subprocess, sys, time
import arenalib
from arenalib import ConfinedArena
from arenalib.aio import FrameReader

N, HELD = int(sys.argv[1]), 50
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < N + 100 and hard > soft:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(N + 100, hard), hard))
n = min(N, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100)

# The peer: its own process (so the server's figures are the server's), n connections of which the
# first HELD send one frame each; then every one sends the first 3 bytes of a length prefix (data in
# flight: 3 bytes, not a staging buffer) and idles until told to close them all.
CLIENT = r'''
import resource, socket, sys
port, n, held = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(n + 100, hard), hard))
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
for i, s in enumerate(socks):
    s.sendall(((1000).to_bytes(8, "big") + b"x" * 1000 if i < held else b"") + b"\0\0\0")
print("connected", flush=True)
sys.stdin.read()
for s in socks:
    s.close()
'''

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

async def main():
    loop = asyncio.get_running_loop()
    counts = {"made": 0, "lost": 0, "read": 0}
    errors, frames = [], []
    loop.set_exception_handler(lambda loop, context: errors.append(repr(context.get("exception"))))

    class Counted(FrameReader):
        def connection_made(self, transport):
            super().connection_made(transport)
            counts["made"] += 1

        def buffer_updated(self, nbytes):
            super().buffer_updated(nbytes)
            if self._staged == 3:  # the prefix's first bytes, after any frame
                counts["read"] += 1

    def lost(exc):
        counts["lost"] += 1

    server = await loop.create_server(lambda: Counted(frames.append, on_connection_lost=lost),
                                      "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    gc.collect()
    before = rss()
    slots_before = arenalib.pool_stats()["slots_created"]
    t0 = time.monotonic()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, str(port), str(n), str(HELD), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE)
    await asyncio.wait_for(client.stdout.readline(), 120)
    while (counts["read"] < n or len(frames) < HELD) and time.monotonic() - t0 < 30:
        await asyncio.sleep(0.05)
    gc.collect()
    during = rss()
    slots_during = arenalib.pool_stats()["slots_created"]
    try:  # other arenas keep working meanwhile
        with ConfinedArena() as a:
            a.allocate(100).fill(1)
        other = "ok"
    except MemoryError as exc:
        other = repr(exc)
    alive_during = sum(seg.alive for seg in frames)
    client.stdin.close()
    await client.wait()
    while counts["lost"] < counts["made"] and time.monotonic() - t0 < 60:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    gc.collect()
    after = rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the close's transient too
    server.close()
    await server.wait_closed()
    print(json.dumps({
        "n": n, "hard_limit": hard, "made": counts["made"], "read": counts["read"], "lost": counts["lost"],
        "errors": errors[:3],
        "before": before, "during": during, "after": after, "peak": peak, "other_arena": other,
        "slots_taken": slots_during - slots_before, "frames": len(frames), "alive_during": alive_during,
        "alive_after": sum(seg.alive for seg in frames), "seconds": time.monotonic() - t0}))

asyncio.run(main())
"""

MiB = 1 << 20


def idle_connections(n: int) -> dict:
    figures = json.loads(assert_ok(run_python(IDLE, str(n), timeout=240)).splitlines()[-1])
    print(json.dumps(figures))
    # All connections are served, each of the first HELD frames delivered, and no other arena
    # fails for it (at HEAD: an Arena per connection, at most 4,000, the rest dropped silently).
    n = figures["n"]
    assert (figures["made"], figures["read"], figures["lost"], figures["errors"]) == (n, n, n, [])
    assert figures["other_arena"] == "ok"
    assert figures["slots_taken"] <= 1  # the shared Arena (made here by the first connection)
    # Frames the consumer kept without freeing die with their connection.
    assert (figures["frames"], figures["alive_during"], figures["alive_after"]) == (50, 50, 0)
    # At HEAD 4,000 connections took 660 MiB (64 KiB of staging and a jemalloc arena each) and
    # kept 627 MiB after they closed; a staging buffer kept between reads would be 640 MiB here.
    # What is left now is CPython's own (its allocator's fragmentation after asyncio's 10,000
    # transports: a plain asyncio.Protocol leaves 10 MiB on 3.11, 9-17 MiB on 3.13t, where
    # FrameReader's runs left 15-34 MiB: mimalloc keeps more, and varies).  The peak
    # covers the close: 10,000 peers closing at once are 10,000 reads that find EOF, each with a
    # staging buffer taken (640 MiB, kept by 3.13t's allocator, had eof_received() not given
    # them back).  The peak's bound is wider than the idle bound: CPython's own transient at the
    # close varies (3.13t here: 36-43 MiB over the baseline, 67.6 MiB once in CI with 37.5 MiB
    # idle), and a buffer per connection would still be 5x over it.
    assert figures["during"] - figures["before"] < 64 * MiB, figures
    assert figures["peak"] - figures["before"] < 128 * MiB, figures
    assert figures["after"] - figures["before"] < 48 * MiB, figures
    return figures


def fd_room() -> int:
    """Connections the child can hold: its fd limit can be raised to the hard limit."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 100


@pytest.mark.skipif(SANITIZED, reason="RSS figures mean nothing under ASan")
def test_ten_thousand_idle_connections_take_no_arena_and_no_buffer_each():
    # ~5 s here.  The server needs one fd a connection (the peer is another process): 10,000 fit
    # in a hard limit of 10,100; below that, as many as fit (the figures printed say how many; past
    # 4,000 both faults of HEAD show).
    figures = idle_connections(min(10_000, fd_room()))
    assert figures["seconds"] < 60


def test_readers_without_an_arena_share_one_and_hold_no_buffer_between_reads():
    shared = arenalib.aio._shared_arena()
    before = arenalib.live_objects()["open_arenas"]
    got: list = []
    readers = [FrameReader(got.append, staging_size=64) for _ in range(100)]
    for r in readers:
        feed(r, wire(b"a" * 10, b"b" * 200) + frame_header(5)[:3])  # ends inside a length prefix
        assert r._arena is shared
        assert r._staging is None and r._carry == frame_header(5)[:3]
    assert arenalib.live_objects()["open_arenas"] == before
    for r in readers:
        feed(r, frame_header(5)[3:] + b"hello")
        assert r._staging is None and r._carry == b""
    assert sorted({s.tobytes() for s in got}) == [b"a" * 10, b"b" * 200, b"hello"]
    for r in readers:
        r.connection_lost(None)
    assert not any(s.alive for s in got)  # kept by the consumer, freed with their connection


def test_frames_freed_by_the_consumer_are_forgotten_as_frames_arrive():
    reader = FrameReader(lambda seg: seg.free(deferred=True), staging_size=4096)
    for _ in range(200):
        feed(reader, wire(*[b"z" * 100] * 30))
    assert reader.frames == 6000
    assert len(reader._delivered) <= 16  # not one entry a frame ever delivered
    reader.connection_lost(None)


def test_frames_still_held_die_with_the_connection_even_while_exported():
    kept: list = []
    reader = FrameReader(kept.append, staging_size=64)
    feed(reader, wire(b"1" * 10, b"2" * 1000, b"3" * 20), step=50)  # the 1000-byte one via its segment
    assert [len(s) for s in kept] == [10, 1000, 20]
    kept[2].free()  # freed by its consumer already: nothing to do for it
    view = memoryview(kept[1])
    reader.connection_lost(None)
    assert not kept[0].alive
    assert kept[1].alive and kept[1].tobytes() == b"2" * 1000  # usable until its view goes
    view.release()
    assert not kept[1].alive


def test_a_callers_arena_keeps_its_frames():
    with Arena() as arena:
        kept: list = []
        reader = FrameReader(kept.append, arena=arena)
        feed(reader, wire(b"q" * 50))
        reader.connection_lost(None)
        assert kept[0].alive and reader._delivered == []  # the caller's: nothing tracked


# -- item 12: connection_lost always reports ----------------------------------------------------------


@pytest.mark.parametrize("how", ["reset", "close"])
@pytest.mark.parametrize("kind", [Arena, ConfinedArena, SlicingArena])
def test_connection_lost_reports_after_the_callers_arena_was_reset_mid_frame(kind, how):
    lost = []
    arena = kind()
    reader = FrameReader(lambda seg: None, arena=arena, staging_size=16, on_connection_lost=lost.append)
    feed(reader, frame_header(1000) + b"x" * 100)
    assert reader._frame is not None
    getattr(arena, how)()  # the owner's right; the cut-short frame is dead now
    error = ConnectionResetError()
    reader.connection_lost(error)  # raised ArenaClosedError at HEAD, and never reported the loss
    assert lost == [error]
    arena.close()


def test_connection_lost_reports_even_when_freeing_a_frame_fails_unexpectedly():
    class Odd:
        def free(self, *, deferred=False):
            raise RuntimeError("boom")

    lost = []
    reader = FrameReader(lambda seg: None, on_connection_lost=lost.append)
    reader._frame = Odd()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="boom"):  # raised to asyncio, which logs it ...
        reader.connection_lost(None)
    assert lost == [None]  # ... after the loss was reported


# -- item 14b: no arena, no memory ---------------------------------------------------------------------

NO_ARENA = r"""
import asyncio, json, socket, sys
from arenalib import ConfinedArena
from arenalib.aio import FrameReader

held = []
try:  # every arena slot of the process taken (the shared Arena of readers not made yet)
    while True:
        held.append(ConfinedArena())
except MemoryError:
    pass

async def main():
    loop = asyncio.get_running_loop()
    reported, lost = [], []
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    server = await loop.create_server(lambda: FrameReader(lambda s: None, on_connection_lost=lost.append),
                                      "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((5).to_bytes(8, "big") + b"hello")
    eof = await asyncio.wait_for(reader.read(), 10)   # the server aborts the connection
    for _ in range(100):
        if lost:
            break
        await asyncio.sleep(0.01)
    writer.close()
    server.close()
    await server.wait_closed()
    print(json.dumps({
        "slots": len(held), "eof": eof.decode(), "lost": [type(e).__name__ for e in lost],
        "reported": [(c.get("message"), type(c.get("exception")).__name__,
                      type(c.get("protocol")).__name__) for c in reported]}))

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
for a in held:
    a.close()
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_without_an_arena_is_reported_and_aborted(loop):
    # At HEAD FrameReader() made an Arena in the protocol factory; asyncio drops a factory's error
    # silently outside debug mode: the connection vanished and nobody heard of it.
    if loop == "uvloop" and (why := uvloop_usable()):
        pytest.skip(why)
    figures = json.loads(assert_ok(run_python(NO_ARENA, loop, timeout=120)).splitlines()[-1])
    assert figures["slots"] >= 3000
    assert figures["eof"] == ""
    assert figures["lost"] == ["MemoryError"]
    assert figures["reported"] == [["FrameReader: no arena for the connection's frames; connection aborted",
                                    "MemoryError", "FrameReader"]]


def test_without_a_running_loop_the_failure_goes_to_the_arenalib_aio_logger(monkeypatch, caplog):
    def no_arena():
        raise MemoryError("no arena for you")

    class Transport:
        aborted = False

        def abort(self):
            self.aborted = True

    monkeypatch.setattr(arenalib.aio, "_shared_arena", no_arena)
    lost = []
    reader = FrameReader(lambda seg: None, on_connection_lost=lost.append)
    transport = Transport()
    with caplog.at_level(logging.ERROR, logger="arenalib.aio"):
        reader.connection_made(transport)  # type: ignore[arg-type]
    assert transport.aborted
    [record] = [r for r in caplog.records if r.name == "arenalib.aio"]
    assert "no arena" in record.getMessage() and isinstance(record.exc_info[1], MemoryError)
    reader.connection_lost(None)
    assert [type(e) for e in lost] == [MemoryError]


def test_a_frame_the_callers_arena_cannot_hold_is_reported_not_silent():
    # max_bytes of the caller's arena: allocate() raises from buffer_updated(); asyncio reports it
    # to the exception handler and closes the connection, the error going to on_connection_lost.
    async def main():
        loop = asyncio.get_running_loop()
        reported, lost = [], []
        loop.set_exception_handler(lambda loop, context: reported.append(context))
        arena = Arena(max_bytes=4096)
        done = loop.create_future()

        def on_lost(exc):
            lost.append(exc)
            done.set_result(None)

        server = await loop.create_server(
            lambda: FrameReader(lambda seg: seg.free(deferred=True), arena=arena, on_connection_lost=on_lost),
            "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(wire(b"ok" * 10) + frame_header(1 << 20) + b"x" * 100)
        await asyncio.wait_for(done, 10)
        sock.close()
        server.close()
        await server.wait_closed()
        live = arena.stats()["live_segments"]
        arena.close()
        return reported, lost, live

    reported, lost, live = asyncio.run(main())
    assert [type(e) for e in lost] == [type(reported[0]["exception"])]
    assert isinstance(lost[0], MemoryError)
    assert "buffer_updated" in reported[0]["message"]
    assert live == 0


FORK = r"""
import os, signal
import arenalib.aio as aio
from arenalib.aio import FrameReader, frame_header

aio._shared_lock.acquire()  # as if another thread were making the shared Arena at the fork
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a hang (the lock still held) kills the fork child: SIGALRM
    got = []
    reader = FrameReader(got.append)
    buf = reader.get_buffer(-1)
    data = frame_header(3) + b"abc"
    buf[:len(data)] = data
    reader.buffer_updated(len(data))
    os._exit(0 if [s.tobytes() for s in got] == [b"abc"] else 3)
aio._shared_lock.release()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_child_makes_its_shared_arena_whatever_the_lock_was_doing():
    assert assert_ok(run_python(FORK, timeout=60)).split() == ["0"]  # -14: hung on the lock
