"""Soaks (marked slow: `python3 dev.py test -m slow`, once per CI run): a million open/allocate/close
cycles of each arena kind, mixed sizes, a long-lived arena, a million BufferPool acquire/release
cycles, and 100k with-blocks, each with the resident set size bounded and nothing left behind in
the pool of jemalloc arenas.

RSS is read from /proc/self/statm after a warm-up, so what the warm-up grows once (the pool's slots,
jemalloc's metadata, CPython's free lists) does not count.  Under AddressSanitizer the cycle counts
are cut tenfold and RSS is not bounded: ASan's quarantine holds up to 256 MiB of freed memory.
"""

from __future__ import annotations

import gc
import sys

import pytest
from support import KINDS, SANITIZED, MiB, rss, settled_rss

import arenalib
from arenalib import Arena, BufferPool, SlicingArena

CYCLES = 100_000 if SANITIZED else 1_000_000
RSS_GROWTH_LIMIT = 32 << 20

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm"),
]
rss_bounded = pytest.mark.skipif(SANITIZED, reason="RSS bounds do not apply under ASan's quarantine")


def check_bounded(cycle, warmup: int, cycles: int) -> None:
    for i in range(warmup):
        cycle(i)
    gc.collect()
    slots_before = arenalib.pool_stats()["slots_created"]
    objects_before = arenalib.live_objects()
    before = rss()
    peak = before
    for i in range(cycles):
        cycle(i)
        if i % 50_000 == 0:
            peak = max(peak, rss())
    gc.collect()
    after = rss()
    peak = max(peak, after)
    assert arenalib.pool_stats()["slots_created"] == slots_before, "a cycle leaves a pool slot behind"
    objects = arenalib.live_objects()
    assert objects["open_arenas"] == objects_before["open_arenas"], "a cycle leaves an arena open"
    assert objects["exports"] == objects_before["exports"]
    assert objects["segments"] <= objects_before["segments"] + 64, "Segment objects pile up"
    if not SANITIZED:
        assert peak - before < RSS_GROWTH_LIMIT, (
            f"RSS grew by {(peak - before) >> 20} MiB over {cycles} cycles")


@pytest.mark.parametrize("kind", KINDS)
def test_soak_open_allocate_close(kind):
    def cycle(i):
        with kind() as arena:
            arena.allocate(64)

    check_bounded(cycle, 10_000, CYCLES)


SIZES = [16, 100, 1000, 4096, 40_000, 65_536, 70_000, 300_000, 1 << 20]


@pytest.mark.parametrize("kind", KINDS)
def test_soak_mixed_sizes_frees_and_resets(kind):
    # Sizes across jemalloc's small, tcache'd large and uncached large classes (and, for a
    # SlicingArena, past its chunk size), zeroed and not, freed early, reset, or left to close().
    def cycle(i):
        with kind(max_bytes=8 << 20) as arena:
            segs = [arena.allocate(SIZES[(i + j) % len(SIZES)], zero=bool((i + j) & 1))
                    for j in range(4)]
            for seg in segs:
                seg[0] = 1
                seg[len(seg) - 1] = 2
            if i % 3 == 0:
                arena.reset()
            elif i % 3 == 1 and kind is not SlicingArena:
                segs[0].free()
                segs[2].free()
            if i % 97 == 0:
                arena.purge()

    check_bounded(cycle, 2_000, CYCLES // 5)


def test_soak_long_lived_arena():
    # One arena kept open through a million allocations and frees (resets for a SlicingArena):
    # the memory of freed segments is reused, not piled up.
    with Arena() as arena, SlicingArena() as slicing:
        def cycle(i):
            seg = arena.allocate(SIZES[i % len(SIZES)], zero=False)
            seg[0] = 3
            seg.free()
            slicing.allocate(SIZES[i % 5])
            if i % 64 == 0:
                slicing.reset()

        check_bounded(cycle, 10_000, CYCLES)


def test_soak_buffer_pool_acquire_release():
    with BufferPool(4096, 64) as pool:
        held = []

        def cycle(i):
            seg = pool.acquire()
            seg[0] = 1
            held.append(seg)
            if len(held) > 32 or i % 7 == 0:
                for s in held:
                    pool.release(s) if i & 1 else s.free()
                held.clear()
            if i % 10_000 == 0:
                assert not held or pool.available == len(pool) - len(held)

        check_bounded(cycle, 10_000, CYCLES)
        for s in held:
            s.free()
        assert pool.available == len(pool)


def test_soak_buffer_pool_open_close():
    def cycle(i):
        with BufferPool(4096 if i & 1 else 65_536, 16, zero=bool(i & 2)) as pool:
            pool.acquire()[0] = 1

    check_bounded(cycle, 2_000, CYCLES // 10)


@rss_bounded
def test_100k_with_blocks(kind):
    for _ in range(2000):  # warm up: pool slots, freelists, jemalloc's metadata
        with kind() as a:
            a.allocate(512).fill(1)
    created = arenalib.pool_stats()["slots_created"]
    before = settled_rss()
    for _ in range(100_000):
        with kind() as a:
            a.allocate(512).fill(1)
    growth = settled_rss() - before
    assert growth < 16 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over 100k with-blocks"
    stats = arenalib.pool_stats()
    assert stats["slots_created"] == created
    assert stats["stale_bytes"] <= stats["slots_idle"] * stats["stale_limit"] + MiB


@rss_bounded
def test_100k_with_blocks_of_mixed_sizes(kind):
    sizes = (16, 512, 4096, 65536, 200_000)
    for _ in range(500):
        with kind() as a:
            for n in sizes:
                a.allocate(n, zero=False).fill(1)
    before = settled_rss()
    for i in range(20_000):
        with kind() as a:
            a.allocate(sizes[i % 5], zero=bool(i & 1), align=64 if i & 2 else None).fill(1)
            a.allocate(sizes[(i + 2) % 5], zero=False).fill(2)
    growth = settled_rss() - before
    assert growth < 24 * MiB, f"RSS grew by {growth / MiB:.1f} MiB"
