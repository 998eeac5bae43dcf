"""Threads: one Arena shared by four threads; arenas closed under other threads' feet; ConfinedArena
refusing every other thread."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time

import numpy as np
import pytest
from support import KINDS, N_THREADS, run_threads, switching_every

import arenalib
from arenalib import Arena, ArenaClosedError, ConfinedArena, WrongThreadError


@pytest.fixture(params=[Arena, arenalib.SlicingArena])
def kind_any(request):
    """The arena kinds any thread may use."""
    return request.param


@pytest.fixture(autouse=True)
def _fast_thread_switching():
    with switching_every(1e-5):
        yield


def in_other_thread(function):
    """function() run in a new thread: ("ok", result) or ("error", exception)."""
    outcome = []

    def run():
        try:
            outcome.append(("ok", function()))
        except BaseException as exc:
            outcome.append(("error", exc))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return outcome[0]


def pattern_byte(thread, step):
    """Distinct per thread: the top two bits name the thread."""
    return (thread << 6) | (step & 63)


def check(seg, byte):
    assert seg.alive
    data = seg.tobytes()
    assert data == bytes([byte]) * len(data), f"segment of {len(seg)} bytes lost its pattern {byte}"


# -- one Arena, four threads -----------------------------------------------------------------------


def test_shared_arena_four_threads():
    steps = 3000
    sizes = [0, 1, 16, 100, 1000, 4096, 5000, 65536, 200_000]

    with Arena() as arena:
        def worker(t):
            rng = random.Random(t)
            held = []
            for step in range(steps):
                roll = rng.random()
                if roll < 0.5 or not held:
                    size = rng.choice(sizes)
                    zero = rng.random() < 0.5
                    align = rng.choice([None, 16, 4096])
                    seg = arena.allocate(size, zero=zero, align=align)
                    if zero:
                        assert seg.tobytes() == bytes(size), "zero=True memory is not zero"
                    if align:
                        assert seg.address % align == 0
                    byte = pattern_byte(t, step)
                    if rng.random() < 0.5:
                        seg.fill(byte)
                    else:
                        with memoryview(seg) as view:
                            view[:] = bytes([byte]) * size
                    held.append((seg, byte))
                elif roll < 0.85:
                    seg, byte = held.pop(rng.randrange(len(held)))
                    check(seg, byte)
                    seg.free()
                    assert not seg.alive
                elif roll < 0.95:
                    seg, byte = held[rng.randrange(len(held))]
                    part = seg.slice(len(seg) // 3, len(seg) // 3)
                    check(part, byte)
                    if len(part):
                        arr = np.frombuffer(part, dtype=np.uint8)
                        assert (arr == byte).all()
                        del arr
                else:
                    for seg, byte in held:
                        check(seg, byte)
            for seg, byte in held:
                check(seg, byte)
            return held

        results = run_threads(worker)
        held = [item for items in results for item in items]
        stats = arena.stats()
        assert stats["live_segments"] == len(held)
        assert stats["live_bytes"] == sum(len(seg) for seg, _ in held)
        assert stats["exports"] == 0
        for seg, byte in held:
            check(seg, byte)
    assert not any(seg.alive for seg, _ in held)


def test_shared_arena_max_bytes_under_threads():
    piece = 64 << 10
    limit = 4 * piece  # each thread holds up to 8 pieces: one thread alone meets the limit
    with Arena(max_bytes=limit) as arena:
        def worker(t):
            rng = random.Random(t)
            held, refused = [], 0
            for step in range(2000):
                if held and (rng.random() < 0.5 or len(held) >= 8):
                    seg, byte = held.pop(rng.randrange(len(held)))
                    check(seg, byte)
                    seg.free()
                    continue
                try:
                    seg = arena.allocate(piece, zero=False)
                except MemoryError:
                    refused += 1
                    continue
                byte = pattern_byte(t, step)
                held.append((seg.fill(byte), byte))
                assert arena.stats()["live_bytes"] <= limit
            for seg, byte in held:
                check(seg, byte)
                seg.free()
            return refused

        refused = run_threads(worker)
        assert sum(refused) > 0  # each thread meets the limit on its own (1 MiB needed overlaps)
        stats = arena.stats()
        assert stats["live_bytes"] == 0 and stats["live_segments"] == 0
        assert stats["peak_bytes"] <= limit
        # all of the limit is usable again
        segs = [arena.allocate(piece) for _ in range(limit // piece)]
        with pytest.raises(MemoryError):
            arena.allocate(1)
        del segs


def test_shared_arena_frees_from_other_threads_then_zero():
    # Blocks allocated and dirtied by one thread, freed by another, reused by a third: zero=True holds.
    with Arena() as arena:
        for _ in range(20):
            kind, segs = in_other_thread(
                lambda: [arena.allocate(n, zero=False).fill(0xFF) for n in (16, 100, 1000, 5000, 65536)])
            assert kind == "ok"
            assert in_other_thread(lambda segs=segs: [s.free() for s in segs])[0] == "ok"
            kind, clean = in_other_thread(
                lambda: [arena.allocate(n).tobytes() == bytes(n) for n in (16, 100, 1000, 5000, 65536)])
            assert kind == "ok" and all(clean)
            for n in (16, 100, 1000, 5000, 65536):
                assert arena.allocate(n).tobytes() == bytes(n)


def test_shared_arena_segments_cross_threads():
    # Allocated in one thread, written in another, freed in a third: any thread may.
    with Arena() as arena:
        kind, segs = in_other_thread(lambda: [arena.allocate(100) for _ in range(10)])
        assert kind == "ok"
        kind, _ = in_other_thread(lambda: [s.fill(i) for i, s in enumerate(segs)])
        assert kind == "ok"
        for i, seg in enumerate(segs):
            check(seg, i)
        kind, _ = in_other_thread(lambda: [s.free() for s in segs[:5]])
        assert kind == "ok"
        assert arena.stats()["live_segments"] == 5
    assert in_other_thread(Arena().close)[0] == "ok"


def test_shared_arena_peak_counts_what_threads_hold_at_once():
    # The peak of a shared arena is of the sum over its threads, also when no thread reaches a
    # new high of its own (allocate() reads the others' live bytes only when their high-water
    # marks say the sum could pass the peak).
    from concurrent.futures import ThreadPoolExecutor

    with Arena() as arena, ThreadPoolExecutor(1) as first, ThreadPoolExecutor(1) as second:
        def on(worker, function):
            return worker.submit(function).result()

        on(first, lambda: arena.allocate(1000).free())
        on(second, lambda: arena.allocate(3000).free())
        assert arena.stats()["peak_bytes"] == 3000  # never both at once so far
        held = on(second, lambda: arena.allocate(3000))
        small = on(first, lambda: arena.allocate(1000))  # no new high for either thread
        on(first, small.free)
        on(second, held.free)
        stats = arena.stats()
        assert stats["live_bytes"] == 0 and stats["peak_bytes"] == 4000
        held = on(second, lambda: arena.allocate(3000))
        on(first, lambda: arena.allocate(500).free())  # below the peak: it stays
        on(second, held.free)
        assert arena.stats()["peak_bytes"] == 4000


@pytest.mark.parametrize("kind", KINDS)
def test_with_blocks_in_four_threads(kind):
    # Each thread runs its own short-lived arenas: the pool of jemalloc arenas is shared.
    def worker(t):
        for step in range(1500):
            byte = pattern_byte(t, step)
            with kind() as a:
                segs = [a.allocate(n, zero=False).fill(byte) for n in (8, 512, 5000)]
                for seg in segs:
                    check(seg, byte)
                fresh = a.allocate(4096)
                assert fresh.tobytes() == bytes(4096)

    run_threads(worker)


def close_under_workers():
    arena = Arena()
    started = threading.Barrier(N_THREADS + 1)
    errors = []

    def worker(t):
        held = []
        started.wait()
        step = 0
        try:
            while True:
                byte = pattern_byte(t, step)
                seg = arena.allocate(256 + step % 1000).fill(byte)
                held.append((seg, byte))
                assert seg.tobytes() == bytes([byte]) * len(seg)
                if len(held) > 50:
                    held.pop(0)[0].free()
                step += 1
        except ArenaClosedError:
            pass
        except BaseException as exc:
            errors.append(exc)
            return
        for seg, _ in held:
            if seg.alive or not isinstance(_raises(seg.tobytes), ArenaClosedError):
                errors.append(AssertionError("a segment of the closed arena is still usable"))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
    for t in threads:
        t.start()
    started.wait()
    deadline = time.monotonic() + 30
    while arena.stats()["allocated_total"] < 200_000 and time.monotonic() < deadline:
        if errors or not any(t.is_alive() for t in threads):
            break
    arena.close()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert arena.closed and arena.stats()["live_segments"] == 0


def _raises(function):
    try:
        function()
    except BaseException as exc:
        return exc
    return None


def test_close_while_other_threads_use_the_arena():
    # Closing under other threads' feet: they see ArenaClosedError, never garbage, never a crash.
    for _ in range(5):
        close_under_workers()


def test_close_refused_while_another_thread_reads_into_a_segment(kind_any):
    # os.readv releases the GIL while the kernel writes into the segment: the export it holds must
    # keep close(), reset() and free() from freeing the memory under it.
    arena = kind_any()
    seg = arena.allocate(4096, zero=False)
    read_fd, write_fd = os.pipe()
    got = []
    thread = threading.Thread(target=lambda: got.append(os.readv(read_fd, [seg])))
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while seg.exports == 0:  # readv holds the buffer before it blocks in the kernel
            assert time.monotonic() < deadline, "the reader thread never took its export"
        actions = [arena.close, arena.reset]
        if kind_any is Arena:
            actions.append(seg.free)
        for action in actions:
            with pytest.raises(BufferError):
                action()
        assert seg.alive and not arena.closed
        os.write(write_fd, b"from the pipe")
        thread.join()
    finally:
        os.close(write_fd)
        thread.join()
        os.close(read_fd)
    assert got == [13]
    assert seg[0:13] == b"from the pipe"
    arena.close()
    assert not seg.alive


# -- ConfinedArena ---------------------------------------------------------------------------------


def foreign_operations(arena, seg):
    def setitem():
        seg[0] = 1

    def setslice():
        seg[0:2] = b"ab"

    def with_block():
        with arena:
            pass

    return {
        "allocate": lambda: arena.allocate(10),
        "close": arena.close,
        "reset": arena.reset,
        "purge": arena.purge,
        "enter": arena.__enter__,
        "with": with_block,
        "fill": lambda: seg.fill(1),
        "memoryview": lambda: memoryview(seg),
        "numpy": lambda: np.frombuffer(seg, dtype=np.uint8),
        "hashlib": lambda: hashlib.sha256(seg),
        "getitem": lambda: seg[0],
        "setitem": setitem,
        "getslice": lambda: seg[0:2],
        "setslice": setslice,
        "tobytes": seg.tobytes,
        "iter": lambda: list(seg),
        "slice": lambda: seg.slice(0, 1),
        "address": lambda: seg.address,
        "free": seg.free,
        "slice_of_slice": lambda: seg.slice(0, 1).fill(1),
    }


def test_confined_arena_refuses_other_threads():
    with ConfinedArena() as arena:
        seg = arena.allocate(64).fill(7)
        part = seg.slice(8, 8)
        for name, operation in foreign_operations(arena, seg).items():
            kind, result = in_other_thread(operation)
            assert kind == "error", f"{name} worked from another thread"
            assert isinstance(result, WrongThreadError), (name, result)
            assert isinstance(result, RuntimeError)
            assert str(arena.owner_thread) in str(result)
        kind, result = in_other_thread(part.tobytes)
        assert isinstance(result, WrongThreadError)
        # nothing changed, and the owner goes on
        assert not arena.closed
        assert seg.alive and seg.tobytes() == b"\x07" * 64
        assert seg.exports == 0 and arena.stats()["exports"] == 0
        stats = arena.stats()
        assert stats["live_segments"] == 1 and stats["live_bytes"] == 64
        more = arena.allocate(32).fill(1)
        with memoryview(more) as view:
            view[0] = 2
        seg.free()
        arena.reset()
    assert arena.closed


def test_confined_arena_properties_from_other_thread():
    # Reading what costs nothing and touches no memory is fine from anywhere.
    with ConfinedArena() as arena:
        seg = arena.allocate(10)
        kind, result = in_other_thread(lambda: (len(seg), seg.nbytes, seg.alive, arena.closed,
                                                arena.owner_thread, repr(seg)))
        assert kind == "ok"
        assert result[:5] == (10, 10, True, False, threading.get_ident())


def test_confined_arena_belongs_to_the_thread_that_made_it():
    made = {}
    ready = threading.Event()
    done = threading.Event()

    def owner():
        arena = ConfinedArena()
        made["arena"] = arena
        made["seg"] = arena.allocate(16).fill(3)
        made["ident"] = threading.get_ident()
        ready.set()
        done.wait()
        arena.close()

    thread = threading.Thread(target=owner)
    thread.start()
    ready.wait()
    try:
        arena, seg = made["arena"], made["seg"]
        assert arena.owner_thread == made["ident"]
        with pytest.raises(WrongThreadError):
            arena.allocate(1)
        with pytest.raises(WrongThreadError):
            seg.tobytes()
        with pytest.raises(WrongThreadError):
            arena.close()
    finally:
        done.set()
        thread.join()
    assert arena.closed
    with pytest.raises(ArenaClosedError):
        seg.tobytes()
    made.clear()
