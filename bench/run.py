"""arenalib's benchmark comparison against the peers a user would pick instead (issue 6).

Arenalib and its peers run side by side in one run, with ratios, a target checklist, a JSON of
every figure and PNG plots.

    python3 dev.py bench                      # quick mode (under 3 minutes on 2 cores)
    python3 dev.py bench --full               # the careful run
    .venv/py3.11/bin/python bench/run.py [--full] [--out DIR]
                                         [--only roundtrip,memory,threads,pool,native,scopes,uring,aio]

Experiments (each module's docstring says what it measures and how):
    roundtrip.py   allocate + fill(3) + free per op, 8 B to 1 MiB: ns/op, ops/ms, ratio to bytearray
    memory.py      RSS through a fragmenting ~1.5 GB workload, a fresh process per candidate
    threads.py     1 and 2 Python threads allocating: ops/s, scaling, single-thread ratio to bytearray
    scopes.py      one arena per scope (k blocks of 8 B to 1 MiB, then close): ns/block, ratio to
                   bytearray, minor page faults per scope; the per-scope cost of a 512 B ConfinedArena
    uring.py       reading a file through arenalib.Ring (read_fixed, QD 1/8/32, page cache and O_DIRECT)
                   against an os.preadv loop, a C loop over liburing and PyPI's liburing; the Python
                   overhead per request (a QD32 NOP loop from Python minus the same loop in C)
    aio.py         asyncio frames over loopback between two processes, 1 MiB and 64 MiB: FrameReader
                   into arena segments vs a bytearray(n) per frame; throughput and server CPU per frame

Each experiment runs in a child process of its own (``run.py --child NAME``): one that dies (a signal,
such as SIGILL from an extension built for another CPU) or raises is reported by name with the reason,
left out of the tables, targets and plots, and the run goes on (exit status 1 at the end).
Output goes to bench/out/ (gitignored) unless --out says otherwise: results.json, results.md and
the PNG plots.  bench/results/ holds the reference run (a --full run; its results.md says where and
when).  --from-json FILE redoes the tables, plots and markdown of a results.json without measuring.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import importlib
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import (  # noqa: E402
    BASELINE,
    SIZES,
    Config,
    CpuShare,
    Progress,
    fmt_ns,
    fmt_num,
    fmt_size,
    loadavg,
    machine_info,
    table,
)

EXPERIMENTS = ("roundtrip", "memory", "threads", "pool", "native", "scopes", "uring", "aio")
# Run order: the memory experiment after the Python-level timings, so the kernel's reclaiming of its
# 1.5 GB children does not disturb them (scopes counts page faults); the I/O of uring and aio last.
RUN_ORDER = ("roundtrip", "threads", "scopes", "memory", "pool", "native", "uring", "aio")
CHEAPEST = "bytearray_repeat"


# -- targets --------------------------------------------------------------------------------------

def ratio_item(title: str, key: str, label: str, n: int, other: str, versus_label: str, limit: float,
               r: dict | None) -> dict:
    """One ratio target: MET when the median of the same-round ratios ``r`` is at most ``limit``
    (borderline when the limit lies between its quartiles); n/a when it was not measured."""
    item = {"target": title, "candidate": key, "label": label, "size": n, "versus": other,
            "versus_label": versus_label, "limit": limit}
    if r is None:
        item.update(status="n/a", ratio=None)
    else:
        item.update(ratio=r["median"], ratio_q1=r["q1"], ratio_q3=r["q3"],
                    status="MET" if r["median"] <= limit else "MISSED",
                    borderline=r["q1"] <= limit <= r["q3"])
    return item


def targets(res: dict) -> list[dict]:
    """The issue's targets, each checked on ratios measured in this one run."""
    import roundtrip

    checks: list[dict] = []
    rt = res.get("roundtrip")
    labels = rt["candidates"] if rt else {}

    def check(title: str, key: str, n: int, other: str, limit: float) -> None:
        item = ratio_item(title, key, labels.get(key, {}).get("label", key), n, other,
                          labels.get(other, {}).get("label", other), limit,
                          roundtrip.ratio(rt, key, other, n))
        if other == BASELINE:
            strict = roundtrip.ratio(rt, key, CHEAPEST, n)
            if strict is not None:
                item["ratio_vs_cheapest_bytearray"] = strict["median"]
                item["status_vs_cheapest_bytearray"] = "MET" if strict["median"] <= limit else "MISSED"
        checks.append(item)

    if rt:
        t1 = "ConfinedArena/Arena zero=False+fill+free"
        both = ("ConfinedArena_nz", "Arena_nz")
        for key in both:
            for n, limit in ((8, 1.0), (512, 1.0), (1024, 1.0), (4096, 0.7), (65536, 0.5), (1 << 20, 0.5)):
                check(f"{t1} vs bytearray", key, n, BASELINE, limit)
        for key in both:
            for n in (8, 512, 1024, 4096):
                check(f"{t1} vs numpy.empty+fill", key, n, "numpy_empty", 0.4)
        for key in both:
            for n in (8, 512, 1024, 4096):
                check(f"{t1} vs pyarrow jemalloc", key, n, "pa_jemalloc", 0.2)
        for key in both:
            check(f"{t1} vs numpy.empty+fill at 1 MiB", key, 1 << 20, "numpy_empty", 1.0)
        for n in SIZES:
            check("SlicingArena allocate+fill (reset per batch) vs bytearray", "SlicingArena", n,
                  BASELINE, 0.8)
        check("per-scope `with ConfinedArena() as a: a.allocate(512, zero=False).fill(3)` vs bytearray",
              "scope", 512, BASELINE, 2.0)
    mem = res.get("memory")
    if mem:
        import memory
        for key in memory.ARENALIB:
            entry = mem["candidates"].get(key, {})
            retained = entry.get("retained_of_peak", {}).get("survivors")
            item = {"target": "memory: RSS above baseline right after the arenas close <= 3% of peak growth",
                    "candidate": key, "label": entry.get("label", key), "limit": 0.03, "ratio": retained,
                    "status": "n/a" if retained is None else ("MET" if retained <= 0.03 else "MISSED")}
            checks.append(item)
        checks.extend(memory.idle_targets(mem))
    sc = res.get("scopes")
    if sc:
        import scopes
        names = sc["candidates"]
        base = names.get(BASELINE, {}).get("label", BASELINE)
        checks.extend(scopes.targets(sc))
        per = sc.get("per_scope", {}).get("candidates", {})
        checks.append(ratio_item(
            f"per-scope `with ConfinedArena() as a: a.allocate({scopes.PER_SCOPE_SIZE}, "
            f"zero=False).fill(3)` vs bytearray({scopes.PER_SCOPE_SIZE})+fill", "ConfinedArena",
            per.get("ConfinedArena", {}).get("label", "ConfinedArena"), scopes.PER_SCOPE_SIZE, BASELINE, base,
            2.0, scopes.per_scope_ratio(sc)))
    ur = res.get("uring")
    if ur:
        import uring
        checks.extend(uring.targets(ur))
    if res.get("aio"):
        import aio
        checks.extend(aio.targets(res["aio"]))
    return checks


