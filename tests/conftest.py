"""Shared fixtures of arenalib's tests.

Hypothesis profiles: "default" (quick, the default), "sanitized" (the default under a sanitizer:
fewer examples) and "thorough", chosen with the environment variable ARENALIB_HYPOTHESIS_PROFILE,
e.g. ``ARENALIB_HYPOTHESIS_PROFILE=thorough python3 dev.py test``.

Every test is followed by a leak check: once the garbage is collected, as many pooled jemalloc slots
must be in use (held by open arenas) as before the test.  An arena left open and unreachable would
also emit a ResourceWarning, which the pytest configuration turns into an error.

On a free-threaded CPython (3.13t: ``python3 dev.py test --python 3.13t``) the GIL must stay off: it
is checked once arenalib is imported (session start), once the test consumers of tests/cython are
loaded, and at the end of the session, which fails if any module imported on the way turned it on.

The helpers the test modules share are in tests/support.py.
"""

from __future__ import annotations

import gc
import os
import sys
import sysconfig

import pytest
from hypothesis import HealthCheck, settings
from support import (
    FREEABLE_KINDS,
    KINDS,
    SANITIZED,
    THREAD_SANITIZED,
    build_example_consumer,
    build_test_consumers,
    slots_in_use,
)

import arenalib

settings.register_profile("default", max_examples=50, deadline=None)
# The sanitizer builds (dev.py sanitize, dev.py tsan) run every path several times slower; the
# random search itself is the other suites' (each CI interpreter runs the default profile with
# its own seeds), so under a sanitizer each property and state machine tries fewer examples.
settings.register_profile("sanitized", max_examples=15, deadline=None)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    stateful_step_count=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get(
    "ARENALIB_HYPOTHESIS_PROFILE", "sanitized" if SANITIZED or THREAD_SANITIZED else "default"))

FREE_THREADED = sysconfig.get_config_var("Py_GIL_DISABLED") == 1
_GIL_PROBLEM = pytest.StashKey[str]()
_GIL_TURNED_ON_IN = pytest.StashKey[str]()


def _gil_enabled_by() -> str | None:
    """None while the GIL is off (or on a GIL build, where there is nothing to check), else why it is on."""
    if not FREE_THREADED or not sys._is_gil_enabled():
        return None
    if os.environ.get("PYTHON_GIL", "") not in ("", "0"):
        return f"PYTHON_GIL={os.environ['PYTHON_GIL']} is set in the environment"
    # Python cannot say which module it was: name the extension modules from outside the standard library.
    stdlib = sysconfig.get_config_var("DESTSHARED") or sysconfig.get_path("platstdlib")
    loaded = sorted(name for name, module in list(sys.modules.items())
                    if (path := getattr(module, "__file__", None) or "").endswith(".so")
                    and not path.startswith(stdlib))
    return ("an extension module that does not declare free-threading support (Py_mod_gil, Cython's "
            "freethreading_compatible directive) turned it on: its import raised \"RuntimeWarning: The "
            "global interpreter lock (GIL) has been enabled to load module ...\" (an error under this "
            "suite's filterwarnings), or, with that warning not an error, it is one of these loaded ones: "
            + (", ".join(loaded) or "none"))


def pytest_sessionstart(session):
    # conftest has imported arenalib (and tests/support.py) by now.
    why = _gil_enabled_by()
    if why is not None:
        pytest.exit(f"free-threaded CPython, but the GIL is enabled at session start: {why}",
                    returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Note the first test (setup, call or teardown, its fixtures included) that turned the GIL on."""
    was_on = FREE_THREADED and sys._is_gil_enabled()
    result = yield
    if FREE_THREADED and not was_on and sys._is_gil_enabled():
        item.config.stash.setdefault(_GIL_TURNED_ON_IN, item.nodeid)
    return result


def pytest_sessionfinish(session, exitstatus):
    why = _gil_enabled_by()
    if why is not None:
        culprit = session.config.stash.get(_GIL_TURNED_ON_IN, None)
        if culprit is not None:
            why = f"it went on during {culprit}: {why}"
        session.config.stash[_GIL_PROBLEM] = why
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    why = config.stash.get(_GIL_PROBLEM, None)
    if why is not None:
        terminalreporter.section("free-threading", sep="=", red=True, bold=True)
        terminalreporter.write_line(f"FAILED: the GIL was enabled during the session: {why}", red=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"_arenalib_rep_{report.when}", report)
    return report


def _live_objects():
    """Open arenas, Segment objects and buffer exports alive now (by arenalib's own counters when it
    has them, else open arenas by the pool's slots in use)."""
    counters = getattr(arenalib, "live_objects", None) or getattr(arenalib._arena, "live_objects", None)
    if counters is None:
        return {"open_arenas": slots_in_use()}
    return dict(counters())


@pytest.fixture(autouse=True)
def _no_leaked_arena(request):
    """After a passing test, every arena, segment and export it made is gone once garbage is collected."""
    before = _live_objects()
    yield
    report = getattr(request.node, "_arenalib_rep_call", None)
    if report is None or not report.passed:
        return  # a failing test's traceback may hold its arenas: do not pile a second error on it
    after = _live_objects()
    if any(after[k] > before[k] for k in after):
        gc.collect()
        after = _live_objects()
    leaked = {k: after[k] - before[k] for k in after if after[k] > before[k]}
    assert not leaked, f"left alive by this test: {leaked}"


@pytest.fixture(params=KINDS)
def kind(request):
    """Each of the three arena classes."""
    return request.param


@pytest.fixture(params=FREEABLE_KINDS)
def freeable_kind(request):
    """The arena classes whose segments can be freed one by one."""
    return request.param


@pytest.fixture
def arena(kind):
    """An open arena of each kind, closed (exports released by the test) at the end."""
    a = kind()
    yield a
    a.close()


@pytest.fixture(scope="session")
def cython_consumers(tmp_path_factory):
    """The test-only Cython consumers of the C API (tests/cython), built once: see
    support.build_test_consumers."""
    was_on = FREE_THREADED and sys._is_gil_enabled()  # (if so, the session's end reports it)
    consumers = build_test_consumers(tmp_path_factory.mktemp("cython_consumers"))
    why = None if was_on else _gil_enabled_by()
    assert why is None, f"loading the test consumers of tests/cython turned the GIL on: {why}"
    return consumers


@pytest.fixture(scope="module")
def example_consumers(tmp_path_factory):
    """The example consumer of arenalib/_examples/cython, built against the package both ways (a
    downstream project's own meson build): {"table": module, "fast": module}."""
    return build_example_consumer(tmp_path_factory.mktemp("consumer"))


@pytest.fixture(params=["table", "fast"])
def consumer(request, example_consumers):
    """The example consumer through the function table, then through the inline fast paths."""
    return example_consumers[request.param]


@pytest.fixture
def pipe():
    """Both ends of a pipe (read, write), closed after the test unless the test closed them."""
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass
