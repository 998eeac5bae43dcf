"""Other Cython extensions cimport arenalib and allocate without the GIL (issue 5), through the C-level
API: its function table (``cimport arenalib``) and its inline fast paths (``cimport arenalib.fast``).

The example consumer shipped in arenalib/_examples/cython is built here against the package, in a
temporary directory, with its own meson.build, as a downstream project would build it, both ways
from one source (each test below runs on both); the test-only consumers of tests/cython are built
once for the session (conftest.py)."""

import ast
import collections
import ctypes
import itertools
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest
from support import (
    FREEABLE_KINDS,
    KINDS,
    ROOT,
    assert_ok,
    overlapping_live_carves,
    resetting_without_the_gil,
    run_python,
    run_threads,
)

import arenalib


def test_consumer_uses_the_package_pxd(example_consumers):
    # The consumer's C code imports arenalib._arena's C API at import time (no link against it).
    assert "arenalib._arena" in sys.modules
    assert example_consumers["table"].fill_free_loop.__module__ == "arenalib_consumer"
    assert example_consumers["fast"].fill_free_loop.__module__ == "arenalib_consumer_fast"


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
@pytest.mark.parametrize("size", [0, 8, 512, 4096, 65536, 1 << 20])
@pytest.mark.parametrize("zero", [False, True])
def test_nogil_allocate_fill_free(consumer, kind, size, zero):
    with kind() as arena:
        assert consumer.fill_free_loop(arena, 200, size, zero) == 200 * size
        stats = arena.stats()
        assert stats["live_bytes"] == 0
        assert stats["live_segments"] == 0
        assert stats["allocated_total"] == 200 * size


def test_nogil_allocations_show_in_stats_and_die_with_reset(consumer):
    with arenalib.ConfinedArena() as arena:
        consumer.keep_allocations(arena, 100, 1000)
        stats = arena.stats()
        assert (stats["live_bytes"], stats["live_segments"]) == (100_000, 100)
        assert stats["peak_bytes"] == 100_000
        arena.reset()
        assert arena.stats()["live_bytes"] == 0


def test_slicing_arena_through_the_c_api(consumer):
    with arenalib.SlicingArena(chunk_size=1 << 16) as arena:
        consumer.keep_allocations(arena, 1000, 100)
        assert arena.stats()["live_bytes"] == 100_000
        with pytest.raises(arenalib.UnsupportedOperation):
            consumer.fill_free_loop(arena, 1, 8)


def test_limits_and_closed_arenas_raise_through_arena_raise(consumer):
    with arenalib.ConfinedArena(max_bytes=4096) as arena:
        with pytest.raises(MemoryError, match="max_bytes"):
            consumer.keep_allocations(arena, 10, 1000)
        assert arena.stats()["live_bytes"] == 4000  # the four that fitted
    with pytest.raises(arenalib.ArenaClosedError):
        consumer.fill_free_loop(arena, 1, 8)
    with pytest.raises(TypeError):
        consumer.fill_free_loop(bytearray(8), 1, 8)


def test_confined_handle_from_wrong_thread_fails_cleanly(consumer):
    arena = arenalib.ConfinedArena()
    errors = []

    def other_thread():
        try:
            consumer.fill_free_loop(arena, 10, 64)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], arenalib.WrongThreadError)
    # untouched and still fine for its owner
    assert arena.stats()["live_segments"] == 0
    assert consumer.fill_free_loop(arena, 10, 64) == 640
    arena.close()


def test_scoped_core_without_python_object(consumer):
    before = arenalib.live_objects()["open_arenas"]
    assert consumer.scoped_loop(10_000, 512) == 10_000
    assert arenalib.live_objects()["open_arenas"] == before


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_on_their_own_confined_arenas(consumer, threads):
    def work(index):
        with arenalib.ConfinedArena() as arena:
            consumer.batch_loop(arena, 200, 64, 256, index + 1)
            assert arena.stats()["live_segments"] == 0

    run_threads(work, threads)


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_on_one_shared_arena(consumer, threads):
    arena = arenalib.Arena()

    def work(index):
        consumer.batch_loop(arena, 200, 64, 256, index + 1)

    run_threads(work, threads)
    stats = arena.stats()
    assert stats["live_bytes"] == 0 and stats["live_segments"] == 0
    assert stats["allocated_total"] == threads * 200 * 64 * 256
    arena.close()


