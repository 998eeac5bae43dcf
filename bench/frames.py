"""Experiment 8, checked frames (issue 26): a frame per operation against bytearray.

What it measures, in experiment 1's loop (bench/roundtrip.py: every name a local, 256 ops per inner
batch, the garbage collector off), per op at several block sizes:

* ``with fr() as f: f.allocate(n, zero=False).fill(3)``: a frame of the calling thread's own frame
  arena (arenalib.frame), pushed and popped per op;
* ``with fa() as f: f.allocate(n, zero=False).fill(3)`` with ``fa = a.frame`` of one long-lived
  SlicingArena ``a``;
* ``m = mark(); alloc(n, zero=False).fill(3); rewind(m)``: the same with an explicit mark;
* ``with CA() as a: a.allocate(n, zero=False).fill(3)``: a whole ConfinedArena scope (experiment 5's
  per-scope row, for reference);
* the floor: ``with fa() as f: f.allocate(n, zero=False).fill(3)`` over C objects that do nothing
  but the memset (bench/native/arenalib_bench_floor.c, built with experiment 4b's kernels; left out
  when they cannot be built): what CPython itself charges for the statement;

against ``bytearray(n)[:] = pattern`` (experiment 1's baseline), candidates interleaved over rounds
with the starting one rotating, reported as the median of same-round ratios; arenalib's frames are
also taken against the floor in the same rounds.  bench/instructions.py counts the instructions of
the same statements (callgrind), split between the interpreter, arenalib and libc.  A second table times
an empty frame (``with fa(): pass``) with 0, 9, 99 and 999 frames already open below it: push and
pop are O(1) when the time per frame stays flat from depth 1 to 1,000.  The C level (mark + carve
64 B + rewind against glibc malloc+free) is in experiment 4b (bench/native.py).
"""

from __future__ import annotations

import roundtrip
from _common import (
    BASELINE,
    Config,
    Progress,
    fmt_ns,
    fmt_size,
    run_standalone,
    same_round_ratio,
    summarize,
    table,
)
from _experiment import ratio_item

TITLE = "8. Checked frames: a frame per operation (issue 26)"
# A sweep, non-powers of two among them: where a frame starts to cost less than bytearray's
# allocation and copy depends on the size (the table's last line says where).
SIZES = [64, 200, 512, 1000, 2000, 3000, 4096, 10000, 65536, 200000]
DEPTHS = [1, 10, 100, 1000]
SETTINGS = {"quick": {"rounds": 7, "target_ms": 10.0}, "full": {"rounds": 21, "target_ms": 30.0}}
FLAT_LIMIT = 1.25  # time per frame at depth 1,000 against depth 1
FLOOR = "floor"
FRAMES = ("frame", "SlicingArena.frame")  # arenalib's frame statements, also taken against the floor


def floor_module():
    """The floor's C objects (bench/native/arenalib_bench_floor.c), or None when they cannot be built."""
    try:
        import native

        return native.build_kernels("arenalib_bench_floor")
    except Exception:  # no compiler, meson or ninja: the run goes on without the floor
        return None


def candidates(arena, floor=None) -> list[roundtrip.Candidate]:
    """The statements of the first table; ``floor``: floor_module(), whose row is left out when None."""
    import arenalib

    floor_row = [] if floor is None else [
        roundtrip.Candidate(FLOOR, "no-op C frame", "reference",
                            "with fa() as f: f.allocate(n, zero=False).fill(3)",
                            lambda n: {"fa": floor.NullArena().frame, "n": n})]
    return [
        roundtrip.Candidate(BASELINE, "bytearray(n)+fill", "peer", "ba(n)[:] = pattern",
                            lambda n: {"ba": bytearray, "pattern": bytearray(b"\x03") * n, "n": n}),
        roundtrip.Candidate("frame", "with arenalib.frame()", "arenalib",
                            "with fr() as f: f.allocate(n, zero=False).fill(3)",
                            lambda n: {"fr": arenalib.frame, "n": n}),
        roundtrip.Candidate("SlicingArena.frame", "with a.frame()", "arenalib",
                            "with fa() as f: f.allocate(n, zero=False).fill(3)",
                            lambda n: {"fa": arena.frame, "n": n}),
        roundtrip.Candidate("SlicingArena.mark", "mark()/rewind()", "arenalib",
                            "m = mark(); alloc(n, zero=False).fill(3); rewind(m)",
                            lambda n: {"mark": arena.mark, "rewind": arena.rewind,
                                       "alloc": arena.allocate, "n": n}),
        roundtrip.Candidate("ConfinedArena", "with ConfinedArena()", "reference",
                            "with CA() as a: a.allocate(n, zero=False).fill(3)",
                            lambda n: {"CA": arenalib.ConfinedArena, "n": n}),
        *floor_row,
    ]


