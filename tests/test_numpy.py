"""NumPy arrays allocated from an arena: `with arena.numpy():` and numpy_handler() (issue 28).

What it promises: the data of the arrays created in the block comes from the Arena and outlives the
block; nothing an array can reach is ever freed first (close() and reset() refuse while an array
lives, the end of `with arena:` closes deferred and the last array's free completes the close); NumPy's
frees with a size of its own, its reallocations and frees from any thread are served; an allocation
after the close falls back to NumPy's default handler and is counted; tracemalloc sees the arrays in
arenalib's domain.  The state machine is tests/test_numpy_stateful.py, NumPy's own policy tests run
under the handler in tests/test_numpy_policy.py."""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import datetime
import gc
import itertools
import os
import pickle
import re
import sys
import sysconfig
import threading
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from numpy._core.multiarray import get_handler_name
from support import (
    ROOT,
    SANITIZED,
    MiB,
    assert_ok,
    resetting_without_the_gil,
    run_python,
    run_threads,
    settled_rss,
    slots_in_use,
)

import arenalib
from arenalib import ArenaClosedError, UnsupportedOperation

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

HANDLER_NAME = "arenalib.Arena"


def arrays(arena):
    return arena.stats()["numpy_arrays"]


def closing_arenas():
    # Counted process-wide: a test compares with its own start, as a failed test's traceback may hold
    # arrays of an arena that an earlier test closed deferred.
    return arenalib.live_objects()["closing_arenas"]


@pytest.fixture
def arena():
    a = arenalib.Arena()
    yield a
    a.close(deferred=True)  # a failing test's traceback may hold arrays; a passing one's leak check says


# -- the scope -------------------------------------------------------------------------------------


def test_arrays_made_in_the_block_come_from_the_arena(arena):
    assert get_handler_name() == "default_allocator"
    with arena.numpy() as entered:
        assert entered is arena
        assert get_handler_name() == HANDLER_NAME
        x = np.arange(1000.0)
        y = x * 2  # a result of arithmetic too
        view = x[::2]  # a view owns no data
    assert get_handler_name() == "default_allocator"
    z = np.arange(10.0)
    assert get_handler_name(x) == get_handler_name(y) == HANDLER_NAME
    assert get_handler_name(view) is None and get_handler_name(z) == "default_allocator"
    stats = arena.stats()
    assert stats["numpy_arrays"] == 2 and stats["numpy_bytes"] == 16000
    assert stats["exports"] == 0  # arrays are counted apart from buffer exports
    assert stats["live_bytes"] >= 16000 and arenalib.live_objects()["numpy_arrays"] >= 2
    assert float(y.sum()) == 999 * 1000.0 and view[3] == 6.0
    del x, y, view
    assert arrays(arena) == 0 and arena.stats()["numpy_bytes"] == 0


def test_an_array_past_two_gib_comes_from_the_arena_and_goes_back(arena):
    """Sizes past 2**31 through the handler's malloc, calloc, realloc and free (NumPy's own test of
    that size, test_huge_vectordot, needs 18 GB free and is left out of test_numpy_policy.py).  Only
    the pages written here are touched: a resize zero-fills what it adds, so it adds 1 MiB."""
    n = (1 << 31) + 4099  # past a C int, not a page multiple
    with arena.numpy():
        empty = np.empty(n, dtype=np.uint8)
        zeros = np.zeros(n, dtype=np.uint8)
        empty.resize(n + MiB, refcheck=False)
    assert get_handler_name(empty) == get_handler_name(zeros) == HANDLER_NAME
    empty[0], empty[-1], zeros[-1] = 1, 2, 3
    assert zeros[0] == zeros[-2] == 0 and empty[n:].sum() == 2  # (the resize's zeros, and the 2)
    assert arena.stats()["numpy_arrays"] == 2 and arena.stats()["numpy_bytes"] == 2 * n + MiB
    empty.resize(8, refcheck=False)  # and back to a small block
    assert arena.stats()["numpy_bytes"] == n + 8 and empty[0] == 1
    del empty, zeros
    assert arrays(arena) == 0 and arena.stats()["numpy_bytes"] == 0


def test_the_automatic_arena_has_a_scope_too():
    # auto_arena() is a shared Arena that is never closed: arrays made in its scope live as long as
    # they like, and its books come back when they die.
    auto = arenalib.auto_arena()
    before = auto.stats()["numpy_arrays"]
    with auto.numpy() as entered:
        assert entered is auto
        x = np.arange(300_000.0)  # a big block (page-aligned) and a small one
        y = np.ones(5)
    assert get_handler_name(x) == get_handler_name(y) == HANDLER_NAME
    assert auto.stats()["numpy_arrays"] == before + 2
    with pytest.raises(TypeError):
        auto.close()  # (never closed, arrays or not)
    assert float(x[-1]) == 299_999.0 and float(y.sum()) == 5.0
    del x, y
    assert auto.stats()["numpy_arrays"] == before

def test_nested_scopes_restore_what_they_replaced(arena):
    with arenalib.Arena() as other:
        with arena.numpy():
            with other.numpy():
                inner = np.ones(10)
            outer = np.ones(10)
        assert arrays(other) == 1 and arrays(arena) == 1
        assert get_handler_name() == "default_allocator"
        del inner, outer


def scoped(arena):
    """A generator suspended inside ``arena.numpy()``: its scope ends when it is closed."""
    with arena.numpy():
        yield


def test_scopes_ended_out_of_order_leave_the_handler_to_those_entered_after_them(arena):
    """Generators closed in the order they were suspended end their scopes out of order: the
    outer's end leaves the inner's handler in place (its block is still open), and the inner's
    end restores what the outer replaced, not the outer's handler (which then stayed current
    once every scope had ended)."""
    with arenalib.Arena() as other:
        outer, inner = scoped(arena), scoped(other)
        next(outer)
        next(inner)
        outer.close()
        x = np.ones(10)
        assert arrays(other) == 1 and arrays(arena) == 0
        inner.close()
        assert get_handler_name() == "default_allocator"
        y = np.ones(10)
        assert arrays(other) == 1 and arrays(arena) == 0
        del x, y


def test_a_scope_ended_out_of_order_under_a_scope_still_open_goes_with_it(arena):
    with arenalib.Arena() as first, arenalib.Arena() as second:
        with first.numpy():
            a, b = scoped(arena), scoped(second)
            next(a)
            next(b)
            a.close()  # out of order: second's handler stays
            b.close()  # first's handler back, arena's scope gone with it
            x = np.ones(10)
            assert arrays(first) == 1 and arrays(arena) == 0 and arrays(second) == 0
        assert get_handler_name() == "default_allocator"
        del x


def test_a_scope_ended_out_of_order_is_not_entered_again(arena):
    with arenalib.Arena() as other:
        scope = arena.numpy()
        scope.__enter__()
        inner = scoped(other)
        next(inner)
        scope.__exit__(None, None, None)
        assert "ended out of order" in repr(scope)
        with pytest.raises(RuntimeError, match="ended before a scope entered after it"):
            scope.__enter__()
        inner.close()
        assert get_handler_name() == "default_allocator"
        with scope:  # let go with the scope entered after it: a scope like any other again
            x = np.ones(10)
        assert arrays(arena) == 1
        del x


def test_a_scope_ended_in_another_context_says_so(arena):
    """A generator suspended in a scope and closed on another thread (whose context is not the one
    the scope began in) cannot reach the context holding the handler: RuntimeError, as
    ContextVar.reset() of another context's token raises; the scope's own context is left as the
    block left it."""
    context = contextvars.copy_context()  # the scope's: the test's own is left untouched
    gen = scoped(arena)
    context.run(next, gen)
    with pytest.raises(RuntimeError, match="another context"):
        run_threads(lambda index: gen.close(), 1)
    x = context.run(np.ones, 10)
    assert arrays(arena) == 1  # its context still has the handler: documented
    assert get_handler_name() == "default_allocator"
    del x


def test_a_scope_ended_in_a_copy_of_its_context_says_so_and_the_scope_around_it_still_ends(arena):
    """A copied context holds the same scopes (an asyncio task's, copy_context().run()): the scope's
    entry token tells the copy from the context it began in.  Ended in the copy it raised nothing,
    restored the copy's handler only, and the scope around it then ended with a false
    RuntimeError, leaving the arena's handler current for good."""
    with arenalib.Arena() as other:
        with arena.numpy():
            inner = scoped(other)
            next(inner)
            with pytest.raises(RuntimeError, match="another context"):
                contextvars.copy_context().run(inner.close)
            x = np.ones(10)  # the context it began in keeps its handler until a scope here ends
            assert arrays(other) == 1
        assert get_handler_name() == "default_allocator"  # the outer end passed over the inner
        y = np.ones(10)
        assert arrays(other) == 1 and arrays(arena) == 0
        del x, y


def test_a_copy_of_the_context_leaves_the_scopes_of_the_one_it_was_copied_from_alone(arena):
    """An asyncio task copies the chain of scopes; its own scope's end, with a scope of the context
    it was copied from below (one that ended out of order there), cleared that scope's state: the
    context it came from then kept the arena's handler once every block had ended."""
    with arenalib.Arena() as second, arenalib.Arena() as third:

        async def child():
            with third.numpy():  # the task's own scope, above the copied, out-of-order one
                return np.zeros(3)

        async def main():
            gen = scoped(arena)
            next(gen)
            task = asyncio.create_task(child())  # copies the chain: arena's scope
            with second.numpy():
                gen.close()  # out of order: second's handler stays until its block ends
                made_in_task = await task
            return made_in_task, get_handler_name(), np.ones(1000)

        made_in_task, handler, after = asyncio.run(main())
        assert handler == "default_allocator"
        assert arrays(arena) == 0 and arrays(third) == 1
        del made_in_task, after


