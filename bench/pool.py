"""BufferPool benchmarks (issue 4): what an I/O loop pays per request for its buffer, and what a file
read costs through pool buffers against bytearray buffers.

    .venv/py3.11/bin/python bench/pool.py [--full]

1. acquire + release per op, for 4 KiB and 64 KiB buffers: ``pool.release(pool.acquire())`` and
   ``pool.acquire().free()`` against a new ``bytearray(n)`` per request (what most code does), a
   Python list of bytearrays used as a pool (``pop()`` / ``append()``) and a ``queue.SimpleQueue`` of
   bytearrays.  Candidates run interleaved, in a rotating order, for several rounds; figures are the
   medians of the rounds' ns/op and of same-round ratios to bytearray.
2. Throughput of reading a 64 MiB file in /var/tmp (from the page cache: it is read once first) in
   64 KiB blocks: a pool buffer acquired and released per block, filled by os.preadv or by
   readinto, against a new bytearray per block (os.preadv, readinto), f.read(65536), and one
   bytearray reused for the whole file (the cheapest a Python loop can be).  Where the platform
   allows, also through the pool with O_DIRECT (page cache bypassed: disk speed; a bytearray cannot
   do this, it is not aligned) and with io_uring, 8 reads in flight: readv and read_fixed into
   registered buffers through examples/raw_uring.py, and readv through the liburing package from
   PyPI where a probe in a child interpreter says it works (its 2026.3.30 wheel dies with SIGILL on
   x86-64 CPUs without AVX-512).

``run(cfg, progress)`` returns every figure as a dict (bench/run.py calls it); quick mode takes ~5 s.
"""

from __future__ import annotations

import importlib
import os
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Config, Progress, fmt_num, fmt_size, run_standalone, same_round_ratio, summarize, table
from _experiment import finding, no_targets, ratio_line, side, times

import arenalib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import raw_uring  # examples/raw_uring.py: io_uring over raw syscalls, stdlib only

TITLE = "4a. BufferPool (issue 4)"
OP_SIZES = (4096, 65536)
FILE_SIZE = 64 << 20
BLOCK = 64 << 10
FILE_DIR = "/var/tmp"
BASELINE = "bytearray"
READ_BASELINE = "bytearray_readinto"


# -- 1. acquire + release per op -------------------------------------------------------------------

def _op_candidates(n: int) -> dict[str, tuple[str, Callable[[int], int], Callable[[], None]]]:
    """key -> (label, loop(iters) -> elapsed ns, cleanup)."""
    clock = time.perf_counter_ns
    pool = arenalib.BufferPool(n, 64)
    free_list = [bytearray(n) for _ in range(64)]
    simple_queue: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(64):
        simple_queue.put(bytearray(n))

    def pool_release(iters: int) -> int:
        acquire, release = pool.acquire, pool.release
        t0 = clock()
        for _ in range(iters):
            release(acquire())
        return clock() - t0

    def pool_free(iters: int) -> int:
        acquire = pool.acquire
        t0 = clock()
        for _ in range(iters):
            acquire().free()
        return clock() - t0

    def new_bytearray(iters: int) -> int:
        t0 = clock()
        for _ in range(iters):
            bytearray(n)
        return clock() - t0

    def list_pool(iters: int) -> int:
        pop, append = free_list.pop, free_list.append
        t0 = clock()
        for _ in range(iters):
            append(pop())
        return clock() - t0

    def queue_pool(iters: int) -> int:
        get, put = simple_queue.get_nowait, simple_queue.put
        t0 = clock()
        for _ in range(iters):
            put(get())
        return clock() - t0

    return {
        "pool_release": ("BufferPool acquire + release", pool_release, pool.close),
        "pool_free": ("BufferPool acquire + seg.free()", pool_free, lambda: None),
        BASELINE: ("bytearray(n) per request", new_bytearray, lambda: None),
        "list_pool": ("list of bytearrays pop/append", list_pool, lambda: None),
        "simplequeue_pool": ("SimpleQueue of bytearrays get/put", queue_pool, lambda: None),
    }


