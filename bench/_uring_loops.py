"""The read loops bench/uring.py (experiment 6) times, one per candidate: what each does is in
uring.py's docstring.

Each is a function (fd, size) -> ns for one block size, made by a factory per block size; the ring
candidates set up their ring (and registration) before the timed loop and close it after.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import arenalib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import raw_uring  # examples/raw_uring.py: liburing_wheel_usable(), the probe in a child

DEPTHS = (1, 8, 32)
BASELINE = "preadv_pool"


def preadv_loop(buf, block: int) -> Callable[[int, int], int]:
    def run(fd: int, size: int) -> int:
        preadv, bufs, clock = os.preadv, [buf], time.perf_counter_ns
        t0 = clock()
        for offset in range(0, size, block):
            got = preadv(fd, bufs, offset)
            if got != block and got != size - offset:  # (only the last block may be shorter)
                raise OSError(errno.EIO, f"short read at offset {offset}")
        return clock() - t0
    return run


def ring_loop(pool: arenalib.BufferPool, segs: list, block: int, depth: int) -> Callable[[int, int], int]:
    if depth == 1:
        return ring_loop_sequential(pool, segs[0], block)

    def run(fd: int, size: int) -> int:
        nblocks = -(-size // block)
        with arenalib.Ring(depth) as ring:
            ring.register_pool(pool)
            read_fixed, wait, clock = ring.read_fixed, ring.wait, time.perf_counter_ns
            total = 0
            t0 = clock()
            issued = min(depth, nblocks)
            for i in range(issued):
                read_fixed(fd, segs[i], i * block, user_data=i)
            reaped = 0
            while reaped < nblocks:
                for i, res in wait(1):
                    if res < 0:
                        arenalib.check(res)
                    total += res
                    reaped += 1
                    if issued < nblocks:
                        read_fixed(fd, segs[i], issued * block, user_data=i)
                        issued += 1
            ns = clock() - t0
            ring.unregister_pool()
        if total != size:
            raise OSError(errno.EIO, f"read {total} bytes of {size}")
        return ns
    return run


def ring_loop_sequential(pool: arenalib.BufferPool, seg, block: int) -> Callable[[int, int], int]:
    """Queue depth 1 as one writes it: a read, then wait() for it (which submits it), block after
    block: the os.preadv loop's shape, with the ring's two calls for preadv's one."""
    def run(fd: int, size: int) -> int:
        with arenalib.Ring(1) as ring:
            ring.register_pool(pool)
            read_fixed, wait, clock = ring.read_fixed, ring.wait, time.perf_counter_ns
            t0 = clock()
            for offset in range(0, size, block):
                read_fixed(fd, seg, offset)
                (_, res), = wait(1)
                if res != block and res != size - offset:  # (only the last block may be shorter)
                    arenalib.check(res)
                    raise OSError(errno.EIO, f"short read at offset {offset}")
            ns = clock() - t0
            ring.unregister_pool()
        return ns
    return run


def c_loop(k, segs: list, block: int, depth: int) -> Callable[[int, int], int]:
    addresses = [seg.address for seg in segs[:depth]]

    def run(fd: int, size: int) -> int:
        return k.read_file(fd, size, block, addresses, True)
    return run


def liburing_loops(pool: arenalib.BufferPool, segs: list, block: int) -> dict | str:
    """{depth: loop} through the liburing package from PyPI (readv over Iovecs of the pool's raw views:
    its read(_fixed) take only a bytearray), or why it cannot run here."""
    usable, why = raw_uring.liburing_wheel_usable()
    if not usable:
        return why
    liburing = importlib.import_module("liburing")  # only after the probe: it may kill the process
    iovs = [liburing.Iovec([view]) for view in pool.raw_views()]  # Iovec refuses a Segment

    def make(depth: int) -> Callable[[int, int], int]:
        def run(fd: int, size: int) -> int:
            ring, cqe = liburing.Ring(), liburing.Cqe()
            liburing.io_uring_queue_init(depth, ring)
            free: list[int] = []  # buffers whose reads are reaped
            try:
                nblocks = -(-size // block)
                total = issued = reaped = 0
                t0 = time.perf_counter_ns()
                while reaped < nblocks:
                    while issued < nblocks and issued - reaped < depth:
                        i = issued % depth if issued < depth else free.pop()
                        sqe = liburing.io_uring_get_sqe(ring)
                        liburing.io_uring_prep_readv(sqe, fd, iovs[pool.index(segs[i])], issued * block)
                        sqe.user_data = i
                        issued += 1
                    liburing.io_uring_submit(ring)
                    liburing.io_uring_wait_cqe(ring, cqe)
                    entry = cqe[0]
                    res, i = entry.res, entry.user_data
                    liburing.io_uring_cqe_seen(ring, entry)
                    if res < 0:
                        arenalib.check(res)
                    total += res
                    reaped += 1
                    free.append(i)
                ns = time.perf_counter_ns() - t0
            finally:
                liburing.io_uring_queue_exit(ring)
            if total != size:
                raise OSError(errno.EIO, f"read {total} bytes of {size}")
            return ns
        return run

    return {depth: make(depth) for depth in DEPTHS}


def candidates(mode: str, block: int, pool: arenalib.BufferPool, segs: list, k,
               liburing: dict | str) -> tuple[dict[str, Callable[[int, int], int]], dict[str, str]]:
    """({key: loop}, {key: why skipped}) for one mode and block size."""
    cands: dict[str, Callable[[int, int], int]] = {BASELINE: preadv_loop(segs[0], block)}
    skipped: dict[str, str] = {}
    if mode == "cache":
        cands["preadv_bytearray"] = preadv_loop(bytearray(block), block)
    for depth in DEPTHS:
        cands[f"ring_qd{depth}"] = ring_loop(pool, segs, block, depth)
        cands[f"c_qd{depth}"] = c_loop(k, segs, block, depth)
        if isinstance(liburing, str):
            skipped[f"liburing_qd{depth}"] = liburing
        else:
            cands[f"liburing_qd{depth}"] = liburing[depth]
    return cands, skipped


def labels() -> dict[str, str]:
    out = {BASELINE: "os.preadv into a pool segment", "preadv_bytearray": "os.preadv into a bytearray"}
    for depth in DEPTHS:
        out[f"ring_qd{depth}"] = f"arenalib Ring read_fixed, QD{depth}"
        out[f"c_qd{depth}"] = f"C loop over liburing read_fixed, QD{depth}"
        out[f"liburing_qd{depth}"] = f"liburing (PyPI) readv, QD{depth}"
    return out
