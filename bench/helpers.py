"""Experiment 9, the Panama-style helpers (issue 27), each against its fastest Python equivalent.

What it measures, in experiment 1's loop (bench/roundtrip.py: every name a local, min(256, 1 MiB / n)
ops per inner batch, the garbage collector off), per op at 64 B, 4 KiB and 64 KiB, one pair per helper:

* ``af(b)`` (``af = arena.allocate_from``) against ``ba(b)`` (``ba = bytearray``), ``b`` a bytes of n;
* ``cp(src, 0, seg, 0, n)`` (``cp = arenalib.copy``) against ``mv[0:n] = src``, ``mv`` a memoryview of
  the same segment (memoryview slice assignment, the cheapest copy into a buffer at an offset);
* ``mm(other)`` (``mm = seg.mismatch``) and ``seg == other`` (equal contents, so the whole of both is
  compared) against ``a == b``, two distinct bytes objects of equal contents;
* ``hx()`` (``hx = seg.hex``) against ``bh()`` (``bh = b.hex``);
* ``st(s)`` (``st = arena.allocate_string``, NUL included) against ``s.encode()``, ``s`` an ASCII str.

The allocating helpers allocate from a SlicingArena reset after every inner batch (its cheapest use:
the carve reuses the same chunk, each Segment object is dropped at once, as the bytearray or bytes of
the peer is); the others work on one long-lived ConfinedArena segment.  Candidates interleave over
rounds (the starting one rotating); each ratio is the median of same-round ratios of a helper to
its own peer.  The target of issue 27: each helper <= 1.2x its peer.
"""

from __future__ import annotations

import roundtrip
from _common import Config, Progress, fmt_ns, fmt_size, run_standalone, same_round_ratio, summarize, table
from _experiment import no_plots, ratio_item

TITLE = "9. Panama-style helpers against their Python equivalents (issue 27)"
SIZES = [64, 4096, 65536]
SETTINGS = {"quick": {"rounds": 7, "target_ms": 8.0}, "full": {"rounds": 21, "target_ms": 30.0}}
LIMIT = 1.2
# helper key -> (its label, its peer's key)
PAIRS = {
    "allocate_from": ("arena.allocate_from(b)", "bytearray(b)"),
    "copy": ("arenalib.copy(src, 0, seg, 0, n)", "mv[0:n] = src"),
    "mismatch": ("seg.mismatch(other)", "bytes =="),
    "equals": ("seg == other", "bytes =="),
    "hex": ("seg.hex()", "bytes.hex()"),
    "allocate_string": ("arena.allocate_string(s)", "s.encode()"),
}


def candidates(slicing, confined) -> list[roundtrip.Candidate]:
    import arenalib

    def segment(n):
        seg = confined.allocate(n, zero=False)
        seg[:] = b"\x5a" * n
        return seg

    reset = "reset()"
    return [
        roundtrip.Candidate("allocate_from", PAIRS["allocate_from"][0], "arenalib", "af(b)",
                            lambda n: {"af": slicing.allocate_from, "b": b"\x5a" * n,
                                       "reset": slicing.reset}, batch=reset),
        roundtrip.Candidate("bytearray(b)", "bytearray(b)", "peer", "ba(b)",
                            lambda n: {"ba": bytearray, "b": b"\x5a" * n}),
        roundtrip.Candidate("copy", PAIRS["copy"][0], "arenalib", "cp(src, 0, seg, 0, n)",
                            lambda n: {"cp": arenalib.copy, "src": b"\x33" * n, "seg": segment(n), "n": n}),
        roundtrip.Candidate("mv[0:n] = src", "mv[0:n] = src", "peer", "mv[0:n] = src",
                            lambda n: {"mv": memoryview(segment(n)), "src": b"\x33" * n, "n": n},
                            teardown=lambda env: env["mv"].release()),
        roundtrip.Candidate("mismatch", PAIRS["mismatch"][0], "arenalib", "mm(other)",
                            lambda n: {"mm": segment(n).mismatch, "other": b"\x5a" * n}),
        roundtrip.Candidate("equals", PAIRS["equals"][0], "arenalib", "seg == other",
                            lambda n: {"seg": segment(n), "other": b"\x5a" * n}),
        roundtrip.Candidate("bytes ==", "bytes ==", "peer", "a == b",
                            lambda n: {"a": b"\x5a" * n, "b": bytes(bytearray(b"\x5a" * n))}),
        roundtrip.Candidate("hex", PAIRS["hex"][0], "arenalib", "hx()",
                            lambda n: {"hx": segment(n).hex}),
        roundtrip.Candidate("bytes.hex()", "bytes.hex()", "peer", "bh()",
                            lambda n: {"bh": (b"\x5a" * n).hex}),
        roundtrip.Candidate("allocate_string", PAIRS["allocate_string"][0], "arenalib", "st(s)",
                            lambda n: {"st": slicing.allocate_string, "s": "z" * n,
                                       "reset": slicing.reset}, batch=reset),
        roundtrip.Candidate("s.encode()", "s.encode()", "peer", "s.encode()",
                            lambda n: {"s": "z" * n}),
    ]


