"""Memory over many scopes: RSS stays bounded through 100k with-blocks, and big arenas give their
memory back to the OS when they close.  Bounded assertions on RSS, never on time."""

from __future__ import annotations

import gc
import os

import pytest

import arenalib
from arenalib import SlicingArena

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")

# Under `python3 dev.py sanitize`, ASan's quarantine keeps freed memory resident for a while.
pytestmark = pytest.mark.skipif(os.environ.get("ARENALIB_SANITIZE") == "1",
                                reason="RSS bounds do not apply under ASan's quarantine")


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def settle() -> int:
    gc.collect()
    return rss()


def test_100k_with_blocks(kind):
    for _ in range(2000):  # warm up: pool slots, freelists, jemalloc's metadata
        with kind() as a:
            a.allocate(512).fill(1)
    created = arenalib.pool_stats()["slots_created"]
    before = settle()
    for _ in range(100_000):
        with kind() as a:
            a.allocate(512).fill(1)
    growth = settle() - before
    assert growth < 16 * MiB, f"RSS grew by {growth / MiB:.1f} MiB over 100k with-blocks"
    stats = arenalib.pool_stats()
    assert stats["slots_created"] == created
    assert stats["stale_bytes"] <= stats["slots_idle"] * stats["stale_limit"] + MiB


def test_100k_with_blocks_of_mixed_sizes(kind):
    sizes = (16, 512, 4096, 65536, 200_000)
    for _ in range(500):
        with kind() as a:
            for n in sizes:
                a.allocate(n, zero=False).fill(1)
    before = settle()
    for i in range(20_000):
        with kind() as a:
            a.allocate(sizes[i % 5], zero=bool(i & 1), align=64 if i & 2 else None).fill(1)
            a.allocate(sizes[(i + 2) % 5], zero=False).fill(2)
    growth = settle() - before
    assert growth < 24 * MiB, f"RSS grew by {growth / MiB:.1f} MiB"


def fill_big(arena, total, piece=64 << 10):
    """Allocate ``total`` bytes in ``piece``-byte segments, touching every page."""
    return [arena.allocate(piece, zero=False).fill(1) for _ in range(total // piece)]


@pytest.mark.parametrize("how", ["close", "with", "gc"])
def test_closing_a_big_arena_returns_memory(kind, how):
    total = 256 * MiB
    arenalib.trim()
    before = settle()
    if how == "with":
        with kind() as a:
            segs = fill_big(a, total)
            peak = rss()
            del segs
    elif how == "close":
        a = kind()
        segs = fill_big(a, total)
        peak = rss()
        del segs
        a.close()
    else:
        a = kind()
        segs = fill_big(a, total)
        peak = rss()
        with pytest.warns(ResourceWarning):
            del a, segs
            gc.collect()
    growth = peak - before
    assert growth >= total * 0.9
    left = settle() - before
    assert left < 0.1 * growth, f"{left / MiB:.1f} MiB of {growth / MiB:.1f} MiB still resident"


def test_freeing_then_closing_returns_memory(freeable_kind):
    arenalib.trim()
    before = settle()
    with freeable_kind() as a:
        segs = fill_big(a, 128 * MiB)
        growth = rss() - before
        for seg in segs:
            seg.free()
        del segs
    left = settle() - before
    assert left < 0.1 * growth, f"{left / MiB:.1f} MiB of {growth / MiB:.1f} MiB still resident"


def test_reset_and_purge_return_memory_of_an_open_arena(kind):
    arenalib.trim()
    before = settle()
    with kind() as a:
        fill_big(a, 128 * MiB)
        growth = rss() - before
        a.reset()
        a.purge()
        left = settle() - before
        assert left < 0.1 * growth, f"{left / MiB:.1f} MiB of {growth / MiB:.1f} MiB still resident"
        a.allocate(1000).fill(1)


def test_many_medium_arenas_stay_bounded(kind):
    # Arenas too small to be purged on close leave warm pages in the pool: at most a few slots' worth.
    arenalib.trim()
    before = settle()
    for _ in range(30):
        arenas = [kind() for _ in range(8)]
        for a in arenas:
            fill_big(a, 3 * MiB)
        for a in arenas:
            a.close()
    left = settle() - before
    assert left < 32 * MiB, f"{left / MiB:.1f} MiB left resident by closed arenas"
    arenalib.trim()
    assert settle() - before < 8 * MiB


def test_slicing_arena_reset_reuses_chunks():
    before = settle()
    with SlicingArena() as a:
        for _ in range(200):
            fill_big(a, 8 * MiB, piece=4096)
            a.reset()
        chunk_bytes = a.stats()["chunk_bytes"]
        assert chunk_bytes < 10 * MiB
    assert settle() - before < 16 * MiB
