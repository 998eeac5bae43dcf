"""arenalib.aio: FrameReader, driven by hand as a transport would (hypothesis over frame sizes and
read boundaries), over loopback sockets with asyncio's loop and with uvloop (probed in a child
first: a native wheel built for another CPU would kill the test process), and the deferred free it
relies on (free or release while asyncio still holds the buffer)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_ok, run_python

import arenalib
from arenalib import Arena, BufferPool, ConfinedArena
from arenalib.aio import FrameError, FrameReader, RingFrameReader, frame_header


@pytest.fixture(scope="module", autouse=True)
def _shared_arena_first():
    """The Arena that readers without arena= share lives as long as the process: made before
    conftest's leak check counts the open arenas, so it is not taken for a test's leak."""
    arenalib.aio._shared_arena()


def payload(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def wire(frames: list[bytes]) -> bytes:
    return b"".join(frame_header(len(f)) + f for f in frames)


def feed(reader: FrameReader, data: bytes, cuts: list[int]) -> None:
    """What a transport does: get_buffer, fill part of it, buffer_updated while still holding the
    buffer (as uvloop holds its Py_buffer), then let go."""
    pos = 0
    cuts = iter(cuts)
    while pos < len(data):
        buf = reader.get_buffer(-1)
        n = min(len(buf), len(data) - pos, max(1, next(cuts, len(data))))
        buf[:n] = data[pos:pos + n]
        reader.buffer_updated(n)
        buf.release()
        pos += n


def test_readers_and_frame_header_judge_their_arguments_at_once():
    with pytest.raises(ValueError, match="not -1"):
        frame_header(-1)  # a struct.error saying "too large" before
    with pytest.raises(ValueError, match="2\\*\\*64"):
        frame_header(1 << 64)
    with pytest.raises(TypeError):
        frame_header(2.5)
    assert frame_header((1 << 64) - 1) == b"\xff" * 8
    for make in (FrameReader, RingFrameReader):
        with pytest.raises(TypeError, match="on_frame must be callable"):
            make(None)
        with pytest.raises(ValueError, match="max_frame_size must be >= 0"):
            make(print, max_frame_size=-1)
    with pytest.raises(TypeError, match="on_connection_lost must be callable"):
        FrameReader(print, on_connection_lost=5)
    with pytest.raises(TypeError, match="feed\\(\\) takes a Received"):
        RingFrameReader(print).feed(b"abc")  # an AttributeError before


@settings(deadline=None)
@given(sizes=st.lists(st.one_of(st.integers(0, 20), st.integers(0, 70_000)), max_size=12),
       cuts=st.lists(st.integers(1, 100_000), max_size=60),
       staging=st.sampled_from([8, 9, 100, 65536]))
def test_frames_arrive_whole_whatever_the_read_boundaries(sizes, cuts, staging):
    frames = [payload(n, i) for i, n in enumerate(sizes)]
    got = []
    reader = FrameReader(lambda seg: got.append(seg), staging_size=staging)
    feed(reader, wire(frames), cuts)
    assert [s.tobytes() for s in got] == frames
    assert reader.frames == len(frames)
    for s in got:
        s.free(deferred=True)
    reader.connection_lost(None)


def test_a_frame_freed_inside_on_frame_waits_for_the_transports_export():
    # The segment path: the frame's bytes past the staging buffer were received into the segment
    # through get_buffer's memoryview, which the transport still holds during buffer_updated.
    seen = []

    def on_frame(seg):
        with pytest.raises(BufferError):
            seg.free()
        seg.free(deferred=True)
        seen.append((seg, seg.alive))

    with Arena() as arena:
        reader = FrameReader(on_frame, arena=arena, staging_size=16)
        feed(reader, wire([payload(1000, 1)]), [16, 500, 1000])
        [(seg, alive_inside)] = seen
        assert alive_inside and not seg.alive  # freed once feed() let the buffer go
        assert arena.stats()["live_segments"] == 0


def test_a_plain_free_inside_on_frame_says_to_defer():
    # A frame received into its segment is exported to the loop during on_frame: the plain free's
    # BufferError (naming the segment) carries the note that says what to call instead.
    def on_frame(seg):
        seg.free()

    with Arena() as arena:
        reader = FrameReader(on_frame, arena=arena, staging_size=16)
        with pytest.raises(BufferError, match="a segment of 1000 bytes") as info:
            feed(reader, wire([payload(1000, 1)]), [16, 1000])
        assert any("seg.free(deferred=True)" in note for note in info.value.__notes__)
        # A small frame, copied out of the staging buffer, is exported to nobody: the free works.
        small = FrameReader(on_frame, arena=arena, staging_size=65536)
        feed(small, wire([payload(100, 2)]), [])
        assert small.frames == 1
        reader.connection_lost(None)
        small.connection_lost(None)


def test_a_frame_above_the_limit_aborts_the_connection():
    class Transport:
        aborted = False

        def abort(self):
            self.aborted = True

    lost = []
    reader = FrameReader(lambda seg: None, max_frame_size=100, on_connection_lost=lost.append)
    transport = Transport()
    reader.connection_made(transport)
    feed(reader, frame_header(101) + b"x" * 10, [])
    assert transport.aborted and isinstance(reader.error, FrameError)
    reader.connection_lost(None)
    assert isinstance(lost[0], FrameError)


def test_connection_lost_mid_frame_frees_it():
    reader = FrameReader(lambda seg: None, staging_size=16)
    feed(reader, frame_header(10_000) + b"y" * 3000, [])
    frame = reader._frame
    assert frame is not None and frame.alive and len(frame) == 10_000
    reader.connection_lost(ConnectionResetError())
    assert not frame.alive and reader._frame is None



def test_a_reader_collected_without_connection_lost_frees_its_frames():
    # asyncio calls no connection_lost() for the connections still open when their loop closes: the
    # reader's collection is their end, or the shared arena (never closed) kept the frame cut short.
    kept = []
    reader = FrameReader(kept.append, staging_size=16)
    feed(reader, frame_header(5) + b"whole" + frame_header(10_000) + b"y" * 3000, [])
    cut_short = reader._frame
    assert cut_short is not None and kept[0].alive
    del reader
    gc.collect()
    assert not cut_short.alive and not kept[0].alive  # (a delivered frame goes as at a loss)


LOOP_CLOSED_WITH_CONNECTIONS_OPEN = """
import asyncio, gc, json, socket, warnings
warnings.simplefilter("ignore")  # (asyncio's "unclosed transport" warnings)
import arenalib.aio
from arenalib.aio import FrameReader, frame_header
peers = []
async def main():
    server = await asyncio.get_running_loop().create_server(
        lambda: FrameReader(lambda seg: seg.free(deferred=True)), "127.0.0.1", 0)
    peer = socket.create_connection(server.sockets[0].getsockname())
    peer.sendall(frame_header(1 << 20) + b"x" * (1 << 19))  # half a frame in flight
    peers.append(peer)  # (stays connected)
    await asyncio.sleep(0.05)
