"""Checked frames (issue 26): SlicingArena.mark()/rewind(), `with arena.frame():`, the calling
thread's own frame arena (arenalib.frame()), and arena_mark()/arena_rewind() of the C API.

After a rewind, a segment carved after the mark raises ArenaClosedError on any use (as after a
reset) while those carved before it stay alive with their bytes; what a rewind refuses (a stale
mark, a frame left out of order, a live export it would kill) changes nothing."""

from __future__ import annotations

import gc
import itertools
import os
import sys
import threading
import time
import tracemalloc

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import overlapping_live_carves

import arenalib
from arenalib import ArenaClosedError, ConfinedArena, Frame, Mark, SlicingArena, WrongThreadError


@pytest.fixture
def arena():
    with SlicingArena(chunk_size=1 << 16) as a:
        yield a


@pytest.fixture
def main_frame_arena_closed():
    """Close the main thread's frame arena after the test (the leak check counts its slot)."""
    yield
    arenalib.frame_arena().close()


def carve(a, n, byte, size=64):
    return [a.allocate(size, zero=False).fill(byte) for _ in range(n)]


def assert_dead(seg):
    assert not seg.alive
    with pytest.raises(ArenaClosedError):
        seg.tobytes()
    with pytest.raises(ArenaClosedError):
        memoryview(seg)


# -- mark and rewind ---------------------------------------------------------------------------------

def test_rewind_kills_what_was_carved_after_the_mark_and_keeps_the_rest(arena):
    before = carve(arena, 3, 1)
    mark = arena.mark()
    after = carve(arena, 5, 2)
    first_after = after[0].address
    arena.rewind(mark)
    for seg in before:
        assert seg.alive and seg.tobytes() == bytes([1]) * 64
    for seg in after:
        assert_dead(seg)
    # The memory is carved again, from where the mark stood.
    again = arena.allocate(64, zero=False)
    assert again.address == first_after
    assert again.fill(7).tobytes() == bytes([7]) * 64
    for seg in before:
        assert seg.tobytes() == bytes([1]) * 64


def test_a_mark_is_used_up_by_its_rewind(arena):
    mark = arena.mark()
    arena.rewind(mark)
    assert not mark.valid
    with pytest.raises(ValueError, match="used up, by a rewind to it or to an earlier mark"):
        arena.rewind(mark)
    for round_ in range(100):
        mark = arena.mark()
        segs = carve(arena, 3, round_ % 256)
        arena.rewind(mark)
        assert all(not s.alive for s in segs)
    assert arena.stats()["marks"] == 0


def test_a_mark_made_before_any_chunk_carves_from_the_first_chunk_again():
    with SlicingArena(chunk_size=4096) as a:
        for _ in range(3):
            with a.frame():
                pass  # nothing carved: nothing to put back
        m = a.mark()
        assert repr(m).startswith("<arenalib.Mark at depth 1 ") and repr(m).endswith(", valid>")
        first = a.allocate(100)
        address = first.address
        a.rewind(m)
        assert repr(m).endswith(", used up>")
        assert a.allocate(100).address == address
        assert a.stats()["chunks"] == 1


def test_at_most_16384_marks_are_open(arena):
    first = arena.mark()
    for _ in range(16383):
        arena.mark()
    with pytest.raises(MemoryError, match="16384 marks"):
        arena.mark()
    with pytest.raises(MemoryError):
        arena.frame().__enter__()
    arena.rewind(first)
    assert arena.stats()["marks"] == 0
    with arena.frame():
        assert arena.stats()["marks"] == 1


def test_the_depth_limit_reached_by_frames_kept_for_exports_names_them(arena):
    # Each frame's exit is refused while a memoryview of its segment lives: the frames stay on
    # the stack up to the limit, whose error says why and what lets them go.
    views = [memoryview(arena.allocate(8))]  # one below every frame, which no frame kills
    for _ in range(16384):
        with pytest.raises(BufferError), arena.frame():
            views.append(memoryview(arena.allocate(8)))
    with pytest.raises(MemoryError, match=r"16384 of them are frames whose exit was refused.*"
                                          r"outermost held at depth 1\b"):
        arena.frame().__enter__()
    views[1].release()  # the outermost frame is no longer held, but frames above it are
    with pytest.raises(MemoryError, match=r"16383 of them .* outermost held at depth 2\b.*; 1 more are "
                                          r"frames whose exit was refused .* until the frames above them go"):
        arena.mark()
    views[-1].release()  # the innermost frame goes with the next push
    with arena.frame():
        assert arena.stats()["marks"] == 16384
    del views[1:]
    with arena.frame():
        assert arena.stats()["marks"] == 1
    assert arena.stats()["live_segments"] == 1 and arena.stats()["marks"] == 0
    assert bytes(views[0]) == bytes(8)


def test_the_depth_limit_reached_by_frames_left_out_of_order_says_so(arena):
    # Frames left before a frame entered after them are kept too: the error named exports that
    # did not exist ("held at depth 0").
    inner_frames = []
    for _ in range(8192):
        outer, inner = arena.frame(), arena.frame()
        outer.__enter__()
        inner.__enter__()
        with pytest.raises(ValueError, match="still open"):
            outer.__exit__(None, None, None)
        inner_frames.append(inner)
    with pytest.raises(MemoryError) as caught:
        arena.frame().__enter__()
    assert "8192 of them are frames whose exit was refused (left out of order" in str(caught.value)
    assert "export" not in str(caught.value)
    for inner in reversed(inner_frames):  # each exit lets the one abandoned under it go
        inner.__exit__(None, None, None)
    assert arena.stats()["marks"] == 0


def test_a_rewind_to_an_earlier_mark_uses_up_later_marks(arena):
    outer = arena.mark()
    inner = arena.mark()
    carve(arena, 2, 1)
    innermost = arena.mark()
    arena.rewind(outer)
    assert not outer.valid and not inner.valid and not innermost.valid
    for stale in (outer, inner, innermost):
        with pytest.raises(ValueError, match="used up"):
            arena.rewind(stale)
    fresh = arena.mark()
    assert fresh.valid and not inner.valid  # a new mark at the same place revives nothing


def test_reset_and_close_make_marks_stale(arena):
    mark = arena.mark()
    seg = arena.allocate(10)
    arena.reset()
    assert_dead(seg)
    with pytest.raises(ValueError, match="used up, by a reset or close of its arena"):
        arena.rewind(mark)
    assert arena.stats()["marks"] == 0
    other = SlicingArena()
    late = other.mark()
    other.close()
    with pytest.raises(ArenaClosedError):
        other.rewind(late)
    assert not late.valid


