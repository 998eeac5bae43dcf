"""A pytest plugin (``-p numpy_handler_plugin``) under which NumPy allocates the data of every array
from one arenalib Arena for the whole run: tests/test_numpy_policy.py runs NumPy's own tests with it.

It sets arenalib's handler as NumPy's current one at configure time, in the context the tests run in
(pytest runs them in its main thread), and at the end writes what the arena served to the JSON file
named by ARENALIB_PLUGIN_REPORT: the handler current then, and the arena's stats()."""

from __future__ import annotations

import json
import os

from numpy._core.multiarray import get_handler_name

import arenalib

_arena = arenalib.Arena()


def pytest_configure(config):
    arenalib.set_numpy_handler(arenalib.numpy_handler(_arena))


def pytest_unconfigure(config):
    report = {"handler": get_handler_name(), "stats": _arena.stats()}
    path = os.environ.get("ARENALIB_PLUGIN_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f)