# -- reports --------------------------------------------------------------------------------------

def roundtrip_tables(rt: dict, markdown: bool = False) -> str:
    sizes = rt["sizes"]
    keys = [k for k, c in rt["candidates"].items() if not c["skipped"] and k in rt["cells"]]
    heads = ["candidate", *[fmt_size(n) for n in sizes]]
    out = []
    for title, fn in (
        ("ns/op (median)", lambda cell: f"{cell['ns_per_op']['median']:.0f}"),
        ("ops/ms (median)", lambda cell: fmt_num(cell["ops_per_ms"])),
        ("ratio to bytearray(n)+fill (median of same-round ratios; lower is faster)",
         lambda cell: f"{cell['ratio_to_baseline']['median']:.2f}"),
    ):
        rows = [[rt["candidates"][k]["label"], *[fn(rt["cells"][k][str(n)]) for n in sizes]] for k in keys]
        out.append(("### " if markdown else "") + f"Round trip: {title}")
        out.append(table(heads, rows, markdown))
        out.append("")
    noise = [rt["cells"][k][str(n)]["ratio_to_baseline"]["rel_iqr"] for k in keys for n in sizes
             if k != BASELINE]
    if noise:
        noise.sort()
        out.append(f"Noise: relative IQR of the same-round ratios, median {noise[len(noise) // 2]:.1%}, "
                   f"worst {noise[-1]:.1%}.")
    return "\n".join(out)


