"""A TCP server that receives length-prefixed frames straight into arena memory with
arenalib.aio.FrameReader (an asyncio BufferedProtocol) and answers each frame with its length and
sha256.  examples/frame_client.py is its client.

    python examples/frame_server.py [--host 127.0.0.1] [--port 8765] [--once] [--no-uvloop]
                                    [--max-frame-size N]

The wire format: each frame is an 8-byte big-endian length, then that many bytes
(``arenalib.aio.frame_header(n)``).  Each reply is 40 bytes: the frame's length (8 bytes,
big-endian) and its sha256 digest (32 bytes), in the order the frames came.

The pattern:

* ``loop.create_server(lambda: FrameReader(on_frame, ...), host, port)``: one FrameReader per
  connection.  Its ``get_buffer()`` hands asyncio the memory of the frame being received, a Segment of
  an arena, so the socket's ``recv_into`` writes a large frame's bytes where they will stay: no
  ``bytearray`` per frame, no copy.  The readers share one Arena (so an idle connection holds no
  arena and no buffer), and each frees the frames it delivered that are still alive when its
  connection is lost.
* ``on_frame(seg)`` receives each whole frame; the segment is then the callee's.

The safety rules:

* asyncio still holds its export of the buffer it got from ``get_buffer()`` while it calls
  ``buffer_updated()``, and ``on_frame`` runs inside that call.  A plain ``seg.free()`` there meets the
  live export and raises BufferError.  ``seg.free(deferred=True)`` frees the segment as soon as the
  last export is released instead (at once when there is none): call it when done with a frame.
* Read a frame through the segment (``hashlib.sha256(seg)``, ``memoryview(seg)``, ``numpy.frombuffer``)
  and release every view of it before it is freed; a view kept alive keeps the memory, and a freed
  segment raises ArenaClosedError on any later use rather than showing someone else's bytes.
* ``max_frame_size`` bounds what one length prefix can make the server allocate: a larger length
  aborts the connection, and the FrameError reaches ``on_connection_lost``.
* uvloop, when importable, runs the loop (``--no-uvloop``: asyncio's own); FrameReader works with both.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import struct
import sys

from arenalib import Segment
from arenalib.aio import FrameReader

REPLY = struct.Struct("!Q32s")   # a frame's length and its sha256


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.frames = 0
        self.bytes = 0


def make_reader(stats: Stats, max_frame_size: int, closed: asyncio.Future | None) -> FrameReader:
    """One connection's protocol: a FrameReader whose ``on_frame`` answers and frees each frame."""
    frames = nbytes = 0

    def on_frame(seg: Segment) -> None:
        nonlocal frames, nbytes
        digest = hashlib.sha256(seg).digest()      # reads the segment in place; the view ends here
        size = len(seg)
        seg.free(deferred=True)                    # asyncio may still hold the buffer: free after it
        assert reader.transport is not None
        reader.transport.write(REPLY.pack(size, digest))
        frames += 1
        nbytes += size

    def on_connection_lost(exc: BaseException | None) -> None:
        stats.connections += 1
        stats.frames += frames
        stats.bytes += nbytes
        why = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        print(f"connection closed: {frames} frames, {nbytes} bytes{why}", flush=True)
        if closed is not None and not closed.done():
            closed.set_result(None)

    reader = FrameReader(on_frame, max_frame_size=max_frame_size, on_connection_lost=on_connection_lost)
    return reader


async def serve(host: str, port: int, once: bool, max_frame_size: int) -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    closed = loop.create_future() if once else None
    server = await loop.create_server(lambda: make_reader(stats, max_frame_size, closed), host, port)
    name = type(loop).__module__.split(".")[0]
    bound = server.sockets[0].getsockname()
    print(f"listening on {bound[0]}:{bound[1]} ({name} loop)", flush=True)
    async with server:
        if closed is not None:
            await closed     # --once: the first connection's end ends the server
        else:
            await server.serve_forever()
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0: any free port (printed)")
    parser.add_argument("--once", action="store_true", help="exit when the first connection closes")
    parser.add_argument("--no-uvloop", action="store_true", help="asyncio's own loop even with uvloop")
    parser.add_argument("--max-frame-size", type=int, default=1 << 30, help="largest frame accepted")
    args = parser.parse_args()
    coro = serve(args.host, args.port, args.once, args.max_frame_size)
    uvloop = None
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
    if uvloop is None:
        stats = asyncio.run(coro)
    else:
        stats = uvloop.run(coro)
    print(f"served {stats.connections} connection(s), {stats.frames} frames, {stats.bytes} bytes")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