def test_marks_of_another_arena_and_other_objects_are_refused(arena):
    with SlicingArena() as other:
        foreign = other.mark()
        carve(arena, 2, 1)
        with pytest.raises(ValueError, match="another arena"):
            arena.rewind(foreign)
        assert other.stats()["marks"] == 1
    with pytest.raises(TypeError):
        arena.rewind(object())
    with pytest.raises(TypeError):
        Mark()
    with pytest.raises(TypeError):
        Frame()


def test_only_a_slicing_arena_has_marks():
    with arenalib.Arena() as a:
        assert not hasattr(a, "mark")


def test_a_live_export_of_a_segment_the_rewind_would_kill_refuses_it_changing_nothing(arena):
    keep = arena.allocate(32).fill(5)
    kept_view = memoryview(keep)  # carved before the mark: does not stand in the way
    mark = arena.mark()
    doomed = arena.allocate(32).fill(6)
    view = memoryview(doomed)
    with pytest.raises(BufferError):
        arena.rewind(mark)
    assert doomed.alive and bytes(view) == bytes([6]) * 32
    assert arena.stats()["live_segments"] == 2
    view.release()
    arena.rewind(mark)
    assert_dead(doomed)
    assert bytes(kept_view) == bytes([5]) * 32
    kept_view.release()


def allocate_exported_in_debug_mode(arena, size):
    return arena.allocate(size).fill(2)


def test_a_refused_rewind_names_in_debug_mode_the_exported_segments_it_would_kill(arena):
    before = arena.allocate(11)  # exported, but carved before the mark: not named
    outer = arena.mark()
    arenalib.set_debug(True)
    try:
        above = arena.allocate(12)  # above the outer mark, below the inner one
        inner = arena.mark()
        doomed = allocate_exported_in_debug_mode(arena, 13)
        first = arena.allocate(11)
    finally:
        arenalib.set_debug(False)
    views = [memoryview(seg) for seg in (before, doomed, above)]
    del first  # unexported: not named
    with pytest.raises(BufferError) as refused:
        arena.rewind(inner)
    message = str(refused.value)
    assert "a segment of 13 bytes" in message and "allocate_exported_in_debug_mode" in message
    assert "12 bytes" not in message and "11 bytes" not in message
    with pytest.raises(BufferError) as refused:
        arena.rewind(outer)
    assert "12 bytes" in str(refused.value) and "13 bytes" in str(refused.value)
    assert "11 bytes" not in str(refused.value)
    with pytest.raises(BufferError) as refused, arena.frame():
        frame_view = memoryview(allocate_exported_in_debug_mode(arena, 14))
    assert "set_debug(True) names" in str(refused.value)  # carved outside debug mode: unnamed
    for view in [*views, frame_view]:
        view.release()
    arena.rewind(outer)
    assert before.alive and not above.alive and not doomed.alive


def test_an_export_of_a_slice_counts_for_its_root(arena):
    mark = arena.mark()
    root = arena.allocate(100).fill(1)
    view = memoryview(root.slice(10, 20))
    with pytest.raises(BufferError):
        arena.rewind(mark)
    view.release()
    arena.rewind(mark)
    assert_dead(root)


def test_stats_and_max_bytes_follow_a_rewind():
    with SlicingArena(max_bytes=1000) as a:
        a.allocate(300)
        mark = a.mark()
        a.allocate(700)
        with pytest.raises(MemoryError):
            a.allocate(1)
        stats = a.stats()
        assert (stats["live_bytes"], stats["live_segments"], stats["marks"]) == (1000, 2, 1)
        a.rewind(mark)
        stats = a.stats()
        assert (stats["live_bytes"], stats["live_segments"]) == (300, 1)
        assert stats["peak_bytes"] == 1000
        assert stats["allocated_total"] == 1000
        a.allocate(700)  # max_bytes counts what is live
        assert a.stats()["allocated_total"] == 1700


def test_purge_keeps_the_chunks_open_marks_name(arena):
    arena.allocate(100)
    outer = arena.mark()
    mark = arena.mark()
    big = [arena.allocate(60_000) for _ in range(5)]
    arena.rewind(mark)
    arena.purge()
    seg = arena.allocate(64).fill(3)
    arena.rewind(outer)
    assert_dead(seg)
    assert all(not s.alive for s in big)
    assert arena.allocate(64).fill(4).tobytes() == bytes([4]) * 64


def test_frames_reuse_their_chunks_whatever_the_sizes(arena):
    # Small carves and requests larger than a chunk (a chunk of their own) in every frame: the
    # chunks carved after the mark are reused by the next frames, never added to for good.
    for i in range(300):
        with arena.frame() as f:
            for size in (100, 70_000, 3000, 200_000 if i % 7 == 0 else 10, 50_000):
                f.allocate(size, zero=False).fill(i % 256)
        if i == 20:
            held = arena.stats()["chunk_bytes"]
    assert arena.stats()["chunk_bytes"] <= held


