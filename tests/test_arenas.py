"""The three arena kinds: construction, allocate()'s arguments, zeroing, alignment, max_bytes (every
test of the limit in Python, single-threaded: tests/test_threads.py has it under threads and
tests/test_capi.py through the C API), the lifecycle (close, reset, purge, with), exports blocking
frees, stats, garbage collection, the pool of jemalloc arenas."""

from __future__ import annotations

import gc
import inspect
import itertools
import re
import sys
import threading
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import FREEABLE_KINDS, KINDS, assert_ok, release, run_python, slots_in_use

import arenalib
from arenalib import (
    Arena,
    ArenaBase,
    ArenaClosedError,
    ArenaError,
    ConfinedArena,
    SlicingArena,
    UnsupportedOperation,
    WrongThreadError,
)

JEMALLOC_FIGURES = ("resident", "mapped", "active", "dirty")
STATS_KEYS = {"live_bytes", "live_segments", "peak_bytes", "allocated_total", "exports", "max_bytes",
              "closed", *JEMALLOC_FIGURES}


# -- the classes and exceptions --------------------------------------------------------------------


def test_exception_hierarchy():
    assert issubclass(ArenaClosedError, ArenaError) and issubclass(ArenaClosedError, ValueError)
    assert issubclass(WrongThreadError, ArenaError) and issubclass(WrongThreadError, RuntimeError)
    assert issubclass(UnsupportedOperation, ArenaError) and issubclass(UnsupportedOperation, TypeError)
    assert issubclass(ArenaError, Exception)
    for name in ("ArenaError", "ArenaClosedError", "WrongThreadError", "UnsupportedOperation"):
        assert getattr(arenalib, name).__module__.startswith("arenalib")


def test_public_names():
    for name in ("Arena", "ConfinedArena", "SlicingArena", "ArenaBase", "Segment", "pool_stats", "trim",
                 "set_debug", "jemalloc_version"):
        assert name in arenalib.__all__
    assert arenalib.jemalloc_version().startswith("5.")


def test_arena_base_is_abstract():
    with pytest.raises(TypeError):
        ArenaBase()
    with pytest.raises(TypeError):
        ArenaBase(max_bytes=10)


def test_python_subclass_of_arena_base_is_not_instantiable():
    # ArenaBase implements no way to carve memory: a subclass of it is no arena either.
    class Custom(ArenaBase):
        pass

    with pytest.raises(TypeError):
        Custom()


@pytest.mark.parametrize("kind", KINDS)
def test_concrete_kinds_are_final(kind):
    with pytest.raises(TypeError):
        type("Sub", (kind,), {})


def test_kinds_derive_from_arena_base(arena):
    assert isinstance(arena, ArenaBase)


def test_constructor_takes_keywords_only(kind):
    with pytest.raises(TypeError) as info:
        kind(100)
    # the message names the class and the keyword
    message = str(info.value)
    assert re.search(rf"\b{kind.__name__}\b", message), message
    assert "max_bytes" in message, message
    with pytest.raises(TypeError):
        kind(no_such_option=1)


@pytest.mark.parametrize("kind", [Arena, ConfinedArena])
def test_chunk_size_only_for_slicing_arena(kind):
    with pytest.raises(TypeError):
        kind(chunk_size=8192)


def test_constructor_failures_leak_no_slot_and_no_warning(kind):
    before = slots_in_use()
    with pytest.raises(ValueError):
        kind(max_bytes=-1)
    with pytest.raises(TypeError):
        kind(max_bytes="10")
    with pytest.raises(TypeError):
        kind(max_bytes=1.5)
    if kind is SlicingArena:
        for bad in (0, -1, 4095):
            with pytest.raises(ValueError):
                SlicingArena(chunk_size=bad)
        with pytest.raises(TypeError):
            SlicingArena(chunk_size=8192.0)
    gc.collect()  # a half-built arena must not warn about being unclosed (warnings are errors here)
    assert slots_in_use() == before


def test_slicing_arena_chunk_size():
    with SlicingArena(chunk_size=4096) as a:
        assert a.chunk_size == 4096
        a.allocate(100)
    with SlicingArena() as a:
        assert isinstance(a.chunk_size, int) and a.chunk_size >= 4096
    with SlicingArena(chunk_size=np.int64(65536)) as a:
        assert a.chunk_size == 65536


@pytest.mark.parametrize("chunk_size", [2**63, 2**64, 2**100])
def test_chunk_size_beyond_ssize_t(chunk_size):
    with pytest.raises((MemoryError, ValueError)):
        SlicingArena(chunk_size=chunk_size)


def test_confined_arena_owner_thread():
    with ConfinedArena() as a:
        assert a.owner_thread == threading.get_ident()


# -- allocate()'s arguments ------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 4095, 4096, 65536, 300_000, 3 << 20])
def test_allocate_sizes(arena, size):
    seg = arena.allocate(size)
    assert len(seg) == size
    seg.fill(0xA5)
    if size:
        assert seg[0] == seg[-1] == 0xA5


def test_allocate_index_likes(arena):
    for size in (np.int64(10), np.uint16(7), np.int8(3)):
        assert len(arena.allocate(size)) == int(size)
    assert len(arena.allocate(Index(12))) == 12


