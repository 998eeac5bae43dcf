"""The README's Python examples run as a user copies them, and do what their comments say.

Each ```python block runs on its own, in a fresh namespace holding the names its prose supplies: an
open file ``fd`` (at ``offset``), a socket ``sock`` and a list ``socks`` with data waiting, a
``pool``, ``items`` and ``steps``, the callbacks ``process``, ``work`` and ``handle`` (which record
what they get), ``host``/``port`` and the event ``loop`` (a block with ``await`` runs as a
coroutine).  Then each block's effect is checked: the bytes that reached the callbacks are the
file's or the sockets', the digest printed is the one of the bytes written.  A README edit that
renames an API, changes a signature or breaks an example fails here.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import inspect
import io
import os
import re
import signal
import socket
import sys
import textwrap

import numpy as np
import pytest
from support import ROOT

import arenalib
import arenalib.aio
from arenalib import BufferPool, Ring

README = (ROOT / "README.md").read_text()
BLOCKS = [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", README, re.S)]
FILE = bytes(range(256)) * 4096 * 2  # 2 MiB: what fd holds
WIRE = b"arenalib over a socket "     # what each socket of sock and socks has waiting


def _no_ring() -> str | None:
    """Why the Ring examples cannot run here (None: they can)."""
    try:
        with Ring(2) as ring, BufferPool(64, 1) as pool:
            ring.provide(pool, 0)  # the provided-buffer example's kernel feature (5.19)
            ring.withdraw(0)
    except OSError as exc:  # ENOSYS, EPERM: a kernel or sandbox without io_uring
        return f"io_uring (with provided buffers) is not available here: {exc}"
    return None


NO_RING = _no_ring()


def _block_id(block: str) -> str:
    first = next(line for line in block.splitlines() if line.strip() and not line.startswith("import"))
    return re.sub(r"\W+", "_", first.split("#")[0]).strip("_")[:40]


class Seen:
    """The callbacks a block calls, and what they were handed (copied while it was alive)."""

    def __init__(self):
        self.processed: list[bytes] = []
        self.worked: list[tuple[int, int]] = []
        self.handled: dict[object, bytes] = {}  # by socket (None: the asyncio example's frames)

    def process(self, data) -> None:
        self.processed.append(bytes(data))

    def work(self, seg, item) -> None:
        seg.fill(item)
        self.worked.append((len(seg), seg[0]))

    def handle(self, *args) -> None:  # handle(view) in the asyncio example, handle(sock, seg) in the ring's
        key = args[0] if len(args) == 2 else None
        self.handled[key] = self.handled.get(key, b"") + bytes(args[-1])


class Serving:
    """``while serving:`` until every socket's bytes were handled (or a bound of turns)."""

    def __init__(self, seen: Seen, expected: int):
        self.seen, self.expected, self.turns = seen, expected, 0

    def __bool__(self) -> bool:
        self.turns += 1
        return sum(map(len, self.seen.handled.values())) < self.expected and self.turns < 10_000


@pytest.fixture(scope="module", autouse=True)
def _shared_arena_first():
    """The Arena that FrameReaders without arena= share lives as long as the process: made before
    conftest's leak check counts the open arenas (as tests/test_aio.py does)."""
    arenalib.aio._shared_arena()