def test_process_wide_operations_leave_open_marks_intact(arena):
    keep = arena.allocate(100).fill(1)
    mark = arena.mark()
    inner = [arena.allocate(5000).fill(2) for _ in range(20)]
    arenalib.trim()
    arena.purge()
    arenalib.set_retention(arenalib.get_retention())
    assert all(s.tobytes() == bytes([2]) * 5000 for s in inner)
    arena.rewind(mark)
    assert not any(s.alive for s in inner)
    assert keep.tobytes() == bytes([1]) * 100


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_marks_in_a_forked_child(arena):
    mark = arena.mark()
    seg = arena.allocate(8).fill(1)
    pid = os.fork()
    if pid == 0:  # the child: its copy of the arena, marks and all
        try:
            arena.rewind(mark)
            fresh = arena.allocate(8).fill(2)
            os._exit(0 if not seg.alive and fresh.tobytes() == bytes([2]) * 8 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert seg.tobytes() == bytes([1]) * 8  # the parent's are its own
    arena.rewind(mark)
    assert_dead(seg)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_threads_frame_arena_closes_in_a_forked_child_where_the_thread_is_gone():
    """In a fork's child only the forking thread runs: the interpreter clears the other threads'
    states there, and each one's frame arena closes then (its segments dead, not another thread's),
    quietly, as at the thread's end."""
    from support import assert_ok, run_python

    result = run_python("""
        import os, threading
        import arenalib
        handed, ready, done = [], threading.Event(), threading.Event()

        def worker():
            handed.append(arenalib.frame_arena().allocate(64).fill(7))
            ready.set()
            done.wait()

        t = threading.Thread(target=worker)
        t.start()
        ready.wait()
        pid = os.fork()
        if pid == 0:
            import gc
            seg = handed[0]
            try:
                seg.fill(1)
                os._exit(3)
            except arenalib.ArenaClosedError:
                pass
            except BaseException:
                os._exit(4)
            gc.collect()
            os._exit(0 if arenalib.live_objects()["closing_arenas"] == 0 else 5)
        _, status = os.waitpid(pid, 0)
        done.set()
        t.join()
        print("child", os.waitstatus_to_exitcode(status), handed[0].alive)
    """, options=("-W", "error::ResourceWarning"))
    assert assert_ok(result).split() == ["child", "0", "False"], result
    assert "ResourceWarning" not in result.stderr, result.stderr


def test_tracemalloc_sees_rewound_blocks_freed(arena):
    tracemalloc.start()
    try:
        arena.allocate(1000)  # before the mark: stays traced
        mark = arena.mark()
        segs = carve(arena, 10, 1, size=5000)
        domain = tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)

        def traced():
            snapshot = tracemalloc.take_snapshot().filter_traces([domain])
            return sum(s.size for s in snapshot.statistics("filename"))

        assert traced() == 1000 + 10 * 5000
        arena.rewind(mark)
        assert traced() == 1000
        del segs
        with arena.frame() as f:
            f.allocate(777)
            assert traced() == 1777
        assert traced() == 1000
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("push", ["mark", "frame"])
def test_tracemalloc_sees_the_blocks_of_abandoned_frames_a_push_lets_go_freed(arena, push):
    tracemalloc.start()
    try:
        domain = tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)

        def traced():
            return sum(t.size for t in tracemalloc.take_snapshot().filter_traces([domain]).traces)

        frame = arena.frame()
        frame.__enter__()
        seg = frame.allocate(100_000)
        view = memoryview(seg)
        with pytest.raises(BufferError):
            frame.__exit__(None, None, None)  # refused: the frame is abandoned, its segment alive
        assert traced() == 100_000
        view.release()
        if push == "mark":
            arena.mark()  # lets the abandoned frame go
        else:
            arena.frame().__enter__()
        assert not seg.alive and arena.stats()["live_bytes"] == 0
        assert traced() == 0
    finally:
        tracemalloc.stop()


# -- frames ------------------------------------------------------------------------------------------

def test_a_frames_repr_says_where_it_stands(arena):
    frame = arena.frame()
    assert repr(frame) == f"<arenalib.Frame of SlicingArena {id(arena):#x}, not entered>"
    with frame:
        with arena.frame() as inner:
            assert repr(inner) == f"<arenalib.Frame at depth 2 of SlicingArena {id(arena):#x}, open>"
    assert repr(inner).endswith(", left>") and repr(frame).startswith("<arenalib.Frame at depth 1 ")
    assert repr(Frame.__new__(Frame)) == "<arenalib.Frame of no arena>"


def test_a_refused_exit_is_noted_on_the_blocks_own_exception(arena):
    """As a file's or Segment's __exit__: the block's exception propagates, the refusal noted on it."""
    with pytest.raises(KeyError) as info:
        with arena.frame() as f:
            view = memoryview(f.allocate(8).fill(1))
            raise KeyError("the block's own")
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1 and "leaving the frame failed" in notes[0] and "BufferError" in notes[0]
    assert "nothing rewound" in notes[0]
    assert bytes(view) == b"\x01" * 8  # the refusal changed nothing
    view.release()
    arena.mark()  # the abandoned frame goes
    assert arena.stats()["marks"] == 1 and arena.stats()["live_segments"] == 0
    with pytest.raises(BufferError, match="nothing rewound"):  # and without an exception: raised
        with arena.frame() as f:
            view = memoryview(f.allocate(8))
    view.release()


def _frames_until_stopped(arena, stop, errors, closing):
    """Enter and leave empty frames of ``arena`` until ``stop``, or its close; errors to ``errors``."""
    while not stop.is_set():
        try:
            with arena.frame():
                pass
        except ArenaClosedError:
            if not closing:
                errors.append("closed")
            return  # closed: no frame can be entered (and the exit raised nothing)
        except Exception as exc:  # any error of the exit is the failure
            errors.append(repr(exc))


def test_an_exit_by_hand_with_no_exception_says_why_it_is_refused(arena):
    for exc in (None, "x", 1, ValueError):  # (only an exception instance takes a note)
        with pytest.raises(ValueError, match="this frame is not open"):
            arena.frame().__exit__(None, exc, None)


@pytest.mark.parametrize("what", ["reset", "close"])
def test_a_frame_left_as_another_thread_resets_or_closes_its_arena_says_nothing(what):
    """A reset or close that lands while a frame is being left made its segments dead already: the
    exit rewinds nothing and raises nothing, as when it lands before the exit (with the GIL off the
    two ran at once: the exit raised ValueError or ArenaClosedError)."""
    errors = []
    for _ in range(20 if what == "close" else 1):
        arena = SlicingArena()
        stop = threading.Event()
        thread = threading.Thread(target=_frames_until_stopped, args=(arena, stop, errors, what == "close"))
        thread.start()
        deadline = time.monotonic() + (0.5 if what == "reset" else 0.02)
        while time.monotonic() < deadline:
            arena.reset()
        if what == "close":
            arena.close()
        stop.set()
        thread.join()
        arena.close()
    assert errors == []


def test_frames_nest_and_a_thousand_push_and_pop(arena):
    frames = []
    segs = []
    for depth in range(1000):
        frame = arena.frame()
        frame.__enter__()
        frames.append(frame)
        segs.append(frame.allocate(8).fill(depth % 256))
    assert arena.stats()["marks"] == 1000
    for depth in reversed(range(1000)):
        assert segs[depth].tobytes() == bytes([depth % 256]) * 8
        frames[depth].__exit__(None, None, None)
        assert_dead(segs[depth])
        if depth:
            assert segs[depth - 1].alive
    assert arena.stats()["marks"] == 0


def test_frames_left_out_of_order_are_refused_and_never_rewind_wrongly(arena):
    # As two asyncio tasks on one thread do: A enters, B enters, A leaves first.
    a, b = arena.frame(), arena.frame()
    a.__enter__()
    seg_a = a.allocate(32).fill(1)
    b.__enter__()
    seg_b = b.allocate(32).fill(2)
    with pytest.raises(ValueError, match="frame entered after"):
        a.__exit__(None, None, None)
    # Nothing was rewound: both frames' segments are alive with their bytes.
    assert seg_a.tobytes() == bytes([1]) * 32 and seg_b.tobytes() == bytes([2]) * 32
    with pytest.raises(ValueError, match="not open"):
        a.allocate(8)  # A's exit was refused, not undone: it is left, and abandoned
    b.__exit__(None, None, None)  # B's exit takes A with it: A was left already
    assert_dead(seg_b)
    assert_dead(seg_a)
    assert arena.stats()["marks"] == 0
    with pytest.raises(ValueError, match="not open"):
        a.__exit__(None, None, None)
    kept = arena.allocate(16).fill(3)  # carved with no frame open: no frame's exit or mark takes it
    with arena.frame():
        assert arena.stats()["marks"] == 1
    assert kept.tobytes() == bytes([3]) * 16


