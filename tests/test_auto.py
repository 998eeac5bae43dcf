"""Segments without a scope (issue 27): arenalib.allocate() (freed when garbage, Panama's
Arena.ofAuto()), and `with seg:` (freed or released at the block's end, deferred while exported).

What it promises: an automatic segment's memory goes back when the last reference to it, its slices
and its buffer exports is gone, from whichever thread drops it, with no ResourceWarning, and never
earlier; the AutoArena refuses what would kill others' segments (close, reset, with); `with seg:`
frees at exit unless the segment went already, and the block's exception propagates unchanged."""

from __future__ import annotations

import gc
import os
import queue
import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import FREEABLE_KINDS, assert_ok, run_python, run_threads

import arenalib
from arenalib import ArenaClosedError, AutoArena, UnsupportedOperation

AUTO = arenalib.auto_arena()


def books() -> tuple[int, int]:
    """(live segments, live bytes) of the automatic arena."""
    stats = AUTO.stats()
    return stats["live_segments"], stats["live_bytes"]


# -- arenalib.allocate() ----------------------------------------------------------------------------

def test_allocate_zeroed_unzeroed_and_aligned():
    seg = arenalib.allocate(1000)
    assert len(seg) == 1000 and seg.tobytes() == bytes(1000)
    seg.fill(7)
    assert arenalib.allocate(100, zero=False, align=4096).address % 4096 == 0
    assert isinstance(seg.arena, AutoArena) and seg.arena is AUTO


@pytest.mark.parametrize(("args", "kwargs", "error", "words"), [
    (("10",), {}, TypeError, "size"),
    ((-1,), {}, ValueError, "size"),
    ((10,), {"zero": object()}, TypeError, "zero"),
    ((10,), {"align": 3}, ValueError, "align"),
    ((1 << 62,), {}, MemoryError, "cannot allocate"),
])
def test_allocate_refuses_bad_arguments_naming_them(args, kwargs, error, words):
    before = books()
    with pytest.raises(error, match=words):
        arenalib.allocate(*args, **kwargs)
    assert books() == before


def test_a_segment_is_freed_when_it_becomes_garbage():
    before = books()
    seg = arenalib.allocate(12345)
    assert books() == (before[0] + 1, before[1] + 12345)
    del seg
    assert books() == before
    segs = [arenalib.allocate(n) for n in range(1, 500)]
    assert books()[0] == before[0] + 499
    segs.clear()
    assert books() == before


def test_slices_views_and_exports_keep_the_memory():
    before = books()
    seg = arenalib.allocate(64).fill(5)
    part = seg.slice(8, 8)
    frozen = seg.readonly()
    view = memoryview(seg)
    array = np.frombuffer(arenalib.allocate(16).fill(3), np.uint8)
    del seg
    assert books()[0] == before[0] + 2
    assert part.tobytes() == b"\x05" * 8 and frozen.tobytes() == b"\x05" * 64
    assert view.tobytes() == b"\x05" * 64 and int(array.sum()) == 48
    del part, frozen
    assert books()[0] == before[0] + 2  # the memoryview still holds it
    view.release()
    del view
    assert books()[0] == before[0] + 1
    del array
    assert books() == before


def test_garbage_in_a_cycle_is_freed_by_the_collector():
    before = books()

    class Node:
        pass

    node = Node()
    node.me = node
    node.seg = arenalib.allocate(4096)
    del node
    gc.collect()
    assert books() == before


def test_no_resource_warning_and_no_open_arena_counted():
    # pytest turns warnings into errors: a ResourceWarning would fail the test.
    live = arenalib.live_objects()
    arenalib.allocate(10)
    assert arenalib.live_objects() == live
    assert not AUTO.closed and AUTO.max_bytes is None


def test_free_early_then_the_garbage_frees_nothing():
    before = books()
    seg = arenalib.allocate(100)
    seg.free()
    assert not seg.alive and books() == before
    del seg
    assert books() == before


