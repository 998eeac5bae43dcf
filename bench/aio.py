"""Experiment 7, asyncio frames (issue 15): receiving length-prefixed frames into arena memory with
arenalib.aio.FrameReader against receiving each into a new ``bytearray(n)``, over loopback TCP between
two processes.

What it measures: a client process sends N frames of 1 MiB or 64 MiB (an 8-byte big-endian length,
then the bytes) to an asyncio server in another process; per connection, after a warm-up frame, the
throughput (the frames' bytes over the time from the end of the warm-up frame's sending to the
server's reply after the last frame) and the server's CPU time per frame
(``resource.getrusage(RUSAGE_SELF)``, user + system, in the server process, from the warm-up frame's
delivery to ``eof_received``: the receiving and the frames' allocation and freeing, kernel copies
included), and its minor page faults per frame.  Two server protocols, the same code:
- ``FrameReader (arena)``: ``arenalib.aio.FrameReader`` with the Arena its readers share (its
  default), the consumer freeing each frame with ``seg.free(deferred=True)``;
- ``bytearray(n) per frame``: the very same FrameReader code with an allocator whose ``allocate(n)``
  returns ``bytearray(n)`` (the consumer drops it): what dask's TCP comm does (a ``bytearray`` per
  frame, filled by tornado's ``read_into``, its first bytes copied from the stream's 64 KiB buffer
  as FrameReader copies them from its staging buffer).
So the two differ only in where a frame's memory comes from: a zeroed ``bytearray`` per frame (for
64 MiB, glibc maps fresh pages and the kernel zeroes and faults in each of them, then unmaps them at
the free) or an arena whose freed memory is reused by the next frame.

How:
* The server (``python bench/aio.py --serve LOOP``) listens on one port per protocol; it answers the
  client's end of sending (shutdown of its write side, seen as ``eof_received``) with a JSON line of
  its figures for the connection.  Two server processes run side by side: one on asyncio's own event
  loop (the selector loop dask runs on by default: the targets are checked there) and one on uvloop
  where it imports and runs (reported beside; skipped with the reason otherwise).
* The client is a blocking socket in the benchmark's process (``sendall`` of a prebuilt payload
  through a memoryview: no copy in user space beyond the kernel's).  One measurement is one
  connection; its first frame is sent before the timer starts and the server's figures start at its
  delivery (warm-up: the connection's arena and first pages, the TCP window).
* Rounds: each round measures both protocols on each loop, the first of the two alternating; ratios
  are taken within a round (FrameReader over bytearray: throughput, CPU per frame) and their medians
  reported.  A whole untimed measurement of each comes first.  Quick mode: 7 rounds of 8 x 64 MiB and
  512 x 1 MiB frames per measurement; full mode: 9 rounds of 24 x 64 MiB and 1536 x 1 MiB.

What bounds it: over loopback the sending side does most of TCP's work (the copy into the socket,
and the receive path of the other end, which runs in the sender's softirq), the receiving side the
copy out of the socket.  So the client bounds the throughput unless the server does more per frame
than it: the "server busy" column (the server's CPU time over the elapsed time) says which.  At
64 MiB the bytearray server does (16,385 page faults a frame: the kernel maps and zeroes fresh
pages), so the arena's throughput shows; at 1 MiB glibc reuses one heap block and the bytearray's
only extra cost is zeroing 1 MiB (~25 us of ~250 us of server CPU a frame, measured on the first
runs), with both servers idle ~25-30 % of the time: both run at the client's speed.  The
"server-bound" figure of the targets is the inverse of the CPU-per-frame ratio: the most the
throughput ratio could be were the server all that bounds it (a faster client, or a server that
has other work).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

from _common import Config, Progress, fmt_size, run_standalone, same_round_ratio, summarize, table
from _experiment import finding, side, times

HERE = Path(__file__).resolve().parent
TITLE = "7. asyncio frames: arenalib.aio.FrameReader (issue 15)"
SIZES = (1 << 20, 64 << 20)
KEYS = ("framereader", "bytearray")
LABELS = {"framereader": "FrameReader (arena), seg.free(deferred=True)",
          "bytearray": "bytearray(n) per frame (dask's TCP comm)"}
LOOPS = ("asyncio", "uvloop")
SHORT = {"framereader": "FrameReader", "bytearray": "bytearray(n)"}  # the tables' row names
TARGET_LOOP = "asyncio"   # the (and dask's default) loop; uvloop's figures are shown beside
SETTINGS = {"quick": {"rounds": 7, "frames": {1 << 20: 512, 64 << 20: 8}},
            "full": {"rounds": 9, "frames": {1 << 20: 1536, 64 << 20: 24}}}
# Targets of issue 15: FrameReader over bytearray, same round.
TARGETS = {64 << 20: {"throughput": 1.5, "cpu": 0.6}, 1 << 20: {"throughput": 1.2}}


def settings(cfg: Config) -> dict:
    return SETTINGS["full" if cfg.mode == "full" else "quick"]


# -- the server (its own process) -------------------------------------------------------------------

class BytearrayAllocator:
    """What FrameReader asks of its arena, answered with a new bytearray per frame."""

    @staticmethod
    def allocate(size: int, zero: bool = False) -> bytearray:
        return bytearray(size)


def server_protocol(kind: str):
    """A factory of the server's protocol ``kind``: FrameReader, answering the client's EOF with its
    figures for the connection, counted from the first frame's delivery (the warm-up frame)."""
    from arenalib.aio import FrameReader

    class Measured(FrameReader):
        cpu0: resource.struct_rusage | None = None
        timed_bytes = 0

        def eof_received(self):
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            c0 = self.cpu0 or cpu
            seconds = (cpu.ru_utime - c0.ru_utime) + (cpu.ru_stime - c0.ru_stime)
            self.transport.write(json.dumps({
                "frames": self.frames, "timed_frames": max(0, self.frames - 1),
                "timed_bytes": self.timed_bytes,
                "cpu_s": seconds, "minflt": cpu.ru_minflt - c0.ru_minflt}).encode() + b"\n")
            self.transport.close()
            super().eof_received()  # the staging buffer goes back, as the README asks of subclasses
            return True

    def factory():
        def on_frame(frame) -> None:
            if protocol.cpu0 is None:     # the warm-up frame: the figures start here
                protocol.cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            else:
                protocol.timed_bytes += len(frame)
            if kind == "framereader":
                frame.free(deferred=True)   # asyncio still holds the buffer: freed when it lets go
            # (a bytearray is dropped here)

        if kind == "framereader":
            protocol = Measured(on_frame)                                  # the readers' shared Arena
        else:
            protocol = Measured(on_frame, arena=BytearrayAllocator())     # type: ignore[arg-type]
        return protocol

    return factory