def test_scopes_re_entered_after_a_copy_cannot_make_the_chain_a_loop(arena):
    """A scope ended in its context, then entered again while a copy still held it in its chain:
    the copy's chain led back to the scope itself, and the next exit walked it for good."""
    arenas = [arenalib.Arena() for _ in range(3)]
    try:
        first, second = arena.numpy(), arenas[0].numpy()
        first.__enter__()
        copy = contextvars.copy_context()  # its chain: first
        second.__enter__()
        first.__exit__(None, None, None)  # out of order

        def in_copy():
            with arenas[1].numpy():
                pass
        copy.run(in_copy)
        second.__exit__(None, None, None)  # passes over first: both ended
        assert get_handler_name() == "default_allocator"
        first.__enter__()  # a scope like any other again
        last = arenas[2].numpy()
        last.__enter__()
        first.__exit__(None, None, None)  # out of order
        last.__exit__(None, None, None)  # returned (it looped before), first gone with it
        assert get_handler_name() == "default_allocator"

        def re_enter_in_copy():  # the copy's chain still names first's earlier entry
            with first:
                with arenas[1].numpy():
                    pass
                x = np.ones(10)
            return x, get_handler_name()
        x, inside = copy.run(re_enter_in_copy)
        assert inside == HANDLER_NAME and arrays(arena) == 1
        assert copy.run(get_handler_name) == HANDLER_NAME  # the copy's, from before its entry
        del x
    finally:
        for a in arenas:
            a.close()


def test_a_scope_never_ended_goes_with_its_context(arena):
    """A scope holds its entry's token, which holds its context, whose chain holds the scope: the
    cyclic GC collects them once the context is gone (they held the arena for good)."""
    before = sys.getrefcount(arena)
    for _ in range(20):
        context = contextvars.copy_context()
        context.run(arena.numpy().__enter__)
        del context
    gc.collect()
    assert sys.getrefcount(arena) == before


def test_a_scope_is_entered_once_at_a_time_and_can_be_entered_again(arena):
    scope = arena.numpy()
    with scope:
        with pytest.raises(RuntimeError, match="entered already"):
            scope.__enter__()
        a = np.zeros(3)
    with scope:
        b = np.zeros(3)
    assert arrays(arena) == 2
    assert "NumpyScope" in repr(scope) and "not entered" in repr(scope)
    with pytest.raises(TypeError):
        arenalib.NumpyScope()
    del a, b


def test_the_blocks_exception_propagates_and_the_handler_is_restored(arena):
    with pytest.raises(ZeroDivisionError):
        with arena.numpy():
            x = np.ones(4)
            raise ZeroDivisionError
    assert get_handler_name() == "default_allocator"
    del x


@pytest.mark.parametrize("kind", [arenalib.ConfinedArena, arenalib.SlicingArena])
def test_other_arena_kinds_are_refused_with_the_reason(kind):
    with kind() as a:
        with pytest.raises(UnsupportedOperation, match=r"use arenalib\.Arena"):
            a.numpy()
        with pytest.raises(UnsupportedOperation, match=r"use arenalib\.Arena"):
            arenalib.numpy_handler(a)


def test_numpy_handler_checks_its_argument():
    with pytest.raises(TypeError, match=r"arenalib\.Arena, not bytearray"):
        arenalib.numpy_handler(bytearray())
    a = arenalib.Arena()
    a.close()
    with pytest.raises(ArenaClosedError):
        arenalib.numpy_handler(a)
    with pytest.raises(ArenaClosedError):
        with a.numpy():
            pass
    assert get_handler_name() == "default_allocator"


def test_numpy_handler_and_set_numpy_handler(arena):
    handler = arenalib.numpy_handler(arena)
    assert type(handler).__name__ == "PyCapsule" and "mem_handler" in repr(handler)
    previous = arenalib.set_numpy_handler(handler)
    try:
        x = np.ones(100)
    finally:
        assert arenalib.set_numpy_handler(previous) is handler
    assert get_handler_name(x) == HANDLER_NAME and arrays(arena) == 1
    assert arenalib.set_numpy_handler(None) is previous  # None: NumPy's default
    for wrong in (object(), 42, b"mem_handler"):  # not a capsule: TypeError, as CPython has it
        with pytest.raises(TypeError, match="'mem_handler' capsule or None, not"):
            arenalib.set_numpy_handler(wrong)
    with pytest.raises(ValueError, match="mem_handler"):
        arenalib.set_numpy_handler(datetime.datetime_CAPI)  # a capsule of another name
    assert get_handler_name() == "default_allocator"
    del x, handler


# -- the lifetime ------------------------------------------------------------------------------------


def test_close_and_reset_refuse_while_an_array_lives_and_change_nothing(arena):
    with arena.numpy():
        x = np.full(1000, 7, dtype=np.int64)
        y = np.zeros(10, dtype=np.uint8)
    seg = arena.allocate(100).fill(1)
    keys = ("live_bytes", "live_segments", "numpy_arrays", "numpy_bytes", "exports", "closed")
    before = {k: arena.stats()[k] for k in keys}
    for attempt in (arena.close, arena.reset):
        with pytest.raises(BufferError, match=r"2 NumPy array\(s\) of 8010 bytes"):
            attempt()
    assert {k: arena.stats()[k] for k in keys} == before
    assert not arena.closed and seg.alive and seg.tobytes() == b"\x01" * 100
    assert int(x.sum()) == 7000 and int(y.sum()) == 0
    view = memoryview(seg)
    with pytest.raises(BufferError, match=r"2 NumPy array\(s\) .* and 1 buffer export"):
        arena.close()
    view.release()
    del x, y
    arena.reset()
    assert not seg.alive


def test_the_end_of_with_arena_closes_deferred_and_the_last_array_completes_it():
    closing = closing_arenas()
    before = slots_in_use()
    with arenalib.Arena() as a, a.numpy():
        x = np.arange(100_000, dtype=np.int64)
        y = np.ones(5)
    assert a.closed and slots_in_use() == before + 1
    assert "held by 2 NumPy array(s)" in repr(a)
    stats = a.stats()
    assert stats["numpy_arrays"] == 2 and stats["held_by_exports"] == 0 and stats["held_bytes"] > 800_000
    assert closing_arenas() == closing + 1
    x[:] += 1  # still the arena's memory, readable and writable
    assert int(x.sum()) == 100_000 * 100_001 // 2
    del x
    assert slots_in_use() == before + 1
    del y  # the last one gives the slot back
    assert slots_in_use() == before and a.stats()["numpy_arrays"] == 0
    assert repr(a) == "<arenalib.Arena closed>"


def test_the_arena_object_lives_as_long_as_its_arrays():
    closing, arrays_before = closing_arenas(), arenalib.live_objects()["numpy_arrays"]
    with arenalib.Arena() as a, a.numpy():
        x = np.ones(1000)
    del a  # the arrays' handler holds the arena object
    gc.collect()
    assert closing_arenas() == closing + 1
    assert float(x.sum()) == 1000.0
    del x
    assert closing_arenas() == closing and arenalib.live_objects()["numpy_arrays"] == arrays_before


def test_an_array_and_a_segment_export_each_may_be_the_last(arena):
    closing = closing_arenas()
    for array_last in (True, False):
        with arenalib.Arena() as a, a.numpy():
            x = np.ones(10)
            view = memoryview(a.allocate(10))
        if array_last:
            view.release()
            assert a.stats()["numpy_arrays"] == 1
            del x
        else:
            del x
            view.release()
        assert closing_arenas() == closing


# -- what NumPy does with the memory ----------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 7, 100, 4096, 70_000, 3 * MiB // 8, 5 * MiB // 8])
def test_sizes_zeros_and_a_free_of_another_size(arena, n):
    with arena.numpy():
        z = np.zeros(n)
        e = np.empty(n, dtype=np.int8)
        e[:] = 5
    assert get_handler_name(z) == HANDLER_NAME and not z.any()
    assert (e == 5).all()
    with warnings.catch_warnings():  # NumPy 2.5 deprecates setting both; the handler must still cope
        warnings.simplefilter("ignore", DeprecationWarning)
        z.shape = (n, 1) if n else (0, 3)  # a shape (and, empty, a size) NumPy frees with differs
        e.dtype = np.uint8
    del z, e
    assert arrays(arena) == 0 and arena.stats()["numpy_bytes"] == 0


