"""The with-statement's deferred close: exports alive at exit hold the memory, not the block.

What it promises: the body's return value and exception survive an export alive at exit; every segment
dies at once; the memory under the exports goes back when the last is released (from any thread);
an explicit close() keeps refusing as mmap.close() does; stats() and live_objects() show it."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import SANITIZED, MiB, run_threads, settled_rss, slots_in_use

import arenalib
from arenalib import ArenaClosedError


def batch_sum(kind, n):
    with kind() as a:
        x = np.frombuffer(a.allocate(n), np.uint8)
        return int(x.sum()), a, x  # x is still alive when the block exits


def test_a_numpy_array_alive_at_exit_keeps_the_return_value(kind):
    total, a, x = batch_sum(kind, 1000)
    assert total == 0
    assert a.closed
    x[:] = 7  # the array's memory is still there, writable
    assert int(x.sum()) == 7000
    stats = a.stats()
    assert stats["closed"] and stats["held_by_exports"] == 1 and stats["held_bytes"] == 1000
    assert arenalib.live_objects()["closing_arenas"] >= 1
    assert "held by 1 buffer export" in repr(a)
    del x
    gc.collect()
    assert a.stats()["held_by_exports"] == 0 and a.stats()["held_bytes"] == 0
    assert repr(a).endswith("closed>")


def test_every_segment_dies_at_exit_the_exported_one_too(kind):
    with kind() as a:
        kept = a.allocate(64).fill(1)
        exported = a.allocate(64).fill(2)
        view = memoryview(exported)
    for seg in (kept, exported):
        assert not seg.alive
        with pytest.raises(ArenaClosedError):
            seg.tobytes()
        with pytest.raises(ArenaClosedError):
            memoryview(seg)  # no new export of a closed arena's segment
    assert view.tobytes() == b"\x02" * 64
    with pytest.raises(ArenaClosedError):
        a.allocate(1)
    view.release()


def test_the_bodys_exception_propagates_unchanged(kind):
    class Boom(Exception):
        pass

    with pytest.raises(Boom) as info:
        with kind() as a:
            view = memoryview(a.allocate(16))
            raise Boom("body")
    assert info.value.args == ("body",)
    assert info.value.__context__ is None  # no BufferError took its place or rode on it
    assert a.closed
    view.release()


def test_an_explicit_close_refuses_and_says_how_to_defer(kind):
    a = kind()
    seg = a.allocate(10).fill(3)
    view = memoryview(seg)
    with pytest.raises(BufferError, match=r"close\(deferred=True\)"):
        a.close()
    assert not a.closed and seg.alive  # changed nothing
    a.close(deferred=True)
    assert a.closed and not seg.alive
    assert view.tobytes() == b"\x03" * 10
    a.close()  # idempotent, also while held
    a.close(deferred=True)
    view.release()
    assert a.stats()["held_by_exports"] == 0


def test_close_deferred_without_exports_closes_at_once(kind):
    before = slots_in_use()
    a = kind()
    a.allocate(10)
    a.close(deferred=True)
    assert a.closed and a.stats()["held_by_exports"] == 0
    assert slots_in_use() == before


def test_the_slot_goes_back_with_the_last_export(kind):
    before = slots_in_use()
    with kind() as a:
        views = [memoryview(a.allocate(32)) for _ in range(3)]
        arr = np.frombuffer(a.allocate(8), np.uint8)
    assert slots_in_use() == before + 1
    for i, view in enumerate(views):
        view.release()
        assert slots_in_use() == before + 1, f"given back with {3 - i} export(s) alive"
    del arr
    gc.collect()
    assert slots_in_use() == before


def test_the_last_release_may_come_from_another_thread(kind):
    before = slots_in_use()
    with kind() as a:
        view = memoryview(a.allocate(4096).fill(9))
    done = []

    def release_it():
        done.append(view.tobytes() == b"\x09" * 4096)
        view.release()

    t = threading.Thread(target=release_it)
    t.start()
    t.join()
    assert done == [True]
    assert slots_in_use() == before and a.stats()["held_by_exports"] == 0


def test_exports_released_by_many_threads_at_once_give_the_slot_back_once(kind):
    # With the GIL off (3.13t) the releases run in parallel: exactly one of them (or the closer)
    # gives the slot back, once all are gone.
    before = slots_in_use()
    for _ in range(20):
        with kind() as a:
            views = [memoryview(a.allocate(64).fill(i)) for i in range(8)]
        barrier = threading.Barrier(len(views))
        seen = []

        def release(view, i, barrier=barrier, seen=seen):
            barrier.wait()
            seen.append(view.tobytes() == bytes([i]) * 64)
            view.release()

        threads = [threading.Thread(target=release, args=(v, i)) for i, v in enumerate(views)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [True] * len(views)
        assert a.stats()["held_by_exports"] == 0
    assert slots_in_use() == before


def test_process_wide_operations_leave_held_memory_alone(kind):
    # trim() resets and wipes idle slots, set_retention() evicts warm ones: a slot held by exports
    # is in use, neither may take its memory.
    with kind() as a:
        big = memoryview(a.allocate(3 * MiB, zero=False).fill(5))
        small = memoryview(a.allocate(100).fill(6))
    retention = arenalib.get_retention()
    try:
        arenalib.set_retention(0)
        arenalib.trim()
        others = [arenalib.ConfinedArena() for _ in range(8)]  # take and give back slots meanwhile
        for other in others:
            other.allocate(4096).fill(1)
            other.close()
        arenalib.trim()
    finally:
        arenalib.set_retention(retention)
    assert big.tobytes() == b"\x05" * (3 * MiB) and small.tobytes() == b"\x06" * 100
    big.release()
    small.release()
    assert a.stats()["held_by_exports"] == 0


def test_a_forked_child_releases_its_copy_and_the_parent_its_own(kind):
    with kind() as a:
        view = memoryview(a.allocate(4096).fill(8))
    pid = os.fork()
    if pid == 0:  # the child: its copy of the held arena goes back with its copy of the export
        ok = view.tobytes() == b"\x08" * 4096
        view.release()
        ok = ok and a.stats()["held_by_exports"] == 0 and arenalib.live_objects()["closing_arenas"] == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert view.tobytes() == b"\x08" * 4096 and a.stats()["held_by_exports"] == 1
    view.release()


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine keeps freed memory resident")
def test_the_memory_goes_back_to_the_os_with_the_last_export():
    before = settled_rss()
    with arenalib.ConfinedArena() as a:
        segs = [a.allocate(MiB, zero=False).fill(1) for _ in range(64)]
        view = memoryview(segs[0])
        del segs
    held = settled_rss() - before
    assert held > 48 * MiB  # the closed arena's memory is held by the one export
    view.release()
    left = settled_rss() - before
    assert left < held - 40 * MiB, f"{left / MiB:.1f} MiB still resident of {held / MiB:.1f}"


def test_debug_mode_names_the_exported_segment():
    arenalib.set_debug(True)
    try:
        a = arenalib.ConfinedArena()
        seg = a.allocate(123)
        view = memoryview(seg)
        with pytest.raises(BufferError) as info:
            a.close()
    finally:
        arenalib.set_debug(False)
    message = str(info.value)
    assert "a segment of 123 bytes at " in message and f"{seg.address:#x}" in message
    assert "test_debug_mode_names_the_exported_segment" in message  # where it was allocated
    view.release()
    a.close()


@pytest.mark.parametrize("debug_first", [True, False], ids=["arena-made-in-debug", "debug-turned-on-later"])
def test_debug_mode_names_the_segments_allocated_after_a_reset(debug_first):
    """A reset clears debug mode's books, which go on: the segment exported after it is named."""
    if debug_first:
        arenalib.set_debug(True)
    a = arenalib.Arena()
    try:
        arenalib.set_debug(True)
        memoryview(a.allocate(77)).release()
        a.reset()
        seg = a.allocate(123)
        view = memoryview(seg)
        with pytest.raises(BufferError) as info:
            a.reset()
    finally:
        arenalib.set_debug(False)
    message = str(info.value)
    assert f"a segment of 123 bytes at {seg.address:#x}" in message and "77 bytes" not in message
    assert "test_debug_mode_names_the_segments_allocated_after_a_reset" in message
    view.release()
    a.close()