async def serve() -> None:
    loop = asyncio.get_running_loop()
    servers = {kind: await loop.create_server(server_protocol(kind), "127.0.0.1", 0) for kind in KEYS}
    ports = {kind: s.sockets[0].getsockname()[1] for kind, s in servers.items()}
    print(json.dumps({"ports": ports}), flush=True)
    # Until the benchmark closes our stdin.
    await loop.run_in_executor(None, sys.stdin.read)
    for s in servers.values():
        s.close()


# -- the client (the benchmark's process) -----------------------------------------------------------

def send_frames(port: int, size: int, count: int, payload: memoryview) -> dict:
    """One connection: a warm-up frame, then ``count`` timed frames; the server's figures plus the
    client's elapsed seconds."""
    header = size.to_bytes(8, "big")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(header)
        sock.sendall(payload)
        t0 = time.perf_counter()
        for _ in range(count):
            sock.sendall(header)
            sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        seconds = time.perf_counter() - t0
    figures = json.loads(reply)
    if figures["timed_frames"] != count or figures["timed_bytes"] != count * size:
        raise RuntimeError(f"the server saw {figures['timed_frames']} timed frames, {figures['timed_bytes']} "
                           f"bytes; {count} of {size} bytes were sent")
    figures["seconds"] = seconds
    return figures


def plan(cfg: Config) -> float:
    """Estimated milliseconds at ~1.5 GB/s over loopback."""
    s = settings(cfg)
    per_round = sum(2 * n * size for size, n in s["frames"].items()) / 1.5e6
    return len(LOOPS) * per_round * (s["rounds"] + 1)


def start_server(loop: str) -> tuple[subprocess.Popen | None, dict | str]:
    """The server process on event loop ``loop`` ("asyncio" or "uvloop"): (process, ports by protocol),
    or (None, why it did not start: uvloop missing, or dead by a signal)."""
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", loop],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    line = server.stdout.readline()
    if line:
        return server, json.loads(line)["ports"]
    server.stdin.close()
    err = server.stderr.read().strip().splitlines()
    status = server.wait()
    why = f"killed by signal {-status}" if status < 0 else (err[-1] if err else f"exit status {status}")
    return None, f"the {loop} server did not start: {why}"


def stop_server(server: subprocess.Popen) -> None:
    server.stdin.close()   # its signal to stop
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    server.stdout.close()
    server.stderr.close()


