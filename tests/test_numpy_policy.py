"""NumPy's own tests with arenalib's handler installed for the whole pytest run (issue 28).

Each test runs pytest in a child interpreter on a test file of the installed NumPy, with the plugin
tests/numpy_handler_plugin.py, which makes an Arena NumPy's data-memory handler before the first test.
numpy/_core/tests/test_mem_policy.py checks the handler machinery itself (setting and restoring
handlers over ours, context and thread locality, owners without a handler: it builds a C extension
with meson); numpy/_core/tests/test_multiarray.py (slow: minutes) runs 14,000 tests of array creation,
views, resize, pickling, sorting and buffers over arena memory.  A run counts only if its tests really
ran (no more skipped than NumPy skips unconditionally), none failed, and the arena served them."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from support import HERE, SANITIZED, TIMEOUT_S, run_python

NUMPY_TESTS = Path(np.__file__).resolve().parent / "_core" / "tests"


def run_numpy_tests(tmp_path: Path, name: str, *pytest_args: str, timeout: float = TIMEOUT_S):
    """Run NumPy's test file ``name`` under the plugin; (counts of the summary line, the report)."""
    test_file = NUMPY_TESTS / name
    if not test_file.exists():
        pytest.fail(f"{test_file} is not in the installed NumPy {np.__version__}")
    report = tmp_path / "report.json"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # none of arenalib's settings: NumPy's own
    env = dict(os.environ, ARENALIB_PLUGIN_REPORT=str(report), PYTHONPATH=str(HERE),
               # extbuild runs meson and ninja from PATH: this interpreter's.
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    result = run_python(
        "import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))",
        "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-p", "numpy_handler_plugin",
        "-p", "no:cacheprovider", "-q", "-rs", "--basetemp", str(tmp_path / "tmp"), *pytest_args,
        str(test_file), env=env, timeout=timeout)
    output = result.stdout + result.stderr
    summary = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)",
                                                     summary)}
    assert result.returncode == 0 and counts.get("failed", 0) == 0, (
        f"NumPy's {name} under arenalib's handler: exit status {result.returncode}\n{output[-6000:]}")
    assert report.exists(), f"the plugin wrote no report\n{output[-3000:]}"
    return counts, json.loads(report.read_text()), output


def test_numpys_mem_policy_tests_pass_with_the_handler_installed(tmp_path):
    counts, report, output = run_numpy_tests(tmp_path, "test_mem_policy.py")
    # test_new_policy is the one NumPy skips ("too slow"); every other test of the file ran.
    skipped = re.findall(r"^SKIPPED .*$", output, re.MULTILINE)
    assert counts.get("passed", 0) >= 9 and all("too slow" in line for line in skipped), output[-3000:]
    # The handler was ours throughout (each test that sets another restores it) and served arrays.
    assert report["handler"] == "arenalib.Arena"
    assert report["stats"]["allocated_total"] > 0 and report["stats"]["numpy_fallbacks"] == 0


@pytest.mark.slow
@pytest.mark.skipif(SANITIZED, reason="hours on the ASan build")
def test_numpys_multiarray_tests_pass_over_arena_memory(tmp_path):
    # test_huge_vectordot needs 18 GB free (17 GB resident), most of the machine, where CI's other
    # lanes run at the same time: NumPy checks what is free only when it starts, and other processes
    # growing after that got this run OOM-killed (2026-12-05).  Arrays past 2 GiB: test_numpy.py.
    counts, report, output = run_numpy_tests(tmp_path, "test_multiarray.py", "-x",
                                             "-k", "not test_huge_vectordot", timeout=3600)
    assert counts.get("passed", 0) > 10_000, output[-3000:]
    assert report["handler"] == "arenalib.Arena"
    assert report["stats"]["allocated_total"] > 1 << 30