def test_a_frame_left_out_of_order_under_an_export_goes_with_the_next_mark_after_the_release(arena):
    """A frame whose exit was refused for a live export stays until the export goes (its segments
    with it); the next mark with nothing open above it lets it go."""
    frame = arena.frame()
    frame.__enter__()
    view = memoryview(frame.allocate(32).fill(1))
    with pytest.raises(BufferError):
        frame.__exit__(None, None, None)
    assert arena.stats()["marks"] == 1 and view[0] == 1
    view.release()
    with arena.frame():  # nothing open above the abandoned frame, nothing of it exported: it goes
        assert arena.stats()["marks"] == 1
    assert arena.stats()["marks"] == 0


def test_frame_methods_take_every_call_shape(arena):
    # allocate(size[, zero=]) and __exit__(t, v, tb) skip Cython's argument parsing (src/entries.h);
    # every other call shape, and every error, is Cython's as before.
    frame = arena.frame()
    frame.__enter__()
    assert frame.allocate(3).tobytes() == bytes(3)
    assert len(frame.allocate(5, zero=False)) == 5
    assert len(frame.allocate(size=6, zero=True)) == 6
    assert frame.allocate(7, align=256).address % 256 == 0
    assert frame.allocate(8, zero=0, align=None).tobytes() != b"x"
    zero = "".join(["ze", "ro"])  # a keyword name that is not the interned "zero"
    assert len(frame.allocate(9, **{zero: False})) == 9
    with pytest.raises(TypeError, match="zerox"):
        frame.allocate(10, zerox=False)
    with pytest.raises(TypeError, match="zero"):
        frame.allocate(10, zero="no")
    with pytest.raises(TypeError):
        frame.allocate(10, False)
    with pytest.raises(TypeError):
        frame.allocate()
    with pytest.raises(TypeError):
        frame.__exit__(None, None)
    with pytest.raises(TypeError):
        frame.__exit__(None, None, None, None)
    assert frame.__exit__(None, None, None) is False
    with pytest.raises(ValueError, match="not open"):
        frame.__exit__(None, None, None)
    with pytest.raises(ValueError, match="not open"):
        frame.allocate(1)
    assert arena.stats()["marks"] == 0


def test_only_the_innermost_frame_allocates(arena):
    with arena.frame() as outer:
        with arena.frame() as inner:
            with pytest.raises(ValueError, match="not the innermost"):
                outer.allocate(8)
            inner.allocate(8)
        outer.allocate(8)


def test_a_frame_under_a_plain_mark_does_not_allocate(arena):
    """A segment of frame f carved while a mark made after f is open would land in the mark's level
    and die at its rewind with f still open: refused, as under a nested frame."""
    with arena.frame() as f:
        kept = f.allocate(8).fill(1)
        m = arena.mark()
        with pytest.raises(ValueError, match="not the innermost"):
            f.allocate(8)
        in_mark = arena.allocate(8).fill(2)  # the arena's own allocate carves under the mark
        arena.rewind(m)
        assert_dead(in_mark)
        assert bytes(kept) == b"\x01" * 8
        assert bytes(f.allocate(8).fill(3)) == b"\x03" * 8  # innermost again


@pytest.mark.parametrize("when", ["before", "in __index__"])
def test_a_frame_of_a_closed_arena_allocates_nothing_and_says_closed(when):
    """Frame.allocate() once its arena is closed (before the call, or by the size's __index__ in
    it) raises ArenaClosedError, as every use after close, not the ValueError of a frame that is
    not the innermost (helper 52); a reset there is a frame left: ValueError, as before."""
    class ClosingSize:
        def __index__(self):
            arena.close()
            return 8

    arena = SlicingArena()
    frame = arena.frame()
    frame.__enter__()
    if when == "before":
        arena.close()
    with pytest.raises(ArenaClosedError):
        frame.allocate(8 if when == "before" else ClosingSize())
    with pytest.raises(ArenaClosedError):
        frame.allocate(8, zero=False)  # (the C entry of the common forms: src/entries.h)
    with pytest.raises(ArenaClosedError):
        frame.allocate(8, zero=False, align=16)


def test_a_frame_of_an_arena_reset_under_it_is_a_frame_left(arena):
    with arena.frame() as frame:
        seg = frame.allocate(8)
        arena.reset()
        assert_dead(seg)
        with pytest.raises(ValueError, match="reset since it was entered"):
            frame.allocate(8)


def test_an_abandoned_frame_goes_with_the_frame_entered_after_it(arena):
    with arena.frame() as outer:
        a, b = arena.frame(), arena.frame()
        a.__enter__()
        seg_a = a.allocate(8).fill(1)
        b.__enter__()
        with pytest.raises(ValueError):
            a.__exit__(None, None, None)
        b.__exit__(None, None, None)  # A, left already, goes with the frame entered after it
        assert_dead(seg_a)
        assert arena.stats()["marks"] == 1  # the outer frame's
        assert outer.arena is arena
    assert arena.stats()["marks"] == 0


def test_a_rewind_past_an_open_frame_is_refused(arena):
    mark = arena.mark()
    seg = arena.allocate(8).fill(1)
    with arena.frame():
        inner = arena.allocate(8).fill(2)
        with pytest.raises(ValueError, match="frame entered after"):
            arena.rewind(mark)
        assert seg.alive and inner.alive
        inner_mark = arena.mark()
        arena.allocate(8)
        arena.rewind(inner_mark)  # a mark inside the frame: fine
    arena.rewind(mark)
    assert_dead(seg)


def test_a_frame_with_a_live_export_at_exit_raises_buffer_error_and_keeps_it(arena):
    frame = arena.frame()
    frame.__enter__()
    seg = frame.allocate(16).fill(3)
    view = memoryview(seg)
    with pytest.raises(BufferError):
        frame.__exit__(None, None, None)
    assert bytes(view) == bytes([3]) * 16
    assert seg.alive and arena.stats()["marks"] == 1
    with arena.frame():
        assert seg.alive  # exported still: the abandoned frame stays below this one
    view.release()
    with arena.frame():
        pass  # no export holds it now: the next mark lets it go
    assert_dead(seg)
    assert arena.stats()["marks"] == 0