def plan(cfg: Config) -> float:
    s = SETTINGS[cfg.mode]
    return s["target_ms"] * (s["rounds"] + 3) * len(SIZES) * 11


def run(cfg: Config, progress: Progress) -> dict:
    import arenalib

    s = SETTINGS[cfg.mode]
    target_ns = s["target_ms"] * 1e6
    slicing = arenalib.SlicingArena()
    confined = arenalib.ConfinedArena()
    sizes = {}
    try:
        for n in SIZES:
            cands = candidates(slicing, confined)
            envs = {c.key: c.setup(n) for c in cands}
            runners = {c.key: roundtrip.make_runner(c, n, envs[c.key]) for c in cands}
            for run_ in runners.values():
                run_(3)
            outers = {key: roundtrip.calibrate(r, n, target_ns) for key, r in runners.items()}
            ops = {key: outers[key] * roundtrip.inner_count(n) for key in runners}
            keys = list(runners)
            per_round: dict[str, list[float]] = {key: [] for key in keys}
            for rnd in range(s["rounds"]):
                shift = rnd % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    per_round[key].append(roundtrip.timed(runners[key], outers[key]) / ops[key])
                progress.step(f"helpers {fmt_size(n)}, round {rnd + 1}/{s['rounds']}",
                              s["target_ms"] * len(keys))
            for c in cands:
                if c.teardown is not None:
                    c.teardown(envs[c.key])
            slicing.reset()
            sizes[str(n)] = {
                "cells": {key: {"ns_per_op": summarize(v)} for key, v in per_round.items()},
                "ratios": {key: same_round_ratio(per_round[key], per_round[peer])
                           for key, (_, peer) in PAIRS.items()},
            }
    finally:
        slicing.close()
        confined.close()
    return {"sizes": sizes, "rounds": s["rounds"], "pairs": {k: list(v) for k, v in PAIRS.items()}}


def targets(results: dict) -> list[dict]:
    checks = []
    for key, (label, peer) in results["pairs"].items():
        for n, cell in results["sizes"].items():
            checks.append(ratio_item(f"each helper <= {LIMIT}x its fastest Python equivalent (issue 27)",
                                     key, label, int(n), peer, peer, LIMIT, cell["ratios"].get(key)))
    return checks


def target_line(check: dict) -> str:
    if check["ratio"] is None:
        return f"{check['status']:6s} not measured"
    border = " (borderline)" if check.get("borderline") else ""
    return (f"{check['status']:6s} {check['label']} at {fmt_size(check['size'])}: {check['ratio']:.2f}x "
            f"{check['versus_label']} (limit {check['limit']}){border}")


def tables(results: dict, markdown: bool = False) -> str:
    rows = []
    for key, (label, peer) in results["pairs"].items():
        for n, cell in results["sizes"].items():
            r = cell["ratios"][key]
            rows.append([label, fmt_size(int(n)), fmt_ns(cell["cells"][key]["ns_per_op"]["median"]),
                         peer, fmt_ns(cell["cells"][peer]["ns_per_op"]["median"]),
                         f"{r['median']:.2f}x ({r['q1']:.2f}-{r['q3']:.2f})"])
    h = "### " if markdown else ""
    return "\n".join([f"{h}Helpers against their peers: ns per op, ratio (median of {results['rounds']} "
                      "same-round ratios, quartiles)",
                      table(["helper", "size", "ns", "peer", "peer ns", "ratio"], rows, markdown)])


plots = no_plots

if __name__ == "__main__":
    run_standalone(__import__(__name__))
