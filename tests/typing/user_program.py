"""A small typed user program of arenalib: tests/test_typing.py runs mypy over it and expects no error.

Each line is something the README or issue 27 says a user writes: a Segment is accepted wherever
typeshed or NumPy asks for a buffer, on every supported Python (the stubs give it __buffer__)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading

import numpy as np
import numpy.typing as npt

import arenalib
from arenalib import ArenaClosedError, Segment
from arenalib.aio import FrameReader, frame_header


def digest(seg: Segment) -> str:
    return hashlib.sha256(seg).hexdigest()


def read_into(fd: int, seg: Segment) -> int:
    return os.preadv(fd, [seg], 0)


if sys.version_info >= (3, 12):
    # NumPy's stubs take collections.abc.Buffer from 3.12 only (a union of builtin types before).
    def as_array(seg: Segment) -> npt.NDArray[np.uint8]:
        return np.frombuffer(seg, np.uint8)
else:
    def as_array(seg: Segment) -> npt.NDArray[np.uint8]:
        return np.frombuffer(memoryview(seg), np.uint8)


def main() -> None:
    with arenalib.ConfinedArena() as arena:
        src = arena.allocate(64, zero=True, align=16)
        dst = arena.allocate(64, zero=0)
        dst[:] = src
        dst[0:4] = b"abcd"
        dst[4] = 5
        view: memoryview = memoryview(src)
        view.release()
        copied: Segment = arena.allocate_from(b"data", align=8)
        text: Segment = arena.allocate_string("hello", nul=False)
        arenalib.copy(src, 0, dst, 8, 16)
        arenalib.copy(bytearray(8), 0, dst, 0, 8)
        first: int = src.mismatch(dst)
        same: bool = src == dst
        hexed: str = src.hex(":", 2)
        frozen: Segment = src.readonly()
        mine: bool = src.is_accessible_by(threading.current_thread()) and src.is_accessible_by(0)
        data = bytearray(64)
        data[:] = src
        print(digest(src), as_array(dst).sum(), copied.nbytes, text.tobytes(), first, same, hexed,
              frozen.alive, mine)
    try:
        src.tobytes()
    except ArenaClosedError:
        pass
    scratch: Segment = arenalib.allocate(256, zero=False, align=64)  # freed when garbage
    auto: arenalib.AutoArena = arenalib.auto_arena()
    assert scratch.arena is auto
    with arenalib.allocate(32) as block, arenalib.BufferPool(4096, 2) as pool:
        block.fill(1)
        with pool.acquire() as buffer:
            arenalib.copy(block, 0, buffer, 0, 32)
    print(auto.stats()["live_bytes"])
    handler: object = arenalib.numpy_handler(auto)  # an AutoArena serves NumPy too
    with arenalib.BufferPool(4096, 2) as lender:
        lent: int = lender.stats()["lent"]
    reader = FrameReader(lambda frame: frame.free(deferred=True), max_frame_size=1 << 20)
    print(handler is not None, lent, arenalib.check(0), arenalib.SETUP_CLAMP, frame_header(3), reader)


if __name__ == "__main__":
    main()