for _ in range(20):
    asyncio.run(main())
    gc.collect()
print(json.dumps(arenalib.aio._shared_arena().stats()["live_bytes"]))
"""


def test_frames_cut_short_go_when_the_loop_closes_with_their_connections_open():
    # 20 loops, each closed with a connection half-way through a 1 MiB frame: 20 MiB kept before.
    live = int(assert_ok(run_python(LOOP_CLOSED_WITH_CONNECTIONS_OPEN)).splitlines()[-1])
    assert live == 0


def test_a_ring_reader_closed_or_collected_mid_frame_frees_the_frame():
    # RingFrameReader frees a frame cut short at the end of stream it is fed; a server that ends a
    # connection itself (or drops the reader, or closes the ring with the receive armed) feeds none.
    with Arena() as arena:
        for how in ("close", "collect"):
            reader = RingFrameReader(lambda seg: None)
            data = arena.allocate_from(frame_header(100_000) + b"z" * 5000)
            assert reader.feed(SimpleNamespace(segment=data, result=len(data), more=True))
            frame = reader._frame
            assert frame is not None and frame.alive and not data.alive
            if how == "close":
                reader.close()
                later = arena.allocate_from(b"q" * 10)
                assert reader.feed(SimpleNamespace(segment=later, result=10, more=True))
                assert not later.alive and reader.closed and reader.frames == 0 and reader.error is None
            else:
                del reader
                gc.collect()
            assert not frame.alive

def test_staging_size_must_hold_a_length_prefix():
    with pytest.raises(ValueError):
        FrameReader(lambda seg: None, staging_size=7)


# -- the deferred free --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Arena, ConfinedArena])
def test_free_deferred_waits_for_every_export(kind):
    with kind() as a:
        seg = a.allocate(64).fill(5)
        views = [memoryview(seg), memoryview(seg)[8:16]]
        seg.free(deferred=True)
        assert seg.alive and seg.tobytes() == b"\x05" * 64  # usable until the last export goes
        views.pop().release()
        assert seg.alive
        views.pop().release()
        assert not seg.alive and a.stats()["live_segments"] == 0
        with pytest.raises(arenalib.ArenaClosedError):
            seg.free(deferred=True)


def test_free_deferred_without_exports_frees_now():
    with Arena() as a:
        seg = a.allocate(8)
        seg.free(deferred=True)
        assert not seg.alive


def test_release_deferred_returns_the_buffer_to_its_pool():
    with BufferPool(4096, 2) as pool:
        seg = pool.acquire()
        view = memoryview(seg)
        with pytest.raises(BufferError):
            pool.release(seg)
        pool.release(seg, deferred=True)
        assert seg.alive and pool.available == 1
        with pytest.raises(BufferError):
            pool.reset()  # the export still pins it
        view.release()
        assert not seg.alive and pool.available == 2
        other = BufferPool(4096, 1)
        with pytest.raises(ValueError):
            other.release(pool.acquire(), deferred=True)
        other.close()


def test_deferred_free_of_a_confined_segment_released_elsewhere_waits_for_close():
    import threading

    with ConfinedArena() as a:
        seg = a.allocate(32)
        view = memoryview(seg)
        seg.free(deferred=True)
        worker = threading.Thread(target=view.release)
        worker.start()
        worker.join()
        assert a.stats()["live_segments"] == 1  # not freed from the other thread; close takes it


def test_free_deferred_of_a_slicing_segment_is_refused_at_the_call():
    # A SlicingArena frees nothing one by one: free(deferred=True) must say so at once, export or
    # not, instead of failing later inside __releasebuffer__ where the error is unraisable.
    import sys

    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        a = arenalib.SlicingArena()
        seg = a.allocate(64)
        with memoryview(seg):
            with pytest.raises(arenalib.UnsupportedOperation):
                seg.free(deferred=True)
    finally:
        sys.unraisablehook = hook
    a.close()
    assert not unraisable


def test_connection_lost_mid_frame_with_a_slicing_arena_still_reports_the_loss():
    lost = []
    with arenalib.SlicingArena() as arena:
        reader = FrameReader(lambda seg: None, arena=arena, staging_size=16,
                             on_connection_lost=lost.append)
        feed(reader, frame_header(1000) + b"x" * 8, [])
        reader.connection_lost(None)  # raised UnsupportedOperation from the partial frame's free
    assert lost == [None]


# -- over sockets ----------------------------------------------------------------------------------

LOOPBACK = r"""
import asyncio, json, random, sys
from arenalib import Arena
from arenalib.aio import FrameReader, frame_header

