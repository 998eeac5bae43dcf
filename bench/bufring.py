"""Experiment 10, provided buffers and multishot receive (issue 30): a server that receives with
``Ring.recv_multishot`` into one BufferPool lent to the kernel (``Ring.provide``), against the servers a
user would write instead, two processes over loopback (127.0.0.1).

What it measures:
1. Memory: one server process holds 10,000 connections, each of which sends 32 KiB.  ``ring``: one
   Ring, one BufferPool of 64 buffers of 64 KiB provided to it, one armed multishot receive per
   connection, each received Segment released at once.  ``recv_into``: a ``selectors`` server with one
   preallocated 64 KiB bytearray per connection, ``sock.recv_into`` into it.  Reported: the server's
   RSS growth from just before the first accept (the pool made, its pages untouched; the ring and its
   request table made) to when every byte has arrived, and its RSS then; target: the ring's growth
   at most 1/10 of recv_into's.
2. Throughput over 16 connections at 64 KiB and 1 MiB messages (length-prefixed frames: 8 bytes of
   length, then the message), a client process with one thread per connection sending ``sendall``:
   ``ring`` (the Ring as above with a pool of 16 buffers of 64 KiB, the buffer memory of the
   selectors server; bytes counted and each segment released), ``ring_pool64`` (the same with the
   memory experiment's pool of 64: the kernel takes a group's buffers in ring order, so all 4 MiB
   cycle through the cache, where 16 buffers are 1 MiB, a core's L2 on the machine measured),
   ``ring frames`` (the receives of ``ring`` through ``arenalib.aio.RingFrameReader``, each frame a
   Segment of an Arena, copied out of the ring's buffers), ``selectors`` (epoll through
   ``selectors.DefaultSelector``, ``recv_into`` a preallocated 64 KiB bytearray per connection,
   bytes counted) and ``asyncio FrameReader`` (asyncio's loop, ``arenalib.aio.FrameReader``, frames
   freed).  Reported: GB/s from the server's first byte to its last, the server's CPU time per MiB
   (user + system, getrusage) and the client's, the bytes each completion (or recv_into) brought;
   ratios to ``selectors`` in the same round.  Targets:
   ``ring``'s throughput >= 1.3x selectors', or, where the client is the bound (its CPU per byte
   above the server's), ``ring``'s server CPU per byte <= 0.6x selectors'.
3. Per completion, the Python overhead: a multishot receive of small messages (64 B, 1000 B and
   4 KiB buffers, 256 of them, so that each completion fills one buffer) through ``ring.wait()`` and
   ``segment.free()`` against the same loop in C over liburing (bench/native's
   ``recv_multishot_loop``: the same ring sizes, a provided-buffer ring over the same pool's buffers,
   each buffer put back at once), one process, both sending their own payload without blocking.
   Reported: the thread's CPU time per completion of each (CLOCK_THREAD_CPUTIME_ID: the receives'
   kernel work, run as task work in the receiving thread, counts in both; other processes' load does
   not) and the difference, the target (median of the same-round differences; <= 1 us); the wall
   clock's figures beside them.

How: each measurement of 1 and 2 starts a fresh server process (``python bench/bufring.py --serve``)
that reports its own figures as JSON; the candidates take turns within a round, the first rotating.
Both processes raise their open-file limit to the hard limit (10,000 connections need ~10,000
descriptors on each side).

What bounds it: loopback TCP moves bytes by a copy in the sender's send() and one in the receiver's
recv (the kernel's, into the pool's buffer or the bytearray), so at large messages every server pays
about the same copy and the client, a Python process sending from 16 threads, is often the bound: the
CPU per byte says what each server spent.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import Config, Progress, fmt_size, run_standalone, same_round_ratio, summarize, table

HERE = Path(__file__).resolve().parent
TITLE = "10. Provided buffers and multishot receive: Ring.recv_multishot (issue 30)"

MEM_CONNECTIONS = 10_000
MEM_MESSAGE = 32 << 10
MEM_KINDS = ("ring", "recv_into")
POOL_BUFFERS = 64
BUFFER = 64 << 10
TP_CONNECTIONS = 16
TP_SIZES = (64 << 10, 1 << 20)
TP_BYTES = 256 << 20                    # per measurement, over the 16 connections
TP_KINDS = ("ring", "ring_pool64", "ring_frames", "selectors", "asyncio")
# The Ring servers' pools in 2: as many buffers as connections (the buffer memory of the selectors
# server), and the memory experiment's 64, four times that, whose buffers cycle through the cache.
TP_BUFFERS = {"ring": TP_CONNECTIONS, "ring_pool64": POOL_BUFFERS, "ring_frames": TP_CONNECTIONS}
LABELS = {"ring": f"Ring.recv_multishot, pool of {TP_CONNECTIONS}",
          "ring_pool64": f"Ring.recv_multishot, pool of {POOL_BUFFERS}",
          "ring_frames": f"Ring + aio.RingFrameReader, pool of {TP_CONNECTIONS}",
          "selectors": "selectors + recv_into", "asyncio": "asyncio + aio.FrameReader",
          "recv_into": "recv_into, 64 KiB each"}
MEM_LABELS = {"ring": f"Ring.recv_multishot, pool of {POOL_BUFFERS}", "recv_into": LABELS["recv_into"]}
OVERHEAD_SIZES = (64, 1000, 4096)
OVERHEAD_BUFFERS = 256
SETTINGS = {"quick": {"mem_rounds": 1, "tp_rounds": 5, "oh_rounds": 9, "oh_messages": 8192},
            "full": {"mem_rounds": 3, "tp_rounds": 9, "oh_rounds": 21, "oh_messages": 8192}}
TARGETS = {"memory": 0.1, "throughput": 1.3, "cpu": 0.6, "overhead_ns": 1000}
HEADER = 8


def settings(cfg: Config) -> dict:
    return SETTINGS["full" if cfg.mode == "full" else "quick"]


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


# -- the servers (each in a process of its own: python bench/bufring.py --serve KIND ...) ------------

class Meter:
    """The server's figures: from its first byte to its last."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.got = 0
        self.reads = 0   # completions or recv_into calls that brought bytes
        self.t0 = self.cpu0 = 0.0

    def add(self, n: int) -> bool:
        if not self.got:
            self.t0, self.cpu0 = time.perf_counter(), cpu_seconds()
        self.got += n
        self.reads += 1
        return self.got >= self.expect

    def report(self, rss0: int) -> dict:
        return {"seconds": time.perf_counter() - self.t0, "cpu_s": cpu_seconds() - self.cpu0,
                "bytes": self.got, "reads": self.reads, "rss_growth": rss() - rss0, "rss": rss()}


