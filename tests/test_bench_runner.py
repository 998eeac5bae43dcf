"""bench/run.py runs each experiment in a child process: one that dies by a signal, raises or exits is
reported by name with the reason, and the rest of the run still completes and writes its report.

The experiments here are stand-ins (``--experiments-dir``) that fail at once or return a small
result, so the whole run takes a few seconds: they have what bench/_experiment.py asks of an
experiment module, and the report (its verdict first) is made of what they return."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from support import tooling_only

pytestmark = tooling_only

RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bench", "run.py")

# What every stand-in has of bench/_experiment.Experiment besides its run() (and, for some, plan()).
COMMON = """
    TITLE = "a stand-in"

    def plan(cfg):
        return 1

    def targets(results):
        return []

    def target_line(check):
        return check["status"]

    def tables(results, markdown=False):
        return ""

    def plots(results, out, plt):
        return []
"""

STAND_INS = {
    "pool.py": """
        import os, signal

        def run(cfg, progress):
            os.kill(os.getpid(), signal.SIGILL)  # as the liburing wheel does on a CPU without AVX-512
    """,
    "native.py": """
        def run(cfg, progress):
            raise ValueError("boom")
    """,
    "memory.py": """
        import os, sys

        def plan(cfg):
            return 5

        def run(cfg, progress):
            print("the last words", file=sys.stderr, flush=True)
            os._exit(3)
    """,
    "threads.py": """
        def plan(cfg):
            return 10

        def run(cfg, progress):
            progress.step("threads: half way", 5)
            progress.note("a note from the child")
            print("a stray print")  # goes to stderr, not into run.py's progress channel
            return {"label": "stand-in candidate", "scaling": 1.5}

        def targets(results):
            return [{"target": "stand-in scaling >= 1.2", "status": "MET", "label": results["label"],
                     "ratio": results["scaling"]}]

        def target_line(check):
            return f"{check['status']:6s} {check['label']}: {check['ratio']:.2f}"

        def tables(results, markdown=False):
            return f"{results['label']}: scaling {results['scaling']:.2f}"
    """,
}


def test_failed_experiments_are_reported_and_the_run_completes(tmp_path):
    stand_ins = tmp_path / "experiments"
    stand_ins.mkdir()
    for name, code in STAND_INS.items():  # its own members after the common ones: they replace them
        (stand_ins / name).write_text(textwrap.dedent(COMMON) + textwrap.dedent(code))
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
    # the verdict comes first, in plain words, from what completed; it names what failed and was not run
    lines = proc.stdout.lstrip("\n").splitlines()
    assert lines[0].startswith("arenalib benchmark, quick mode, ")
    verdict = "\n".join(lines[:lines.index("")])
    assert "Where arenalib wins:\n  - a stand-in: 1 of its 1 targets met." in verdict
    words = " ".join(verdict.split())  # (the verdict is wrapped at 120 columns)
    assert "Not measured in this run: - Experiments not in this run (--only chose the others): roundtrip, " \
           "scopes, frames, helpers, numpy_scope, uring, aio, bufring." in words  # in run order
    for name, why in reasons.items():
        assert f"Experiment {name} failed, so its figures and targets are left out: {why}." in words
    assert words.index("Experiment memory failed") < words.index("Experiment pool failed") \
        < words.index("Experiment native failed")  # in run order
    assert "Targets the project set itself: 1 of 1 met, 0 missed" in words
    # the checklist comes last, as the stand-in words its line
    checklist = proc.stdout.index("Targets the project set itself, checked on this run's figures")
    assert proc.stdout.index("a stand-in\n==========") < checklist
    assert "    met    stand-in candidate: 1.50" in proc.stdout[checklist:]
    assert all(len(line) <= 120 for line in lines)
    results = json.loads((out / "results.json").read_text())
    assert results["failed"] == reasons
    assert set(results) >= {"threads", "failed", "targets"}
    assert not {"pool", "native", "memory"} & set(results)
    assert results["threads"]["scaling"] == 1.5
    assert [c["status"] for c in results["targets"]] == ["MET"]
    markdown = (out / "results.md").read_text()
    assert markdown.startswith("# arenalib benchmark results\n\narenalib benchmark, quick mode, ")
    assert markdown.index("Where arenalib wins:") < markdown.index("## a stand-in") \
        < markdown.index("## Targets the project set itself")
    assert "Experiments that failed" in markdown
    for name, why in reasons.items():
        assert f"- **{name}**: {why}" in markdown
    assert "## a stand-in\n\nstand-in candidate: scaling 1.50" in markdown
    assert all(len(line) <= 120 for line in markdown.splitlines())


def test_from_json_redoes_the_report_and_refuses_a_module_that_is_no_experiment(tmp_path):
    stand_ins = tmp_path / "experiments"
    stand_ins.mkdir()
    (stand_ins / "threads.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent(STAND_INS["threads.py"]))
    (stand_ins / "aio.py").write_text("def run(cfg, progress):\n    return {}\n")
    out = tmp_path / "out"
    args = ["--only", "threads", "--out", str(out), "--experiments-dir", str(stand_ins)]
    subprocess.run([sys.executable, RUN, *args], capture_output=True, text=True, timeout=120, check=True)
    first = {name: (out / name).read_text() for name in ("results.json", "results.md")}
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, RUN, "--from-json", str(out / "results.json"), "--out", str(again),
                           "--experiments-dir", str(stand_ins)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert {name: (again / name).read_text() for name in first} == first
    proc = subprocess.run([sys.executable, RUN, "--only", "aio", "--out", str(tmp_path / "aio"),
                           "--experiments-dir", str(stand_ins)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    # (wrapped at 120 columns, where the path may start a line of its own: compared word by word)
    assert (f"aio: raised TypeError: {stand_ins / 'aio.py'} is not an experiment: it lacks TITLE, plan, "
            "targets, target_line, tables, plots") in " ".join(proc.stdout.split())
