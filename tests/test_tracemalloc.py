"""Memory handed out by arenalib, by arenas and by a BufferPool's region, is visible to tracemalloc, in
arenalib's own domain."""

import gc
import sys
import sysconfig
import tracemalloc

import pytest
from support import FREEABLE_KINDS, KINDS

import arenalib


@pytest.fixture
def tracing():
    tracemalloc.start(5)
    try:
        yield
    finally:
        tracemalloc.stop()


def arenalib_traces():
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)])
    return snapshot.traces


def allocate_here(arena, size):
    return arena.allocate(size)


@pytest.mark.parametrize("kind", KINDS)
def test_allocations_are_traced_with_the_callers_stack(tracing, kind):
    with kind() as arena:
        seg = allocate_here(arena, 123_457)
        traces = arenalib_traces()
        assert [t.size for t in traces] == [123_457]
        frames = {frame.filename for frame in traces[0].traceback}
        assert __file__ in frames
        assert seg.alive
    assert len(arenalib_traces()) == 0


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
def test_free_untracks(tracing, kind):
    with kind() as arena:
        keep = arena.allocate(1000)
        gone = arena.allocate(2000)
        gone.free()
        assert sorted(t.size for t in arenalib_traces()) == [1000]
        assert keep.alive


@pytest.mark.parametrize("kind", KINDS)
def test_reset_and_close_untrack_everything(tracing, kind):
    arena = kind()
    for size in (10, 20, 30):
        arena.allocate(size)
    assert sorted(t.size for t in arenalib_traces()) == [10, 20, 30]
    arena.reset()
    assert len(arenalib_traces()) == 0
    arena.allocate(40)
    assert [t.size for t in arenalib_traces()] == [40]
    arena.close()
    assert len(arenalib_traces()) == 0


def test_nothing_is_traced_when_tracemalloc_is_off():
    assert not tracemalloc.is_tracing()
    with arenalib.ConfinedArena() as arena:
        arena.allocate(100)
        tracemalloc.start()
        try:
            arena.allocate(200)
            # only what was allocated while tracing shows
            assert [t.size for t in arenalib_traces()] == [200]
        finally:
            tracemalloc.stop()


def test_region_is_traced_by_tracemalloc():
    domain = tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)
    tracemalloc.start()
    try:
        p = arenalib.BufferPool(1000, 4)
        traced = tracemalloc.take_snapshot().filter_traces([domain]).statistics("lineno")
        assert sum(s.size for s in traced) == p.nbytes
        assert any(s.traceback[0].filename == __file__ for s in traced)
        p.close()
        assert not tracemalloc.take_snapshot().filter_traces([domain]).traces
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                    reason="a free-threaded build's collector does not run at the allocation this needs")
def test_a_finalizer_that_resets_while_a_block_is_traced_leaves_a_dead_segment_not_an_error(tracing,
                                                                                          consumer):
    # Tracing a carve first untracks what rewinds killed, which makes objects: a GC there may run a
    # finalizer that resets the arena (untracking everything).  The carve's trace must see that.
    # (The rewind its sync has to catch up with is the C API's: Python's own sync as they go.)
    a = arenalib.SlicingArena()
    try:
        class Bomb:
            def __init__(self):
                self.me = self

            def __del__(self):
                if not a.closed:
                    a.reset()

        mark = consumer.mark(a)
        carved = [a.allocate(16) for _ in range(3)]  # traced with a frame stamp
        assert consumer.rewind(a, mark) == 0  # a rewind the traces have not seen
        del carved  # (their objects are kept for the next segments: no GC before the carve below)
        gc.collect()  # (an empty generation 0: the Bomb is not collected before the carve)
        Bomb()
        junk = [[] for _ in range(100)]  # generation 0 past the threshold below
        old = gc.get_threshold()
        gc.set_threshold(1)
        try:
            seg = a.allocate(16)
        finally:
            gc.set_threshold(*old)
        del junk
        with pytest.raises(arenalib.ArenaClosedError):
            seg.fill(0)  # carved before the finalizer's reset: dead
        assert not arenalib_traces()
    finally:
        gc.collect()  # (a Bomb the collector has not run yet goes here, not in a later test)
        a.close()