def test_slicing_arena_refuses_concurrent_carving(consumer):
    # Two threads carving one SlicingArena: each call either works or gets ArenaError (busy),
    # never corrupted blocks.
    arena = arenalib.SlicingArena()
    outcomes = []

    def work(index):
        for _ in range(200):
            try:
                consumer.keep_allocations(arena, 50, 64)
                outcomes.append("ok")
            except arenalib.ArenaError:
                outcomes.append("busy")

    run_threads(work, 2)
    assert "ok" in outcomes
    # a busy call may have carved part of its 50 blocks before it was refused
    live = arena.stats()["live_segments"]
    assert 50 * outcomes.count("ok") <= live <= 50 * len(outcomes)
    arena.close()


def _assert_blocks_intact(blocks, size):
    """blocks: (address, pattern) pairs of live blocks: none overlaps another, each holds its
    pattern."""
    blocks = sorted(blocks)
    for (address, _), (next_address, _) in itertools.pairwise(blocks):
        assert address + size <= next_address, "two live blocks overlap"
    for address, pattern in blocks:
        assert ctypes.string_at(address, size) == bytes([pattern]) * size


@pytest.mark.parametrize("threads", [2, 4])
def test_slicing_arena_carved_by_threads_at_once(consumer, threads):
    # Threads carving one SlicingArena at the same time: carves refused as busy are retried, and
    # every block carved is whole, its own and intact at the end.
    size = 48
    with arenalib.SlicingArena(chunk_size=1 << 20) as arena:
        carved = {}

        def work(index):
            blocks = []
            for _ in range(100):
                addresses, _ = consumer.carve_blocks(arena, 20, size, index + 1)
                blocks += addresses
            carved[index] = blocks

        run_threads(work, threads)
        _assert_blocks_intact(
            [(address, index + 1) for index, blocks in carved.items() for address in blocks], size)
        assert arena.stats()["live_segments"] == threads * 100 * 20


def test_slicing_arena_handed_between_threads_is_never_busy(consumer):
    # Threads taking turns (never at once): each takes the arena over from the one before, and a
    # handover is never refused as busy, since nobody is carving at that moment.
    size = 100
    turns = [threading.Event() for _ in range(3)]
    blocks = []
    refusals = []
    rounds = 50

    def work(index):
        for _ in range(rounds):
            turns[index].wait()
            turns[index].clear()
            addresses, refused = consumer.carve_blocks(arena, 10, size, index + 1)
            blocks.extend((address, index + 1) for address in addresses)
            refusals.append(refused)
            turns[(index + 1) % len(turns)].set()

    with arenalib.SlicingArena(chunk_size=4096) as arena:  # small chunks: the slow path too
        turns[0].set()
        run_threads(work, len(turns))
        assert refusals == [0] * (rounds * len(turns))
        _assert_blocks_intact(blocks, size)
        # Python-level use between threads takes the arena over the same way.
        seg = arena.allocate(size, zero=False).fill(9)
        _assert_blocks_intact([*blocks, (seg.address, 9)], size)


def test_consumer_built_against_other_layouts_is_refused(cython_consumers):
    # The fast paths are inline, compiled with the struct layouts of the arenalib built against:
    # a consumer built against another C API version must fail cleanly, not touch memory.
    stale = cython_consumers["stale_consumer"]
    with arenalib.ConfinedArena() as arena:
        with pytest.raises(ImportError, match="rebuild the extension"):
            stale.fill_free_loop(arena, 10, 64)
        assert arena.stats()["live_segments"] == 0
    with pytest.raises(ImportError, match="another arenalib C ABI"):
        stale.scoped_loop(10, 64)


def test_consumer_built_against_another_table_is_refused(cython_consumers):
    """A table-only consumer compiled against another function table (here arena_free's size is a
    Py_ssize_t) is refused by its first call, before it calls anything of the table."""
    stale = cython_consumers["stale_table_consumer"]
    with arenalib.ConfinedArena() as arena:
        with pytest.raises(ImportError, match="another arenalib C API table"):
            stale.fill_free_loop(arena, 10, 64)
        assert arena.stats()["live_segments"] == 0
    with pytest.raises(ImportError, match="rebuild the extension"):
        stale.scoped_loop(10, 64)


