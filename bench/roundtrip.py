"""Experiment 1, the allocation round trip (the panama-dev benchmark) at Python level.

What it measures: the cost of one operation "allocate n bytes, fill them with byte 3, free them", for
n in 8, 512, 1024, 4096, 65536 and 1 MiB, for arenalib and for what a user would pick instead.  It
reports ns/op, ops/ms (JMH's unit) and the ratio to bytearray's round trip.

How:
* Every candidate is one statement (``op``) put into the same generated loop,

      def run(outer, _inner=range(k), <every name the op uses, bound as a local>):
          for _ in range(outer):
              for _ in _inner:
                  <op>
              <batch>          # "pass", except SlicingArena's reset()

  so callables are local variables for every candidate alike and the loop overhead (also measured,
  as "(empty loop)") is the same for all.  k = min(256, 1 MiB // n), at least 1, for every candidate
  at a given size; it is also SlicingArena's reset period.
* ``outer`` is calibrated per candidate so one measurement takes about ``target_ms`` (25 ms in full
  mode, 6 ms in quick mode).  The garbage collector is disabled during every measurement.
* Rounds interleave the candidates (A B C ... A B C ..., the starting candidate rotating by one each
  round); one warm-up round is discarded.  Each round gives every candidate's ns/op and its ratio to
  bytearray measured in that same round; the report gives the median ns/op and the median of the
  same-round ratios (less sensitive to drifts of the machine than a ratio of medians).

Peers and why each statement is written as it is:
* bytearray: ``bytearray(n)[:] = pattern`` with ``pattern`` a prebuilt bytearray of n bytes 3.  Of the
  ways to fill a new bytearray(n) this is the cheapest (slice assignment from a bytes object copies
  it to a temporary bytearray first: ~2x slower; ``memoryview(b)[:] = ...`` adds a view: ~2x; a loop
  or ctypes.memset is far slower).  bytearray(n) zeroes, then the assignment is a memcpy.  This is the
  peer the issue's figures were measured with (62/70/72/168/1193/31428 ns) and its targets refer to.
* bytearray*n: ``bytearray(b"\\x03") * n``: CPython repeats a one-byte bytearray with a memset, so this
  is malloc + memset + free, exactly the work of arenalib's zero=False + fill + free, and the cheapest
  way to get a bytearray of n bytes 3 in pure Python.  Reported as the strict reading of "bytearray with
  the cheapest fill"; the target checklist shows the ratios to it too.
* numpy.empty+fill: ``empty(n, uint8).fill(3)``; numpy.zeros: ``zeros(n, uint8)`` (no fill: the peer
  of arenalib's zero=True).
* pyarrow allocate_buffer on the jemalloc, mimalloc and system pools:
  ``frombuffer(allocate_buffer(n, memory_pool=pool), uint8).fill(3)``.  A pyarrow Buffer has no fill of
  its own; a NumPy view is the cheapest way to memset it from Python (``memoryview(buf)[:] = ...``
  needs a cast of its signed-byte format first).  Dropping the array frees the buffer.  A pool that
  this pyarrow build lacks is skipped with a note.
* ctypes: ``memset(create_string_buffer(n), 3, n)`` (create_string_buffer zeroes; ctypes.memset is a
  foreign call).
* arenalib: ``alloc(n, zero=False).fill(3).free()`` for Arena and ConfinedArena (``alloc`` is the
  arena's bound allocate), ``alloc(n).free()`` for zero=True (the default), SlicingArena
  ``alloc(n, zero=False).fill(3)`` with reset() after every k allocations, and the per-scope pattern
  ``with ConfinedArena() as a: a.allocate(n, zero=False).fill(3)``.  Segment.fill is a memset.
  One diagnostic row more: ConfinedArena ``alloc(n).fill(3).free()`` (zero=True, then touched).  jemalloc
  zeroes a dirty large block with madvise(MADV_DONTNEED) rather than memset, which makes zero=True +
  free alone look nearly free while the first touch pays a page fault per 4 KiB page (arenalib before
  9c745bf: 418 us per 1 MiB round trip); this row is where that would show.
"""

from __future__ import annotations

import gc
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from _common import (
    BASELINE,
    SIZES,
    Config,
    Progress,
    fmt_num,
    fmt_size,
    run_standalone,
    same_round_ratio,
    summarize,
    table,
)
from _experiment import finding, ratio_item, ratio_line, side, times

