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

``FrameReader.write(data)`` sends a Segment (or any buffer) on the connection: asyncio's
``transport.write()`` takes bytes, bytearray and memoryview only, so the segment goes as a
memoryview of it, whose buffer export keeps its memory from being freed while the transport holds it.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import logging
import operator
import os
import struct
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from arenalib._arena import Arena, ArenaBase, Segment, copy
from arenalib._errors import ArenaError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from arenalib._ring import Received

__all__ = ["FRAME_HEADER", "FrameError", "FrameReader", "RingFrameReader", "frame_header"]

FRAME_HEADER = struct.Struct("!Q")
"""The length prefix of a frame: 8 bytes, big-endian, unsigned."""

logger = logging.getLogger("arenalib.aio")


class FrameError(ValueError):
    """A frame's length prefix asks for more than the reader's ``max_frame_size``."""


def frame_header(size: int) -> bytes:
    """The length prefix of a frame of ``size`` bytes (send it, then the frame's bytes)."""
    size = operator.index(size)
    if not 0 <= size < 1 << 64:
        raise ValueError(f"a frame's size is 0 to 2**64 - 1 bytes, not {size}")
    return FRAME_HEADER.pack(size)


def _check_reader_arguments(on_frame: object, max_frame_size: int) -> None:
    """What a reader's constructor can judge at once (its arena, anything with allocate(), is
    found out by its first frame)."""
    takes_calls = callable(on_frame)  # (a name: no narrowing of ``object`` for the type checker)
    if not takes_calls:
        raise TypeError(f"on_frame must be callable, not {type(on_frame).__name__}")
    if operator.index(max_frame_size) < 0:
        raise ValueError(f"max_frame_size must be >= 0, not {max_frame_size}")


# -- what connections share ---------------------------------------------------------------------------

# The Arena of every reader made without arena=: one for the process, made by the first connection
# that needs it (from any thread), so a server's connections take one pooled jemalloc arena, not one
# each (at most 4,000 exist: 4,000 idle connections used to make every other arena fail).  Never
# closed while the program runs; closed at exit when no frame is alive (its ResourceWarning would
# otherwise report an arena nobody could have closed).
_shared: Arena | None = None
_shared_lock = threading.Lock()


def _shared_arena() -> Arena:
    """The process's Arena for readers without ``arena=`` (MemoryError when none can be had)."""
    global _shared
    arena = _shared
    if arena is None:
        with _shared_lock:
            arena = _shared
            if arena is None:
                arena = _shared = Arena()
    return arena


def _after_fork_in_child() -> None:
    # Another thread may have held the lock at the fork: it is nobody's in the child.
    global _shared_lock
    _shared_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_shared_arena() -> None:
    global _shared
    arena = _shared
    if arena is not None and arena.stats()["live_segments"] == 0:
        _shared = None
        try:
            arena.close()
        except BufferError:
            pass


# Staging buffers not in use.  A reader holds one only during a read (from get_buffer() to the end
# of buffer_updated(), when nothing but the first bytes of a length prefix is left over), so an idle
# connection holds none, and a loop's thread needs one at a time: a few spares per size serve every
# connection without a new bytearray (zeroed) per read.
_spare_staging: dict[int, list[bytearray]] = {}
_SPARES_PER_SIZE = 4
_SPARE_SIZES = 4
_SPARE_MAX_SIZE = 1 << 20


def _take_staging(size: int) -> bytearray:
    spares = _spare_staging.get(size)
    if spares:
        try:
            return spares.pop()
        except IndexError:  # another thread took the last one
            pass
    return bytearray(size)


def _give_staging(buffer: bytearray) -> None:
    size = len(buffer)
    spares = _spare_staging.get(size)
    if spares is None:
        if len(_spare_staging) >= _SPARE_SIZES or size > _SPARE_MAX_SIZE:
            return
        spares = _spare_staging.setdefault(size, [])
    if len(spares) < _SPARES_PER_SIZE:
        spares.append(buffer)


# Delivered frames a reader without arena= keeps track of (to free them with the connection): those
# still alive once on_frame() returns; the dead ones are dropped at the end of a read while few are
# tracked, else when their number doubles (amortized: a consumer that keeps many costs no rescans).
_PRUNE_SMALL = 8


