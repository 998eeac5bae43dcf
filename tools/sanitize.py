"""The environment that runs arenalib's test suite on its AddressSanitizer + UBSan build.

Used by ``python3 dev.py sanitize`` (which builds arenalib with the meson option -Dsanitize=true, and
jemalloc with --enable-debug, into .venv/<python>-asan and build/<python>-asan, then runs pytest in
the environment below).  Standard library only, Python 3.10+.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def runtime_library(name: str) -> str:
    """Full path of a gcc sanitizer runtime (gcc answers with the bare name when it has none)."""
    cc = os.environ.get("CC", "gcc")
    path = subprocess.run([cc, "-print-file-name=" + name], check=True, capture_output=True,
                          text=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        raise SystemExit(f"{cc} has no {name}: install the sanitizer runtime (Debian: libasan8, libubsan1)")
    return os.path.realpath(path)


# UBSan findings inside jemalloc 5.3.0 itself, not arenalib's: its MALLOCX_ARENA_MASK is
# (((1 << 12) - 1) << 20), a left shift into the sign bit of an int ("left shift of 4095 by 20 places
# cannot be represented in type 'int'" at every mallocx).  jemalloc is compiled with recoverable UBSan
# checks, so these can be suppressed by source file; arenalib's own code stays under
# -fno-sanitize-recover and is never suppressed.
UBSAN_SUPPRESSIONS = """\
shift-base:*/jemalloc-5.3.0/*
"""


def sanitizer_env(build_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The interpreter is not built with ASan: its runtime must be the first library loaded.  The
    # extension links libubsan too; preloading it as well keeps both runtimes' init order fixed.
    preload = [runtime_library("libasan.so"), runtime_library("libubsan.so")]
    if env.get("LD_PRELOAD"):
        preload.append(env["LD_PRELOAD"])
    suppressions = build_dir / "ubsan-suppressions.txt"
    suppressions.write_text(UBSAN_SUPPRESSIONS)
    env.update({
        "LD_PRELOAD": " ".join(preload),
        # Every Python allocation goes through malloc, where ASan sees it (pymalloc would hide
        # use-after-free and overflows of small objects inside its own pools).
        "PYTHONMALLOC": "malloc",
        # detect_leaks=0: CPython itself never frees much of what it allocates (interned strings,
        # static types, module state kept until exit), so LeakSanitizer would report thousands of
        # leaks that are not arenalib's.  arenalib's own leaks are checked by the test suite instead
        # (pool slots and live objects per test, RSS in the soak tests).  abort_on_error=1: a finding
        # kills the process with SIGABRT, so it cannot pass unnoticed.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:suppressions={suppressions}",
        # Tests that cannot run under ASan (RLIMIT_AS: ASan reserves terabytes of shadow address
        # space) skip themselves when they see this.
        "ARENALIB_SANITIZE": "1",
    })
    return env


# ThreadSanitizer findings that are not arenalib's data races, each with its reason (arenalib's own
# cross-thread reads are atomic; jemalloc is not instrumented).
TSAN_SUPPRESSIONS = """
# CPython 3.13.5's string interning races with itself (python/cpython#129701): two threads raising
# from the same Cython function build their traceback's code objects at once (__Pyx_AddTraceback ->
# PyCode_NewEmpty -> intern_common), and immortalize_interned() writes a str another thread compares.
race:intern_common
# CPython's lock-free list reads (list_get_item_ref -> _Py_TryXGetRef) read the reference count
# of an item another thread may be freeing, by design (mimalloc keeps the memory an object's until
# readers are done); the allocation that reuses that memory later (here a Segment's) is then
# reported against the speculative read.
race:_Py_TryIncrefCompare
# jemalloc is not instrumented: its background thread finds a new arena through jemalloc's own
# release/acquire atomics, which ThreadSanitizer cannot see, and then reports the arena's mutex
# initialisation against the thread's first trylock of it.
race:pac_time_until_deferred_work
"""


def tsan_env(build_dir: Path, interpreter_suppressions: str) -> dict[str, str]:
    """The environment of `dev.py tsan`: the interpreter is built with ThreadSanitizer (its runtime
    is loaded with it), so only the options and the suppressions are set here: CPython's own list
    for the interpreter (``interpreter_suppressions``), then arenalib's."""
    env = dict(os.environ)
    suppressions = build_dir / "tsan-suppressions.txt"
    suppressions.write_text(interpreter_suppressions + "\n" + TSAN_SUPPRESSIONS)
    env.update({
        # halt_on_error: a report fails the test run instead of scrolling past.  detect_deadlocks=0:
        # jemalloc's fork handler takes a mutex per arena, thousands with arenalib's slot pool, past
        # the lock-order detector's table ("CHECK failed: sanitizer_deadlock_detector.h:67").
        # die_after_fork=0: a fork's child starts threads (the tests', and jemalloc's background
        # thread, which arenalib restarts there), which ThreadSanitizer refuses by default.
        "TSAN_OPTIONS": (f"halt_on_error=1:detect_deadlocks=0:die_after_fork=0:"
                         f"suppressions={suppressions}"),
        "PYTHON_GIL": "0",
        "ARENALIB_SANITIZE": "1",
    })
    return env
