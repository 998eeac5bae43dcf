"""Experiment 9, the Panama-style helpers (issue 27), each against its fastest Python equivalent.

What it measures, in experiment 1's loop (bench/roundtrip.py: every name a local, min(256, 1 MiB / n)
ops per inner batch, the garbage collector off), per op at 64 B, 4 KiB and 64 KiB, one pair per helper:

* ``af(b)`` (``af = arena.allocate_from``) against ``ba(b)`` (``ba = bytearray``), ``b`` a bytes of n;
* ``cp(src, 0, seg, 0, n)`` (``cp = arenalib.copy``) against ``mv[0:n] = src``, ``mv`` a memoryview of
  the same segment (memoryview slice assignment, the cheapest copy into a buffer at an offset);
* ``mm(other)`` (``mm = seg.mismatch``) and ``seg == other`` (equal contents, so the whole of both is
  compared) against ``a == b``, two distinct bytes objects of equal contents; in each pair the two
  buffers lie alike in a 64-byte line (_bytes_placed): past ~512 B memcmp's time depends on that
  (glibc's, here: 1000 B 9.6 ns alike, 11.9 ns 16 bytes apart; 4 KiB 37 against 47), and malloc
  placed the peer's bytes differently from run to run (``==`` at 1000 B: 1.17x in one run, 1.23x in
  the next, the same code);
* ``hx()`` (``hx = seg.hex``) against ``bh()`` (``bh = b.hex``);
* ``st(s)`` (``st = arena.allocate_string``, NUL included) against ``s.encode()``, ``s`` an ASCII str;
* ``al(n)`` (``al = arenalib.allocate``: a zeroed automatic segment, freed as it is dropped) against
  ``ba(n)`` (``bytearray(n)``, zeroed, dropped): what a segment without a scope costs (reported, no
  target of issue 27's).
* two rows beside ``==``, reported with no target: CPython's own ``bytearray == bytes`` against the same
  ``a == b`` (what any operand that is not an exact bytes costs the comparison: CPython special-cases
  two bytes objects), and ``seg == seg2`` (the other operand a segment, which is exported to compare).

``seg.resize(n)`` in place (issue 27's target: <= 1.5x one allocate) is measured at more sizes, the
cache's size classes and jemalloc's large extents (RESIZE_SIZES): ``h[0] = h[0].resize(m)`` then
back to ``n``, ``m`` the smallest size of n's 16-byte step (both in place: one size class), against
``al(m).free()`` then ``al(n).free()`` of another ConfinedArena (``al = arena.allocate``; zero=False
for both): one allocation's cost in a steady state, where the block freed is the next one's (a reset
per batch instead would charge the large sizes a jemalloc arena reset per call).  ns per pair.

The allocating helpers allocate from a SlicingArena reset after every inner batch (its cheapest use:
the carve reuses the same chunk, each Segment object is dropped at once, as the bytearray or bytes of
the peer is); the others work on one long-lived ConfinedArena segment.  Candidates interleave over
rounds (the starting one rotating); each ratio is the median of same-round ratios of a helper to
its own peer.  The target of issue 27: each helper <= 1.2x its peer.
"""

from __future__ import annotations

import sys

import roundtrip
from _common import Config, Progress, fmt_ns, fmt_size, run_standalone, same_round_ratio, summarize, table
from _experiment import ratio_item

TITLE = "9. Panama-style helpers against their Python equivalents (issue 27)"
# From where the Python peer is one cheap C call (64 B) to past the CPU caches, non-powers of two among them.
SIZES = [64, 200, 1000, 4096, 24_000, 65536, 1_000_000]
SETTINGS = {"quick": {"rounds": 7, "target_ms": 8.0}, "full": {"rounds": 21, "target_ms": 30.0}}
LIMIT = 1.2
RESIZE_SIZES = [64, 200, 1000, 3000, 4096, 24_000, 65536, 100_000, 1_000_000, 3_000_000]
RESIZE_LIMIT = 1.5
RESIZE_PAIR = ("seg.resize(n) in place", "arena.allocate(n).free()")
# helper key -> (its label, its peer's key): the targets, and the pairs only reported
# (CPython's own bytearray == bytes shows what a non-bytes operand costs the comparison that the
# peer, two exact bytes objects, skips; seg == seg2 compares with a segment, which is exported.)
INFO_PAIRS = {"auto": ("arenalib.allocate(n)", "bytearray(n)"),
              "bytearray_equals": ("bytearray == bytes (CPython)", "bytes =="),
              "equals_segment": ("seg == seg2", "bytes ==")}
PAIRS = {
    "allocate_from": ("arena.allocate_from(b)", "bytearray(b)"),
    "copy": ("arenalib.copy(src, 0, seg, 0, n)", "mv[0:n] = src"),
    "mismatch": ("seg.mismatch(other)", "bytes =="),
    "equals": ("seg == other", "bytes =="),
    "hex": ("seg.hex()", "bytes.hex()"),
    "allocate_string": ("arena.allocate_string(s)", "s.encode()"),
}