def _free_deferred(seg: Segment) -> None:
    """Free ``seg`` once no export of it is alive; nothing when it is dead already, or when its
    arena frees nothing one by one (a SlicingArena's reset or close takes it)."""
    try:
        seg.free(deferred=True)
    except ArenaError:  # ArenaClosedError: freed, reset or closed already; UnsupportedOperation
        pass


def _add_note(exc: BaseException, note: str) -> None:
    """BaseException.add_note() (3.11+), or the __notes__ it fills on 3.10."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


def _report(protocol: asyncio.BaseProtocol, transport: asyncio.BaseTransport | None, message: str,
            exc: BaseException) -> None:
    """Report ``exc`` as asyncio reports an error in a protocol callback: to the running loop's
    exception handler (``loop.set_exception_handler``; by default the "asyncio" logger), or to the
    "arenalib.aio" logger when no loop is running."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        logger.error("%s", message, exc_info=exc)
        return
    loop.call_exception_handler({"message": message, "exception": exc, "protocol": protocol,
                                 "transport": transport})


class FrameReader(asyncio.BufferedProtocol):
    """Length-prefixed frames received into Segments of an arena, one Segment a frame.

    FrameReader(on_frame, *, arena=None, max_frame_size=1 << 30, staging_size=65536,
    on_connection_lost=None).  ``on_frame(segment)`` gets each whole frame; the segment is then the
    callee's, to free with ``segment.free(deferred=True)`` when done (or to leave to the connection's
    end).  Without ``arena``, frames come from one Arena the process's readers share (made by the
    first connection, never closed), and the reader frees every frame it delivered that is still
    alive when the connection is lost (``free(deferred=True)``: a frame whose memoryview is still
    alive goes when that is released), or when the reader is collected without a loss (a loop closed
    with the connection open), so no frame outlives the connection unless the caller gives the
    arena.  A connection holds memory only for what is in flight: the frame being received,
    and the frames its consumer has not freed; an idle one holds no buffer and no arena of its own.

    Small frames and the length prefixes land in a staging buffer first (one ``recv_into`` may
    carry several), taken for the read and given back after it; a frame's bytes past the first read
    go straight into its segment.  A length above ``max_frame_size`` aborts the connection; the
    FrameError goes to ``on_connection_lost`` (or is stored in ``error``).  When no arena can be had
    for the connection (MemoryError), the reader reports it to the loop's exception handler at
    connection_made (as asyncio reports an error in a callback) and aborts the connection, the
    error going to ``on_connection_lost``; a frame that cannot be allocated (the arena's
    ``max_bytes``, or no memory) raises from buffer_updated(), which asyncio reports the same way
    before it closes the connection.  ``on_connection_lost`` is called whatever happens to the
    connection's frames.

    ``transport``: the connection's asyncio transport once connection_made() ran (None before);
    ``write(data)`` sends on it.  ``error``: what ended the connection on the reader's side, if
    anything; ``frames``: how many were delivered.

    A frame whose bytes were received into its segment is exported to the event loop until
    on_frame returns (asyncio holds the buffer it received into during the call): a plain
    ``seg.free()`` there raises BufferError, noted with what to call instead, and asyncio closes
    the connection as for any error of a protocol callback; ``seg.free(deferred=True)`` frees it
    when the loop lets go."""

    def __init__(self, on_frame: Callable[[Segment], object], *, arena: ArenaBase | None = None,
                 max_frame_size: int = 1 << 30, staging_size: int = 65536,
                 on_connection_lost: Callable[[BaseException | None], object] | None = None) -> None:
        _check_reader_arguments(on_frame, max_frame_size)
        takes_calls = on_connection_lost is None or callable(on_connection_lost)
        if not takes_calls:
            raise TypeError(f"on_connection_lost must be callable or None, not "
                            f"{type(on_connection_lost).__name__}")
        if staging_size < FRAME_HEADER.size:
            raise ValueError(f"staging_size must be at least {FRAME_HEADER.size}, not {staging_size}")
        # Nothing is allocated here: asyncio drops an error of a protocol factory silently (unless
        # the loop is in debug mode), so what can fail waits for connection_made.
        self._on_frame = on_frame
        self._on_connection_lost = on_connection_lost
        self._tracks = arena is None         # the shared arena's frames die with the connection
        self._arena: ArenaBase | None = arena
        self._delivered: list[Segment] = []  # frames delivered, some maybe dead (see _track)
        self._prune_at = 2 * _PRUNE_SMALL
        self._max_frame_size = max_frame_size
        self._staging_size = staging_size
        self._staging: bytearray | None = None  # only during a read
        self._carry = b""                    # between reads: the first bytes of a length prefix
        self._staged = 0                     # bytes staged (in _staging, or in _carry between reads)
        self._frame: Segment | None = None   # the frame being received into
        self._filled = 0                     # bytes of it received so far
        self.transport: asyncio.Transport | None = None
        self.error: BaseException | None = None
        self.frames = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self._arena is None:
            try:
                self._arena = _shared_arena()
            except Exception as exc:  # reported, and the connection aborted
                self.error = exc
                _report(self, transport, "FrameReader: no arena for the connection's frames; "
                        "connection aborted", exc)
                self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        staging = self._staging
        if staging is None:
            staging = self._staging = _take_staging(self._staging_size)
            if self._carry:
                staging[:self._staged] = self._carry
                self._carry = b""
        return memoryview(staging)[self._staged:]

    def buffer_updated(self, nbytes: int) -> None:
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled == len(frame):
                self._frame = None
                self._deliver(frame, received_into=True)
            return
        self._staged += nbytes
        self._take_staged_frames()
        self._end_read()

    def eof_received(self) -> bool | None:
        """The peer will send no more: the staging buffer taken for the read that found the end
        goes back at once (asyncio calls connection_lost() only after its other callbacks: a
        thousand peers closing together would otherwise hold a thousand buffers), and the
        transport closes itself (None).  A subclass that overrides it should call it."""
        self._end_read()
        return None

    def _end_read(self) -> None:
        """Give the staging buffer back once a read is done (at most the first bytes of the next
        length prefix are left: kept in a bytes object)."""
        staging = self._staging
        if staging is not None and self._staged < FRAME_HEADER.size:
            self._carry = bytes(staging[:self._staged]) if self._staged else b""
            self._staging = None
            _give_staging(staging)
            if self._delivered and len(self._delivered) <= _PRUNE_SMALL:
                self._prune()

    def _take_staged_frames(self) -> None:
        """Every whole frame in the staging buffer, and the start of the next one's segment."""
        staging: bytearray = self._staging  # type: ignore[assignment]  # (taken by get_buffer)
        arena = self._arena
        if arena is None:  # driven without connection_made()
            arena = self._arena = _shared_arena()
        start = 0
        while self._staged - start >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(staging, start)
            if size > self._max_frame_size:
                self._fail(FrameError(f"a frame of {size} bytes is above max_frame_size "
                                      f"({self._max_frame_size})"))
                return
            body = start + FRAME_HEADER.size
            have = min(size, self._staged - body)
            frame = arena.allocate(size, zero=False)
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

    def write(self, data: Buffer) -> None:
        """Send ``data`` (a Segment, a slice of one, any bytes-like object) on the transport, as
        ``transport.write()`` does.

        A Segment goes as a memoryview of it (asyncio's transports take bytes, bytearray and
        memoryview only): no copy where the transport sends at once or keeps the memoryview until
        the socket takes the rest (asyncio's selector loop from 3.12 on; on 3.10 and 3.11 it copies
        what the socket did not take at once into its own buffer).  While the transport holds the
        memoryview, the segment's buffer export keeps its memory: ``seg.free()`` raises BufferError
        (``seg.free(deferred=True)`` frees it once the transport let go), and its arena closes
        deferred at a with-block's end.  RuntimeError before connection_made()."""
        transport = self.transport
        if transport is None:
            raise RuntimeError("FrameReader.write() before connection_made(): no transport yet")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = memoryview(data)  # (not released here: the transport may keep it)
            if data.ndim != 1 or data.format != "B":
                data = data.cast("B")
        transport.write(data)

    def _deliver(self, frame: Segment, received_into: bool = False) -> None:
        """Hand ``frame`` to on_frame; ``received_into``: the loop received into the segment, and
        holds that buffer's export during the call."""
        self.frames += 1
        try:
            self._on_frame(frame)
        except BufferError as exc:
            if received_into and frame.exports:
                _add_note(exc, "FrameReader: the event loop holds the buffer it received this frame "
                          "into until on_frame returns; free the frame with seg.free(deferred=True) "
                          "(or pool.release(seg, deferred=True)), which frees it when the loop lets go")
            raise
        finally:
            if self._tracks:
                self._track(frame)

    def _track(self, frame: Segment) -> None:
        """Keep a delivered frame of the shared arena, to free it with the connection."""
        if frame.alive:  # not freed by its consumer (a deferred free counts as alive until done)
            delivered = self._delivered
            delivered.append(frame)
            if len(delivered) >= self._prune_at:
                self._prune()

    def _prune(self) -> None:
        """Forget the delivered frames that are dead (freed by their consumer)."""
        self._delivered = alive = [seg for seg in self._delivered if seg.alive]
        self._prune_at = max(2 * _PRUNE_SMALL, 2 * len(alive))

    def _fail(self, error: BaseException) -> None:
        self.error = error
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            self._let_go()
        finally:  # whatever the frames' arena says (reset or closed by its owner meanwhile ...)
            if self._on_connection_lost is not None:
                self._on_connection_lost(self.error if self.error is not None else exc)

    def __del__(self) -> None:
        # A reader collected without connection_lost(): asyncio calls none for the connections still
        # open when their loop closes (nor does anyone for a reader driven by hand).  Its frames go
        # as at a loss, like a socket closed by its collection; else the shared arena, never closed,
        # kept the frame cut short for good (an attack: 100 loops, 100 MiB).
        if sys.is_finalizing():
            return  # (the memory goes with the process)
        if getattr(self, "_frame", None) is not None or getattr(self, "_delivered", None):
            self._let_go()

    def _let_go(self) -> None:
        """The connection's memory: the frame cut short (nobody will see it) and, from the shared
        arena, every frame delivered and still alive, freed once no export of it is alive."""
        frame, self._frame = self._frame, None
        delivered, self._delivered = self._delivered, []
        # (Not given back: a transport that fails may still hold it for a read under way.)
        self._staging, self._carry, self._staged = None, b"", 0
        if frame is not None:
            _free_deferred(frame)
        for seg in delivered:
            _free_deferred(seg)