def test_debug_mode_switched_while_segments_are_exported_names_only_the_exported_ones():
    """The exports of a segment allocated in debug mode count whatever the mode is when they begin
    and end: an export released out of debug mode is not named later (it once stayed counted), and
    one taken out of it and released in it does not hide a real one."""
    a = arenalib.Arena()
    try:
        arenalib.set_debug(True)
        released, hidden, exported = a.allocate(111), a.allocate(222), a.allocate(333)
        view = memoryview(released)
        arenalib.set_debug(False)
        view.release()  # out of debug mode
        early = memoryview(hidden)  # out of debug mode, for the whole test
        arenalib.set_debug(True)
        late = memoryview(exported)
        with pytest.raises(BufferError) as info:
            a.close()
    finally:
        arenalib.set_debug(False)
    message = str(info.value)
    assert f"a segment of 111 bytes at {released.address:#x}" not in message
    assert f"a segment of 222 bytes at {hidden.address:#x} (1 export(s))" in message
    assert f"a segment of 333 bytes at {exported.address:#x} (1 export(s))" in message
    early.release()
    late.release()
    a.close()


def test_without_debug_mode_the_error_says_how_to_name_them():
    a = arenalib.ConfinedArena()
    view = memoryview(a.allocate(5))
    with pytest.raises(BufferError, match=r"set_debug\(True\)"):
        a.reset()
    view.release()
    a.close()


