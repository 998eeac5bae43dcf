"""The report of a run, or of a results.json redone: printed, and written as results.json, results.md
and PNG plots.

It opens with the verdict (how many of the project's targets were met, which were missed, what
failed or disturbed the run), then each experiment's tables in the order bench/run.py lists them,
then the checklist of every target.  What an experiment shows, and how its targets read, is its own
module's (bench/_experiment.py); this module only lays the parts out.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

from _experiment import Experiment

WIDTH = 120        # the verdict's and the prose's lines; tables are as wide as their columns
MISSED_SHOWN = 12  # missed targets the verdict names; the checklist has them all

# (experiment module, its checks), in report order: what run.py's targets() returns.
Groups = list[tuple[Experiment, list[dict]]]
# (name, experiment module) of each experiment with results, in report order: run.py's experiments().
Named = list[tuple[str, Experiment]]


def _wrap(text: str, indent: str = "") -> list[str]:
    # A size stays on one line ("512 B"): the no-break space is not whitespace to textwrap.
    text = re.sub(r"(\d) (B|KiB|MiB|GiB)\b", "\\1\u00a0\\2", text)
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(
        text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]


def verdict(res: dict, groups: Groups, order: tuple[str, ...]) -> list[str]:
    """The report's first lines: the targets met, each missed one, the experiments that failed and a
    warning when other processes disturbed the run."""
    checks = [c for _, cs in groups for c in cs]
    missed = [(exp, c) for exp, cs in groups for c in cs if c["status"] == "MISSED"]
    met = sum(c["status"] == "MET" for c in checks)
    rest = len(checks) - met - len(missed)
    parts = [f"{met} of {len(checks)} targets met" if checks else "no targets checked"]
    if missed:
        parts.append(f"{len(missed)} missed")
    if rest:
        parts.append(f"{rest} not measured or not applicable")
    head = "Verdict: " + "; ".join(parts) + "."
    failed = res.get("failed") or {}
    if failed:
        head += (f"  {len(failed)} experiment(s) failed and are left out: {', '.join(failed)} (why: below; "
                 "their targets are not counted).")
    share = disturbance_share(res)
    if share is not None:
        head += (f"  Other processes took {share:.0%} of the CPU time: rerun on an idle machine before "
                 "trusting the ratios.")
    lines = _wrap(head)
    if missed:
        lines.append("Missed (the figure measured against the limit; the checklist at the end has them all):")
        by_target: dict[str, list[str]] = {}
        for exp, c in missed[:MISSED_SHOWN]:
            line = exp.target_line(c).removeprefix(c["status"]).lstrip()
            by_target.setdefault(c["target"], []).append(line)
        for target, shown in by_target.items():
            lines += _wrap(f"- {target}: {'; '.join(shown)}", "  ")
        if len(missed) > MISSED_SHOWN:
            lines.append(f"- and {len(missed) - MISSED_SHOWN} more")
    return lines


def targets_text(groups: Groups, markdown: bool = False) -> str:
    """The checklist: every experiment's checks under their targets' headings."""
    checks = [c for _, cs in groups for c in cs]
    out = [] if markdown else ["Targets, from ratios measured in this run"]
    met = sum(c["status"] == "MET" for c in checks)
    out.append(f"{met} of {len(checks)} met.")
    if any("ratio_vs_cheapest_bytearray" in c for c in checks):  # issue 6's targets are among them
        out[-1] += ("  The bytearray peer is bytearray(n)+fill (issue 6's); [cheapest: ...] gives the ratio "
                    "to bytearray(b'\\x03')*n, malloc+memset, the strict reading.")
    last = None
    for exp, cs in groups:
        for c in cs:
            if c["target"] != last:
                out.extend(["", f"**{c['target']}**", ""] if markdown else ["  " + c["target"]])
                last = c["target"]
            out.append(("- " if markdown else "    ") + exp.target_line(c))
    return "\n".join(out)


def failures_text(res: dict, markdown: bool = False) -> str:
    """The experiments that did not complete, each with why; "" when all did."""
    failed = res.get("failed") or {}
    if not failed:
        return ""
    if markdown:
        return "\n".join(["## Experiments that failed", "", "Left out of the tables, targets and plots:", "",
                          *(f"- **{name}**: {why}" for name, why in failed.items())])
    return "\n".join(["Experiments that failed (left out of the tables, targets and plots):",
                      *(f"  {name}: {why}" for name, why in failed.items())])


def disturbance_share(res: dict) -> float | None:
    """The share of the machine's CPU time other processes took during the run, when noticeable."""
    share = res.get("cpu_share", {}).get("others_share")
    return None if share is None or share < 0.1 else share


