"""Helpers shared by the benchmark modules: configuration, the progress bar, timing statistics,
machine information, RSS readings and plain-text tables.  Standard library only."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass

SIZES = (8, 512, 1024, 4096, 65536, 1 << 20)
BASELINE = "bytearray"   # the peer every ratio is taken against (the "bytearray's round trip")


@dataclass
class Config:
    """Knobs of one run; quick() and full() are the two modes of bench/run.py."""

    mode: str
    rounds: int              # round-trip: measured rounds (A B A B ...) after one warm-up round
    target_ms: float         # round-trip: time of one measurement of one candidate
    memory_bytes: int        # memory: bytes allocated and kept by the workload (survivors + bulk)
    thread_seconds: float    # threads: time of one single-thread measurement
    thread_rounds: int
    seed: int = 6

    @classmethod
    def quick(cls) -> Config:
        return cls(mode="quick", rounds=15, target_ms=8.0, memory_bytes=1_500_000_000,
                   thread_seconds=0.25, thread_rounds=5)

    @classmethod
    def full(cls) -> Config:
        return cls(mode="full", rounds=41, target_ms=30.0, memory_bytes=1_500_000_000,
                   thread_seconds=1.0, thread_rounds=11)

    def asdict(self) -> dict:
        return asdict(self)


# -- progress bar ---------------------------------------------------------------------------------

class Progress:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, a line every 5 %
    otherwise (CI logs).  Units are estimated milliseconds of work: each experiment says how many it
    expects (plan) and steps by its own estimates; sync() corrects the drift after each one."""

    WIDTH = 30

    def __init__(self, total: float, stream=None):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self.label = ""
        self._last_pct = -5
        self._drawn = False

    def step(self, label: str | None = None, units: float = 1) -> None:
        self.done = min(self.done + units, self.total)
        if label is not None:
            self.label = label
        self._draw()

    def sync(self, done: float) -> None:
        self.done = min(done, self.total)
        self._draw()

    def set_label(self, label: str) -> None:
        self.label = label
        self._draw()

    def note(self, message: str) -> None:
        """A line of its own that does not break the bar."""
        self._clear()
        print(message, file=self.stream, flush=True)
        self._draw()

    def close(self) -> None:
        self._clear()
        elapsed = time.monotonic() - self.start
        print(f"done in {elapsed:.0f} s", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        frac = self.done / self.total
        pct = int(frac * 100)
        elapsed = time.monotonic() - self.start
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        eta = ""
        if 0.02 < frac < 1:
            eta = f" eta {fmt_seconds(elapsed / frac - elapsed)}"
        text = f"[{bar}] {pct:3d}% {fmt_seconds(elapsed)}{eta}  {self.label}"
        if self.tty:
            self.stream.write("\r\x1b[K" + text[:160])
            self.stream.flush()
            self._drawn = True
        elif pct >= self._last_pct + 5:
            self._last_pct = pct - pct % 5
            print(text, file=self.stream, flush=True)


class QuietProgress(Progress):
    """A Progress that draws nothing (tests run the experiments at a small scale); notes still go to
    stderr."""

    def __init__(self) -> None:
        super().__init__(1)

    def _draw(self) -> None:
        pass


def fmt_seconds(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


# -- statistics -----------------------------------------------------------------------------------

def summarize(values: list[float]) -> dict:
    """Median and spread of one series of per-round figures."""
    values = sorted(values)
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
    else:
        q1, q3 = values[0], values[-1]
    med = statistics.median(values)
    return {"median": med, "q1": q1, "q3": q3, "min": values[0], "max": values[-1],
            "rel_iqr": (q3 - q1) / med if med else 0.0, "n": len(values)}


def same_round_ratio(per_round_a: list[float], per_round_b: list[float]) -> dict:
    """Median (and spread) of a/b taken round by round: both were measured in the same round."""
    return summarize([a / b for a, b in zip(per_round_a, per_round_b, strict=True)])


# -- machine --------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(distribution: str) -> str | None:
    """The installed version of ``distribution``, read from its metadata: never imported here, as a
    native wheel built for another CPU would kill the process (SIGILL) before it could say so."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    import arenalib

    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        with open("/proc/meminfo") as f:
            mem_total_kib = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        mem_total_kib = 0
    governor = None
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as f:
            governor = f.read().strip()
    except OSError:
        pass
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "cpu_governor": governor,
        "mem_total_gib": round(mem_total_kib / 2**20, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
        "arenalib": arenalib.__version__,
        "jemalloc_of_arenalib": arenalib.jemalloc_version(),
        "numpy": _version("numpy"),
        "pyarrow": _version("pyarrow"),
        "matplotlib": _version("matplotlib"),
    }


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class CpuShare:
    """How much CPU other processes took while the benchmark ran: /proc/stat's busy time of the
    whole machine minus this process's and its children's (os.times), over the machine's total."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        total = sum(fields[:8])                                     # without guest (counted in user)
        t = os.times()
        ours = t.user + t.system + t.children_user + t.children_system
        return (total - idle) / hz, total / hz, ours

    def result(self) -> dict:
        end = self._read()
        if self.start is None or end is None:
            return {}
        busy = end[0] - self.start[0]
        total = end[1] - self.start[1]
        ours = end[2] - self.start[2]
        others = max(busy - ours, 0.0)
        return {"cpu_seconds_total": round(total, 1), "cpu_seconds_ours": round(ours, 1),
                "cpu_seconds_others": round(others, 1),
                "others_share": round(others / total, 3) if total > 0 else None}


# -- memory readings ------------------------------------------------------------------------------

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size now, from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_SIZE


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of RSS (VmHWM), Linux 4.0+."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# -- formatting -----------------------------------------------------------------------------------

def fmt_size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def fmt_ns(ns: float) -> str:
    if ns >= 100_000:
        return f"{ns / 1000:.0f}k"
    if ns >= 10_000:
        return f"{ns / 1000:.1f}k"
    return f"{ns:.0f}"


def fmt_num(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(headers: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """Left-aligned first column, right-aligned others; plain text or GitHub markdown."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        parts = [str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i])
                 for i, c in enumerate(cells)]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts)

    out = [line(headers)]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2))
                                  for i, w in enumerate(widths)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def run_standalone(module) -> None:
    """An experiment run by itself (``python3 bench/<name>.py [--full]``): its run(cfg, progress),
    then its tables and target lines (bench/_experiment.py: what an experiment module has)."""
    import argparse

    parser = argparse.ArgumentParser(description=module.__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the careful run (longer)")
    cfg = Config.full() if parser.parse_args().full else Config.quick()
    progress = Progress(module.plan(cfg))
    results = module.run(cfg, progress)
    progress.close()
    print(module.tables(results))
    for check in module.targets(results):
        print(module.target_line(check))


def run_memory_child(workload, doc: str) -> int:
    """A memory workload's child process (``--child NAME --bytes N [--seed S]``): run
    ``workload(name, nbytes, seed)`` for one candidate and print its figures as JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--child", required=True, metavar="NAME", help="the candidate")
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=6)
    args = parser.parse_args()
    print(json.dumps(workload(args.child, args.bytes, args.seed)), flush=True)
    return 0