def accept_all(listener: socket.socket, n: int) -> list[socket.socket]:
    socks = []
    while len(socks) < n:
        sock, _ = listener.accept()
        socks.append(sock)
    return socks


def serve_ring(listener, n: int, expect: int, frames: bool, buffers: int) -> dict:
    import arenalib
    from arenalib.aio import RingFrameReader

    rss0 = rss()  # before the ring (its request table: ~130 bytes a receive) and the pool are made
    pool = arenalib.BufferPool(BUFFER, buffers)
    ring = arenalib.Ring(min(32768, max(64, n)))  # a completion queue of 2n: every receive armed
    arena = arenalib.Arena()
    ring.provide(pool, 0)
    meter = Meter(expect)
    socks = accept_all(listener, n)
    readers = [None] * n
    if frames:
        def on_frame(seg) -> None:
            seg.free()
        readers = [RingFrameReader(on_frame, arena=arena) for _ in range(n)]
    for i, sock in enumerate(socks):
        ring.recv_multishot(sock, 0, user_data=i)
    wait, rearm = ring.wait, ring.recv_multishot
    done = False
    while not done:
        for i, r in wait(1):
            n_bytes = r.result
            if frames:
                more = readers[i].feed(r)
                if n_bytes > 0:
                    done = meter.add(n_bytes)
            else:
                seg = r.segment
                more = r.more
                if seg is not None:
                    done = meter.add(n_bytes)
                    seg.free()
            if not more and (n_bytes > 0 or n_bytes == -105):  # ended by the kernel, or ENOBUFS
                rearm(socks[i], 0, user_data=i)
    figures = meter.report(rss0)
    figures["buffers"] = len(pool)
    ring.close()
    pool.close()
    arena.close()
    for sock in socks:
        sock.close()
    return figures


