"""Experiment 3, many threads allocating (the LWJGL observation) at Python level.

What it measures: throughput of one buffer round trip (get n bytes, fill them with byte 3, give them
back) when 1 and then 2 Python threads run it at once, in total ops/s, the scaling factor
ops/s(2 threads) / ops/s(1 thread), and each candidate's single-thread time per op relative to
bytearray's (its ratio to bytearray, measured in the same round).

How:
* Candidates, each one statement put into experiment 1's generated loop (bench/roundtrip.py:
  ``make_runner``, callables bound as locals, the same inner batch k at a size):
  - peers, nothing shared between the threads: ``bytearray(n)[:] = pattern`` (experiment 1's
    bytearray, the baseline of the ratios), ``bytearray(b"\\x03") * n`` (malloc + memset, no copy)
    and ``numpy.empty(n, uint8).fill(3)`` (left out with a note where numpy is missing);
  - ``alloc(n, zero=False).fill(3).free()`` on a ConfinedArena per thread (each thread creates its
    own, as confinement requires) and on one Arena shared by the threads;
  - ``release(acquire().fill(3))`` on a BufferPool per thread (``BufferPool(n, 64)`` made by each
    thread) and on one BufferPool shared by the threads (64 buffers per thread);
  - the peer of the shared pool: one ``queue.SimpleQueue`` shared by the threads, pre-filled with 64
    ``bytearray(n)`` per thread, ``b = get(); b[:] = pattern; put(b)``.
* Every thread builds its own locals (bound methods, the fill pattern, its own int object for n),
  even from a shared object: what the threads share is only what the candidate shares (the Arena,
  the pool, the queue), not an artefact of the benchmark (on a free-threaded build every reference
  taken to an object another thread owns is an atomic add on its shared reference count).
* Every thread runs the same fixed number of operations, calibrated so one thread alone takes about
  ``thread_seconds``; the threads start together at a barrier and the wall time runs from the barrier
  to the last thread's end.  Rounds interleave the candidates and thread counts (the order rotating
  by one each round); the report gives median ops/s, the median of same-round scaling factors and the
  median of same-round single-thread ratios to bytearray.

What bounds the scaling:
* With the GIL (every CPython but a free-threaded build, and a free-threaded one whose GIL an
  extension turned back on): Python threads take turns; neither bytearray nor arenalib releases the
  GIL for a fill this small, so the scaling at Python level is bounded by 1.0 and the experiment
  shows the cost of contention (GIL hand-offs, a shared object's bookkeeping), not a speed-up.
* Free-threaded, GIL off (3.13t): the threads run Python code in parallel, so the scaling can reach
  2.0 on two idle cores; what the threads share (a shared Arena's or pool's lock, the queue's lock,
  the reference counts of shared objects) and the machine's memory bandwidth (64 KiB fills) take
  it below.  The issue's targets (issue 13) apply here: a ConfinedArena per thread and a BufferPool
  per thread >= 1.8, one shared Arena >= 1.6; they are reported as n/a when the GIL is on.  The
  single-thread ratios to bytearray differ from the GIL build's where the interpreter differs: 3.13t
  runs without the specialising interpreter, which makes the loop and call overhead that every
  candidate shares (and the method calls arenalib's statements make more of) slower.
* With fewer than 2 usable CPUs, or other processes busy on them, the scaling is bounded by the
  CPU time the threads get, whatever the interpreter: the result records the usable CPUs and the
  load average.
* The baseline's fill is a memcpy (the slice assignment; the queue's too), the others' a memset.
  glibc copies 64 KiB with ``rep movsb``, which some x86 CPUs (AMD EPYC with glibc 2.36 here) run
  over 10x slower for some relative placements of source and destination: bytearray(n)+fill at
  64 KiB can then take ~50 us instead of ~3, from one process (or thread, or heap layout) to the
  next, and every ratio to it at 64 KiB with it (GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=
  4194304 avoids it).  bytearray*n is the peer to read those rows against (the JSON has the ratios
  to it too).
C-level scaling (``cimport arenalib``, no interpreter in the loop) belongs to bench/native.py.
"""

from __future__ import annotations

