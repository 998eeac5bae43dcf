"""Experiment 2, fragmentation and memory handed back (the Blender observation).

What it measures: how much of a process's peak RSS each allocator keeps after the program frees most
of what it allocated, with only a small long-lived survivor set left, after an idle second, and after
the allocator's explicit trim.

How:
* Every candidate runs in a fresh process (this module, run with --child), so no allocator starts
  warm or inherits another's heap.  RSS comes from /proc/self/statm; the peak is the kernel's
  high-water mark (VmHWM, reset at the baseline through /proc/self/clear_refs).
* The workload is drawn from a seeded RNG before the baseline is read, identically for every
  candidate: allocations of log-uniform sizes from 16 B to 64 KiB until ``memory_bytes`` (~1.5 GB) are
  kept.  Each kept allocation belongs at random to one of 4 interleaved "lifetime groups", or, with
  probability 0.5 %, to the long-lived survivor set.  Between them come short-lived temporaries (one
  per two kept allocations on average, same sizes) freed in batches of 64.  Every allocation is
  filled with byte 3, so its pages are resident.
* Phases, each followed by an RSS reading: baseline (interpreter, imports and the plan), peak (during
  the build), freed_most (groups 0-2 freed: 75 % of the bulk), survivors (group 3 and the last
  temporaries freed: only survivors live), idle_1s (time.sleep(1)), trimmed (the candidate's explicit
  trim: glibc's malloc_trim(0) through ctypes for bytearray and numpy; pool.release_unused() for
  pyarrow; arenalib.trim() for arenalib).
* arenalib workloads are written as arenalib is meant to be used: survivors live in their own
  long-lived arena, each lifetime group in its own arena that is closed when the group dies, the
  temporaries in a scratch arena (Arena: each temporary freed with seg.free(); SlicingArena: reset()
  per batch).  Closing an arena that allocated more than 4 MiB purges its memory at once.
* The figures: MB above baseline per phase, and retained/peak = (RSS - baseline) / (peak - baseline).
  The issue's target is retained/peak <= 3 % at "survivors" (right after the arenas closed: no trim,
  no waiting) for arenalib.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from array import array
from pathlib import Path

from _common import Config, Progress, peak_rss_bytes, reset_peak_rss, rss_bytes

GROUPS = 4
SURVIVOR_P = 0.005
TEMP_P = 0.5
TEMP_BATCH = 64
MIN_SIZE, MAX_SIZE = 16, 65536
PHASES = ["baseline", "peak", "freed_most", "survivors", "idle_1s", "trimmed"]

CANDIDATES = {
    "bytearray": ("bytearray", "glibc malloc (pymalloc up to 512 B)", "malloc_trim(0)"),
    "numpy": ("numpy.empty", "glibc malloc", "malloc_trim(0)"),
    "pa_jemalloc": ("pyarrow jemalloc", "pyarrow's jemalloc", "pool.release_unused()"),
    "pa_mimalloc": ("pyarrow mimalloc", "pyarrow's mimalloc", "pool.release_unused()"),
    "pa_system": ("pyarrow system", "glibc malloc via pyarrow", "pool.release_unused()"),
    "Arena": ("arenalib Arena", "arenalib (jemalloc explicit arenas)", "arenalib.trim()"),
    "SlicingArena": ("arenalib SlicingArena", "arenalib (bump chunks on jemalloc)", "arenalib.trim()"),
}
ARENALIB = ("Arena", "SlicingArena")


# -- the workload (child process) -----------------------------------------------------------------

def make_plan(total_bytes: int, seed: int) -> tuple[array, array]:
    """(sizes, kinds): kind 0..GROUPS-1 is a lifetime group, GROUPS a survivor, GROUPS+1 a temporary."""
    rng = random.Random(seed)
    lo, hi = math.log(MIN_SIZE), math.log(MAX_SIZE)
    sizes, kinds = array("I"), array("b")
    kept = 0
    while kept < total_bytes:
        n = int(math.exp(rng.uniform(lo, hi)))
        kind = GROUPS if rng.random() < SURVIVOR_P else rng.randrange(GROUPS)
        sizes.append(n)
        kinds.append(kind)
        kept += n
        if rng.random() < TEMP_P:
            sizes.append(int(math.exp(rng.uniform(lo, hi))))
            kinds.append(GROUPS + 1)
    return sizes, kinds


class Backend:
    """alloc(kind, n) -> a filled object; free_temps(); free_group(g); finish(); trim()."""

    def __init__(self):
        self.groups = [[] for _ in range(GROUPS)]
        self.survivors = []
        self.temps = []

    def _store(self, kind: int, obj) -> None:
        if kind < GROUPS:
            self.groups[kind].append(obj)
        elif kind == GROUPS:
            self.survivors.append(obj)
        else:
            self.temps.append(obj)
            if len(self.temps) >= TEMP_BATCH:
                self.free_temps()

    def free_temps(self) -> None:
        self.temps.clear()

    def free_group(self, g: int) -> None:
        self.groups[g].clear()

    def finish(self) -> None:
        self.free_temps()


def _malloc_trim() -> None:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)


class BytearrayBackend(Backend):
    def __init__(self):
        super().__init__()
        self.b3 = bytearray(b"\x03")

    def alloc(self, kind: int, n: int) -> None:
        self._store(kind, self.b3 * n)

    def trim(self) -> None:
        _malloc_trim()


class NumpyBackend(Backend):
    def __init__(self):
        super().__init__()
        import numpy
        self.empty, self.u8 = numpy.empty, numpy.uint8

    def alloc(self, kind: int, n: int) -> None:
        a = self.empty(n, self.u8)
        a.fill(3)
        self._store(kind, a)

    def trim(self) -> None:
        _malloc_trim()


class PyarrowBackend(Backend):
    def __init__(self, pool_name: str):
        super().__init__()
        import numpy
        import pyarrow
        self.pool = getattr(pyarrow, f"{pool_name}_memory_pool")()
        self.allocate_buffer = pyarrow.allocate_buffer
        self.frombuffer, self.u8 = numpy.frombuffer, numpy.uint8

    def alloc(self, kind: int, n: int) -> None:
        buf = self.allocate_buffer(n, memory_pool=self.pool)
        self.frombuffer(buf, self.u8).fill(3)
        self._store(kind, buf)

    def trim(self) -> None:
        self.pool.release_unused()


class ArenaBackend(Backend):
    def __init__(self):
        super().__init__()
        import arenalib
        self.arenalib = arenalib
        self.survivor_arena = arenalib.Arena()
        self.arenas = [arenalib.Arena() for _ in range(GROUPS)]
        self.scratch = arenalib.Arena()

    def alloc(self, kind: int, n: int) -> None:
        if kind < GROUPS:
            arena = self.arenas[kind]
        elif kind == GROUPS:
            arena = self.survivor_arena
        else:
            arena = self.scratch
        self._store(kind, arena.allocate(n, zero=False).fill(3))

    def free_temps(self) -> None:
        for seg in self.temps:
            seg.free()
        self.temps.clear()

    def free_group(self, g: int) -> None:
        self.groups[g].clear()
        self.arenas[g].close()

    def finish(self) -> None:
        self.free_temps()
        self.scratch.close()

    def trim(self) -> None:
        self.arenalib.trim()


class SlicingBackend(ArenaBackend):
    def __init__(self):
        Backend.__init__(self)
        import arenalib
        self.arenalib = arenalib
        self.survivor_arena = arenalib.SlicingArena()
        self.arenas = [arenalib.SlicingArena() for _ in range(GROUPS)]
        self.scratch = arenalib.SlicingArena()

    def free_temps(self) -> None:
        self.temps.clear()
        self.scratch.reset()


def make_backend(name: str) -> Backend:
    if name == "bytearray":
        return BytearrayBackend()
    if name == "numpy":
        return NumpyBackend()
    if name.startswith("pa_"):
        return PyarrowBackend(name[3:])
    if name == "Arena":
        return ArenaBackend()
    if name == "SlicingArena":
        return SlicingBackend()
    raise SystemExit(f"unknown memory candidate {name!r}")


def child(name: str, total_bytes: int, seed: int) -> dict:
    """Run the workload for one candidate in this (fresh) process; print phases, return figures."""
    import gc

    def phase(label: str) -> None:
        print(f"@phase {label}", flush=True)

    # Imports first: they belong to the baseline, not to the workload.
    if name in ("numpy",) or name.startswith("pa_"):
        import numpy  # noqa: F401
    if name.startswith("pa_"):
        import pyarrow  # noqa: F401
    if name in ARENALIB:
        import arenalib
    sizes, kinds = make_plan(total_bytes, seed)
    gc.collect()
    gc.disable()  # containers of buffers only: no cycles to collect, and no collector pauses
    rss = {}
    seconds = {}
    rss["baseline"] = rss_bytes()
    hwm_ok = reset_peak_rss()
    phase("baseline")

    t0 = time.perf_counter()
    backend = make_backend(name)
    alloc = backend.alloc
    sampled_peak = 0
    for i in range(len(sizes)):
        alloc(kinds[i], sizes[i])
        if not i & 4095:
            sampled_peak = max(sampled_peak, rss_bytes())
    sampled_peak = max(sampled_peak, rss_bytes())
    hwm = peak_rss_bytes() if hwm_ok else None
    rss["peak"] = max(sampled_peak, hwm or 0)
    seconds["build"] = time.perf_counter() - t0
    phase("peak")

    t0 = time.perf_counter()
    for g in range(GROUPS - 1):
        backend.free_group(g)
    seconds["freed_most"] = time.perf_counter() - t0
    rss["freed_most"] = rss_bytes()
    phase("freed_most")

    t0 = time.perf_counter()
    backend.free_group(GROUPS - 1)
    backend.finish()
    seconds["survivors"] = time.perf_counter() - t0
    rss["survivors"] = rss_bytes()
    phase("survivors")

    time.sleep(1.0)
    rss["idle_1s"] = rss_bytes()
    phase("idle_1s")

    t0 = time.perf_counter()
    backend.trim()
    seconds["trimmed"] = time.perf_counter() - t0
    rss["trimmed"] = rss_bytes()
    phase("trimmed")

    survivors = backend.survivors
    kept = sum(sizes[i] for i in range(len(sizes)) if kinds[i] < GROUPS + 1)
    result = {
        "rss": rss,
        "seconds": seconds,
        "allocations": len(sizes),
        "kept_bytes": kept,
        "temp_bytes": sum(sizes[i] for i in range(len(sizes)) if kinds[i] == GROUPS + 1),
        "survivor_count": len(survivors),
        "survivor_bytes": sum(sizes[i] for i in range(len(sizes)) if kinds[i] == GROUPS),
        "peak_source": "VmHWM" if hwm_ok and hwm and hwm >= sampled_peak else "statm samples",
    }
    if name.startswith("pa_"):
        result["pool_bytes_allocated"] = backend.pool.bytes_allocated()
    if name in ARENALIB:
        import arenalib
        result["pool_stats"] = arenalib.pool_stats()
        result["survivor_arena_stats"] = backend.survivor_arena.stats()
    return result


# -- the experiment (parent process) --------------------------------------------------------------

# Estimated milliseconds each phase takes (the build scales with the workload), for the progress bar.
PHASE_MS = {"baseline": 500, "peak": 2500, "freed_most": 200, "survivors": 100, "idle_1s": 1000,
            "trimmed": 200}


def _phase_ms(phase: str, total_bytes: int) -> float:
    return PHASE_MS[phase] * (total_bytes / 1.5e9 if phase == "peak" else 1)


def plan_units(cfg: Config) -> float:
    return len(CANDIDATES) * sum(_phase_ms(p, cfg.memory_bytes) for p in PHASES)


def _available(name: str) -> str | None:
    """Why the candidate cannot run here, or None."""
    if name.startswith("pa_"):
        try:
            import pyarrow
            getattr(pyarrow, f"{name[3:]}_memory_pool")()
        except Exception as exc:
            return f"pyarrow.{name[3:]}_memory_pool() unavailable: {exc}"
    return None


def run(cfg: Config, progress: Progress) -> dict:
    total = cfg.memory_bytes
    results: dict = {
        "method": {
            "memory_bytes": total, "groups": GROUPS, "survivor_probability": SURVIVOR_P,
            "temp_probability": TEMP_P, "temp_batch": TEMP_BATCH, "sizes": [MIN_SIZE, MAX_SIZE],
            "seed": cfg.seed, "phases": PHASES,
            "retained": "(RSS - baseline) / (peak - baseline)",
        },
        "candidates": {},
    }
    for name, (label, allocator, trim) in CANDIDATES.items():
        entry = {"label": label, "allocator": allocator, "trim": trim}
        results["candidates"][name] = entry
        why = _available(name)
        if why:
            entry["skipped"] = why
            progress.note(f"memory: skipping {label}: {why}")
            progress.step(units=sum(_phase_ms(p, total) for p in PHASES))
            continue
        progress.set_label(f"memory {label}: starting")
        # the child runs as this interpreter does (-S too: then PYTHONPATH alone finds the packages)
        cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []),
               str(Path(__file__).resolve()), "--child", name,
               "--bytes", str(total), "--seed", str(cfg.seed)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        payload = None
        start = progress.done
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("@phase "):
                done = line.split()[1]
                upcoming = PHASES[PHASES.index(done) + 1] if done != PHASES[-1] else done
                progress.step(f"memory {label}: {upcoming}", _phase_ms(done, total))
            elif line.startswith("{"):
                payload = json.loads(line)
        stderr = proc.stderr.read() if proc.stderr else ""
        proc.wait()
        progress.sync(start + sum(_phase_ms(p, total) for p in PHASES))
        entry["wall_seconds"] = round(time.perf_counter() - t0, 2)
        if proc.returncode or payload is None:
            entry["error"] = f"child exited {proc.returncode}: {stderr.strip()[-2000:]}"
            progress.note(f"memory: {label} failed: {entry['error']}")
            continue
        entry.update(payload)
        rss = payload["rss"]
        base, growth = rss["baseline"], rss["peak"] - rss["baseline"]
        entry["mb_above_baseline"] = {p: (rss[p] - base) / 1e6 for p in PHASES}
        entry["retained_of_peak"] = {p: ((rss[p] - base) / growth if growth > 0 else None) for p in PHASES}
    return results


def main() -> int:
    import argparse
    parser = argparse.ArgumentParser(description="memory experiment child process")
    parser.add_argument("--child", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=6)
    args = parser.parse_args()
    result = child(args.child, args.bytes, args.seed)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
