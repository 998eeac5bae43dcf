"""C-level experiments: arenalib's nogil API against glibc's malloc/calloc/free (issue 5).

What: (1) the panama-dev experiment in C: per op allocate + fill(3) + free at 8 B .. 64 KiB, zeroed
and unzeroed, for each arena kind against malloc+fill+free and calloc+fill+free, plus the per-scope
pattern (open a confined arena, allocate, fill, close); (2) the LWJGL experiment: allocate/free pairs
per thread at 8 and 1024 B on 1 and 2 threads, ns per op and the 2-thread scaling factor.

How: the loops are Cython kernels (bench/native/arenalib_bench_kernels.pyx) that cimport arenalib
and time themselves with CLOCK_MONOTONIC, so no Python call overhead is measured; the kernel module
is built with meson against the installed arenalib on first use (build/bench-native-<python>/).
Candidates are interleaved (A B A B ...) over rounds; each round's ratio to glibc is taken in that
round, and the medians of ns/op and of the same-round ratios are reported, pooled over several
fresh processes (memory layouts; see roundtrip()).  The "fill only" row is the floor under every
candidate: the memset alone, into one buffer.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import threading
from functools import partial
from pathlib import Path

from _common import Config, Progress

import arenalib

HERE = Path(__file__).resolve().parent
TITLE = "4b. The C level through `cimport arenalib` (issue 5)"
SIZES = [8, 64, 512, 1024, 4096, 65536]
FRAME_SIZE = 64  # issue 26's C-level frame: mark + carve 64 B + rewind


def build_kernels(name: str = "arenalib_bench_kernels"):
    """Build (once) and import a Cython kernel module of bench/native/: ``arenalib_bench_kernels``,
    ``arenalib_bench_table`` (its arena loops through the function table), or
    ``arenalib_bench_uring`` (bench/uring.py's liburing loops)."""
    # One build per interpreter and venv: a free-threaded 3.13t cannot load what 3.13 built (the
    # ABI differs: "init function ... returned uninitialized object"), nor should an ASan venv share.
    version = f"py{sys.version_info[0]}.{sys.version_info[1]}{sys.abiflags}"
    tag = Path(sys.prefix).name if sys.prefix != sys.base_prefix else version
    build = HERE.parent / "build" / f"bench-native-{tag}"
    source = HERE / "native"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    meson = [sys.executable, "-m", "mesonbuild.mesonmain"]
    if not (build / "build.ninja").exists():
        shutil.rmtree(build, ignore_errors=True)
        native = build.parent / f"bench-native-{tag}.ini"
        native.parent.mkdir(parents=True, exist_ok=True)
        cython = bin_dir / "cython"
        native.write_text(f"[binaries]\npython = '{sys.executable}'\ncython = '{cython}'\n")
        subprocess.run([*meson, "setup", str(build), str(source), f"--native-file={native}"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([*meson, "compile", "-C", str(build)], check=True, env=env, stdout=subprocess.DEVNULL)
    built = build / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not built.exists():
        raise ImportError(f"bench/native/ built no {name} module (for arenalib_bench_uring: liburing's "
                          "source was not found; python3 dev.py setup fetches it)")
    spec = importlib.util.spec_from_file_location(name, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def roundtrip(quick: bool, progress=None) -> dict:
    """Panama's experiment at C level: median ns/op and same-round ratios to malloc+fill+free.

    The rounds are run in several fresh processes and pooled.  In one process, where the stack,
    the heap and the code happen to lie decides which candidate's stores and loads alias (seen
    here: the same binary at 512 B measured 6.3 ns in one process and 8.2 ns in the next, glibc's
    malloc once 16 ns instead of 6.3); a single layout would hand one candidate that luck for
    the whole run (Mytkowicz et al., "Producing wrong data without doing anything obviously
    wrong!", ASPLOS 2009).  Each process also gets an environment of a different size, which
    moves its stack even where ASLR is off."""
    processes = 3 if quick else 5
    pooled: dict = {}
    for index in range(processes):
        env = {**os.environ, "ARENALIB_BENCH_LAYOUT": "x" * (index * 1000 % 4096)}
        command = [sys.executable, str(Path(__file__).resolve()), "--roundtrip-process"]
        output = subprocess.run(command + ([] if quick else ["--full"]), env=env, check=True,
                                capture_output=True, text=True).stdout
        for size, row in json.loads(output).items():
            for name, values in row.items():
                merged = pooled.setdefault(int(size), {}).setdefault(
                    name, {"samples": [], "ratios": []})
                merged["samples"] += values["samples"]
                merged["ratios"] += values["ratios"]
        if progress:
            progress(f"native roundtrip, process {index + 1} of {processes}")
    return {
        size: {name: {"ns_per_op": statistics.median(values["samples"]),
                      "ratio_to_malloc": statistics.median(values["ratios"])}
               for name, values in row.items()}
        for size, row in pooled.items()
    }


def roundtrip_samples(kernels, table, quick: bool) -> dict:
    """One process's share of roundtrip(): every round's ns/op and ratio to malloc, per size.
    ``table``: the same arena loops built against the table-only C API (cimport arenalib)."""
    rounds = 3 if quick else 5
    confined = arenalib.ConfinedArena()
    shared = arenalib.Arena()
    slicing = arenalib.SlicingArena()
    results = {}
    try:
        for size in SIZES:
            n = max(20_000, (400_000 if quick else 2_000_000) // max(1, size // 512))
            candidates = {
                "fill only (floor)": partial(kernels.fill_only, n, size),
                "malloc+fill+free": partial(kernels.malloc_fill_free, n, size),
                "calloc+fill+free": partial(kernels.calloc_fill_free, n, size),
                "ConfinedArena zero=False": partial(kernels.arena_fill_free, confined, n, size, False),
                "ConfinedArena zero=True": partial(kernels.arena_fill_free, confined, n, size, True),
                "Arena zero=False": partial(kernels.arena_fill_free, shared, n, size, False),
                "Arena zero=True": partial(kernels.arena_fill_free, shared, n, size, True),
                "SlicingArena (reset/100)": partial(kernels.slicing_fill, slicing, n, size, 100),
                "scope open+alloc+fill+close": partial(kernels.scope_open_allocate_close, n, size),
                # The literal scope target: open + allocate + close against malloc + free.
                "malloc+free (no fill)": partial(kernels.malloc_free, n, size),
                "scope open+alloc+close (no fill)": partial(
                    kernels.scope_open_allocate_close, n, size, False),
                # A pair with nothing between, inline and through the function table (issue 24:
                # the table's call may cost at most 2x the inline pair).
                "ConfinedArena pair (no fill)": _pair_ns(kernels, confined, n, size),
                "ConfinedArena pair via table (no fill)": _pair_ns(table, confined, n, size),
                "ConfinedArena via table zero=False": partial(
                    table.arena_fill_free, confined, n, size, False),
                # A frame per op (issue 26): mark, carve, rewind, inline and through the table.
                "frame mark+carve+rewind (no fill)": partial(
                    kernels.mark_carve_rewind, slicing, n, size),
                "frame via table (no fill)": partial(table.mark_carve_rewind, slicing, n, size),
            }
            row = {name: {"samples": [], "ratios": []} for name in candidates}
            for fn in candidates.values():  # warm-up
                fn()
            for _ in range(rounds):
                this_round = {name: fn() for name, fn in candidates.items()}
                for name, value in this_round.items():
                    baseline = "malloc+free (no fill)" if "no fill" in name else "malloc+fill+free"
                    row[name]["samples"].append(value)
                    row[name]["ratios"].append(value / this_round[baseline])
            results[size] = row
    finally:
        confined.close()
        shared.close()
        slicing.close()
    return results


def _pair_ns(kernels, arena, n: int, size: int):
    """ns per allocate/free pair of ``arena`` through ``kernels``' arena_alloc_free_pairs."""
    return lambda: kernels.arena_alloc_free_pairs(arena, n, size)[0]


def threads(kernels, quick: bool, progress=None) -> dict:
    """LWJGL's experiment: allocate/free pairs per thread, 1 and 2 threads, scaling factor.

    The kernels wait at a start line (spinning, without the GIL) until every thread has arrived,
    then time themselves; throughput is counted over the interval they report (first start to
    last end, on CLOCK_MONOTONIC), so thread start-up is not measured and two threads that did
    not really overlap show no scaling.  The issue's 10 million pairs per thread in both modes: with
    fewer, the loops end within a few milliseconds, before the second core has woken up."""
    per_thread = 10_000_000
    rounds = 3 if quick else 5
    results = {}

    def run(thread_count, make_call):
        outcomes = []
        kernels.set_start_line(thread_count)

        def worker():
            outcomes.append(make_call()())

        workers = [threading.Thread(target=worker) for _ in range(thread_count)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        start = min(start for _, start, _ in outcomes)
        end = max(end for _, _, end in outcomes)
        return {"ns_per_op": statistics.mean(ns for ns, _, _ in outcomes),
                "ops_per_s": thread_count * per_thread / ((end - start) * 1e-9)}

    for size in (8, 1024):
        shared = arenalib.Arena()
        candidates = {
            "malloc+free": partial(_malloc_call, kernels, per_thread, size),
            "ConfinedArena per thread": partial(_confined_call, kernels, per_thread, size),
            "shared Arena": partial(_shared_call, kernels, shared, per_thread, size),
        }
        for name, make_call in candidates.items():
            ones, twos, scalings = [], [], []
            for _ in range(rounds):
                one = run(1, make_call)
                two = run(2, make_call)
                ones.append(one["ns_per_op"])
                twos.append(two["ns_per_op"])
                scalings.append(two["ops_per_s"] / one["ops_per_s"])
            results[f"{name} {size} B"] = {
                "1 thread ns/op": statistics.median(ones),
                "2 threads ns/op": statistics.median(twos),
                "scaling": statistics.median(scalings),
            }
            if progress:
                progress(f"native threads {name} {size} B")
        shared.close()
    return results


# Each makes, in the worker thread, the call that worker times.
def _malloc_call(kernels, n, size):
    return partial(kernels.malloc_free_pairs, n, size)


def _confined_call(kernels, n, size):
    arena = arenalib.ConfinedArena()  # made by the worker thread: it owns it
    return lambda: _closing(arena, kernels.arena_alloc_free_pairs(arena, n, size))


def _shared_call(kernels, arena, n, size):
    return partial(kernels.arena_alloc_free_pairs, arena, n, size)


def _closing(arena, value):
    arena.close()
    return value


def c_targets(roundtrip_results: dict, thread_results: dict) -> list[dict]:
    """The issue's targets, each with the measured ratio and whether it is met.  A roundtrip
    target also carries the fill alone as a ratio (``floor``): no allocator can go below it, so a
    bound under the floor cannot be met by any candidate."""
    checks = []
    for size, row in roundtrip_results.items():
        floor = row["fill only (floor)"]["ratio_to_malloc"]
        checks.append(("ConfinedArena alloc+fill+free <= 1.0x malloc+fill+free", size,
                       row["ConfinedArena zero=False"]["ratio_to_malloc"], 1.0, floor))
        if size <= 1024:
            checks.append(("SlicingArena <= 0.33x malloc+fill+free", size,
                           row["SlicingArena (reset/100)"]["ratio_to_malloc"], 0.33, floor))
        elif size == 4096:
            checks.append(("SlicingArena <= 1.0x malloc+fill+free", size,
                           row["SlicingArena (reset/100)"]["ratio_to_malloc"], 1.0, floor))
        checks.append(("scope open+alloc+fill+close <= 1.0x malloc+fill+free", size,
                       row["scope open+alloc+fill+close"]["ratio_to_malloc"], 1.0, floor))
        if "ConfinedArena pair via table (no fill)" in row:
            checks.append(("pair via the table <= 2.0x the inline pair", size,
                           row["ConfinedArena pair via table (no fill)"]["ns_per_op"]
                           / row["ConfinedArena pair (no fill)"]["ns_per_op"], 2.0, None))
        if size == FRAME_SIZE and "frame mark+carve+rewind (no fill)" in row:
            frame = row["frame mark+carve+rewind (no fill)"]
            checks.append(("frame mark+carve+rewind <= 0.6x malloc+free (issue 26)", size,
                           frame["ratio_to_malloc"], 0.6, None))
            checks.append(("frame mark+carve+rewind <= 3 ns (issue 26; ns, not a ratio)", size,
                           frame["ns_per_op"], 3.0, None))
        if "scope open+alloc+close (no fill)" in row:
            checks.append(("scope open+alloc+close <= 1.0x malloc+free", size,
                           row["scope open+alloc+close (no fill)"]["ratio_to_malloc"], 1.0, None))
    for name, row in thread_results.items():
        if name.startswith("ConfinedArena"):
            checks.append((f"2-thread scaling >= 1.9x ({name})", None, row["scaling"], 1.9, None))
    out = []
    for label, size, value, bound, floor in checks:
        met = value >= bound if "scaling" in label else value <= bound
        out.append({"target": label, "size": size, "value": value, "bound": bound, "met": met,
                    "floor": floor})
    return out


def measure(quick: bool, say=None) -> dict:
    """Both experiments and their targets; ``say(message)`` after each step."""
    kernels = build_kernels()
    rt = roundtrip(quick, say)
    th = threads(kernels, quick, say)
    return {"roundtrip": rt, "threads": th, "targets": c_targets(rt, th)}


def plan(cfg: Config) -> float:
    """Estimated milliseconds (full mode took ~23 s on 2 cores)."""
    return 23_000 if cfg.mode == "full" else 12_000


def run(cfg: Config, progress: Progress) -> dict:
    return measure(cfg.mode != "full", progress.set_label)


# -- reading the results back (tables; also from a results.json) ----------------------------------

def plots(results: dict, out, plt) -> list[str]:
    from _plot import native_plots  # the plot is drawn in bench/_plot.py
    return native_plots(results, out, plt)


def _by_size(result: dict) -> dict:
    """run()'s roundtrip figures keyed by int size again (a results.json's keys are str)."""
    return {int(size): row for size, row in result["roundtrip"].items()}


def targets(result: dict) -> list[dict]:
    """c_targets() recomputed from the figures (an older results.json gets today's targets), each
    target's sizes together."""
    checks = []
    for t in sorted(c_targets(_by_size(result), result["threads"]), key=lambda t: t["target"]):
        checks.append({"target": f"C level (issue 5): {t['target']}", "label": "cimport arenalib",
                       "size": t["size"], "ratio": t["value"], "limit": t["bound"], "floor": t["floor"],
                       "status": "MET" if t["met"] else "MISSED"})
    return checks


def target_line(c: dict) -> str:
    """As the C level's targets were always printed, the fill alone beside: no allocator goes below it."""
    note = ""
    if c["floor"] is not None:
        below = " (the bound is below it)" if c["floor"] > c["limit"] else ""
        note = f"   [the fill alone: {c['floor']:.2f}{below}]"
    size = f"at {c['size']} B" if c["size"] else "measured"
    return f"{c['status']:6s} {size}: {c['ratio']:.2f}{note}"


def tables(result: dict, markdown: bool = False) -> str:
    """Per op at each size and the threads' pairs (the targets are in the checklist); in markdown, the
    same text in a code block."""
    rt = _by_size(result)
    out = ["```"] if markdown else ["C level through `cimport arenalib` (issue 5)", ""]
    out.append("C level, per op (ns) and ratio to malloc+fill+free measured in the same round "
               "(the no-fill rows: to malloc+free)")
    names = list(next(iter(rt.values())))
    out.append(f"{'candidate':38s}" + "".join(f"{size:>13d}" for size in rt))
    for name in names:
        cells = "".join(f"{row[name]['ns_per_op']:6.1f}({row[name]['ratio_to_malloc']:4.2f}x)"
                        for row in rt.values())
        out.append(f"{name:38s}{cells}")
    out += ["", "C level, allocate/free pairs per thread"]
    for name, row in result["threads"].items():
        out.append(f"{name:34s} 1 thread {row['1 thread ns/op']:6.1f} ns/op   2 threads "
                   f"{row['2 threads ns/op']:6.1f} ns/op   scaling {row['scaling']:4.2f}x")
    if markdown:
        out.append("```")
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--roundtrip-process", action="store_true",
                        help="(internal) one process's rounds of the roundtrip, as JSON")
    args = parser.parse_args()
    if args.roundtrip_process:
        print(json.dumps(roundtrip_samples(build_kernels(), build_kernels("arenalib_bench_table"),
                                           quick=not args.full)))
    else:
        result = measure(not args.full, lambda m: print(m, file=sys.stderr))
        print(tables(result))
        print("\nTargets (C level)")
        for check in targets(result):
            print(f"  {check['target']}: {target_line(check)}")