def _rounds(runners: dict, outers: dict, ops: dict, rounds: int, progress: Progress, label: str,
            step_ms: float) -> dict[str, list[float]]:
    keys = list(runners)
    per_round: dict[str, list[float]] = {key: [] for key in keys}
    for rnd in range(rounds):
        shift = rnd % len(keys)
        for key in keys[shift:] + keys[:shift]:
            per_round[key].append(roundtrip.timed(runners[key], outers[key]) / ops[key])
        progress.step(f"{label}, round {rnd + 1}/{rounds}", step_ms)
    return per_round


def plan(cfg: Config) -> float:
    s = SETTINGS[cfg.mode]
    return s["target_ms"] * (s["rounds"] + 3) * (len(SIZES) * 6 + len(DEPTHS))


def run(cfg: Config, progress: Progress) -> dict:
    import arenalib

    s = SETTINGS[cfg.mode]
    target_ns = s["target_ms"] * 1e6
    arena = arenalib.SlicingArena()
    floor = floor_module()
    try:
        sizes = {}
        for n in SIZES:
            cands = candidates(arena, floor)
            runners = {c.key: roundtrip.make_runner(c, n, c.setup(n)) for c in cands}
            for run_ in runners.values():
                run_(3)
            outers = {key: roundtrip.calibrate(r, n, target_ns) for key, r in runners.items()}
            ops = {key: outers[key] * roundtrip.inner_count(n) for key in runners}
            per_round = _rounds(runners, outers, ops, s["rounds"], progress, f"frames {fmt_size(n)}",
                                s["target_ms"] * len(runners))
            sizes[str(n)] = {
                "cells": {key: {"ns_per_op": summarize(v), "per_round_ns": [round(x, 2) for x in v]}
                          for key, v in per_round.items()},
                "ratios": {key: same_round_ratio(v, per_round[BASELINE])
                           for key, v in per_round.items() if key != BASELINE},
                "over_floor": {key: same_round_ratio(per_round[key], per_round[FLOOR])
                               for key in FRAMES if FLOOR in per_round},
            }
        depth = _depth_run(arena, s, target_ns, progress)
    finally:
        arena.close()
        arenalib.frame_arena().close()
    return {"sizes": sizes, "depth": depth, "rounds": s["rounds"],
            "candidates": {c.key: {"label": c.label, "op": c.op, "family": c.family}
                           for c in candidates(None, floor)}}


def _depth_run(arena, s: dict, target_ns: float, progress: Progress) -> dict:
    """ns per empty frame (push + pop) with depth - 1 frames open below it."""
    cand = roundtrip.Candidate("depth", "with a.frame(): pass", "arenalib", "with fa(): pass",
                               lambda n: {"fa": arena.frame})
    runner = roundtrip.make_runner(cand, 512, cand.setup(512))
    ops_per_outer = roundtrip.inner_count(512)

    def at_depth(depth: int, measure):
        below = [arena.frame() for _ in range(depth - 1)]
        for f in below:
            f.__enter__()
        try:
            return measure()
        finally:
            for f in reversed(below):
                f.__exit__(None, None, None)

    runner(3)
    outers = {d: at_depth(d, lambda: roundtrip.calibrate(runner, 512, target_ns)) for d in DEPTHS}
    per_round: dict[str, list[float]] = {str(d): [] for d in DEPTHS}
    for rnd in range(s["rounds"]):
        for d in DEPTHS:
            ns = at_depth(d, lambda outer=outers[d]: roundtrip.timed(runner, outer))
            per_round[str(d)].append(ns / (outers[d] * ops_per_outer))
        progress.step(f"frames: depth, round {rnd + 1}/{s['rounds']}", s["target_ms"] * len(DEPTHS))
    return {"cells": {d: summarize(v) for d, v in per_round.items()},
            "flatness": same_round_ratio(per_round[str(DEPTHS[-1])], per_round[str(DEPTHS[0])])}


