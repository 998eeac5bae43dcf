"""Shared fixtures of arenalib's tests.

Hypothesis profiles: "default" (quick, the default) and "thorough", chosen with the environment
variable ARENALIB_HYPOTHESIS_PROFILE, e.g. ``ARENALIB_HYPOTHESIS_PROFILE=thorough python3 dev.py test``.

Every test is followed by a leak check: once the garbage is collected, as many pooled jemalloc slots
must be in use (held by open arenas) as before the test.  An arena left open and unreachable would
also emit a ResourceWarning, which the pytest configuration turns into an error.

The helpers the test modules share are in tests/support.py.
"""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import HealthCheck, settings
from support import FREEABLE_KINDS, KINDS, build_test_consumers, slots_in_use

import arenalib

settings.register_profile("default", max_examples=50, deadline=None)
settings.register_profile(
    "thorough",
    max_examples=1000,
    deadline=None,
    stateful_step_count=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("ARENALIB_HYPOTHESIS_PROFILE", "default"))


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
    return build_test_consumers(tmp_path_factory.mktemp("cython_consumers"))