def test_free_refuses_while_exported_and_defers_when_asked():
    before = books()
    seg = arenalib.allocate(100).fill(1)
    view = memoryview(seg)
    with pytest.raises(BufferError):
        seg.free()
    seg.free(deferred=True)
    assert seg.alive and view.tobytes() == b"\x01" * 100
    view.release()
    assert not seg.alive and books() == before


def test_resize_gives_another_automatic_segment():
    before = books()
    seg = arenalib.allocate(100).fill(2)
    grown = seg.resize(100_000)
    assert not seg.alive and grown.arena is AUTO
    assert grown.tobytes()[:100] == b"\x02" * 100 and grown.tobytes()[100:] == bytes(99_900)
    del seg
    assert books() == (before[0] + 1, before[1] + 100_000)
    del grown
    assert books() == before


def test_the_auto_arena_refuses_close_reset_and_with():
    # Through the base class's methods too (ArenaBase.reset(AUTO) reset it, killing others' segments).
    held = arenalib.allocate(16).fill(3)
    for refused in (AUTO.close, lambda: AUTO.close(deferred=True), AUTO.reset,
                    lambda: AUTO.__exit__(None, None, None), lambda: arenalib.ArenaBase.reset(AUTO),
                    lambda: arenalib.ArenaBase.close(AUTO), lambda: arenalib.Arena.reset(AUTO)):
        with pytest.raises(UnsupportedOperation):
            refused()
    with pytest.raises(UnsupportedOperation, match="not a scope"):
        with AUTO:
            pass
    assert not AUTO.closed and held.tobytes() == b"\x03" * 16
    with pytest.raises(TypeError, match="cannot be instantiated"):
        AutoArena()
    assert arenalib.auto_arena() is AUTO
    seg = AUTO.allocate_from(b"abc")
    text = AUTO.allocate_string("hi")
    assert seg.tobytes() == b"abc" and text.tobytes() == b"hi\x00" and seg.arena is AUTO
    AUTO.purge()  # hands dirty pages back; live segments stay
    assert seg.tobytes() == b"abc"


def test_the_c_api_refuses_the_auto_arena(cython_consumers):
    # Its blocks are freed by the collector, which knows nothing of a C caller's pointers.
    with pytest.raises(UnsupportedOperation, match="not handed to C"):
        cython_consumers["safety_consumer"].core_address(AUTO)


def test_process_wide_operations_leave_automatic_segments_alone():
    # trim() resets and wipes idle slots, set_retention() evicts warm ones, purge() hands dirty
    # pages back: the AutoArena's slot is in use, its live segments keep their bytes.
    segs = [arenalib.allocate(n, zero=False).fill(n % 251) for n in (100, 5000, 70_000, 3 << 20)]
    retention = arenalib.get_retention()
    try:
        arenalib.set_retention(0)
        arenalib.trim()
        AUTO.purge()
        del segs[1]  # a free in between
        arenalib.trim()
    finally:
        arenalib.set_retention(retention)
    assert [s.tobytes() == bytes([len(s) % 251]) * len(s) for s in segs] == [True] * 3


