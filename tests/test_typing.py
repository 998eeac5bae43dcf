"""Types and introspection (issue 27): mypy accepts a typed user program of arenalib and rejects one
with type errors, against the stubs; inspect.signature() works on every public callable."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
from support import HERE, tooling_only

import arenalib

TYPING = HERE / "typing"
ROOT = HERE.parent


# The oldest and newest Pythons arenalib supports: mypy checks against either from any interpreter.
TARGETS = ["3.10", "3.13"]


def run_mypy(program, target: str) -> subprocess.CompletedProcess:
    """mypy over ``program``, finding arenalib's stubs in the source tree: the editable install's
    import hook is invisible to mypy, so MYPYPATH names the checkout (what a user of an editable
    install sets too)."""
    pytest.importorskip("mypy")
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--no-error-summary",
         "--python-version", target, str(program)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@tooling_only
@pytest.mark.parametrize("target", TARGETS)
def test_mypy_accepts_a_typed_user_program(target):
    result = run_mypy(TYPING / "user_program.py", target)
    assert result.returncode == 0, result.stdout + result.stderr


@tooling_only
@pytest.mark.parametrize("target", TARGETS)
def test_mypy_rejects_the_type_errors_of_a_user_program(target):
    program = TYPING / "type_errors.py"
    result = run_mypy(program, target)
    assert result.returncode == 1, result.stdout + result.stderr
    expected = {n for n, line in enumerate(program.read_text().splitlines(), 1) if line.endswith("# error")}
    reported = {int(line.split(":")[1]) for line in result.stdout.splitlines() if ": error:" in line}
    assert reported == expected, result.stdout


# The classes a user constructs (the others raise TypeError when called: no signature to show).
CONSTRUCTIBLE = {"Arena", "ConfinedArena", "SlicingArena", "BufferPool", "Ring"}


def _public_callables():
    """(name, callable) of every public function, class constructor and method of arenalib."""
    for name in arenalib.__all__:
        obj = getattr(arenalib, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            if name in CONSTRUCTIBLE:
                yield name, obj
            for attr, member in vars(obj).items():
                if (not attr.startswith("_") or attr in ("__enter__", "__exit__")) and callable(member):
                    yield f"{name}.{attr}", getattr(obj, attr)
        elif callable(obj):
            yield name, obj


def test_inspect_signature_works_on_every_public_callable():
    missing = []
    for name, obj in _public_callables():
        try:
            inspect.signature(obj)
        except (ValueError, TypeError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, "\n".join(missing)


def _parameters(obj) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(obj).parameters.values()]


E = inspect.Parameter.empty


@pytest.mark.parametrize(("obj", "expected"), [
    (arenalib.ArenaBase.allocate, [("self", "POSITIONAL_ONLY", E), ("size", "POSITIONAL_OR_KEYWORD", E),
                                   ("zero", "KEYWORD_ONLY", True), ("align", "KEYWORD_ONLY", None)]),
    (arenalib.ArenaBase.allocate_from, [("self", "POSITIONAL_ONLY", E), ("data", "POSITIONAL_OR_KEYWORD", E),
                                        ("align", "KEYWORD_ONLY", None)]),
    (arenalib.ArenaBase.allocate_string, [("self", "POSITIONAL_ONLY", E), ("s", "POSITIONAL_OR_KEYWORD", E),
                                          ("encoding", "POSITIONAL_OR_KEYWORD", "utf-8"),
                                          ("nul", "POSITIONAL_OR_KEYWORD", True)]),
    (arenalib.copy, [(name, "POSITIONAL_ONLY", E)
                     for name in ("src", "src_offset", "dst", "dst_offset", "nbytes")]),
    (arenalib.Segment.slice, [("self", "POSITIONAL_ONLY", E), ("offset", "POSITIONAL_OR_KEYWORD", E),
                              ("size", "POSITIONAL_OR_KEYWORD", E)]),
    (arenalib.Segment.free, [("self", "POSITIONAL_ONLY", E), ("deferred", "KEYWORD_ONLY", False)]),
    (arenalib.BufferPool, [("buffer_size", "POSITIONAL_OR_KEYWORD", E), ("count", "POSITIONAL_OR_KEYWORD", E),
                           ("align", "KEYWORD_ONLY", 4096), ("zero", "KEYWORD_ONLY", False)]),
    (arenalib.Segment.mismatch, [("self", "POSITIONAL_ONLY", E), ("other", "POSITIONAL_ONLY", E)]),
    (arenalib.Segment.hex, [("self", "POSITIONAL_ONLY", E), ("sep", "POSITIONAL_OR_KEYWORD", None),
                            ("bytes_per_sep", "POSITIONAL_OR_KEYWORD", 1)]),
    (arenalib.Arena, [("max_bytes", "KEYWORD_ONLY", None)]),
    (arenalib.set_debug, [("enabled", "POSITIONAL_OR_KEYWORD", E)]),
    (arenalib.allocate, [("size", "POSITIONAL_OR_KEYWORD", E), ("zero", "KEYWORD_ONLY", True),
                         ("align", "KEYWORD_ONLY", None)]),
    (arenalib.Segment.__exit__, [("self", "POSITIONAL_ONLY", E), ("exc_type", "POSITIONAL_OR_KEYWORD", E),
                                 ("exc", "POSITIONAL_OR_KEYWORD", E), ("tb", "POSITIONAL_OR_KEYWORD", E)]),
], ids=lambda v: getattr(v, "__qualname__", "") if callable(v) else "")
def test_inspect_signature_gives_the_parameters(obj, expected):
    assert _parameters(obj) == expected