def targets(results: dict) -> list[dict]:
    labels = {key: c["label"] for key, c in results["candidates"].items()}
    at = results["sizes"].get("512", {}).get("ratios", {})
    checks = [
        ratio_item("`with arenalib.frame() as f: f.allocate(512, zero=False).fill(3)` <= 1.0x "
                   "bytearray(512)+fill (issue 26)", "frame", labels["frame"], 512, BASELINE,
                   labels[BASELINE], 1.0, at.get("frame")),
        ratio_item("`with arena.frame():` around one allocate+fill on a long-lived SlicingArena <= 0.9x "
                   "bytearray(512)+fill (issue 26)", "SlicingArena.frame", labels["SlicingArena.frame"],
                   512, BASELINE, labels[BASELINE], 0.9, at.get("SlicingArena.frame")),
    ]
    floor = at.get(FLOOR)
    for check in checks:  # the floor: what CPython alone charges for the same statement
        check["floor_ratio"] = floor["median"] if floor else None
    flat = results["depth"]["flatness"]
    checks.append(ratio_item(f"an empty frame at depth {DEPTHS[-1]} costs <= {FLAT_LIMIT}x one at depth 1 "
                             "(O(1) push and pop, issue 26)", "depth", f"depth {DEPTHS[-1]}", 0,
                             "depth 1", "depth 1", FLAT_LIMIT, flat))
    return checks


def target_line(check: dict) -> str:
    if check["ratio"] is None:
        return f"{check['status']:6s} not measured"
    size = f" at {fmt_size(check['size'])}" if check["size"] else ""
    border = " (borderline)" if check.get("borderline") else ""
    floor = (f"; the floor: {check['floor_ratio']:.2f}x"
             if check.get("floor_ratio") is not None else "")
    return (f"{check['status']:6s} {check['label']}{size}: {check['ratio']:.2f}x {check['versus_label']} "
            f"(limit {check['limit']}){border}{floor}")


def tables(results: dict, markdown: bool = False) -> str:
    keys = list(results["candidates"])
    labels = [results["candidates"][k]["label"] for k in keys]
    rows = []
    for n, cell in results["sizes"].items():
        row = [fmt_size(int(n))]
        for key in keys:
            ns = fmt_ns(cell["cells"][key]["ns_per_op"]["median"])
            row.append(ns if key == BASELINE else f"{ns} ({cell['ratios'][key]['median']:.2f}x)")
        rows.append(row)
    quote = "`" if markdown else ""
    h = "### " if markdown else ""
    out = [f"{h}A frame per op: ns per op (ratio to bytearray(n)+fill in the same round, median of "
           f"{results['rounds']} rounds)",
           table(["size", *labels], rows, markdown), "", "Statements, per op:",
           *[f"{'- ' if markdown else '  '}{c['label']}: {quote}{c['op']}{quote}"
             for c in results["candidates"].values()], ""]
    out += [crossover_line(results), ""]
    over = next(iter(results["sizes"].values())).get("over_floor", {})
    if over:
        out += [f"{h}arenalib's frames against the floor (no-op C objects: what CPython alone charges), "
                "same round",
                table(["size", *[results["candidates"][k]["label"] for k in over]],
                      [[fmt_size(int(n)), *[f"{cell['over_floor'][k]['median']:.2f}x" for k in over]]
                       for n, cell in results["sizes"].items()], markdown), ""]
    depth = results["depth"]
    out += [f"{h}An empty frame (`with a.frame(): pass`) with depth - 1 frames open below it",
            table(["depth", "ns per frame"],
                  [[d, fmt_ns(c["median"])] for d, c in depth["cells"].items()], markdown),
            "", f"Depth {DEPTHS[-1]} against depth 1, same round: {depth['flatness']['median']:.2f}x"]
    return "\n".join(out)


def crossover_line(results: dict) -> str:
    """Where each frame statement starts to cost at most what bytearray(n)+fill costs, for good."""
    sizes = sorted(int(n) for n in results["sizes"])
    parts = []
    for key in FRAMES:
        ratios = [results["sizes"][str(n)]["ratios"][key]["median"] for n in sizes]
        from_ = next((n for i, n in enumerate(sizes) if all(r <= 1.0 for r in ratios[i:])), None)
        label = results["candidates"][key]["label"]
        parts.append(f"{label} from {fmt_size(from_)} up" if from_ is not None
                     else f"{label} at no size measured")
    return "At most bytearray(n)+fill's time: " + "; ".join(parts) + "."


def plots(results: dict, out, plt) -> list[str]:
    from _plot import frames_plots  # the plot is drawn in bench/_plot.py
    return frames_plots(results, out, plt)


if __name__ == "__main__":
    run_standalone(__import__(__name__))