def serve_selectors(listener, n: int, expect: int) -> dict:
    import selectors

    rss0 = rss()
    meter = Meter(expect)
    socks = accept_all(listener, n)
    sel = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        buf = bytearray(BUFFER)                 # one preallocated buffer per connection
        sel.register(sock, selectors.EVENT_READ, (sock.recv_into, memoryview(buf)))
    done = False
    while not done:
        for key, _ in sel.select():
            recv_into, view = key.data
            try:
                got = recv_into(view)
            except BlockingIOError:
                continue
            if got == 0:
                sel.unregister(key.fileobj)
                continue
            done = meter.add(got)
    figures = meter.report(rss0)
    sel.close()
    for sock in socks:
        sock.close()
    return figures


def serve_asyncio(listener, n: int, expect: int) -> dict:
    import asyncio

    from arenalib.aio import FrameReader

    meter = Meter(expect)
    rss0 = rss()
    result: dict = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def on_frame(seg) -> None:
            seg.free(deferred=True)
            if meter.add(len(seg) + HEADER) and not finished.done():
                finished.set_result(None)

        socks = accept_all(listener, n)
        transports = []
        for sock in socks:
            transport, _ = await loop.connect_accepted_socket(lambda: FrameReader(on_frame), sock)
            transports.append(transport)
        await finished
        result.update(meter.report(rss0))
        del result["reads"]  # (counted per frame here, not per read)
        for t in transports:
            t.close()

    asyncio.run(main())
    return result


def server_main(kind: str, n: int, expect: int, buffers: int) -> int:
    raise_nofile()
    listener = socket.create_server(("127.0.0.1", 0), backlog=min(n, 4096))
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    if kind in ("ring", "ring_frames"):
        figures = serve_ring(listener, n, expect, kind == "ring_frames", buffers)
    elif kind == "asyncio":
        figures = serve_asyncio(listener, n, expect)
    else:
        figures = serve_selectors(listener, n, expect)
    print(json.dumps(figures), flush=True)
    return 0


# -- the client (this process) ----------------------------------------------------------------------

