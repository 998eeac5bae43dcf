"""Workload 2 of bench/memory.py, "idle" (issue 14), in the child process memory.py starts for each
candidate (``_memory_idle.py --child NAME --bytes N --seed S``): one long-lived allocator frees 99 %
of its blocks, then waits.  What it measures and how: memory.py's docstring.

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
from _memory_fragment import malloc_trim

IDLE_SIZES = (64, 65536)
IDLE_SURVIVORS = 0.01
IDLE_CHURN = 1000
IDLE_WAITS = {"idle_0.5s": 0.5, "idle_1s": 1.0, "idle_2s": 2.0, "idle_4s": 4.0}  # after the last free
IDLE_PHASES = ["baseline", "peak", "freed", *IDLE_WAITS, "churn", "trimmed"]
IDLE_ARENALIB = ("Arena", "ConfinedArena")


def idle_plan(total_bytes: int, seed: int) -> tuple[array, array, array, array]:
    """(sizes, survivors, frees, churn): the sizes allocated in order, the indices of the survivors,
    the indices of the others in the order they are freed, and the sizes of the allocate+free pairs
    that follow the idle readings."""
    rng = random.Random(seed)
    lo, hi = math.log(IDLE_SIZES[0]), math.log(IDLE_SIZES[1])
    sizes = array("I")
    total = 0
    while total < total_bytes:
        n = int(math.exp(rng.uniform(lo, hi)))
        sizes.append(n)
        total += n
    order = list(range(len(sizes)))
    rng.shuffle(order)
    keep = max(1, round(len(sizes) * IDLE_SURVIVORS))
    churn = array("I", (int(math.exp(rng.uniform(lo, hi))) for _ in range(IDLE_CHURN)))
    return sizes, array("I", sorted(order[:keep])), array("I", order[keep:]), churn


class IdleBackend:
    """One long-lived allocator: allocate(n) -> a filled object; free(obj) (then the caller drops
    it); trim(); facts() -> dict of the allocator's own figures; close()."""

    def free(self, obj) -> None:  # dropping the last reference frees it
        pass

    def facts(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class IdleBytearray(IdleBackend):
    def __init__(self):
        self.b3 = bytearray(b"\x03")

    def allocate(self, n: int) -> bytearray:
        return self.b3 * n

    def trim(self) -> None:
        malloc_trim()


class IdleNumpy(IdleBackend):
    def __init__(self):
        import numpy
        self.empty, self.u8 = numpy.empty, numpy.uint8

    def allocate(self, n: int):
        a = self.empty(n, self.u8)
        a.fill(3)
        return a

    def trim(self) -> None:
        malloc_trim()


class IdlePyarrow(IdleBackend):
    def __init__(self):
        import numpy
        import pyarrow
        self.pool = pyarrow.jemalloc_memory_pool()
        self.allocate_buffer = pyarrow.allocate_buffer
        self.frombuffer, self.u8 = numpy.frombuffer, numpy.uint8

    def allocate(self, n: int):
        buf = self.allocate_buffer(n, memory_pool=self.pool)
        self.frombuffer(buf, self.u8).fill(3)
        return buf

    def trim(self) -> None:
        self.pool.release_unused()

    def facts(self) -> dict:
        return {"pool_bytes_allocated": self.pool.bytes_allocated(),
                "pool_max_memory": self.pool.max_memory()}


class IdleArena(IdleBackend):
    def __init__(self, kind: str):
        import arenalib
        self.arenalib = arenalib
        self.arena = getattr(arenalib, kind)()

    def allocate(self, n: int):
        return self.arena.allocate(n, zero=False).fill(3)

    def free(self, seg) -> None:
        seg.free()

    def trim(self) -> None:
        self.arena.purge()

    def facts(self) -> dict:
        return {"arena_stats": self.arena.stats(), "pool_stats": self.arenalib.pool_stats()}

    def close(self) -> None:
        self.arena.close()


def idle_backend(name: str) -> IdleBackend:
    if name == "bytearray":
        return IdleBytearray()
    if name == "numpy":
        return IdleNumpy()
    if name == "pa_jemalloc":
        return IdlePyarrow()
    if name in IDLE_ARENALIB:
        return IdleArena(name)
    raise SystemExit(f"unknown idle candidate {name!r}")


def idle_child(name: str, total_bytes: int, seed: int) -> dict:
    """Run the idle workload for one candidate in this (fresh) process; print phases, return figures."""
    import gc

    def phase(label: str) -> None:
        print(f"@phase {label}", flush=True)

    # Imports, the plan and the long-lived allocator first: they belong to the baseline.
    sizes, survivors, frees, churn = idle_plan(total_bytes, seed)
    backend = idle_backend(name)
    allocate, free = backend.allocate, backend.free
    live: list = [None] * len(sizes)
    gc.collect()
    gc.disable()  # a list of buffers only: no cycles to collect, and no collector pauses
    rss = {}
    seconds = {}
    rss["baseline"] = rss_bytes()
    hwm_ok = reset_peak_rss()
    phase("baseline")

    t0 = time.perf_counter()
    sampled_peak = 0
    for i in range(len(sizes)):
        live[i] = allocate(sizes[i])
        if not i & 4095:
            sampled_peak = max(sampled_peak, rss_bytes())
    sampled_peak = max(sampled_peak, rss_bytes())
    hwm = peak_rss_bytes() if hwm_ok else None
    rss["peak"] = max(sampled_peak, hwm or 0)
    seconds["build"] = time.perf_counter() - t0
    phase("peak")

    t0 = time.perf_counter()
    for i in frees:
        free(live[i])
        live[i] = None
    freed_at = time.perf_counter()
    seconds["freed"] = freed_at - t0
    rss["freed"] = rss_bytes()
    phase("freed")

    idle_at = {}
    for label, after in IDLE_WAITS.items():
        time.sleep(max(0.0, freed_at + after - time.perf_counter()))
        rss[label] = rss_bytes()
        idle_at[label] = time.perf_counter() - freed_at
        phase(label)

    t0 = time.perf_counter()
    for n in churn:
        free(allocate(n))
    seconds["churn"] = time.perf_counter() - t0
    rss["churn"] = rss_bytes()
    phase("churn")

    facts = backend.facts()  # before the trim: what the allocator held
    t0 = time.perf_counter()
    backend.trim()
    seconds["trimmed"] = time.perf_counter() - t0
    rss["trimmed"] = rss_bytes()
    phase("trimmed")

    result = {
        "rss": rss,
        "seconds": seconds,
        "idle_seconds": idle_at,
        "allocations": len(sizes),
        "allocated_bytes": sum(sizes),
        "survivor_count": len(survivors),
        "survivor_bytes": sum(sizes[i] for i in survivors),
        "peak_source": "VmHWM" if hwm_ok and hwm and hwm >= sampled_peak else "statm samples",
        **facts,
    }
    for i in survivors:
        free(live[i])
        live[i] = None
    backend.close()
    return result


if __name__ == "__main__":
    sys.exit(run_memory_child(idle_child, __doc__))