# Where a bytes object's data begins in it (its header before ob_sval; CPython 3.10-3.13).
_BYTES_DATA = sys.getsizeof(b"") - 1


def _bytes_placed(n: int, like: int) -> bytes:
    """n bytes of 0x5a whose data lies where the address ``like`` does in a 64-byte line (both
    16-byte aligned, as malloc's, pymalloc's and jemalloc's blocks here are), or the last of 256
    tries if none does."""
    tried = []  # kept alive meanwhile: each try lands somewhere new
    for _ in range(256):
        b = bytes(bytearray(b"\x5a" * n))
        if (id(b) + _BYTES_DATA - like) % 64 == 0:
            return b
        tried.append(b)
    return tried[-1]


def candidates(slicing, confined) -> list[roundtrip.Candidate]:
    import arenalib

    def segment(n):
        seg = confined.allocate(n, zero=False)
        seg[:] = b"\x5a" * n
        return seg

    def compared(n, name, use):
        """The names of a comparison of a segment with a bytes placed alike (_bytes_placed)."""
        seg = segment(n)
        return {name: use(seg), "other": _bytes_placed(n, seg.address)}

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
                            lambda n: compared(n, "mm", lambda seg: seg.mismatch)),
        roundtrip.Candidate("equals", PAIRS["equals"][0], "arenalib", "seg == other",
                            lambda n: compared(n, "seg", lambda seg: seg)),
        roundtrip.Candidate("bytes ==", "bytes ==", "peer", "a == b",
                            lambda n: (lambda a: {"a": a, "b": _bytes_placed(n, id(a) + _BYTES_DATA)})(
                                b"\x5a" * n)),
        roundtrip.Candidate("bytearray_equals", INFO_PAIRS["bytearray_equals"][0], "reference", "a == b",
                            lambda n: {"a": bytearray(b"\x5a" * n), "b": b"\x5a" * n}),
        roundtrip.Candidate("equals_segment", INFO_PAIRS["equals_segment"][0], "arenalib", "seg == seg2",
                            lambda n: {"seg": segment(n), "seg2": segment(n)}),
        roundtrip.Candidate("hex", PAIRS["hex"][0], "arenalib", "hx()",
                            lambda n: {"hx": segment(n).hex}),
        roundtrip.Candidate("bytes.hex()", "bytes.hex()", "peer", "bh()",
                            lambda n: {"bh": (b"\x5a" * n).hex}),
        roundtrip.Candidate("allocate_string", PAIRS["allocate_string"][0], "arenalib", "st(s)",
                            lambda n: {"st": slicing.allocate_string, "s": "z" * n,
                                       "reset": slicing.reset}, batch=reset),
        roundtrip.Candidate("s.encode()", "s.encode()", "peer", "s.encode()",
                            lambda n: {"s": "z" * n}),
        roundtrip.Candidate("auto", INFO_PAIRS["auto"][0], "arenalib", "al(n)",
                            lambda n: {"al": arenalib.allocate, "n": n}),
        roundtrip.Candidate("bytearray(n)", "bytearray(n)", "peer", "ba(n)",
                            lambda n: {"ba": bytearray, "n": n}),
    ]


def _step_start(n: int) -> int:
    return n - (n - 1) % 16


def resize_candidates(resizing, allocating) -> list[roundtrip.Candidate]:
    return [
        roundtrip.Candidate("resize", RESIZE_PAIR[0], "arenalib",
                            "h[0] = h[0].resize(m, zero=False); h[0] = h[0].resize(n, zero=False)",
                            lambda n: {"h": [resizing.allocate(n, zero=False)], "m": _step_start(n), "n": n}),
        roundtrip.Candidate("allocate", RESIZE_PAIR[1], "arenalib",
                            "al(m, zero=False).free(); al(n, zero=False).free()",
                            lambda n: {"al": allocating.allocate, "m": _step_start(n), "n": n}),
    ]


def plan(cfg: Config) -> float:
    s = SETTINGS[cfg.mode]
    return s["target_ms"] * (s["rounds"] + 3) * (len(SIZES) * 13 + len(RESIZE_SIZES) * 2)


def _measure(cands, n: int, s: dict, progress: Progress, what: str) -> dict[str, list[float]]:
    """ns per op of each candidate at size n, per round (the starting one rotating)."""
    target_ns = s["target_ms"] * 1e6
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
        progress.step(f"{what} {fmt_size(n)}, round {rnd + 1}/{s['rounds']}", s["target_ms"] * len(keys))
    for c in cands:
        if c.teardown is not None:
            c.teardown(envs[c.key])
    return per_round


