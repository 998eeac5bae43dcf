"""The features of issues 26 (frames), 27 (resize, helpers, deferred close, automatic segments,
`with seg:`) and 28 (NumPy scopes) used together, each test one combination that held when attacked.

What it promises: a combination kills or keeps each segment as each feature alone would, no data
moves under a live export, and the books (stats(), live_objects(), tracemalloc) come back to
where they started once everything is released."""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc

import numpy as np
import pytest

import arenalib
from arenalib import ArenaClosedError, SlicingArena, UnsupportedOperation


def test_resize_in_a_frame_then_its_exit_leaves_tracemalloc_and_books_as_before():
    a = SlicingArena(chunk_size=4096)
    outer = a.allocate(100).fill(1)
    domain = tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)
    tracemalloc.start()
    try:
        def traced():
            return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([domain]).traces)

        before = traced()
        with a.frame() as f:
            seg = f.allocate(100).fill(2).resize(300)  # grows in place: the frame's last carve
            seg = seg.resize(50)
            big = f.allocate(5000).fill(3)  # a chunk of its own
            seg = seg.resize(200)  # not the last carve any more: moves to a new carve
            assert seg.tobytes() == b"\2" * 50 + bytes(150) and big.tobytes() == b"\3" * 5000
            with pytest.raises(ValueError):
                outer.resize(200)  # would move into the frame, whose exit would take it
            assert traced() == before + 200 + 5000
        assert traced() == before and not seg.alive and not big.alive
        assert outer.tobytes() == b"\1" * 100
        assert a.stats()["live_bytes"] == 100 and a.stats()["live_segments"] == 1
    finally:
        tracemalloc.stop()
        a.close()


def test_deferred_close_with_frames_marks_and_a_resized_export_open():
    a = SlicingArena(chunk_size=4096)
    frame = a.frame()
    frame.__enter__()
    seg = frame.allocate(100).fill(4).resize(3000)
    view = memoryview(seg)
    mark = a.mark()
    a.close(deferred=True)
    for call in (a.mark, lambda: a.rewind(mark), lambda: frame.allocate(1)):
        with pytest.raises((ArenaClosedError, ValueError)):
            call()
    assert frame.__exit__(None, None, None) is False  # nothing left to rewind
    assert not seg.alive and not mark.valid
    assert view[:100].tobytes() == b"\4" * 100  # the memory stays under its export
    assert a.stats()["held_by_exports"] == 1
    view.release()
    assert a.stats()["held_by_exports"] == 0 and a.stats()["held_bytes"] == 0


def test_a_thread_ends_with_its_frame_open_and_a_resized_segment_exported():
    kept = []

    def work():
        frame = arenalib.frame()
        frame.__enter__()
        seg = frame.allocate(5000).fill(7).resize(100)
        kept.extend((frame, seg, memoryview(seg)))

    for _ in range(3):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    for frame, seg, view in zip(kept[::3], kept[1::3], kept[2::3], strict=True):
        assert view.tobytes() == b"\7" * 100
        assert not seg.alive  # its arena closed with the thread, deferred by the export
        assert frame.__exit__(None, None, None) is False
        with pytest.raises(ValueError):
            frame.allocate(1)
        view.release()
    del frame, seg, view
    kept.clear()
    gc.collect()
    assert arenalib.live_objects()["closing_arenas"] == 0


def test_with_blocks_of_arena_numpy_scope_and_segment_end_in_any_release_order():
    for reverse in (False, True):
        with arenalib.Arena() as a, a.numpy():
            with a.allocate(1000) as seg:
                on_segment = np.frombuffer(seg, np.uint8)
                array = np.full(10, 3)
        assert a.closed and a.stats()["numpy_arrays"] == 1 and a.stats()["held_by_exports"] == 1
        array.resize(100_000, refcheck=False)  # moves to NumPy's own handler, arena closed
        assert array[:10].tolist() == [3] * 10 and a.stats()["numpy_arrays"] == 0
        both = [on_segment, array]
        del on_segment, array
        if reverse:
            both.reverse()
        while both:
            both.pop()
        assert a.stats()["held_by_exports"] == 0 and a.stats()["held_bytes"] == 0
        assert not seg.alive


def test_automatic_segments_with_helpers_resize_and_numpy_from_threads():
    auto = arenalib.allocate(1).arena
    start = auto.stats()["live_segments"]
    results = []

    def work(byte):
        seg = auto.allocate_from(bytes([byte]) * 100)
        seg = seg.resize(70_000)  # large: another class, moves
        with seg:
            ro = seg.readonly()
            results.append((byte, ro.hex()[:4], seg.mismatch(bytes([byte]) * 100)))
        with auto.numpy():
            results.append(int(np.full(1000, byte, dtype=np.int64).sum()))

    threads = [threading.Thread(target=work, args=(b,)) for b in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r for r in results if isinstance(r, tuple)) == [
        (b, f"{b:02x}" * 2, 100) for b in (1, 2, 3)]
    assert sorted(r for r in results if isinstance(r, int)) == [1000, 2000, 3000]
    gc.collect()
    assert auto.stats()["live_segments"] == start and auto.stats()["numpy_arrays"] == 0


@pytest.mark.parametrize("make", ["slice", "readonly"])
def test_a_slice_of_an_automatic_segment_is_not_freed_by_with(make):
    seg = arenalib.allocate(64).fill(6)
    part = seg.slice(8, 8) if make == "slice" else seg.readonly()
    with pytest.raises(UnsupportedOperation):
        with part:
            pass
    with pytest.raises(UnsupportedOperation):
        part.__exit__(None, None, None)
    del seg
    gc.collect()
    assert part.alive and part.tobytes() == b"\6" * len(part)  # the slice keeps its root


def test_a_forked_child_leaves_frames_releases_exports_and_allocates():
    a = SlicingArena()
    frame = a.frame()
    frame.__enter__()
    seg = frame.allocate(100).fill(4)
    view = memoryview(seg)
    auto = arenalib.allocate(100).fill(6)
    pid = os.fork()
    if pid == 0:
        try:
            ok = view[0] == 4 and auto.resize(1000).tobytes()[:100] == b"\6" * 100
            view.release()
            frame.__exit__(None, None, None)
            with a.frame() as f:
                ok = ok and f.allocate(10).fill(1).tobytes() == b"\1" * 10
            ok = ok and not seg.alive
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seg.tobytes() == b"\4" * 100 and auto.tobytes() == b"\6" * 100  # the parent's own
    view.release()
    frame.__exit__(None, None, None)
    a.close()