def _calibrate(loop: Callable[[int], int], target_ns: float) -> int:
    iters = 1000
    while True:
        elapsed = loop(iters)
        if elapsed >= target_ns / 4 or iters >= 1 << 26:
            return max(int(iters * target_ns / max(elapsed, 1)), 1000)
        iters *= 4


def bench_ops(rounds: int, target_ms: float) -> dict:
    result: dict = {}
    for n in OP_SIZES:
        cands = _op_candidates(n)
        try:
            keys = list(cands)
            iters = {k: _calibrate(cands[k][1], target_ms * 1e6) for k in keys}
            per_round: dict[str, list[float]] = {k: [] for k in keys}
            for r in range(rounds + 1):  # round 0 warms up
                order = keys[r % len(keys):] + keys[:r % len(keys)]
                for k in order:
                    ns = cands[k][1](iters[k]) / iters[k]
                    if r:
                        per_round[k].append(ns)
            result[str(n)] = {
                k: {"label": cands[k][0], "ns_per_op": summarize(per_round[k]),
                    "ratio_to_bytearray": same_round_ratio(per_round[k], per_round[BASELINE])}
                for k in keys}
        finally:
            for _, _, cleanup in cands.values():
                cleanup()
    return result


# -- 2. file read throughput -----------------------------------------------------------------------

def _make_file() -> str:
    path = os.path.join(FILE_DIR, f"arenalib-bench-pool-{os.getpid()}.bin")
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(FILE_SIZE >> 20):
            f.write(block)
    return path


def _read_through_pool(pool, path: str, flags: int) -> int:
    """Read the whole file with preadv into pool buffers, one block per acquire; bytes read."""
    fd = os.open(path, flags)
    acquire, release, preadv = pool.acquire, pool.release, os.preadv
    total = 0
    try:
        while True:
            seg = acquire()
            n = preadv(fd, (seg,), total)
            release(seg)
            total += n
            if n < BLOCK:
                return total
    finally:
        os.close(fd)


def _read_candidates(path: str, skipped: dict[str, str]) -> dict[str, tuple[str, Callable[[], int],
                                                                              Callable[[], None]]]:
    """key -> (label, read the whole file -> bytes read, cleanup); ``skipped`` gets key -> why for the
    candidates that cannot run here."""
    pool = arenalib.BufferPool(BLOCK, 8)
    cands: dict[str, tuple[str, Callable[[], int], Callable[[], None]]] = {}

    def pool_preadv() -> int:
        return _read_through_pool(pool, path, os.O_RDONLY)

    def pool_readinto() -> int:
        acquire, release = pool.acquire, pool.release
        total = 0
        with open(path, "rb", buffering=0) as f:
            readinto = f.readinto
            while True:
                seg = acquire()
                n = readinto(seg)
                release(seg)
                total += n
                if n < BLOCK:
                    return total

    def bytearray_preadv() -> int:
        fd = os.open(path, os.O_RDONLY)
        preadv = os.preadv
        total = 0
        try:
            while True:
                n = preadv(fd, (bytearray(BLOCK),), total)
                total += n
                if n < BLOCK:
                    return total
        finally:
            os.close(fd)

    def bytearray_readinto() -> int:
        total = 0
        with open(path, "rb", buffering=0) as f:
            readinto = f.readinto
            while True:
                n = readinto(bytearray(BLOCK))
                total += n
                if n < BLOCK:
                    return total

    def read_bytes() -> int:
        total = 0
        with open(path, "rb", buffering=0) as f:
            read = f.read
            while True:
                n = len(read(BLOCK))
                total += n
                if n < BLOCK:
                    return total

    def reused_bytearray() -> int:
        buf = bytearray(BLOCK)
        total = 0
        with open(path, "rb", buffering=0) as f:
            readinto = f.readinto
            while True:
                n = readinto(buf)
                total += n
                if n < BLOCK:
                    return total

    cands["pool_preadv"] = ("BufferPool + os.preadv", pool_preadv, pool.close)
    cands["pool_readinto"] = ("BufferPool + readinto", pool_readinto, lambda: None)
    cands["bytearray_preadv"] = ("bytearray per block + os.preadv", bytearray_preadv, lambda: None)
    cands[READ_BASELINE] = ("bytearray per block + readinto", bytearray_readinto, lambda: None)
    cands["read_bytes"] = ("f.read(64 KiB) per block", read_bytes, lambda: None)
    cands["reused_bytearray"] = ("one bytearray reused + readinto", reused_bytearray, lambda: None)

    direct = _o_direct_candidate(path, pool)
    if direct is not None:
        cands["pool_o_direct"] = direct
    _io_uring_candidates(path, pool, cands, skipped)
    _liburing_candidate(path, pool, cands, skipped)
    return cands