import gc
import os
import queue
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import roundtrip
from _common import BASELINE, Config, Progress, fmt_size, same_round_ratio, summarize, table
from _experiment import finding, side, times

TITLE = "3. Threads"

SIZES = (512, 4096, 65536)
THREADS = (1, 2)
POOL_COUNT = 64          # buffers per thread: a per-thread pool has this many, a shared one this many
                         # times the number of threads (each thread holds at most one at a time)
# issue 13's Python-level scaling targets, on a free-threaded build with the GIL off
TARGET_SCALING = {"ConfinedArena": 1.8, "BufferPool": 1.8, "Arena_shared": 1.6}
# issue 24's: a shared Arena's scaling over bytearray's in the same round, at these sizes
TARGET_SCALING_TO_BASELINE = {"Arena_shared": (0.9, (512, 4096))}


@dataclass
class ThreadCandidate:
    key: str
    label: str
    op: str                                          # the statement timed, once per operation
    thread_env: Callable[[int, dict | None], dict]   # in each thread: (n, shared) -> the loop's names
    shared: Callable[[int, int], dict] | None = None  # once per measurement: (n, threads) -> shared objects
    close_thread: Callable[[dict], None] | None = None
    close_shared: Callable[[dict], None] | None = None
    note: str = ""
    skipped: str | None = None
    batch: str = "pass"                              # roundtrip.make_runner's statement per batch


def _own(n: int) -> int:
    """An int equal to n that the calling thread creates (and so owns on a free-threaded build)."""
    return int.from_bytes(n.to_bytes(8, "little"), "little")


def candidates() -> list[ThreadCandidate]:
    import arenalib

    def bytearray_env(n: int, shared: dict | None) -> dict:
        return {"ba": bytearray, "pattern": bytearray(b"\x03") * n, "n": _own(n)}

    out = [ThreadCandidate(BASELINE, "bytearray(n)+fill", "ba(n)[:] = pattern", bytearray_env,
                           note="experiment 1's peer: bytearray(n) zeroes, slice assignment copies")]

    def repeat_env(n: int, shared: dict | None) -> dict:
        return {"b3": bytearray(b"\x03"), "n": _own(n)}

    out.append(ThreadCandidate("bytearray_repeat", "bytearray*n", "b3 * n", repeat_env,
                               note="malloc + memset, no copy: the peer unaffected by memcpy's moods"))
    try:
        import numpy
    except ImportError as exc:
        numpy, skipped = None, f"numpy unavailable: {exc}"
    else:
        skipped = None

    def numpy_env(n: int, shared: dict | None) -> dict:
        return {"empty": numpy.empty, "u8": numpy.uint8, "n": _own(n)}

    out.append(ThreadCandidate("numpy_empty", "numpy.empty+fill", "empty(n, u8).fill(3)", numpy_env,
                               skipped=skipped))

    def confined_env(n: int, shared: dict | None) -> dict:
        arena = arenalib.ConfinedArena()
        return {"alloc": arena.allocate, "n": _own(n), "_close": arena.close}

    def shared_arena(n: int, threads: int) -> dict:
        arena = arenalib.Arena()
        return {"arena": arena, "_close": arena.close}

    def arena_env(n: int, shared: dict | None) -> dict:
        return {"alloc": shared["arena"].allocate, "n": _own(n)}

    def own_pool_env(n: int, shared: dict | None) -> dict:
        pool = arenalib.BufferPool(n, POOL_COUNT)
        return {"acquire": pool.acquire, "release": pool.release, "_close": pool.close}

    def shared_pool(n: int, threads: int) -> dict:
        pool = arenalib.BufferPool(n, POOL_COUNT * threads)
        return {"pool": pool, "_close": pool.close}

    def pool_env(n: int, shared: dict | None) -> dict:
        return {"acquire": shared["pool"].acquire, "release": shared["pool"].release}

    def shared_queue(n: int, threads: int) -> dict:
        q: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(POOL_COUNT * threads):
            q.put(bytearray(n))
        return {"queue": q}

    def queue_env(n: int, shared: dict | None) -> dict:
        return {"get": shared["queue"].get, "put": shared["queue"].put,
                "pattern": bytearray(b"\x03") * n}

    def close(env: dict) -> None:
        env["_close"]()

    arena_op = "alloc(n, zero=False).fill(3).free()"
    pool_op = "release(acquire().fill(3))"
    out += [
        ThreadCandidate("ConfinedArena", "ConfinedArena per thread", arena_op, confined_env,
                        close_thread=close, note="each thread creates (and closes) its own"),
        ThreadCandidate("Arena_shared", "Arena shared", arena_op, arena_env, shared=shared_arena,
                        close_shared=close),
        ThreadCandidate("BufferPool", "BufferPool per thread", pool_op, own_pool_env, close_thread=close,
                        note=f"each thread creates (and closes) its own BufferPool(n, {POOL_COUNT})"),
        ThreadCandidate("BufferPool_shared", "BufferPool shared", pool_op, pool_env, shared=shared_pool,
                        close_shared=close, note=f"one BufferPool(n, {POOL_COUNT} * threads)"),
        ThreadCandidate("SimpleQueue_shared", "SimpleQueue of bytearrays shared",
                        "b = get(); b[:] = pattern; put(b)", queue_env, shared=shared_queue,
                        note=f"peer of the shared pool: {POOL_COUNT} * threads bytearray(n) buffers"),
    ]
    return out