def test_a_segment_dropped_by_another_thread_is_freed_there():
    before = books()
    handed = queue.SimpleQueue()
    seen = []

    def make():
        for i in range(200):
            handed.put((arenalib.allocate(64 + i).fill(i % 256), i))
        handed.put(None)

    def drop():
        while (item := handed.get()) is not None:
            seg, i = item
            seen.append(seg.tobytes() == bytes([i % 256]) * (64 + i))
            del seg, item

    threads = [threading.Thread(target=make), threading.Thread(target=drop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [True] * 200
    assert books() == before


def test_threads_allocating_handing_over_and_dropping_at_once():
    # With the GIL off (3.13t) the frees of one thread run beside the allocations of the others;
    # every segment keeps its own bytes until it is dropped.
    before = books()
    handed = [queue.SimpleQueue() for _ in range(4)]
    bad = []

    def work(index):
        for i in range(2000):
            seg = arenalib.allocate(16 + (i * 37) % 3000, zero=False).fill((index * 50 + i) % 256)
            handed[(index + 1) % 4].put((seg, (index * 50 + i) % 256))
            try:
                other, byte = handed[index].get_nowait()
            except queue.Empty:
                continue
            if other.tobytes() != bytes([byte]) * len(other):
                bad.append(other.tobytes()[:16])
        return 0

    run_threads(work, 4)
    for q in handed:
        while not q.empty():
            q.get()
    assert not bad
    assert books() == before


def test_a_finalizer_dropping_segments_inside_allocate():
    # gc.set_threshold(1): a collection (and finalizers dropping automatic segments, whose memory
    # goes back inside the allocate under way) runs at almost every allocation of a GC object.
    before = books()
    kept = []

    class Dropper:
        def __init__(self):
            self.me = self
            self.segs = [arenalib.allocate(48).fill(9) for _ in range(3)]

        def __del__(self):
            self.segs.clear()

    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        for i in range(500):
            Dropper()
            kept.append(arenalib.allocate(48).fill(i % 256))
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert [seg.tobytes() for seg in kept] == [bytes([i % 256]) * 48 for i in range(500)]
    assert books()[0] == before[0] + 500
    kept.clear()
    assert books() == before


def test_dropped_while_an_exception_propagates():
    before = books()

    def fails():
        seg = arenalib.allocate(100)  # noqa: F841  (garbage as the frame goes, the error set)
        raise KeyError("body")

    with pytest.raises(KeyError) as info:
        fails()
    assert info.value.args == ("body",) and info.value.__context__ is None
    del info
    assert books() == before


def test_tracemalloc_sees_the_block_go_with_the_garbage():
    tracemalloc.start()
    try:
        seg = arenalib.allocate(777_777)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)])
        assert sum(t.size for t in snapshot.traces) >= 777_777
        del seg
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)])
        assert all(t.size != 777_777 for t in snapshot.traces)
    finally:
        tracemalloc.stop()


def test_debug_mode_frees_the_garbage():
    # Debug mode records each allocation (where it was made): the garbage's free forgets it.
    before = books()
    arenalib.set_debug(True)
    try:
        segs = [arenalib.allocate(321) for _ in range(10)]
        view = memoryview(segs[0])
        with pytest.raises(BufferError, match="a segment of 321 bytes at 0x") as info:
            segs[0].free()
        assert "test_debug_mode_frees_the_garbage" in str(info.value)  # where it was allocated
        view.release()
        del segs, view
    finally:
        arenalib.set_debug(False)
    assert books() == before


def test_a_forked_child_frees_its_copies():
    seg = arenalib.allocate(4096).fill(4)
    pid = os.fork()
    if pid == 0:  # the child: its copy of the segment goes back to its copy of the arena
        try:
            before = books()
            ok = seg.tobytes() == b"\x04" * 4096
            del seg
            more = [arenalib.allocate(100).fill(1) for _ in range(100)]
            ok = ok and books()[0] == before[0] - 1 + 100
            more.clear()
            ok = ok and books()[0] == before[0] - 1
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seg.tobytes() == b"\x04" * 4096


def test_interpreter_exit_with_automatic_segments_alive():
    # Segments in module globals, in a thread's locals, exported: no ResourceWarning, no crash, and
    # the atexit-time drops free into an arena that is still open.
    out = assert_ok(run_python("""
        import threading, arenalib
        kept = [arenalib.allocate(n).fill(1) for n in range(1, 100)]
        view = memoryview(kept[5])
        event = threading.Event()
        def hold():
            seg = arenalib.allocate(64)
            event.set()
            threading.Event().wait(60)
        threading.Thread(target=hold, daemon=True).start()
        event.wait()
        print("ok")
    """, options=("-W", "error", "-X", "dev")))
    assert out.strip() == "ok"