def measure(kind: str, n: int, message: int, per_conn: int, buffers: int = POOL_BUFFERS) -> dict:
    """Start a ``kind`` server, connect ``n`` clients, send ``per_conn`` frames of ``message`` bytes on
    each (one thread per connection while there are at most 64, else in turns), and return the
    server's figures with the client's CPU time."""
    expect = n * per_conn * (message + HEADER)
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", kind,
                               "--conns", str(n), "--expect", str(expect), "--buffers", str(buffers)],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        frame = (message).to_bytes(HEADER, "big") + os.urandom(message)
        cpu0 = cpu_seconds()
        if n <= 64:
            def send(sock):
                for _ in range(per_conn):
                    sock.sendall(frame)
            threads = [threading.Thread(target=send, args=(s,)) for s in socks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for _ in range(per_conn):
                for s in socks:
                    s.sendall(frame)
        client_cpu = cpu_seconds() - cpu0
        line = server.stdout.readline()
        server.wait(timeout=120)
        for s in socks:
            s.close()
        if not line:
            raise RuntimeError(f"the {kind} server exited without its figures (status {server.returncode})")
        figures = json.loads(line)
        figures["client_cpu_s"] = client_cpu
        return figures
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# -- 3: per completion, Python against C ------------------------------------------------------------

def overhead_round(mod, size: int, messages: int, c_first: bool) -> dict:
    """ns per completion of the Python loop and of the C loop, wall clock and the thread's CPU time
    (a fresh pair of sockets for each; ``c_first``: the C loop runs first)."""
    import arenalib

    payload = os.urandom(size * messages)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    pool = arenalib.BufferPool(size, OVERHEAD_BUFFERS, align=64)

    def c_loop() -> tuple[float, float]:
        # The pool's buffers acquired (so nothing else hands them out), their addresses lent.
        segs = [pool.acquire() for _ in range(OVERHEAD_BUFFERS)]
        addresses = [pool.address + pool.index(s) * pool.stride for s in segs]
        try:
            ns, n, cpu = mod.recv_multishot_loop(server.fileno(), client.fileno(), addresses, size,
                                                 payload, 1)
        finally:
            for s in segs:
                s.free()
        return ns / n, cpu / n

    def py_loop() -> tuple[float, float]:
        # The same ring sizes, the same buffers, provided.
        client.setblocking(False)
        total, view = len(payload), memoryview(payload)
        with arenalib.Ring(OVERHEAD_BUFFERS) as ring:
            ring.provide(pool, 0)
            ring.recv_multishot(server, 0)
            wait, send, rearm = ring.wait, client.send, ring.recv_multishot
            n = sent = got = 0
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            while got < total:
                if sent < total:
                    try:
                        sent += send(view[sent:])
                    except BlockingIOError:
                        pass
                for _, r in wait(1 if sent >= total else 0):
                    n += 1
                    seg = r.segment
                    if seg is not None:
                        got += r.result
                        seg.free()
                    if not r.more:
                        if r.result < 0 and r.result != -105:
                            arenalib.check(r.result)
                        rearm(server, 0)
            ns = time.perf_counter_ns() - t0
            cpu = time.thread_time_ns() - c0
        client.setblocking(True)
        return ns / n, cpu / n

    try:
        if c_first:
            c_ns, c_cpu = c_loop()
            py_ns, py_cpu = py_loop()
        else:
            py_ns, py_cpu = py_loop()
            c_ns, c_cpu = c_loop()
        return {"python_ns": py_ns, "c_ns": c_ns, "python_cpu": py_cpu, "c_cpu": c_cpu}
    finally:
        client.close()
        server.close()
        pool.close()


# -- the experiment ---------------------------------------------------------------------------------

def plan(cfg: Config) -> float:
    s = settings(cfg)
    return (s["mem_rounds"] * 2 * 8000 + s["tp_rounds"] * len(TP_SIZES) * len(TP_KINDS) * 900
            + s["oh_rounds"] * len(OVERHEAD_SIZES) * 60)


def run(cfg: Config, progress: Progress) -> dict:
    s = settings(cfg)
    hard = raise_nofile()
    out: dict = {"rounds": s, "nofile": hard}
    # 1. memory
    conns = MEM_CONNECTIONS if hard >= MEM_CONNECTIONS + 200 else max(100, hard // 2 - 200)
    out["memory"] = {"connections": conns, "message": MEM_MESSAGE, "buffers": POOL_BUFFERS,
                     "buffer": BUFFER, "cells": {k: [] for k in MEM_KINDS}}
    for rnd in range(s["mem_rounds"]):
        order = MEM_KINDS if rnd % 2 == 0 else MEM_KINDS[::-1]
        for kind in order:
            server_kind = "ring" if kind == "ring" else "selectors"
            out["memory"]["cells"][kind].append(measure(server_kind, conns, MEM_MESSAGE, 1))
            progress.step(f"bufring memory {kind}, round {rnd + 1}", 8000)
    # 2. throughput
    tp: dict = {}
    for size in TP_SIZES:
        per_conn = max(1, TP_BYTES // (TP_CONNECTIONS * size))
        cells: dict = {k: [] for k in TP_KINDS}
        for rnd in range(s["tp_rounds"]):
            shift = rnd % len(TP_KINDS)
            for kind in TP_KINDS[shift:] + TP_KINDS[:shift]:
                server = "ring" if kind == "ring_pool64" else kind
                cells[kind].append(measure(server, TP_CONNECTIONS, size, per_conn,
                                           TP_BUFFERS.get(kind, POOL_BUFFERS)))
                progress.step(f"bufring {fmt_size(size)} {kind}, round {rnd + 1}", 900)
        tp[str(size)] = {"per_conn": per_conn, "cells": cells}
    out["throughput"] = tp
    # 3. per completion
    sys.path.insert(0, str(HERE))
    import native

    mod = native.build_kernels("arenalib_bench_uring")
    oh: dict = {}
    for size in OVERHEAD_SIZES:
        cells = []
        for rnd in range(s["oh_rounds"]):
            cells.append(overhead_round(mod, size, s["oh_messages"], rnd % 2 == 0))
            progress.step(f"bufring overhead {size} B, round {rnd + 1}", 60)
        oh[str(size)] = {key: summarize([c[key] for c in cells])
                         for key in ("python_ns", "c_ns", "python_cpu", "c_cpu")}
        oh[str(size)]["diff_ns"] = summarize([c["python_ns"] - c["c_ns"] for c in cells])
        oh[str(size)]["diff_cpu"] = summarize([c["python_cpu"] - c["c_cpu"] for c in cells])
    out["overhead"] = oh
    out["load"] = os.getloadavg()
    return out


def _growth_ratio(res: dict) -> dict:
    cells = res["memory"]["cells"]
    return same_round_ratio([c["rss_growth"] for c in cells["ring"]],
                            [c["rss_growth"] for c in cells["recv_into"]])


def _tp(cell: dict) -> float:
    return cell["bytes"] / cell["seconds"] / 1e9


def _cpu_per_mib(cell: dict, who: str = "cpu_s") -> float:
    return cell[who] / (cell["bytes"] / (1 << 20)) * 1e6  # us per MiB


def targets(results: dict) -> list[dict]:
    checks = []
    r = _growth_ratio(results)["median"]
    checks.append({"target": "provided buffers: server RSS growth <= 1/10 of recv_into per connection "
                             "(issue 30)",
                   "status": "MET" if r <= TARGETS["memory"] else "MISSED", "label": "memory", "ratio": r,
                   "connections": results["memory"]["connections"]})
    for size, cell in results["throughput"].items():
        ring, sel = cell["cells"]["ring"], cell["cells"]["selectors"]
        tp = same_round_ratio([_tp(c) for c in ring], [_tp(c) for c in sel])["median"]
        cpu = same_round_ratio([_cpu_per_mib(c) for c in ring], [_cpu_per_mib(c) for c in sel])["median"]
        client_bound = summarize([c["client_cpu_s"] / c["cpu_s"] for c in sel])["median"] > 1
        met = tp >= TARGETS["throughput"] or (client_bound and cpu <= TARGETS["cpu"])
        checks.append({"target": "provided buffers: throughput >= 1.3x selectors+recv_into, or server "
                                 "CPU/byte <= 0.6x where the client is the bound (issue 30)",
                       "status": "MET" if met else "MISSED", "label": f"throughput {fmt_size(int(size))}",
                       "ratio": tp, "cpu_ratio": cpu, "client_bound": client_bound})
    for size, cell in results["overhead"].items():
        d = cell["diff_cpu"]["median"]
        checks.append({"target": "provided buffers: Python overhead per completion <= 1 us over C (issue 30)",
                       "status": "MET" if d <= TARGETS["overhead_ns"] else "MISSED",
                       "label": f"overhead {fmt_size(int(size))}", "ratio": d / 1000})
    return checks


def target_line(check: dict) -> str:
    if check["ratio"] is None:
        return f"{check['status']:6s} not measured"
    if check["label"] == "memory":
        return (f"{check['status']:6s} RSS growth with {check['connections']} connections: "
                f"{check['ratio']:.3f}x recv_into's (limit {TARGETS['memory']})")
    if check["label"].startswith("throughput"):
        bound = "client-bound" if check["client_bound"] else "not client-bound"
        return (f"{check['status']:6s} {check['label']}: {check['ratio']:.2f}x selectors' GB/s (limit 1.3), "
                f"server CPU/byte {check['cpu_ratio']:.2f}x (limit 0.6, {bound})")
    return (f"{check['status']:6s} {check['label']}: {check['ratio'] * 1000:.0f} ns of CPU per completion "
            "over C (limit 1000)")


def tables(results: dict, markdown: bool = False) -> str:
    h = "### " if markdown else ""
    mem = results["memory"]
    rows = []
    for kind, cells in mem["cells"].items():
        g = summarize([c["rss_growth"] for c in cells])["median"]
        total = summarize([c["rss"] for c in cells])["median"]
        rows.append([MEM_LABELS[kind], f"{g / (1 << 20):.1f}", f"{total / (1 << 20):.1f}"])
    ratio = _growth_ratio(results)
    parts = [f"{h}Memory: {mem['connections']} connections of one server, {fmt_size(mem['message'])} each; "
             f"pool {mem['buffers']} x {fmt_size(mem['buffer'])} (ratio {ratio['median']:.3f})",
             table(["server", "RSS growth MiB", "RSS MiB"], rows, markdown), ""]
    rows = []
    for size, cell in results["throughput"].items():
        sel = cell["cells"]["selectors"]
        for kind, cells in cell["cells"].items():
            tp = summarize([_tp(c) for c in cells])["median"]
            cpu = summarize([_cpu_per_mib(c) for c in cells])["median"]
            ccpu = summarize([_cpu_per_mib(c, "client_cpu_s") for c in cells])["median"]
            tr = same_round_ratio([_tp(c) for c in cells], [_tp(c) for c in sel])["median"]
            cr = same_round_ratio([_cpu_per_mib(c) for c in cells], [_cpu_per_mib(c) for c in sel])["median"]
            reads = [c["bytes"] / c["reads"] / 1024 for c in cells if c.get("reads")]
            rows.append([fmt_size(int(size)), LABELS[kind], f"{tp:.2f}", f"{tr:.2f}x", f"{cpu:.0f}",
                         f"{cr:.2f}x", f"{ccpu:.0f}", f"{summarize(reads)['median']:.0f}" if reads else "-"])
    parts += [f"{h}Throughput, {TP_CONNECTIONS} connections, {fmt_size(TP_BYTES)} a measurement "
              "(medians; ratios to selectors, same round)",
              table(["message", "server", "GB/s", "vs sel", "server us/MiB", "vs sel", "client us/MiB",
                     "KiB/read"], rows, markdown), ""]
    rows = []
    for size, cell in results["overhead"].items():
        d = cell["diff_cpu"]
        rows.append([fmt_size(int(size)), f"{cell['python_cpu']['median']:.0f}",
                     f"{cell['c_cpu']['median']:.0f}", f"{d['median']:.0f} ({d['q1']:.0f}-{d['q3']:.0f})",
                     f"{cell['python_ns']['median']:.0f}", f"{cell['c_ns']['median']:.0f}",
                     f"{cell['diff_ns']['median']:.0f}"])
    parts += [f"{h}Per completion: the thread's CPU ns and wall ns of the Python loop (wait(), free()) and "
              "of the C loop over liburing",
              table(["buffer", "Python CPU", "C CPU", "difference (quartiles)", "Python wall", "C wall",
                     "wall diff"], rows, markdown)]
    return "\n".join(parts)


def plots(results: dict, out, plt) -> list[str]:
    """Throughput of every receive loop by message size; the RSS the 10,000 idle connections add."""
    from _plot import bars

    sizes = list(results["throughput"])
    tp = results["throughput"]
    values = {LABELS[kind]: [summarize([_tp(c) for c in tp[n]["cells"][kind]])["median"] for n in sizes]
              for kind in TP_KINDS}
    written = bars(plt, out, "bufring_throughput.png", [f"{fmt_size(int(n))} messages" for n in sizes],
                   values, ylabel="GB/s (median)",
                   title=f"Receiving from {TP_CONNECTIONS} connections over loopback (higher is faster)")
    mem = results["memory"]
    growth = {MEM_LABELS[kind]: [summarize([c["rss_growth"] / (1 << 20)
                                            for c in mem["cells"][kind]])["median"]]
              for kind in MEM_KINDS}
    written += bars(plt, out, "bufring_memory.png", [f"{mem['connections']:,} idle connections"], growth,
                    ylabel="RSS growth (MiB, median)",
                    title="Memory a server holds for idle connections (lower is better)")
    return written

if __name__ == "__main__":
    if "--serve" in sys.argv:
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("--serve")
        p.add_argument("--conns", type=int)
        p.add_argument("--expect", type=int)
        p.add_argument("--buffers", type=int)
        a = p.parse_args()
        sys.exit(server_main(a.serve, a.conns, a.expect, a.buffers))
    run_standalone(__import__(__name__))