def _o_direct_candidate(path: str, pool: arenalib.BufferPool):
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        return None

    def pool_o_direct() -> int:
        return _read_through_pool(pool, path, os.O_RDONLY | os.O_DIRECT)

    return ("BufferPool + O_DIRECT preadv (disk, no page cache)", pool_o_direct, lambda: None)


def _io_uring_candidates(path: str, pool: arenalib.BufferPool, cands: dict, skipped: dict) -> None:
    """io_uring through examples/raw_uring.py (raw syscalls): readv into the buffer's iovec, and
    read_fixed into registered buffers; 8 reads in flight, the pattern of examples/io_uring_read.py."""
    try:
        ring = raw_uring.Ring(len(pool))
    except raw_uring.Unavailable as e:
        skipped["pool_io_uring"] = f"io_uring unavailable: {e}"
        return
    iovs = [raw_uring.iovec_array([pair]) for pair in pool.iovecs()]
    ring.register_buffers(pool.iovecs())  # buffer i is fixed buffer i; unregistered before the pool closes

    def read_loop(fixed: bool) -> int:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        inflight: dict[int, arenalib.Segment] = {}
        offset = total = 0
        try_acquire, index, release, check = pool.try_acquire, pool.index, pool.release, raw_uring.check
        try:
            while total < size:
                while offset < size and (seg := try_acquire()) is not None:
                    i = index(seg)
                    if fixed:
                        ring.prep_read_fixed(fd, seg.address, BLOCK, offset, i, i)
                    else:
                        ring.prep_readv(fd, iovs[i], offset, i)
                    inflight[i] = seg
                    offset += BLOCK
                ring.submit()
                for i, res in ring.wait(1):
                    total += check(res)
                    release(inflight.pop(i))
            return total
        finally:
            if ring.inflight:  # an error: the kernel may still write into the acquired buffers
                ring.wait(ring.inflight)
            os.close(fd)

    def cleanup() -> None:
        ring.unregister_buffers()
        ring.close()

    cands["pool_io_uring"] = ("BufferPool + io_uring readv, 8 in flight", lambda: read_loop(False), cleanup)
    cands["pool_io_uring_fixed"] = ("BufferPool + io_uring read_fixed (registered), 8 in flight",
                                    lambda: read_loop(True), lambda: None)


def _liburing_candidate(path: str, pool: arenalib.BufferPool, cands: dict, skipped: dict) -> None:
    """The same readv loop through the liburing package from PyPI, only where a probe in a child
    interpreter says it works: its 2026.3.30 wheel dies with SIGILL on x86-64 CPUs without AVX-512."""
    usable, why = raw_uring.liburing_wheel_usable()
    if not usable:
        skipped["pool_liburing"] = why
        return
    liburing = importlib.import_module("liburing")
    ring = liburing.Ring()
    try:
        liburing.io_uring_queue_init(len(pool), ring)
    except OSError as e:
        skipped["pool_liburing"] = f"io_uring_queue_init: {e}"
        return
    # Iovec takes no Segment: one Iovec per buffer index from the pool's raw views, made once.
    iovs = [liburing.Iovec([view]) for view in pool.raw_views()]
    cqe = liburing.Cqe()

    def pool_liburing() -> int:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        inflight: dict[int, object] = {}
        offset = total = 0
        try:
            while total < size:
                while offset < size and (seg := pool.try_acquire()) is not None:
                    i = pool.index(seg)
                    sqe = liburing.io_uring_get_sqe(ring)
                    liburing.io_uring_prep_readv(sqe, fd, iovs[i], offset)
                    sqe.user_data = i
                    inflight[i] = seg
                    offset += BLOCK
                liburing.io_uring_submit(ring)
                liburing.io_uring_wait_cqe(ring, cqe)
                entry = cqe[0]
                i = entry.user_data
                try:
                    total += entry.res
                finally:
                    liburing.io_uring_cqe_seen(ring, entry)
                pool.release(inflight.pop(i))
            return total
        finally:
            os.close(fd)

    def cleanup() -> None:
        liburing.io_uring_queue_exit(ring)

    cands["pool_liburing"] = ("BufferPool + liburing (PyPI) readv, 8 in flight", pool_liburing, cleanup)