def test_first_use_from_many_threads_makes_one_arena():
    out = assert_ok(run_python("""
        import threading, arenalib
        start = threading.Barrier(8)
        arenas = []
        def first():
            start.wait()
            arenas.append(arenalib.allocate(8).arena)
        threads = [threading.Thread(target=first) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert len({id(a) for a in arenas}) == 1, arenas
        assert arenalib.live_objects()["open_arenas"] == 0
        print(arenalib.pool_stats()["slots_created"] - arenalib.pool_stats()["slots_idle"])
    """, options=("-W", "error")))
    assert out.strip() == "1"  # the arenas made by the threads that lost went back


# -- with seg: ---------------------------------------------------------------------------------------

def _owners():
    """Each kind whose segments `with` frees: the arenas freeing one by one, a pool, the auto arena."""
    return [*FREEABLE_KINDS, arenalib.BufferPool, AutoArena]


def _make_owner(kind):
    if kind is arenalib.BufferPool:
        return arenalib.BufferPool(256, 4)
    if kind is AutoArena:
        return AUTO
    return kind()


def _get(owner, n=100):
    if isinstance(owner, arenalib.BufferPool):
        return owner.acquire()
    return owner.allocate(n)


def _close(owner):
    if owner is not AUTO:
        owner.close()


def _live(owner) -> int:
    if isinstance(owner, arenalib.BufferPool):
        return len(owner) - owner.available
    return owner.stats()["live_segments"]


@pytest.mark.parametrize("kind", _owners(), ids=lambda k: k.__name__)
def test_with_frees_at_exit(kind):
    owner = _make_owner(kind)
    before = _live(owner)
    with _get(owner) as seg:
        seg.fill(3)
        assert _live(owner) == before + 1
    assert not seg.alive and _live(owner) == before
    with pytest.raises(ArenaClosedError):
        seg.tobytes()
    _close(owner)


@pytest.mark.parametrize("kind", _owners(), ids=lambda k: k.__name__)
def test_with_defers_while_exported(kind):
    owner = _make_owner(kind)
    before = _live(owner)
    with _get(owner) as seg:
        view = memoryview(seg)
        seg.fill(8)
    assert seg.alive and _live(owner) == before + 1  # held by the export
    assert view.tobytes()[:4] == b"\x08" * 4
    view.release()
    assert not seg.alive and _live(owner) == before
    _close(owner)


@pytest.mark.parametrize("kind", _owners(), ids=lambda k: k.__name__)
def test_with_propagates_the_bodys_exception_unchanged(kind):
    owner = _make_owner(kind)

    class Boom(Exception):
        pass

    with pytest.raises(Boom) as info:
        with _get(owner) as seg:
            raise Boom("body")
    assert info.value.args == ("body",) and info.value.__context__ is None
    assert not seg.alive
    _close(owner)


@pytest.mark.parametrize("kind", _owners(), ids=lambda k: k.__name__)
def test_with_after_the_segment_went_in_the_block(kind):
    owner = _make_owner(kind)
    with _get(owner) as seg:
        seg.free()
    if kind is not arenalib.BufferPool:
        with _get(owner) as seg:
            grown = seg.resize(5000)  # the with's segment dies; the resized one stays
        assert grown.alive
        grown.free()
    if owner is not AUTO:
        with _get(owner):
            if isinstance(owner, arenalib.BufferPool):
                owner.close()
            else:
                owner.close(deferred=True)
        assert owner.closed


def test_with_a_failing_free_keeps_the_bodys_exception_and_notes_it():
    # A ConfinedArena's segment left on another thread (by calling __exit__ there): the free is
    # refused; the body's exception is what propagates, with a note, and without one the error.
    a = arenalib.ConfinedArena()
    seg = a.__enter__().allocate(10).__enter__()
    body = KeyError("body")
    results = []

    def exit_elsewhere(exc):
        try:
            results.append(seg.__exit__(type(exc) if exc else None, exc, None))
        except BaseException as error:
            results.append(error)

    for exc in (body, None):
        t = threading.Thread(target=exit_elsewhere, args=(exc,))
        t.start()
        t.join()
    assert results[0] is False and isinstance(results[1], arenalib.WrongThreadError)
    assert any("freeing the segment failed" in note for note in body.__notes__)
    assert seg.alive
    a.close()