def test_fingerprints_are_derived_from_the_declarations_in_the_tree():
    """arenalib/_fingerprints.pxd is what tools/abi_fingerprint.py derives from the declarations now:
    a change to a struct, a constant, an inline rule or a table signature without it would let a
    consumer of the old declarations run against the new arenalib."""
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "abi_fingerprint.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_fingerprint_digest_ignores_comments_and_sees_declarations(tmp_path):
    """The digest leaves comments and blank lines out (rewording a comment breaks no consumer) and
    sees every declaration, including a field added into a struct's padding."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import abi_fingerprint
    finally:
        sys.path.pop(0)
    package = tmp_path / "arenalib"
    shutil.copytree(Path(arenalib.get_include(), "arenalib"), package,
                    ignore=shutil.ignore_patterns("*.so", "*.py", "*.pyi", "*.pyx", "*.pxi", "__pycache__"))
    original = abi_fingerprint.digest(package, abi_fingerprint.FAST_FILES)
    table = abi_fingerprint.digest(package, abi_fingerprint.TABLE_FILES)
    abi = package / "_abi.pxd"
    text = abi.read_text()
    abi.write_text(text.replace("cdef struct Books:", "# a reworded comment\n\ncdef struct Books:"))
    assert abi_fingerprint.digest(package, abi_fingerprint.FAST_FILES) == original
    abi.write_text(text.replace("    int busy ", "    char added\n    int busy "))
    assert abi_fingerprint.digest(package, abi_fingerprint.FAST_FILES) != original
    abi.write_text(text)
    # A verbatim C block's preprocessor lines are declarations, not comments (they began with '#').
    arena = package / "_arena.pxd"
    arena_text = arena.read_text()
    arena.write_text(arena_text.replace("#define ARENALIB_SEG_FREEING 2", "#define ARENALIB_SEG_FREEING 7"))
    assert abi_fingerprint.digest(package, abi_fingerprint.FAST_FILES) != original
    arena.write_text(arena_text.replace("/* Segment._freed", "/* Reworded: Segment._freed"))
    assert abi_fingerprint.digest(package, abi_fingerprint.FAST_FILES) == original
    # The inline paths' layout is no business of a table-only consumer's.
    assert abi_fingerprint.digest(package, abi_fingerprint.TABLE_FILES) == table


def cython_lines(directory: Path, source: str) -> int:
    """Lines of C that Cython generates for a module of ``source`` (against the installed arenalib)."""
    pyx = directory / "module.pyx"
    pyx.write_text(source)
    result = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", arenalib.get_include(), str(pyx)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return len((directory / "module.c").read_text().splitlines())


def test_table_only_consumers_compile_no_arenalib_code(tmp_path):
    """``cimport arenalib`` adds at most 1,000 lines of C to an empty module (the table's
    declarations and its one-line calls), where the inline fast paths add thousands."""
    empty = cython_lines(tmp_path, "x = 1\n")
    table = cython_lines(tmp_path, "cimport arenalib\nx = 1\n")
    fast = cython_lines(tmp_path, "cimport arenalib.fast\nx = 1\n")
    assert table - empty <= 1000, (empty, table)
    assert fast - empty > table - empty, (empty, table, fast)


def test_buffer_pool_has_no_c_level_arena_handle(consumer):
    # A pool's region is carved by acquire(); raw C allocations from it could never be freed.
    with arenalib.BufferPool(4096, 2) as pool, pytest.raises(TypeError):
        consumer.keep_allocations(pool, 1, 64)


BAD_ALIGNS = [3, 5, 6, 7, 9, 10, 12, 15, 24, 48, 96, 4095, 4097, 3 << 20, 1 << 31]
GOOD_ALIGNS = [0, 1, 2, 4, 8, 16, 32, 64, 4096]


@pytest.mark.parametrize("kind", FREEABLE_KINDS)
@pytest.mark.parametrize("size", [64, 1000, 1 << 20])
def test_c_api_free_of_null_does_nothing(cython_consumers, kind, size):
    """arena_free(core, NULL, size) is free(NULL): ARENA_OK, and nothing taken in.  It once went
    into the free-block cache, whose next allocation was NULL and whose next free crashed; past
    the cache, jemalloc was handed NULL (SIGSEGV)."""
    safety_consumer = cython_consumers["safety_consumer"]
    with kind() as arena:
        err, first, second = safety_consumer.free_null(arena, size)
        assert err == safety_consumer.OK
        assert first != 0 and second != 0 and first != second
        stats = arena.stats()
        assert (stats["live_segments"], stats["live_bytes"]) == (0, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_c_api_refuses_bad_alignments_on_the_inline_fast_paths(cython_consumers, kind):
    """arena_allocate() from a cimporting module returns ARENA_EINVAL for every alignment that is not
    a power of two up to 1 GiB, with the fast path warm (a ConfinedArena's free list holding a
    block, a SlicingArena biased to this thread), as the slow path and the Python API do."""
    safety_consumer = cython_consumers["safety_consumer"]
    with kind() as arena:
        codes = {align: safety_consumer.allocate_aligned(arena, 64, align) for align in BAD_ALIGNS}
        assert codes == dict.fromkeys(BAD_ALIGNS, safety_consumer.EINVAL)
        codes = {align: safety_consumer.allocate_aligned(arena, 64, align) for align in GOOD_ALIGNS}
        assert codes == dict.fromkeys(GOOD_ALIGNS, safety_consumer.OK)
        for align in BAD_ALIGNS:
            with pytest.raises(ValueError, match="align"):
                arena.allocate(64, align=align)


def test_c_api_arena_core_init_prepares_a_garbage_stack_core(cython_consumers):
    """arena_core_init() makes an ArenaCore on the stack full of garbage (0xFF bytes) ready for
    arena_open(), for every kind, with and without max_bytes; nothing stays open afterwards."""
    consumer = cython_consumers["core_init_consumer"]
    before = arenalib.live_objects()["open_arenas"]
    for kind in consumer.KINDS.values():
        assert consumer.garbage_stack_core(kind, -1, 512, 200) == 200 * 512
        assert consumer.garbage_stack_core(kind, 4096, 512, 20) == 20 * 512
        assert consumer.garbage_stack_core(kind, -1, 1 << 20, 5) == 5 << 20
    assert arenalib.live_objects()["open_arenas"] == before


ERROR_CODES = {  # code: (exception class, words of the table's message)
    1: (MemoryError, "out of memory"),
    2: (MemoryError, "max_bytes would be exceeded"),
    3: (arenalib.ArenaClosedError, "the arena is closed"),
    4: (arenalib.WrongThreadError, "from another thread"),
    5: (ValueError, "align must be a power of two"),
    6: (BufferError, "buffer exports"),
    7: (arenalib.ArenaError, "in use by another thread"),
    8: (arenalib.UnsupportedOperation, "cannot be freed one by one"),
    9: (ValueError, "the mark is of another arena, or used up"),
    10: (ValueError, "a frame entered after the mark is still open"),
}


@pytest.mark.parametrize("code", ERROR_CODES)
def test_c_api_errors_come_from_the_one_table(cython_consumers, code):
    """arena_raise() turns each error code into the exception class the Python methods raise for it,
    with the table's message; codes outside the table are ArenaError, ARENA_OK raises nothing."""
    safety_consumer = cython_consumers["safety_consumer"]
    exc_type, words = ERROR_CODES[code]
    with pytest.raises(exc_type, match=words) as caught:
        safety_consumer.raise_code(code)
    assert type(caught.value) is exc_type
    safety_consumer.raise_code(0)
    for unknown in (-1, len(ERROR_CODES) + 1, 1000):
        with pytest.raises(arenalib.ArenaError, match=f"unknown arenalib error code {unknown}"):
            safety_consumer.raise_code(unknown)