def test_a_reset_or_close_inside_a_frame_leaves_nothing_to_rewind(arena):
    with arena.frame() as f:
        seg = f.allocate(8)
        arena.reset()
        assert_dead(seg)
    assert arena.stats()["marks"] == 0
    other = SlicingArena()
    with other.frame() as f:
        other.close()
    with pytest.raises(ValueError, match="not open"):
        f.allocate(8)
    with pytest.raises(ArenaClosedError):
        other.frame().__enter__()
    frame = arena.frame()
    with frame:
        pass
    with pytest.raises(ValueError, match="entered once"):
        frame.__enter__()


def test_an_export_of_a_framed_segment_outlives_a_deferred_close():
    # The export's release counts on its segment's level of marks: the close keeps the stack for it
    # (it segfaulted here, the stack freed at the close).
    a = SlicingArena()
    outer = a.mark()
    with a.frame() as f:
        view = memoryview(f.allocate(8).fill(5))
        inner = a.mark()
        pinned = memoryview(a.allocate(16).fill(6))
        a.close(deferred=True)
        assert a.stats()["marks"] == 0 and not outer.valid and not inner.valid
        assert bytes(view) == bytes([5]) * 8 and bytes(pinned) == bytes([6]) * 16
    view.release()
    pinned.release()
    assert a.stats()["held_by_exports"] == 0
    with SlicingArena() as b:
        b.mark()
        kept = memoryview(b.allocate(4).fill(7))  # as a NumPy array returned from the block
    assert bytes(kept) == bytes([7]) * 4
    kept.release()
    del a, b, f
    gc.collect()


def test_reentrant_index_that_rewinds_mid_allocate(arena):
    marks = [arena.mark()]
    doomed = carve(arena, 2, 1)

    class Size:
        def __index__(self):
            arena.rewind(marks[-1])
            marks[-1] = arena.mark()
            return 64

    with arena.frame() as f:
        with pytest.raises(ValueError, match="frame entered after"):
            f.allocate(Size())
    assert all(s.alive for s in doomed)
    seg = arena.allocate(Size()).fill(5)  # rewound during conversion, carved after: alive
    assert seg.tobytes() == bytes([5]) * 64
    assert not any(s.alive for s in doomed)
    arena.rewind(marks[-1])
    assert_dead(seg)


def test_finalizers_that_rewind_during_allocation(arena):
    state = {"mark": arena.mark()}

    class Rewinder:
        def __del__(self):
            if not arena.closed:  # (a cycle the test left may be collected later)
                arena.rewind(state["mark"])
                state["mark"] = arena.mark()

    old = gc.get_threshold()
    gc.set_threshold(1)
    try:
        live = []
        for i in range(300):
            cycle = Rewinder()
            cycle.self = cycle
            del cycle
            try:
                live.append((arena.allocate(32).fill(i % 256), i % 256))
            except ArenaClosedError:
                pass  # rewound between its allocate and its fill (a collection ran there)
            kept = []
            for seg, byte in live:  # any collection, even one these reads start, may rewind
                try:
                    assert seg.tobytes() == bytes([byte]) * 32
                    kept.append((seg, byte))
                except ArenaClosedError:
                    assert not seg.alive
            live = kept
    finally:
        gc.set_threshold(*old)
        gc.collect()


# -- threads -----------------------------------------------------------------------------------------

def test_a_rewind_kills_what_any_thread_carved_after_the_mark(arena):
    # One stack of marks per arena: a rewind is a reset of what was carved since its mark.
    before = arena.allocate(8).fill(1)
    mark = arena.mark()
    got = []
    t = threading.Thread(target=lambda: got.append(arena.allocate(8).fill(2)))
    t.start()
    t.join()
    assert got[0].tobytes() == bytes([2]) * 8
    arena.rewind(mark)
    assert_dead(got[0])
    assert before.tobytes() == bytes([1]) * 8
    other_mark = []
    t = threading.Thread(target=lambda: other_mark.append(arena.mark()))
    t.start()
    t.join()
    arena.rewind(other_mark[0])  # a mark is the arena's, whichever thread made it


def test_frames_of_one_thread_beside_another_threads_carves():
    # One thread pushes and pops frames on a shared SlicingArena while another carves from it: what
    # the other carves inside a frame dies with it, and no segment ever holds another's bytes.
    errors, carved = [], []
    stop = threading.Event()
    with SlicingArena(chunk_size=1 << 16) as arena:

        def framer():
            try:
                for i in range(2000):
                    with arena.frame() as f:
                        segs = [f.allocate(64, zero=False).fill(i % 200) for _ in range(4)]
                        for s in segs:
                            assert s.tobytes() == bytes([i % 200]) * 64
            except BaseException as exc:
                errors.append(exc)
            finally:
                stop.set()

        def carver():
            try:
                while not stop.is_set():
                    seg = arena.allocate(32, zero=False)
                    try:
                        carved.append(seg.fill(250))
                    except ArenaClosedError:
                        assert not seg.alive  # carved in the other's frame, which ended since
                    if len(carved) > 1000:
                        del carved[:500]
                for s in carved:  # those carved inside the other's frames died with them
                    try:
                        assert s.tobytes() == bytes([250]) * 32
                    except ArenaClosedError:
                        pass
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=framer), threading.Thread(target=carver)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert arena.stats()["marks"] == 0
        carved.clear()


def test_a_carve_beside_another_threads_marks_dies_with_the_mark_it_was_carved_under():
    # A carve read the version of the stack of marks, then its depth: a mark published the version
    # first, so a carve could pair the new version with the old depth, take the stamp of the level
    # below the new mark and pass its check after the carve.  It outlived that mark's rewind, and the
    # next carve overwrote it (3.13t: 3 runs of 3 within 2,300 carves; helper 62).
    stop = threading.Event()
    errors = []
    with SlicingArena(chunk_size=4096) as arena:

        def marker():
            try:
                while not stop.is_set():
                    mark = arena.mark()
                    arena.allocate(16, zero=False).fill(0xCC)
                    arena.rewind(mark)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=marker)
        t.start()
        try:
            found = overlapping_live_carves(arena, 2.0)
        finally:
            stop.set()
            t.join()
        assert found is None and not errors


