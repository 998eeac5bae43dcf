"""Experiment 5, one arena per request or batch (issue 14): the way most arenalib code is written.

    for batch in batches:
        with arenalib.SlicingArena() as a:           # or Arena() / ConfinedArena()
            bufs = [a.allocate(n, zero=False).fill(3) for _ in range(k)]

What it measures: the cost of such a scope (open a fresh arena, allocate k blocks of n bytes unzeroed
and fill each with byte 3, keeping every segment, then close the arena and drop the segments) for
a sweep of 23 block sizes from 8 B to 1 MiB (powers of two and the sizes between them: the retention
policy depends on the size, through jemalloc's size classes and the 4 MiB big-scope threshold), with
k = min(1024, 16 MiB // n) blocks per scope, and for a mixed scope (MIXED_SIZES in turn, 16 MiB), for
each arena kind and for the same scope written with bytearray and NumPy.  It reports ns per block
(the scope's time / k), the ratio to bytearray(n)+fill measured in the same round, and the minor
page faults per scope next to them.  A second, small table gives the per-scope cost of the smallest scope,
``with ConfinedArena() as a: a.allocate(512, zero=False).fill(3)``, against ``bytearray(512)`` + fill.

How:
* Every candidate's scope is put into the same generated loop (as bench/roundtrip.py does), every
  name it uses bound as a local:

      def run(scopes, _inner=[n] * k, <names>):   # the mixed scope: _inner lists its sizes
          for _ in range(scopes):
              with Kind() as a:             # arenalib only; the peers have no with-block
                  bufs = []
                  append = bufs.append
                  alloc = a.allocate        # arenalib only
                  for n in _inner:
                      <block>
              bufs = append = ... = None    # drop the segments / buffers (and the arena object)

  with <block> one of
  - ``append(alloc(n, zero=False).fill(3))`` for Arena, ConfinedArena and SlicingArena (a fresh
    arena per scope, closed by the with-exit; Segment.fill is a memset and returns the segment);
  - ``b = ba(n); b[:] = pattern; append(b)`` for bytearray, ``pattern`` a prebuilt bytearray of n
    bytes 3: the fill of bench/roundtrip.py's bytearray baseline (``bytearray(n)[:] = pattern``, the
    cheapest way to fill a new bytearray(n): it zeroes, then the slice assignment is a memcpy), so
    the ratios here read like experiment 1's (the mixed scope takes each size's pattern from a dict,
    ``patterns[n]``);
  - ``b = empty(n, u8); b.fill(3); append(b)`` for ``numpy.empty(n, uint8)`` (left out, with a note,
    where numpy cannot be imported).
  The user's list comprehension becomes a loop with a bound ``append`` so that every candidate runs
  the same loop (bytearray's fill is a statement, not an expression); ``alloc = a.allocate`` is bound
  once per scope, as roundtrip.py binds its callables.  Dropping the list frees the k bytearrays or
  arrays, the peers' equivalent of the close; the arenalib scopes pay the close and then the
  deallocation of k dead Segment objects.
* Per size, each candidate's scope first runs a few times untimed (warm-up: the process's first-touch
  page faults, glibc's heap growth, jemalloc's first arenas, are not charged to whichever candidate
  runs first), then the number of scopes per measurement is calibrated so one measurement takes
  about ``target_ms``.  Rounds interleave the candidates, the starting candidate rotating by one each
  round (as threads.py does); the garbage collector is off during every measurement.
* Each measurement reads ``resource.getrusage(RUSAGE_SELF).ru_minflt`` before and after the timed
  scopes (outside the timed interval): faults per scope = the delta / the number of scopes.
* The report gives the median ns per block, the median of same-round ratios to bytearray (less
  sensitive to drifts of the machine than a ratio of medians) and the median faults per scope.
* Quick mode: 5 rounds of ~20 ms measurements per size (about a minute for the sweep); full mode: 21
  rounds of ~50 ms (about 8 minutes).  These live here (SETTINGS), not in _common.Config.

What bounds it:
* At 8 B and 512 B the per-block work of every candidate is a few calls and a small memset or memcpy:
  the interpreter's call overhead bounds the ratios (as in experiment 1), and the arena's open and
  close are shared by 1024 blocks.
* From 4 KiB up, page faults.  Memory new to the process costs a minor page fault per 4 KiB page at
  first touch, more than the fill of the page (about 2.5 us per fault on the 2-vCPU Firecracker VM of
  the first runs, where bytearray at 1 MiB took ~700 us per block for its 256 faults).  Whoever hands
  a scope's pages back to the OS at its end faults them in again in the next scope:
  - glibc gives the top of its heap back once more than its trim threshold is free there (128 KiB
    by default; twice the dynamic mmap threshold once the process has freed a block glibc had
    mmap'd, 64 MiB at most).  The k bytearrays or arrays of a 4 MiB or 16 MiB scope are freed at the
    top of the heap, so glibc trims, and the next scope faults them in again (first runs: ~880 faults
    per 4 KiB scope of 1024 pages, ~4,060 per 16 MiB scope).  A process whose history raised the
    thresholds past the scope's size (or MALLOC_TRIM_THRESHOLD_) would not pay them: the faults
    table says what each candidate paid in this run.
  - arenalib's close policy at the time of writing resets and purges the jemalloc arena of a scope
    that churned more than 4 MiB: the 16 MiB scopes (64 KiB, 1 MiB) pay ~4,100-4,350 faults each,
    while the 4 MiB scope of 4 KiB blocks keeps its pages.
  So at 64 KiB and 1 MiB both sides are bound by the faults and the ratios stay near 1.0, and at
  4 KiB only the peers pay them.  With glibc's trimming turned off (GLIBC_TUNABLES=
  glibc.malloc.trim_threshold=1073741824:glibc.malloc.mmap_threshold=33554432, which run.py records)
  the peers paid no faults at all, and the arenalib rows at 64 KiB and 1 MiB came out 8-10x
  bytearray on the same VM: the ratios at those sizes measure the two allocators' policies for
  handing memory back as much as their speed.
* bytearray's fill is a memcpy; glibc copies 64 KiB and more with ``rep movsb``, which some x86 CPUs
  run far slower for some relative placements of source and destination (see bench/threads.py): a
  64 KiB bytearray figure that jumps from run to run is that, not arenalib.
* The machine: other processes on the CPUs, and the VM's page-fault cost, move every figure; the
  ratios taken within one round cancel the slow drifts, not the bursts.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass

import _scopes_per_scope as per_scope
import roundtrip
from _common import BASELINE, Config, Progress, fmt_ns, fmt_size, same_round_ratio, summarize, table
from _experiment import finding, ratio_line, side, times

TITLE = "5. One arena per scope (issue 14)"

SIZES = (8, 24, 100, 512, 1000, 1500, 3000, 4096, 5000, 6144, 8000, 12000, 16384, 20000, 24000, 32768,
         40000, 50000, 65536, 100_000, 200_000, 500_000, 1 << 20)
# The mixed scope: blocks of these sizes in turn, up to SCOPE_BYTES (MAX_BLOCKS at most).
MIXED = "mixed"
MIXED_SIZES = (100, 3000, 5000, 20000, 70000, 1500, 40000)
SCOPE_BYTES = 16 << 20     # at most this many bytes per scope ...
MAX_BLOCKS = 1024          # ... and at most this many blocks
WARMUP_SCOPES = 3          # untimed scopes per candidate and size before calibrating
ARENA_KINDS = ("Arena", "ConfinedArena", "SlicingArena")
# rounds and the duration of one measurement, per mode of bench/run.py
SETTINGS = {"quick": {"rounds": 5, "target_ms": 20.0}, "full": {"rounds": 21, "target_ms": 50.0}}
PAGE = 4096


def block_sizes(n: int | str) -> list[int]:
    """The sizes of one scope's blocks, in order: k blocks of n bytes, or the mixed scope's."""
    if n == MIXED:
        out: list[int] = []
        total = 0
        while len(out) < MAX_BLOCKS:
            size = MIXED_SIZES[len(out) % len(MIXED_SIZES)]
            if total + size > SCOPE_BYTES:
                break
            out.append(size)
            total += size
        return out
    return [n] * max(1, min(MAX_BLOCKS, SCOPE_BYTES // n))


def blocks(n: int | str) -> int:
    """k, the blocks allocated in one scope of size n (or the mixed scope)."""
    return len(block_sizes(n))


def scope_pages(n: int | str) -> int:
    """The pages one scope's blocks span (their bytes / 4 KiB, rounded up)."""
    return -(-sum(block_sizes(n)) // PAGE)


def measured_sizes() -> list[int | str]:
    return [*SIZES, MIXED]


def settings(cfg: Config) -> dict:
    return SETTINGS["full" if cfg.mode == "full" else "quick"]


@dataclass
class ScopeCandidate:
    key: str
    label: str
    family: str                      # "peer" or "arenalib"
    block: str                       # the statement run once per block
    env: Callable[[int], dict]       # names the scope uses, for size n
    kind: str | None = None          # arenalib: the arena class opened per scope
    note: str = ""
    skipped: str | None = None       # why the candidate cannot run here

    def body(self) -> list[str]:
        """One scope's statements (the generated loop's body)."""
        inner = ["bufs = []", "append = bufs.append"]
        if self.kind:
            inner.append("alloc = a.allocate")
        inner += ["for n in _inner:", f"    {self.block}"]
        if self.kind:
            return [f"with {self.kind}() as a:", *("    " + line for line in inner),
                    "bufs = append = alloc = a = None"]
        return [*inner, "bufs = append = b = None"]

    def shown(self) -> str:
        """The scope as a user writes it, for the report."""
        if self.kind:
            return f"with {self.kind}() as a: bufs = [a.allocate(n, zero=False).fill(3) for _ in range(k)]"
        return "bufs = [], k buffers appended, then bufs dropped"


def candidates() -> list[ScopeCandidate]:
    import arenalib

    def bytearray_env(n: int | str) -> dict:
        if n == MIXED:
            return {"ba": bytearray, "patterns": {m: bytearray(b"\x03") * m for m in MIXED_SIZES}}
        return {"ba": bytearray, "pattern": bytearray(b"\x03") * n}

    out = [ScopeCandidate(BASELINE, "bytearray(n)+fill", "peer", "b = ba(n); b[:] = pattern; append(b)",
                          bytearray_env,
                          note="experiment 1's fill: bytearray(n) zeroes, slice assignment from a prebuilt "
                               "bytearray copies (memcpy)")]
    try:
        import numpy
    except ImportError as exc:
        numpy, skipped = None, f"numpy unavailable: {exc}"
    else:
        skipped = None

    def numpy_env(n: int) -> dict:
        return {"empty": numpy.empty, "u8": numpy.uint8}

    out.append(ScopeCandidate("numpy_empty", "numpy.empty+fill", "peer",
                              "b = empty(n, u8); b.fill(3); append(b)", numpy_env, skipped=skipped))

    def arena_env(kind: str) -> Callable[[int], dict]:
        cls = getattr(arenalib, kind)
        return lambda n: {kind: cls}

    for kind in ARENA_KINDS:
        out.append(ScopeCandidate(kind, f"{kind} per scope", "arenalib",
                                  "append(alloc(n, zero=False).fill(3))", arena_env(kind), kind=kind,
                                  note="a fresh arena per scope, closed by the with-exit"))
    return out


def make_scope_runner(cand: ScopeCandidate, n: int | str, env: dict) -> Callable[[int], None]:
    """The timed loop: ``run(scopes)`` runs ``scopes`` scopes of ``cand`` at size n (or the mixed
    scope), every name of ``env`` a local (default argument)."""
    params = "".join(f", {name}={name}" for name in sorted(env))
    body = cand.body()
    if n == MIXED:
        body = [line.replace("b[:] = pattern;", "b[:] = patterns[n];") for line in body]
    src = (f"def run(scopes, _inner=_inner{params}):\n"
           f"    for _ in range(scopes):\n"
           + "".join(f"        {line}\n" for line in body))
    namespace = dict(env)
    namespace["_inner"] = block_sizes(n)
    exec(compile(src, f"<scope {cand.key} n={n}>", "exec"), namespace)
    return namespace["run"]


def measure(run_fn: Callable[[int], None], count: int) -> tuple[int, int]:
    """(ns, minor page faults) of ``run_fn(count)``; the faults are read outside the timed interval."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ns = roundtrip.timed(run_fn, count)
    return ns, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


# -- the experiment -------------------------------------------------------------------------------

def plan(cfg: Config) -> float:
    """Estimated milliseconds: per size and candidate, warm-up + calibration (~4 measurements) and the
    rounds; then the per-scope table's two candidates."""
    s = settings(cfg)
    count = sum(1 for c in candidates() if not c.skipped)
    per_scope_rounds = max(per_scope.PER_SCOPE_MIN_ROUNDS, s["rounds"])
    return s["target_ms"] * (len(measured_sizes()) * count * (s["rounds"] + 4) + 2 * (per_scope_rounds + 4))


def run(cfg: Config, progress: Progress) -> dict:
    s = settings(cfg)
    rounds, target_ms = s["rounds"], s["target_ms"]
    target_ns = target_ms * 1e6
    cands = candidates()
    for c in cands:
        if c.skipped:
            progress.note(f"scopes: skipping {c.label}: {c.skipped}")
    active = [c for c in cands if not c.skipped]
    keys = [c.key for c in active]
    results: dict = {
        "method": {
            "rounds": rounds, "target_ms_per_measurement": target_ms, "warmup_scopes": WARMUP_SCOPES,
            "blocks_per_scope": {str(n): blocks(n) for n in measured_sizes()},
            "pages_per_scope": {str(n): scope_pages(n) for n in measured_sizes()},
            "mixed_sizes": list(MIXED_SIZES),
            "ns_per_block": "the scope's time (open, k x allocate + fill, close, drop) / k",
            "ratio": "median over rounds of (candidate ns/block / bytearray ns/block in the same round)",
            "faults": "resource.getrusage(RUSAGE_SELF).ru_minflt delta over the timed scopes / scopes",
            "baseline": BASELINE,
        },
        "candidates": {c.key: {"label": c.label, "family": c.family, "scope": c.shown(), "block": c.block,
                               "code": c.body(), "note": c.note, "skipped": c.skipped} for c in cands},
        "sizes": measured_sizes(),
        "cells": {},
    }
    for n in measured_sizes():
        k = blocks(n)
        progress.set_label(f"scopes n={n}: warm-up")
        runners = {c.key: make_scope_runner(c, n, c.env(n)) for c in active}
        for key in keys:
            runners[key](WARMUP_SCOPES)
        progress.set_label(f"scopes n={n}: calibrating")
        scopes = {key: roundtrip.calibrate(runners[key], n, target_ns) for key in keys}
        progress.step(f"scopes n={n}: calibrated", len(active) * target_ms * 4)
        ns_per_block: dict[str, list[float]] = {key: [] for key in keys}
        faults: dict[str, list[float]] = {key: [] for key in keys}
        for rnd in range(rounds):
            shift = rnd % len(keys)
            for key in keys[shift:] + keys[:shift]:
                ns, flt = measure(runners[key], scopes[key])
                ns_per_block[key].append(ns / (scopes[key] * k))
                faults[key].append(flt / scopes[key])
            progress.step(f"scopes n={n}: round {rnd + 1}/{rounds}", len(active) * target_ms)
        runners.clear()
        for key in keys:
            ns = summarize(ns_per_block[key])
            results["cells"].setdefault(key, {})[str(n)] = {
                "ns_per_block": ns,
                "ns_per_scope": ns["median"] * k,
                "ratio_to_baseline": same_round_ratio(ns_per_block[key], ns_per_block[BASELINE]),
                "faults_per_scope": summarize(faults[key]),
                "per_round_ns": [round(x, 2) for x in ns_per_block[key]],
                "per_round_faults": [round(x, 1) for x in faults[key]],
                "scopes_per_measurement": scopes[key],
            }
    results["per_scope"] = per_scope.run(max(per_scope.PER_SCOPE_MIN_ROUNDS, rounds), target_ns, progress,
                                         WARMUP_SCOPES, measure)
    return results


# -- reading the results back (targets, tables; also from a results.json) -------------------------

def findings(sc: dict) -> list[dict]:
    """The verdict's sentences: at how many block sizes one arena per scope beats bytearray(n)+fill per
    block (the same-round ratios), by how much, and where it does not."""
    counts, speedups, mixed, losses, kinds, kinds_measured = [], [], [], [], set(), []
    small = True
    for key in ARENA_KINDS:
        pairs = [(n, r["median"]) for n in sc["sizes"] if n != MIXED
                 and (r := ratio(sc, key, BASELINE, n)) is not None]
        if not pairs:
            continue
        kinds_measured.append(key)
        faster = [1 / r for _, r in pairs if side(r) == "win"]
        slower = [(n, r) for n, r in pairs if side(r) == "loss"]
        small = small and all(n <= 1024 for n, _ in slower)
        kinds.add("win" if len(faster) > len(pairs) / 2 else "even" if faster else "loss")
        counts.append((len(faster), len(pairs)))
        speedups += faster
        if (m := ratio(sc, key, BASELINE, MIXED)) is not None:
            mixed.append(1 / m["median"])
        if slower:
            losses.append(f"{key} at " + ", ".join(f"{fmt_size(n)} ({times(r).split()[0]})"
                                                   for n, r in slower[:4])
                          + (f" and {len(slower) - 4} more sizes" if len(slower) > 4 else ""))
    if not counts:
        return [finding("skip", "One arena per scope: no arena kind was measured.")]
    lo, hi = min(c for c, _ in counts), max(c for c, _ in counts)
    text = (f"One arena per scope ({', '.join(kinds_measured)}), per block against bytearray(n)+fill: "
            "faster at "
            f"{lo}{f'-{hi}' if hi > lo else ''} of {counts[0][1]} block sizes")
    if speedups:
        text += f" (up to {max(speedups):.1f}x)"
    if mixed:
        text += f", {min(mixed):.1f}x" + (f"-{max(mixed):.1f}x" if max(mixed) > min(mixed) else "") + \
            " with mixed sizes"
    kind = "win" if kinds == {"win"} else "loss" if "loss" in kinds else "even"
    out = [finding(kind, text + ".")]
    if losses:
        out.append(finding("loss", "One arena per scope is slower than bytearray(n)+fill: "
                           + "; ".join(losses) + ".",
                           "at small blocks the Python calls per block (allocate, fill) cost more than the "
                           "memory"
                           if small else None))
    return out


def plots(sc: dict, out, plt) -> list[str]:
    """Each candidate's time per block over bytearray(n)+fill's against the block size."""
    from _plot import lines

    sizes = [n for n in sc["sizes"] if n != MIXED]
    series = {}
    for key, c in sc["candidates"].items():
        if c["skipped"] or key not in sc["cells"] or key == BASELINE:
            continue
        ratios = [ratio(sc, key, BASELINE, n) for n in sizes]
        series[c["label"]] = (c["family"], [None if r is None else r["median"] for r in ratios])
    if not series:
        return []
    return lines(plt, out, "scopes_ratio.png", sizes, series,
                 ylabel="time per block / bytearray(n)+fill's (same round)", logx=True, logy=True, hline=1.0,
                 title="One arena per scope (k blocks, then close): per block against bytearray(n)+fill "
                       "(lower is faster)")


def ratio(results: dict, key: str, other: str, n: int) -> dict | None:
    """Median of same-round ratios of ns/block key/other at size n, from the per-round figures."""
    cells = results["cells"]
    if key not in cells or other not in cells or str(n) not in cells[key] or str(n) not in cells[other]:
        return None
    return same_round_ratio(cells[key][str(n)]["per_round_ns"], cells[other][str(n)]["per_round_ns"])


# -- targets ----------------------------------------------------------------------------------------

# A warm scope re-faults at most this share of its pages (plus FAULT_SLACK): the policy keeps a
# repeated scope's pages whatever its block size.
FAULT_SHARE = 0.02
FAULT_SLACK = 8


def ratio_limit(n: int | str) -> float:
    """Per block against bytearray(n)+fill: 0.8x up to 1 KiB (the interpreter's call overhead bounds
    both), 0.5x from 2 KiB up (page faults and memsets dominate: a warm arena pays none)."""
    return 0.8 if n != MIXED and n <= 1024 else 0.5


def targets(sc: dict) -> list[dict]:
    """Per kind and size: the ratio to bytearray and the faults of a warm scope, each a target; then
    the per-scope table's."""
    checks = []
    names = sc["candidates"]
    for key in ARENA_KINDS:
        if key not in sc["cells"]:
            continue
        label = names.get(key, {}).get("label", key)
        for n in sc["sizes"]:
            cell = sc["cells"][key].get(str(n))
            r = ratio(sc, key, BASELINE, n)
            limit = ratio_limit(n)
            checks.append({"target": "scopes ratio: one arena per scope, per block vs bytearray(n)+fill",
                           "candidate": key, "label": label, "size": n, "limit": limit,
                           "ratio": None if r is None else r["median"],
                           "status": "n/a" if r is None else ("MET" if r["median"] <= limit else "MISSED")})
            pages = sc["method"]["pages_per_scope"][str(n)]
            allowed = FAULT_SHARE * pages + FAULT_SLACK
            faults = None if cell is None else cell["faults_per_scope"]["median"]
            title = f"scopes faults: a warm scope re-faults <= {FAULT_SHARE:.0%} of its pages + {FAULT_SLACK}"
            checks.append({"target": title, "candidate": key, "label": label, "size": n,
                           "limit": allowed, "ratio": faults, "pages": pages,
                           "status": "n/a" if faults is None else ("MET" if faults <= allowed else "MISSED")})
    return [*checks, per_scope.target(sc)]


def target_line(c: dict) -> str:
    """One line of the checklist for a check of targets()."""
    if not c["target"].startswith("scopes "):  # the per-scope table's: a ratio_item
        return ratio_line(c)
    size = "mixed sizes" if c["size"] == MIXED else fmt_size(c["size"])
    if c["ratio"] is None:
        return f"{c['status']:6s} {c['label']} at {size}: not measured"
    if c["target"].startswith("scopes faults"):
        return (f"{c['status']:6s} {c['label']} at {size}: {c['ratio']:.0f} faults per scope "
                f"(limit {c['limit']:.0f} of {c['pages']} pages)")
    return f"{c['status']:6s} {c['label']} at {size}: {c['ratio']:.2f}x (limit {c['limit']:.1f}x)"


def tables(sc: dict, markdown: bool = False) -> str:
    """One arena per scope: per block size, each candidate's ns per block with the ratio to
    bytearray and the minor page faults per scope next to it; then the per-scope table of the
    smallest scope.  In markdown, each candidate's scope first."""
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

    out = []
    if markdown:
        out += ["Timed per scope (bench/scopes.py: every name bound as a local, the same loop for all; "
                "k blocks per scope):", ""]
        for c in sc["candidates"].values():
            if c["skipped"]:
                out.append(f"- {c['label']}: skipped ({c['skipped']})")
            else:
                note = f" — {c['note']}" if c["note"] else ""
                out.append(f"- {c['label']}: `{c['scope']}`, per block `{c['block']}`{note}")
        out.append("")
    short = {BASELINE: "bytearray", "numpy_empty": "numpy", "ConfinedArena": "Confined",
             "SlicingArena": "Slicing"}
    heads = ["n", "k", *[short.get(key, key) for key in keys]]
    rows = [["mixed" if n == "mixed" else fmt_size(n), str(k[str(n)]), *[cell(key, n) for key in keys]]
            for n in sizes]
    out += [f"{h}Scopes (k blocks of n bytes per scope; arenalib: a fresh arena per scope): ns per block, "
            "median (ratio to",
            "bytearray(n)+fill, median of same-round ratios; lower is faster), then minor page faults per "
            "scope (ru_minflt)", table(heads, rows, markdown), ""]
    noise = sorted(sc["cells"][key][str(n)]["ratio_to_baseline"]["rel_iqr"] for key in keys for n in sizes
                   if key != BASELINE)
    if noise:
        out.append(f"Noise: relative IQR of the same-round ratios, median {noise[len(noise) // 2]:.1%}, "
                   f"worst {noise[-1]:.1%}; {sc['method']['rounds']} rounds.")
    if sc.get("per_scope"):
        out += ["", *per_scope.table_lines(sc["per_scope"], markdown)]
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    from _common import run_standalone
    run_standalone(sys.modules[__name__])