def test_allocate_methods_take_every_call_shape(arena):
    # allocate(size), allocate(size, zero=z), allocate_from(data) and allocate_string(s) skip
    # Cython's argument parsing (src/entries.h); every other call shape, and every error, is
    # Cython's as before, in the same order (the zero flag is judged before the size).
    assert arena.allocate(3).tobytes() == bytes(3)
    assert len(arena.allocate(5, zero=False)) == 5
    assert arena.allocate(Index(4), zero=True).tobytes() == bytes(4)
    assert len(arena.allocate(size=6, zero=True)) == 6
    assert arena.allocate(7, align=256).address % 256 == 0
    zero = "".join(["ze", "ro"])  # a keyword name that is not the interned "zero"
    assert arena.allocate(9, **{zero: True}).tobytes() == bytes(9)
    with pytest.raises(TypeError, match="zero"):
        arena.allocate("10", zero="no")  # the flag first, as Cython's wrapper judges it
    with pytest.raises(TypeError, match="size must be an integer"):
        arena.allocate("10", zero=False)
    with pytest.raises(TypeError, match="zerox"):
        arena.allocate(10, zerox=False)
    with pytest.raises(TypeError, match="positional"):
        arena.allocate(10, False)
    with pytest.raises(TypeError):
        arena.allocate()
    assert arena.allocate_from(b"abc").tobytes() == b"abc"
    assert arena.allocate_from(data=b"de").tobytes() == b"de"
    assert arena.allocate_from(b"xyz", align=64).address % 64 == 0
    with pytest.raises(TypeError, match="bytes-like"):
        arena.allocate_from(5)
    with pytest.raises(TypeError):
        arena.allocate_from(b"a", 64)
    assert arena.allocate_string("h\u00e9").tobytes() == b"h\xc3\xa9\x00"
    assert arena.allocate_string("ab", "utf-16-le").tobytes() == "ab\0".encode("utf-16-le")
    assert arena.allocate_string("ab", nul=False).tobytes() == b"ab"
    assert arena.allocate_string(s="cd").tobytes() == b"cd\x00"
    with pytest.raises(TypeError, match="str"):
        arena.allocate_string(5)
    assert str(inspect.signature(arena.allocate)) == "(size, *, zero=True, align=None)"
    assert str(inspect.signature(arena.allocate_from)) == "(data, *, align=None)"
    assert str(inspect.signature(arena.allocate_string)) == "(s, encoding='utf-8', nul=True)"
    arena.close()
    for call in (lambda: arena.allocate(1), lambda: arena.allocate(1, zero=False),
                 lambda: arena.allocate_from(b"a"), lambda: arena.allocate_string("a")):
        with pytest.raises(ArenaClosedError):
            call()


def test_zero_size_segments_have_distinct_addresses(freeable_kind):
    with freeable_kind() as a:
        segs = [a.allocate(0) for _ in range(10)]
        assert len({s.address for s in segs}) == 10
        assert a.stats()["live_bytes"] == 0
        assert a.stats()["live_segments"] == 10


@pytest.mark.parametrize("size", [-1, -4096, -(2**63), -(2**63) - 1, -(2**64), -(2**70), -(2**100),
                                  np.int64(-1)])
def test_allocate_negative_size(arena, size):
    with pytest.raises(ValueError):
        arena.allocate(size)
    assert arena.allocate(100).fill(0x42).tobytes() == b"\x42" * 100  # still usable


@pytest.mark.parametrize("size", [1.0, 1.5, "1", b"1", None, [1], np.float64(4)])
def test_allocate_non_integer_size(arena, size):
    with pytest.raises(TypeError):
        arena.allocate(size)


@pytest.mark.parametrize("size", [2**47, 2**62, 2**63 - 1, 2**63, 2**64, 2**100, 10**30],
                         ids=["2^47", "2^62", "2^63-1", "2^63", "2^64", "2^100", "10^30"])
def test_allocate_impossible_size(arena, size):
    # (no max_bytes: the memory cannot be had, or the size fits no size_t)
    for zero in (False, True):
        with pytest.raises(MemoryError):
            arena.allocate(size, zero=zero)
        with pytest.raises(MemoryError):
            arena.allocate(size, zero=zero, align=4096)
    # nothing was accounted and the arena stays usable
    stats = arena.stats()
    assert stats["live_bytes"] == 0 and stats["live_segments"] == 0
    assert arena.allocate(10).fill(1).tobytes() == b"\x01" * 10