def disturbance(res: dict, order: tuple[str, ...]) -> str | None:
    """A warning when other processes took a noticeable share of the CPUs during the run."""
    share = disturbance_share(res)
    if share is None:
        return None
    parts = [f"{name} {res[name]['cpu_share'].get('others_share', 0):.0%}" for name in order
             if name in res and res[name].get("cpu_share")]
    detail = f"; per experiment: {', '.join(parts)}" if parts else ""
    return (f"WARNING: other processes used {share:.0%} of the machine's CPU time during this run "
            f"({res['cpu_share']['cpu_seconds_others']} CPU s{detail}): "
            "the figures may be disturbed; rerun on an idle machine before trusting the ratios.")


def machine_line(info: dict) -> str:
    m = info["machine"]
    return (f"{m['cpu_model']}, {m['cpus_usable']} of {m['cpu_count']} CPUs, {m['mem_total_gib']} GiB, "
            f"Linux {m['kernel']}, {m['libc']}, Python {m['python']}, numpy {m['numpy']}, "
            f"pyarrow {m['pyarrow']}, arenalib {m['arenalib']} (jemalloc "
            f"{m['jemalloc_of_arenalib'].split('-')[0]}); load average {info['loadavg_before']} before, "
            f"{info['loadavg_after']} after")


def plots(res: dict, experiments: Named, out: Path) -> list[str]:
    """Each experiment's PNG plots; the file names written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (python3 dev.py bench installs it)", file=sys.stderr)
        return []
    return [png for name, exp in experiments for png in exp.plots(res[name], out, plt)]


def markdown_report(res: dict, experiments: Named, groups: Groups, pngs: list[str],
                    order: tuple[str, ...]) -> str:
    cmd = "python3 dev.py bench" + (" --full" if res["config"]["mode"] == "full" else "")
    parts = [
        "# arenalib benchmark results", "", *verdict(res, groups, order), "",
        *_wrap(f"Machine: {machine_line(res)}."),
        *_wrap(f"Run: {res['started']}, {res['config']['mode']} mode, {res['wall_seconds']:.0f} s; "
               f"other processes took {res.get('cpu_share', {}).get('others_share', 0) or 0:.0%} of the CPU "
               f"time meanwhile.  Reproduce: `{cmd}` (writes bench/out/; `--out DIR` to choose)."),
        "",
    ]
    if failures_text(res):
        parts += [failures_text(res, markdown=True), ""]
    if disturbance(res, order):
        parts += [*_wrap(f"**{disturbance(res, order)}**"), ""]
    for name, exp in experiments:
        parts += [f"## {exp.TITLE}", "", exp.tables(res[name], markdown=True), ""]
    if any(cs for _, cs in groups):
        parts += ["## Targets, from ratios measured in this run", "", targets_text(groups, markdown=True), ""]
    for png in pngs:
        parts.append(f"![{png}]({png})")
    return "\n".join(parts) + "\n"


def report(res: dict, experiments: Named, groups: Groups, out: Path, order: tuple[str, ...]) -> None:
    """Print the verdict, the tables and the checklist; write results.json, the plots and results.md.
    ``experiments``: (name, module) of each experiment in ``res``, in report order; ``order``: the
    order they ran in."""
    print("\n" + "\n".join(verdict(res, groups, order)))
    print("\n" + "\n".join(_wrap(f"Machine: {machine_line(res)}")) + "\n")
    failed = failures_text(res)
    if failed:
        print(failed + "\n")
    disturbed = disturbance(res, order)
    if disturbed:
        print("\n".join(_wrap(disturbed)) + "\n")
    for name, exp in experiments:
        print(exp.tables(res[name]) + "\n")
    if any(cs for _, cs in groups):
        print(targets_text(groups) + "\n")

    (out / "results.json").write_text(compact_json(res) + "\n")
    pngs = plots(res, experiments, out)
    (out / "results.md").write_text(markdown_report(res, experiments, groups, pngs, order))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}"
          + "".join(f", {out / p}" for p in pngs))
    print(f"wall time {res['wall_seconds']:.0f} s")
    if failed:
        print(f"{len(res['failed'])} experiment(s) failed: " + ", ".join(res["failed"]))


def _rounded(obj):
    if isinstance(obj, float):
        return float(f"{obj:.5g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def compact_json(obj) -> str:
    """Indented JSON, floats to 5 significant digits, lists of numbers and flat objects of numbers
    each on one line."""
    text = json.dumps(_rounded(obj), indent=1)
    text = re.sub(r"\[\s+([-0-9.e,\s]+?)\s+\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    number = r'"[^"\n]+": (?:-?[0-9.e+-]+|null|true|false)'
    return re.sub(r"\{\s+((?:" + number + r",\s+)*" + number + r")\s+\}",
                  lambda m: "{" + ", ".join(x.strip() for x in m.group(1).split(",\n")) + "}", text)
