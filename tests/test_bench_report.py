"""The bench report a user reads: bench/run.py --from-json renders it from a recorded quick run
(tests/data/bench_quick_results.json, every experiment, measured on 2 busy cores) or from that run with
figures changed, through the real experiment modules.

The verdict comes first and is made of the figures (change them and it changes), no printed line is
wider than 120 columns, the checklist of targets comes last without issue numbers, quick mode says
what it leaves out, and a target's status reads the same in its table and in the checklist.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import tooling_only

pytestmark = tooling_only

BENCH = Path(__file__).resolve().parent.parent / "bench"
RUN = BENCH / "run.py"
RECORDED = Path(__file__).resolve().parent / "data" / "bench_quick_results.json"
WIDTH = 120


def render(tmp_path: Path, results: dict, name: str = "report") -> tuple[str, Path]:
    """The printed report of ``results`` (through run.py --from-json) and its output directory."""
    source = tmp_path / f"{name}.json"
    source.write_text(json.dumps(results))
    out = tmp_path / name
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(RUN), "--from-json", str(source), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, out


def verdict_of(text: str) -> str:
    """The verdict: the report's first paragraph."""
    return text.lstrip("\n").split("\n\n", 1)[0]


def titles(recorded: dict | None = None) -> list[str]:
    """Each experiment's section heading as the report prints it, in report order (only those with
    results in ``recorded``, when given: an experiment newer than the recording has none)."""
    sys.path.insert(0, str(BENCH))
    try:
        import run
        from _report import plain
        return [plain(run.load(name).TITLE) for name in run.EXPERIMENTS
                if recorded is None or name in recorded]
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(RECORDED.read_text())


@pytest.fixture(scope="module")
def report(recorded, tmp_path_factory) -> str:
    return render(tmp_path_factory.mktemp("bench-report"), recorded)[0]


