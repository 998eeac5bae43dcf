"""What the tests share: the arena kinds, the sanitizer build, child interpreters, threads, the resident
set size, and the Cython consumers of arenalib's C API built with meson.

Test modules and conftest.py import from here (``from support import KINDS, run_python``): pytest's
default import mode puts tests/, a folder without __init__.py, first on sys.path.  tests/safety_child.py
runs as a script in a child interpreter and does without it."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from pathlib import Path

import pytest

import arenalib
from arenalib import ArenaClosedError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# -- the arena kinds --------------------------------------------------------------------------------

# (pytest names a parameter that is a class by its __name__: test ids read test_x[Arena])
KINDS = [arenalib.Arena, arenalib.ConfinedArena, arenalib.SlicingArena]
FREEABLE_KINDS = [arenalib.Arena, arenalib.ConfinedArena]  # seg.free() works (not SlicingArena)


def release(seg) -> None:
    """Free a segment where the arena kind can; a SlicingArena keeps it until reset/close."""
    if not isinstance(seg.arena, arenalib.SlicingArena):
        seg.free()


def slots_in_use() -> int:
    """Pooled jemalloc arenas held by open arena objects."""
    stats = arenalib.pool_stats()
    return stats["slots_created"] - stats["slots_idle"]


# -- the sanitizer build ----------------------------------------------------------------------------

# `python3 dev.py sanitize` (tools/sanitize.py) runs the suite on an ASan + UBSan build with jemalloc
# --enable-debug and sets ARENALIB_SANITIZE=1: ASan's runtime replaces malloc and exports symbols of
# its own, keeps freed memory resident in its quarantine, reserves terabytes of shadow address
# space, and makes everything several times slower.
SANITIZED = os.environ.get("ARENALIB_SANITIZE") == "1"
not_sanitized = pytest.mark.skipif(SANITIZED, reason="not meaningful on the ASan build")
# The tests of the tooling around arenalib (mypy over its stubs, the benchmark harness): what they
# run of arenalib's native code, the library's own tests run on the ASan build too.
tooling_only = pytest.mark.skipif(
    SANITIZED, reason="a test of tooling: the native paths it reaches run under ASan in the library's tests")
# `dev.py tsan`: an interpreter built --with-thread-sanitizer (about ten times slower).
THREAD_SANITIZED = "--with-thread-sanitizer" in (sysconfig.get_config_var("CONFIG_ARGS") or "")

# -- child interpreters -----------------------------------------------------------------------------

# Generous: a sanitized interpreter is several times slower than a normal one.
TIMEOUT_S = 600 if SANITIZED else 180


def run_python(code: str | Path, *argv: str, options: tuple[str, ...] = (), timeout: float = TIMEOUT_S,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (source text, dedented, or the Path of a script) with arguments ``argv`` in a fresh
    interpreter with command line ``options`` and environment ``env`` (this one's by default).

    faulthandler is on, so a crash or a hang shows where.  Under the sanitizer build the child
    inherits ASan and UBSan.  A child still running after ``timeout`` seconds is killed and reported
    as a result with exit status -1 and what it printed, "(timed out after N s)" last on stderr, so
    that the test fails with its output instead of a bare TimeoutExpired."""
    program = [str(code)] if isinstance(code, Path) else ["-c", textwrap.dedent(code)]
    cmd = [sys.executable, "-X", "faulthandler", *options, *program, *argv]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        def text(out) -> str:
            return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")

        return subprocess.CompletedProcess(cmd, -1, text(exc.stdout),
                                           text(exc.stderr) + f"\n(timed out after {timeout} s)")