def memory_table(mem: dict, markdown: bool = False) -> str:
    import memory
    phases = memory.PHASES
    rows = []
    for _key, e in mem["candidates"].items():
        if "rss" not in e:
            why = e.get("skipped") or e.get("error", "")[:60]
            rows.append([e["label"], *(["-"] * (len(phases) + 3)), why])
            continue
        mb = e["mb_above_baseline"]
        ret = e["retained_of_peak"]
        rows.append([e["label"], f"{e['rss']['baseline'] / 1e6:.0f}",
                     *[f"{mb[p]:.0f}" for p in phases[1:]],
                     *[f"{ret[p]:.1%}" for p in ("survivors", "idle_1s", "trimmed")], e["trim"]])
    heads = ["candidate", "baseline MB", *[f"{p} +MB" for p in phases[1:]],
             "kept@survivors", "kept@idle", "kept@trim", "trim"]
    gb = mem["method"]["memory_bytes"] / 1e9
    title = (("### " if markdown else "") + f"Memory: RSS above baseline per phase ({gb:.2f} GB kept, "
             f"sizes 16 B-64 KiB); kept = (RSS - baseline) / (peak - baseline)")
    return title + "\n" + table(heads, rows, markdown)


def threads_title(th: dict) -> str:
    """Which interpreter measured the threads table, and what bounds its scaling."""
    interp = th["method"].get("interpreter")
    if interp is None:  # a results.json from before the interpreter was recorded: a GIL build
        return "a GIL build (interpreter not recorded): Python threads share the GIL, scaling at most ~1.0"
    where = interp["description"]
    if interp["gil_enabled"]:
        return f"{where}: Python threads share the GIL, scaling at most ~1.0 at Python level"
    if not interp.get("specialising_interpreter", True):
        where += ", no specialising interpreter"
    return f"{where}: Python threads run in parallel"


def threads_table(th: dict, markdown: bool = False) -> str:
    rows = []
    for key, c in th["candidates"].items():
        if c.get("skipped") or key not in th["cells"]:
            continue
        for n in th["method"]["sizes"]:
            cell = th["cells"][key][str(n)]
            ratio = (cell.get("ratio_to_baseline") or {}).get("1")
            ratio_repeat = (cell.get("ratio_to_bytearray_repeat") or {}).get("1")
            target = cell.get("target")
            rows.append([c["label"], fmt_size(n),
                         f"{cell['1']['ops_per_s']['median'] / 1e6:.2f}",
                         f"{cell['2']['ops_per_s']['median'] / 1e6:.2f}",
                         f"{cell['scaling']['median']:.2f}",
                         f"{ratio['median']:.2f}" if ratio else "",
                         f"{ratio_repeat['median']:.2f}" if ratio_repeat else "",
                         f">= {target['min_scaling']}: {target['status']}" if target else ""])
    title = (("### " if markdown else "") + f"Threads, {threads_title(th)}.  Total Mops/s with 1 and 2 "
             "threads; scaling = 2 threads / 1 thread; 1T/x = time per op with 1 thread over x's "
             "(same round)")
    heads = ["candidate", "size", "1 thread", "2 threads", "scaling", "1T/bytearray", "1T/bytearray*n",
             "target (issue 13)"]
    keep = [i for i in range(len(heads)) if i < 5 or any(r[i] for r in rows)]  # older JSON lacks some
    return title + "\n" + table([heads[i] for i in keep], [[r[i] for i in keep] for r in rows], markdown)


