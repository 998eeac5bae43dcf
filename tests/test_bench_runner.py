"""bench/run.py runs each experiment in a child process: one that dies by a signal, raises or exits is
reported by name with the reason, and the rest of the run still completes and writes its report.

The experiments here are stand-ins (``--experiments-dir``) that fail at once or return a small
result, so the whole run takes a few seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench", "run.py")

STAND_INS = {
    # pool.py and native.py take run(quick=...) (run.py wraps them); the others run(cfg, progress).
    "pool.py": """
        import os, signal

        def run(quick):
            os.kill(os.getpid(), signal.SIGILL)  # as the liburing wheel does on a CPU without AVX-512
    """,
    "native.py": """
        def run(quick):
            raise ValueError("boom")
    """,
    "memory.py": """
        import os, sys

        def plan_units(cfg):
            return 5

        def run(cfg, progress):
            print("the last words", file=sys.stderr, flush=True)
            os._exit(3)
    """,
    "threads.py": """
        def plan_units(cfg):
            return 10

        def run(cfg, progress):
            progress.step("threads: half way", 5)
            progress.note("a note from the child")
            print("a stray print")  # goes to stderr, not into run.py's progress channel
            cell = {"1": {"ops_per_s": {"median": 2e6}}, "2": {"ops_per_s": {"median": 3e6}},
                    "scaling": {"median": 1.5}}
            return {"method": {"sizes": [512], "note": "stand-in"},
                    "candidates": {"fake": {"label": "stand-in candidate"}},
                    "cells": {"fake": {"512": cell}}}
    """,
}


def test_failed_experiments_are_reported_and_the_run_completes(tmp_path):
    stand_ins = tmp_path / "experiments"
    stand_ins.mkdir()
    for name, code in STAND_INS.items():
        (stand_ins / name).write_text(textwrap.dedent(code))
    out = tmp_path / "out"
    args = ["--only", "pool,threads,native,memory", "--out", str(out), "--experiments-dir", str(stand_ins)]
    proc = subprocess.run([sys.executable, RUN, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # failures make the exit status 1, after the report
    reasons = {
        "pool": "died with SIGILL (Illegal instruction)",
        "native": "raised ValueError: boom",
        "memory": "exited with status 3: the last words",
    }
    for name, why in reasons.items():
        assert f"  {name}: {why}\n" in proc.stdout
        assert f"{name}: {why}" in proc.stderr  # also a note under the progress bar, as it happens
    assert "3 experiment(s) failed: memory, pool, native" in proc.stdout  # in run order
    # the experiment that completed is in every output
    assert "stand-in candidate" in proc.stdout and "1.50" in proc.stdout
    assert "a note from the child" in proc.stderr and "a stray print" in proc.stderr
    assert "Fatal Python error" in proc.stderr  # the child's faulthandler report, passed on
    results = json.loads((out / "results.json").read_text())
    assert results["failed"] == reasons
    assert set(results) >= {"threads", "failed", "targets"}
    assert not {"pool", "native", "memory"} & set(results)
    assert results["threads"]["cells"]["fake"]["512"]["scaling"]["median"] == 1.5
    markdown = (out / "results.md").read_text()
    assert "Experiments that failed" in markdown
    for name, why in reasons.items():
        assert f"- **{name}**: {why}" in markdown
    assert "stand-in candidate" in markdown