def run(cfg: Config, progress: Progress) -> dict:
    s = settings(cfg)
    rounds = s["rounds"]
    results: dict = {
        "method": {"rounds": rounds, "loops": list(LOOPS),
                   "frames_per_measurement": {str(k): v for k, v in s["frames"].items()},
                   "client": "blocking socket, sendall, another process",
                   "cpu": "server getrusage(RUSAGE_SELF) utime+stime, from the warm-up frame's delivery to "
                          "eof_received", "sizes": list(SIZES)},
        "candidates": dict(LABELS),
        "skipped": {},
        "cells": {},
    }
    servers: dict[str, tuple[subprocess.Popen, dict]] = {}
    try:
        for loop in LOOPS:
            server, ports = start_server(loop)
            if server is None:
                results["skipped"][loop] = ports
                progress.note(f"aio: skipping {loop}: {ports}")
            else:
                servers[loop] = (server, ports)
        for size in SIZES:
            count = s["frames"][size]
            payload = memoryview(os.urandom(1 << 20) * (size >> 20))
            progress.set_label(f"aio {fmt_size(size)}: warm-up")
            for _, ports in servers.values():
                for kind in KEYS:   # a whole measurement each, untimed
                    send_frames(ports[kind], size, count, payload)
            per: dict = {loop: {kind: {"gb_per_s": [], "cpu_ms_per_frame": [], "faults_per_frame": [],
                                       "server_busy": []}
                                for kind in KEYS} for loop in servers}
            for rnd in range(rounds):
                for loop, (_, ports) in servers.items():
                    for kind in (KEYS if rnd % 2 == 0 else KEYS[::-1]):
                        f = send_frames(ports[kind], size, count, payload)
                        frames = f["timed_frames"]
                        cell = per[loop][kind]
                        cell["gb_per_s"].append(count * size / f["seconds"] / 1e9)
                        cell["cpu_ms_per_frame"].append(f["cpu_s"] * 1e3 / frames)
                        cell["faults_per_frame"].append(f["minflt"] / frames)
                        cell["server_busy"].append(f["cpu_s"] / f["seconds"])
                progress.step(f"aio {fmt_size(size)}: round {rnd + 1}/{rounds}",
                              len(servers) * 2 * count * size / 1.5e6)
            for loop in servers:
                p = per[loop]
                cells = results["cells"].setdefault(loop, {}).setdefault(str(size), {})
                for kind in KEYS:
                    cells[kind] = {name: summarize(values) for name, values in p[kind].items()}
                    cells[kind]["per_round"] = p[kind]
                cells["ratios"] = {
                    "throughput": same_round_ratio(p["framereader"]["gb_per_s"], p["bytearray"]["gb_per_s"]),
                    "cpu_per_frame": same_round_ratio(p["framereader"]["cpu_ms_per_frame"],
                                                      p["bytearray"]["cpu_ms_per_frame"]),
                    # The most the throughput ratio could be were the server all that bounds it.
                    "server_bound_throughput": same_round_ratio(p["bytearray"]["cpu_ms_per_frame"],
                                                                p["framereader"]["cpu_ms_per_frame"]),
                }
        return results
    finally:
        for server, _ in servers.values():
            stop_server(server)


# -- reading the results back (targets, tables; also from a results.json) -------------------------

def findings(results: dict) -> list[dict]:
    """The verdict's sentences: FrameReader against a bytearray per frame, throughput (and the server's
    CPU per frame) per loop and frame size, grouped by who wins."""
    grouped: dict[str, list[tuple[str, float]]] = {}
    for loop, by_size in results["cells"].items():
        for size in results["method"]["sizes"]:
            ratios = (by_size.get(str(size)) or {}).get("ratios")
            if not ratios:
                continue
            r, cpu = ratios["throughput"]["median"], ratios["cpu_per_frame"]["median"]
            grouped.setdefault(side(r, lower_is_faster=False), []).append(
                (f"{times(r, lower_is_faster=False)} on {loop} at {fmt_size(size)} "
                 f"({cpu:.2f}x the server CPU)",
                 cpu))
    out = []
    for kind, parts in grouped.items():
        why = None
        if kind != "win":
            cpus = [cpu for _, cpu in parts]
            why = ("the server spends about the same CPU per frame either way: at this frame size a new "
                   "bytearray "
                   "costs what an arena segment does" if all(cpu > 0.8 for cpu in cpus)
                   else "the loopback copy and the client bound the throughput too")
        out.append(finding(kind, "asyncio frames over loopback, FrameReader into arena segments against a "
                                 f"bytearray(n) per frame: {', '.join(p for p, _ in parts)}.", why))
    for loop, why in results.get("skipped", {}).items():
        out.append(finding("skip", f"asyncio frames: the {loop} loop not measured.", why))
    return out