@pytest.mark.skipif(bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                    reason="a free-threaded build's collector does not run at the allocation this needs")
def test_a_finalizer_that_resets_and_carves_during_a_sync_keeps_the_new_blocks_trace(tracing):
    # mark() syncs the traces with the rewinds (here: an abandoned frame it lets go); the sync makes
    # objects, so a GC may reset the arena and carve a block at an address the sync found dead.
    # It untracked that live block (helper 60).
    a = arenalib.SlicingArena(chunk_size=4096)
    kept = []
    try:
        class Bomb:
            def __init__(self):
                self.me = self

            def __del__(self):
                if not kept:
                    a.reset()
                    kept.append(a.allocate(64))

        frame = a.frame()
        frame.__enter__()
        view = memoryview(frame.allocate(64))
        with pytest.raises(BufferError):
            frame.__exit__(None, None, None)  # abandoned, its block traced
        view.release()
        gc.collect()
        Bomb()
        old = gc.get_threshold()
        gc.set_threshold(1)
        try:
            a.mark()
        finally:
            gc.set_threshold(*old)
        assert kept and kept[0].alive
        assert [t.size for t in arenalib_traces()] == [64]
    finally:
        kept.clear()
        gc.collect()
        a.close()


@pytest.mark.skipif(bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                    reason="a free-threaded build's collector does not run at the allocation this needs")
def test_a_finalizer_that_rewinds_past_a_block_being_traced_leaves_no_trace_of_it(tracing):
    # The trace's sync of earlier rewinds makes objects: a GC there ran a finalizer that rewound past
    # the block being traced, whose own sync came before the block was in the table.  The dead block
    # was traced for good, and once a live one was carved at its address, a later sync untracked
    # that one (an attack, 12-05).  (A resize traces its new block through the same _trace.)
    def sizes():
        return sorted(t.size for t in arenalib_traces())

    a = arenalib.SlicingArena()
    try:
        mark = a.mark()
        first = a.allocate(100)  # under the mark: the next trace's sync has a table to walk

        class Bomb:
            def __init__(self):
                self.me = self

            def __del__(self):
                a.rewind(mark)

        gc.collect()
        old = gc.get_threshold()
        Bomb()
        gc.set_threshold(1)
        try:
            dead = a.allocate(200)
        finally:
            gc.set_threshold(*old)
        assert not first.alive and not dead.alive
        assert sizes() == []
        live = [a.allocate(100), a.allocate(250)]  # carved where the dead ones were, no mark open
        assert sizes() == [100, 250]
        inner = a.mark()
        a.allocate(10)
        a.rewind(inner)  # a sync that must not untrack the live blocks at the dead ones' addresses
        assert sizes() == [100, 250] and all(seg.alive for seg in live)
    finally:
        gc.collect()
        a.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_segment_of_no_bytes_has_an_address_and_a_trace_of_its_own(tracing, kind):
    # A SlicingArena carved 0 bytes at the cursor and left it there: the next carve got the same
    # address, and resizing either untracked the other's trace (traces are keyed by address).
    with kind() as arena:
        empty = arena.allocate(0)
        full = arena.allocate(100)
        shrunk = arena.allocate(30).resize(0)  # a SlicingArena's last carve: shrunk in place
        after = arena.allocate(70)
        addresses = {seg.address for seg in (empty, full, shrunk, after)}
        assert len(addresses) == 4
        assert sorted(t.size for t in arenalib_traces()) == [0, 0, 70, 100]
        grown = empty.resize(50)
        assert sorted(t.size for t in arenalib_traces()) == [0, 50, 70, 100]
        grown = shrunk.resize(0)
        assert full.alive and after.alive and grown.alive
        assert sorted(t.size for t in arenalib_traces()) == [0, 50, 70, 100]
        assert arena.stats()["live_bytes"] == 220


def test_a_resized_block_carved_in_a_frame_leaves_no_trace_behind(tracing):
    with arenalib.SlicingArena() as arena:
        with arena.frame():
            kept = arena.allocate(40)
            moved = arena.allocate(24)
            kept = kept.resize(4000)  # not the last carve: moved to a new carve
            assert sorted(t.size for t in arenalib_traces()) == [24, 4000]
            del moved
        assert len(arenalib_traces()) == 0
        assert not kept.alive