def scopes_tables(sc: dict, markdown: bool = False) -> str:
    """One arena per scope: per block size, each candidate's ns per block with the ratio to
    bytearray and the minor page faults per scope next to it; then the per-scope table of the
    smallest scope."""
    sizes = sc["sizes"]
    k = sc["method"]["blocks_per_scope"]
    keys = [key for key, c in sc["candidates"].items() if not c["skipped"] and key in sc["cells"]]
    h = "### " if markdown else ""

    def cell(key: str, n) -> str:
        c = sc["cells"][key][str(n)]
        ns = fmt_ns(c["ns_per_block"]["median"])
        faults = c["faults_per_scope"]["median"]
        shown = f"{faults:.0f}" if faults >= 10 else f"{faults:.1f}"
        if key == BASELINE:
            return f"{ns} {shown}"
        return f"{ns} ({c['ratio_to_baseline']['median']:.2f}) {shown}"

    short = {BASELINE: "bytearray", "numpy_empty": "numpy", "ConfinedArena": "Confined",
             "SlicingArena": "Slicing"}
    heads = ["n", "k", *[short.get(key, key) for key in keys]]
    rows = [["mixed" if n == "mixed" else fmt_size(n), str(k[str(n)]), *[cell(key, n) for key in keys]]
            for n in sizes]
    out = [f"{h}Scopes (k blocks of n bytes per scope; arenalib: a fresh arena per scope): ns per block, "
           "median (ratio to",
           "bytearray(n)+fill, median of same-round ratios; lower is faster), then minor page faults per "
           "scope (ru_minflt)", table(heads, rows, markdown), ""]
    noise = sorted(sc["cells"][key][str(n)]["ratio_to_baseline"]["rel_iqr"] for key in keys for n in sizes
                   if key != BASELINE)
    if noise:
        out.append(f"Noise: relative IQR of the same-round ratios, median {noise[len(noise) // 2]:.1%}, "
                   f"worst {noise[-1]:.1%}; {sc['method']['rounds']} rounds.")
    per = sc.get("per_scope")
    if per:
        n = per["size"]
        ratio = per["ratio_to_baseline"]
        rows = []
        for key, c in per["cells"].items():
            mine = key != BASELINE
            rows.append([per["candidates"][key]["label"], fmt_ns(c["ns_per_op"]["median"]),
                         f"{ratio['median']:.2f}" if mine else "baseline",
                         f"{ratio['min']:.2f}" if mine else "", f"{ratio['max']:.2f}" if mine else "",
                         f"{c['faults_per_op']['median']:.2f}"])
        quote = "`" if markdown else ""
        out += ["", f"{h}Per scope at {fmt_size(n)}: a fresh ConfinedArena per op (one {n} B block) against "
                f"bytearray({n})+fill, in experiment 1's loop; ratio = median of same-round ratios",
                table(["candidate", "ns/op", "ratio", "min", "max", "faults/op"], rows, markdown), "",
                f"Statements (n = {n}): " + "; ".join(
                    f"{c['label']}: {quote}{c['op']}{quote}" for c in per["candidates"].values()) + ".",
                *([""] if markdown else []),
                f"Same-round ratios, all {per['rounds']} rounds: "
                + " ".join(f"{x:.2f}" for x in per["per_round_ratios"])]
    return "\n".join(out)


def targets_text(checks: list[dict], markdown: bool = False) -> str:
    out = [] if markdown else ["Targets, from ratios measured in this run"]
    met = sum(c["status"] == "MET" for c in checks)
    out.append(f"{met} of {len(checks)} met.")
    if any("ratio_vs_cheapest_bytearray" in c for c in checks):  # issue 6's targets are among them
        out[-1] += ("  The bytearray peer is bytearray(n)+fill (issue 6's); [cheapest: ...] gives the ratio "
                    "to bytearray(b'\\x03')*n, malloc+memset, the strict reading.")
    last = None
    for c in checks:
        if c["target"] != last:
            out.extend(["", f"**{c['target']}**", ""] if markdown else ["  " + c["target"]])
            last = c["target"]
        if c["target"].startswith(("uring ", "aio ", "scopes ")):  # their own modules say how
            line = importlib.import_module(c["target"].split()[0]).target_line(c)
            out.append(("- " if markdown else "    ") + line)
            continue
        size = f" at {fmt_size(c['size'])}" if c.get("size") else ""
        if c["ratio"] is None:
            line = f"{c['status']:6s} {c['label']}{size}: not measured"
        elif "versus" in c:
            line = (f"{c['status']:6s} {c['label']}{size}: {c['ratio']:.2f}x "
                    f"(limit {c['limit']:.1f}x{', within noise' if c.get('borderline') else ''})")
            if "ratio_vs_cheapest_bytearray" in c:
                line += (f"  [cheapest: {c['ratio_vs_cheapest_bytearray']:.2f}x "
                         f"{c['status_vs_cheapest_bytearray']}]")
        else:
            line = f"{c['status']:6s} {c['label']}: {c['ratio']:.1%} (limit {c['limit']:.0%})"
        out.append(("- " if markdown else "    ") + line)
    return "\n".join(out)