def bench_read(rounds: int, skipped: dict[str, str]) -> dict:
    path = _make_file()
    try:
        cands = _read_candidates(path, skipped)
        try:
            keys = list(cands)
            for k in keys:  # warm-up: page cache, and each candidate reads the whole file right
                assert cands[k][1]() == FILE_SIZE, k
            per_round: dict[str, list[float]] = {k: [] for k in keys}
            for r in range(rounds):
                order = keys[r % len(keys):] + keys[:r % len(keys)]
                for k in order:
                    t0 = time.perf_counter()
                    cands[k][1]()
                    per_round[k].append(FILE_SIZE / (time.perf_counter() - t0) / 1e6)
            return {k: {"label": cands[k][0], "mb_per_s": summarize(per_round[k]),
                        "ratio_to_bytearray": same_round_ratio(per_round[k], per_round[READ_BASELINE])}
                    for k in keys}
        finally:
            for _, _, cleanup in reversed(cands.values()):
                cleanup()
    finally:
        os.unlink(path)


# -- entry points ----------------------------------------------------------------------------------

def plan(cfg: Config) -> float:
    """Estimated milliseconds, half of them the acquire + release loops: ~5 s in quick mode on 2 cores,
    ~15 s in full mode."""
    return 15_000 if cfg.mode == "full" else 5_000


def run(cfg: Config, progress: Progress) -> dict:
    """Both experiments."""
    quick = cfg.mode != "full"
    rounds, target_ms, read_rounds = (15, 10.0, 7) if quick else (41, 30.0, 21)
    t0 = time.monotonic()
    progress.set_label("pool: acquire + release")
    ops = bench_ops(rounds, target_ms)
    progress.step("pool: reading a file", plan(cfg) / 2)
    skipped: dict[str, str] = {}
    reads = bench_read(read_rounds, skipped)
    progress.step(None, plan(cfg) / 2)
    return {"mode": "quick" if quick else "full", "op_rounds": rounds, "op_target_ms": target_ms,
            "read_rounds": read_rounds, "file_bytes": FILE_SIZE, "block_bytes": BLOCK,
            "acquire_release": ops, "read_throughput": reads, "read_skipped": skipped,
            "seconds": round(time.monotonic() - t0, 1)}


# -- reading the results back (tables; also from a results.json) ----------------------------------

# Issue 4 set no ratio as a target: the tables are the verdict.
targets = no_targets
target_line = ratio_line