@pytest.fixture
def names(tmp_path):
    """The names the README's prose gives its examples, and the Seen that records their calls."""
    path = tmp_path / "data"
    path.write_bytes(FILE)
    fd = os.open(path, os.O_RDONLY)
    seen = Seen()
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        pairs = [socket.socketpair() for _ in range(4)]
        for ours, theirs in pairs:
            stack.enter_context(ours)
            stack.enter_context(theirs)
            theirs.sendall(WIRE)
        pool = stack.enter_context(BufferPool(4096, 4))
        namespace = {
            "os": os, "arenalib": arenalib, "numpy": np, "BufferPool": BufferPool,
            "fd": fd, "offset": 0, "sock": pairs[0][0], "socks": [ours for ours, _ in pairs[1:]],
            "pool": pool, "items": [3, 5, 7], "steps": 3, "a": np.arange(1000.0), "b": np.full(1000, 2.0),
            "process": seen.process, "work": seen.work, "handle": seen.handle,
            "serving": Serving(seen, len(WIRE) * (len(pairs) - 1)), "host": "127.0.0.1", "port": 0,
        }
        yield seen, namespace
        # What the block made goes before the pool closes and the leak check runs.  A program ends its
        # long-lived arenas (the frames example's SlicingArena, the main thread's frame arena) itself.
        arenas = [value for value in namespace.values() if isinstance(value, arenalib.ArenaBase)]
        namespace.clear()
        for arena in arenas:
            arena.close(deferred=True)  # (a no-op for one closed already)
        arenalib.frame_arena().close()


@contextlib.contextmanager
def _deadline(seconds: float):
    """TimeoutError from whatever the block waits in (Ring.wait() returns to Python on a signal),
    rather than a hang, when an example never sees what it waits for."""

    def expire(signum, frame):
        raise TimeoutError(f"the example did not finish in {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def _run_async(code, namespace: dict, seen: Seen) -> None:
    """Run a block with a top-level ``await`` (the asyncio example), then send its server a frame."""
    namespace["loop"] = asyncio.get_running_loop()
    result = eval(code, namespace)  # the README's own code
    if inspect.iscoroutine(result):
        await result
    server = namespace["server"]
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(arenalib.aio.frame_header(len(WIRE)) + WIRE)
    await writer.drain()
    for _ in range(500):
        if seen.handled:
            break
        await asyncio.sleep(0.01)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize("block", BLOCKS, ids=[_block_id(b) for b in BLOCKS])
def test_every_readme_example_runs_and_does_what_it_says(block, names, monkeypatch):
    seen, namespace = names
    if NO_RING and ("Ring(" in block or "raw_uring" in block):
        pytest.skip(NO_RING)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # `import raw_uring  # examples/raw_uring.py`
    code = compile(block, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), _deadline(60):
        if code.co_flags & inspect.CO_COROUTINE:
            asyncio.run(_run_async(code, namespace, seen))
        else:
            exec(code, namespace)
    if "import raw_uring" in block:
        sys.modules.pop("raw_uring", None)

    for data in seen.processed:  # reads of fd from offset 0, or of sock
        assert data and (FILE.startswith(data) or data == WIRE), data[:32]
    if "process(" in block:
        assert seen.processed
    if "work(" in block:
        assert seen.worked == [(512, 3), (512, 5), (512, 7)]
    if "handle(" in block:  # one frame of the asyncio client; each socket's bytes, whole and in order
        assert seen.handled == ({None: WIRE} if "await" in block else dict.fromkeys(namespace["socks"], WIRE))
    if "digest = " in block:
        assert namespace["digest"] == hashlib.sha256(FILE[: 1 << 20]).hexdigest()
    if "def batch(" in block:  # "valid; the arena's memory goes when x does"
        x = namespace["batch"](100)
        assert x.tolist() == [0] * 100
        x[:] = 9
        assert x.sum() == 900
    if "print(hashlib.sha256(block)" in block:  # the first program: block.fill(7)
        assert out.getvalue().strip() == hashlib.sha256(b"\7" * (1 << 20)).hexdigest()
    if "arenalib.ConfinedArena() as arena" in block and "block" in namespace:
        with pytest.raises(arenalib.ArenaClosedError):  # "using one now raises ArenaClosedError"
            namespace["block"].fill(1)
    if "with arena.frame() as f" in block:
        with pytest.raises(arenalib.ArenaClosedError):  # "every segment carved in the frame is dead"
            namespace["header"].fill(1)
    if "with arena.numpy()" in block:
        np.testing.assert_array_equal(namespace["result"], namespace["a"] * 3)