def test_a_mark_that_lets_an_abandoned_frame_go_waits_for_other_threads_reads():
    # A push lets abandoned frames go (their segments die, as at a rewind).  With the GIL off it did
    # not wait for other threads' accesses as a rewind does: a read in flight returned the bytes of
    # the marking thread's next carve (3.13t: 2-5 reads in 100,000 trials; helper 63).
    arena = SlicingArena()
    job, done, stop = [0], [0], threading.Event()
    errors = []

    def marker():
        seen = 0
        try:
            while not stop.is_set():
                if job[0] == seen:
                    continue
                seen = job[0]
                mark = arena.mark()  # lets the abandoned frame go
                carved = arena.allocate(64, zero=False)
                for _ in range(10):
                    carved.fill(0x5A)
                arena.rewind(mark)
                done[0] = seen
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=marker)
    t.start()
    wrong = []
    try:
        deadline = time.monotonic() + 2.0
        trial = 0
        while time.monotonic() < deadline and not wrong and not errors:
            trial += 1
            frame = arena.frame()
            frame.__enter__()
            seg = frame.allocate(64, zero=False).fill(0x11)
            view = memoryview(seg)
            with pytest.raises(BufferError):
                frame.__exit__(None, None, None)  # refused: the frame is abandoned
            view.release()
            job[0] = trial
            while done[0] != trial and not errors:
                try:
                    got = seg.tobytes()
                except ArenaClosedError:
                    continue
                if got != b"\x11" * 64:
                    wrong.append(got)
                    break
    finally:
        stop.set()
        t.join()
        arena.close()
    assert not wrong and not errors


def test_threads_frames_on_their_own_thread_arenas():
    errors = []

    def work(byte):
        try:
            for _ in range(500):
                with arenalib.frame() as f:
                    segs = [f.allocate(100, zero=False).fill(byte) for _ in range(5)]
                    for s in segs:
                        assert s.tobytes() == bytes([byte]) * 100
                for s in segs:
                    assert not s.alive
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# -- the thread's frame arena -------------------------------------------------------------------------

def test_frame_arena_is_the_threads_own_and_confined(main_frame_arena_closed):
    arena = arenalib.frame_arena()
    assert arenalib.frame_arena() is arena
    assert arena.chunk_size == 64 * 1024
    with pytest.raises(ValueError, match="chunk_size"):
        arenalib.frame_arena(chunk_size=4096)
    with arenalib.frame() as f:
        seg = f.allocate(64, zero=False).fill(1)
        assert f.arena is arena
        result = []

        def other():
            try:
                seg.tobytes()
            except WrongThreadError:
                result.append("refused")
            result.append(arenalib.frame_arena() is not arena)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert result == ["refused", True]
    assert_dead(seg)


def test_arenalib_frame_is_a_plain_builtin_that_takes_no_arguments(main_frame_arena_closed):
    # Start-up puts a METH_FASTCALL twin in place of Cython's frame() (src/entries.h); it must
    # still be the documented, picklable frame() with the errors of a function of no arguments.
    import inspect
    import pickle

    frame = arenalib.frame
    assert frame is arenalib._arena.frame
    assert frame.__name__ == "frame" and frame.__module__ == "arenalib._arena"
    assert "thread's frame arena" in frame.__doc__
    assert str(inspect.signature(frame)) == "()"
    assert pickle.loads(pickle.dumps(frame)) is frame
    with pytest.raises(TypeError, match=r"^frame\(\) takes no arguments \(1 given\)$"):
        frame(1)
    with pytest.raises(TypeError, match=r"takes no keyword arguments"):
        frame(chunk_size=4096)
    with frame() as f:
        assert isinstance(f, Frame) and f.arena is arenalib.frame_arena()
        assert f.allocate(5, zero=False).fill(7).tobytes() == b"\x07" * 5
    assert arenalib.frame_arena().stats()["marks"] == 0


def test_slicing_arena_frame_is_a_plain_method_that_takes_no_arguments():
    # Start-up puts a METH_FASTCALL twin in place of Cython's SlicingArena.frame (src/entries.h):
    # the documented method still, bound or not, checking its self and refusing arguments.
    import inspect

    method = SlicingArena.__dict__["frame"]
    assert method.__name__ == "frame" and method.__objclass__ is SlicingArena
    assert "marks on entry" in method.__doc__
    assert str(inspect.signature(SlicingArena.frame)) == "(self, /)"
    with SlicingArena() as a:
        assert str(inspect.signature(a.frame)) == "()"
        with pytest.raises(TypeError, match=r"^frame\(\) takes no arguments \(1 given\)$"):
            a.frame(1)
        with pytest.raises(TypeError, match=r"takes no keyword arguments"):
            a.frame(depth=1)
        with ConfinedArena() as other, pytest.raises(TypeError, match=r"doesn't apply to"):
            SlicingArena.frame(other)
        with pytest.raises(TypeError, match=r"needs an argument"):
            SlicingArena.frame()
        for frame in (SlicingArena.frame(a), a.frame()):
            with frame as f:
                assert isinstance(f, Frame) and f.arena is a
                seg = f.allocate(5, zero=False).fill(7)
                assert seg.tobytes() == b"\x07" * 5
            assert_dead(seg)
            assert a.stats()["marks"] == 0


def test_a_threads_frame_arena_closes_when_the_thread_ends():
    got = {}

    def work():
        arenalib.frame_arena(chunk_size=8192)
        got["arena"] = arenalib.frame_arena()
        with arenalib.frame() as f:
            got["seg"] = f.allocate(10)
        got["kept"] = arenalib.frame().arena.allocate(10)  # outside any frame: lives until the end

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert got["arena"].chunk_size == 8192
    assert got["arena"].closed
    assert not got["kept"].alive