use_uvloop = sys.argv[1] == "uvloop"
sizes = [0, 1, 8, 65535, 65536, 65537, 1 << 20, 3 << 20]
sizes += [random.Random(i).randrange(200_000) for i in range(20)]
frames = [random.Random(i).randbytes(n) for i, n in enumerate(sizes)]

async def main():
    got, done = [], asyncio.get_running_loop().create_future()
    arena = Arena()

    def on_frame(seg):
        got.append(seg.tobytes())
        seg.free(deferred=True)
        if len(got) == len(frames):
            done.set_result(None)

    server = await asyncio.get_running_loop().create_server(
        lambda: FrameReader(on_frame, arena=arena), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for f in frames:
        writer.write(frame_header(len(f)))
        writer.write(f)
        await writer.drain()
    await asyncio.wait_for(done, 60)
    writer.close()
    server.close()
    await server.wait_closed()
    live = arena.stats()["live_segments"]
    arena.close()
    loop = type(asyncio.get_running_loop()).__module__
    print(json.dumps({"same": got == frames, "live": live, "loop": loop}))

if use_uvloop:
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def uvloop_usable() -> str | None:
    """None when uvloop imports and runs a loop in a child process here, else why not."""
    result = run_python("import uvloop, asyncio; uvloop.run(asyncio.sleep(0))")
    if result.returncode == 0:
        return None
    if result.returncode < 0:
        return f"uvloop dies on this machine: signal {-result.returncode}"
    return "uvloop is not installed" if "No module named" in result.stderr else result.stderr[-300:]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_frames_over_loopback(loop):
    if loop == "uvloop":
        why = uvloop_usable()
        if why:
            pytest.skip(why)
    result = run_python(LOOPBACK, loop)
    assert result.returncode == 0, result.stderr
    figures = __import__("json").loads(result.stdout.splitlines()[-1])
    assert figures == {"same": True, "live": 0, "loop": figures["loop"]}
    assert figures["loop"].startswith("uvloop" if loop == "uvloop" else "asyncio")


# -- FrameReader.write: a Segment on the transport ---------------------------------------------------

async def _serve(on_frame):
    """A FrameReader server calling ``on_frame(reader, seg)``, and a client stream to it."""
    def make():
        reader = FrameReader(lambda seg: on_frame(reader, seg))
        return reader

    server = await asyncio.get_running_loop().create_server(make, "127.0.0.1", 0)
    client = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    return server, client


def test_write_sends_segments_back_without_a_copy_to_bytes():
    frames = [payload(n, n) for n in (0, 1, 100, 70_000, 1 << 20)]

    def echo(reader, seg):
        reader.write(frame_header(len(seg)))
        reader.write(seg)              # a Segment: asyncio's own write() refuses it
        reader.write(seg.slice(0, 0))  # a slice, empty: nothing sent
        seg.free(deferred=True)        # freed once the transport let go of it

    async def main():
        server, (rd, wr) = await _serve(echo)
        for f in frames:
            wr.write(frame_header(len(f)) + f)
        await wr.drain()
        got = []
        for _ in frames:
            (size,) = arenalib.aio.FRAME_HEADER.unpack(await rd.readexactly(8))
            got.append(await rd.readexactly(size))
        wr.close()
        server.close()
        await server.wait_closed()
        return got

    assert asyncio.run(main()) == frames


WRITE_HELD = r"""
import asyncio, json, socket, sys
from arenalib import Arena
from arenalib.aio import FrameReader, frame_header

size = 4 << 20
outcome = {}

def send(reader, seg):
    seg.free(deferred=True)
    reader.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    with Arena() as arena:
        big = arena.allocate(size, zero=False).fill(0x5A)
        reader.write(big)
        try:
            big.free()
            outcome["free"] = "freed"  # copied by the transport (3.10, 3.11)
        except BufferError:
            outcome["free"] = "refused"  # held by the transport: no copy
    stats = arena.stats()
    outcome["arena"] = {"closed": stats["closed"], "held_by_exports": stats["held_by_exports"]}

async def main():
    def make():
        reader = FrameReader(lambda seg: send(reader, seg))
        return reader
    server = await asyncio.get_running_loop().create_server(make, "127.0.0.1", 0)
    rd, wr = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    wr.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    wr.write(frame_header(1) + b"x")
    await wr.drain()
    while "arena" not in outcome:
        await asyncio.sleep(0.01)
    data = await rd.readexactly(size)
    wr.close()
    server.close()
    await server.wait_closed()
    outcome["intact"] = data == b"\x5a" * size

asyncio.run(main())
print(json.dumps(outcome))
"""


def test_write_keeps_the_segment_until_the_transport_sent_it():
    # The peer reads nothing until the segment was written and its arena closed: the transport
    # holds what the socket did not take (a memoryview of the segment from 3.12 on, a copy
    # before), and the bytes arrive intact whatever the writer did meanwhile.  Small socket buffers
    # on both sides, so that a few MiB stay with the transport.  In a child: the megabytes it moves
    # would stay in this process, and a later test's child, forked from it, inherits its peak RSS
    # (ru_maxrss survives fork and exec).
    outcome = json.loads(assert_ok(run_python(WRITE_HELD)).splitlines()[-1])
    assert outcome["intact"] and outcome["arena"]["closed"]
    if sys.version_info >= (3, 12):
        assert outcome["free"] == "refused"
        assert outcome["arena"]["held_by_exports"] == 1  # closed deferred at the with's end


def test_write_needs_a_transport_and_a_buffer():
    reader = FrameReader(lambda seg: None)
    with pytest.raises(RuntimeError, match="connection_made"):
        reader.write(b"x")

    class Transport:
        def __init__(self):
            self.sent = []

        def write(self, data):
            assert isinstance(data, (bytes, bytearray, memoryview))
            self.sent.append(bytes(data))

    reader.connection_made(Transport())
    reader.write(arenalib.allocate(3).fill(1))
    reader.write(np.arange(6, dtype=np.uint16).reshape(2, 3))  # cast to bytes, C order
    with pytest.raises(TypeError):
        reader.write("text")
    assert reader.transport.sent == [b"\x01" * 3, np.arange(6, dtype=np.uint16).tobytes()]
    reader.connection_lost(None)


def test_module_is_importable_without_a_running_loop():
    assert os.path.basename(arenalib.aio.__file__) == "aio.py"
    assert asyncio.BufferedProtocol in FrameReader.__mro__