# -- the interpreter ------------------------------------------------------------------------------

def gil_enabled() -> bool:
    check = getattr(sys, "_is_gil_enabled", None)
    return True if check is None else bool(check())


def interpreter() -> dict:
    """Which CPython runs this, and whether its GIL is on (an extension may have turned it back on)."""
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil = gil_enabled()
    version = sys.version.split()[0]
    if free_threaded:
        kind = "free-threaded, GIL on" if gil else "free-threaded, GIL off"
    else:
        kind = "GIL"
    return {
        "version": version, "implementation": sys.implementation.name, "free_threaded_build": free_threaded,
        "gil_enabled": gil, "description": f"{sys.implementation.name} {version} ({kind})",
        # the free-threaded build of 3.13 runs without the specialising adaptive interpreter
        "specialising_interpreter": not (free_threaded and sys.version_info < (3, 14)),
        "switch_interval_s": sys.getswitchinterval(),
    }


def _note(interp: dict, cpus: int | None) -> str:
    if interp["gil_enabled"]:
        text = ("Python threads share the GIL: scaling at Python level is bounded by 1.0; "
                "the issue-13 scaling targets apply to a free-threaded build with the GIL off")
    else:
        text = ("GIL off: threads run Python code in parallel, scaling up to ~2.0 on 2 idle cores, less "
                "for what the threads share (a shared Arena's or pool's lock, the queue, reference counts)")
        if not interp["specialising_interpreter"]:
            text += ("; this build runs without the specialising interpreter, so single-thread ratios "
                     "to bytearray differ from the GIL build's")
    if cpus is not None and cpus < 2:
        text += f"; only {cpus} usable CPU: scaling is bounded by 1.0 whatever the interpreter"
    return text


# -- measuring ------------------------------------------------------------------------------------