def test_no_line_is_wider_than_120_columns(report):
    wide = [line for line in report.splitlines() if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines over {WIDTH} columns, the widest {max(map(len, wide))}: {wide[:3]}"


def test_the_verdict_comes_first_in_plain_words(report, recorded):
    lines = report.lstrip("\n").splitlines()
    assert lines[0].startswith("arenalib benchmark, quick mode, ")
    verdict = verdict_of(report)
    assert "Where arenalib wins:" in verdict and "Where it does not, and why:" in verdict
    assert len(verdict.splitlines()) <= 60  # a screen, not a log
    first_table = min(report.index(f"{title}\n===") for title in titles() if f"{title}\n===" in report)
    assert report.index("Where arenalib wins:") < report.index("Machine: ") < first_table
    # every experiment with results says something in it, from its own figures
    words = " ".join(verdict.split())
    for phrase in ("Round trip from Python", "Memory: after a 1.5 GB fragmenting workload", "BufferPool",
                   "One arena per scope", "io_uring, O_DIRECT", "asyncio frames over loopback",
                   "The C level through", "Checked frames", "Threads: "):
        assert phrase in words, phrase
    assert "Targets the project set itself: " in words and "(the list is at the end)" in words


def test_the_checklist_comes_last_without_issue_numbers(report, recorded):
    heading = "Targets the project set itself, checked on this run's figures"
    checklist = report.index(heading)
    assert all(report.index(f"{title}\n===") < checklist for title in titles(recorded))
    tail = report[checklist:]
    assert not any(f"{title}\n===" in tail for title in titles())
    footer = tail[tail.index("\nwrote into "):]  # the files written, then nothing
    assert footer.rstrip().endswith("s") and "wall time" in footer and "\n\n" not in footer
    assert not re.search(r"\bissues? ?-?\d", report, re.IGNORECASE)
    assert not re.search(r"^\d+ of \d+ met\.$", report, re.MULTILINE)
    assert "[cheapest:" not in report and "MISSED]" not in report
    assert re.search(r"^Of the \d+ targets checked, \d+ were met and \d+ missed", tail, re.MULTILINE)


def test_quick_mode_says_what_it_leaves_out(report):
    words = " ".join(verdict_of(report).split())
    assert "Quick mode: shorter and fewer measurements" in words and "--full" in words
    # the idle-memory target is not checked at quick mode's scale, and the verdict says why
    assert re.search(r"2 target\(s\) not checked: the idle workload was 0\.25 GB, below the 1\.1 GB", words)
    # a GIL build checks no thread-scaling target, and says so
    assert "they need a free-threaded build with the GIL off" in words


def test_a_targets_status_reads_the_same_in_its_table_and_in_the_checklist(report):
    idle = report[report.index("Memory, idle:"):]
    idle = idle[:idle.index("\n\n")]
    rows = {line.split()[0]: line.split()[-1] for line in idle.splitlines()
            if line.startswith(("Arena ", "Confined"))}
    assert rows == {"Arena": "n/a", "ConfinedArena": "n/a"}  # quick mode: not checked, so not MISSED
    checklist = report[report.index("Targets the project set itself, checked"):]
    lines = checklist[checklist.index("memory, idle: "):].splitlines()[1:]
    checks = [line for line in lines[:next(i for i, line in enumerate(lines) if not line.startswith("    "))]
              if not line.startswith("     ")]  # (a check's wrapped lines are indented further)
    assert [line.split()[0] for line in checks] == ["n/a", "n/a"]
    assert all("not measured: the idle workload was 0.25 GB" in line for line in checks)


def test_the_verdict_follows_the_figures(recorded, tmp_path):
    """The same run with ConfinedArena's round trip made 2x bytearray's time, then half of it: the
    verdict moves it from where arenalib loses to where it wins, with the new figures."""
    words = {}
    for name, factor in (("slower", 2.0), ("faster", 0.5)):
        res = copy.deepcopy(recorded)
        cells = res["roundtrip"]["cells"]
        for size, cell in cells["ConfinedArena_nz"].items():
            cell["per_round_ns"] = [x * factor for x in cells["bytearray"][size]["per_round_ns"]]
        words[name] = " ".join(verdict_of(render(tmp_path, res, name)[0]).split())
    slower, faster = words["slower"], words["faster"]
    # (4 KiB is left out: in the recorded run bytearray(n)+fill's copy took 10x bytearray*n's memset there)
    claim = ("Round trip from Python (allocate, fill, free), ConfinedArena against bytearray(n)+fill: "
             "2.0x {} at 8 B, 2.0x at 512 B, 2.0x at 1 KiB, 2.0x at 64 KiB, 2.0x at 1 MiB")
    assert claim.format("slower") in slower.split("Where it does not, and why:")[1]
    assert claim.format("faster") in faster.split("Where it does not, and why:")[0]
    assert claim.format("faster") not in slower and claim.format("slower") not in faster
    assert "Round trip against bytearray(n)+fill at 4 KiB (its copy 10x slower than bytearray*n's memset): " \
           "not counted above" in faster


def test_missing_figures_are_said_to_be_not_measured(recorded, tmp_path):
    res = copy.deepcopy(recorded)
    for name in ("aio", "uring"):
        del res[name]
    res["failed"] = {"frames": "raised ValueError: boom"}
    del res["frames"]
    words = " ".join(verdict_of(render(tmp_path, res)[0]).split())
    assert "Not measured in this run:" in words
    # (helpers, numpy_scope, bufring: newer than the recording)
    assert "Experiments not in this run: helpers, numpy_scope, uring, aio, bufring." in words
    assert ("Experiment frames failed, so its figures and targets are left out: raised ValueError: "
            "boom.") in words
    assert "asyncio frames over loopback" not in words and "io_uring, O_DIRECT" not in words


def test_one_plot_per_experiment_with_distinct_colours(recorded, tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    _, out = render(tmp_path, recorded)
    pngs = sorted(p.name for p in out.glob("*.png"))
    for name in ("roundtrip", "memory", "threads", "pool", "native", "scopes", "uring", "aio", "frames"):
        assert any(p.startswith(name + "_") for p in pngs), (name, pngs)
    markdown = (out / "results.md").read_text()
    assert all(f"]({p})" in markdown for p in pngs)
    sys.path.insert(0, str(BENCH))
    try:
        import _plot
        for count in (3, 10, 16, 24):
            styles = _plot.styles(plt, (["arenalib", "peer"] * count)[:count])
            assert len({tuple(s["color"]) for s in styles}) == count
    finally:
        sys.path.remove(str(BENCH))


def test_the_experiments_recorded_alone_get_their_plots_too(tmp_path):
    # helpers, numpy_scope and bufring are newer than the recording above: each has a run of its own.
    pytest.importorskip("matplotlib.pyplot")
    names = ("helpers", "numpy_scope", "bufring")
    runs = {name: json.loads((BENCH / "results" / f"{name}.json").read_text()) for name in names}
    res = copy.deepcopy(runs["helpers"])
    res["failed"] = {}
    for name in names:
        res[name] = runs[name][name]
    _, out = render(tmp_path, res)
    pngs = sorted(p.name for p in out.glob("*.png"))
    for name in names:
        assert any(p.startswith(name + "_") for p in pngs), (name, pngs)
    markdown = (out / "results.md").read_text()
    assert all(f"]({p})" in markdown for p in pngs)


def test_only_names_the_experiments_when_given_an_unknown_one():
    proc = subprocess.run([sys.executable, str(RUN), "--only", "nonsense"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "unknown experiment(s): nonsense; the experiments are roundtrip, memory, threads, pool, native, " \
           "scopes, uring, aio, frames" in proc.stderr