TITLE = "1. Allocation round trip (allocate, fill with byte 3, free)"
CHEAPEST = "bytearray_repeat"   # the strict reading of "bytearray with the cheapest fill"
SLOW_COPY = 0.15  # bytearray*n under this share of bytearray(n)+fill's time: the latter's copy ran slow


@dataclass
class Candidate:
    key: str
    label: str
    family: str                      # "peer", "arenalib" or "reference"
    op: str                          # the statement timed, once per operation
    setup: Callable[[int], dict]     # names the statement uses, for size n
    batch: str = "pass"              # statement after every inner batch
    teardown: Callable[[dict], None] | None = None
    note: str = ""
    skipped: str | None = None       # why the candidate cannot run here


def inner_count(n: int) -> int:
    return max(1, min(256, (1 << 20) // max(n, 1)))


def make_runner(cand: Candidate, n: int, env: dict) -> Callable[[int], None]:
    """The timed loop of ``cand`` at size ``n``: every name of ``env`` is a local (default argument)."""
    names = sorted(env)
    params = "".join(f", {name}={name}" for name in names)
    src = (f"def run(outer, _inner=_inner{params}):\n"
           f"    for _ in range(outer):\n"
           f"        for _ in _inner:\n"
           f"            {cand.op}\n"
           f"        {cand.batch}\n")
    namespace = dict(env)
    namespace["_inner"] = range(inner_count(n))
    exec(compile(src, f"<bench {cand.key} n={n}>", "exec"), namespace)
    return namespace["run"]


def timed(run: Callable[[int], None], outer: int) -> int:
    """Nanoseconds of one call of ``run(outer)`` with the garbage collector off."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        run(outer)
        return time.perf_counter_ns() - t0
    finally:
        if gc_was:
            gc.enable()


def calibrate(run: Callable[[int], None], n: int, target_ns: float) -> int:
    """``outer`` such that run(outer) takes about target_ns."""
    outer = 1
    while True:
        dt = timed(run, outer)
        if dt >= target_ns / 4 or outer >= 1 << 24:
            break
        outer *= 4 if dt < target_ns / 64 else 2
    return max(1, math.ceil(outer * target_ns / max(dt, 1)))


# -- candidates -----------------------------------------------------------------------------------

def candidates() -> list[Candidate]:
    import ctypes

    import numpy
    import pyarrow

    import arenalib

    u8 = numpy.uint8
    out = [
        Candidate("loop", "(empty loop)", "reference", "pass", lambda n: {},
                  note="the loop overhead shared by every candidate, included in all figures"),
        Candidate("bytearray", "bytearray(n)+fill", "peer", "ba(n)[:] = pattern",
                  lambda n: {"ba": bytearray, "pattern": bytearray(b"\x03" * n), "n": n},
                  note="bytearray(n) zeroes, then slice assignment from a prebuilt bytearray (memcpy)"),
        Candidate("bytearray_repeat", "bytearray*n", "peer", "b3 * n",
                  lambda n: {"b3": bytearray(b"\x03"), "n": n},
                  note="bytearray(b'\\x03') * n: CPython memsets a repeated single byte (malloc+memset)"),
        Candidate("numpy_empty", "numpy.empty+fill", "peer", "empty(n, u8).fill(3)",
                  lambda n: {"empty": numpy.empty, "u8": u8, "n": n}),
        Candidate("numpy_zeros", "numpy.zeros", "peer", "zeros(n, u8)",
                  lambda n: {"zeros": numpy.zeros, "u8": u8, "n": n}, note="no fill: peer of zero=True"),
    ]
    for pool_name, key in (("jemalloc", "pa_jemalloc"), ("mimalloc", "pa_mimalloc"), ("system", "pa_system")):
        factory = getattr(pyarrow, f"{pool_name}_memory_pool", None)
        skipped = None
        try:
            pool = factory()
        except Exception as exc:  # pyarrow built without this allocator
            pool, skipped = None, f"pyarrow.{pool_name}_memory_pool() unavailable: {exc}"
        if factory is None:
            skipped = f"this pyarrow has no {pool_name}_memory_pool"

        def setup(n: int, pool=pool) -> dict:
            return {"frombuffer": numpy.frombuffer, "allocate_buffer": pyarrow.allocate_buffer,
                    "pool": pool, "u8": u8, "n": n}

        out.append(Candidate(key, f"pyarrow {pool_name}", "peer",
                             "frombuffer(allocate_buffer(n, memory_pool=pool), u8).fill(3)", setup,
                             skipped=skipped, note="fill through a NumPy view; dropping it frees"))
    out.append(Candidate("ctypes", "ctypes buffer+memset", "peer",
                         "memset(create_string_buffer(n), 3, n)",
                         lambda n: {"create_string_buffer": ctypes.create_string_buffer,
                                    "memset": ctypes.memset, "n": n},
                         note="create_string_buffer zeroes; ctypes.memset is a foreign call"))

    def arena_setup(cls):
        def setup(n: int) -> dict:
            arena = cls()
            return {"alloc": arena.allocate, "n": n, "_arena": arena}
        return setup

    def arena_teardown(env: dict) -> None:
        env["_arena"].close()

    def slicing_setup(n: int) -> dict:
        arena = arenalib.SlicingArena()
        return {"alloc": arena.allocate, "reset": arena.reset, "n": n, "_arena": arena}

    for cls_name in ("ConfinedArena", "Arena"):
        cls = getattr(arenalib, cls_name)
        out.append(Candidate(f"{cls_name}_nz", f"{cls_name} zero=False", "arenalib",
                             "alloc(n, zero=False).fill(3).free()", arena_setup(cls),
                             teardown=arena_teardown))
    for cls_name in ("ConfinedArena", "Arena"):
        cls = getattr(arenalib, cls_name)
        out.append(Candidate(f"{cls_name}_z", f"{cls_name} zero=True", "arenalib",
                             "alloc(n).free()", arena_setup(cls), teardown=arena_teardown,
                             note="no fill: compare with numpy.zeros"))
    out.append(Candidate("ConfinedArena_z_fill", "ConfinedArena zero=True+fill", "arenalib",
                         "alloc(n).fill(3).free()", arena_setup(arenalib.ConfinedArena),
                         teardown=arena_teardown,
                         note="diagnostic: zero=True memory then touched, so zeroing by madvise "
                              "(a page fault per 4 KiB page at first touch) would show here"))
    out.append(Candidate("SlicingArena", "SlicingArena+reset", "arenalib", "alloc(n, zero=False).fill(3)",
                         slicing_setup,
                         batch="reset()", teardown=arena_teardown,
                         note="reset() after every inner batch of k allocations"))
    out.append(Candidate("scope", "with ConfinedArena()", "arenalib",
                         "with CA() as a: a.allocate(n, zero=False).fill(3)",
                         lambda n: {"CA": arenalib.ConfinedArena, "n": n},
                         note="a fresh arena per operation, closed at the end of the with-block"))
    return out


# -- the experiment -------------------------------------------------------------------------------

def plan(cfg: Config) -> float:
    """Estimated milliseconds: per size, calibration (~3 measurements) and rounds + 1 warm-up."""
    count = sum(1 for c in candidates() if not c.skipped)
    return len(SIZES) * count * cfg.target_ms * (cfg.rounds + 4)


def run(cfg: Config, progress: Progress) -> dict:
    cands = candidates()
    for c in cands:
        if c.skipped:
            progress.note(f"roundtrip: skipping {c.label}: {c.skipped}")
    active = [c for c in cands if not c.skipped]
    target_ns = cfg.target_ms * 1e6
    results: dict = {
        "method": {
            "rounds": cfg.rounds, "warmup_rounds": 1, "target_ms_per_measurement": cfg.target_ms,
            "inner_batch": {str(n): inner_count(n) for n in SIZES},
            "ratio": "median over rounds of (candidate ns/op / bytearray ns/op in the same round)",
            "baseline": BASELINE,
        },
        "candidates": {c.key: {"label": c.label, "family": c.family, "op": c.op, "batch": c.batch,
                               "note": c.note, "skipped": c.skipped} for c in cands},
        "sizes": list(SIZES),
        "cells": {},
    }
    for n in SIZES:
        progress.set_label(f"roundtrip n={n}: calibrating")
        envs = {}
        runners = {}
        outers = {}
        for c in active:
            env = c.setup(n)
            envs[c.key] = env
            run_fn = make_runner(c, n, {k: v for k, v in env.items() if not k.startswith("_")})
            runners[c.key] = run_fn
            outers[c.key] = calibrate(run_fn, n, target_ns)
        progress.step(f"roundtrip n={n}: calibrated", len(active) * cfg.target_ms * 3)
        per_round: dict[str, list[float]] = {c.key: [] for c in active}
        keys = [c.key for c in active]
        for rnd in range(cfg.rounds + 1):
            shift = rnd % len(keys)
            order = keys[shift:] + keys[:shift]
            measured = {}
            for key in order:
                ops = outers[key] * inner_count(n)
                measured[key] = timed(runners[key], outers[key]) / ops
            if rnd == 0:
                progress.step(f"roundtrip n={n}: warm-up", len(active) * cfg.target_ms)
                continue  # warm-up round
            for key in keys:
                per_round[key].append(measured[key])
            progress.step(f"roundtrip n={n}: round {rnd}/{cfg.rounds}", len(active) * cfg.target_ms)
        for c in active:
            if c.teardown:
                c.teardown(envs[c.key])
        envs.clear()
        for c in active:
            ns = summarize(per_round[c.key])
            cell = {
                "ns_per_op": ns,
                "ops_per_ms": 1e6 / ns["median"],
                "ratio_to_baseline": same_round_ratio(per_round[c.key], per_round[BASELINE]),
                "per_round_ns": [round(x, 2) for x in per_round[c.key]],
                "ops_per_measurement": outers[c.key] * inner_count(n),
            }
            results["cells"].setdefault(c.key, {})[str(n)] = cell
    return results


def ratio(results: dict, key: str, other: str, n: int) -> dict | None:
    """Median of same-round ratios key/other at size n (any pair of candidates)."""
    cells = results["cells"]
    if key not in cells or other not in cells or str(n) not in cells[key] or str(n) not in cells[other]:
        return None
    return same_round_ratio(cells[key][str(n)]["per_round_ns"], cells[other][str(n)]["per_round_ns"])


# -- reading the results back (targets, tables, plots; also from a results.json) --------------------

target_line = ratio_line


def targets(rt: dict) -> list[dict]:
    """Issue 6's targets, each checked on ratios measured in this one run."""
    checks: list[dict] = []
    labels = rt["candidates"]

    def check(title: str, key: str, n: int, other: str, limit: float) -> None:
        item = ratio_item(title, key, labels.get(key, {}).get("label", key), n, other,
                          labels.get(other, {}).get("label", other), limit, ratio(rt, key, other, n))
        if other == BASELINE:
            strict = ratio(rt, key, CHEAPEST, n)
            if strict is not None:
                item["ratio_vs_cheapest_bytearray"] = strict["median"]
                item["status_vs_cheapest_bytearray"] = "MET" if strict["median"] <= limit else "MISSED"
        checks.append(item)

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
        check("SlicingArena allocate+fill (reset per batch) vs bytearray", "SlicingArena", n, BASELINE, 0.8)
    check("per-scope `with ConfinedArena() as a: a.allocate(512, zero=False).fill(3)` vs bytearray",
          "scope", 512, BASELINE, 2.0)
    return checks


def _sizes_text(pairs: list[tuple[int, float]]) -> str:
    """ "1.2x faster at 8 B, 1.5x at 512 B, on par at 1 KiB": ratios of times, by size, the direction
    said when it changes."""
    words, last = [], None
    for n, r in pairs:
        text = times(r)
        direction = text.split()[-1]
        if direction == last and text != "on par":
            text = text.rsplit(" ", 1)[0]
        words.append(f"{text} at {fmt_size(n)}")
        last = direction
    return ", ".join(words)


def findings(rt: dict) -> list[dict]:
    """The verdict's sentences: ConfinedArena's round trip against bytearray(n)+fill, numpy and pyarrow,
    then against bytearray*n, each from this run's same-round ratios."""
    out: list[dict] = []
    key, sizes = "ConfinedArena_nz", rt["sizes"]
    if key not in rt["cells"]:
        return [finding("skip", "Allocation round trip: ConfinedArena was not measured.")]
    what = "Round trip from Python (allocate, fill, free), ConfinedArena"
    # bytearray(n)+fill's copy is sometimes many times slower than the same bytes' memset (glibc's rep
    # movsb on some CPUs and buffer placements: bench/threads.py); a ratio to it there says nothing.
    slow = {n: 1 / r["median"] for n in sizes
            if (r := ratio(rt, CHEAPEST, BASELINE, n)) is not None and r["median"] < SLOW_COPY}
    by_side: dict[str, list[tuple[int, float]]] = {"win": [], "loss": [], "even": []}
    for n in sizes:
        r = ratio(rt, key, BASELINE, n)
        if r is not None and n not in slow:
            by_side[side(r["median"])].append((n, r["median"]))
    if by_side["win"]:
        peers = []
        for other in ("numpy_empty", "pa_jemalloc"):
            r = ratio(rt, key, other, 512)
            if r is not None and side(r["median"]) == "win":
                peers.append(f"{times(r['median'])} than {rt['candidates'][other]['label']}")
        also = f"; at 512 B {' and '.join(peers)}" if peers else ""
        out.append(finding("win", f"{what} against bytearray(n)+fill: {_sizes_text(by_side['win'])}{also}."))
    if by_side["even"]:
        out.append(finding("even", f"{what} is on par with bytearray(n)+fill at "
                                   f"{', '.join(fmt_size(n) for n, _ in by_side['even'])}."))
    if by_side["loss"]:
        out.append(finding("loss", f"{what} against bytearray(n)+fill: {_sizes_text(by_side['loss'])}.",
                           "arenalib's round trip is three Python method calls (allocate, fill, free)"))
    strict = [(n, r["median"]) for n in sizes if (r := ratio(rt, key, CHEAPEST, n)) is not None]
    slower = [(n, x) for n, x in strict if side(x) == "loss"]
    if slower:
        out.append(finding(
            "loss", f"bytearray(b'\\x03')*n, malloc + memset in one C call, beats it: ConfinedArena is "
                    f"{_sizes_text(slower)}.",
            "that statement is one call into C; arenalib's round trip is three method calls from Python"))
    elif strict:
        out.append(finding("even" if all(side(x) == "even" for _, x in strict) else "win",
                           "Against bytearray(b'\\x03')*n (malloc + memset, the cheapest bytearray) "
                           f"ConfinedArena is {_sizes_text(strict)}."))
    if slow:
        where = ", ".join(f"{fmt_size(n)} (its copy {x:.0f}x slower than bytearray*n's memset)"
                          for n, x in slow.items())
        out.append(finding(
            "skip", f"Round trip against bytearray(n)+fill at {where}: not counted above",
            "glibc's memcpy (rep movsb) runs many times slower on some CPUs for some buffer placements; "
            "bytearray*n is the peer to read there"))
    skipped = [c["label"] for c in rt["candidates"].values() if c["skipped"]]
    if skipped:
        out.append(finding("skip", f"Round trip peers not measured: {', '.join(skipped)}.",
                           "; ".join(sorted({c["skipped"] for c in rt["candidates"].values()
                                             if c["skipped"]}))))
    return out


def tables(rt: dict, markdown: bool = False) -> str:
    """ns/op, ops/ms and the ratios to bytearray, per candidate and size; in markdown, the timed
    statements first."""
    sizes = rt["sizes"]
    keys = [k for k, c in rt["candidates"].items() if not c["skipped"] and k in rt["cells"]]
    heads = ["candidate", *[fmt_size(n) for n in sizes]]
    out = []
    if markdown:
        out += ["Timed statements (one per op, callables bound as locals):", ""]
        for c in rt["candidates"].values():
            if c["skipped"]:
                out.append(f"- {c['label']}: skipped ({c['skipped']})")
            else:
                batch = f" + `{c['batch']}` per batch" if c["batch"] != "pass" else ""
                note = f" — {c['note']}" if c["note"] else ""
                out.append(f"- {c['label']}: `{c['op']}`{batch}{note}")
        out.append("")
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


def plots(rt: dict, out, plt) -> list[str]:
    """Time per op and the ratio to bytearray against the size, every candidate a line of its own
    colour and marker (arenalib solid, peers dashed)."""
    from _plot import lines

    written = []
    for fname, field, ylabel, title in (
        ("roundtrip_ns.png", "ns_per_op", "ns per allocate+fill+free (median)",
         "Allocation round trip: time per op (lower is faster)"),
        ("roundtrip_ratio.png", "ratio_to_baseline", "time / bytearray(n)+fill's (same round)",
         "Allocation round trip: ratio to bytearray(n)+fill (lower is faster)"),
    ):
        series = {c["label"]: (c["family"], [rt["cells"][key][str(n)][field]["median"] for n in rt["sizes"]])
                  for key, c in rt["candidates"].items()
                  if not c["skipped"] and key in rt["cells"] and not (key == "loop" and field != "ns_per_op")}
        written += lines(plt, out, fname, rt["sizes"], series, xlabels=[fmt_size(n) for n in rt["sizes"]],
                         ylabel=ylabel, title=title, logx=True, logy=True,
                         hline=1.0 if field == "ratio_to_baseline" else None)
    return written


if __name__ == "__main__":
    run_standalone(sys.modules[__name__])