def _measure(cand: ThreadCandidate, n: int, threads: int, ops_per_thread: int) -> float:
    """Wall seconds for ``threads`` threads each running ops_per_thread operations."""
    inner = roundtrip.inner_count(n)
    outer = max(1, ops_per_thread // inner)
    barrier = threading.Barrier(threads + 1)
    done: list[float] = []
    errors: list[BaseException] = []
    shared = cand.shared(n, threads) if cand.shared else None

    def worker() -> None:
        env = None
        try:
            env = cand.thread_env(n, shared)
            fn = roundtrip.make_runner(cand, n, {k: v for k, v in env.items() if not k.startswith("_")})
            fn(1)  # warm this thread's path (tcache, freelists)
            barrier.wait()
            fn(outer)
            done.append(time.perf_counter())
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            barrier.abort()
        finally:
            if env is not None and cand.close_thread:
                cand.close_thread(env)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for w in workers:
            w.start()
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass  # a worker failed before the start: its error is raised below
        t0 = time.perf_counter()
        for w in workers:
            w.join()
    finally:
        if gc_was:
            gc.enable()
        if shared is not None and cand.close_shared:
            cand.close_shared(shared)
    if errors:
        raise errors[0]
    return max(done) - t0


def plan(cfg: Config) -> float:
    """Estimated milliseconds: per size, calibration and rounds of 1 + 2 threads per candidate."""
    ms = cfg.thread_seconds * 1000
    count = sum(1 for c in candidates() if not c.skipped)
    return len(SIZES) * count * ms * (2 + 3 * cfg.thread_rounds)


def _target(key: str, scaling: float, gil: bool) -> dict | None:
    limit = TARGET_SCALING.get(key)
    if limit is None:
        return None
    status = "n/a (GIL on)" if gil else ("MET" if scaling >= limit else "MISSED")
    return {"min_scaling": limit, "status": status}


def run(cfg: Config, progress: Progress) -> dict:
    all_cands = candidates()
    for c in all_cands:
        if c.skipped:
            progress.note(f"threads: skipping {c.label}: {c.skipped}")
    cands = {c.key: c for c in all_cands if not c.skipped}
    interp = interpreter()  # after arenalib and numpy are imported: either may turn the GIL back on
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    results: dict = {
        "method": {
            "sizes": list(SIZES), "threads": list(THREADS), "rounds": cfg.thread_rounds,
            "seconds_single_thread": cfg.thread_seconds,
            "note": _note(interp, cpus),
            "switch_interval_s": sys.getswitchinterval(),
            "interpreter": interp, "cpus_usable": cpus,
            "ratio": "median over rounds of (candidate time per op / bytearray time per op in the same "
                     "round), with 1 thread (and with 2 threads, total ops/s)",
            "baseline": BASELINE, "target_scaling": TARGET_SCALING,
            "ratio_to_bytearray_repeat": "the same, to bytearray*n (memset, no memcpy)",
        },
        "candidates": {c.key: {"label": c.label, "op": c.op, "shared": c.shared is not None,
                               "note": c.note, "skipped": c.skipped} for c in all_cands},
        "cells": {},
    }
    ms = cfg.thread_seconds * 1000
    for n in SIZES:
        progress.set_label(f"threads n={n}: calibrating")
        ops = {}
        for key, cand in cands.items():
            # calibrate with one thread: grow until >= 1/8 of the target, then scale
            count = 1024
            while True:
                dt = _measure(cand, n, 1, count)
                if dt >= cfg.thread_seconds / 8:
                    break
                count *= 4
            ops[key] = max(1024, int(count * cfg.thread_seconds / dt))
        progress.step(f"threads n={n}: calibrated", len(cands) * ms * 2)
        per_round: dict[tuple[str, int], list[float]] = {(k, t): [] for k in cands for t in THREADS}
        combos = [(k, t) for k in cands for t in THREADS]
        inner = roundtrip.inner_count(n)
        for rnd in range(cfg.thread_rounds):
            shift = rnd % len(combos)
            for key, t in combos[shift:] + combos[:shift]:
                dt = _measure(cands[key], n, t, ops[key])
                total_ops = t * max(1, ops[key] // inner) * inner
                per_round[(key, t)].append(total_ops / dt)
            progress.step(f"threads n={n}: round {rnd + 1}/{cfg.thread_rounds}", len(cands) * ms * 3)
        for key in cands:
            cell: dict = {}
            for t in THREADS:
                cell[str(t)] = {"ops_per_s": summarize(per_round[(key, t)]),
                                "per_round_ops_per_s": [round(x) for x in per_round[(key, t)]]}
            cell["scaling"] = same_round_ratio(per_round[(key, 2)], per_round[(key, 1)])
            # time per op relative to bytearray's = bytearray's ops/s over the candidate's
            cell["ratio_to_baseline"] = {
                str(t): same_round_ratio(per_round[(BASELINE, t)], per_round[(key, t)]) for t in THREADS}
            if "bytearray_repeat" in cands:
                cell["ratio_to_bytearray_repeat"] = {
                    str(t): same_round_ratio(per_round[("bytearray_repeat", t)], per_round[(key, t)])
                    for t in THREADS}
            cell["ns_per_op_1_thread"] = 1e9 / cell["1"]["ops_per_s"]["median"]
            cell["ops_per_thread"] = ops[key]
            target = _target(key, cell["scaling"]["median"], interp["gil_enabled"])
            if target:
                cell["target"] = target
            # the scaling over bytearray's, round by round: both met the same machine load
            cell["scaling_to_baseline"] = summarize([
                (a2 / a1) / (b2 / b1) for a1, a2, b1, b2 in zip(
                    per_round[(key, 1)], per_round[(key, 2)],
                    per_round[(BASELINE, 1)], per_round[(BASELINE, 2)], strict=True)])
            limit, sizes = TARGET_SCALING_TO_BASELINE.get(key, (None, ()))
            if n in sizes:
                ratio = cell["scaling_to_baseline"]["median"]
                met = "MET" if ratio >= limit else "MISSED"
                cell["target_to_baseline"] = {
                    "min_ratio": limit, "status": "n/a (GIL on)" if interp["gil_enabled"] else met}
            results["cells"].setdefault(key, {})[str(n)] = cell
    results["method"]["gil_enabled_at_end"] = gil_enabled()
    return results


# -- reading the results back (tables; also from a results.json) ----------------------------------



def targets(th: dict) -> list[dict]:
    """Issue 13's scaling targets, as run() decided them in each cell (also the table's last column):
    n/a on a GIL build, where Python threads cannot scale."""
    checks = []
    for key, c in th["candidates"].items():
        for n in th["method"]["sizes"]:
            cell = th["cells"].get(key, {}).get(str(n), {})
            target = cell.get("target")
            if target is None:
                continue
            checks.append({"target": "threads (issue 13): 2-thread scaling at Python level, free-threaded "
                                     "build with the GIL off",
                           "candidate": key, "label": c["label"], "size": n, "limit": target["min_scaling"],
                           "ratio": cell["scaling"]["median"],
                           "status": target["status"] if target["status"] in ("MET", "MISSED") else "n/a",
                           "why": None if target["status"] in ("MET", "MISSED") else NOT_FREE_THREADED})
            relative = cell.get("target_to_baseline")
            if relative is not None:
                status = relative["status"] if relative["status"] in ("MET", "MISSED") else "n/a"
                checks.append({"target": "threads (issue 24): 2-thread scaling over bytearray's in the same "
                                         "run, free-threaded build with the GIL off",
                               "candidate": key, "label": c["label"], "size": n,
                               "limit": relative["min_ratio"], "ratio": cell["scaling_to_baseline"]["median"],
                               "relative": True, "status": status,
                               "why": None if status != "n/a" else NOT_FREE_THREADED})
    return checks


NOT_FREE_THREADED = ("they need a free-threaded build with the GIL off, where Python threads run in parallel "
                     "(python3 dev.py bench --python 3.13t)")


def findings(th: dict) -> list[dict]:
    """The verdict's sentences: on a GIL build, that no Python thread scales (arenalib's figures beside
    bytearray's); free-threaded, arenalib's scaling against bytearray's, per size."""
    cells, names = th["cells"], th["candidates"]
    sizes = th["method"]["sizes"]
    ours = [k for k in ("ConfinedArena", "BufferPool", "Arena_shared") if k in cells]
    if not ours or BASELINE not in cells:
        return [finding("skip", "Threads: arenalib or its bytearray peer was not measured.")]
    interp = th["method"].get("interpreter") or {"gil_enabled": True, "description": "a GIL build"}

    def scaling(key: str) -> str:
        values = [cells[key][str(n)]["scaling"]["median"] for n in sizes if str(n) in cells[key]]
        return f"{min(values):.2f}-{max(values):.2f}" if values else "-"

    if interp["gil_enabled"]:
        return [finding("skip", f"Threads: {interp['description']} runs one Python thread at a time: "
                                f"2-thread scaling {scaling(ours[0])} for {names[ours[0]]['label']}, "
                                f"{scaling(BASELINE)} "
                                f"for {names[BASELINE]['label']}.")]
    out = []
    for key in ours:
        pairs = [(n, cells[key][str(n)]["scaling"]["median"] / cells[BASELINE][str(n)]["scaling"]["median"])
                 for n in sizes if str(n) in cells[key] and str(n) in cells[BASELINE]]
        parts, kinds = [], set()
        for kind, word in (("win", "better"), ("even", "as well"), ("loss", "worse")):
            shown = [fmt_size(n) + ("" if kind == "even" else f" ({times(r, False).split()[0]})")
                     for n, r in pairs if side(r, lower_is_faster=False) == kind]
            if shown:
                kinds.add(kind)
                parts.append(f"{word} at {', '.join(shown)}")
        if not parts:
            continue
        kind = "loss" if "loss" in kinds else "win" if "win" in kinds else "even"
        out.append(finding(kind, f"Two threads, {names[key]['label']}: scaling {scaling(key)} against "
                                 f"{names[BASELINE]['label']}'s {scaling(BASELINE)}, so it scales "
                                 f"{'; '.join(parts)}.",
                           "what the threads share (a lock, reference counts) or the memory "
                           "bandwidth bounds it" if kind == "loss" else None))
    return out


def plots(th: dict, out, plt) -> list[str]:
    """The 2-thread scaling of every candidate at each size, bars grouped by size."""
    from _plot import bars

    keys = [k for k, c in th["candidates"].items() if not c.get("skipped") and k in th["cells"]]
    sizes = th["method"]["sizes"]
    values = {th["candidates"][k]["label"]: [th["cells"][k].get(str(n), {}).get("scaling", {}).get("median")
                                             for n in sizes] for k in keys}
    return bars(plt, out, "threads_scaling.png", [fmt_size(n) for n in sizes], values,
                ylabel="ops/s with 2 threads / with 1 thread (median)",
                title=f"Threads: 2-thread scaling ({title(th)})", line=1.0)


def target_line(c: dict) -> str:
    gil = " (GIL on: Python threads take turns)" if c["status"] == "n/a" else ""
    what = "scaling over bytearray's" if c.get("relative") else "scaling"
    return (f"{c['status']:6s} {c['label']} at {fmt_size(c['size'])}: {what} {c['ratio']:.2f} "
            f"(at least {c['limit']}){gil}")


def title(th: dict) -> str:
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


def tables(th: dict, markdown: bool = False) -> str:
    """Ops/s with 1 and 2 threads, the scaling and the single-thread ratios; then the method's note."""
    rows = []
    for key, c in th["candidates"].items():
        if c.get("skipped") or key not in th["cells"]:
            continue
        for n in th["method"]["sizes"]:
            cell = th["cells"][key][str(n)]
            ratio = (cell.get("ratio_to_baseline") or {}).get("1")
            ratio_repeat = (cell.get("ratio_to_bytearray_repeat") or {}).get("1")
            target = cell.get("target")
            relative = cell.get("scaling_to_baseline")
            rows.append([c["label"], fmt_size(n),
                         f"{cell['1']['ops_per_s']['median'] / 1e6:.2f}",
                         f"{cell['2']['ops_per_s']['median'] / 1e6:.2f}",
                         f"{cell['scaling']['median']:.2f}",
                         f"{relative['median']:.2f}" if relative else "",
                         f"{ratio['median']:.2f}" if ratio else "",
                         f"{ratio_repeat['median']:.2f}" if ratio_repeat else "",
                         f">= {target['min_scaling']}: {target['status'].split(' ')[0]}" if target else ""])
    heading = (("### " if markdown else "") + f"Threads, {title(th)}.  Total Mops/s with 1 and 2 "
               "threads; scaling = 2 threads / 1 thread (and over bytearray's, by round); 1T/x = time per "
               "op with 1 thread over x's (same round), ba = bytearray(n)+fill, ba*n = bytearray*n")
    heads = ["candidate", "size", "1 thread", "2 threads", "scaling", "/bytearray's", "1T/ba", "1T/ba*n",
             "target"]
    keep = [i for i in range(len(heads)) if i < 5 or any(r[i] for r in rows)]  # older JSON lacks some
    text = heading + "\n" + table([heads[i] for i in keep], [[r[i] for i in keep] for r in rows], markdown)
    if markdown:
        return text + "\n\n" + th["method"].get("note", "")
    return text + "\n  " + th["method"]["note"]


if __name__ == "__main__":
    from _common import run_standalone
    run_standalone(sys.modules[__name__])