def plots(results: dict, out, plt) -> list[str]:
    """Throughput of FrameReader and of a bytearray per frame, grouped by loop and frame size."""
    from _plot import bars

    groups = [(loop, size) for loop in results["cells"] for size in results["method"]["sizes"]
              if str(size) in results["cells"][loop]]
    values = {results["candidates"][kind]: [results["cells"][loop][str(size)][kind]["gb_per_s"]["median"]
                                            for loop, size in groups] for kind in KEYS}
    return bars(plt, out, "aio_throughput.png", [f"{loop}, {fmt_size(size)} frames" for loop, size in groups],
                values, ylabel="GB/s (median)", title="asyncio frames over loopback (higher is faster)")


def targets(results: dict) -> list[dict]:
    checks = []
    for size, limits in TARGETS.items():
        ratios = results["cells"].get(TARGET_LOOP, {}).get(str(size), {}).get("ratios")
        for what, limit in limits.items():
            r = ratios["throughput" if what == "throughput" else "cpu_per_frame"] if ratios else None
            at_least = what == "throughput"
            item = {"target": f"aio (issue 15): FrameReader over bytearray(n) per frame, {TARGET_LOOP} loop, "
                              f"{'throughput >=' if at_least else 'server CPU per frame <='} {limit}x",
                    "candidate": "framereader", "label": LABELS["framereader"], "size": size,
                    "versus": "bytearray", "versus_label": LABELS["bytearray"], "limit": limit,
                    "at_least": at_least}
            if r is None:
                item.update(status="n/a", ratio=None)
            else:
                met = r["median"] >= limit if at_least else r["median"] <= limit
                item.update(ratio=r["median"], ratio_q1=r["q1"], ratio_q3=r["q3"],
                            status="MET" if met else "MISSED", borderline=r["q1"] <= limit <= r["q3"])
                if at_least:
                    cells = results["cells"][TARGET_LOOP][str(size)]
                    item["server_busy"] = {kind: cells[kind]["server_busy"]["median"] for kind in KEYS}
                    item["server_bound"] = ratios["server_bound_throughput"]["median"]
            checks.append(item)
    return checks


def target_line(c: dict) -> str:
    size = f" at {fmt_size(c['size'])}"
    if c["ratio"] is None:
        return f"{c['status']:6s} {c['label']}{size}: not measured"
    bound = "at least" if c["at_least"] else "at most"
    line = (f"{c['status']:6s} {c['label']}{size}: {c['ratio']:.2f}x {c['versus_label']} ({bound} "
            f"{c['limit']:.2f}x{', within noise' if c.get('borderline') else ''})")
    if c.get("server_bound") is not None:
        busy = c["server_busy"]
        line += (f"; servers busy {busy['framereader']:.0%} / {busy['bytearray']:.0%} of the time; were the "
                 f"server all that bounds it: {c['server_bound']:.2f}x (the inverse of their CPU per frame)")
    return line


def tables(results: dict, markdown: bool = False) -> str:
    h = "### " if markdown else ""
    rows = []
    for loop, by_size in results["cells"].items():
        for size in results["method"]["sizes"]:
            cells = by_size.get(str(size))
            if not cells:
                continue
            for kind in KEYS:
                c = cells[kind]
                mine = kind == "framereader"
                rows.append([SHORT[kind], loop, fmt_size(size),
                             f"{c['gb_per_s']['median']:.2f}",
                             f"{cells['ratios']['throughput']['median']:.2f}" if mine else "",
                             f"{c['cpu_ms_per_frame']['median']:.3f}",
                             f"{cells['ratios']['cpu_per_frame']['median']:.2f}" if mine else "",
                             f"{c['faults_per_frame']['median']:.0f}",
                             f"{c['server_busy']['median']:.0%}"])
    m = results["method"]
    title = (f"{h}asyncio frames over loopback (two processes; {m['rounds']} rounds, medians; ratios: "
             "FrameReader over bytearray in the same round)")
    out = ["What and how: bench/aio.py's docstring.", ""] if markdown else []
    out += [title, table(["server protocol", "loop", "frame", "GB/s", "ratio", "server CPU ms/frame", "ratio",
                         "faults/frame", "server busy"], rows, markdown)]
    out += [f"{SHORT[kind]}: {label}" for kind, label in results["candidates"].items()]
    out += [f"Skipped {loop}: {why}" for loop, why in results.get("skipped", {}).items()]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        if sys.argv[2] == "uvloop":
            import uvloop
            uvloop.run(serve())
        else:
            asyncio.run(serve())
        sys.exit(0)
    run_standalone(sys.modules[__name__])