@pytest.mark.parametrize("make", ["slice", "readonly", "slicing"])
def test_with_refuses_what_is_not_freed_one_by_one(make):
    a = arenalib.SlicingArena() if make == "slicing" else arenalib.Arena()
    seg = a.allocate(64)
    target = {"slice": lambda: seg.slice(0, 8), "readonly": seg.readonly, "slicing": lambda: seg}[make]()
    with pytest.raises(UnsupportedOperation):
        with target:
            pass
    assert seg.alive and target.alive
    a.close()


@pytest.mark.parametrize("make", ["slice", "readonly", "slicing", "slicing_exported"])
def test_exit_alone_refuses_what_enter_refuses(make):
    # __exit__ called without __enter__ (it is public): it refused nothing, so a slice's exit freed
    # the parent's block at the slice's interior address (the books went to -1), and a SlicingArena
    # segment's exported exit left a free for the release that raised there, unraisably.
    a = arenalib.SlicingArena() if make.startswith("slicing") else arenalib.Arena()
    seg = a.allocate(1 << 16).fill(5)
    target = {"slice": lambda: seg.slice(4096, 4096), "readonly": seg.readonly}.get(make, lambda: seg)()
    view = memoryview(target) if make == "slicing_exported" else None
    with pytest.raises(UnsupportedOperation):
        target.__exit__(None, None, None)
    body = KeyError("body")
    assert target.__exit__(KeyError, body, None) is False
    assert any("freeing the segment failed" in note for note in body.__notes__)
    if view is not None:
        view.release()
    assert seg.alive and target.alive and seg.tobytes() == b"\x05" * (1 << 16)
    assert a.stats()["live_segments"] == 1 and a.stats()["live_bytes"] == 1 << 16
    a.close()


def test_with_a_dead_segment_raises_at_entry():
    a = arenalib.Arena()
    seg = a.allocate(8)
    seg.free()
    with pytest.raises(ArenaClosedError):
        with seg:
            pass
    a.close()


def test_with_binds_without_a_tracked_method_object():
    seg = arenalib.allocate(8)
    bound = seg.__enter__  # what the with statement looks up (_with.pxi)
    assert not gc.is_tracked(bound) and bound.__name__ == "__enter__"
    assert bound() is seg
    seg.__exit__(None, None, None)
    assert not seg.alive


# -- a state machine against a model of the books ---------------------------------------------------

