"""The second table of bench/scopes.py (experiment 5): the per-scope cost of its smallest scope,
``with ConfinedArena() as a: a.allocate(512, zero=False).fill(3)`` per op, against
``bytearray(512)[:] = pattern``, in experiment 1's loop (bench/roundtrip.py's, its inner batch of 256
ops).  scopes.py runs it after its sweep and reports it under the sweep's table."""

from __future__ import annotations

from collections.abc import Callable

import roundtrip
from _common import BASELINE, Progress, fmt_ns, fmt_size, same_round_ratio, summarize, table
from _experiment import ratio_item

PER_SCOPE_SIZE = 512       # one block per scope
PER_SCOPE_MIN_ROUNDS = 5


def candidates() -> list[roundtrip.Candidate]:
    """The second table: experiment 1's bytearray and its per-scope ConfinedArena statement."""
    import arenalib

    return [
        roundtrip.Candidate(BASELINE, "bytearray(n)+fill", "peer", "ba(n)[:] = pattern",
                            lambda n: {"ba": bytearray, "pattern": bytearray(b"\x03") * n, "n": n}),
        roundtrip.Candidate("ConfinedArena", "with ConfinedArena() per op", "arenalib",
                            "with CA() as a: a.allocate(n, zero=False).fill(3)",
                            lambda n: {"CA": arenalib.ConfinedArena, "n": n},
                            note="a fresh arena per operation, closed at the end of the with-block"),
    ]


def run(rounds: int, target_ns: float, progress: Progress, warmup: int,
        measure: Callable[[Callable[[int], None], int], tuple[int, int]]) -> dict:
    """The second table: ``with ConfinedArena() as a: a.allocate(512, zero=False).fill(3)`` per op
    against ``bytearray(512)[:] = pattern``, in experiment 1's loop (its inner batch of 256 ops)."""
    n = PER_SCOPE_SIZE
    cands = candidates()
    keys = [c.key for c in cands]
    progress.set_label(f"scopes: per-scope {n} B, warm-up and calibrating")
    runners = {}
    for c in cands:
        runners[c.key] = roundtrip.make_runner(c, n, c.setup(n))
        runners[c.key](warmup)
    outers = {key: roundtrip.calibrate(runners[key], n, target_ns) for key in keys}
    progress.step(None, 2 * target_ns / 1e6 * 4)
    ops = {key: outers[key] * roundtrip.inner_count(n) for key in keys}
    per_round: dict[str, list[float]] = {key: [] for key in keys}
    faults: dict[str, list[float]] = {key: [] for key in keys}
    for rnd in range(rounds):
        shift = rnd % len(keys)
        for key in keys[shift:] + keys[:shift]:
            ns, flt = measure(runners[key], outers[key])
            per_round[key].append(ns / ops[key])
            faults[key].append(flt / ops[key])
        progress.step(f"scopes: per-scope {n} B, round {rnd + 1}/{rounds}", 2 * target_ns / 1e6)
    return {
        "size": n, "rounds": rounds,
        "candidates": {c.key: {"label": c.label, "op": c.op} for c in cands},
        "cells": {key: {"ns_per_op": summarize(per_round[key]),
                        "faults_per_op": summarize(faults[key]),
                        "per_round_ns": [round(x, 2) for x in per_round[key]],
                        "ops_per_measurement": ops[key]} for key in keys},
        "ratio_to_baseline": same_round_ratio(per_round["ConfinedArena"], per_round[BASELINE]),
        "per_round_ratios": [round(a / b, 3) for a, b in
                             zip(per_round["ConfinedArena"], per_round[BASELINE], strict=True)],
    }


def ratio(results: dict) -> dict | None:
    """Median of same-round ratios of the per-scope ConfinedArena to bytearray (the second table)."""
    cells = results.get("per_scope", {}).get("cells", {})
    if "ConfinedArena" not in cells or BASELINE not in cells:
        return None
    return same_round_ratio(cells["ConfinedArena"]["per_round_ns"], cells[BASELINE]["per_round_ns"])


def target(sc: dict) -> dict:
    """Issue 14's per-scope target on scopes.py's results: at most 2x bytearray."""
    per = sc.get("per_scope", {}).get("candidates", {})
    base = sc["candidates"].get(BASELINE, {}).get("label", BASELINE)
    return ratio_item(
        f"per-scope `with ConfinedArena() as a: a.allocate({PER_SCOPE_SIZE}, "
        f"zero=False).fill(3)` vs bytearray({PER_SCOPE_SIZE})+fill", "ConfinedArena",
        per.get("ConfinedArena", {}).get("label", "ConfinedArena"), PER_SCOPE_SIZE, BASELINE, base,
        2.0, ratio(sc))


def table_lines(per: dict, markdown: bool = False) -> list[str]:
    """The table of run()'s result, its statements and its same-round ratios."""
    h = "### " if markdown else ""
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
    return [f"{h}Per scope at {fmt_size(n)}: a fresh ConfinedArena per op (one {n} B block) against "
            f"bytearray({n})+fill, in experiment 1's loop; ratio = median of same-round ratios",
            table(["candidate", "ns/op", "ratio", "min", "max", "faults/op"], rows, markdown), "",
            f"Statements (n = {n}): " + "; ".join(
                f"{c['label']}: {quote}{c['op']}{quote}" for c in per["candidates"].values()) + ".",
            *([""] if markdown else []),
            f"Same-round ratios, all {per['rounds']} rounds: "
            + " ".join(f"{x:.2f}" for x in per["per_round_ratios"])]
