"""The report of a run, or of a results.json redone: printed, and written as results.json, results.md
and PNG plots.

It opens with the verdict in plain words (where arenalib wins and by how much, where it does not and
why, what this run did not measure, what quick mode leaves out), then the machine, then each
experiment's tables in the order bench/run.py lists them, then, last, the checklist of the project's
targets.  Every claim of the verdict is computed from the run's figures: an experiment's findings()
where it has one, else its targets' checks.  What an experiment shows, and how its targets read, is its
own module's (bench/_experiment.py); this module only lays the parts out, every printed line within
WIDTH columns.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

from _common import Config
from _experiment import Experiment, finding

WIDTH = 120        # no printed line is wider (tables are laid out to fit; prose is wrapped)
MISSED_NAMED = 3   # missed targets the verdict names for an experiment without findings(); the checklist
                   # at the end has them all

# (experiment module, its checks), in report order: what run.py's targets() returns.
Groups = list[tuple[Experiment, list[dict]]]
# (name, experiment module) of each experiment with results, in report order: run.py's experiments().
Named = list[tuple[str, Experiment]]

# Issue numbers are the makers' bookkeeping: a user reads the report without them.
_ISSUE_REFS = [(re.compile(r"\s*\(issues? \d+(?:'s)?\)"), ""), (re.compile(r"\(issues? \d+; "), "("),
               (re.compile(r",\s*issues? \d+\)"), ")"), (re.compile(r"\bthe issue-\d+ "), "the ")]


def plain(text: str) -> str:
    """``text`` without the issue numbers the experiments' titles and targets carry."""
    for pattern, replacement in _ISSUE_REFS:
        text = pattern.sub(replacement, text)
    return text


def _wrap(text: str, indent: str = "", first: str = "") -> list[str]:
    # A size stays on one line ("512 B"): the no-break space is not whitespace to textwrap.
    text = re.sub(r"(\d) (B|KiB|MiB|GiB|GB|MB|ns|us|s)\b", "\\1\u00a0\\2", text)
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=indent, break_long_words=False,
        break_on_hyphens=False)]


def _is_table_row(line: str) -> bool:
    """A row of a plain-text table (cells apart by two spaces or more), which wrapping would break."""
    cells = re.findall(r"\S {2,}(?=\S)", line.replace(".  ", ". "))
    return len(cells) >= 2 or set(line.strip()) <= {"-", " "}


def fit(text: str) -> str:
    """``text`` with every prose line wider than WIDTH wrapped (its indent kept); table rows as they are
    (each experiment lays its tables out within WIDTH)."""
    out = []
    for line in text.split("\n"):
        if len(line) <= WIDTH or _is_table_row(line):
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        out += _wrap(line.strip(), indent + "  ", indent)
    return "\n".join(out)


# -- the verdict -----------------------------------------------------------------------------------

def _from_checks(exp: Experiment, checks: list[dict]) -> list[dict]:
    """The finding of an experiment without findings(): how many of its targets it met, and which it
    missed (a target of one check with its figure, a target of several with how many it missed)."""
    measured = [c for c in checks if c["status"] in ("MET", "MISSED")]
    if not measured:
        return []
    title = plain(exp.TITLE).split(". ", 1)[-1]
    met = sum(c["status"] == "MET" for c in measured)
    by_target: dict[str, list[dict]] = {}
    for c in measured:
        by_target.setdefault(c["target"], []).append(c)
    missed = []
    for target, cs in by_target.items():
        bad = [c for c in cs if c["status"] == "MISSED"]
        # a target's own prefix ("C level: ...") repeats the experiment's title: left out
        name = re.sub(r"^[\w ]{1,20}: ", "", plain(target))
        if bad:
            count = f" ({len(bad)} of {len(cs)} checks)" if len(cs) > 1 else ""
            missed.append(name.replace("`", "") + count)
    if len(missed) > MISSED_NAMED:
        missed[MISSED_NAMED:] = [f"{len(missed) - MISSED_NAMED} more (the checklist at the end)"]
    text = f"{title}: {met} of its {len(measured)} targets met" + (f"; missed: {'; '.join(missed)}" if missed
                                                                      else "")
    kind = "win" if not missed else "loss" if met < len(measured) / 2 else "even"
    return [finding(kind, text + ".", None)]


def findings(res: dict, experiments: Named, groups: Groups) -> list[dict]:
    """Every experiment's findings, in report order."""
    checks = {id(exp): cs for exp, cs in groups}
    out = []
    for name, exp in experiments:
        own = getattr(exp, "findings", None)
        try:
            found = own(res[name]) if own else _from_checks(exp, checks.get(id(exp), []))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # an older results.json
            found = [finding("skip", f"{plain(exp.TITLE)}: no summary from these results.",
                             f"{name}.findings() could not read them ({type(exc).__name__}: {exc})")]
        out += found
    return out