def disturbance(res: dict) -> str | None:
    """A warning when other processes took a noticeable share of the CPUs during the run."""
    share = res.get("cpu_share", {}).get("others_share")
    if share is None or share < 0.1:
        return None
    parts = [f"{name} {res[name]['cpu_share'].get('others_share', 0):.0%}" for name in RUN_ORDER
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


def plots(res: dict, out: Path) -> list[str]:
    """PNG plots; returns the file names written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plots (python3 dev.py bench installs it)", file=sys.stderr)
        return []
    written = []
    rt = res.get("roundtrip")
    if rt:
        for fname, field, ylabel, title in (
            ("roundtrip_ns.png", "ns_per_op", "ns per allocate+fill+free (median)",
             "Allocation round trip: time per op"),
            ("roundtrip_ratio.png", "ratio_to_baseline", "ratio to bytearray(n)+fill (same round)",
             "Allocation round trip: ratio to bytearray (lower is faster)"),
        ):
            fig, ax = plt.subplots(figsize=(9, 5.5))
            # peers dashed with squares, arenalib solid with circles; each family its own colour cycle
            palette = plt.get_cmap("tab10").colors
            seen = {"peer": 0, "arenalib": 0, "reference": 0}
            for key, c in rt["candidates"].items():
                if c["skipped"] or key not in rt["cells"] or (key == "loop" and field != "ns_per_op"):
                    continue
                ys = [rt["cells"][key][str(n)][field]["median"] for n in rt["sizes"]]
                style = {"arenalib": "-", "peer": "--", "reference": ":"}[c["family"]]
                marker = "o" if c["family"] == "arenalib" else ("s" if c["family"] == "peer" else ".")
                color = "gray" if key == "loop" else palette[seen[c["family"]] % len(palette)]
                seen[c["family"]] += 1
                ax.plot(rt["sizes"], ys, style, marker=marker, label=c["label"], linewidth=1.4,
                        markersize=4, color=color)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(rt["sizes"], [fmt_size(n) for n in rt["sizes"]])
            ax.set_xlabel("size")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
            fig.tight_layout()
            fig.savefig(out / fname, dpi=90)
            plt.close(fig)
            written.append(fname)
    mem = res.get("memory")
    if mem:
        import memory
        phases = memory.PHASES
        fig, axes = plt.subplots(1, 2, figsize=(11, 5.4))
        for key, e in mem["candidates"].items():
            if "rss" not in e:
                continue
            ys = [e["rss"][p] / 1e6 for p in phases]
            style = "-" if key in memory.ARENALIB else "--"
            for ax in axes:
                ax.plot(phases, ys, style, marker="o", markersize=4, label=e["label"])
        axes[0].set_ylabel("RSS (MB)")
        axes[0].set_title("RSS per phase")
        axes[1].set_yscale("log")
        axes[1].set_title("RSS per phase (log scale)")
        for ax in axes:
            ax.grid(True, alpha=0.3)
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=4, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        fig.savefig(out / "memory_rss.png", dpi=90)
        plt.close(fig)
        written.append("memory_rss.png")
    return written


def markdown_report(res: dict, checks: list[dict], pngs: list[str]) -> str:
    cmd = "python3 dev.py bench" + (" --full" if res["config"]["mode"] == "full" else "")
    parts = [
        "# arenalib benchmark results",
        "",
        f"Machine: {machine_line(res)}.",
        f"Run: {res['started']}, {res['config']['mode']} mode, {res['wall_seconds']:.0f} s; "
        f"other processes took {res.get('cpu_share', {}).get('others_share', 0) or 0:.0%} of the CPU "
        f"time meanwhile.  Reproduce: `{cmd}` (writes bench/out/; `--out DIR` to choose).",
        "",
    ]
    if failures_text(res):
        parts += [failures_text(res, markdown=True), ""]
    if disturbance(res):
        parts += [f"**{disturbance(res)}**", ""]
    if "roundtrip" in res:
        parts += ["## 1. Allocation round trip (allocate, fill with byte 3, free)", "",
                  "Timed statements (one per op, callables bound as locals):", ""]
        for c in res["roundtrip"]["candidates"].values():
            if c["skipped"]:
                parts.append(f"- {c['label']}: skipped ({c['skipped']})")
            else:
                batch = f" + `{c['batch']}` per batch" if c["batch"] != "pass" else ""
                note = f" — {c['note']}" if c["note"] else ""
                parts.append(f"- {c['label']}: `{c['op']}`{batch}{note}")
        parts += ["", roundtrip_tables(res["roundtrip"], markdown=True), ""]
    if "memory" in res:
        import memory
        parts += ["## 2. Memory handed back", "", memory_table(res["memory"], markdown=True), ""]
        if res["memory"].get("idle"):
            parts += [memory.idle_table(res["memory"], markdown=True), ""]
    if "threads" in res:
        parts += ["## 3. Threads", "", threads_table(res["threads"], markdown=True), "",
                  res["threads"]["method"].get("note", ""), ""]
    if checks:
        parts += ["## Targets, from ratios measured in this run", "",
                  targets_text(checks, markdown=True), ""]
    extra = extra_reports(res)
    if extra:
        parts += ["## 4. BufferPool and the C level (issues 4 and 5)", "", "```", extra, "```", ""]
    if "scopes" in res:
        parts += ["## 5. One arena per scope (issue 14)", "",
                  "Timed per scope (bench/scopes.py: every name bound as a local, the same loop for all; "
                  "k blocks per scope):", ""]
        for c in res["scopes"]["candidates"].values():
            if c["skipped"]:
                parts.append(f"- {c['label']}: skipped ({c['skipped']})")
            else:
                note = f" — {c['note']}" if c["note"] else ""
                parts.append(f"- {c['label']}: `{c['scope']}`, per block `{c['block']}`{note}")
        parts += ["", scopes_tables(res["scopes"], markdown=True), ""]
    if "uring" in res:
        import uring
        parts += ["## 6. io_uring: arenalib.Ring (issue 15)", "",
                  "What and how: bench/uring.py's docstring.", "",
                  uring.tables(res["uring"], markdown=True), ""]
    if "aio" in res:
        import aio
        parts += ["## 7. asyncio frames: arenalib.aio.FrameReader (issue 15)", "",
                  "What and how: bench/aio.py's docstring.", "", aio.tables(res["aio"], markdown=True), ""]
    for png in pngs:
        parts.append(f"![{png}]({png})")
    return "\n".join(parts) + "\n"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the careful run (longer)")
    parser.add_argument("--out", default=str(HERE / "out"), help="output directory (default bench/out)")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help="comma-separated experiments: " + ",".join(EXPERIMENTS))
    parser.add_argument("--memory-bytes", type=float, default=None,
                        help="bytes the memory workload keeps (default 1.5e9)")
    parser.add_argument("--from-json", metavar="FILE",
                        help="measure nothing: redo tables, targets, plots and markdown of a results.json")
    parser.add_argument("--experiments-dir", metavar="DIR",
                        help="look the experiment modules up in DIR first (the tests' stand-ins)")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)   # run.py runs each
    parser.add_argument("--result", metavar="FILE", help=argparse.SUPPRESS)  # experiment in a child
    parser.add_argument("--config", metavar="JSON", help=argparse.SUPPRESS)  # process of its own
    args = parser.parse_args()
    if args.experiments_dir:
        sys.path.insert(0, str(Path(args.experiments_dir).resolve()))
    if args.child:
        return child_main(args.child, Path(args.result), Config(**json.loads(args.config)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        res = json.loads(Path(args.from_json).read_text())
        res["targets"] = targets(res)
        if "native" in res:
            native_targets(res["native"])
        report(res, out)
        return 0
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(only) - set(EXPERIMENTS)
    if unknown:
        parser.error(f"unknown experiment(s): {', '.join(sorted(unknown))}")
    cfg = Config.full() if args.full else Config.quick()
    if args.memory_bytes:
        cfg.memory_bytes = int(args.memory_bytes)

    res: dict = {
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": cfg.asdict(),
        "loadavg_before": loadavg(),
        "machine": machine_info(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OPENBLAS_", "ARENALIB_", "MALLOC_", "GLIBC_TUNABLES"))},
        "failed": {},
    }
    print(f"arenalib benchmark, {cfg.mode} mode: {', '.join(only)} -> {out}", file=sys.stderr)
    busy = loadavg()[:1]
    if busy and busy[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {busy[0]} before the run: other processes compete for the CPUs "
              "and will make the figures noisy", file=sys.stderr)
    cpu = CpuShare()
    planned = {name: plan_units(name, cfg) for name in only}
    progress = Progress(sum(planned.values()))
    t0 = time.perf_counter()
    for name in RUN_ORDER:
        if name in only:
            t = time.perf_counter()
            start = progress.done
            share = CpuShare()
            result, failure = run_in_child(name, cfg, progress, args.experiments_dir)
            progress.sync(start + planned[name])
            if failure is not None:
                res["failed"][name] = failure
                progress.note(f"{name}: {failure}")
                continue
            if name == "native":
                native_targets(result)
            res[name] = result
            res[name]["wall_seconds"] = round(time.perf_counter() - t, 1)
            res[name]["cpu_share"] = share.result()
    progress.close()
    res["wall_seconds"] = round(time.perf_counter() - t0, 1)
    res["loadavg_after"] = loadavg()
    res["cpu_share"] = cpu.result()
    res["targets"] = targets(res)
    report(res, out)
    return 1 if res["failed"] else 0


def native_targets(measured: dict) -> None:
    """native.py's figures read back from JSON: sizes as ints again, and its targets redone."""
    import native

    measured["roundtrip"] = {int(size): row for size, row in measured["roundtrip"].items()}
    measured["targets"] = native.targets(measured["roundtrip"], measured["threads"])


class QuickOrFull:
    """pool.py and native.py (issues 4 and 5) take run(quick=...): seen here as run.py's modules."""

    def __init__(self, module):
        self.module = module

    def plan_units(self, cfg: Config) -> float:
        return 1

    def run(self, cfg: Config, progress: Progress) -> dict:
        progress.set_label(self.module.__name__)
        return self.module.run(quick=cfg.mode != "full")


def experiment(name: str):
    """The module of an experiment, with plan_units(cfg) and run(cfg, progress)."""
    module = importlib.import_module(name)
    return QuickOrFull(module) if name in ("pool", "native") else module


def plan_units(name: str, cfg: Config) -> float:
    try:
        return experiment(name).plan_units(cfg)
    except Exception:  # the child will fail the same way and say why
        return 1


# -- each experiment in a child process -----------------------------------------------------------
#
# An experiment that dies (a signal: SIGILL from an extension built for another CPU, SIGSEGV) or
# raises takes only its own process down: the parent reports it by name and goes on.  The child
# writes its result as JSON to --result and its progress as JSON lines to its stdout (anything else
# it prints goes to its stderr, which the parent shows as notes).

class ChildProgress:
    """The Progress interface inside a child: every change goes to the parent as a JSON line."""

    def __init__(self, stream):
        self.stream = stream
        self.done = 0.0
        self.label = ""

    def _send(self, **message) -> None:
        self.stream.write(json.dumps(message) + "\n")
        self.stream.flush()

    def step(self, label: str | None = None, units: float = 1) -> None:
        self.done += units
        self.label = self.label if label is None else label
        self._send(done=self.done, label=self.label)

    def sync(self, done: float) -> None:
        self.done = done
        self._send(done=self.done, label=self.label)

    def set_label(self, label: str) -> None:
        self.label = label
        self._send(done=self.done, label=label)

    def note(self, message: str) -> None:
        self._send(note=message)


def child_main(name: str, result: Path, cfg: Config) -> int:
    """Run one experiment; its result (or the exception it raised) goes to ``result`` as JSON."""
    faulthandler.enable()  # a fatal signal prints the Python stack to stderr, then kills the process
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (the experiment's, its subprocesses') go to stderr
    try:
        text, status = json.dumps({"result": experiment(name).run(cfg, ChildProgress(channel))}), 0
    except BaseException as exc:
        traceback.print_exc()
        text, status = json.dumps({"error": traceback.format_exception_only(type(exc), exc)[-1].strip()}), 1
    partial = result.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(result)  # whole or absent
    return status


def run_in_child(name: str, cfg: Config, progress: Progress,
                 experiments_dir: str | None = None) -> tuple[dict | None, str | None]:
    """Run experiment ``name`` in a child process: ``(result, None)``, or ``(None, why it failed)``."""
    start = progress.done
    progress.set_label(f"{name}: starting")
    with tempfile.TemporaryDirectory(prefix="arenalib-bench-") as tmp:
        result_file = Path(tmp) / f"{name}.json"
        cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), str(Path(__file__).resolve()),
               "--child", name, "--result", str(result_file), "--config", json.dumps(cfg.asdict()),
               *(["--experiments-dir", experiments_dir] if experiments_dir else [])]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stderr_tail: collections.deque[str] = collections.deque(maxlen=20)

        def on_message(line: str) -> None:
            try:
                message = json.loads(line)
            except ValueError:
                message = {"note": line}
            if "note" in message:
                progress.note(message["note"])
            else:
                progress.label = message["label"]
                progress.sync(start + message["done"])

        def on_stderr(line: str) -> None:
            stderr_tail.append(line)
            progress.note(line)

        _pump(proc, on_message, on_stderr)
        returncode = proc.wait()
        payload = json.loads(result_file.read_text()) if result_file.exists() else {}
    if "result" in payload and returncode == 0:
        return payload["result"], None
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return None, f"died with {sig.name} ({signal.strsignal(sig)})"
    if "error" in payload:
        return None, f"raised {payload['error']}"
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    return None, f"exited with status {returncode}" + (f": {last.strip()}" if last else "")