def test_a_frame_arena_whose_holder_dies_on_another_thread_stays_its_owners():
    # The holder of a thread's frame arena (in the thread's state dict) dropped on another thread
    # while the owner still runs: the other thread must not close the arena, whose owner's accesses
    # count no export (Segment._pin).  Closing it there let a free-threaded owner write into memory
    # another arena had been given (helper 55).  In a fork's child and at the interpreter's exit
    # the owner no longer runs, and the holder's end still closes it (tests above and below).
    import ctypes

    # A borrowed reference: a py_object restype would make ctypes drop one reference of the dict
    # per call (it takes the result for a new one), freeing the thread's dict under its state.
    thread_dict = ctypes.pythonapi.PyThreadState_GetDict
    thread_dict.restype, thread_dict.argtypes = ctypes.c_void_p, []
    box, handed, dropped, checked = {}, threading.Event(), threading.Event(), threading.Event()

    def owner():
        seg = arenalib.frame_arena().allocate(1000, zero=False).fill(0x5A)
        box["arena"] = seg.arena
        holder = ctypes.cast(thread_dict(), ctypes.py_object).value.pop("arenalib._frames")
        # The holder gone from the dict: a new holder and arena (on a GIL build, the last holder
        # the module remembers while it lives, its arena open: the same one); closed by the end.
        box["second"] = arenalib.frame_arena()
        box["holder"] = holder
        handed.wait(10)
        del box["holder"], holder  # the main thread's reference is now the last one
        dropped.set()
        checked.wait(10)
        try:
            box["after"] = seg.fill(0x33).tobytes()
        finally:
            box["arena"].close()  # (its owner's close: no ResourceWarning)

    t = threading.Thread(target=owner)
    t.start()
    try:
        while "holder" not in box:
            time.sleep(0.001)
        holder = box["holder"]
        handed.set()
        assert dropped.wait(10)
        assert sys.getrefcount(holder) == 2  # (this name and the call's): the del below ends it here
        del holder
        closed_by_the_drop = box["arena"].closed
    finally:
        checked.set()
        t.join()
    assert not closed_by_the_drop
    assert box["after"] == b"\x33" * 1000
    assert box["arena"].closed
    assert box["second"].closed


def test_threads_one_after_another_each_get_their_own_frame_arena():
    # Each thread keeps an export of its frame arena alive past its end (the arena stays open), and
    # the next thread's state is often made where the last one's was: each must still get a new
    # arena of its own, never the previous thread's.
    kept, arenas, errors = [], [], []

    def work():
        try:
            arena = arenalib.frame_arena()
            with arenalib.frame() as f:
                assert f.arena is arena and all(arena is not a for a in arenas)
                f.allocate(64, zero=False).fill(1)
            kept.append(memoryview(arena.allocate(16)))
            arenas.append(arena)
        except BaseException as exc:
            errors.append(exc)

    for _ in range(20):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert not errors
    assert len(arenas) == 20
    # Each closed with its thread, deferred: the export holds the memory, no ResourceWarning.
    assert all(a.closed and a.stats()["held_by_exports"] == 1 for a in arenas)
    for view in kept:
        assert view.tobytes() == bytes(16)
        view.release()
    assert all(a.stats()["held_by_exports"] == 0 for a in arenas)


def test_a_closed_frame_arena_is_made_anew(main_frame_arena_closed):
    first = arenalib.frame_arena()
    first.close()
    with arenalib.frame() as f:
        assert f.arena is not first and not f.arena.closed


def test_frame_arenas_chunk_size_is_read_before_the_arena_is_looked_up(main_frame_arena_closed):
    """Its __index__ may close the thread's frame arena, or make it: the call still answers with
    the thread's one open frame arena (it returned the closed one, or closed the one the
    __index__ made under its segments)."""
    first = arenalib.frame_arena()

    class Closes:
        def __index__(self):
            first.close()
            return 1 << 16

    got = arenalib.frame_arena(chunk_size=Closes())
    assert got is not first and not got.closed and got is arenalib.frame_arena()
    results = []

    def in_a_new_thread():
        made = []

        class Makes:
            def __index__(self):
                made.append(arenalib.frame_arena())
                made.append(made[0].allocate(8).fill(7))
                return 8192

        with pytest.raises(ValueError, match="chunk_size=65536 already"):
            arenalib.frame_arena(chunk_size=Makes())
        results.append((arenalib.frame_arena() is made[0], made[1].alive, bytes(made[1])))
        made[0].close()
        made.clear()

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join()
    assert results == [(True, True, b"\x07" * 8)]


# -- the C API ---------------------------------------------------------------------------------------

def test_c_mark_carve_rewind_reuses_one_address(consumer, arena):
    arena.allocate(10)
    assert consumer.frame_loop(arena, 10_000, 64, 3) == 1
    assert arena.stats()["live_segments"] == 1
    assert arena.stats()["marks"] == 0


def test_c_rewind_kills_python_segments_and_refuses_stale_marks(consumer, arena):
    mark = consumer.mark(arena)
    assert isinstance(mark, bytes)
    seg = arena.allocate(32).fill(1)
    assert consumer.rewind(arena, mark) == 0
    assert_dead(seg)
    arena.reset()
    assert consumer.rewind(arena, mark) == 9  # ARENA_ESTALEMARK
    with arenalib.Arena() as shared:
        assert consumer.mark(shared) == 8  # ARENA_EUNSUPPORTED
    forged = bytearray(consumer.mark(arena))
    forged[16] ^= 0xFF  # its serial
    assert consumer.rewind(arena, bytes(forged)) == 9
    inner = consumer.mark(arena)
    for field in range(4):  # arena, generation, serial, depth: each forged alone is refused
        forged = bytearray(inner)
        forged[field * 8] ^= 1
        assert consumer.rewind(arena, bytes(forged)) == 9
    assert arena.stats()["marks"] == 2
    assert consumer.rewind(arena, inner) == 0


def test_c_rewind_refuses_to_kill_an_exported_segment(consumer, arena):
    mark = consumer.mark(arena)
    view = memoryview(arena.allocate(8).fill(4))
    assert consumer.rewind(arena, mark) == 6  # ARENA_EEXPORTED
    assert bytes(view) == bytes([4]) * 8
    view.release()
    assert consumer.rewind(arena, mark) == 0


def test_python_rewind_after_c_marks(consumer, arena):
    outer = arena.mark()
    seg = arena.allocate(8)
    inner = consumer.mark(arena)
    assert arena.stats()["marks"] == 2
    arena.rewind(outer)
    assert_dead(seg)
    assert arena.stats()["marks"] == 0
    assert consumer.rewind(arena, inner) == 9


# -- a state machine against a model ------------------------------------------------------------------

SIZES = st.one_of(st.integers(0, 200), st.sampled_from([1000, 4096, 5000, 70_000]))
PICK = st.integers(0, 2**16)