def run(cfg: Config, progress: Progress) -> dict:
    import arenalib

    s = SETTINGS[cfg.mode]
    slicing = arenalib.SlicingArena()
    confined = arenalib.ConfinedArena()
    allocating = arenalib.ConfinedArena()
    sizes, resize = {}, {}
    try:
        for n in SIZES:
            per_round = _measure(candidates(slicing, confined), n, s, progress, "helpers")
            slicing.reset()
            sizes[str(n)] = {
                "cells": {key: {"ns_per_op": summarize(v)} for key, v in per_round.items()},
                "ratios": {key: same_round_ratio(per_round[key], per_round[peer])
                           for key, (_, peer) in (PAIRS | INFO_PAIRS).items()},
            }
        for n in RESIZE_SIZES:
            per_round = _measure(resize_candidates(confined, allocating), n, s, progress, "resize")
            resize[str(n)] = {key: {"ns_per_op": summarize(v)} for key, v in per_round.items()}
            resize[str(n)]["ratio"] = same_round_ratio(per_round["resize"], per_round["allocate"])
    finally:
        slicing.close()
        confined.close()
        allocating.close()
    return {"sizes": sizes, "rounds": s["rounds"], "pairs": {k: list(v) for k, v in PAIRS.items()},
            "info_pairs": {k: list(v) for k, v in INFO_PAIRS.items()}, "resize": resize}


def targets(results: dict) -> list[dict]:
    checks = []
    for key, (label, peer) in results["pairs"].items():
        for n, cell in results["sizes"].items():
            checks.append(ratio_item(f"each helper <= {LIMIT}x its fastest Python equivalent (issue 27)",
                                     key, label, int(n), peer, peer, LIMIT, cell["ratios"].get(key)))
    for n, cell in results.get("resize", {}).items():
        checks.append(ratio_item(f"resize in place <= {RESIZE_LIMIT}x one allocate (issue 27)", "resize",
                                 RESIZE_PAIR[0], int(n), "allocate", RESIZE_PAIR[1], RESIZE_LIMIT,
                                 cell["ratio"]))
    return checks


def target_line(check: dict) -> str:
    if check["ratio"] is None:
        return f"{check['status']:6s} not measured"
    border = " (borderline)" if check.get("borderline") else ""
    return (f"{check['status']:6s} {check['label']} at {fmt_size(check['size'])}: {check['ratio']:.2f}x "
            f"{check['versus_label']} (limit {check['limit']}){border}")


def tables(results: dict, markdown: bool = False) -> str:
    rows = []
    for key, (label, peer) in (results["pairs"] | results.get("info_pairs", {})).items():
        for n, cell in results["sizes"].items():
            r = cell["ratios"][key]
            rows.append([label, fmt_size(int(n)), fmt_ns(cell["cells"][key]["ns_per_op"]["median"]),
                         peer, fmt_ns(cell["cells"][peer]["ns_per_op"]["median"]),
                         f"{r['median']:.2f}x ({r['q1']:.2f}-{r['q3']:.2f})"])
    h = "### " if markdown else ""
    parts = [f"{h}Helpers against their peers: ns per op, ratio (median of {results['rounds']} "
             "same-round ratios, quartiles)",
             table(["helper", "size", "ns", "peer", "peer ns", "ratio"], rows, markdown)]
    resize = results.get("resize")
    if resize:
        rows = [[fmt_size(int(n)), fmt_ns(c["resize"]["ns_per_op"]["median"]),
                 fmt_ns(c["allocate"]["ns_per_op"]["median"]),
                 f"{c['ratio']['median']:.2f}x ({c['ratio']['q1']:.2f}-{c['ratio']['q3']:.2f})"]
                for n, c in resize.items()]
        parts += ["", f"{h}seg.resize(n) in place against a ConfinedArena's allocate + free: ns per pair",
                  table(["size", "resize ns", "allocate ns", "ratio"], rows, markdown)]
    return "\n".join(parts)


def plots(results: dict, out, plt) -> list[str]:
    """Each helper's time over its Python equivalent's, grouped by size; resize in place over allocate."""
    from _plot import bars, lines

    pairs = results["pairs"] | results.get("info_pairs", {})
    sizes = list(results["sizes"])
    values = {f"{label} / {peer}": [results["sizes"][n]["ratios"][key]["median"] for n in sizes]
              for key, (label, peer) in pairs.items()}
    written = bars(plt, out, "helpers_ratio.png", [fmt_size(int(n)) for n in sizes], values, line=LIMIT,
                   ylabel="time / the Python equivalent's (median of same-round ratios)",
                   title=f"Panama-style helpers against their Python equivalents (lower is faster; "
                         f"the line: the {LIMIT}x target)")
    resize = results.get("resize")
    if resize:
        xs = [int(n) for n in resize]
        series = {" over ".join(RESIZE_PAIR): ("arenalib", [c["ratio"]["median"] for c in resize.values()])}
        written += lines(plt, out, "helpers_resize.png", xs, series, logx=True, hline=1.0,
                         ylabel="time / allocate + free's (median of same-round ratios)",
                         title="seg.resize(n) in place against a fresh allocate + free, by size "
                               "(lower is faster)")
    return written

if __name__ == "__main__":
    run_standalone(__import__(__name__))
