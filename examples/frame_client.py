"""The client of examples/frame_server.py: sends length-prefixed frames over TCP and checks that each
reply carries the frame's length and sha256.

    python examples/frame_client.py [--host 127.0.0.1] [--port 8765] [--sizes 0,1,65536,1048576]
                                    [--count N] [--seed S] [--no-uvloop]

Each frame is ``arenalib.aio.frame_header(n)`` (an 8-byte big-endian length), then n bytes; the
server answers each with 40 bytes, the length and the sha256 digest, in order.  The frames cycle
through ``--sizes`` (random bytes, seeded), ``--count`` of them in all.

The pattern: ``writer.write(frame_header(len(data)))``, ``writer.write(data)`` and ``await
writer.drain()`` per frame (drain waits while the socket's send buffer is full: flow control);
a second task reads the replies meanwhile, so neither side ever waits for the other with a full
buffer.  Nothing here needs arenalib's safety rules: the client sends bytes objects, and the
server's side (frame_server.py) is where frames land in arena memory.

Exits with status 0 when every reply matched, 1 otherwise (a wrong reply, or the server closing the
connection early: for example a frame above its --max-frame-size).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import struct
import sys
import time

from arenalib.aio import frame_header

REPLY = struct.Struct("!Q32s")   # keep in step with frame_server.py


async def run(host: str, port: int, frames: list[bytes]) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    expected = [(len(f), hashlib.sha256(f).digest()) for f in frames]
    start = time.perf_counter()

    async def replies() -> int:
        for i, (size, digest) in enumerate(expected):
            try:
                got = REPLY.unpack(await reader.readexactly(REPLY.size))
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                why = "closed" if isinstance(exc, asyncio.IncompleteReadError) else f"reset ({exc})"
                print(f"the server {why} the connection after {i} of {len(frames)} replies")
                return 1
            if got != (size, digest):
                print(f"frame {i}: sent {size} bytes with sha256 {digest.hex()}, the server saw "
                      f"{got[0]} bytes with sha256 {got[1].hex()}")
                return 1
        return 0

    checking = asyncio.ensure_future(replies())
    try:
        for f in frames:
            writer.write(frame_header(len(f)))
            writer.write(f)
            await writer.drain()
    except ConnectionError as exc:
        print(f"sending failed: {exc}")
    status = await checking
    seconds = time.perf_counter() - start
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass
    if status == 0:
        total = sum(len(f) for f in frames)
        print(f"{len(frames)} frames, {total} bytes: every reply matched "
              f"({seconds * 1e3:.1f} ms, {total / max(seconds, 1e-9) / 1e6:.0f} MB/s)")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--sizes", default="0,1,65536,1048576", help="frame sizes, comma-separated")
    parser.add_argument("--count", type=int, default=None, help="frames to send (default: one per size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-uvloop", action="store_true", help="asyncio's own loop even with uvloop")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    count = len(sizes) if args.count is None else args.count
    rng = random.Random(args.seed)
    frames = [rng.randbytes(sizes[i % len(sizes)]) for i in range(count)]
    coro = run(args.host, args.port, frames)
    uvloop = None
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
    if uvloop is None:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