def not_measured(res: dict, groups: Groups, all_names: tuple[str, ...]) -> list[str]:
    """What this run did not measure, each with why: experiments left out or failed, then the targets
    not checked, grouped by their reason."""
    out = []
    failed = res.get("failed") or {}
    asked = res.get("only")
    left = [n for n in all_names if n not in res and n not in failed]
    if left:
        how = " (--only chose the others)" if asked is not None and not set(left) & set(asked) else ""
        out.append(f"Experiments not in this run{how}: {', '.join(left)}.")
    for name, why in failed.items():
        out.append(f"Experiment {name} failed, so its figures and targets are left out: {why}.")
    unchecked: dict[str, int] = {}
    for _exp, cs in groups:
        for c in cs:
            if c["status"] not in ("MET", "MISSED"):
                why = c.get("why") or "not measured in this run"
                unchecked[why] = unchecked.get(why, 0) + 1
    for why, count in unchecked.items():
        out.append(f"{count} target(s) not checked: {why}.")
    return out


def quick_note(res: dict) -> str | None:
    """What quick mode leaves out, from the run's configuration against full mode's."""
    cfg = res.get("config") or {}
    if cfg.get("mode") != "quick":
        return None
    full = Config.full()
    text = (f"Quick mode: shorter and fewer measurements (the round trip {cfg['rounds']} rounds of "
            f"{cfg['target_ms']:g} ms per figure, --full {full.rounds} of {full.target_ms:g} ms; smaller "
            "idle-memory, io_uring and asyncio workloads)")
    rt = res.get("roundtrip")
    if rt and rt.get("cells"):
        spread = sorted(cell["ratio_to_baseline"]["rel_iqr"] for key, cells in rt["cells"].items()
                        if key != "bytearray" for cell in cells.values())
        if spread:
            text += (f": the round trip's ratios spread by {spread[len(spread) // 2]:.0%} (median relative "
                     "IQR), so read differences smaller than that as noise")
    return text + ".  `python3 dev.py bench --full` is the careful run."


def verdict(res: dict, groups: Groups, order: tuple[str, ...], experiments: Named | None = None,
            all_names: tuple[str, ...] = ()) -> list[str]:
    """The report's first lines, in plain words: where arenalib wins, where it does not and why, what
    was not measured, what quick mode leaves out; then how many targets were met."""
    experiments = experiments if experiments is not None else []
    found = findings(res, experiments, groups)
    mode = (res.get("config") or {}).get("mode", "?")
    lines = _wrap(f"arenalib benchmark, {mode} mode, {res.get('started', '?')}: what this run measured")
    sections = (("win", "Where arenalib wins:"), ("even", "On par:"), ("loss", "Where it does not, and why:"))
    for kind, heading in sections:
        shown = [f for f in found if f["kind"] == kind]
        if not shown:
            continue
        lines.append(heading)
        for f in shown:
            why = f" Why: {f['why']}." if f.get("why") else ""
            lines += _wrap(f"{f['text']}{why}", "    ", "  - ")
    by_why: dict[str, list[str]] = {}
    for f in found:
        if f["kind"] == "skip":
            by_why.setdefault(f.get("why") or "", []).append(f["text"].rstrip("."))
    missing = [("; ".join(texts) + (f" ({why})." if why else ".")) for why, texts in by_why.items()]
    missing += not_measured(res, groups, all_names)
    if missing:
        lines.append("Not measured in this run:")
        for text in missing:
            lines += _wrap(text, "    ", "  - ")
    if not found and not missing:
        lines.append("No experiment completed: nothing to conclude.")
    note = quick_note(res)
    if note:
        lines += _wrap(note)
    checks = [c for _, cs in groups for c in cs]
    if checks:
        met = sum(c["status"] == "MET" for c in checks)
        missed = sum(c["status"] == "MISSED" for c in checks)
        rest = len(checks) - met - missed
        lines += _wrap(f"Targets the project set itself: {met} of {len(checks)} met, {missed} missed"
                       + (f", {rest} not checked" if rest else "") + " (the list is at the end).")
    share = disturbance_share(res)
    if share is not None:
        lines += _wrap(f"Other processes took {share:.0%} of the CPU time during this run: rerun on an idle "
                       "machine before trusting the ratios.")
    return lines