def test_a_c_level_reset_without_the_gil_never_runs_inside_python_level_use(cython_consumers):
    # Any thread may use an Arena; on a GIL build its Python-level users hold the GIL and announce
    # nothing else, so arena_reset() without the GIL ran inside an allocate(), fill() or free() of
    # another thread and crashed in jemalloc within seconds (2026-12-06).  It now takes the GIL on
    # a GIL build (3.13t: it waits for the accesses under way).  A segment a reset killed between
    # its allocate and its use raises ArenaClosedError, and nothing else happens.
    arena = arenalib.Arena()
    wrong = 0
    with resetting_without_the_gil(cython_consumers["safety_consumer"].reset_core_without_the_gil,
                                   arena) as resets:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            for i in range(500):
                try:
                    seg = arena.allocate(64, zero=False)
                    seg.fill(i & 255)
                    wrong += seg[0] != i & 255 or seg[63] != i & 255
                    seg.free()
                except arenalib.ArenaClosedError:
                    pass
    assert resets and wrong == 0
    assert (arena.stats()["live_bytes"], arena.stats()["live_segments"]) == (0, 0)
    arena.close()


def test_python_and_c_close_share_one_path(cython_consumers):
    """A ConfinedArena closed from another thread, or with a live export, is refused with the same
    exception by close() and by the C API's arena_close(), and stays open and intact either way."""
    safety_consumer = cython_consumers["safety_consumer"]
    arena = arenalib.ConfinedArena()
    seg = arena.allocate(64).fill(7)
    view = memoryview(seg)
    for close in (arena.close, lambda: safety_consumer.close_core(arena)):
        with pytest.raises(BufferError, match="buffer export"):
            close()
    view.release()
    errors = []

    def from_another_thread():
        for close in (arena.close, lambda: safety_consumer.close_core(arena)):
            try:
                close()
            except arenalib.WrongThreadError as exc:
                errors.append(exc)

    thread = threading.Thread(target=from_another_thread)
    thread.start()
    thread.join()
    assert len(errors) == 2
    assert not arena.closed and seg.tobytes() == b"\x07" * 64
    safety_consumer.close_core(arena)
    assert arena.closed and not seg.alive
    arena.close()  # idempotent