class AutoMachine(RuleBasedStateMachine):
    """Automatic segments made, sliced, exported, freed, deferred, resized, left by `with` and dropped
    (from this thread or another), against a model: each is alive until freed or until it, its slices
    and its exports are all gone; the arena's books count exactly the alive ones; every alive one
    holds its bytes."""

    def __init__(self):
        super().__init__()
        self.before = books()
        self.entries = []  # {"seg", "byte", "size", "held": [slices and views], "deferred"}

    def _alive(self):
        return [e for e in self.entries if e["seg"] is not None or e["held"]]

    @rule(size=st.integers(0, 70_000), byte=st.integers(0, 255))
    def allocate(self, size, byte):
        seg = arenalib.allocate(size, zero=False).fill(byte)
        self.entries.append({"seg": seg, "byte": byte, "size": size, "held": [], "freed": False})

    def _pick(self, data, pred):
        # By index: hypothesis keeps what it draws (for its report), and an entry holds segments.
        choices = [e for e in self.entries if pred(e)]
        return choices[data.draw(st.integers(0, len(choices) - 1))]

    @precondition(lambda self: any(e["seg"] is not None and not e["freed"] for e in self.entries))
    @rule(data=st.data(), how=st.sampled_from(["slice", "readonly", "memoryview"]))
    def hold(self, data, how):
        e = self._pick(data, lambda e: e["seg"] is not None and not e["freed"])
        seg = e["seg"]
        held = {"slice": lambda: seg.slice(0, min(4, len(seg))), "readonly": seg.readonly,
                "memoryview": lambda: memoryview(seg)}[how]()
        e["held"].append(held)

    @precondition(lambda self: any(e["held"] for e in self.entries))
    @rule(data=st.data(), other_thread=st.booleans())
    def let_go(self, data, other_thread):
        e = self._pick(data, lambda e: e["held"])
        held = e["held"].pop(data.draw(st.integers(0, len(e["held"]) - 1)))
        release = held.release if isinstance(held, memoryview) else (lambda: None)
        if other_thread:
            t = threading.Thread(target=release)
            t.start()
            t.join()
        else:
            release()
        del held
        self._settle(e)

    @precondition(lambda self: any(e["seg"] is not None for e in self.entries))
    @rule(data=st.data(), other_thread=st.booleans())
    def drop(self, data, other_thread):
        e = self._pick(data, lambda e: e["seg"] is not None)
        seg, e["seg"] = e["seg"], None
        if other_thread:
            box = [seg]
            del seg
            t = threading.Thread(target=box.clear)
            t.start()
            t.join()
        else:
            del seg
        self._settle(e)

    @precondition(lambda self: any(e["seg"] is not None and not e["freed"] for e in self.entries))
    @rule(data=st.data(), how=st.sampled_from(["free", "deferred", "exit"]))
    def free(self, data, how):
        e = self._pick(data, lambda e: e["seg"] is not None and not e["freed"])
        exported = any(isinstance(h, memoryview) for h in e["held"])
        if how == "free" and exported:
            try:
                e["seg"].free()
            except BufferError:
                return  # (no pytest.raises: its traceback would make a cycle holding the segment)
            raise AssertionError("free() of an exported segment did not raise BufferError")
        if how == "free":
            e["seg"].free()
        elif how == "deferred":
            e["seg"].free(deferred=True)
        else:
            e["seg"].__exit__(None, None, None)
        e["freed"] = True
        if not exported:
            e["held"] = [h for h in e["held"] if isinstance(h, memoryview)]
        self._settle(e)

    @precondition(lambda self: any(e["seg"] is not None and not e["freed"] and not e["held"]
                                   for e in self.entries))
    @rule(data=st.data(), size=st.integers(0, 70_000))
    def resize(self, data, size):
        e = self._pick(data, lambda e: e["seg"] is not None and not e["freed"] and not e["held"])
        old = e["seg"]
        e["seg"] = old.resize(size, zero=False)
        e["size"] = size
        del old
        e["seg"].fill(e["byte"])

    def _settle(self, e):
        """An entry whose memory is gone (freed with no export left, or all references gone)."""
        if e["freed"] and not any(isinstance(h, memoryview) for h in e["held"]):
            e["gone"] = True
        if e["seg"] is None and not e["held"]:
            e["gone"] = True
        if e.get("gone"):
            e["held"] = []
            self.entries.remove(e)

    @invariant()
    def books_count_the_alive(self):
        alive = [e for e in self.entries if not e.get("gone")]
        assert books() == (self.before[0] + len(alive), self.before[1] + sum(e["size"] for e in alive))

    @invariant()
    def alive_ones_hold_their_bytes(self):
        for e in self.entries:
            if e["seg"] is not None:
                assert e["seg"].alive
                assert e["seg"].tobytes() == bytes([e["byte"]]) * e["size"]
            for h in e["held"]:
                data = bytes(h) if isinstance(h, memoryview) else h.tobytes()
                assert data == bytes([e["byte"]]) * len(data)

    def teardown(self):
        for view in [h for e in self.entries for h in e["held"] if isinstance(h, memoryview)]:
            view.release()
        self.entries.clear()
        assert books() == self.before


TestAuto = AutoMachine.TestCase
TestAuto.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