class DeferredCloseMachine(RuleBasedStateMachine):
    """Segments, exports and closes of arenas made one after another, against a model: a segment
    is alive while its arena is open; an export keeps its bytes readable until released, whatever
    its arena does; a closed arena's slot goes back with its last export."""

    def __init__(self):
        super().__init__()
        self.before = slots_in_use()
        self.arenas = []     # every arena made, the last one the current
        self.closed = []     # parallel to arenas
        self.segments = []   # (segment, byte) of the current arena
        self.views = []      # (memoryview, byte, size, index of its arena)
        self.new_arena()

    @precondition(lambda self: self.closed[-1])
    @rule(kind=st.sampled_from([arenalib.Arena, arenalib.ConfinedArena, arenalib.SlicingArena]))
    def new_arena(self, kind=arenalib.Arena):
        self.arenas.append(kind())
        self.closed.append(False)
        self.segments = []

    @precondition(lambda self: not self.closed[-1])
    @rule(size=st.integers(1, 300), byte=st.integers(0, 255))
    def allocate(self, size, byte):
        self.segments.append((self.arenas[-1].allocate(size, zero=False).fill(byte), byte))

    @precondition(lambda self: not self.closed[-1] and self.segments)
    @rule(data=st.data())
    def export(self, data):
        seg, byte = data.draw(st.sampled_from(self.segments))
        self.views.append((memoryview(seg), byte, len(seg), len(self.arenas) - 1))

    @precondition(lambda self: self.views)
    @rule(data=st.data(), other_thread=st.booleans())
    def release(self, data, other_thread):
        view = self.views.pop(data.draw(st.integers(0, len(self.views) - 1)))[0]
        if other_thread:
            t = threading.Thread(target=view.release)
            t.start()
            t.join()
        else:
            view.release()

    @precondition(lambda self: len(self.views) >= 2)
    @rule(data=st.data())
    def release_at_once(self, data):
        # Several exports released by threads started together: with the GIL off (3.13t) they
        # run in parallel, and of the last ones exactly one gives a closed arena's slot back.
        count = data.draw(st.integers(2, min(6, len(self.views))))
        picked = [self.views.pop(data.draw(st.integers(0, len(self.views) - 1)))[0] for _ in range(count)]
        barrier = threading.Barrier(count)

        def release(view):
            barrier.wait()
            view.release()

        threads = [threading.Thread(target=release, args=(view,)) for view in picked]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _exported(self, index):
        return sum(1 for v in self.views if v[3] == index)

    @precondition(lambda self: not self.closed[-1])
    @rule()
    def close(self):
        if self._exported(len(self.arenas) - 1):
            with pytest.raises(BufferError):
                self.arenas[-1].close()
        else:
            self.arenas[-1].close()
            self.closed[-1] = True

    @precondition(lambda self: not self.closed[-1])
    @rule(with_exit=st.booleans())
    def close_deferred(self, with_exit):
        if with_exit:
            self.arenas[-1].__exit__(None, None, None)
        else:
            self.arenas[-1].close(deferred=True)
        self.closed[-1] = True

    @invariant()
    def exports_see_their_bytes(self):
        for view, byte, size, _ in self.views:
            assert view.tobytes() == bytes([byte]) * size

    @invariant()
    def segments_live_while_open(self):
        for seg, byte in self.segments:
            assert seg.alive == (not self.closed[-1])
            if not self.closed[-1]:
                assert seg.tobytes() == bytes([byte]) * len(seg)

    @invariant()
    def held_while_closed_and_exported(self):
        held = 0
        for index, arena in enumerate(self.arenas):
            exported = self._exported(index)
            assert arena.stats()["held_by_exports"] == (exported if self.closed[index] else 0)
            held += not self.closed[index] or exported > 0
        assert slots_in_use() == self.before + held

    def teardown(self):
        for view, _, _, _ in self.views:
            view.release()
        for arena in self.arenas:
            arena.close()


TestDeferredClose = DeferredCloseMachine.TestCase
TestDeferredClose.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_generator_closed_on_another_thread_inside_a_confined_scope_says_why_it_stays_open():
    """A generator suspended in `with ConfinedArena()` and closed on another thread: the close is
    refused there (WrongThreadError).  Noted on the GeneratorExit, it was swallowed with it by
    close(), and the arena stayed open silently until the collector's ResourceWarning."""
    from arenalib import ConfinedArena, WrongThreadError

    def scoped():
        with ConfinedArena() as arena:
            arena.allocate(16)
            yield arena

    gen = scoped()
    arena = next(gen)
    with pytest.raises(WrongThreadError) as caught:
        run_threads(lambda index: gen.close(), 1)
    assert isinstance(caught.value.__context__, GeneratorExit)
    assert arena.stats()["live_segments"] == 1  # open: its owner closes it
    arena.close()
