"""Experiment 3, many threads allocating (the LWJGL observation) at Python level.

What it measures: throughput of the allocate + fill(3) + free round trip when 1 and then 2 Python
threads run it at once, in total ops/s, and the scaling factor ops/s(2 threads) / ops/s(1 thread).

How:
* The candidates are bytearray (the peer of experiment 1: ``bytearray(n)[:] = pattern``), a
  ConfinedArena per thread (each thread creates its own, as confinement requires), and one Arena shared
  by all threads; arenalib runs ``alloc(n, zero=False).fill(3).free()``.  The loops are the ones of
  experiment 1 (same generated code, callables bound as locals), at 512 B and 64 KiB.
* Every thread runs the same fixed number of operations, calibrated so one thread alone takes about
  ``thread_seconds``; the threads start together at a barrier and the wall time runs from the barrier
  to the last thread's end.  Rounds interleave the candidates and thread counts; the report gives
  median ops/s and the median of same-round scaling factors.
* Python-level threads share the GIL: neither bytearray nor arenalib releases it for a fill this
  small, so the scaling at Python level is bounded by 1.0 (two threads take turns).  What the
  experiment shows is the cost of contention (GIL hand-offs, the shared Arena's bookkeeping), not
  parallel speed-up; C-level scaling belongs to the cimport issue.
"""

from __future__ import annotations

import gc
import threading
import time

import roundtrip
from _common import Config, Progress, same_round_ratio, summarize

SIZES = (512, 65536)
THREADS = (1, 2)
CANDIDATES = {
    "bytearray": "bytearray(n)+fill",
    "ConfinedArena": "ConfinedArena per thread",
    "Arena_shared": "Arena shared",
}


def _candidate(key: str) -> roundtrip.Candidate:
    wanted = {"bytearray": "bytearray", "ConfinedArena": "ConfinedArena_nz", "Arena_shared": "Arena_nz"}[key]
    for c in roundtrip.candidates():
        if c.key == wanted:
            return c
    raise KeyError(key)


def _measure(key: str, cand: roundtrip.Candidate, n: int, threads: int, ops_per_thread: int,
             shared_env: dict | None) -> float:
    """Wall seconds for ``threads`` threads each running ops_per_thread operations."""
    inner = roundtrip.inner_count(n)
    outer = max(1, ops_per_thread // inner)
    barrier = threading.Barrier(threads + 1)
    done: list[float] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            env = shared_env if shared_env is not None else cand.setup(n)
            fn = roundtrip.make_runner(cand, n, {k: v for k, v in env.items() if not k.startswith("_")})
            fn(1)  # warm this thread's path (tcache, freelists)
            barrier.wait()
            fn(outer)
            done.append(time.perf_counter())
            if shared_env is None and cand.teardown:
                cand.teardown(env)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for w in workers:
            w.start()
        barrier.wait()
        t0 = time.perf_counter()
        for w in workers:
            w.join()
    finally:
        if gc_was:
            gc.enable()
    if errors:
        raise errors[0]
    return max(done) - t0


def plan_units(cfg: Config) -> float:
    """Estimated milliseconds: per size, calibration and rounds of 1 + 2 threads per candidate."""
    ms = cfg.thread_seconds * 1000
    return len(SIZES) * len(CANDIDATES) * ms * (2 + 3 * cfg.thread_rounds)


def run(cfg: Config, progress: Progress) -> dict:
    cands = {key: _candidate(key) for key in CANDIDATES}
    results: dict = {
        "method": {
            "sizes": list(SIZES), "threads": list(THREADS), "rounds": cfg.thread_rounds,
            "seconds_single_thread": cfg.thread_seconds,
            "note": "Python threads share the GIL: scaling at Python level is bounded by 1.0",
            "switch_interval_s": __import__("sys").getswitchinterval(),
        },
        "candidates": {key: {"label": label, "op": cands[key].op} for key, label in CANDIDATES.items()},
        "cells": {},
    }
    for n in SIZES:
        progress.set_label(f"threads n={n}: calibrating")
        shared = {}
        ops = {}
        for key, cand in cands.items():
            shared[key] = cand.setup(n) if key == "Arena_shared" else None
            # calibrate with one thread: double until >= 1/8 of the target, then scale
            count = 1024
            while True:
                dt = _measure(key, cand, n, 1, count, shared[key])
                if dt >= cfg.thread_seconds / 8:
                    break
                count *= 4
            ops[key] = max(1024, int(count * cfg.thread_seconds / dt))
        ms = cfg.thread_seconds * 1000
        progress.step(f"threads n={n}: calibrated", len(cands) * ms * 2)
        per_round: dict[tuple[str, int], list[float]] = {(k, t): [] for k in cands for t in THREADS}
        combos = [(k, t) for k in cands for t in THREADS]
        for rnd in range(cfg.thread_rounds):
            shift = rnd % len(combos)
            for key, t in combos[shift:] + combos[:shift]:
                dt = _measure(key, cands[key], n, t, ops[key], shared[key])
                inner = roundtrip.inner_count(n)
                total_ops = t * max(1, ops[key] // inner) * inner
                per_round[(key, t)].append(total_ops / dt)
            progress.step(f"threads n={n}: round {rnd + 1}/{cfg.thread_rounds}", len(cands) * ms * 3)
        for key, cand in cands.items():
            if shared[key] is not None and cand.teardown:
                cand.teardown(shared[key])
            cell = {}
            for t in THREADS:
                cell[str(t)] = {"ops_per_s": summarize(per_round[(key, t)]),
                                "per_round_ops_per_s": [round(x) for x in per_round[(key, t)]]}
            cell["scaling"] = same_round_ratio(per_round[(key, 2)], per_round[(key, 1)])
            cell["ops_per_thread"] = ops[key]
            results["cells"].setdefault(key, {})[str(n)] = cell
    return results
