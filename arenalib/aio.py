"""asyncio protocols that receive straight into arenalib memory.

``FrameReader`` reads length-prefixed frames (an 8-byte big-endian length, then that many bytes)
from a stream and hands each one over as a Segment of an arena, received into by the socket itself
(``recv_into``): no ``bytearray`` per frame, no copy of a large frame.

The trap it handles: asyncio hands the buffer from ``get_buffer()`` to the socket as a buffer
export and still holds that export while it calls ``buffer_updated()`` (uvloop keeps its
``Py_buffer`` until the call returns; the selector loop keeps its ``memoryview``).  A segment freed
or released inside ``buffer_updated()``, or inside ``on_frame`` called from it, meets a live export
and raises BufferError.  ``seg.free(deferred=True)`` and ``pool.release(seg, deferred=True)`` free it
as soon as the last export is released instead, which is what a frame's consumer should call.

    def on_frame(seg):
        handle(memoryview(seg))
        seg.free(deferred=True)

    server = await loop.create_server(lambda: FrameReader(on_frame), host, port)
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

from arenalib._arena import Arena, ArenaBase, Segment
from arenalib._errors import UnsupportedOperation

__all__ = ["FRAME_HEADER", "FrameError", "FrameReader", "frame_header"]

FRAME_HEADER = struct.Struct("!Q")
"""The length prefix of a frame: 8 bytes, big-endian, unsigned."""


class FrameError(ValueError):
    """A frame's length prefix asks for more than the reader's ``max_frame_size``."""


def frame_header(size: int) -> bytes:
    """The length prefix of a frame of ``size`` bytes (send it, then the frame's bytes)."""
    return FRAME_HEADER.pack(size)


class FrameReader(asyncio.BufferedProtocol):
    """Length-prefixed frames received into Segments of an arena, one Segment a frame.

    FrameReader(on_frame, *, arena=None, max_frame_size=1 << 30, staging_size=65536,
    on_connection_lost=None).  ``on_frame(segment)`` gets each whole frame; the segment is then the
    callee's, to free with ``segment.free(deferred=True)`` when done (or to leave to the arena's
    close).  Without ``arena``, the reader makes an Arena of its own and closes it when the
    connection is lost, so no frame outlives the connection unless the caller gives the arena (a
    frame's export still alive then keeps that arena open until it is collected, with the
    ResourceWarning of an unclosed arena: release frames' memoryviews with the connection, or pass
    an arena of your own).

    Small frames and the length prefixes land in a staging buffer first (one ``recv_into`` may
    carry several); a frame's bytes past the first read go straight into its segment.  A length
    above ``max_frame_size`` aborts the connection; the FrameError goes to ``on_connection_lost``
    (or is stored in ``error``)."""

    def __init__(self, on_frame: Callable[[Segment], object], *, arena: ArenaBase | None = None,
                 max_frame_size: int = 1 << 30, staging_size: int = 65536,
                 on_connection_lost: Callable[[BaseException | None], object] | None = None) -> None:
        if staging_size < FRAME_HEADER.size:
            raise ValueError(f"staging_size must be at least {FRAME_HEADER.size}, not {staging_size}")
        self._on_frame = on_frame
        self._on_connection_lost = on_connection_lost
        self._owns_arena = arena is None
        self._arena: ArenaBase = Arena() if arena is None else arena
        self._max_frame_size = max_frame_size
        self._staging = bytearray(staging_size)
        self._staged = 0                     # bytes in the staging buffer
        self._frame: Segment | None = None   # the frame being received into
        self._filled = 0                     # bytes of it received so far
        self.transport: asyncio.Transport | None = None
        self.error: BaseException | None = None
        self.frames = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            # (The stub gives Segment __buffer__ from Python 3.12 on, as CPython's types have it.)
            return memoryview(self._frame)[self._filled:]  # type: ignore[arg-type]
        return memoryview(self._staging)[self._staged:]

    def buffer_updated(self, nbytes: int) -> None:
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled == len(frame):
                self._frame = None
                self._deliver(frame)
            return
        self._staged += nbytes
        self._take_staged_frames()

    def _take_staged_frames(self) -> None:
        """Every whole frame in the staging buffer, and the start of the next one's segment."""
        staging = self._staging
        start = 0
        while self._staged - start >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(staging, start)
            if size > self._max_frame_size:
                self._fail(FrameError(f"a frame of {size} bytes is above max_frame_size "
                                      f"({self._max_frame_size})"))
                return
            body = start + FRAME_HEADER.size
            have = min(size, self._staged - body)
            frame = self._arena.allocate(size, zero=False)
            frame[:have] = memoryview(staging)[body:body + have]
            start = body + have
            if have < size:  # the rest goes straight into the segment
                self._frame, self._filled = frame, have
                break
            self._deliver(frame)
        rest = self._staged - start
        if start and rest:
            staging[:rest] = staging[start:self._staged]
        self._staged = rest

    def _deliver(self, frame: Segment) -> None:
        self.frames += 1
        self._on_frame(frame)

    def _fail(self, error: BaseException) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        frame, self._frame = self._frame, None
        if frame is not None:  # a frame cut short: nobody will see it
            try:
                frame.free(deferred=True)
            except UnsupportedOperation:
                pass  # a SlicingArena's: its reset or close takes it
        if self._owns_arena:
            # Frames still held by the callee keep their exports: close once they are released.
            try:
                self._arena.close()
            except BufferError:
                pass  # a frame's memoryview is still alive: the arena goes with its last segment
        if self._on_connection_lost is not None:
            self._on_connection_lost(self.error if self.error is not None else exc)