def targets_text(groups: Groups, markdown: bool = False) -> str:
    """The checklist: every experiment's checks under their targets' headings, in plain words."""
    checks = [c for _, cs in groups for c in cs]
    met = sum(c["status"] == "MET" for c in checks)
    missed = sum(c["status"] == "MISSED" for c in checks)
    rest = len(checks) - met - missed
    head = (f"Of the {len(checks)} targets checked, {met} were met and {missed} missed"
            + (f"; {rest} could not be checked in this run" if rest else "")
            + ".  Each line: met or MISSED, the figure measured, the limit.")
    if any("ratio_vs_cheapest_bytearray" in c for c in checks):
        head += ("  bytearray means bytearray(n)+fill; \"against bytearray*n\" adds the ratio to "
                 "bytearray(b'\\x03')*n (malloc + memset, the cheapest bytearray), a stricter reading.")
    out = [head] if markdown else ["Targets the project set itself, checked on this run's figures",
                                   *_wrap(head)]
    last = None
    for exp, cs in groups:
        for c in cs:
            if c["target"] != last:
                title = plain(c["target"])
                out.extend(["", f"**{title}**", ""] if markdown else _wrap(title, "    ", "  "))
                last = c["target"]
            line = plain(exp.target_line(c))
            if c["status"] not in ("MET", "MISSED") and c.get("why") and line.endswith("not measured"):
                line += f": {c['why']}"
            line = re.sub(r"^MET(\s*)", lambda m: "met" + m.group(1), line)
            out.extend([f"- {line}"] if markdown else _wrap(line, " " * 11, "    "))
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
    written = []
    for name, exp in experiments:
        try:
            written += exp.plots(res[name], out, plt)
        except Exception as exc:  # a plot that cannot be drawn from these results costs only itself
            print(f"{name}: no plot ({type(exc).__name__}: {exc})", file=sys.stderr)
            plt.close("all")
    return written


def _verdict(res: dict, experiments: Named, groups: Groups, order: tuple[str, ...]) -> list[str]:
    return verdict(res, groups, order, experiments, order)


def _run_line(res: dict) -> str:
    cmd = "python3 dev.py bench" + (" --full" if res["config"]["mode"] == "full" else "")
    return (f"Run: {res['started']}, {res['config']['mode']} mode, {res['wall_seconds']:.0f} s; "
            "other processes "
            f"took {res.get('cpu_share', {}).get('others_share', 0) or 0:.0%} of the CPU time meanwhile.  "
            f"Reproduce: `{cmd}` (writes bench/out/; `--out DIR` to choose).")


def markdown_report(res: dict, experiments: Named, groups: Groups, pngs: list[str],
                    order: tuple[str, ...]) -> str:
    parts = ["# arenalib benchmark results", "", *_verdict(res, experiments, groups, order), "",
             *_wrap(f"Machine: {machine_line(res)}."), *_wrap(_run_line(res)), ""]
    if failures_text(res):
        parts += [failures_text(res, markdown=True), ""]
    if disturbance(res, order):
        parts += [*_wrap(f"**{disturbance(res, order)}**"), ""]
    for name, exp in experiments:
        parts += [f"## {plain(exp.TITLE)}", "", plain(exp.tables(res[name], markdown=True)), ""]
        # An experiment's plots are named after it (numpy_scope_loop.png), or its singular (frame_...).
        for png in pngs:
            if png.startswith((name + "_", name + ".", name.rstrip("s") + "_")):
                parts += [f"![{png}]({png})", ""]
    if any(cs for _, cs in groups):
        parts += ["## Targets the project set itself, checked on this run's figures", "",
                  targets_text(groups, markdown=True), ""]
    return "\n".join(parts) + "\n"


def report(res: dict, experiments: Named, groups: Groups, out: Path, order: tuple[str, ...]) -> None:
    """Print the verdict, the machine, the tables and, last, the checklist; write results.json, the
    plots and results.md.  ``experiments``: (name, module) of each experiment in ``res``, in report
    order; ``order``: every experiment's name, in the order they run."""
    print("\n" + render(res, experiments, groups, order))
    (out / "results.json").write_text(compact_json(res) + "\n")
    pngs = plots(res, experiments, out)
    (out / "results.md").write_text(markdown_report(res, experiments, groups, pngs, order))
    written = ", ".join(["results.json", "results.md", *pngs])
    print("\n".join(_wrap(f"wrote into {out}: {written}; wall time {res['wall_seconds']:.0f} s")))
    if res.get("failed"):
        print(f"{len(res['failed'])} experiment(s) failed: " + ", ".join(res["failed"]))


def render(res: dict, experiments: Named, groups: Groups, order: tuple[str, ...]) -> str:
    """The printed report: the verdict first, the checklist of targets last, no line over WIDTH."""
    parts = ["\n".join(_verdict(res, experiments, groups, order)),
             "\n".join(_wrap(f"Machine: {machine_line(res)}"))]
    failed = failures_text(res)
    if failed:
        parts.append(failed)
    disturbed = disturbance(res, order)
    if disturbed:
        parts.append("\n".join(_wrap(disturbed)))
    for name, exp in experiments:
        title = plain(exp.TITLE)
        parts.append(f"{title}\n{'=' * min(len(title), WIDTH)}\n{plain(exp.tables(res[name]))}")
    if any(cs for _, cs in groups):
        parts.append(targets_text(groups))
    return fit("\n\n".join(parts))


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