@pytest.mark.parametrize("kind", KINDS)
def test_a_module_handed_a_core_fetches_the_function_table_without_the_gil(cython_consumers, kind):
    """A module that never called arena_core()/arena_open() gets an ArenaCore from another module and
    allocates through it without the GIL, past the inline fast path (align=64): it fetches arenalib's
    function table on its own and the allocation is the arena's."""
    safety_consumer = cython_consumers["safety_consumer"]
    handoff = cython_consumers["handoff_consumer"]
    with kind() as arena:
        address = safety_consumer.core_address(arena)
        for round_ in range(3):
            code, block = handoff.allocate_without_the_gil(address, 256, 64)
            assert code == safety_consumer.OK and block % 64 == 0
            assert arena.stats()["live_segments"] == round_ + 1
    code, _ = handoff.allocate_without_the_gil(address, 256, 64)
    assert code != safety_consumer.OK  # closed: ARENA_ECLOSED, nothing allocated


@pytest.mark.parametrize("kind", KINDS)
def test_c_api_refuses_a_copied_core(cython_consumers, kind):
    """A copy of an open ArenaCore (``copy = core[0]``) is refused by every call, while the
    original is open and after its close, with the fast paths warm: before, the copy allocated
    from the slot after the close (ARENA_OK for all three kinds) and a later scope was handed the
    copy's live block.  A scope opened afterwards works and is not aliased."""
    safety_consumer = cython_consumers["safety_consumer"]
    codes = safety_consumer.copied_core(safety_consumer.KINDS[kind.__name__])
    assert codes and set(codes.values()) == {safety_consumer.ECLOSED}, codes
    with kind() as arena:
        segs = [arena.allocate(64).fill(i) for i in range(8)]
        assert [seg.tobytes() for seg in segs] == [bytes([i]) * 64 for i in range(8)]
        assert len({seg.address for seg in segs}) == 8


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("holder", ["memoryview", "numpy"])
def test_a_core_closed_deferred_is_not_reopened_while_its_exports_live(cython_consumers, kind, holder):
    """Re-opening from C an arena object's core closed deferred (the end of its with-block, with a
    buffer export alive) reset the count of exports its held memory waits for: the old export's
    release then counted the new open's down, close() passed over a live export of the new open,
    and writes through it landed in another arena's segments."""
    consumer = cython_consumers["safety_consumer"]
    if holder == "numpy":
        if kind is not arenalib.Arena:
            pytest.skip("numpy() is Arena's")
        np = pytest.importorskip("numpy")
    arena = kind()
    address = consumer.core_address(arena)
    if holder == "numpy":
        with arena.numpy():
            held = np.arange(100, dtype=np.uint8)
    else:
        held = memoryview(arena.allocate(100).fill(7))
    arena.close(deferred=True)
    with pytest.raises(BufferError, match="1 buffer export"):
        consumer.open_core_at(address, consumer.KINDS[kind.__name__])
    assert arena.closed and arena.stats()["held_bytes"] > 0
    del held  # the last export: the held memory goes back, and the core may open again
    assert arena.stats()["held_bytes"] == 0
    consumer.open_core_at(address, consumer.KINDS[kind.__name__])
    seg = arena.allocate(64).fill(9)
    view = memoryview(seg)
    with pytest.raises(BufferError):
        arena.close()
    view.release()
    arena.close()
    assert not seg.alive