def findings(res: dict) -> list[dict]:
    """The verdict's sentences: acquire + release against a new bytearray per request and against a list
    of bytearrays used as a pool; a file read through pool buffers against bytearray+readinto."""
    out = []
    ours, fastest = "pool_release", "list_pool"
    per_size = {int(n): c for n, c in res["acquire_release"].items() if ours in c}
    if per_size:
        vs_new = ", ".join(f"{times(c[ours]['ratio_to_bytearray']['median'])} at {fmt_size(n)}"
                           for n, c in per_size.items())
        out.append(finding(side(min(c[ours]["ratio_to_bytearray"]["median"] for c in per_size.values())),
                           "BufferPool, a buffer per request (acquire + release) against a new "
                           f"bytearray(n): "
                           f"{vs_new}."))
        slower = [(n, c[ours]["ns_per_op"]["median"] / c[fastest]["ns_per_op"]["median"])
                  for n, c in per_size.items() if fastest in c]
        slower = [(n, r) for n, r in slower if side(r) == "loss"]
        if slower:
            out.append(finding("loss", "A Python list of bytearrays used as a pool (pop/append) is faster "
                                       "than "
                                       "BufferPool: " + ", ".join(f"{times(1 / r)} at {fmt_size(n)}"
                                                                  for n, r in slower) + ".",
                               "a list hands out the same bytearrays unchecked; BufferPool hands out "
                               "Segments "
                               "it counts, checks and can take back"))
    reads = res["read_throughput"]
    best = max((k for k in ("pool_preadv", "pool_readinto") if k in reads),
               key=lambda k: reads[k]["ratio_to_bytearray"]["median"], default=None)
    if best is not None:
        r = reads[best]["ratio_to_bytearray"]["median"]
        read = (f"reading a {fmt_size(res['file_bytes'])} file through it (readinto, page cache): "
                f"{times(r, lower_is_faster=False)} than a bytearray per block")
        if out and out[0]["kind"] == side(r, lower_is_faster=False):
            out[0]["text"] = out[0]["text"].removesuffix(".") + f"; {read}."
        else:
            out.append(finding(side(r, lower_is_faster=False), f"BufferPool: {read}."))
    for key, why in res.get("read_skipped", {}).items():
        out.append(finding("skip", f"BufferPool file read: {key} not measured.", why))
    return out


def plots(res: dict, out: Path, plt) -> list[str]:
    """Time per acquire + release of each candidate, grouped by buffer size; the file read's throughput."""
    from _plot import bars

    sizes = list(res["acquire_release"])
    labels = {k: c["label"] for n in sizes for k, c in res["acquire_release"][n].items()}
    values = {label: [res["acquire_release"][n].get(k, {}).get("ns_per_op", {}).get("median") for n in sizes]
              for k, label in labels.items()}
    written = bars(plt, out, "pool_acquire.png", [fmt_size(int(n)) + " buffers" for n in sizes], values,
                   ylabel="ns per acquire + release (median)",
                   title="BufferPool: a buffer per request, acquire + release (lower is faster)")
    reads = res["read_throughput"]
    written += bars(plt, out, "pool_read.png", [f"{fmt_size(res['file_bytes'])} file, "
                                                f"{fmt_size(res['block_bytes'])} blocks"],
                    {c["label"]: [c["mb_per_s"]["median"]] for c in reads.values()}, ylabel="MB/s (median)",
                    title="BufferPool: reading a file through pool buffers (higher is faster)", logy=True)
    return written


def tables(res: dict, markdown: bool = False) -> str:
    """Plain text; in markdown, the same text in a code block."""
    out = ["```"] if markdown else ["BufferPool", ""]
    for n, cands in res["acquire_release"].items():
        rows = [[c["label"], fmt_num(c["ns_per_op"]["median"]),
                 f"{c['ns_per_op']['q1']:.0f}-{c['ns_per_op']['q3']:.0f}",
                 f"{c['ratio_to_bytearray']['median']:.2f}x"] for c in cands.values()]
        out.append(f"acquire + release per op, {fmt_size(int(n))} buffers")
        out.append(table(["candidate", "ns/op", "IQR", "vs bytearray"], rows))
        out.append("")
    rows = [[c["label"], fmt_num(c["mb_per_s"]["median"]),
             f"{c['mb_per_s']['q1']:.0f}-{c['mb_per_s']['q3']:.0f}",
             f"{c['ratio_to_bytearray']['median']:.2f}x"] for c in res["read_throughput"].values()]
    out.append(f"reading a {fmt_size(res['file_bytes'])} file in {fmt_size(res['block_bytes'])} blocks "
               "(page cache unless noted)")
    out.append(table(["candidate", "MB/s", "IQR", "vs bytearray+readinto"], rows))
    out.extend(f"  skipped {key}: {why}" for key, why in res.get("read_skipped", {}).items())
    if markdown:
        out.append("```")
    return "\n".join(out)


if __name__ == "__main__":
    run_standalone(sys.modules[__name__])
