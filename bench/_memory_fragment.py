"""Workload 1 of bench/memory.py, "fragment", in the child process memory.py starts for each
candidate (``_memory_fragment.py --child NAME --bytes N --seed S``): a small long-lived survivor set
left among freed lifetime groups and temporaries.  What it measures and how: memory.py's docstring.

Standard library and the candidate's own package only: what this process imports is part of its
baseline RSS.
"""

from __future__ import annotations

import math
import random
import sys
import time
from array import array

from _common import peak_rss_bytes, reset_peak_rss, rss_bytes, run_memory_child

GROUPS = 4
SURVIVOR_P = 0.005
TEMP_P = 0.5
TEMP_BATCH = 64
MIN_SIZE, MAX_SIZE = 16, 65536
PHASES = ["baseline", "peak", "freed_most", "survivors", "idle_1s", "trimmed"]
ARENALIB = ("Arena", "SlicingArena")


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


def malloc_trim() -> None:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)


class BytearrayBackend(Backend):
    def __init__(self):
        super().__init__()
        self.b3 = bytearray(b"\x03")

    def alloc(self, kind: int, n: int) -> None:
        self._store(kind, self.b3 * n)

    def trim(self) -> None:
        malloc_trim()


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
        malloc_trim()


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


if __name__ == "__main__":
    sys.exit(run_memory_child(child, __doc__))