class Index:
    """An index-like object: only __index__."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def test_integers_beyond_ssize_t_through_index_raise_as_plain_ints_do():
    with arenalib.Arena() as arena:
        for size, error in ((2**70, MemoryError), (-(2**70), ValueError)):
            with pytest.raises(error):
                arena.allocate(size)
            with pytest.raises(error):
                arena.allocate(Index(size))
        seg = arena.allocate(8)
        with pytest.raises(IndexError):
            seg.slice(Index(2**70), 0)
        with pytest.raises(ValueError):
            seg.slice(0, Index(-(2**70)))
    arenalib.Arena(max_bytes=Index(2**70)).close()  # beyond any address space: no limit


def test_allocate_impossible_size_with_alignment(arena):
    with pytest.raises(MemoryError):
        arena.allocate(2**62, align=2**21)
    with pytest.raises(MemoryError):
        arena.allocate(2**63 - 4096, align=4096)
    assert arena.allocate(1, align=2**21).address % 2**21 == 0


ALIGNMENTS = [2**k for k in range(22)]  # 1 .. 2 MiB


@pytest.mark.parametrize("size", [0, 1, 100, 5000])
def test_alignment(arena, size):
    arena.allocate(3)  # moves a SlicingArena's bump pointer off any boundary
    for align in ALIGNMENTS:
        seg = arena.allocate(size, align=align)
        assert seg.address % align == 0, (align, hex(seg.address))
        seg.fill(1)
        assert seg.tobytes() == b"\x01" * size
        arena.allocate(1)


def test_alignment_one_gib(arena):
    seg = arena.allocate(64, align=2**30)
    assert seg.address % 2**30 == 0
    assert seg.fill(2).tobytes() == b"\x02" * 64


def test_alignment_as_index_like(arena):
    assert arena.allocate(8, align=np.int64(256)).address % 256 == 0


@pytest.mark.parametrize("align", [0, 3, 6, 12, 3 << 20, -1, -4, 2**31, 2**40, 2**70, -(2**70)])
def test_bad_alignment(arena, align):
    with pytest.raises(ValueError):
        arena.allocate(8, align=align)
    assert arena.stats()["live_segments"] == 0


@pytest.mark.parametrize("align", [1.0, 8.0, "8", b"8", [8]])
def test_non_integer_alignment(arena, align):
    with pytest.raises((TypeError, ValueError)) as info:
        arena.allocate(8, align=align)
    assert info.type in (TypeError, ValueError)  # not some other subclass or error


# -- zeroing ---------------------------------------------------------------------------------------


ZERO_SIZES = [1, 8, 100, 4096, 65536, 200_000, 2 << 20]


def is_zero(seg):
    return not np.frombuffer(seg.tobytes(), dtype=np.uint8).any()


@pytest.mark.parametrize("size", ZERO_SIZES)
def test_zero_true_on_fresh_memory(arena, size):
    assert is_zero(arena.allocate(size))
    assert is_zero(arena.allocate(size, zero=True, align=4096))


def test_zero_false_gives_usable_memory(arena):
    # Its content is unspecified: only its size and writability are.
    seg = arena.allocate(10000, zero=False)
    assert len(seg) == 10000
    seg.fill(3)
    assert seg.tobytes() == b"\x03" * 10000


@pytest.mark.parametrize("size", ZERO_SIZES)
def test_zero_true_after_free(freeable_kind, size):
    with freeable_kind() as a:
        for _ in range(30):
            dirty = a.allocate(size, zero=False).fill(0xFF)
            dirty.free()
            clean = a.allocate(size, zero=True)
            assert is_zero(clean)
            clean.fill(0xEE)
            clean.free()


def test_zero_true_after_free_mixed_sizes(freeable_kind):
    rng = np.random.default_rng(1)
    with freeable_kind() as a:
        for _ in range(20):
            sizes = rng.integers(1, 20000, 50)
            for seg in [a.allocate(int(n), zero=False).fill(0xFF) for n in sizes]:
                seg.free()
            for n in rng.permutation(sizes):
                assert is_zero(a.allocate(int(n)))
            a.reset()


@pytest.mark.parametrize("size", ZERO_SIZES)
def test_zero_true_after_reset(kind, size):
    with kind() as a:
        for _ in range(10):
            segs = [a.allocate(size, zero=False).fill(0xFF) for _ in range(5)]
            a.reset()
            assert not any(s.alive for s in segs)
            for _ in range(5):
                assert is_zero(a.allocate(size))


def test_zero_true_after_reset_with_shifted_offsets():
    # A SlicingArena reuses its chunks after reset: new segments straddle old, dirty ones.
    with SlicingArena(chunk_size=8192) as a:
        for shift in range(0, 40, 3):
            for n in (100, 5000, 9000, 20000):
                a.allocate(n, zero=False).fill(0xFF)
            a.reset()
            a.allocate(shift, zero=False)
            for n, align in ((50, 1), (3000, 64), (9000, 4096), (100, 16), (12000, 1)):
                assert is_zero(a.allocate(n, align=align))
            a.reset()


@pytest.mark.parametrize("total", [64 << 10, 3 << 20, 12 << 20], ids=["64KiB", "3MiB", "12MiB"])
def test_zero_true_in_a_new_arena_after_close(kind, total):
    # Closed arenas leave garbage in their pooled jemalloc arena, dropped in bulk later: the next
    # arena on the same slot must still get zeroed memory.
    for _ in range(4):
        with kind() as a:
            for n in (8, 100, 4096, 65536):
                for _ in range(max(1, total // 4 // n)):
                    a.allocate(n, zero=False).fill(0xFF)
        with kind() as b:
            for n in (8, 100, 4096, 65536):
                for _ in range(4):
                    assert is_zero(b.allocate(n))


def test_zero_true_after_trim(kind):
    with kind() as a:
        for _ in range(100):
            a.allocate(4096, zero=False).fill(0xFF)
    arenalib.trim()
    with kind() as b:
        for _ in range(100):
            assert is_zero(b.allocate(4096))


# -- max_bytes -------------------------------------------------------------------------------------


def test_max_bytes(kind):
    with kind(max_bytes=1000) as a:
        assert a.max_bytes == 1000
        assert a.stats()["max_bytes"] == 1000
        first = a.allocate(600)
        with pytest.raises(MemoryError):
            a.allocate(401)
        assert a.stats()["live_bytes"] == 600 and a.stats()["live_segments"] == 1
        a.allocate(400)
        with pytest.raises(MemoryError):
            a.allocate(1)
        a.allocate(0)  # a 0-byte segment never exceeds the limit
        assert a.stats()["live_bytes"] == 1000
        assert first.fill(1).tobytes() == b"\x01" * 600  # still usable
        if kind is SlicingArena:
            a.reset()
        else:
            first.free()
        a.allocate(600).fill(2)
        with pytest.raises(MemoryError):
            a.allocate(1000)


def test_max_bytes_zero(kind):
    with kind(max_bytes=0) as a:
        assert a.max_bytes == 0
        a.allocate(0)
        with pytest.raises(MemoryError):
            a.allocate(1)


def test_max_bytes_none(kind):
    with kind() as a:
        assert a.max_bytes is None
        assert a.stats()["max_bytes"] is None
    with kind(max_bytes=None) as a:
        assert a.max_bytes is None


def test_max_bytes_index_like(kind):
    with kind(max_bytes=np.int64(100)) as a:
        assert a.max_bytes == 100


@pytest.mark.parametrize("limit", [2**63 - 1, 2**63, 2**64, 2**70, 2**100])
def test_max_bytes_beyond_address_space_is_no_limit(kind, limit):
    with kind(max_bytes=limit) as a:
        a.allocate(1 << 20)
        with pytest.raises(MemoryError):
            a.allocate(2**62)
        assert a.allocate(100).fill(0x42).tobytes() == b"\x42" * 100


@pytest.mark.parametrize("limit", [-2**63 - 1, -2**100])
def test_max_bytes_hugely_negative(kind, limit):
    with pytest.raises(ValueError):
        kind(max_bytes=limit)


@pytest.mark.parametrize("limit", [1, 4096, 100_000, 3 << 20])
def test_max_bytes_exceeded_then_fully_usable(kind, limit):
    with kind(max_bytes=limit) as arena:
        first = arena.allocate(limit // 2, zero=False).fill(0xA1)
        with pytest.raises(MemoryError):
            arena.allocate(limit - limit // 2 + 1)
        with pytest.raises(MemoryError):
            arena.allocate(limit + 1, align=64)
        with pytest.raises(MemoryError):
            arena.allocate(2**62)
        assert arena.stats()["live_bytes"] == limit // 2
        # Up to the limit exactly still works, and nothing already there was touched.
        rest = arena.allocate(limit - limit // 2).fill(0xB2)
        assert first.tobytes() == b"\xa1" * (limit // 2)
        assert rest.tobytes() == b"\xb2" * (limit - limit // 2)
        assert arena.allocate(0).nbytes == 0
        with pytest.raises(MemoryError):
            arena.allocate(1)
        # Giving memory back makes room again.
        if kind is SlicingArena:
            arena.reset()
        else:
            rest.free()
            first.free()
        whole = arena.allocate(limit).fill(0xC3)
        assert whole.tobytes() == b"\xc3" * limit
        assert arena.stats()["live_bytes"] == limit


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data())
def test_max_bytes_model(kind, data):
    # Random allocations and frees against a model: MemoryError exactly when the live bytes would
    # pass the limit, and every live segment keeps its contents.
    limit = data.draw(st.integers(0, 200_000), label="max_bytes")
    with kind(max_bytes=limit) as arena:
        live = []
        used = 0
        for step in range(data.draw(st.integers(1, 30), label="steps")):
            if live and kind is not SlicingArena and data.draw(st.booleans(), label="free"):
                seg, byte = live.pop(data.draw(st.integers(0, len(live) - 1), label="which"))
                assert seg.tobytes() == bytes([byte]) * seg.nbytes
                used -= seg.nbytes
                seg.free()
                continue
            size = data.draw(st.integers(0, 120_000), label="size")
            align = data.draw(st.sampled_from([None, 1, 64, 4096]), label="align")
            if used + size > limit:
                with pytest.raises(MemoryError):
                    arena.allocate(size, align=align, zero=bool(step % 2))
            else:
                byte = step % 256
                live.append((arena.allocate(size, align=align, zero=bool(step % 2)).fill(byte), byte))
                used += size
            assert arena.stats()["live_bytes"] == used
        for seg, byte in live:
            assert seg.tobytes() == bytes([byte]) * seg.nbytes


def test_shared_arena_max_bytes_does_not_wrap_around():
    """A request near sys.maxsize on a limited shared Arena is refused for max_bytes (the live
    counter must not overflow into a negative total), and the arena stays usable."""
    with arenalib.Arena(max_bytes=1000) as arena:
        kept = arena.allocate(200)
        for size in (sys.maxsize - 100, sys.maxsize, sys.maxsize - 199, sys.maxsize // 2 + 1):
            with pytest.raises(MemoryError, match="max_bytes"):
                arena.allocate(size)
        assert arena.stats()["live_bytes"] == 200
        more = arena.allocate(800)
        with pytest.raises(MemoryError, match="max_bytes"):
            arena.allocate(1)
        kept.free()
        more.free()
        assert arena.stats()["live_bytes"] == 0


# -- lifecycle -------------------------------------------------------------------------------------


def test_close_is_idempotent(kind):
    a = kind()
    assert a.closed is False
    a.allocate(10)
    a.close()
    assert a.closed is True
    a.close()
    a.close()
    assert a.closed is True
    assert "closed" in repr(a)


@pytest.mark.parametrize("used", [False, True], ids=["unused", "used"])
def test_closed_arena_refuses_use(kind, used):
    a = kind()
    if used:  # the allocating thread's fast path must be closed too
        a.allocate(8).fill(1)
    a.close()
    for operation in (lambda: a.allocate(1), a.reset, a.purge, a.__enter__):
        with pytest.raises(ArenaClosedError):
            operation()
    with pytest.raises(ArenaClosedError):
        with a:
            pass


def test_closed_arena_stats(kind):
    a = kind()
    for _ in range(10):
        a.allocate(1000)
    a.close()
    stats = a.stats()
    assert stats["closed"] is True
    assert stats["live_bytes"] == 0 and stats["live_segments"] == 0
    assert stats["peak_bytes"] == 10000
    assert stats["allocated_total"] == 10000
    for key in JEMALLOC_FIGURES:
        assert stats[key] == 0, key


def test_with_block_closes(kind):
    with kind() as a:
        assert isinstance(a, kind)
        seg = a.allocate(100)
        assert not a.closed
    assert a.closed
    assert not seg.alive


def test_with_block_closes_on_exception(kind):
    with pytest.raises(KeyError):
        with kind() as a:
            seg = a.allocate(1000).fill(1)
            raise KeyError("boom")
    assert a.closed
    assert not seg.alive
    assert a.stats()["live_bytes"] == 0


def test_with_block_with_live_export(kind):
    # The exit closes deferred (tests/test_deferred_close.py): the export keeps the memory.
    with kind() as a:
        view = memoryview(a.allocate(16).fill(4))
    assert a.closed
    assert view.tobytes() == b"\x04" * 16
    view.release()


def test_context_methods_bound_like_builtin_methods(kind):
    # __enter__ and __exit__ bind cheaply (arenalib/_with.pxi) yet show what a builtin method
    # shows; through the class they are the methods themselves.
    a = kind()
    enter, exit_ = a.__enter__, a.__exit__
    assert (enter.__self__, exit_.__self__) == (a, a)
    assert (enter.__name__, exit_.__name__) == ("__enter__", "__exit__")
    assert "__exit__" in repr(exit_) and exit_.__doc__ == type(a).__exit__.__doc__
    assert type(type(a).__exit__).__name__ == "method_descriptor"
    assert type(a).__enter__(a) is a and enter() is a
    with pytest.raises(TypeError):
        exit_(None)
    with pytest.raises(TypeError):
        enter(1)
    assert not a.closed
    assert exit_(None, None, tb=None) is False and a.closed
    type(a).__exit__(a, None, None, None)  # idempotent, as close() is


def test_context_method_descriptor_refuses_an_object_that_is_not_an_arena():
    # The descriptor in ArenaBase's dict (arenalib/_with.pxi) calls the method's C function with
    # whatever it was bound to: it must refuse a non-arena as the method descriptor does, not hand
    # it to C code that reads it as an ArenaCore (SIGSEGV before the fix).
    result = run_python("""
        import arenalib
        enter = vars(arenalib.ArenaBase)["__enter__"]
        exit_ = vars(arenalib.ArenaBase)["__exit__"]

        class NotAnArena:
            __enter__ = enter
            __exit__ = exit_

        for call in (lambda: type(enter).__get__(enter, bytearray(64))(),
                     lambda: NotAnArena().__enter__()):
            try:
                call()
            except TypeError:
                pass
            else:
                raise SystemExit("bound to a non-arena")
        print("refused")
        """)
    assert assert_ok(result).strip() == "refused"


def test_context_method_descriptor_follows_the_mro_not_the_layout():
    # Its instance check walks the primary bases only for static types (src/with.h): a class whose
    # metaclass leaves ArenaBase out of the MRO, though ArenaBase is its layout's base, is refused
    # as isinstance() and the method descriptor refuse it.
    result = run_python("""
        import arenalib
        enter = vars(arenalib.ArenaBase)["__enter__"]
        exit_ = vars(arenalib.ArenaBase)["__exit__"]
        kept = []

        class NoBaseInMro(type):
            def mro(cls):
                return (cls, object)

        class Evil(arenalib.ArenaBase, metaclass=NoBaseInMro):
            def __del__(self):
                kept.append(self)  # the half-made instance, kept past its refused construction

        try:
            Evil()
        except TypeError:
            pass
        evil = kept[0]
        assert Evil.__base__ is arenalib.ArenaBase and not isinstance(evil, arenalib.ArenaBase)
        for descriptor in (enter, exit_):
            try:
                type(descriptor).__get__(descriptor, evil, None)  # as the with statement binds
            except TypeError:
                pass
            else:
                raise SystemExit("bound to an object outside ArenaBase's MRO")
        print("refused")
        """)
    assert assert_ok(result).strip() == "refused"


def test_bound_context_methods_keep_their_arena(kind):
    exits = [kind().__exit__ for _ in range(50)]  # more than are kept for reuse
    arenas = [weakref.ref(e.__self__) for e in exits]
    gc.collect()
    assert all(r() is not None and not r().closed for r in arenas)
    for e, r in zip(exits, arenas, strict=True):
        assert e.__self__ is r()
        e(None, None, None)
        assert r().closed
    del exits, e
    gc.collect()
    assert all(r() is None for r in arenas)


def test_with_block_propagates_exceptions_and_closes(kind):
    for _ in range(20):  # bound objects come from the reuse list after the first rounds
        with pytest.raises(KeyError):
            with kind() as a:
                a.allocate(32).fill(1)
                raise KeyError("inside")
        assert a.closed


def test_reset(kind):
    with kind() as a:
        segs = [a.allocate(100).fill(i) for i in range(10)]
        part = segs[0].slice(0, 10)
        stats = a.stats()
        assert stats["live_bytes"] == 1000 and stats["live_segments"] == 10
        a.reset()
        assert not a.closed
        assert not any(s.alive for s in segs) and not part.alive
        stats = a.stats()
        assert stats["live_bytes"] == 0 and stats["live_segments"] == 0
        assert stats["peak_bytes"] == 1000
        assert stats["allocated_total"] == 1000
        new = a.allocate(50).fill(9)
        assert new.alive and new.tobytes() == b"\x09" * 50
        a.reset()
        a.reset()  # reset of an empty arena is fine
        assert a.stats()["allocated_total"] == 1050


def test_purge_keeps_live_segments(kind):
    with kind() as a:
        keep = [a.allocate(n).fill(n % 256) for n in (10, 4096, 100_000, 1 << 20)]
        for _ in range(50):
            release(a.allocate(65536).fill(1))
        before = a.stats()
        a.purge()
        after = a.stats()
        for key in ("live_bytes", "live_segments", "peak_bytes", "allocated_total", "exports"):
            assert after[key] == before[key], key
        for seg in keep:
            assert seg.alive
            assert seg.tobytes() == bytes([len(seg) % 256]) * len(seg)
        a.allocate(10).fill(1)


def test_purge_after_reset_returns_dirty_pages(kind):
    with kind() as a:
        for _ in range(64):
            a.allocate(65536, zero=False).fill(1)
        a.reset()
        a.purge()
        stats = a.stats()
        assert stats["dirty"] == 0
        if kind is SlicingArena:
            assert stats["chunks"] <= 1
        a.allocate(10).fill(1)


# -- free ------------------------------------------------------------------------------------------


def test_free(freeable_kind):
    with freeable_kind() as a:
        first = a.allocate(100).fill(1)
        second = a.allocate(50).fill(2)
        first.free()
        assert not first.alive and second.alive
        stats = a.stats()
        assert stats["live_bytes"] == 50 and stats["live_segments"] == 1
        assert stats["peak_bytes"] == 150
        with pytest.raises(ArenaClosedError):
            first.free()
        assert a.stats()["live_segments"] == 1
        assert second.tobytes() == b"\x02" * 50


def test_free_after_close(freeable_kind):
    a = freeable_kind()
    seg = a.allocate(10)
    a.close()
    with pytest.raises(ArenaClosedError):
        seg.free()


def test_free_on_slicing_arena_is_unsupported():
    with SlicingArena() as a:
        seg = a.allocate(100).fill(1)
        with pytest.raises(UnsupportedOperation):
            seg.free()
        with pytest.raises(TypeError):
            seg.free()
        assert seg.alive and seg.tobytes() == b"\x01" * 100
        assert a.stats()["live_segments"] == 1


def test_free_on_slicing_arena_with_export_is_unsupported():
    # free() can never work on a SlicingArena segment: it must say so, not ask to release exports.
    with SlicingArena() as a:
        seg = a.allocate(100)
        with memoryview(seg):
            with pytest.raises(UnsupportedOperation):
                seg.free()


# -- exports block free, reset and close -----------------------------------------------------------


def snapshot(arena, segs):
    stats = arena.stats()
    return ({k: stats[k] for k in ("live_bytes", "live_segments", "exports", "closed")},
            [(s.alive, s.tobytes()) for s in segs])


def actions(kind, seg):
    result = {"reset": seg.arena.reset, "close": seg.arena.close}
    if kind is not SlicingArena:
        result["free"] = seg.free
    return result


@pytest.mark.parametrize("exporter", ["memoryview", "numpy", "slice-memoryview", "two"])
@pytest.mark.parametrize(
    ("kind", "action"),
    [
        pytest.param(k, action, id=f"{k.__name__}-{action}")
        for k in KINDS
        for action in ("free", "reset", "close")
        if not (action == "free" and k is SlicingArena)  # see test_free_on_slicing_arena_*
    ],
)
def test_exports_block(kind, action, exporter):
    a = kind()
    seg = a.allocate(64).fill(5)
    other = a.allocate(32).fill(6)
    if exporter == "memoryview":
        held, count = [memoryview(seg)], 1
    elif exporter == "numpy":
        held, count = [np.frombuffer(seg, dtype=np.uint8)], 1
    elif exporter == "slice-memoryview":
        held, count = [memoryview(seg.slice(8, 8))], 1
    else:
        held, count = [memoryview(seg), np.frombuffer(seg.slice(0, 4), dtype=np.uint8)], 2
    assert seg.exports == count
    before = snapshot(a, [seg, other])
    with pytest.raises(BufferError, match=rf"\b{count} buffer export"):
        actions(kind, seg)[action]()
    assert snapshot(a, [seg, other]) == before
    # the export still sees the memory, writable
    np.frombuffer(held[0], dtype=np.uint8)[0] = 42
    assert seg[8 if exporter == "slice-memoryview" else 0] == 42
    for obj in held:
        if isinstance(obj, memoryview):
            obj.release()
    del obj
    held.clear()
    assert seg.exports == 0
    actions(kind, seg)[action]()
    assert not seg.alive
    a.close()


def test_export_of_other_segment_blocks_arena_but_not_free(freeable_kind):
    with freeable_kind() as a:
        seg = a.allocate(10)
        other = a.allocate(10)
        with memoryview(other):
            seg.free()  # another segment's export does not stop this one's free
            with pytest.raises(BufferError):
                a.reset()
        assert other.alive


# -- stats -----------------------------------------------------------------------------------------


def test_stats(kind):
    with kind() as a:
        stats = a.stats()
        expected = STATS_KEYS | ({"chunks", "chunk_bytes"} if kind is SlicingArena else set())
        assert expected <= set(stats)
        assert stats["closed"] is False
        assert stats["live_bytes"] == stats["live_segments"] == stats["peak_bytes"] == 0
        segs = [a.allocate(n).fill(1) for n in (10, 1000, 100_000)]
        stats = a.stats()
        assert stats["live_bytes"] == 101_010
        assert stats["live_segments"] == 3
        assert stats["peak_bytes"] == 101_010
        assert stats["allocated_total"] == 101_010
        assert stats["exports"] == 0
        for key in JEMALLOC_FIGURES:
            assert isinstance(stats[key], int) and stats[key] >= 0, key
        assert stats["active"] >= 100_000
        assert stats["resident"] >= 100_000
        assert stats["mapped"] >= stats["active"]
        if kind is SlicingArena:
            assert stats["chunks"] >= 1
            assert stats["chunk_bytes"] >= 101_010
        release(segs[2])
        if kind is not SlicingArena:
            stats = a.stats()
            assert stats["live_bytes"] == 1010 and stats["peak_bytes"] == 101_010


def test_slicing_arena_chunks():
    with SlicingArena(chunk_size=16384) as a:
        for _ in range(10):
            a.allocate(4000)
        stats = a.stats()
        assert stats["chunks"] >= 3 and stats["chunk_bytes"] == stats["chunks"] * 16384
        big = a.allocate(100_000)  # larger than a chunk: a chunk of its own
        big.fill(7)
        assert big.tobytes() == b"\x07" * 100_000
        stats = a.stats()
        chunks, chunk_bytes = stats["chunks"], stats["chunk_bytes"]
        assert chunk_bytes >= 100_000 + 3 * 16384
        a.reset()
        # The chunks of chunk_size stay warm; the one made for `big` alone goes back (a one-off
        # huge request must not stay resident for the arena's life).
        assert a.stats()["chunks"] == chunks - 1
        assert a.stats()["chunk_bytes"] == chunk_bytes - 25 * 4096
        for _ in range(10):
            a.allocate(4000)
        a.allocate(100_000)
        assert a.stats()["chunk_bytes"] == chunk_bytes  # reused, not grown
        a.close()
        assert a.stats()["chunks"] == 0 and a.stats()["chunk_bytes"] == 0


# -- lifetime and garbage collection ---------------------------------------------------------------


def test_segment_keeps_arena_alive(kind):
    seg = kind().allocate(16).fill(3)
    ref = weakref.ref(seg.arena)
    gc.collect()
    assert ref() is not None
    assert seg.alive and seg.tobytes() == b"\x03" * 16
    part = seg.slice(0, 4)
    seg.arena.close()
    del seg
    gc.collect()
    assert ref() is not None  # the slice holds it
    del part
    gc.collect()
    assert ref() is None


def test_unclosed_arena_warns_and_frees(kind):
    a = kind()
    seg = a.allocate(1000).fill(1)
    ref = weakref.ref(a)
    in_use = slots_in_use()
    with pytest.warns(ResourceWarning, match=kind.__name__):
        del a, seg
        gc.collect()
    assert ref() is None
    assert slots_in_use() == in_use - 1


def test_unclosed_arena_warns_when_last_segment_dies(kind):
    seg = kind().allocate(10)
    with pytest.warns(ResourceWarning):
        del seg
        gc.collect()


def test_closed_arena_does_not_warn(kind):
    a = kind()
    a.allocate(10)
    a.close()
    del a
    gc.collect()  # a ResourceWarning would be an error here


def make_unclosed_arena_in_debug_mode(kind):
    return kind()


def test_debug_mode_names_creation_site(kind):
    arenalib.set_debug(True)
    try:
        a = make_unclosed_arena_in_debug_mode(kind)
    finally:
        arenalib.set_debug(False)
    with pytest.warns(ResourceWarning, match="make_unclosed_arena_in_debug_mode") as record:
        del a
        gc.collect()
    assert "test_arenas.py" in str(record[0].message)


def test_debug_mode_imports_what_it_records_with_when_turned_on():
    # An arena made in debug mode records its creation stack with traceback.  Were traceback first
    # imported there, a fork on another thread mid-import left the child waiting on the parent's
    # module lock for ever (found with fork + set_debug + scopes on 3.13t): set_debug(True)
    # imports it first, on its caller's thread.
    result = run_python("""
        import sys
        import arenalib
        assert "traceback" not in sys.modules
        arenalib.set_debug(False)
        assert "traceback" not in sys.modules
        arenalib.set_debug(True)
        print("traceback" in sys.modules)
        """)
    assert assert_ok(result).strip() == "True"


def test_no_creation_site_without_debug(kind):
    a = kind()
    with pytest.warns(ResourceWarning) as record:
        del a
        gc.collect()
    assert "test_no_creation_site_without_debug" not in str(record[0].message)


# -- the free-block cache --------------------------------------------------------------------------
# A cache miss for a small block takes a batch of blocks of its class from jemalloc at once and
# keeps the rest for the next allocations; a shared Arena's first allocating thread reaches its own
# cache without a thread-local lookup.  Neither may show: blocks never overlap, contents stay, the
# cache keeps its bounds, and the books of every thread add up.

CACHE_MAX_BYTES = 1 << 20      # what one free-block cache holds at most (_capi.pxd)


@pytest.mark.parametrize("freeable", FREEABLE_KINDS, ids=lambda k: k.__name__)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=400),
       freed=st.sets(st.integers(0, 399), max_size=100))
def test_cached_blocks_never_overlap(freeable, sizes, freed):
    with freeable() as a:
        kept = [a.allocate(n, zero=False).fill(i % 251) for i, n in enumerate(sizes)]
        for seg in [kept[i] for i in freed if i < len(kept)]:
            seg.free()
        kept = [seg for seg in kept if seg.alive]
        again = [a.allocate(n, zero=True) for n in sizes[:len(freed)]]  # some from the cache
        spans = sorted((s.address, s.address + len(s)) for s in kept + again if len(s))
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
        assert all(s.tobytes() == bytes(len(s)) for s in again)


def test_cached_blocks_keep_their_contents(freeable_kind):
    with freeable_kind() as a:
        segs = [a.allocate(8 + i % 700, zero=False).fill(i % 256) for i in range(5000)]
        assert all(s.tobytes() == bytes([i % 256]) * len(s) for i, s in enumerate(segs))


def test_free_block_cache_keeps_its_bound():
    for _ in range(3):
        with ConfinedArena() as a:
            for size in range(16, 4097, 16):  # every class a batch could fill
                a.allocate(size, zero=False)
        with ConfinedArena() as a:
            a.allocate(8)
        stats = arenalib.pool_stats()
        assert stats["cached_bytes"] <= max(1, stats["slots_idle"]) * CACHE_MAX_BYTES


def test_shared_arena_books_with_first_thread_and_others():
    # The first thread to allocate takes the inline path, the others the thread-local one: the
    # arena's books are the sum of both, whichever frees what.
    with Arena() as a:
        mine = [a.allocate(100) for _ in range(10)]
        theirs = []
        worker = threading.Thread(target=lambda: theirs.extend(a.allocate(50) for _ in range(4)))
        worker.start()
        worker.join()
        stats = a.stats()
        assert (stats["live_bytes"], stats["live_segments"], stats["peak_bytes"]) == (1200, 14, 1200)
        threading.Thread(target=lambda: [s.free() for s in mine[:5]]).start()
        for t in threading.enumerate():
            if t is not threading.current_thread():
                t.join()
        for s in theirs:
            s.free()
        stats = a.stats()
        assert (stats["live_bytes"], stats["live_segments"], stats["peak_bytes"]) == (500, 5, 1200)


def test_shared_arena_first_thread_gone_then_slot_reused():
    # More threads than a slot keeps caches for: close gives their caches back, so a fast path
    # that still reached one would use freed memory.  The next arena on the slot must not.
    with Arena() as a:
        def work():
            segs = [a.allocate(64).fill(5) for _ in range(50)]
            for s in segs[::2]:
                s.free()
        threads = [threading.Thread(target=work) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for _ in range(3):
        with Arena() as b:
            segs = [b.allocate(64).fill(6) for _ in range(200)]
            for s in segs[::3]:
                s.free()
            assert all(s.tobytes() == b"\x06" * 64 for s in segs if s.alive)
            assert b.stats()["live_segments"] == sum(1 for s in segs if s.alive)


# -- the pool of jemalloc arenas -------------------------------------------------------------------


def test_slot_stats_keys_and_its_old_name():
    # slot_stats() counts the pooled jemalloc arenas ("slots"), not BufferPools; pool_stats() was
    # its name before and stays the same function.
    assert arenalib.pool_stats is arenalib.slot_stats
    stats = arenalib.slot_stats()
    for key in ("slots_created", "slots_idle", "stale_bytes", "resets", "purges", "stale_limit",
                "purge_limit", "warm_slots"):
        assert isinstance(stats[key], int) and stats[key] >= 0, key


def test_sequential_arenas_reuse_one_slot(kind):
    with kind():
        pass
    created = arenalib.pool_stats()["slots_created"]
    for _ in range(2000):
        with kind() as a:
            a.allocate(100).fill(1)
    assert arenalib.pool_stats()["slots_created"] == created


def test_many_open_arenas_then_reuse(kind):
    arenas = [kind() for _ in range(40)]
    segs = [a.allocate(64).fill(i) for i, a in enumerate(arenas)]
    for i, seg in enumerate(segs):
        assert seg.tobytes() == bytes([i]) * 64
    created = arenalib.pool_stats()["slots_created"]
    for a in arenas:
        a.close()
    arenas = [kind() for _ in range(40)]
    assert arenalib.pool_stats()["slots_created"] == created
    for a in arenas:
        a.close()


def test_stale_garbage_is_dropped_in_bulk(kind):
    stats = arenalib.pool_stats()
    limit = stats["stale_limit"]
    resets = stats["resets"]
    # (a SlicingArena that holds only a few chunks gives them straight back: give it many)
    make = (lambda: kind(chunk_size=65536)) if kind is SlicingArena else kind
    for _ in range(4 * limit // 65536 // 8 + 4):
        with make() as a:
            for _ in range(8):
                a.allocate(65536)
    stats = arenalib.pool_stats()
    assert stats["resets"] > resets
    assert stats["stale_bytes"] <= stats["slots_idle"] * (limit + (1 << 20))


def test_trim_wipes_idle_slots_only(kind):
    with kind() as a:
        a.allocate(100_000).fill(1)
    with kind() as keep:
        seg = keep.allocate(100_000).fill(7)
        arenalib.trim()
        assert arenalib.pool_stats()["stale_bytes"] == 0
        assert seg.alive and seg.tobytes() == b"\x07" * 100_000
        keep.allocate(10).fill(1)


def test_stale_handle_from_a_reused_slot(kind):
    # Arena b most likely takes the jemalloc slot a gave back: a's segments must stay dead and
    # writing through them must be refused, never land in b's memory.
    a = kind()
    old = a.allocate(4096).fill(1)
    a.close()
    with kind() as b:
        new = [b.allocate(4096).fill(2) for _ in range(8)]
        with pytest.raises(ArenaClosedError):
            old.fill(3)
        with pytest.raises(ArenaClosedError):
            old[0] = 3
        assert all(s.tobytes() == b"\x02" * 4096 for s in new)


def test_segments_of_open_arenas_never_overlap():
    rng = np.random.default_rng(7)
    arenas = [k() for k in KINDS for _ in range(2)]
    arenas.append(SlicingArena(chunk_size=4096))
    live = []
    for step in range(3000):
        a = arenas[rng.integers(len(arenas))]
        roll = rng.random()
        if roll < 0.02:
            a.reset()
            live = [(s, v) for s, v in live if s.arena is not a]
        elif roll < 0.3 and live:
            i = int(rng.integers(len(live)))
            seg, _ = live[i]
            if not isinstance(seg.arena, SlicingArena):
                seg.free()
                live.pop(i)
        else:
            size = int(rng.choice([0, 1, 24, 100, 4096, 5000, 70000]))
            align = int(rng.choice([1, 8, 64, 4096]))
            seg = a.allocate(size, zero=bool(rng.integers(2)), align=align)
            value = step % 251
            live.append((seg.fill(value), value))
    for seg, value in live:
        assert seg.tobytes() == bytes([value]) * len(seg)
    spans = sorted((s.address, s.address + len(s)) for s, _ in live if len(s))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    for a in arenas:
        a.close()


def test_pooled_slots_pass_between_kinds_safely():
    # The pool hands one jemalloc arena to arena objects of every kind in turn, with whatever the
    # last one left (garbage, cached free blocks): nothing of it may leak into the next one's
    # segments, nor into arenas open meanwhile.
    rng = np.random.default_rng(11)
    outer = [k() for k in KINDS]
    kept = [(a.allocate(n).fill(0x5A), 0x5A) for a in outer for n in (24, 4096, 70000)]
    for step in range(600):
        kind = KINDS[int(rng.integers(3))]
        with kind() as a:
            live = []
            for _ in range(int(rng.integers(1, 12))):
                size = int(rng.choice([0, 8, 16, 100, 1024, 4096, 20000, 65536, 100_000]))
                zero = bool(rng.integers(2))
                seg = a.allocate(size, zero=zero, align=int(rng.choice([1, 16, 64, 4096])))
                if zero:
                    assert is_zero(seg), (kind.__name__, step, size)
                value = int(rng.integers(256))
                live.append((seg.fill(value), value))
                if kind is not SlicingArena and rng.random() < 0.4:
                    seg, _ = live.pop(int(rng.integers(len(live))))
                    seg.free()
            for seg, value in live:
                assert seg.tobytes() == bytes([value]) * len(seg)
            if rng.random() < 0.2:
                a.reset()
                assert is_zero(a.allocate(5000))
        if step % 50 == 0:
            if rng.random() < 0.5:
                arenalib.trim()
            for seg, value in kept:
                assert seg.tobytes() == bytes([value]) * len(seg)
    for seg, value in kept:
        assert seg.tobytes() == bytes([value]) * len(seg)
    for a in outer:
        a.close()


def test_reset_gives_back_what_counted_against_max_bytes():
    """After reset() every byte that counted against max_bytes is free again, for every kind (a
    shared Arena reserves against the limit in a counter of its own)."""
    for kind in KINDS:
        with kind(max_bytes=1000) as arena:
            for _ in range(5):
                arena.allocate(600)
                with pytest.raises(MemoryError, match="max_bytes=1000"):
                    arena.allocate(600)
                arena.reset()
            assert arena.stats()["live_bytes"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_flag_is_refused_as_such_whatever_the_size(kind):
    """align and zero are judged before the size: a bad one is a ValueError or TypeError even with
    a size past any address space (which alone is a MemoryError)."""
    with kind() as arena:
        for size in (10, 2**63, 2**64):
            with pytest.raises(ValueError, match="align"):
                arena.allocate(size, align=3)
            with pytest.raises(TypeError, match="zero"):
                arena.allocate(size, zero="no")
            with pytest.raises(ValueError, match="align"):
                arenalib.allocate(size, align=-1)
        with pytest.raises(MemoryError):
            arena.allocate(2**63)