@pytest.mark.parametrize("kind", KINDS)
def test_a_c_level_reset_or_close_ends_the_traces_of_the_segments(tracing, kind, cython_consumers):
    # Through the C API they left the dead segments traced; a block of another arena traced later
    # at one of their addresses then lost its trace to this arena's close().
    consumer = cython_consumers["safety_consumer"]
    arena = kind()
    segs = [arena.allocate(n) for n in (10, 200, 3000)]
    consumer.reset_core_without_the_gil(arena)
    assert len(arenalib_traces()) == 0 and not any(seg.alive for seg in segs)
    segs = [arena.allocate(n) for n in (20, 400)]
    assert sorted(t.size for t in arenalib_traces()) == [20, 400]
    consumer.close_core(arena)
    assert len(arenalib_traces()) == 0 and arena.closed
    with kind() as other:
        theirs = other.allocate(1000)
        arena.close()  # (idempotent)
        assert [t.size for t in arenalib_traces()] == [1000] and theirs.alive


class failing_python_allocation:  # (a context manager, used as a function)
    """A context in which the k-th allocation of Python's allocators from its start fails (a class,
    not a generator: its entry allocates nothing after the hook is set)."""

    def __init__(self, k):
        self.testcapi = pytest.importorskip("_testcapi")
        self.k = k

    def __enter__(self):
        self.testcapi.set_nomemory(self.k, self.k + 1)

    def __exit__(self, *exc_info):
        self.testcapi.remove_mem_hooks()


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
def test_no_memory_for_tracemallocs_books_of_a_block_loses_neither_the_block_nor_the_segment(kind):
    """tracemalloc's table is written once the block is bound to its segment: a MemoryError there
    lost the block (counted until close, max_bytes used up by blocks nobody held) and, in a
    resize, the segment (the old one dead, the new one never returned).  Every Python allocation
    in turn fails once: allocate() and resize() either raise with nothing changed or succeed."""
    tracemalloc.start()
    try:
        for k in range(60):
            with kind(max_bytes=1 << 20) as arena:
                kept = [arena.allocate(64) for _ in range(7)]  # the table is about to grow
                try:
                    with failing_python_allocation(k):
                        seg = arena.allocate(1024)
                except MemoryError:
                    assert arena.stats()["live_segments"] == len(kept), k
                    continue
                finally:
                    for one in kept:
                        one.free()
                    kept.clear()
                seg.fill(7)
                try:
                    with failing_python_allocation(k):
                        grown = seg.resize(50_000)
                except MemoryError:
                    assert seg.alive and seg.tobytes() == b"\x07" * 1024, k
                    assert arena.stats()["live_bytes"] == 1024, k
                else:
                    assert not seg.alive and grown.tobytes()[:1024] == b"\x07" * 1024, k
                    assert arena.stats()["live_bytes"] == 50_000, k
                    seg = grown
                seg.free()
                assert arena.stats()["live_segments"] == 0, k
            # No trace outlives the blocks: one made before its table entry failed used to.
            assert not arenalib_traces(), k
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
def test_debug_mode_at_the_recursion_limit_loses_no_block(kind):
    """Debug mode notes where a block was allocated (traceback.format_stack()) once the block is
    bound: at the recursion limit that raised RecursionError, and the block was lost to a segment
    the caller never got.  Allocations made at every depth up to the limit: each one either raises
    before taking memory or returns its segment, and the books count exactly those returned."""
    got: list = []
    arenalib.set_debug(True)
    try:
        with kind() as arena:

            def dive():
                try:
                    dive()
                except RecursionError:
                    pass
                try:
                    got.append(arena.allocate(64))
                except RecursionError:
                    pass

            depth, frame = 0, sys._getframe()
            while frame is not None:
                depth, frame = depth + 1, frame.f_back
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(depth + 150)  # (each note formats the whole stack: keep it short)
            try:
                dive()
            finally:
                sys.setrecursionlimit(limit)
            assert got and arena.stats()["live_segments"] == len(got)
            for seg in got:
                seg.free()
            got.clear()
    finally:
        arenalib.set_debug(False)


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
def test_no_trace_outlives_a_block_whose_table_entry_could_not_be_made(kind):
    """The trace was made before the table entry that lets a close untrack it: an entry that could
    not be made (a MemoryError, swallowed since) left a trace in arenalib's domain for good."""
    tracemalloc.start()
    try:
        for k in range(1, 30):
            arena = kind()
            kept = [arena.allocate(64) for _ in range(7)]  # the table is about to grow
            try:
                with failing_python_allocation(k):
                    arena.allocate(12345)
            except MemoryError:
                pass
            arena.close()
            kept.clear()
            assert not arenalib_traces(), k
    finally:
        tracemalloc.stop()