def test_zeros_are_zero_in_reused_memory(arena):
    with arena.numpy():
        for n in (100, 5000, 200_000, 5 * MiB // 8):
            dirty = np.full(n, 0xAB, dtype=np.float64)
            del dirty
            assert not np.zeros(n).any()


def test_resize_grows_and_shrinks_in_the_arena(arena):
    with arena.numpy():
        x = np.arange(10, dtype=np.int64)
    x.resize(100_000)  # refcheck: x is the only reference
    assert list(x[:10]) == list(range(10)) and not x[10:].any()
    assert arena.stats()["numpy_bytes"] == 800_000 and get_handler_name(x) == HANDLER_NAME
    x.resize(3)
    assert list(x) == [0, 1, 2] and arena.stats()["numpy_bytes"] == 24
    x.resize(0)
    assert arena.stats()["numpy_bytes"] == 1
    del x
    assert arrays(arena) == 0


def test_an_array_grown_in_place_or_moved_raises_the_peak(arena):
    # A big block's realloc brought numpy_bytes up to date, not peak_bytes: an array of 200 KB
    # grown to 8 MiB left the peak at 200 KB, under the live bytes.
    with arena.numpy():
        x = np.zeros(200_000, dtype=np.uint8)
    for size in (8 * MiB, 8 * MiB + 3 * 4096 + 5, 12 * MiB):
        x.resize(size, refcheck=False)
        books = arena.stats()
        assert books["peak_bytes"] >= books["live_bytes"] >= size
    x.resize(10, refcheck=False)
    assert arena.stats()["peak_bytes"] >= 12 * MiB
    del x


def test_fromiter_grows_its_buffer_by_realloc(arena):
    with arena.numpy():
        x = np.fromiter((i * i for i in range(50_000)), dtype=np.int64)
    assert int(x[-1]) == 49_999**2 and arrays(arena) == 1
    assert arena.stats()["numpy_bytes"] >= 400_000
    del x


def test_max_bytes_is_a_memory_error_and_the_arena_stays_usable():
    with arenalib.Arena(max_bytes=MiB) as a, a.numpy():
        small = np.ones(1000)
        with pytest.raises(MemoryError):
            np.empty(200_000)
        with pytest.raises(MemoryError):
            small.resize(200_000, refcheck=False)
        assert float(small.sum()) == 1000.0
        more = np.ones(1000)
        assert a.stats()["numpy_arrays"] == 2
    del small, more


def test_pickles_load_with_the_handler_current_where_they_load(arena):
    objects = np.array([1, "two", None, 4.0] * 10, dtype=object)
    with arena.numpy():
        x = np.arange(1000.0)
        inside = pickle.loads(pickle.dumps(objects))  # an object array's items are set one by one
        floats = pickle.loads(pickle.dumps(x))  # may view the pickle's bytes rather than copy
        buffers = []
        data = pickle.dumps(x, protocol=5, buffer_callback=buffers.append)
        out_of_band = pickle.loads(data, buffers=buffers)  # views x's memory
    outside = pickle.loads(pickle.dumps(objects))
    assert get_handler_name(inside) == HANDLER_NAME and get_handler_name(outside) == "default_allocator"
    assert get_handler_name(floats) in (None, HANDLER_NAME) and get_handler_name(out_of_band) is None
    assert list(inside) == list(objects) == list(outside)
    assert (floats == x).all() and (out_of_band == x).all()
    del x
    assert float(out_of_band[999]) == 999.0  # the buffer still holds x's memory
    del out_of_band, buffers, inside, floats
    assert arrays(arena) == 0


def test_sorting_structured_arrays_uses_the_current_handler_for_scratch(arena):
    dtype = np.dtype([("a", ">i4"), ("b", "<f8")], align=False)
    with arena.numpy():
        x = np.array([(3, 1.0), (1, 2.0), (2, 0.5)] * 100, dtype=dtype)
        x.sort(order=["a", "b"])
    assert list(x["a"][:3]) == [1, 1, 1] and arrays(arena) == 1
    del x


# -- the small blocks the handler keeps for reuse (GIL builds) -----------------------------------------

# A bucket per 16 bytes of data up to 1 KiB, four blocks each; a block has a 16-byte header.
KEPT_PER_BUCKET = 4


def kept_size(nbytes):
    return -(-nbytes // 16) * 16 + 16


def kept_bytes(arena):
    return arena.stats()["numpy_cached_bytes"]


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_a_dead_arrays_small_block_is_kept_out_of_the_live_figures_and_reused_zeroed(arena):
    with arena.numpy():
        x = np.zeros(100)  # (np.zeros makes no temporary of its own, np.full and np.ones do)
        x.fill(7.0)
        address = x.ctypes.data
        del x
        stats = arena.stats()
        assert (stats["numpy_cached_bytes"], stats["numpy_arrays"]) == (kept_size(800), 0)
        assert (stats["live_bytes"], stats["live_segments"], stats["exports"]) == (0, 0, 0)
        assert "0 segments, 0 bytes" in repr(arena)
        y = np.zeros(100)  # calloc: the kept block again, zeroed
        assert kept_bytes(arena) == 0 and y.ctypes.data == address and not y.any()
        z = np.empty(99)  # the same bucket, none kept now: from the arena
        assert z.ctypes.data != address
        z.resize(5000, refcheck=False)  # a kept-size block resized in the arena
        z[:99] = 1.0
        assert arena.stats()["numpy_bytes"] == 800 + 40_000
    assert float(z[:99].sum()) == 99.0
    before = kept_bytes(arena)
    del y, z  # y's block is kept, z's (40 KB) goes back to the arena
    assert kept_bytes(arena) - before == kept_size(800) and arena.stats()["live_bytes"] == 0


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_the_cache_is_bounded_and_keeps_no_big_block(arena):
    with arena.numpy():
        small = [np.zeros(100) for _ in range(3 * KEPT_PER_BUCKET)]
        sizes = [np.zeros(n) for n in (1, 2, 17, 127, 128)]  # 8 B to 1 KiB: a bucket each
        big = [np.zeros(129), np.zeros(100_000)]  # past 1 KiB: back to the arena
    del small, sizes, big
    assert kept_bytes(arena) == KEPT_PER_BUCKET * kept_size(800) + sum(
        kept_size(8 * n) for n in (1, 2, 17, 127, 128))
    assert arena.stats()["live_bytes"] == 0


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
@pytest.mark.parametrize("how", ["reset", "purge", "close", "close_deferred"])
def test_reset_purge_and_close_give_the_kept_blocks_back(how):
    arena = arenalib.Arena()
    with arena.numpy():
        kept = [np.zeros(n) for n in range(1, 100, 7)]
        alive = np.arange(10.0)
    del kept
    assert kept_bytes(arena) > 0
    active = arena.stats()["active"]
    if how == "close_deferred":
        arena.close(deferred=True)  # alive holds the memory: the kept blocks went back first
        assert arena.stats()["held_bytes"] == kept_size(80) and list(alive) == list(range(10))
        del alive
        assert arena.stats()["held_bytes"] == 0 and kept_bytes(arena) == 0
        return
    del alive
    getattr(arena, how)()
    stats = arena.stats()
    assert stats["numpy_cached_bytes"] == 0 and stats["live_bytes"] == 0
    if how == "purge":  # still open: the blocks went back to jemalloc, which no longer counts them
        assert stats["active"] < active
        with arena.numpy():
            x = np.full(10, 3.0)
        assert list(x) == [3.0] * 10
        del x
    arena.close()


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_a_c_level_close_gives_the_kept_blocks_back(cython_consumers):
    # The C API's close did not flush the handler's cache: its blocks stayed in the slot's
    # jemalloc arena, counted nowhere (an attack: 3,000 scopes closed so, 35 -> 460 MiB).
    close_core = cython_consumers["safety_consumer"].close_core
    before = None
    for scope in range(400):
        if scope == 100:  # (the first scopes warm the slots up)
            before = settled_rss()
        arena = arenalib.Arena()
        with arena.numpy():
            kept = [np.zeros(n) for n in range(1, 128)]  # ~140 KiB of kept blocks a scope
        del kept
        assert kept_bytes(arena) > 0
        close_core(arena)
        assert arena.closed and kept_bytes(arena) == 0
    # 300 scopes leaked ~40 MiB.  Under ASan, its quarantine keeps freed Python objects resident too
    # (+8.3 MiB in one CI run).
    assert settled_rss() - before < (16 if SANITIZED else 8) * MiB


def test_a_limited_arena_keeps_no_block_and_counts_sizes_unrounded():
    with arenalib.Arena(max_bytes=MiB) as a:
        with a.numpy():
            x = np.zeros(100)
        del x
        assert kept_bytes(a) == 0 and a.stats()["live_bytes"] == 0
    with arenalib.Arena(max_bytes=1000) as a, a.numpy():
        x = np.empty(980, dtype=np.uint8)  # 980 bytes and the 16-byte header: the limit's 996
        assert a.stats()["live_bytes"] == 996
        with pytest.raises(MemoryError):
            np.empty(1, dtype=np.uint8)
        del x


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_kept_blocks_are_out_of_the_peak_and_the_totals_count_each_array(arena):
    with arena.numpy():
        for n in range(1, 129):  # one array alive at a time, every bucket kept once
            x = np.zeros(n)
            del x
        kept = kept_bytes(arena)
        total = arena.stats()["allocated_total"]
        y = np.zeros(128)  # from the cache: counted as an allocation again
    assert kept >= 128 * 16 and arena.stats()["allocated_total"] == total + kept_size(1024)
    arena.allocate(10)  # a Python-level allocate brings the peak up to date
    stats = arena.stats()
    assert stats["live_bytes"] == kept_size(1024) + 10
    assert stats["peak_bytes"] <= 2 * kept_size(1024) + 10  # what was alive at once, not what is kept
    del y


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_any_thread_keeps_and_takes_blocks_and_the_books_stay_exact(arena):
    # The cache is the GIL's, not a thread's: a block another thread's array held is kept, and
    # this thread's next array of its bucket takes it; the live figures and the peak never count it.
    addresses = []

    def worker():
        with arena.numpy():
            x = np.zeros(100)
            addresses.append(x.ctypes.data)
            del x

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    stats = arena.stats()
    assert kept_bytes(arena) == kept_size(800)
    assert (stats["live_bytes"], stats["live_segments"], stats["numpy_arrays"]) == (0, 0, 0)
    with arena.numpy():
        y = np.zeros(100)
    assert y.ctypes.data == addresses[0] and not y.any()
    assert arena.stats()["live_bytes"] == kept_size(800) and kept_bytes(arena) == 0
    segment = arena.allocate(10)  # brings the peak up to date: the block is held once, not twice
    assert arena.stats()["peak_bytes"] == kept_size(800) + 10
    del y
    threads_done = []

    def dropper(array):
        del array[:]  # the last reference goes in this thread: its free keeps the block
        threads_done.append(kept_bytes(arena))

    with arena.numpy():
        z = [np.zeros(50)]
    thread = threading.Thread(target=dropper, args=(z,))
    thread.start()
    thread.join()
    assert threads_done == [kept_size(800) + kept_size(400)]
    assert arena.stats()["live_bytes"] == 10
    segment.free()


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
@pytest.mark.parametrize("how", ["reset", "purge"])
def test_the_peak_after_a_reset_or_purge_counts_no_block_kept_before(how):
    # The kept blocks' bytes are taken out of the live sums the peak is compared with; a reset
    # (which drops them) or a purge (which gives them back) must leave nothing to take out, or a
    # later allocation would raise the peak too little.
    arena = arenalib.Arena()
    with arena.numpy():
        for n in range(1, 129):
            x = np.zeros(n)
            del x
    kept = kept_bytes(arena)
    assert kept > 30_000  # 64 buckets, one block each
    peak = arena.stats()["peak_bytes"]
    getattr(arena, how)()
    assert arena.stats()["live_bytes"] == 0
    size = peak + kept // 2  # past the peak, but not past it by what was kept
    segment = arena.allocate(size)
    stats = arena.stats()
    assert stats["peak_bytes"] == size and stats["live_bytes"] == size
    segment.free()
    arena.close()


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_a_c_level_reset_without_the_gil_never_runs_inside_the_handler(cython_consumers):
    # A kept block taken while another thread's arena_reset() (no GIL) reset the jemalloc arena
    # went to an array and stayed in the cache of the new generation: negative books, the array
    # overwritten by later ones, then a crash in jemalloc (an attack, 2026-12-06).  An Arena's
    # C-level reset now takes the GIL, which the handler's functions hold.
    arena = arenalib.Arena()
    seen = []
    with resetting_without_the_gil(cython_consumers["safety_consumer"].reset_core_without_the_gil,
                                   arena) as resets, arena.numpy():
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for i in range(500):
                x = np.empty(8)
                x[:] = i
                assert (x == i).all()
                del x
            stats = arena.stats()
            seen.append((stats["live_bytes"], stats["live_segments"]))
    assert resets and min(seen) >= (0, 0)
    assert (arena.stats()["live_bytes"], arena.stats()["live_segments"]) == (0, 0)
    arena.close()


def test_a_free_threaded_build_keeps_no_block(arena):
    with arena.numpy():
        x = np.zeros(100)
    del x
    assert kept_bytes(arena) == (0 if FREE_THREADED else kept_size(800))


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
def test_blocks_kept_before_a_c_level_close_and_reopen_are_never_handed_out(cython_consumers):
    """A close through the C API gives the jemalloc arena back without asking the handler: the blocks
    it kept are then another arena's to hand out, and the reopened arena's next arrays must not get
    them (its new generation makes the cache stale)."""
    consumer = cython_consumers["safety_consumer"]
    arena = arenalib.Arena()
    with arena.numpy():
        kept = [np.zeros(100) for _ in range(KEPT_PER_BUCKET)]
        old = {x.ctypes.data for x in kept}
    del kept
    assert kept_bytes(arena) == KEPT_PER_BUCKET * kept_size(800)
    consumer.close_and_reopen(arena, consumer.KINDS["Arena"])
    assert kept_bytes(arena) == 0 and arena.stats()["live_bytes"] == 0
    assert arena.stats()["allocated_total"] == 0  # (the handed-out-again count went with the open)
    other = arenalib.Arena()  # likely the slot the close gave back, warm
    with other.numpy():
        theirs = [np.full(100, float(i)) for i in range(2 * KEPT_PER_BUCKET)]
    with arena.numpy():
        ours = [np.full(100, -1.0 - i) for i in range(KEPT_PER_BUCKET)]
    assert not {x.ctypes.data for x in ours} & {x.ctypes.data for x in theirs}
    assert all((x == float(i)).all() for i, x in enumerate(theirs))
    assert all((x == -1.0 - i).all() for i, x in enumerate(ours))
    # From the reopened arena's books (a stale block would come from no books, and go back to the
    # cache counted out of them: live_bytes would read 0 now, and negative after the del).
    assert arena.stats()["live_bytes"] >= KEPT_PER_BUCKET * kept_size(800)
    del theirs, ours, old
    assert arena.stats()["live_bytes"] == 0
    other.close()
    arena.close()


# -- after the block ---------------------------------------------------------------------------------


def test_asyncio_tasks_inherit_the_block_and_fall_back_after_the_close():
    closing = closing_arenas()
    async def make(event=None):
        if event is not None:
            await event.wait()
        return np.arange(100.0)

    async def main():
        event = asyncio.Event()
        with arenalib.Arena() as a, a.numpy():
            during = asyncio.create_task(make())
            after = asyncio.create_task(make(event))  # created in the block: its context has the handler
            first = await during
        assert get_handler_name() == "default_allocator" and a.closed
        event.set()
        second = await after
        return a, first, second

    a, first, second = asyncio.run(main())
    assert get_handler_name(first) == get_handler_name(second) == HANDLER_NAME
    stats = a.stats()
    assert stats["numpy_fallbacks"] == 1  # the task's array came from NumPy's default allocation
    assert stats["numpy_arrays"] == 1  # first, still the arena's
    assert float(second.sum()) == 4950.0
    second.resize(10_000, refcheck=False)  # a fallback block reallocates with NumPy's default
    assert float(second.sum()) == 4950.0
    del first
    assert closing_arenas() == closing
    del second


def test_a_realloc_after_the_close_moves_the_bytes_to_numpys_default(arena):
    closing = closing_arenas()
    with arenalib.Arena() as a, a.numpy():
        x = np.arange(1000, dtype=np.int64)
    x.resize(2000, refcheck=False)
    assert list(x[:1000]) == list(range(1000)) and not x[1000:].any()
    assert a.stats()["numpy_fallbacks"] == 1 and a.stats()["numpy_arrays"] == 0
    assert closing_arenas() == closing  # the move was the last arena block
    del x


def test_threads_started_in_the_block_follow_the_interpreter():
    # CPython 3.10-3.13 start a thread with an empty context: NumPy's default handler.  3.14 can make
    # threads inherit their starter's context (sys.flags.thread_inherit_context).
    inherits = bool(getattr(sys.flags, "thread_inherit_context", 0))
    names = []
    with arenalib.Arena() as a, a.numpy():
        t = threading.Thread(target=lambda: names.append(get_handler_name(np.ones(3))))
        t.start()
        t.join()
    assert names == [HANDLER_NAME if inherits else "default_allocator"]


def test_a_copied_context_runs_in_other_threads_with_the_arena(arena):
    with arena.numpy():
        context = contextvars.copy_context()
    made = run_threads(lambda i: context.copy().run(np.full, 1000, i), 4)
    assert [int(m[0]) for m in made] == [0, 1, 2, 3] and arrays(arena) == 4
    del made


# -- threads -----------------------------------------------------------------------------------------


def test_frees_from_many_threads(arena):
    with arena.numpy():
        batches = [[np.full(n, i, dtype=np.int32) for n in (10, 1000, 100_000)] for i in range(8)]
    expected = arena.stats()["numpy_bytes"]
    assert arrays(arena) == 24 and expected == 8 * 101_010 * 4

    def drop(i):
        ok = all((x == i).all() for x in batches[i])
        batches[i] = None
        return ok

    assert run_threads(drop, 8) == [True] * 8
    assert arrays(arena) == 0 and arena.stats()["numpy_bytes"] == 0
    assert arena.stats()["live_bytes"] == 0


def test_one_scope_entered_and_exited_by_threads_at_once(arena):
    # Misuse (a scope object shared by threads): refusals and handlers restored in the wrong context
    # are the price, never a crash (with the GIL off the fields change under a critical section).
    scope = arena.numpy()

    def hammer(i):
        for _ in range(300):
            try:
                scope.__enter__()
            except RuntimeError:
                pass
            x = np.ones(10)
            try:
                scope.__exit__(None, None, None)
            except RuntimeError as exc:  # entered by another thread: its context, not this one
                assert "another context" in str(exc)
            del x
        return get_handler_name()

    assert set(run_threads(hammer, 4)) <= {"default_allocator", HANDLER_NAME}
    assert get_handler_name() == "default_allocator" and arrays(arena) == 0


SCOPE_IN_TURNS = """
import sys, threading
from numpy._core.multiarray import get_handler_name
import arenalib
arena = arenalib.Arena()
scope = arena.numpy()
rounds = int(sys.argv[1])
barrier = threading.Barrier(2)
wrong = []

def turns(k):
    barrier.wait()
    for r in range(rounds):
        try:
            with scope:
                pass
        except RuntimeError as exc:
            if "entered already" not in str(exc):
                wrong.append((k, r, str(exc)[:80]))
        except Exception as exc:
            wrong.append((k, r, repr(exc)[:80]))
    if get_handler_name() != "default_allocator":
        wrong.append((k, "handler", get_handler_name()))

threads = [threading.Thread(target=turns, args=(k,)) for k in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with scope:
    inside = get_handler_name()
print(len(wrong), wrong[:3], repr(scope), inside)
"""


def test_one_scope_used_by_threads_in_turn_is_refused_only_while_another_is_in_it():
    """Each thread enters and ends the shared scope in its own context: an entry while another
    thread is in the block (or ending it) is refused with "entered already", nothing else.  With the
    GIL off, an entry during another thread's exit replaced the fields that exit was reading: false
    "another context" errors, a Token error, the arena's handler left current in a thread for good
    and the scope refused for good (5 runs of 5 of this script)."""
    out = assert_ok(run_python(SCOPE_IN_TURNS, "20000" if FREE_THREADED else "3000", timeout=240))
    assert out.startswith("0 [] ") and "not entered" in out and out.rstrip().endswith(HANDLER_NAME), out


def test_an_exit_from_another_thread_leaves_the_block_to_its_own_end(arena):
    """Another thread's exit of a scope whose block is running is refused and leaves the block's
    own end working: it made that end a silent no-op, the arena's handler current in the block's
    thread for good, and the scope refused for good."""
    scope = arena.numpy()
    inside, refused = threading.Event(), threading.Event()
    seen = {}

    def block(index):
        if index == 0:
            with scope:
                inside.set()
                refused.wait()
                seen["inside"] = get_handler_name()
            seen["after"] = get_handler_name()
        else:
            inside.wait()
            with pytest.raises(RuntimeError, match="another context"):
                scope.__exit__(None, None, None)
            refused.set()

    run_threads(block, 2)
    assert seen == {"inside": HANDLER_NAME, "after": "default_allocator"}
    assert "not entered" in repr(scope)
    with scope:
        x = np.ones(10)
    assert arrays(arena) == 1
    del x


def test_a_foreign_value_in_the_scope_chains_variable_is_no_chain(arena):
    """The chain's ContextVar is reachable by walking a context: a value set there by other code was
    read as a link (a crash at the scope's end)."""
    scope = arena.numpy()

    def tampered():
        scope.__enter__()
        var = next(v for v in contextvars.copy_context() if v.name == "arenalib_numpy_scopes")
        var.set(12345)
        scope.__exit__(None, None, None)  # not found in the chain: ended out of order

    contextvars.copy_context().run(tampered)  # (whose handler stays the arena's: left there)
    assert "ended out of order" in repr(scope) and get_handler_name() == "default_allocator"


def test_threads_allocate_free_and_race_a_deferred_close():
    closing = closing_arenas()
    # Each round: threads make and drop arrays in the arena's context while the main thread closes
    # it (refused while an array lives), then closes deferred; the last array's free, from
    # whichever thread, completes the close, and what comes after falls back to NumPy's default.
    for _ in range(10):
        a = arenalib.Arena()
        with a.numpy():
            context = contextvars.copy_context()
        started = threading.Event()

        def work(i, context=context, started=started):
            run = context.copy().run  # a context is entered by one thread at a time
            kept = []
            for j in range(200):
                x = run(np.full, 1 + (i * 7919 + j * 104729) % 20_000, j, dtype=np.int32)
                started.set()
                assert x[0] == j and x[-1] == j
                if j % 10 == 0:
                    kept.append(x)
            return all((x == x[0]).all() for x in kept)

        results = []
        t = threading.Thread(target=lambda results=results, work=work: results.append(run_threads(work, 4)))
        t.start()
        started.wait()
        for _ in range(20):
            try:
                a.close()
            except BufferError:
                continue
        a.close(deferred=True)
        t.join()
        assert results == [[True] * 4]
        stats = a.stats()
        assert stats["closed"] and stats["numpy_arrays"] == 0
    assert closing_arenas() == closing


# -- re-entrancy, fork, the process-wide operations ---------------------------------------------------


def test_finalizers_that_enter_scopes_while_other_threads_enter_and_leave_theirs():
    # On 3.10 and 3.11 a collection can start inside a ContextVar.set()'s own allocations; a finalizer
    # it runs that sets a context variable (enters a numpy() scope) freed the table that set was
    # walking (CPython gh-148891): this crashed every run before the scope held the collector off
    # around NumPy's PyDataMem_SetHandler.  3.12 on collect between bytecodes only.
    out = assert_ok(run_python("""
        import gc, threading
        import numpy as np
        import arenalib
        arenas = [arenalib.Arena() for _ in range(3)]
        kept = []
        class Finalized:
            count = 0
            def __init__(self):
                self.cycle = self  # only a collection frees it
            def __del__(self):
                Finalized.count += 1
                with arenas[Finalized.count % 3].numpy():
                    made = [np.ones(n) for n in (1, 20, 200, 20000)]
                    if Finalized.count % 2:
                        kept.append(made[Finalized.count % 4])
        def loop():
            for i in range(1000):
                with arenas[i % 3].numpy():
                    Finalized()
                    arrays = [np.ones(n) for n in (1, 3, 50, 128, 1000, 17000, 140000)]
                    Finalized().array = arrays[2]
                    joined = np.concatenate(arrays)
                    assert joined.sum() == sum(a.size for a in arrays)
                    if i % 5 == 0:
                        kept.append(joined)
                    if len(kept) > 30:
                        del kept[:10]
        gc.set_threshold(1, 1, 1)
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gc.set_threshold(700, 10, 10)
        print("finalizers", Finalized.count > 0)
    """))
    assert out.split() == ["finalizers", "True"]

def test_a_finalizer_that_closes_the_arena_during_allocations():
    closing, arrays_before = closing_arenas(), arenalib.live_objects()["numpy_arrays"]
    # With gc.set_threshold(1) a collection can run at any object NumPy makes (before it allocates the
    # data, or after), and a finalizer there closes or resets the arena: the handler sees the arena
    # closed or open, never half-closed, and the arrays made either way stay valid.
    class Closer:
        def __init__(self, arena, how):
            self.arena, self.how = arena, how
            self.cycle = self

        def __del__(self):
            try:
                self.arena.reset() if self.how == "reset" else self.arena.close(deferred=True)
            except BufferError:
                pass

    threshold = gc.get_threshold()
    for how in ("reset", "close"):
        a = arenalib.Arena()
        kept = []
        gc.set_threshold(1)
        try:
            with a.numpy():
                for i in range(300):
                    Closer(a, how)
                    x = np.full(1 + i * 37 % 5000, i, dtype=np.int16)
                    if how == "close" and i % 7 == 0:
                        kept.append(x)
                    y = x + 1
                    assert (y == i + 1).all()
                    del x, y
        finally:
            gc.set_threshold(*threshold)
        gc.collect()
        assert all((x == x[0]).all() for x in kept)
        stats = a.stats()
        if how == "close":  # closed at the first collection: the later arrays are NumPy's default's
            assert stats["closed"] and stats["numpy_arrays"] <= len(kept)
            # (3.13t's collector skips young collections while few objects are new: none may run.)
            assert stats["numpy_fallbacks"] > 100 or FREE_THREADED
        else:
            assert not stats["closed"] and stats["numpy_arrays"] == 0
        del kept
        assert a.stats()["numpy_arrays"] == 0
        a.close()
    assert closing_arenas() == closing and arenalib.live_objects()["numpy_arrays"] == arrays_before


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_forked_child_frees_makes_and_closes_its_copy(arena):
    with arena.numpy():
        x = np.full(100_000, 3, dtype=np.int64)
    closing = closing_arenas()
    pid = os.fork()
    if pid == 0:
        try:
            ok = int(x.sum()) == 300_000
            with arena.numpy():
                y = np.ones(1000)
            del x
            ok = ok and arena.stats()["numpy_arrays"] == 1 and float(y.sum()) == 1000.0
            arena.close(deferred=True)
            del y
            ok = ok and closing_arenas() == closing
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert int(x.sum()) == 300_000 and arrays(arena) == 1
    del x


def test_process_wide_operations_leave_live_arrays_alone():
    closing = closing_arenas()
    retention = arenalib.get_retention()
    with arenalib.Arena() as a, a.numpy():
        big = np.full(3 * MiB // 8, 5.0)
        small = np.full(100, 6.0)
        a.purge()
        for n in (0, 1 << 20):
            arenalib.set_retention(n)
            arenalib.trim()
        temporary = big * 2
        del temporary
        a.purge()
    try:
        others = [arenalib.Arena() for _ in range(6)]  # take and give back slots meanwhile
        for other in others:
            with other.numpy():
                np.ones(100_000)
            other.close()
        arenalib.set_retention(0)
        arenalib.trim()
    finally:
        arenalib.set_retention(retention)
    assert (big == 5.0).all() and (small == 6.0).all()
    del big, small
    assert closing_arenas() == closing


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds ``address`` (/proc/self/smaps)."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = lo <= address < hi
            elif head == "VmFlags:" and current:
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return next((w[1:-1] for w in f.read().split() if w.startswith("[")), None)
    except OSError:
        return None


@pytest.mark.skipif(thp_mode() != "madvise", reason="huge pages are advised where THP is in madvise mode")
def test_big_arrays_get_the_huge_page_advice_numpys_handler_gives(arena):
    # NumPy's default handler advises MADV_HUGEPAGE from 4 MiB on; arenalib's from 2 MiB on, on a
    # 2 MiB boundary (a 2 MiB array is one huge page), and takes the advice back when the block goes
    # back to the arena.
    was = np._core.multiarray._set_madvise_hugepage(True)
    try:
        with arena.numpy():
            big = np.ones(MiB)  # 8 MiB
            two = np.ones(2 * MiB, dtype=np.uint8)
            under = np.ones(2 * MiB - 4096, dtype=np.uint8)
            odd = np.zeros(3_000_000, dtype=np.uint8)  # a block with a header: zeroed after the advice
            small = np.ones(1000)
        middle = big.ctypes.data + 4 * MiB
        assert "hg" in vm_flags(middle) and "hg" not in vm_flags(small.ctypes.data)
        assert big.ctypes.data % (2 * MiB) == 0  # (a big block has no header: its data is the block)
        assert two.ctypes.data % (2 * MiB) == 0 and "hg" in vm_flags(two.ctypes.data + MiB)
        assert "hg" not in vm_flags(under.ctypes.data + MiB)  # (no huge page fits)
        assert is_lead(odd.ctypes.data % (2 * MiB)) and "hg" in vm_flags(odd.ctypes.data + MiB)
        assert not odd.any()
        odd_middle = odd.ctypes.data + MiB
        del odd
        assert "hg" not in vm_flags(odd_middle)
        del big
        assert "hg" not in vm_flags(middle)
        two.resize(MiB, refcheck=False)  # under 2 MiB: the advice goes with it
        assert "hg" not in vm_flags(two.ctypes.data)
        assert (two == 1).all() and (under == 1).all()
        del two, under
        np._core.multiarray._set_madvise_hugepage(False)
        with arena.numpy():  # NumPy's switch is read when the scope is entered
            plain = np.ones(MiB)
        assert "hg" not in vm_flags(plain.ctypes.data + 4 * MiB)
    finally:
        np._core.multiarray._set_madvise_hugepage(was)
    del small, plain


# -- tracemalloc ---------------------------------------------------------------------------------------


def arenalib_traces():
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, arenalib.TRACEMALLOC_DOMAIN)])
    return sorted(t.size for t in snapshot.traces)