class FramesMachine(RuleBasedStateMachine):
    """Carves, marks, rewinds, nested and interleaved frames, exports and resets of one SlicingArena
    against a model: the live segments in carve order; a mark is its place in that order, valid until
    a rewind to it or to an earlier one, or a reset; a rewind kills the segments after its mark."""

    def __init__(self):
        super().__init__()
        self.arena = SlicingArena(chunk_size=4096)
        self.entries = []      # [seg, byte, size, alive]
        self.live = []         # the live entries, in carve order
        self.marks = []        # [mark, seq, pos, valid]
        self.frames = []       # [frame, seq, pos, state ("open", "abandoned", "gone"), generation]
        self.views = []        # (memoryview, entry)
        self.seq = 0
        self.generation = 0

    def teardown(self):
        for view, _ in self.views:
            view.release()
        self.arena.close()

    def _next(self):
        self.seq += 1
        return self.seq

    def _in_stack(self, f):
        return f[4] == self.generation and f[3] in ("open", "abandoned")

    def _exported(self, pos):
        # By identity: `in` would compare entries by value, and segments by content.
        after = {id(entry) for entry in self.live[pos:]}
        return any(id(entry) in after for _, entry in self.views)

    def _kill_after(self, pos, seq):
        for entry in self.live[pos:]:
            entry[3] = False
        del self.live[pos:]
        for m in self.marks:
            if m[1] > seq:
                m[3] = False
        for f in self.frames:
            if f[1] > seq and self._in_stack(f):
                f[3] = "gone"

    @rule(size=SIZES, byte=st.integers(0, 255), through=PICK)
    def carve(self, size, byte, through):
        open_frames = [f for f in self.frames if f[3] == "open" and f[4] == self.generation]
        if open_frames and through % 3 == 0:
            f = open_frames[through % len(open_frames)]
            # Innermost: no frame and no plain mark above it (a carve would land in that level).
            innermost = (not any(g[1] > f[1] and self._in_stack(g) for g in self.frames)
                         and not any(m[3] and m[1] > f[1] for m in self.marks))
            if not innermost:
                with pytest.raises(ValueError, match="not the innermost"):
                    f[0].allocate(size)
                return
            seg = f[0].allocate(size, zero=False)
        else:
            seg = self.arena.allocate(size, zero=False)
        seg.fill(byte)
        entry = [seg, byte, size, True]
        self.entries.append(entry)
        self.live.append(entry)

    def _let_abandoned_go(self):
        """A mark or frame entry, and a rewind or frame exit after its own, let go of abandoned
        frames nothing open lies above and no export holds."""
        while True:
            items = [(m[1], "mark", m) for m in self.marks if m[3]]
            items += [(f[1], "frame", f) for f in self.frames if self._in_stack(f)]
            if not items:
                return
            _, what, top = max(items, key=lambda item: item[0])
            if what != "frame" or top[3] != "abandoned" or self._exported(top[2]):
                return
            self._kill_after(top[2], top[1] - 1)

    @rule()
    def mark(self):
        self._let_abandoned_go()
        self.marks.append([self.arena.mark(), self._next(), len(self.live), True])

    @precondition(lambda self: self.marks)
    @rule(pick=PICK)
    def rewind(self, pick):
        m = self.marks[pick % len(self.marks)]
        mark, seq, pos, valid = m
        if not valid:
            with pytest.raises(ValueError, match="used up"):
                self.arena.rewind(mark)
            return
        if any(f[1] > seq and f[3] == "open" and f[4] == self.generation for f in self.frames):
            with pytest.raises(ValueError, match="frame entered after"):
                self.arena.rewind(mark)
        elif self._exported(pos):
            with pytest.raises(BufferError):
                self.arena.rewind(mark)
        else:
            self.arena.rewind(mark)
            self._kill_after(pos, seq - 1)  # the mark is used up too
            self._let_abandoned_go()  # frames left under it while it was open go with it

    @rule()
    def enter_frame(self):
        self._let_abandoned_go()
        frame = self.arena.frame()
        frame.__enter__()
        self.frames.append([frame, self._next(), len(self.live), "open", self.generation])

    @precondition(lambda self: any(f[3] == "open" for f in self.frames))
    @rule(pick=PICK)
    def exit_frame(self, pick):
        candidates = [f for f in self.frames if f[3] == "open"]
        f = candidates[pick % len(candidates)]
        frame, seq, pos, _, generation = f
        if generation != self.generation:
            frame.__exit__(None, None, None)  # a reset since made everything in it dead already
            f[3] = "gone"
        elif any(g[1] > seq and g[3] == "open" and g[4] == self.generation for g in self.frames):
            with pytest.raises(ValueError, match="frame entered after"):
                frame.__exit__(None, None, None)
            f[3] = "abandoned"
        elif self._exported(pos):
            with pytest.raises(BufferError):
                frame.__exit__(None, None, None)
            f[3] = "abandoned"
        else:
            frame.__exit__(None, None, None)
            self._kill_after(pos, seq - 1)  # its own mark goes too
            f[3] = "gone"
            self._let_abandoned_go()  # frames left under it while it was open go with it

    @precondition(lambda self: self.live)
    @rule(pick=PICK)
    def export(self, pick):
        entry = self.live[pick % len(self.live)]
        self.views.append((memoryview(entry[0]), entry))

    @precondition(lambda self: self.views)
    @rule(pick=PICK)
    def release(self, pick):
        view, _ = self.views.pop(pick % len(self.views))
        view.release()

    @rule()
    def reset(self):
        if self.views:
            with pytest.raises(BufferError):
                self.arena.reset()
            return
        self.arena.reset()
        for entry in self.live:
            entry[3] = False
        self.live.clear()
        for m in self.marks:
            m[3] = False
        self.generation += 1

    @invariant()
    def segments_match_the_model(self):
        spans = []
        for seg, byte, size, alive in self.entries:
            assert seg.alive == alive
            if alive:
                assert seg.tobytes() == bytes([byte]) * size
                if size:
                    spans.append((seg.address, seg.address + size))
            else:
                with pytest.raises(ArenaClosedError):
                    seg.tobytes()
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # none overlap
        stats = self.arena.stats()
        assert stats["live_segments"] == len(self.live)
        assert stats["live_bytes"] == sum(entry[2] for entry in self.live)
        for mark, _, _, valid in self.marks:
            assert mark.valid == valid

    @invariant()
    def views_hold_their_bytes(self):
        for view, entry in self.views:
            assert bytes(view) == bytes([entry[1]]) * entry[2]


TestFramesMachine = FramesMachine.TestCase


@pytest.mark.skipif(sys.version_info < (3, 12), reason="3.10 and 3.11 mark no thread state being cleared")
def test_a_finalizer_at_thread_end_gets_no_frame_arena_that_would_stay_open():
    # Clearing a thread's state clears its locals, whose finalizers may run arenalib.frame(): an arena
    # made then would never be closed (4,000 such threads and no arena could be opened).
    errors = []

    class Scratch:
        def __del__(self):
            try:
                with arenalib.frame() as f:
                    f.allocate(100)
            except RuntimeError as error:
                errors.append(error)

    local = threading.local()

    def worker():
        local.scratch = Scratch()

    before = arenalib.live_objects()["open_arenas"]
    for _ in range(20):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert arenalib.live_objects()["open_arenas"] == before
    assert len(errors) == 20 and "no thread state" in str(errors[0])