def _pump(proc: subprocess.Popen, on_stdout, on_stderr) -> None:
    """Feed the lines of the child's stdout and stderr to the two callbacks as they come, until both
    are closed."""
    handlers = {proc.stdout: on_stdout, proc.stderr: on_stderr}
    pending = {proc.stdout: b"", proc.stderr: b""}
    with selectors.DefaultSelector() as selector:
        for stream in handlers:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    chunk = b"\n" if pending[key.fileobj] else b""
                *lines, pending[key.fileobj] = (pending[key.fileobj] + chunk).split(b"\n")
                for line in lines:
                    handlers[key.fileobj](line.decode(errors="replace"))


def extra_reports(res: dict) -> str:
    """The BufferPool and C-level sections, as their own modules print them."""
    import contextlib
    import io

    parts = []
    if "pool" in res:
        import pool

        parts += ["BufferPool (issue 4)", pool.tables(res["pool"])]
    if "native" in res:
        import native

        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            native.print_report(res["native"])
        parts += ["C level through `cimport arenalib` (issue 5)", text.getvalue().strip("\n")]
    return "\n\n".join(parts)


def report(res: dict, out: Path) -> None:
    """Print the tables and the checklist; write results.json, the plots and results.md."""
    checks = res["targets"]
    print(f"\nMachine: {machine_line(res)}\n")
    failed = failures_text(res)
    if failed:
        print(failed + "\n")
    disturbed = disturbance(res)
    if disturbed:
        print(disturbed + "\n")
    if "roundtrip" in res:
        print(roundtrip_tables(res["roundtrip"]) + "\n")
    if "memory" in res:
        import memory
        print(memory_table(res["memory"]) + "\n")
        if res["memory"].get("idle"):
            print(memory.idle_table(res["memory"]) + "\n")
    if "threads" in res:
        print(threads_table(res["threads"]))
        print("  " + res["threads"]["method"]["note"] + "\n")
    if "scopes" in res:
        print(scopes_tables(res["scopes"]) + "\n")
    if "uring" in res:
        import uring
        print(uring.tables(res["uring"]) + "\n")
    if "aio" in res:
        import aio
        print(aio.tables(res["aio"]) + "\n")
    if checks:
        print(targets_text(checks) + "\n")
    extra = extra_reports(res)
    if extra:
        print(extra + "\n")

    (out / "results.json").write_text(compact_json(res) + "\n")
    pngs = plots(res, out)
    (out / "results.md").write_text(markdown_report(res, checks, pngs))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}"
          + "".join(f", {out / p}" for p in pngs))
    print(f"wall time {res['wall_seconds']:.0f} s")
    if failed:
        print(f"{len(res['failed'])} experiment(s) failed: " + ", ".join(res["failed"]))


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


if __name__ == "__main__":
    sys.exit(main())