def test_tracemalloc_sees_the_arrays_in_arenalibs_domain(arena):
    tracemalloc.start()
    try:
        with arena.numpy():
            x = np.ones(12_345, dtype=np.uint8)
            y = np.ones(100, dtype=np.float64)
        assert arenalib_traces() == [800, 12_345]
        x.resize(50_000, refcheck=False)
        assert arenalib_traces() == [800, 50_000]
        del x
        assert arenalib_traces() == [800]
    finally:
        tracemalloc.stop()
    del y



def test_tracemalloc_sees_the_arrays_made_while_it_traces_and_no_other(arena):
    # The handler reads tracemalloc's flag itself (src/tracemalloc.h): started and stopped inside a
    # scope, over and over, it must see each array made while it traces, on each of the handler's
    # paths (a fresh small block, a kept one, a page-aligned big block), and nothing else.
    sizes = [100, 100_000, 300_000]
    with arena.numpy():
        for _ in range(3):
            dropped = [np.ones(n, dtype=np.uint8) for n in sizes]
            del dropped  # (the small block is kept, and handed out again below)
            untraced = np.ones(50, dtype=np.uint8)
            assert not tracemalloc.is_tracing()
            tracemalloc.start()
            try:
                traced = [np.ones(n, dtype=np.uint8) for n in sizes]
                assert arenalib_traces() == sizes
                del untraced  # made before the start: its free changes nothing
                assert arenalib_traces() == sizes
                traced[1].resize(200_000, refcheck=False)
                assert arenalib_traces() == [100, 200_000, 300_000]
                traced.pop()
                assert arenalib_traces() == [100, 200_000]
            finally:
                tracemalloc.stop()
            untraced = [np.ones(n, dtype=np.uint8) for n in sizes]
            del traced, untraced
            tracemalloc.start()
            try:
                assert arenalib_traces() == []
            finally:
                tracemalloc.stop()

