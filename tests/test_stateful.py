"""Hypothesis state machines: one per arena kind, and one for BufferPool.

An arena's: every live segment's bytes against a bytearray model through random allocate / write /
read / slice / export / release-export / free / reset / close steps.  Invariants: the arena's live
bytes, live segments and exports match the model; dead handles raise ArenaClosedError for every
use; free/reset/close with live exports raise BufferError and change nothing.

The pool's: acquire / write / release / reset / stale access (see PoolMachine).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

import arenalib
from arenalib import (
    ArenaClosedError,
    BufferPool,
    PoolExhaustedError,
    Segment,
    SlicingArena,
    UnsupportedOperation,
)

SIZES = st.one_of(st.integers(0, 64), st.integers(0, 600), st.sampled_from([4095, 4096, 5000, 9000]))
ALIGNS = st.sampled_from([None, 1, 2, 8, 16, 64, 4096])
PICK = st.integers(0, 2**16)
BYTE = st.integers(0, 255)


class Root:
    """Model of one allocation: its bytes, whether it is alive, its exports (and its slices')."""

    def __init__(self, data: bytes):
        self.data = bytearray(data)
        self.alive = True
        self.exports = 0


class Handle:
    """A Segment (an allocation or a slice of one) and the part of its root it views."""

    def __init__(self, seg, root: Root, offset: int, is_root: bool):
        self.seg = seg
        self.root = root
        self.offset = offset
        self.size = len(seg)
        self.is_root = is_root

    @property
    def model(self) -> bytearray:
        return self.root.data[self.offset:self.offset + self.size]

    def write_model(self, start: int, data: bytes) -> None:
        begin = self.offset + start
        self.root.data[begin:begin + len(data)] = data


class Export:
    def __init__(self, obj, handle: Handle):
        self.obj = obj
        self.handle = handle

    def release(self):
        if isinstance(self.obj, memoryview):
            self.obj.release()
        self.obj = None


class ArenaMachine(RuleBasedStateMachine):
    kind: type = arenalib.Arena

    def __init__(self):
        super().__init__()
        self.arena = None
        self.max_bytes = None
        self.handles: list[Handle] = []   # live handles
        self.dead: list[Handle] = []      # handles whose memory is gone (checked, then dropped)
        self.exports: list[Export] = []
        self.peak = 0

    # -- arena lifecycle ---------------------------------------------------------------------------

    @initialize(max_bytes=st.one_of(st.none(), st.integers(0, 20000)),
                chunk_size=st.sampled_from([None, 4096, 8192]))
    def open_first(self, max_bytes, chunk_size):
        self.chunk_size = chunk_size
        self.open(max_bytes)

    def open(self, max_bytes):
        if self.kind is SlicingArena:
            self.arena = SlicingArena(chunk_size=self.chunk_size, max_bytes=max_bytes)
        else:
            self.arena = self.kind(max_bytes=max_bytes)
        self.max_bytes = max_bytes
        self.peak = 0

    # -- helpers -----------------------------------------------------------------------------------

    def pick(self, i):
        return self.handles[i % len(self.handles)]

    def kill_all(self):
        self.dead.extend(self.handles)
        self.handles = []

    def roots(self):
        return [h for h in self.handles if h.is_root]

    # -- allocation --------------------------------------------------------------------------------

    @rule(size=SIZES, zero=st.booleans(), align=ALIGNS)
    def allocate(self, size, zero, align):
        live = sum(h.size for h in self.roots())
        if self.max_bytes is not None and live + size > self.max_bytes:
            with pytest.raises(MemoryError):
                self.arena.allocate(size, zero=zero, align=align)
            return
        seg = self.arena.allocate(size, zero=zero, align=align)
        assert len(seg) == seg.nbytes == size
        assert seg.alive and seg.arena is self.arena and seg.exports == 0
        if align:
            assert seg.address % align == 0
        data = seg.tobytes()
        if zero:
            assert data == bytes(size)
        self.handles.append(Handle(seg, Root(data), 0, is_root=True))
        self.peak = max(self.peak, live + size)

    @precondition(lambda self: self.handles)
    @rule(i=PICK, offset=PICK, size=PICK)
    def make_slice(self, i, offset, size):
        h = self.pick(i)
        offset %= h.size + 1
        size %= h.size - offset + 1
        part = h.seg.slice(offset, size)
        assert len(part) == size
        assert part.address == h.seg.address + offset
        self.handles.append(Handle(part, h.root, h.offset + offset, is_root=False))

    # -- writes ------------------------------------------------------------------------------------

    @precondition(lambda self: any(h.size for h in self.handles))
    @rule(i=PICK, index=PICK, value=BYTE)
    def write_item(self, i, index, value):
        h = self.pick(i)
        if not h.size:
            return
        index %= h.size
        if index % 2:
            index -= h.size  # negative indices too
        h.seg[index] = value
        h.write_model(index % h.size, bytes([value]))

    @precondition(lambda self: self.handles)
    @rule(i=PICK, start=PICK, data=st.binary(max_size=300))
    def write_slice(self, i, start, data):
        h = self.pick(i)
        start %= h.size + 1
        data = data[:h.size - start]
        h.seg[start:start + len(data)] = data
        h.write_model(start, data)

    @precondition(lambda self: self.handles)
    @rule(i=PICK, value=BYTE)
    def fill(self, i, value):
        h = self.pick(i)
        assert h.seg.fill(value) is h.seg
        h.write_model(0, bytes([value]) * h.size)

    @precondition(lambda self: self.exports)
    @rule(i=PICK, start=PICK, data=st.binary(max_size=300))
    def write_through_export(self, i, start, data):
        e = self.exports[i % len(self.exports)]
        h = e.handle
        start %= h.size + 1
        data = data[:h.size - start]
        if isinstance(e.obj, memoryview):
            e.obj[start:start + len(data)] = data
        else:
            e.obj[start:start + len(data)] = np.frombuffer(data, dtype=np.uint8)
        h.write_model(start, data)

    # -- reads -------------------------------------------------------------------------------------

    @precondition(lambda self: self.handles)
    @rule(i=PICK, key=st.slices(600))
    def read(self, i, key):
        h = self.pick(i)
        model = bytes(h.model)
        assert h.seg.tobytes() == model
        assert h.seg[key] == model[key]
        if h.size:
            index = (key.start or 0) % h.size
            assert h.seg[index] == model[index]

    @precondition(lambda self: self.exports)
    @rule(i=PICK)
    def read_through_export(self, i):
        e = self.exports[i % len(self.exports)]
        assert bytes(e.obj) == bytes(e.handle.model)

    # -- exports -----------------------------------------------------------------------------------

    @precondition(lambda self: self.handles)
    @rule(i=PICK, numpy=st.booleans())
    def export(self, i, numpy):
        h = self.pick(i)
        obj = np.frombuffer(h.seg, dtype=np.uint8) if numpy else memoryview(h.seg)
        self.exports.append(Export(obj, h))
        h.root.exports += 1

    @precondition(lambda self: self.exports)
    @rule(i=PICK)
    def release_export(self, i):
        e = self.exports.pop(i % len(self.exports))
        e.release()
        e.handle.root.exports -= 1

    # -- free, reset, close --------------------------------------------------------------------------

    def check_unchanged(self, action):
        before = self.arena.stats()
        with pytest.raises(BufferError):
            action()
        after = self.arena.stats()
        for key in ("live_bytes", "live_segments", "exports", "closed"):
            assert after[key] == before[key], key
        for h in self.handles:
            assert h.seg.alive

    @precondition(lambda self: self.handles and self.kind is not SlicingArena)
    @rule(i=PICK)
    def free(self, i):
        h = self.pick(i)
        if not h.is_root:
            with pytest.raises(UnsupportedOperation):
                h.seg.free()
            return
        if h.root.exports:
            self.check_unchanged(h.seg.free)
            return
        h.seg.free()
        self.dead.extend(x for x in self.handles if x.root is h.root)
        self.handles = [x for x in self.handles if x.root is not h.root]

    @precondition(lambda self: self.handles and self.kind is SlicingArena)
    @rule(i=PICK)
    def free_unsupported(self, i):
        h = self.pick(i)
        # test_arenas pins the exact error down; here only: refused, nothing changes
        with pytest.raises((UnsupportedOperation, BufferError)):
            h.seg.free()

    @rule()
    def reset(self):
        if self.exports:
            self.check_unchanged(self.arena.reset)
            return
        self.arena.reset()
        self.kill_all()

    @rule()
    def purge(self):
        self.arena.purge()

    @rule(max_bytes=st.one_of(st.none(), st.integers(0, 20000)))
    def close_and_reopen(self, max_bytes):
        if self.exports:
            self.check_unchanged(self.arena.close)
            return
        arena = self.arena
        arena.close()
        self.kill_all()
        self.stats_match_model()
        arena.close()  # idempotent
        assert arena.closed
        for operation in (lambda: arena.allocate(1), arena.reset, arena.purge, arena.__enter__):
            with pytest.raises(ArenaClosedError):
                operation()
        # the dead handles stay, checked by use_dead; a new arena takes over
        self.open(max_bytes)

    @precondition(lambda self: self.dead)
    @rule(i=PICK, which=st.sampled_from(
        ["tobytes", "getitem", "setitem", "getslice", "setslice", "fill", "memoryview", "slice",
         "address", "free", "iter"]))
    def use_dead(self, i, which):
        h = self.dead[i % len(self.dead)]
        seg = h.seg
        assert not seg.alive
        assert len(seg) == h.size
        operation = {
            "tobytes": seg.tobytes,
            "getitem": lambda: seg[0],
            "setitem": lambda: seg.__setitem__(0, 1),
            "getslice": lambda: seg[0:1],
            "setslice": lambda: seg.__setitem__(slice(0, 0), b""),
            "fill": lambda: seg.fill(0),
            "memoryview": lambda: memoryview(seg),
            "slice": lambda: seg.slice(0, 0),
            "address": lambda: seg.address,
            "free": seg.free,
            "iter": lambda: list(seg),
        }[which]
        with pytest.raises(ArenaClosedError):
            operation()
        assert seg.exports == 0

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def stats_match_model(self):
        if self.arena is None:
            return
        stats = self.arena.stats()
        roots = self.roots()
        assert stats["closed"] is self.arena.closed
        if self.arena.closed:
            assert not roots
        assert stats["live_segments"] == len(roots)
        assert stats["live_bytes"] == sum(h.size for h in roots)
        assert stats["exports"] == len(self.exports)
        if not self.arena.closed:
            assert stats["peak_bytes"] >= stats["live_bytes"]
            assert stats["peak_bytes"] >= self.peak
        else:
            assert stats["resident"] == stats["mapped"] == 0

    @invariant()
    def handles_alive_and_exports_counted(self):
        for h in self.handles:
            assert h.seg.alive
            assert h.seg.exports == h.root.exports
        for h in self.dead:
            assert not h.seg.alive

    @invariant()
    def live_contents_match(self):
        # cheap enough: segments are small
        for h in self.handles:
            if h.is_root:
                assert h.seg.tobytes() == bytes(h.root.data)

    def teardown(self):
        for e in self.exports:
            e.release()
        self.exports = []
        if self.arena is not None:
            self.arena.close()


class ArenaStateMachine(ArenaMachine):
    kind = arenalib.Arena


class ConfinedArenaStateMachine(ArenaMachine):
    kind = arenalib.ConfinedArena


class SlicingArenaStateMachine(ArenaMachine):
    kind = arenalib.SlicingArena


TestArena = ArenaStateMachine.TestCase
TestConfinedArena = ConfinedArenaStateMachine.TestCase
TestSlicingArena = SlicingArenaStateMachine.TestCase


# -- BufferPool ------------------------------------------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    """Acquire / write / release / reset / stale access against a model: live segments never overlap,
    each keeps what was written to it, stale handles always raise, the counts add up."""

    live = Bundle("live")

    def __init__(self):
        super().__init__()
        self.pool = BufferPool(40, 4, align=16)
        self.model: dict[int, tuple[Segment, bytes]] = {}  # id(seg) -> (seg, expected content)
        self.dead_segments: list[Segment] = []
        self.stamp = 0

    @precondition(lambda self: len(self.model) < 4)
    @rule(target=live)
    def acquire(self):
        seg = self.pool.acquire()
        self.model[id(seg)] = (seg, seg.tobytes())
        return seg

    @precondition(lambda self: len(self.model) == 4)
    @rule()
    def acquire_exhausted(self):
        assert self.pool.try_acquire() is None
        with pytest.raises(PoolExhaustedError):
            self.pool.acquire()

    @rule(seg=live, offset=st.integers(0, 39), size=st.integers(0, 40))
    def write(self, seg, offset, size):
        if id(seg) not in self.model:  # killed by a reset
            with pytest.raises(ArenaClosedError):
                seg[offset:offset + 1] = b"x"
            return
        size = min(size, 40 - offset)
        self.stamp += 1
        data = bytes([self.stamp & 0xFF]) * size
        seg[offset:offset + size] = data
        old = self.model[id(seg)][1]
        self.model[id(seg)] = (seg, old[:offset] + data + old[offset + size:])

    @rule(seg=consumes(live), via_free=st.booleans())
    def release(self, seg, via_free):
        if id(seg) not in self.model:  # killed by a reset
            with pytest.raises(ArenaClosedError):
                seg.free() if via_free else self.pool.release(seg)
            return
        if via_free:
            seg.free()
        else:
            self.pool.release(seg)
        del self.model[id(seg)]
        self.dead_segments.append(seg)

    @rule()
    def reset(self):
        self.dead_segments.extend(seg for seg, _ in self.model.values())
        self.model.clear()
        self.pool.reset()

    @precondition(lambda self: self.dead_segments)
    @rule(data=st.data())
    def stale_access(self, data):
        seg = data.draw(st.sampled_from(self.dead_segments))
        op = data.draw(st.sampled_from(["read", "write", "view", "release", "free", "index", "address"]))
        with pytest.raises(ArenaClosedError):
            if op == "read":
                seg.tobytes()
            elif op == "write":
                seg[0] = 1
            elif op == "view":
                memoryview(seg)
            elif op == "release":
                self.pool.release(seg)
            elif op == "free":
                seg.free()
            elif op == "index":
                self.pool.index(seg)
            else:
                _ = seg.address

    @invariant()
    def consistent(self):
        spans = sorted((seg.address, seg.address + len(seg)) for seg, _ in self.model.values())
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live segments overlap"
        for seg, expected in self.model.values():
            assert seg.alive and seg.tobytes() == expected
        assert all(not seg.alive for seg in self.dead_segments)
        assert self.pool.available == 4 - len(self.model)
        assert self.pool.stats()["in_use"] == len(self.model)

    def teardown(self):
        self.pool.close()


TestPoolMachine = PoolMachine.TestCase
