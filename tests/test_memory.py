"""Memory given back to the OS: big arenas return their pages when they close (or are freed, reset and
purged, or collected unclosed), closed arenas leave at most a few slots' worth of warm pages, a
SlicingArena's reset reuses its chunks.  Bounded assertions on the resident set size, never on time.
(The long runs, RSS bounded over 100k to a million cycles, are in tests/test_soak.py.)"""

from __future__ import annotations

import gc
import sys

import pytest
from support import SANITIZED, MiB, rss, settled_rss

import arenalib
from arenalib import SlicingArena

pytestmark = [
    pytest.mark.skipif(SANITIZED, reason="RSS bounds do not apply under ASan's quarantine"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm"),
]


def assert_given_back(before: int, growth: int) -> None:
    """Less than a tenth of ``growth`` (bytes of RSS) is left resident above ``before``."""
    left = settled_rss() - before
    assert left < 0.1 * growth, f"{left / MiB:.1f} MiB of {growth / MiB:.1f} MiB still resident"


def fill_big(arena, total, piece=64 << 10):
    """Allocate ``total`` bytes in ``piece``-byte segments, touching every page."""
    return [arena.allocate(piece, zero=False).fill(1) for _ in range(total // piece)]


@pytest.mark.parametrize("how", ["close", "with", "gc"])
def test_closing_a_big_arena_returns_memory(kind, how):
    total = 256 * MiB
    arenalib.trim()
    before = settled_rss()
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
    assert_given_back(before, growth)


def test_freeing_then_closing_returns_memory(freeable_kind):
    arenalib.trim()
    before = settled_rss()
    with freeable_kind() as a:
        segs = fill_big(a, 128 * MiB)
        growth = rss() - before
        for seg in segs:
            seg.free()
        del segs
    assert_given_back(before, growth)


def test_reset_and_purge_return_memory_of_an_open_arena(kind):
    arenalib.trim()
    before = settled_rss()
    with kind() as a:
        fill_big(a, 128 * MiB)
        growth = rss() - before
        a.reset()
        a.purge()
        assert_given_back(before, growth)
        a.allocate(1000).fill(1)


def test_purge_returns_freed_memory_with_many_arenas_made(freeable_kind):
    # Past 64 jemalloc arenas purge() no longer reads jemalloc's statistics (a refresh visits every
    # arena) to see whether the background thread, purging the same arena, made it skip pages.
    arenas = [freeable_kind() for _ in range(80)]
    for a in arenas:
        a.allocate(100)
        a.close()
    assert arenalib.pool_stats()["slots_created"] > 64
    for _ in range(10):
        arenalib.trim()
        before = settled_rss()
        with freeable_kind() as a:
            segs = fill_big(a, 96 * MiB)
            growth = rss() - before
            for seg in segs:
                seg.free()
            del segs
            a.purge()
            assert_given_back(before, growth)


def test_many_medium_arenas_stay_bounded(kind):
    # Arenas too small to be purged on close leave warm pages in the pool: at most a few slots' worth.
    arenalib.trim()
    before = settled_rss()
    for _ in range(30):
        arenas = [kind() for _ in range(8)]
        for a in arenas:
            fill_big(a, 3 * MiB)
        for a in arenas:
            a.close()
    left = settled_rss() - before
    assert left < 32 * MiB, f"{left / MiB:.1f} MiB left resident by closed arenas"
    arenalib.trim()
    assert settled_rss() - before < 8 * MiB


def test_slicing_arena_reset_reuses_chunks():
    before = settled_rss()
    with SlicingArena() as a:
        for _ in range(200):
            fill_big(a, 8 * MiB, piece=4096)
            a.reset()
        chunk_bytes = a.stats()["chunk_bytes"]
        assert chunk_bytes < 10 * MiB
    assert settled_rss() - before < 16 * MiB


@pytest.mark.parametrize("then", ["close", "close_and_trim"])
def test_a_slicing_arena_reset_past_its_own_big_chunk_gives_it_back_at_close(then):
    # A request above chunk_size gets a chunk of its own, which reset() hands back to jemalloc,
    # dirty: the close must still count it among what the slot holds (it once counted only the
    # chunks left, 0 here, and the pages stayed until jemalloc's decay, or for good without it).
    arenalib.trim()
    before = settled_rss()
    a = SlicingArena(chunk_size=1 * MiB)
    a.allocate(200 * MiB, zero=False).fill(1)
    growth = rss() - before
    assert growth >= 190 * MiB
    a.reset()
    assert a.stats()["chunk_bytes"] == 0
    a.close()
    if then == "close_and_trim":
        arenalib.trim()
    assert_given_back(before, growth)


@pytest.mark.parametrize("reset", [False, True])
def test_a_big_slicing_scope_is_wiped_alone_whether_it_reset_or_not(reset):
    # A big scope's close wipes its own slot (over the allowance), not the warm idle slots of the
    # small scopes around it: a reset that handed its chunk of its own back changes nothing there
    # (it once left the chunk out of the close's churn, and the retain limit then wiped every idle
    # slot before it came to the big scope's own).
    def small_scopes():
        arenas = [SlicingArena(chunk_size=256 << 10) for _ in range(4)]
        for a in arenas:
            for _ in range(12):
                a.allocate((256 << 10) - 64).fill(1)
        for a in reversed(arenas):
            a.close()

    arenalib.trim()
    small_scopes()
    before = dict(arenalib.pool_stats()["wipes"])
    a = SlicingArena(chunk_size=256 << 10)
    a.allocate(40 * MiB).fill(1)
    if reset:
        a.reset()
    a.close()
    after = arenalib.pool_stats()["wipes"]
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"over_allowance": 1}