# -- the handler's functions, called as NumPy calls them ---------------------------------------------


class _Allocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p),
                ("malloc", ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)),
                ("calloc", ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                             ctypes.c_size_t)),
                ("realloc", ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                              ctypes.c_size_t)),
                ("free", ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t))]


class _Handler(ctypes.Structure):  # NEP 49's PyDataMem_Handler, version 1
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", _Allocator)]


def handler_struct(capsule) -> _Allocator:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    handler = _Handler.from_address(get(capsule, b"mem_handler"))
    assert handler.name == HANDLER_NAME.encode() and handler.version == 1
    return handler.allocator


def test_the_handlers_functions_directly(arena):
    capsule = arenalib.numpy_handler(arena)
    h = handler_struct(capsule)
    p = h.malloc(h.ctx, 100)
    ctypes.memset(p, 1, 100)
    p = h.realloc(h.ctx, p, 10_000)  # moves or grows: the first 100 bytes kept
    assert ctypes.string_at(p, 100) == b"\x01" * 100
    q = h.calloc(h.ctx, 10, 10)
    assert ctypes.string_at(q, 100) == bytes(100)
    r = h.realloc(h.ctx, None, 10)  # realloc of NULL is a malloc
    assert arena.stats()["numpy_arrays"] == 3
    assert h.calloc(h.ctx, 1 << 62, 8) is None  # overflows: NULL, nothing counted
    assert h.malloc(h.ctx, sys.maxsize) is None
    assert h.realloc(h.ctx, p, sys.maxsize) is None and ctypes.string_at(p, 100) == b"\x01" * 100
    for block in (p, q, r):
        h.free(h.ctx, block, 12345)  # NumPy's size is not trusted
    h.free(h.ctx, None, 0)
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0
    del capsule