# -- frames from a Ring's multishot receive (issue 30) -------------------------------------------------
#
# A sibling of FrameReader for a server driven by arenalib.Ring rather than by an asyncio loop: its
# bytes come from the completions of ring.recv_multishot() (provided buffers of one BufferPool shared
# by every connection), not from recv_into.  Kept apart from FrameReader on purpose: nothing of it is
# asyncio's, and FrameReader's own rules (staging buffers, the loop's exports) do not apply.

class RingFrameReader:
    """Length-prefixed frames (FRAME_HEADER, as FrameReader reads them) from the completions of a
    Ring's ``recv_multishot()`` on one connection, each whole frame a Segment of an arena.

    RingFrameReader(on_frame, *, arena=None, max_frame_size=1 << 30).  ``feed(received)`` takes one
    completion of the connection's receive (the Received that ``ring.wait()`` returned): its bytes
    are copied out of the ring's buffer into the frames they belong to, the buffer is given back to
    the ring at once (the received Segment is released), and each frame completed goes to
    ``on_frame(segment)``, the callee's to free (``segment.free()``).  Without ``arena``, frames
    come from the Arena FrameReader's readers share.  Memory per connection: the frame being
    received, and the frames its consumer has not freed; the receive buffers are the pool's, shared
    by every connection.

    ``feed()`` returns ``received.more``: False when the receive has ended (re-arm it, unless
    ``eof`` or ``error`` says the connection is done).  The end of the stream sets ``eof`` (a
    frame cut short there sets ``error`` to a FrameError, and is freed); a length above
    ``max_frame_size`` sets ``error`` to a FrameError and drops the rest of the stream; a receive
    error other than ENOBUFS (which only asks for a re-arm) sets ``error`` to the OSError.  An
    exception from ``on_frame``, or a MemoryError of a frame the arena cannot hold, leaves ``feed()``
    and is ``error`` too: the stream is dropped (the bytes after it went back with the buffer).
    ``close()`` gives up a stream the server ends itself (an idle timeout, a shutdown): the frame
    cut short is freed, as it is when the reader is collected; called from ``on_frame``, it leaves
    the rest of that completion unread.  ``feed()`` called from inside ``on_frame`` raises
    RuntimeError and ends the stream (frames would come out of order)."""

    def __init__(self, on_frame: Callable[[Segment], object], *, arena: ArenaBase | None = None,
                 max_frame_size: int = 1 << 30) -> None:
        _check_reader_arguments(on_frame, max_frame_size)
        self._on_frame = on_frame
        self._arena: ArenaBase | None = arena
        self._max_frame_size = max_frame_size
        self._header = bytearray()          # the first bytes of a length prefix
        self._frame: Segment | None = None  # the frame being filled
        self._filled = 0
        self.frames = 0
        self.eof = False
        self.error: BaseException | None = None
        self.closed = False
        self._feeding = False               # inside feed(): on_frame may not feed again

    def close(self) -> None:
        """Give up the stream: the frame cut short is freed, and later completions fed are only
        given back to the ring (their bytes dropped).  The frames delivered are their callee's."""
        self.closed = True
        self._let_go()

    def __del__(self) -> None:
        # Dropped mid-frame without an end of stream fed (a server closing the connection itself, a
        # ring closed with the receive armed): nothing else would free the frame cut short.
        if not sys.is_finalizing() and getattr(self, "_frame", None) is not None:
            self._let_go()

    def feed(self, received: Received) -> bool:
        """Take one completion of this connection's ``recv_multishot()`` (see the class)."""
        try:
            seg = received.segment
        except AttributeError:
            raise TypeError(f"feed() takes a Received of Ring.wait(), not {type(received).__name__}"
                            ) from None
        if seg is None:
            result = received.result
            if result == 0:
                self.eof = True
                if self._frame is not None or self._header:
                    self._drop(FrameError("the stream ended inside a frame"))
            elif result < 0 and result != -errno.ENOBUFS and self.error is None:
                self._drop(OSError(-result, os.strerror(-result)))
            return bool(received.more)
        if self._feeding:
            seg.free()  # (given back: the stream ends here, as for any error while taking one)
            error = RuntimeError("feed() called again from inside on_frame: feed completions one "
                                 "at a time, in the order wait() returned them")
            self._drop(error)
            raise error
        self._feeding = True
        try:
            if self.error is None and not self.closed:
                self._take(seg)
        except BaseException as exc:
            # Whatever stopped the copy (on_frame's exception, a MemoryError of a frame the arena
            # cannot hold): the rest of the buffer goes back unread, so what follows could only be
            # read from the middle of a frame, as if it were a length prefix.  The stream ends here.
            if self.error is None:
                self._drop(exc)
            raise
        finally:
            self._feeding = False
            seg.free()  # the buffer goes back to the ring (a frame holds a copy)
        return bool(received.more)

    def _take(self, seg: Segment) -> None:
        n = len(seg)
        pos = 0
        header = self._header
        arena = self._arena
        while pos < n:
            frame = self._frame
            if frame is None:
                need = FRAME_HEADER.size - len(header)
                header += seg[pos:pos + need]
                pos += min(need, n - pos)
                if len(header) < FRAME_HEADER.size:
                    return
                (size,) = FRAME_HEADER.unpack(header)
                header.clear()
                if size > self._max_frame_size:
                    self._drop(FrameError(f"a frame of {size} bytes is above max_frame_size "
                                          f"({self._max_frame_size})"))
                    return
                if arena is None:
                    arena = self._arena = _shared_arena()
                frame = self._frame = arena.allocate(size, zero=False)
                self._filled = 0
            take = min(len(frame) - self._filled, n - pos)
            if take:
                copy(seg, pos, frame, self._filled, take)  # one memcpy, checked on both segments
                self._filled += take
                pos += take
            if self._filled == len(frame):
                self._frame = None
                self.frames += 1
                self._on_frame(frame)  # (an exception ends the stream: see feed())
                if self.closed or self.error is not None:
                    return  # on_frame gave the stream up: the rest of the buffer goes back unread

    def _drop(self, error: BaseException) -> None:
        self.error = error
        self._let_go()

    def _let_go(self) -> None:
        """Free the frame cut short and forget the length prefix begun."""
        frame, self._frame = self._frame, None
        self._header.clear()
        if frame is not None:
            _free_deferred(frame)