@pytest.mark.parametrize("kind", KINDS)
def test_an_arena_objects_core_opens_again_as_its_own_kind_only(cython_consumers, kind):
    """arena_open() of an arena object's closed core with another kind opened a ConfinedArena that
    handed its segments to other threads, or an Arena whose NumPy arrays freed on another thread
    leaked: refused (ValueError, the arena stays closed); its own kind opens it."""
    consumer = cython_consumers["safety_consumer"]
    arena = kind()
    address = consumer.core_address(arena)
    arena.close()
    for other in set(consumer.KINDS.values()) - {consumer.KINDS[kind.__name__]}:
        with pytest.raises(ValueError, match=f"{kind.__name__}'s: it opens as"):
            consumer.open_core_at(address, other)
        assert arena.closed
    consumer.open_core_at(address, consumer.KINDS[kind.__name__])
    assert not arena.closed and arena.allocate(8).fill(1).tobytes() == b"\x01" * 8
    arena.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_module_of_another_abi_handed_a_core_is_refused_on_the_fast_path(cython_consumers, kind):
    """The inline fast paths read the core with the layout and rules their module was compiled
    with: a module of another C ABI handed a core by one of the right ABI took them without any
    check (a size class rule changed: 32 bytes handed out for 64), and read the core's pointers
    where its own layout put them (a SlicingArena's chunk size taken for its carver record: a
    crash) before any check.  It is refused, and allocates or marks nothing, whichever path the
    call would take."""
    good, stale = cython_consumers["safety_consumer"], cython_consumers["stale_handoff_consumer"]
    with kind() as arena:
        address = good.core_address(arena)
        assert good.allocate_aligned(arena, 256, 0) == good.OK  # warm: a block cached, or biased
        live = arena.stats()["live_segments"]
        for align in (0, 64):
            code, block = stale.allocate_without_the_gil(address, 256, align)
            assert (code, block) == (good.ECLOSED, 0)
        assert stale.mark_and_rewind_without_the_gil(address) == (good.ECLOSED, -1)
        assert arena.stats()["live_segments"] == live
        if kind is arenalib.SlicingArena:
            assert arena.stats()["marks"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_of_an_arena_objects_core_closes_nothing(cython_consumers, kind):
    """The C API's close of an arena object's core is the object's close(): reached through a copy
    of the core (which the C API promises to treat as closed), it closed the original object, and
    a copy kept past the object's death called into freed memory."""
    consumer = cython_consumers["safety_consumer"]
    with kind() as arena:
        seg = arena.allocate(64).fill(5)
        with pytest.raises(arenalib.ArenaClosedError):
            consumer.close_a_copy_of(arena)
        assert not arena.closed and seg.tobytes() == b"\x05" * 64


def test_python_calls_wait_for_c_threads_carving_the_same_slicing_arena(cython_consumers):
    """A Python allocate or frame of a SlicingArena that a C library carves from on other threads
    waits for the carve in flight (microseconds) instead of raising ArenaError ("in use by another
    thread"), with the GIL as without it.  A frame whose exit raised that stayed open after its
    block."""
    safety_consumer = cython_consumers["safety_consumer"]
    safety_consumer.stop_carving(False)
    with arenalib.SlicingArena() as arena:
        # Plain carves (no marks, which a frame's exit would find out of order), 16 MiB at most.
        carvers = [threading.Thread(target=safety_consumer.carve_until_stopped,
                                    args=(arena, 16, 1 << 20, False)) for _ in range(2)]
        for carver in carvers:
            carver.start()
        try:
            rounds = 0
            while rounds < 2000 or (any(c.is_alive() for c in carvers) and rounds < 200_000):
                arena.allocate(16)
                with arena.frame() as frame:
                    frame.allocate(16)
                rounds += 1
            assert arena.stats()["marks"] == 0  # every frame's exit went through
        finally:
            safety_consumer.stop_carving()
            for carver in carvers:
                carver.join()


def test_a_python_carve_beside_c_marks_dies_with_the_mark_it_was_carved_under(cython_consumers):
    """A C thread without the GIL marks, carves and rewinds a SlicingArena that Python carves from:
    a Python carve made after a C mark dies at its rewind, and never stays alive under the next
    carve (with the GIL as without it: 3 runs of 3 on 3.11 overwrote live segments; helper 62)."""
    safety_consumer = cython_consumers["safety_consumer"]
    safety_consumer.stop_carving(False)
    with arenalib.SlicingArena(chunk_size=4096) as arena:
        carver = threading.Thread(target=safety_consumer.carve_until_stopped,
                                  args=(arena, 16, 1 << 62, True))
        carver.start()
        try:
            found = overlapping_live_carves(arena, 2.0)
        finally:
            safety_consumer.stop_carving()
            carver.join()
        assert found is None


def while_holding_the_gil(consumer, call, check):
    """Run ``call`` (a consumer function called with on_go=True) on a thread, let it go while this
    thread holds the GIL for 0.5 s and runs ``check()`` at the end of that: whether the call
    finished meanwhile, and its result."""
    consumer.reset_stage()
    done = []
    t = threading.Thread(target=lambda: done.append(call()))
    old = sys.getswitchinterval()
    t.start()
    try:
        while consumer.stage() != 1:
            time.sleep(0.001)  # (the GIL released: the thread reaches its wait without it)
        sys.setswitchinterval(60)  # no handover of the GIL while this thread computes
        consumer.go()
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and consumer.stage() != 3:
            pass  # the GIL held
        finished = consumer.stage() == 3
        check()
    finally:
        sys.setswitchinterval(old)
        t.join()
    return finished, done[0]


GIL_BUILD_ONLY = pytest.mark.skipif(sysconfig.get_config_var("Py_GIL_DISABLED") == 1,
                                    reason="no GIL to hold: the kill waits for the accesses themselves")


@GIL_BUILD_ONLY
@pytest.mark.parametrize("python_carved", [True, False])
def test_a_c_rewind_of_python_carves_waits_for_the_gil_and_of_c_carves_does_not(
        cython_consumers, python_carved):
    """On a GIL build a Python thread holds the GIL alone while it uses a segment, so a C-level
    rewind from a thread without the GIL that kills segments carved from Python takes the GIL
    first; one that kills only what C carved does not wait for it (helper 62: the rewind landed
    inside a Python read, which returned the next carve's bytes)."""
    consumer = cython_consumers["safety_consumer"]
    with arenalib.SlicingArena() as arena:
        before = arena.allocate(16).fill(0x22)
        mark = consumer.mark_bytes(arena)
        seg = arena.allocate(16).fill(0x11) if python_carved else None

        def still_alive():
            if python_carved:
                assert seg.alive and seg.tobytes() == b"\x11" * 16

        finished, err = while_holding_the_gil(
            consumer, lambda: consumer.rewind_then_scribble(arena, mark, 16, 0xCC, True), still_alive)
        assert finished is not python_carved
        assert err == consumer.OK and before.tobytes() == b"\x22" * 16
        if python_carved:
            assert not seg.alive


def abandoned_frame_segment(arena):
    """A segment of a frame whose exit a live export refused, the export released since: it dies at
    the next mark, rewind or frame exit."""
    frame = arena.frame()
    frame.__enter__()
    seg = frame.allocate(16).fill(0x11)
    view = memoryview(seg)
    with pytest.raises(BufferError):
        frame.__exit__(None, None, None)
    view.release()
    assert seg.alive
    return seg


@GIL_BUILD_ONLY
def test_a_c_mark_that_lets_a_python_carved_frame_go_waits_for_the_gil(cython_consumers):
    """A push lets abandoned frames go: their segments die as at a rewind, so a C-level mark that
    would let a frame Python carved in go takes the GIL first (helper 63: 45 reads in 20,000
    returned the next carve's bytes)."""
    consumer = cython_consumers["safety_consumer"]
    with arenalib.SlicingArena() as arena:
        seg = abandoned_frame_segment(arena)

        def still_alive():
            assert seg.alive and seg.tobytes() == b"\x11" * 16

        finished, (err, _) = while_holding_the_gil(
            consumer, lambda: consumer.mark_then_scribble(arena, 16, 0xCC, True), still_alive)
        assert not finished and err == consumer.OK and not seg.alive
        assert arena.stats()["marks"] == 1  # the C mark; the abandoned frame went


def test_a_c_rewind_beside_python_reads_is_not_refused_as_exported(cython_consumers):
    """A Python read of a segment counts as an export of it while it runs (GIL build): a C rewind
    that must take the GIL first asks for it before it looks at the exports, so a read under way
    is waited out rather than reported as ARENA_EEXPORTED (helper 63: 92 rewinds in 2,000)."""
    consumer = cython_consumers["safety_consumer"]
    results = collections.Counter()
    with arenalib.SlicingArena() as arena:
        for _ in range(300):
            mark = consumer.mark_bytes(arena)
            seg = arena.allocate(4096, zero=False).fill(1)
            out = []
            t = threading.Thread(target=lambda out=out, mark=mark: out.append(
                consumer.rewind_once(arena, mark)))
            t.start()
            while not out:
                try:
                    seg.tobytes()
                except arenalib.ArenaClosedError:
                    pass
            t.join()
            results[out[0]] += 1
            if out[0] != consumer.OK:
                assert consumer.rewind_once(arena, mark) == consumer.OK
    assert results == {consumer.OK: 300}


@pytest.mark.slow  # ~50,000 threads: about 20 s
def test_a_c_rewind_never_lands_inside_a_python_read_of_what_it_kills(cython_consumers):
    """The race itself (helper 62's reproducer): a C thread without the GIL rewinds past a segment
    that Python reads meanwhile, then carves and fills its bytes.  Every read that raises nothing
    returns the segment's own bytes (1-2 of 20,000 reads did not, before the GIL-taking rewind)."""
    consumer = cython_consumers["safety_consumer"]
    consumer.reset_stage()
    wrong = []
    with arenalib.SlicingArena(chunk_size=1 << 20) as arena:
        for _ in range(50_000):
            mark = consumer.mark_bytes(arena)
            seg = arena.allocate(16, zero=False).fill(0x11)
            t = threading.Thread(target=consumer.rewind_then_scribble, args=(arena, mark, 16, 0xCC))
            t.start()
            try:
                while True:
                    got = seg.tobytes()
                    if got != b"\x11" * 16:
                        wrong.append(got)
                        break
            except arenalib.ArenaClosedError:
                pass
            t.join()
    assert wrong == []


FORK_WHILE_C_CARVES = """
import collections, importlib.util, os, signal, sys, threading, time, traceback, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads (3.12+)
spec = importlib.util.spec_from_file_location("safety_consumer", sys.argv[1])
consumer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(consumer)
import arenalib
arena = arenalib.SlicingArena()
carvers = [threading.Thread(target=consumer.carve_until_stopped, args=(arena, 64, 1 << 62, True))
           for _ in range(2)]
for carver in carvers:
    carver.start()
time.sleep(0.05)
outcomes = collections.Counter()
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a lock the fork left held: waited for forever
        try:
            try:
                arena.allocate(64).fill(1)
                with arena.frame() as frame:
                    frame.allocate(64).fill(2)
                arena.reset()
                outcome = 10
            except arenalib.ArenaError as exc:  # busy for good: a carve was under way at the fork
                assert "forked" in str(exc), exc
                outcome = 11
            arena.close()
            assert arena.closed
            with arenalib.SlicingArena() as fresh:  # the child's own arenas work
                fresh.allocate(64).fill(3)
            os._exit(outcome)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    status = os.waitpid(pid, 0)[1]
    outcomes[os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)] += 1
    time.sleep(0.005)
consumer.stop_carving()
for carver in carvers:
    carver.join()
print(dict(outcomes))
"""


def test_a_fork_while_c_threads_carve_leaves_the_child_a_usable_or_refusing_arena(cython_consumers):
    """A fork while C threads carve and rewind a SlicingArena without the GIL: in the child the
    arena works, or, when a carve held its busy lock at the fork (its state maybe half updated),
    refuses every use with ArenaError saying so, for good; it closes either way, and the child's
    new arenas work.  Never a wait for a thread that is not in the child: a rewind's exclusive
    flag left held made every Python access of the arena wait forever on 3.13t, and a Python
    call waiting out the busy lock waited forever."""
    module = cython_consumers["safety_consumer"].__file__
    outcomes = ast.literal_eval(assert_ok(run_python(FORK_WHILE_C_CARVES, module, "30")).strip())
    assert set(outcomes) <= {10, 11} and sum(outcomes.values()) == 30, outcomes


C_CARVES_UNDER_TRACEMALLOC = """
import importlib.util, sys, threading, time, tracemalloc
spec = importlib.util.spec_from_file_location("safety_consumer", sys.argv[1])
consumer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(consumer)
import arenalib
tracemalloc.start()
arena = arenalib.SlicingArena()
consumer.stop_carving(False)
# 4 KiB carves: a new chunk every 63, so the chunk list grows all along (up to 64 MiB a thread).
carvers = [threading.Thread(target=consumer.carve_until_stopped, args=(arena, 4096, 16384, False))
           for _ in range(2)]
for carver in carvers:
    carver.start()
rounds = 0
while any(carver.is_alive() for carver in carvers) and rounds < 200_000:
    arena.allocate(16)
    with arena.frame() as frame:
        frame.allocate(16)
    rounds += 1
consumer.stop_carving()
for carver in carvers:
    carver.join()
arena.close()
print("ok")
"""


def test_c_threads_carving_under_tracemalloc_never_wait_for_the_gil_under_the_busy_lock(cython_consumers):
    """A C thread that grows a SlicingArena's books under its busy lock must not need the GIL:
    tracemalloc's hook of PyMem_Raw*() takes it, while a Python thread waiting out the busy lock
    holds it (a hang, 10 runs of 10; on 3.13t the hook's thread state waited for that thread to
    stop).  The books are libc's allocations."""
    module = cython_consumers["safety_consumer"].__file__
    assert assert_ok(run_python(C_CARVES_UNDER_TRACEMALLOC, module, timeout=120)).strip() == "ok"


FIRST_ALLOCATIONS_UNDER_TRACEMALLOC = """
import importlib.util, sys, threading, tracemalloc
spec = importlib.util.spec_from_file_location(sys.argv[2], sys.argv[1])
consumer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(consumer)
import arenalib
tracemalloc.start()
for _ in range(60):
    arena = arenalib.Arena()
    threads = [threading.Thread(target=consumer.fill_free_loop, args=(arena, 1, 64)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(300):
        arena.stats()
    for thread in threads:
        thread.join()
    arena.close()
print("ok")
"""


def test_first_allocations_of_c_threads_under_tracemalloc_never_wait_for_the_gil(consumer):
    """A thread's first allocation from a shared Arena makes its cache under the slot's
    threads_lock, which stats() takes with the GIL held: with tracemalloc on, the raw allocator's
    hook took the GIL there (a hang, 3 runs of 3)."""
    name = consumer.__name__
    assert assert_ok(run_python(FIRST_ALLOCATIONS_UNDER_TRACEMALLOC, consumer.__file__, name,
                                timeout=120)).strip() == "ok"