BIG = 128 * 1024 + 1  # from here on a block is page-aligned (arenalib/src/numpy_large.h)


def size_class(n):
    """jemalloc's size class of n bytes past its small ones (16 KiB): four a doubling."""
    k = (n - 1).bit_length() - 1  # 2**k < n <= 2**(k + 1)
    step = 1 << (k - 2)
    return -(-n // step) * step


def header_fits(n):
    return size_class(n + 16) == size_class(n)


def _numpy_vector_bytes():
    features = getattr(np._core._multiarray_umath, "__cpu_features__", {})
    return 64 if features.get("AVX512_SKX") is True else 16


# Where a big block with a header has its data: on a cache line where NumPy's loops use 64-byte
# vectors (and the class has room), else right after the header (src/numpy_large.h).
LEAD = _numpy_vector_bytes()


def lead_of(n):
    """The bytes before the data of a new big array of n bytes (0: no header)."""
    room = size_class(n) - n
    return LEAD if room >= LEAD else 16 if room >= 16 else 0


def is_lead(offset):
    """Whether a big block's data may start ``offset`` bytes into its page (after a header)."""
    return offset in (16, LEAD)


@pytest.mark.parametrize("n", [16384, 65536, BIG - 17, BIG - 1, BIG, BIG + 15, 200_000, 229_376, 1_500_000,
                               MiB, MiB + 1, 3 * MiB, 5 * MiB - 16, 5 * MiB - 15, 5 * MiB - 63,
                               5 * MiB - 64, 5 * MiB - 100])
def test_a_big_arrays_data_starts_after_a_header_within_its_class_or_on_its_page(arena, n):
    # After a header, where the size class has room for one: on a cache line, 64 bytes in, where
    # NumPy's loops use 64-byte vectors and the class has room for that, else 16 bytes in (the
    # whole lead in the class's room: no bigger class); on the page, with no header, where the
    # array's size is its class's own (so that it takes that class).
    with arena.numpy():
        small = [np.empty(k, dtype=np.uint8) for k in range(0, 5000, 16)]  # every 16-byte class
        big = np.empty(n, dtype=np.uint8)
    header = 16 if n < BIG else lead_of(n)
    if n >= BIG:
        assert big.ctypes.data % 4096 == header
    big[:] = 7
    stats = arena.stats()
    assert stats["numpy_bytes"] == n + sum(a.size or 1 for a in small)  # (an empty array's block: 1 byte)
    before = stats["live_bytes"]
    del big
    assert before - arena.stats()["live_bytes"] == n + header
    del small
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0


@pytest.mark.skipif(LEAD != 64, reason="NumPy's loops use 64-byte vectors only with AVX-512")
def test_big_arrays_start_on_a_cache_line_where_numpys_loops_use_avx512():
    # Where the class has room for it: 200,000 bytes (class 229,376) has; 229,336 (room 40) has room
    # for the header alone.  The loop c = a*b + a at 1.5-10 MB took 1.03x NumPy's default handler's
    # time with the data 16 bytes in, 0.97-0.99x on a line (a Zen 4 host, 2026-12-06).
    with arenalib.Arena() as arena, arena.numpy():
        roomy = np.ones(200_000, dtype=np.uint8)
        tight = np.ones(229_336, dtype=np.uint8)
        assert roomy.ctypes.data % 4096 == 64 and tight.ctypes.data % 4096 == 16
        assert arena.stats()["live_bytes"] == 200_000 + 64 + 229_336 + 16
        c = roomy * 2 + roomy  # temporaries too
        assert c.ctypes.data % 4096 == 64 and (c == 3).all()
        del roomy, tight, c
        assert arena.stats()["live_bytes"] == 0


@pytest.mark.parametrize(("avx512", "lead"), [(True, 64), (False, 16), (None, 16)])
def test_the_lead_follows_numpys_cpu_features(avx512, lead):
    # The choice is NumPy's (the kernels it dispatches), read when arenalib first loads NumPy's API:
    # a child process whose NumPy says otherwise (None: a NumPy without the key).
    out = assert_ok(run_python(f"""
        import numpy as np
        umath = np._core._multiarray_umath
        features = dict(umath.__cpu_features__)
        features.pop("AVX512_SKX", None)
        if {avx512!r} is not None:
            features["AVX512_SKX"] = {avx512!r}
        umath.__cpu_features__ = features
        import arenalib
        with arenalib.Arena() as arena, arena.numpy():
            x = np.full(200_000, 7, dtype=np.uint8)
            print(x.ctypes.data % 4096, arena.stats()["live_bytes"], int(x.sum()))
            del x
    """))
    assert out.split() == [str(lead), str(200_000 + lead), str(7 * 200_000)]


def test_a_big_block_with_a_header_resizes_in_place_and_moves_to_change_kind(arena):
    expected = np.arange(1_500_000, dtype=np.uint8)
    with arena.numpy():
        x = expected.copy()
    address = x.ctypes.data
    lead = address % 4096
    assert is_lead(lead) and arena.stats()["live_bytes"] == 1_500_000 + lead
    x.resize(1_400_000, refcheck=False)  # the same size class (1.5 MiB): in place
    assert x.ctypes.data == address and (x == expected[:1_400_000]).all()
    assert arena.stats()["live_bytes"] == 1_400_000 + lead and arena.stats()["numpy_bytes"] == 1_400_000
    x.resize(MiB, refcheck=False)  # a class's own size: no room for a header, so a block with none
    assert x.ctypes.data % 4096 == 0 and (x == expected[:MiB]).all()
    assert arena.stats()["live_bytes"] == MiB and arena.stats()["numpy_arrays"] == 1
    x.resize(1_500_000, refcheck=False)  # a block with none stays one (in place where jemalloc can)
    assert x.ctypes.data % 4096 == 0 and (x[:MiB] == expected[:MiB]).all() and not x[MiB:].any()
    assert arena.stats()["live_bytes"] == 1_500_000
    del x
    with arena.numpy():
        y = expected.copy()
    y.resize(5000, refcheck=False)  # under BIG: a small block (with its rounding)
    assert (y == expected[:5000]).all() and y.ctypes.data % 4096 != 0
    assert 5000 + 16 <= arena.stats()["live_bytes"] < 5000 + 32
    del y
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0


def test_a_big_block_with_a_header_through_the_handlers_functions(arena):
    capsule = arenalib.numpy_handler(arena)  # alive while its functions are called
    h = handler_struct(capsule)
    p = h.malloc(h.ctx, 1_500_000)
    assert is_lead(p % 4096)
    ctypes.memset(p, 0x42, 1_500_000)
    q = h.realloc(h.ctx, p, 3_000_000)  # grown (moved or not), bytes kept
    assert ctypes.string_at(q, 1_500_000) == b"\x42" * 1_500_000 and is_lead(q % 4096)
    assert arena.stats()["numpy_bytes"] == 3_000_000
    assert arena.stats()["live_bytes"] == 3_000_000 + q % 4096
    h.free(h.ctx, q, 0)
    h.free(h.ctx, q, 0)  # a second free finds no tag: nothing happens
    z = h.calloc(h.ctx, 3, 1_000_000)
    assert ctypes.string_at(z, 3_000_000) == bytes(3_000_000)
    h.free(h.ctx, z, 0)
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0
    del capsule


@pytest.mark.parametrize("n", [200_000, 1_500_000, MiB])  # with a header, with one, without
def test_the_old_address_of_a_big_block_moved_by_a_realloc_is_left_alone(arena, n):
    # jemalloc's move copied a header's tag too, and freed the old block with it: a stale pointer
    # then read as a live block, and its free gave jemalloc the block a second time (a crash; an
    # attack found it, 2026-12-06).  As after a free, the old address has no tag or record now.
    capsule = arenalib.numpy_handler(arena)
    h = handler_struct(capsule)
    # A block with another live one less than 2n after it cannot grow in place to 2n: the realloc
    # moves it.  (One neighbour allocated next was not always after it: jemalloc places extents as
    # it likes, and under ASan a block grew in place.)
    blocks = sorted(h.malloc(h.ctx, n) for _ in range(8))
    movable = [a for a, b in itertools.pairwise(blocks) if b - a < 2 * n]
    assert movable, [hex(a) for a in blocks]
    p = movable[0]
    ctypes.memset(p, 0x37, n)
    q = h.realloc(h.ctx, p, 2 * n)
    assert q != p and ctypes.string_at(q, n) == b"\x37" * n
    books = arena.stats()
    h.free(h.ctx, p, 0)
    assert h.realloc(h.ctx, p, n + 4096) is None
    stats = arena.stats()
    assert [stats[k] for k in ("numpy_arrays", "numpy_bytes", "live_bytes")] == [
        books[k] for k in ("numpy_arrays", "numpy_bytes", "live_bytes")] and stats["numpy_arrays"] == 8
    for block in [q] + [b for b in blocks if b != p]:
        h.free(h.ctx, block, 0)
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0
    del capsule


def test_a_power_of_two_array_takes_its_own_size_class_not_the_next(arena):
    # With a 16-byte header in front, a 1 MiB array took jemalloc's 1.25 MiB class.
    before = arena.stats()["active"]
    with arena.numpy():
        arrays = [np.ones(MiB // 8) for _ in range(8)]
    grown = arena.stats()["active"] - before
    assert 8 * MiB <= grown <= 8 * (MiB + 2 * 4096)  # (jemalloc's cache-oblivious page, at most)
    del arrays


@pytest.mark.parametrize(("first", "then"), [(100, BIG * 4), (BIG * 4, 100), (BIG * 4, BIG * 64),
                                              (BIG * 64, BIG * 4), (BIG, BIG - 1), (BIG - 1, BIG),
                                              (20_000, BIG + 5000)])
def test_resizes_across_the_big_block_edge_keep_the_bytes_and_the_books(arena, first, then):
    with arena.numpy():
        x = np.arange(first, dtype=np.uint8)
    expected = np.arange(first, dtype=np.uint8)
    x.resize(then, refcheck=False)
    keep = min(first, then)
    assert (x[:keep] == expected[:keep]).all() and not x[keep:].any()
    stats = arena.stats()
    assert stats["numpy_arrays"] == 1 and stats["numpy_bytes"] == then
    header = stats["live_bytes"] - then  # a block's header (and a small one's rounding), or none
    if then < BIG:
        assert 16 <= header < 32
    else:  # a big block keeps its kind where it can, resized in place: either kind is right
        assert x.ctypes.data % 4096 == header and (header == 0 or is_lead(header))
        assert header or not header_fits(then) or first >= BIG
    del x
    assert arena.stats()["numpy_bytes"] == 0 and arena.stats()["live_bytes"] == 0


def test_a_big_block_resized_after_a_deferred_close_moves_to_numpys_default(arena):
    with arena.numpy():
        x = np.arange(BIG * 2, dtype=np.uint8)
    arena.close(deferred=True)
    x.resize(BIG * 8, refcheck=False)  # the arena's block goes, the bytes move to NumPy's default
    assert (x[:BIG * 2] == np.arange(BIG * 2, dtype=np.uint8)).all() and not x[BIG * 2:].any()
    stats = arena.stats()
    assert arena.closed and stats["numpy_fallbacks"] == 1 and stats["numpy_arrays"] == 0
    assert stats["exports"] == 0 and stats["held_bytes"] == 0  # its last array's block was that one
    del x


@pytest.mark.parametrize("n", [32, 64, 96])  # (blocks of 48, 80, 112 bytes: the classes where it happens)
def test_thousands_of_live_small_arrays_some_on_a_page_boundary(arena, n):
    # About one region in 256 of a slab puts a small block's data on a page, as a big block's always
    # is: free() looks such an address up in the big blocks' table first, then reads the header.
    # (A version that refused such blocks failed every allocation of the 48-, 80- and 112-byte
    # classes after ~600 live arrays.)
    with arena.numpy():
        arrays = [np.full(n, i % 251, dtype=np.uint8) for i in range(5000)]
    assert any(a.ctypes.data % 4096 == 0 for a in arrays)
    assert all((a == i % 251).all() for i, a in enumerate(arrays))
    stats = arena.stats()
    assert stats["numpy_arrays"] == 5000 and stats["numpy_bytes"] == 5000 * n
    resized = [a for i, a in enumerate(arrays) if i % 2 or a.ctypes.data % 4096 == 0]
    for a in resized:  # moved: the old block's record and header read as at a free
        a.resize(n * 3, refcheck=False)
    stats = arena.stats()
    assert stats["numpy_arrays"] == 5000 and stats["numpy_bytes"] == (5000 + 2 * len(resized)) * n
    del arrays, resized, a
    assert arena.stats()["numpy_arrays"] == 0 and arena.stats()["live_bytes"] == 0
    assert arena.stats()["numpy_bytes"] == 0


def test_small_blocks_on_a_page_boundary_through_the_handlers_functions(arena):
    # Their records say they have a header: a realloc moves them with the header's size (a version
    # read the record's flagged size into the books: UBSan's signed overflow), a second free finds
    # no record.
    capsule = arenalib.numpy_handler(arena)
    h = handler_struct(capsule)
    blocks = [h.malloc(h.ctx, 32) for _ in range(3000)]
    aligned = [p for p in blocks if p % 4096 == 0]
    assert aligned
    ctypes.memset(aligned[0], 0x5A, 32)
    moved = h.realloc(h.ctx, aligned[0], 96)
    assert ctypes.string_at(moved, 32) == b"\x5a" * 32
    stats = arena.stats()
    assert stats["numpy_bytes"] == 2999 * 32 + 96 and stats["numpy_arrays"] == 3000
    h.free(h.ctx, aligned[-1], 0)
    h.free(h.ctx, aligned[-1], 0)  # no record left: nothing happens
    assert arena.stats()["numpy_arrays"] == 2999
    for p in [moved] + [p for p in blocks if p not in (aligned[0], aligned[-1])]:
        h.free(h.ctx, p, 0)
    stats = arena.stats()
    assert stats["numpy_arrays"] == 0 and stats["numpy_bytes"] == 0 and stats["live_bytes"] == 0
    del capsule


def test_a_block_the_handler_never_made_is_left_alone(arena):
    capsule = arenalib.numpy_handler(arena)  # alive while its functions are called
    h = handler_struct(capsule)
    foreign = ctypes.create_string_buffer(b"\xee" * 64)
    data = ctypes.addressof(foreign) + 16
    h.free(h.ctx, data, 48)
    assert h.realloc(h.ctx, data, 100) is None
    assert foreign.raw[:64] == b"\xee" * 64
    before = arena.stats()
    p = h.malloc(h.ctx, 100)
    h.free(h.ctx, p, 100)
    h.free(h.ctx, p, 100)  # a second free of the same block finds no tag: nothing happens
    big = h.malloc(h.ctx, 1 << 20)  # a big block: no header, recorded in the arena's table
    h.free(h.ctx, big, 0)
    h.free(h.ctx, big, 0)  # a second free finds no record: nothing happens
    page = ctypes.create_string_buffer(3 * 4096)
    aligned = (ctypes.addressof(page) + 4095) // 4096 * 4096 + 4096
    ctypes.memset(aligned - 4096, 0xEE, 2 * 4096)
    h.free(h.ctx, aligned, 4096)  # page-aligned and not in the table: not the handler's
    assert h.realloc(h.ctx, aligned, 100) is None
    assert ctypes.string_at(aligned - 4096, 2 * 4096) == b"\xee" * (2 * 4096)
    # ... and not even read before: here the page before it is not mapped.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = libc.mmap(None, 2 * 4096, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    assert libc.munmap(pages, 4096) == 0
    h.free(h.ctx, pages + 4096, 0)
    assert h.realloc(h.ctx, pages + 4096, 100) is None
    libc.munmap(pages + 4096, 4096)
    after = arena.stats()
    assert after["numpy_arrays"] == 0 and after["live_segments"] == before["live_segments"]
    assert after["live_bytes"] == before["live_bytes"]
    del capsule


# -- NumPy's C API, as arenalib reads it --------------------------------------------------------------


def test_the_c_api_entries_are_those_of_the_installed_numpys_header():
    # arenalib reads NumPy's C-API table at run time, by index (src/numpy.h): the indices must be the
    # ones the installed NumPy's own header gives its functions.
    header = Path(np.get_include()) / "numpy" / "__multiarray_api.h"
    text = header.read_text()
    ours = dict(re.findall(r"#define ARENALIB_NP_(\w+) (\d+)\b",
                           (ROOT / "arenalib" / "src" / "numpy.h").read_text()))
    names = {"GET_ABI_VERSION": "PyArray_GetNDArrayCVersion",
             "GET_FEATURE_VERSION": "PyArray_GetNDArrayCFeatureVersion",
             "SET_HANDLER": "PyDataMem_SetHandler", "GET_HANDLER": "PyDataMem_GetHandler",
             "DEFAULT_HANDLER": "PyDataMem_DefaultHandler"}
    assert set(ours) == set(names)
    for key, name in names.items():
        found = re.search(rf"#define {name}\b[^#]*?PyArray_API\[(\d+)\]", text)
        assert found, f"{name} is not in {header}"
        assert int(found.group(1)) == int(ours[key]), (name, found.group(1), ours[key])
    # ... and the handler struct, its layout (version 1) as src/numpy.h declares it.
    types = (Path(np.get_include()) / "numpy" / "ndarraytypes.h").read_text()
    assert re.search(r"char name\[127\];.*\n\s*uint8_t version;.*\n\s*PyDataMemAllocator allocator;", types)


# -- NumPy absent or too old ----------------------------------------------------------------------------


def test_without_numpy_the_error_says_so():
    out = assert_ok(run_python("""
        import sys
        sys.modules["numpy"] = None  # import numpy raises ImportError
        import arenalib
        for call in (lambda: arenalib.Arena().numpy(), lambda: arenalib.numpy_handler(arenalib.Arena())):
            try:
                call()
            except ImportError as e:
                print("ImportError:", e)
    """))
    assert out.count("need NumPy 1.22 or newer") == 2 and out.count("import of numpy halted") == 2


def test_an_exception_during_numpy_s_first_import_is_not_taken_for_a_missing_numpy():
    """The first arena.numpy() imports NumPy: a signal handler's exception there (or a
    MemoryError) went out as ImportError("... need NumPy 1.22 or newer ...")."""
    out = assert_ok(run_python("""
        import builtins, importlib, sys
        import arenalib
        sys.modules.pop("numpy", None)
        real = importlib.import_module

        def interrupted(name, *args):
            if name == "numpy":
                raise TimeoutError("deadline (as from a SIGALRM handler)")
            return real(name, *args)

        importlib.import_module = interrupted
        try:
            arenalib.Arena().numpy()
        except Exception as e:
            print(type(e).__name__, e)
        importlib.import_module = real
        with arenalib.Arena() as arena, arena.numpy():
            import numpy
            print("then", numpy.ones(4).sum())
    """))
    assert out.split("\n")[0] == "TimeoutError deadline (as from a SIGALRM handler)", out
    assert "then 4.0" in out


def test_a_numpy_older_than_1_22_is_refused():
    # A stand-in for NumPy 1.21's C API: the table's version functions say ABI 1, C API 0x0e.
    out = assert_ok(run_python("""
        import ctypes, sys, types
        VERSION = ctypes.CFUNCTYPE(ctypes.c_uint)
        abi, feature = VERSION(lambda: 0x01000009), VERSION(lambda: 0x0E)
        table = (ctypes.c_void_p * 400)()
        table[0] = ctypes.cast(abi, ctypes.c_void_p).value
        table[211] = ctypes.cast(feature, ctypes.c_void_p).value
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        umath = types.ModuleType("numpy._core._multiarray_umath")
        umath._ARRAY_API = new(ctypes.addressof(table), None, None)
        numpy = types.ModuleType("numpy")
        numpy.__version__ = "1.21.6"
        core = types.ModuleType("numpy._core")
        core._multiarray_umath = umath
        numpy._core = core
        sys.modules.update({"numpy": numpy, "numpy._core": core, "numpy._core._multiarray_umath": umath})
        import arenalib
        try:
            arenalib.Arena().numpy()
        except ImportError as e:
            print("ImportError:", e)
    """))
    assert "NumPy 1.21.6 has C API 0xe (1.22 is 0xf)" in out


# -- memory ------------------------------------------------------------------------------------------


@pytest.mark.skipif(SANITIZED, reason="ASan's quarantine keeps freed memory resident")
def test_the_memory_goes_back_at_the_end_of_the_scope():
    before = settled_rss()
    with arenalib.Arena() as a, a.numpy():
        x = np.ones(8 * MiB)  # 64 MiB
        for _ in range(3):
            x = x * 2 + 1
        during = settled_rss()
        del x
    after = settled_rss()
    # Measured from `during`, not `before`: memory this process freed before the scope (Python's
    # allocator, an earlier test's dirty pages) may go back to the OS meanwhile (3.13t, 2026-12-05:
    # during - before was 56.6 MB with the 64 MiB array alive).
    assert during - after > 60 * MiB
    assert after < before + 8 * MiB


@pytest.mark.skipif(FREE_THREADED, reason="the cache is the GIL's: a free-threaded build keeps none")
@pytest.mark.parametrize("how", ["with", "close", "deferred", "collected"])
def test_the_small_blocks_the_handler_keeps_go_back_at_close(how):
    # They are out of the books, so a close that left them to the slot left garbage nothing counted:
    # every `with Arena() as a, a.numpy():` that dropped small arrays leaked ~34 KiB in the reused slot.
    def scope():
        a = arenalib.Arena()
        with a.numpy():
            for n in range(16, 1025, 16):  # a dead array per bucket: each block kept
                np.empty(n, dtype=np.uint8)
            alive = np.ones(10) if how == "deferred" else None
        assert a.stats()["numpy_cached_bytes"] > 30_000
        active = a.stats()["active"]
        if how == "with":
            with a:
                pass
        elif how == "close":
            a.close()
        elif how == "deferred":
            a.close(deferred=True)
            del alive
        else:
            with pytest.warns(ResourceWarning):
                del a
                gc.collect()
        return active

    first = scope()
    for _ in range(200):
        last = scope()
    assert last - first < 1 << 20  # 200 leaks of ~34 KiB each would be 7 MiB