def assert_ok(result: subprocess.CompletedProcess) -> str:
    """The standard output of a child that exited with status 0 (else a failure showing both outputs)."""
    assert result.returncode == 0, (
        f"exit status {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    return result.stdout


# -- threads ------------------------------------------------------------------------------------------

N_THREADS = 4


@contextlib.contextmanager
def switching_every(seconds: float):
    """Threads switch every ``seconds`` (instead of 5 ms) inside the block: with the GIL, threads
    interleave at many more points."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@contextlib.contextmanager
def resetting_without_the_gil(reset, arena):
    """While the block runs, another thread calls ``reset(arena)`` (a C-level arena_reset() without
    the GIL) over and over, threads switching every microsecond; yields the list of the resets that
    went through (an export refuses one: BufferError)."""
    stop = threading.Event()
    resets: list[int] = []

    def resetter():
        while not stop.is_set():
            try:
                reset(arena)
                resets.append(1)
            except BufferError:
                pass

    with switching_every(1e-6):
        thread = threading.Thread(target=resetter)
        thread.start()
        try:
            yield resets
        finally:
            stop.set()
            thread.join()


def run_roles(*roles) -> None:
    """Run each of ``roles`` in a thread of its own, started together; the first error raised in
    any of them is raised here once all have finished."""
    run_threads(lambda index: roles[index](), len(roles))


def run_threads(target, n: int = N_THREADS) -> list:
    """Run ``target(index)`` in ``n`` threads started together (behind a barrier); their results, by
    index.  The first error raised in any of them is raised here once all have finished."""
    barrier = threading.Barrier(n)
    results = [None] * n
    errors: list[BaseException] = []

    def run(index):
        try:
            barrier.wait()
            results[index] = target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# -- memory -------------------------------------------------------------------------------------------

PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20


def rss() -> int:
    """Resident set size of this process, in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def settled_rss() -> int:
    """rss() once the garbage is collected."""
    gc.collect()
    return rss()


# -- Cython consumers of the C API, built with meson ------------------------------------------------

EXAMPLE = Path(arenalib.__file__).resolve().parent / "_examples" / "cython"
CONSUMERS = HERE / "cython"


def meson_build(source: Path, build: Path, *setup_options: str) -> None:
    """Configure and compile the meson project in ``source`` into ``build``, with this interpreter and
    its cython, whatever python3 is first on PATH."""
    bin_dir = Path(sys.executable).parent
    build.mkdir(parents=True, exist_ok=True)
    native = build.parent / f"{build.name}-native.ini"
    native.write_text(f"[binaries]\npython = '{sys.executable}'\ncython = '{bin_dir / 'cython'}'\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    meson = [sys.executable, "-m", "mesonbuild.mesonmain"]
    for cmd in ([*meson, "setup", str(build), str(source), f"--native-file={native}", *setup_options],
                [*meson, "compile", "-C", str(build)]):
        result = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def load_extension(build: Path, name: str):
    """Import the extension module ``name`` built in ``build`` (not put in sys.modules)."""
    [path] = build.glob(f"{name}.*.so")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_example_consumer(directory: Path) -> dict:
    """The example consumer shipped in arenalib/_examples/cython, built in ``directory`` with its own
    meson.build as a downstream project builds it (against the installed arenalib), both ways, and
    imported: ``{"table": arenalib_consumer, "fast": arenalib_consumer_fast}``."""
    for path in EXAMPLE.iterdir():
        if path.is_file():
            shutil.copy(path, directory / path.name)
    meson_build(directory, directory / "build")
    return {"table": load_extension(directory / "build", "arenalib_consumer"),
            "fast": load_extension(directory / "build", "arenalib_consumer_fast")}


def stale_package_copy(directory: Path, *edits: tuple[str, str, str]) -> Path:
    """A copy of the installed arenalib's .pxd files and C headers in ``directory``/arenalib with
    ``edits`` (file, old text, new text) and its fingerprints derived again by
    tools/abi_fingerprint.py, as another arenalib version would have them; returns ``directory``."""
    package = directory / "arenalib"
    package.mkdir(parents=True)
    installed = Path(arenalib.get_include(), "arenalib")
    for pxd in installed.glob("*.pxd"):
        shutil.copy(pxd, package / pxd.name)
    shutil.copytree(arenalib.get_c_include(), package / "include")
    for name, old, new in edits:
        text = (package / name).read_text()
        assert old in text, (name, old)
        (package / name).write_text(text.replace(old, new))
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "abi_fingerprint.py"), "--package",
                             str(package)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return directory


# Two fields of SlicingState as _abi.pxd declares them, one after the other (a pointer the inline
# carve dereferences, and a size).
_CARVE_RECORD = "    CarverRecord* carve_record  # the biased thread's record (NULL: not biased)\n"
_CHUNK_SIZE = "    size_t chunk_size\n"


def build_test_consumers(directory: Path) -> dict:
    """The test-only consumers of tests/cython, built in ``directory`` by tests/cython/meson.build and
    imported, by name: ``safety_consumer``, ``core_init_consumer`` and ``handoff_consumer`` against
    the installed arenalib (its inline fast paths), and the example consumer built against copies
    of arenalib's declarations of another version: ``stale_consumer`` (fast) against one with
    another free-block cache tuning (CACHE_MAX_PER_BIN 32, not 64) and a SlicingState whose chunk
    size and carver record swapped places (changes that leave every struct's size as it is, so
    Cython's checks at import see nothing), ``stale_table_consumer`` (table-only) against one whose
    table has another signature (arena_free's size is a Py_ssize_t), and ``stale_handoff_consumer``
    (handoff_consumer, fast) against the first."""
    stale = stale_package_copy(
        directory / "stale-fast",
        ("_abi.pxd", "    CACHE_MAX_PER_BIN = 64\n", "    CACHE_MAX_PER_BIN = 32\n"),
        ("_abi.pxd", _CARVE_RECORD + _CHUNK_SIZE, _CHUNK_SIZE + _CARVE_RECORD))
    stale_table = stale_package_copy(directory / "stale-table", (
        "_table.pxd", "ctypedef int (*table_free_fn)(OpaqueCore* core, void* ptr, size_t size)",
        "ctypedef int (*table_free_fn)(OpaqueCore* core, void* ptr, Py_ssize_t size)"))
    build = directory / "build"
    meson_build(CONSUMERS, build, f"-Darenalib_include={arenalib.get_include()}",
                f"-Darenalib_c_include={arenalib.get_c_include()}", f"-Dstale_include={stale}",
                f"-Dstale_table_include={stale_table}", f"-Dexample_dir={EXAMPLE}")
    return {"safety_consumer": load_extension(build, "safety_consumer"),
            "core_init_consumer": load_extension(build, "core_init_consumer"),
            "handoff_consumer": load_extension(build, "handoff_consumer"),
            "stale_consumer": load_extension(build, "arenalib_consumer_fast"),
            "stale_table_consumer": load_extension(build, "arenalib_consumer"),
            "stale_handoff_consumer": load_extension(build, "stale_handoff_consumer")}


def overlapping_live_carves(arena, seconds):
    """Carve 16 B segments filled 0x11 from ``arena`` for ``seconds`` while another thread marks,
    carves and rewinds; the first carve found alive at the address of another live one, or holding
    bytes that are not its own (None if none).  A carve made after another thread's mark must die
    at that mark's rewind: if it stays alive, a later carve lands on top of it."""
    kept = []  # (segment, address), the last 64
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            seg = arena.allocate(16, zero=False).fill(0x11)
            address = seg.address
        except ArenaClosedError:
            continue  # carved under the other thread's mark, rewound already
        alive_at = {a for k, a in kept if k.alive}  # (liveness only ever ends: see below)
        if seg.alive and address in alive_at:
            # Both were alive at once: seg from its carve on, the other until alive_at was read.
            return seg
        for k, _ in kept:
            try:
                if k.tobytes() != b"\x11" * 16:
                    return k
            except ArenaClosedError:
                pass
        kept.append((seg, address))
        del kept[:-64]
    return None
