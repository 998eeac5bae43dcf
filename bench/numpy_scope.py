"""Experiment 10, NumPy arrays from an arena (issue 28): `with arena.numpy():` against NumPy's own handler.

What it measures, each part in a fresh child process (``numpy_scope.py --child PART``), so that one
part's glibc heap and page tables do not carry into the next:

* The loop ``c = a*b + a`` over float64 arrays of n bytes, ``a`` and ``b`` made once by NumPy's default
  handler.  NumPy's temporary elision makes the product the sum's output, so an iteration allocates one
  array of n bytes and frees the previous ``c``.  Per iteration after 2 warm-up iterations: ms (the
  loop's time over its iterations) and minor page faults (getrusage's ru_minflt), with NumPy's default
  handler and inside ``with arena.numpy():`` (one Arena open through the part, the scope entered around
  each measurement), and the floor, the same arithmetic into a preallocated array
  (``multiply(a, b, out=c); add(c, a, out=c)``).  n: 64 MiB (the issue's case), then 1 to 16 MiB,
  powers of two and not: the default handler (glibc's malloc) maps a block past its mmap threshold and
  unmaps it at the free, and the threshold starts at 128 KiB and rises to the size of a mapped block
  freed, up to 32 MiB, so which sizes come back from the heap warm depends on what came before.
  Children per size, so each size starts from the same history, and more than one (their rounds
  pooled): at 1-3 MiB the ratio of one process to the next varied by up to 0.1 with the same code
  (2 MiB, 4 processes: 0.99-1.06x), as each maps its blocks to other physical pages.
* Small arrays: ``e(8)`` and ``z(100)`` (``e = numpy.empty``, ``z = numpy.zeros``; the targets), and
  more sizes from 296 B to 1 MiB on both sides of each bound where the handler's path changes (the
  1 KiB up to which it keeps the blocks of dead arrays for reuse, the 64 KiB and 128 KiB of the arena's
  and jemalloc's caches, past 128 KiB a block is page-aligned: SMALL_SWEEP), made and dropped
  in experiment 1's loop (bench/roundtrip.py: 256
  per inner batch, the garbage collector off): ns per array,
  with NumPy's default handler, inside ``with arena.numpy():``, and, for reference, under the floor
  handler (bench/native/arenalib_bench_floor.c: the one block freed last handed out again, no books;
  left out when it cannot be built): what NumPy charges any handler that is not its own, so that the
  arena's own share is the difference.
* RSS at scope exit: a child per workload and handler reads its RSS (the baseline: NumPy imported and
  used once, an arena opened and closed once, and before the many-arrays workload as many 8-byte
  arrays made and dropped, no array alive: each library's first-use state, and the pymalloc arenas
  of the workload's array objects, made once per process and kept for the next use whichever
  handler holds the data, are no memory a scope keeps), runs the workload inside
  ``with arenalib.Arena() as arena, arena.numpy():`` (or with the default handler) making every array
  in the block and dropping it there, and reads RSS right after the block, with no trim call and no
  wait.  Workloads: the 64 MiB loop; the 1-16 MiB sweep; many small and medium arrays (8 B to 1 MiB)
  kept in a list, then dropped.

Candidates interleave round by round (the starting one rotating); every ratio is the median of the
same-round ratios (quartiles in brackets).  Targets (issue 28): the 64 MiB loop >= 15% faster than the
default (time ratio <= 0.85) with <= 1% of its pages faulted per iteration; at 1-16 MiB <= 1.02x the
default; small arrays <= 1.05x; RSS within 5% of the baseline at scope exit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import roundtrip
from _common import Config, Progress, fmt_ns, fmt_size, run_standalone, same_round_ratio, summarize, table
from _experiment import finding, ratio_item, side, times

TITLE = "10. NumPy arrays from an arena: `with arena.numpy():` against NumPy's default handler (issue 28)"
MiB = 1 << 20
PAGE = 4096
BIG = 64 * MiB
SWEEP = {"quick": [MiB, 3_000_000, 4 * MiB, 7_500_000, 12 * MiB, 16 * MiB],
         "full": [MiB, 1_500_000, 2 * MiB, 3_000_000, 4 * MiB, 5_000_000, 6 * MiB, 7_500_000, 8 * MiB,
                  10_000_000, 12 * MiB, 14_000_000, 16 * MiB]}
# children: the processes a loop size's (and the small arrays') rounds are split over, and pooled.
SETTINGS = {"quick": {"rounds": 5, "children": 1, "target_ms": 40.0, "small_ms": 8.0},
            "full": {"rounds": 15, "children": 3, "target_ms": 120.0, "small_ms": 30.0}}
WARMUP = 2
LOOP = {"default": "NumPy's default handler", "arena": "with arena.numpy()", "out": "out= (preallocated)"}
SMALL_TARGETS = {"empty": ("e(8)", "numpy.empty(8)"), "zeros": ("z(100)", "numpy.zeros(100)")}
# More sizes, no target, where the handler's cost changes: it keeps the blocks of dead arrays of up to
# 1 KiB (1024 bytes of data) for reuse on a GIL build; the arena's free-block cache ends at 64 KiB and
# jemalloc's thread cache at 128 KiB; past 128 KiB a block is page-aligned, with a header only where its
# size class has room for one (src/numpy_large.h).  Sizes on both sides of each, not powers of two too.
SWEEP_SIZES = [("empty", 37), ("empty", 128), ("empty", 129), ("empty", 500), ("zeros", 37), ("zeros", 129),
               ("zeros", 1250), ("empty", 2500), ("empty", 8192), ("empty", 12_000), ("empty", 16_383),
               ("empty", 16_384), ("empty", 16_385), ("empty", 25_000), ("empty", 131_072)]
SMALL_SWEEP = {f"{kind}{n}": (f"{kind[0]}({n})", f"numpy.{kind}({n}), {fmt_size(8 * n)}")
               for kind, n in SWEEP_SIZES}
SWEEP_SPAN = " to ".join(fmt_size(8 * f(n for _, n in SWEEP_SIZES)) for f in (min, max))
SMALL = {**SMALL_TARGETS, **SMALL_SWEEP}
RSS_WORKLOADS = {"loop64": "the 64 MiB loop", "sweep": "the 1-16 MiB loop sweep",
                 "mixed": "4,000 arrays of 8 B-1 MiB kept, then dropped"}
NP_HEADER = 16  # the bytes arenalib's NumPy handler puts before an array's data (up to 128 KiB, always)
BIG_ARRAY = 64 * 1024  # from here an array's block is past the arena's own cache (see _big_why)
BIG_LIMIT, BIG_FAULTS, SWEEP_LIMIT, SMALL_LIMIT, RSS_LIMIT = 0.85, 0.01, 1.02, 1.05, 0.05


# -- the children -------------------------------------------------------------------------------------

def _faults() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _loop_child(n: int, rounds: int, target_ms: float) -> dict:
    """ms and minor faults per iteration of each LOOP candidate at n bytes, per round."""
    import gc

    import numpy as np

    import arenalib

    count = n // 8
    a = np.random.default_rng(1).random(count)
    b = np.random.default_rng(2).random(count)
    out = np.empty(count)
    arena = arenalib.Arena()

    def measure(key: str, k: int) -> tuple[float, float]:
        c = None
        if key == "out":
            for _ in range(WARMUP):
                np.multiply(a, b, out=out)
                np.add(out, a, out=out)
            f0, t0 = _faults(), time.perf_counter_ns()
            for _ in range(k):
                np.multiply(a, b, out=out)
                np.add(out, a, out=out)
            return (time.perf_counter_ns() - t0) / k / 1e6, (_faults() - f0) / k
        for _ in range(WARMUP):
            c = a * b + a
        f0, t0 = _faults(), time.perf_counter_ns()
        for _ in range(k):
            c = a * b + a
        dt, flt = time.perf_counter_ns() - t0, _faults() - f0
        del c
        return dt / k / 1e6, flt / k

    def run(key: str, k: int) -> tuple[float, float]:
        gc.disable()
        try:
            if key == "arena":
                with arena.numpy():
                    return measure(key, k)
            return measure(key, k)
        finally:
            gc.enable()

    first, _ = run("default", 1)
    k = max(3, round(target_ms / max(first, 1e-3)))
    keys = list(LOOP)
    ms: dict[str, list[float]] = {key: [] for key in keys}
    faults: dict[str, list[float]] = {key: [] for key in keys}
    for rnd in range(rounds):
        shift = rnd % len(keys)
        for key in keys[shift:] + keys[:shift]:
            t, f = run(key, k)
            ms[key].append(t)
            faults[key].append(f)
    stats = arena.stats()
    arena.close()
    assert stats["numpy_arrays"] == 0 and stats["allocated_total"] > 0, stats
    return {"n": n, "iterations": k, "ms": ms, "faults": faults}


def _small_child(rounds: int, target_ms: float) -> dict:
    """ns per array of each SMALL statement, with the default handler, in an arena's scope and under the
    floor handler (when bench/native builds)."""
    import numpy as np
    from frames import floor_module

    import arenalib

    floor = floor_module()
    # (None without the module, or without NumPy's headers when it was built: bench/native/meson.build)
    floor_handler = floor.numpy_handler() if hasattr(floor, "numpy_handler") else None
    arena = arenalib.Arena()
    envs = {"e": np.empty, "z": np.zeros}
    runners, outers, cells = {}, {}, {}
    for name, (op, _) in SMALL.items():
        runner = roundtrip.make_runner(roundtrip.Candidate(name, name, "peer", op, lambda n: envs), 8, envs)
        runner(3)
        runners[name] = runner
        outers[name] = roundtrip.calibrate(runner, 8, target_ms * 1e6)
    ops = roundtrip.inner_count(8)
    for name in SMALL:
        keys = ["default", "arena"] + (["floor"] if floor_handler is not None else [])
        per: dict[str, list[float]] = {key: [] for key in keys}
        for rnd in range(rounds):
            for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
                if key == "arena":
                    with arena.numpy():
                        ns = roundtrip.timed(runners[name], outers[name])
                elif key == "floor":
                    previous = arenalib.set_numpy_handler(floor_handler)
                    try:
                        ns = roundtrip.timed(runners[name], outers[name])
                    finally:
                        arenalib.set_numpy_handler(previous)
                else:
                    ns = roundtrip.timed(runners[name], outers[name])
                per[key].append(ns / (outers[name] * ops))
        cells[name] = per
    arena.close()
    return cells


def _rss_child(workload: str, handler: str, sweep: list[int]) -> dict:
    """RSS before, at the peak of, and right after the workload's scope."""
    import contextlib

    import numpy as np
    from _common import rss_bytes

    import arenalib

    np.ones(10).sum()  # NumPy's own first-use state, before the baseline
    # arenalib's: the first arena's jemalloc arena and thread cache (~240 KiB, 0.8% of the baseline;
    # a second arena reuses them and adds nothing: measured 2026-12-05).  In both children.
    with arenalib.Arena() as first, first.numpy():
        np.ones(100)
    # The workload's input too: alive after the scope, its 4,000 ints are no memory a handler keeps.
    sizes = [8 << (i % 18) for i in range(4000)]  # 8 B to 1 MiB
    # And its 4,000 array objects' (pymalloc keeps an arena a survivor is in, whatever the handler:
    # +670 KiB, 2.2% of the baseline, with 8-byte arrays in either handler, measured 2026-12-06).
    headers = [np.empty(1) for _ in sizes] if workload == "mixed" else []
    del headers
    baseline = rss_bytes()
    peak = baseline
    with contextlib.ExitStack() as stack:
        if handler == "arena":
            arena = stack.enter_context(arenalib.Arena())
            stack.enter_context(arena.numpy())
        if workload == "mixed":
            kept = [np.ones(n // 8 or 1) for n in sizes]
            peak = max(peak, rss_bytes())
            del kept
        else:
            for n in [BIG] if workload == "loop64" else sweep:
                a, b = np.ones(n // 8), np.ones(n // 8)
                for _ in range(6):
                    c = a * b + a
                peak = max(peak, rss_bytes())
                del a, b, c
    return {"baseline": baseline, "peak": peak, "after": rss_bytes()}


def _child_main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=["loop", "small", "rss"], required=True)
    parser.add_argument("--n", type=int, default=BIG)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target-ms", type=float, default=40.0)
    parser.add_argument("--workload", default="loop64")
    parser.add_argument("--handler", default="arena")
    parser.add_argument("--sweep", default="")
    args = parser.parse_args(argv)
    if args.child == "loop":
        out = _loop_child(args.n, args.rounds, args.target_ms)
    elif args.child == "small":
        out = _small_child(args.rounds, args.target_ms)
    else:
        out = _rss_child(args.workload, args.handler, [int(x) for x in args.sweep.split(",") if x])
    print(json.dumps(out), flush=True)
    return 0


def _child(*args: str) -> dict:
    """Run this module as a child with ``args``: its JSON result ({"error": why} when it failed)."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True,
                          text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": f"child {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"}
    return json.loads(lines[-1])


# -- the experiment -------------------------------------------------------------------------------------

def plan(cfg: Config) -> float:
    s = SETTINGS[cfg.mode]
    loops = (1 + len(SWEEP[cfg.mode])) * (s["rounds"] + s["children"]) * len(LOOP) * s["target_ms"]
    return loops + len(SMALL) * 2 * s["rounds"] * s["small_ms"] + len(RSS_WORKLOADS) * 2 * 2500


def _pooled(raws: list[dict]) -> dict:
    """The loop children's results at one size as one: their rounds one after the other."""
    failed = [raw for raw in raws if "error" in raw]
    if failed:
        return failed[0]
    return {"n": raws[0]["n"], "iterations": [raw["iterations"] for raw in raws],
            "ms": {key: [t for raw in raws for t in raw["ms"][key]] for key in LOOP},
            "faults": {key: [f for raw in raws for f in raw["faults"][key]] for key in LOOP}}


def _pooled_small(raws: list[dict]) -> dict:
    """The small-array children's results as one: each statement's rounds one after the other."""
    failed = [raw for raw in raws if "error" in raw]
    if failed:
        return failed[0]
    return {name: {key: [ns for raw in raws for ns in raw[name][key]] for key in raws[0][name]}
            for name in raws[0]}


def _loop_cell(raw: dict) -> dict:
    if "error" in raw:
        return raw
    ms, faults = raw["ms"], raw["faults"]
    return {"n": raw["n"], "iterations": raw["iterations"], "children": len(raw["iterations"]),
            "ms": {k: summarize(v) for k, v in ms.items()},
            "faults": {k: summarize(v) for k, v in faults.items()},
            "ratio": same_round_ratio(ms["arena"], ms["default"]),
            "floor_ratio": same_round_ratio(ms["out"], ms["default"])}


def run(cfg: Config, progress: Progress) -> dict:
    s = SETTINGS[cfg.mode]
    children = s["children"]
    rounds, target = str(s["rounds"] // children), str(s["target_ms"])
    loop_ms = (s["rounds"] // children + 1) * len(LOOP) * s["target_ms"]
    loops = {}
    for n in [BIG, *SWEEP[cfg.mode]]:
        progress.set_label(f"numpy_scope: c = a*b + a at {fmt_size(n)}")
        raws = []
        for _ in range(children):
            raws.append(_child("--child", "loop", "--n", str(n), "--rounds", rounds, "--target-ms", target))
            progress.step(None, loop_ms)
        loops[str(n)] = _loop_cell(_pooled(raws))
    progress.set_label("numpy_scope: small arrays")
    from frames import floor_module

    floor_module()  # built here once, not by the child (which then only imports it)
    # As the loops: 2 * rounds + 1 rounds in all (a few more when split), from `children` processes.
    small_rounds = -(-(2 * s["rounds"] + 1) // children)
    raws = []
    for _ in range(children):
        raws.append(_child("--child", "small", "--rounds", str(small_rounds),
                           "--target-ms", str(s["small_ms"])))
        progress.step(None, len(SMALL) * 2 * s["rounds"] * s["small_ms"] / children)
    raw = _pooled_small(raws)
    small = raw if "error" in raw else {name: _small_cell(per) for name, per in raw.items()}
    rss = {}
    sweep = ",".join(str(n) for n in SWEEP[cfg.mode])
    for workload in RSS_WORKLOADS:
        rss[workload] = {}
        for handler in ("default", "arena"):
            progress.set_label(f"numpy_scope: RSS, {workload}, {handler}")
            rss[workload][handler] = _child("--child", "rss", "--workload", workload, "--handler", handler,
                                            "--sweep", sweep)
            progress.step(None, 2500)
    return {"loops": loops, "small": small, "rss": rss, "rounds": s["rounds"], "loop_children": children,
            "small_children": children, "small_rounds": small_rounds * children,
            "warmup": WARMUP, "sweep": SWEEP[cfg.mode]}


# -- targets, findings, tables ------------------------------------------------------------------------

def _share(cell: dict) -> float | None:
    """RSS above baseline right after the scope, as a share of the baseline."""
    if "error" in cell:
        return None
    return (cell["after"] - cell["baseline"]) / cell["baseline"]


def _big_title() -> str:
    return (f"64 MiB `c = a*b + a` in `arena.numpy()`: >= 15% faster than NumPy's default (<= {BIG_LIMIT}x), "
            f"<= {BIG_FAULTS:.0%} of pages faulted (issue 28)")


def _faults_item(big: dict) -> dict:
    faults = big.get("faults", {}).get("arena")
    item = {"target": _big_title(), "candidate": "arena", "label": "c = a*b + a, minor faults per iteration",
            "size": BIG, "limit": BIG_FAULTS, "pages": BIG // PAGE}
    if faults is None:
        item.update(status="n/a", ratio=None)
    else:
        share = faults["median"] / (BIG // PAGE)
        item.update(ratio=share, faults=faults["median"], status="MET" if share <= BIG_FAULTS else "MISSED")
    return item


def targets(results: dict) -> list[dict]:
    big = results["loops"].get(str(BIG), {})
    checks = [ratio_item(_big_title(), "arena", "c = a*b + a, time", BIG, "default", LOOP["default"],
                         BIG_LIMIT, big.get("ratio")), _faults_item(big)]
    sweep_title = f"1-16 MiB: no slower than NumPy's default handler (<= {SWEEP_LIMIT}x, issue 28)"
    for n in results["sweep"]:
        checks.append(ratio_item(sweep_title, "arena", "c = a*b + a", n, "default", LOOP["default"],
                                 SWEEP_LIMIT, results["loops"].get(str(n), {}).get("ratio")))
    small = {} if "error" in results["small"] else results["small"]
    for name, (_, label) in SMALL_TARGETS.items():
        checks.append(ratio_item(f"small arrays: <= {SMALL_LIMIT}x the default handler's creation cost "
                                 "(issue 28)", "arena", label, 0, "default", LOOP["default"], SMALL_LIMIT,
                                 small.get(name, {}).get("ratio")))
    rss_title = f"RSS within {RSS_LIMIT:.0%} of the baseline at scope exit, no trim call (issue 28)"
    for workload, label in RSS_WORKLOADS.items():
        share = _share(results["rss"][workload]["arena"])
        status = "n/a" if share is None else "MET" if abs(share) <= RSS_LIMIT else "MISSED"
        checks.append({"target": rss_title, "candidate": "arena", "label": label, "size": 0,
                       "limit": RSS_LIMIT, "ratio": share, "status": status})
    return checks


def target_line(check: dict) -> str:
    if check["ratio"] is None:
        return f"{check['status']:6s} {check['label']}: not measured"
    size = f" at {fmt_size(check['size'])}" if check["size"] else ""
    if "pages" in check:
        return (f"{check['status']:6s} {check['label']}{size}: {check['faults']:.1f} of {check['pages']} "
                f"pages ({check['ratio']:.2%}, limit {check['limit']:.0%})")
    if "versus" not in check:
        return (f"{check['status']:6s} {check['label']}: RSS {check['ratio']:+.1%} of the baseline "
                f"(limit {check['limit']:.0%})")
    border = " (borderline)" if check.get("borderline") else ""
    return (f"{check['status']:6s} {check['label']}{size}: {check['ratio']:.2f}x {check['versus_label']} "
            f"(limit {check['limit']}){border}")


def _against_default(ratio: float) -> str:
    words = times(ratio)
    return "on par with NumPy's default handler" if words == "on par" else f"{words} than NumPy's default"


def findings(results: dict) -> list[dict]:
    out = []
    big = results["loops"].get(str(BIG), {})
    if "ratio" in big:
        r, ms, f = big["ratio"]["median"], big["ms"], big["faults"]
        out.append(finding(side(r), f"NumPy in an arena scope, the 64 MiB loop `c = a*b + a`: "
                           f"{_against_default(r)} ({ms['arena']['median']:.1f} against "
                           f"{ms['default']['median']:.1f} ms, into preallocated arrays "
                           f"{ms['out']['median']:.1f}), {f['arena']['median']:.0f} page faults per "
                           f"iteration against {f['default']['median']:.0f}."))
    sweep = [(n, results["loops"][str(n)]["ratio"]) for n in results["sweep"]
             if "ratio" in results["loops"].get(str(n), {})]
    if sweep:
        lo, hi = min(r["median"] for _, r in sweep), max(r["median"] for _, r in sweep)
        slower = [(n, r) for n, r in sweep if r["median"] > SWEEP_LIMIT]
        text = (f"NumPy in an arena scope at 1-16 MiB: {lo:.2f}-{hi:.2f}x the default's time at "
                f"{len(sweep)} sizes")
        if slower:
            noise = all(r["q1"] <= SWEEP_LIMIT for _, r in slower)
            text += (f", over {SWEEP_LIMIT}x at " + ", ".join(fmt_size(n) for n, _ in slower)
                     + (" (within this run's noise: their quartiles reach below it)" if noise else ""))
        kind = "loss" if slower else "win" if all(side(r["median"]) == "win" for _, r in sweep) else "even"
        out.append(finding(kind, text + ".", "glibc's heap serves these sizes warm too: no page fault to "
                           "save, what is left is each handler's own work" if slower else None))
    if "error" not in results["small"] and results["small"]:
        small = results["small"]
        ratios = {label: small[k]["ratio"]["median"] for k, (_, label) in SMALL_TARGETS.items() if k in small}
        worst = max(ratios.values())
        swept = [(8 * n, small[f"{kind}{n}"]["ratio"]["median"]) for kind, n in SWEEP_SIZES
                 if f"{kind}{n}" in small]
        under = [(n, r) for n, r in swept if n < BIG_ARRAY]
        more = (f" ({_span([r for _, r in under])}x at {len(under)} more sizes, {_size_span(under)})"
                if under else "")
        out.append(finding(side(worst), "NumPy in an arena scope, small arrays: " + ", ".join(
            f"{label} {r:.2f}x" for label, r in ratios.items()) + f" the default's cost{more}.",
            _small_why(small) if side(worst) == "loss" else None))
        over = [(n, r) for n, r in swept if n >= BIG_ARRAY]
        if over:
            hi = max(r for _, r in over)
            out.append(finding(side(hi), f"NumPy in an arena scope, making arrays of {fmt_size(BIG_ARRAY)} "
                               f"and more: {_span([r for _, r in over])}x the default's cost at {len(over)} "
                               f"sizes, {_size_span(over)}.",
                               _big_why(small) if side(hi) == "loss" else None))
    shares = {RSS_WORKLOADS[w]: _share(results["rss"][w]["arena"]) for w in RSS_WORKLOADS}
    if all(v is not None for v in shares.values()):
        kind = "win" if all(abs(v) <= RSS_LIMIT for v in shares.values()) else "loss"
        out.append(finding(kind, "NumPy in an arena scope: RSS right after the scope, above the baseline: "
                           + ", ".join(f"{v:+.1%} ({w})" for w, v in shares.items()) + "."))
    return out


def _small_cell(per: dict) -> dict:
    """A small statement's ns per handler and its ratios, the floor handler's when it ran."""
    cell = {"ns": {k: summarize(v) for k, v in per.items()},
            "ratio": same_round_ratio(per["arena"], per["default"])}
    if "floor" in per:
        cell["floor_ratio"] = same_round_ratio(per["floor"], per["default"])
        cell["arena_over_floor"] = same_round_ratio(per["arena"], per["floor"])
    return cell


def _small_why(small: dict) -> str:
    """Why small arrays cost more in the scope: with the floor handler's figures, how much of it any
    handler not NumPy's own pays."""
    why = ("both handlers hand out a kept block, but arenalib's also counts the array as an export of the "
           "arena, keeps the arena's books and writes its header")
    if all("floor_ratio" in small.get(k, {}) for k in SMALL_TARGETS):
        why += "; a handler that keeps one block and no books (the floor) costs " + ", ".join(
            f"{label} {small[k]['floor_ratio']['median']:.2f}x" for k, (_, label) in SMALL_TARGETS.items())
    return why


def _span(values: list[float], spec: str = ".2f") -> str:
    """"lo-hi" of ``values``, one figure when they agree at ``spec``."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _size_span(cells: list[tuple[int, float]]) -> str:
    """"lo to hi" of the sizes in (bytes, ratio) ``cells``."""
    return f"{fmt_size(min(n for n, _ in cells))} to {fmt_size(max(n for n, _ in cells))}"


def _big_why(small: dict) -> str:
    """Why making a big array costs more in the scope than with NumPy's default handler."""
    # (a block past jemalloc's tcache_max, 128 KiB, is an extent: with its header from 128 KiB - 15)
    extent = [small[f"{kind}{n}"]["ns"] for kind, n in SWEEP_SIZES
              if f"{kind}{n}" in small and 8 * n + NP_HEADER > 128 * 1024]
    why = ("from 64 KiB a block comes from jemalloc's thread cache (the arena's own free-block cache stops "
           "at 64 KiB, and a block has a 16-byte header), and every such allocation fires jemalloc's thread "
           "events (its thread cache's upkeep, its peak counter), each due after 64 KiB allocated")
    if extent:
        arena = [c["arena"]["median"] for c in extent]
        default = [c["default"]["median"] for c in extent]
        why += (f"; past 128 KiB each block is an extent of jemalloc's own ({_span(arena, '.0f')} ns "
                f"against {_span(default, '.0f')}), where glibc's heap hands the chunk freed last back; next "
                "to filling the array (1 MiB: ~30 us) it is small")
    return why


def tables(results: dict, markdown: bool = False) -> str:
    h = "### " if markdown else ""
    rows = []
    for n, cell in results["loops"].items():
        if "error" in cell:
            rows.append([fmt_size(int(n)), "failed", "", "", "", ""])
            continue
        ms, faults, r = cell["ms"], cell["faults"], cell["ratio"]
        rows.append([fmt_size(int(n)), f"{ms['default']['median']:.2f}", f"{ms['arena']['median']:.2f}",
                     f"{r['median']:.2f}x ({r['q1']:.2f}-{r['q3']:.2f})", f"{ms['out']['median']:.2f}",
                     f"{faults['default']['median']:.0f} / {faults['arena']['median']:.0f} / "
                     f"{int(n) // PAGE}"])
    parts = [f"{h}`c = a*b + a` on float64 arrays of n bytes: ms an iteration after {results['warmup']} "
             f"warm-ups (ratio: median of {results['rounds']} same-round ratios)",
             table(["n", "default ms", "arena ms", "arena/default", "out= ms",
                    "faults/iter: default / arena / pages"], rows, markdown)]
    children = results.get("loop_children", 1)
    if children > 1:
        parts += ["", f"Each size's rounds come from {children} processes, pooled: one process's ratio",
                  "differs from the next by up to 0.1 with the same code (each maps its blocks to other",
                  "physical pages)."]
    small_children = results.get("small_children", 1)
    if "error" in results["small"]:
        parts += ["", f"Small arrays: {results['small']['error']}"]
    else:
        def span(r):
            return f"{r['median']:.2f}x ({r['q1']:.2f}-{r['q3']:.2f})"

        shown = [(k, label) for k, (_, label) in SMALL.items() if k in results["small"]]
        floored = all("floor_ratio" in results["small"][k] for k, _ in shown)
        rows = []
        for k, label in shown:
            cell = results["small"][k]
            rows.append([label, fmt_ns(cell["ns"]["default"]["median"]),
                         fmt_ns(cell["ns"]["arena"]["median"]), span(cell["ratio"])])
            if floored:  # (medians only: the row stays within 120 columns)
                rows[-1] += [fmt_ns(cell["ns"]["floor"]["median"]), f"{cell['floor_ratio']['median']:.2f}x",
                             f"{cell['arena_over_floor']['median']:.2f}x"]
        head = ["statement", "default", "arena scope", "ratio"]
        if floored:
            head += ["floor", "floor/default", "arena/floor"]
        parts += ["", f"{h}Arrays made and dropped: ns per array (the first two: the targets; kept blocks "
                  "to 1 KiB)", table(head, rows, markdown)]
        if floored:
            parts += ["", "The floor handler hands the block freed last out again and keeps no books: "
                      "what NumPy charges",
                      "any handler that is not its own (bench/native/arenalib_bench_floor.c)."]
        if small_children > 1:
            parts += ["", f"The {results.get('small_rounds')} rounds come from {small_children} processes, "
                      "pooled: np.zeros(100)'s ratio",
                      "ranged 1.00-1.09x over 10 processes with the same code (2026-12-06)."]
    rows = []
    for workload, label in RSS_WORKLOADS.items():
        for handler in ("default", "arena"):
            c = results["rss"][workload][handler]
            if "error" in c:
                rows.append([label, handler, "failed", "", "", ""])
                continue
            rows.append([label, handler, f"{c['baseline'] / MiB:.1f}", f"{c['peak'] / MiB:.1f}",
                         f"{c['after'] / MiB:.1f}", f"{_share(c):+.1%}"])
    parts += ["", f"{h}RSS (MiB) before, at the peak of and right after the scope (no trim, no wait)",
              table(["workload", "handler", "baseline", "peak", "after", "after vs baseline"], rows,
                    markdown)]
    return "\n".join(parts)


def plots(results: dict, out, plt) -> list[str]:
    sizes = [n for n in results["loops"] if "ratio" in results["loops"][n]]
    if not sizes:
        return []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [int(n) / MiB for n in sizes]
    for key, label in LOOP.items():
        ax.plot(xs, [results["loops"][n]["ms"][key]["median"] for n in sizes], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("array size (MiB)")
    ax.set_ylabel("ms per iteration of c = a*b + a")
    ax.set_title("NumPy's temporaries: default handler vs an arena scope")
    ax.legend()
    name = "numpy_scope_loop.png"
    fig.tight_layout()
    fig.savefig(Path(out) / name, dpi=110)
    plt.close(fig)
    return [name]


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(_child_main(sys.argv[1:]))
    run_standalone(__import__(__name__))
