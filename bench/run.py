"""arenalib's benchmark comparison against the peers a user would pick instead (issue 6).

Arenalib and its peers run side by side in one run.  The report opens with a verdict in plain words
computed from the run's figures (where arenalib wins and by how much, where it does not and why, what
the run did not measure), then the tables, then the checklist of the project's targets; results.json
keeps every figure, and each experiment draws a PNG plot.  No printed line is over 120 columns.

    python3 dev.py bench                      # quick mode (under 3 minutes on 2 cores)
    python3 dev.py bench --full               # the careful run
    .venv/py3.11/bin/python bench/run.py [--full] [--out DIR]
                                         [--only roundtrip,memory,threads,pool,native,scopes,uring,aio]

Experiments, one module each (its docstring says what it measures and how; each also runs alone,
``python3 bench/<name>.py [--full]``):
    roundtrip.py   allocate + fill(3) + free per op, 8 B to 1 MiB: ns/op, ops/ms, ratio to bytearray
    memory.py      RSS through a fragmenting ~1.5 GB workload and a long-lived allocator gone idle, a
                   fresh process per candidate (_memory_fragment.py, _memory_idle.py)
    threads.py     1 and 2 Python threads allocating: ops/s, scaling, single-thread ratio to bytearray
    pool.py        BufferPool: acquire + release per op, a file read through pool buffers
    native.py      the C level through ``cimport arenalib`` (Cython kernels in native/)
    scopes.py      one arena per scope (k blocks of 8 B to 1 MiB, then close): ns/block, ratio to
                   bytearray, minor page faults per scope; the per-scope cost of a 512 B ConfinedArena
                   (_scopes_per_scope.py)
    uring.py       reading a file through arenalib.Ring (read_fixed, QD 1/8/32, page cache and O_DIRECT)
                   against an os.preadv loop, a C loop over liburing and PyPI's liburing (the loops:
                   _uring_loops.py); the Python overhead per request (a QD32 NOP loop from Python minus
                   the same loop in C)
    aio.py         asyncio frames over loopback between two processes, 1 MiB and 64 MiB: FrameReader
                   into arena segments vs a bytearray(n) per frame; throughput and server CPU per frame
    helpers.py     the Panama-style helpers (allocate_from, copy, mismatch, ==, hex, allocate_string), each
                   against its fastest Python equivalent at 64 B, 4 KiB and 64 KiB: ratios; resize in
                   place against allocate + free; arenalib.allocate(n) against bytearray(n)
    numpy_scope.py NumPy in `with arena.numpy():` against NumPy's default handler: the loop c = a*b + a at
                   64 MiB and 1-16 MiB (ms and page faults per iteration), small arrays, RSS at scope exit
    bufring.py     provided buffers and multishot receive (Ring.provide, recv_multishot) over loopback in two
                   processes: server RSS with 10,000 connections, throughput and CPU/byte over 16 connections
                   against selectors + recv_into and asyncio's FrameReader, the Python overhead per completion

This module only orchestrates: every experiment module has the members of _experiment.Experiment
(plan, run, targets, target_line, tables, plots; findings, the verdict's sentences, where it has
them) and is reached only through them; _report.py lays out what they return.  The experiments run
one after the other in the same sitting, each in a child process of its own (``run.py --child
NAME``): one that dies (a signal, such as SIGILL from an extension built for another CPU) or raises
is reported by name with the reason, left out of the tables, targets and plots, and the run goes on
(exit status 1 at the end).  Output goes to bench/out/ (gitignored) unless --out says otherwise:
results.json, results.md and the PNG plots (results.json first, so a report that fails loses no
figure).  bench/results/ holds the reference run (a --full run; its results.md says where and
when).  --from-json FILE redoes the verdict, tables, targets, plots and markdown of a results.json
without measuring.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import Config, CpuShare, Progress, loadavg, machine_info  # noqa: E402
from _experiment import Experiment, load  # noqa: E402
from _report import compact_json, report  # noqa: E402

# The report's order (the experiments' numbers in results.md) ...
EXPERIMENTS = ("roundtrip", "memory", "threads", "pool", "native", "scopes", "uring", "aio", "frames",
               "helpers", "numpy_scope", "bufring")
# ... and the run's: the memory experiment after the Python-level timings, so the kernel's reclaiming
# of its 1.5 GB children does not disturb them (scopes counts page faults); the I/O of uring and aio last.
RUN_ORDER = ("roundtrip", "threads", "scopes", "frames", "helpers", "numpy_scope", "memory", "pool", "native",
             "uring", "aio", "bufring")


def experiments(res: dict) -> list[tuple[str, Experiment]]:
    """(name, module) of every experiment with results in ``res``, in report order."""
    return [(name, load(name)) for name in EXPERIMENTS if name in res]


def targets(res: dict) -> list[tuple[Experiment, list[dict]]]:
    """Each experiment's checks of the project's targets, computed from its results in ``res``."""
    return [(exp, exp.targets(res[name])) for name, exp in experiments(res)]


def finish(res: dict, out: Path) -> None:
    """The targets into ``res`` (results.json keeps them), then the report."""
    (out / "results.json").write_text(compact_json(res) + "\n")  # first: a report that fails loses nothing
    groups = targets(res)
    res["targets"] = [c for _, checks in groups for c in checks]
    report(res, experiments(res), groups, out, RUN_ORDER)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the careful run (longer)")
    parser.add_argument("--out", default=str(HERE / "out"), help="output directory (default bench/out)")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help="comma-separated experiments: " + ",".join(EXPERIMENTS))
    parser.add_argument("--memory-bytes", type=float, default=None,
                        help="bytes the memory workload keeps (default 1.5e9)")
    parser.add_argument("--from-json", metavar="FILE",
                        help="measure nothing: redo the verdict, tables, targets, plots and markdown of "
                             "a results.json")
    parser.add_argument("--experiments-dir", metavar="DIR",
                        help="look the experiment modules up in DIR first (the tests' stand-ins)")
    parser.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)   # run.py runs each
    parser.add_argument("--result", metavar="FILE", help=argparse.SUPPRESS)  # experiment in a child
    parser.add_argument("--config", metavar="JSON", help=argparse.SUPPRESS)  # process of its own
    args = parser.parse_args()
    if args.experiments_dir:
        sys.path.insert(0, str(Path(args.experiments_dir).resolve()))
    if args.child:
        return child_main(args.child, Path(args.result), Config(**json.loads(args.config)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json:
        finish(json.loads(Path(args.from_json).read_text()), out)
        return 0
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    if not only:
        parser.error(f"--only names no experiment; the experiments are {', '.join(EXPERIMENTS)}")
    unknown = set(only) - set(EXPERIMENTS)
    if unknown:
        parser.error(f"unknown experiment(s): {', '.join(sorted(unknown))}; the experiments are "
                     f"{', '.join(EXPERIMENTS)}")
    cfg = Config.full() if args.full else Config.quick()
    if args.memory_bytes:
        cfg.memory_bytes = int(args.memory_bytes)

    res: dict = {
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": cfg.asdict(),
        "only": only,
        "loadavg_before": loadavg(),
        "machine": machine_info(),
        "env": {k: v for k, v in os.environ.items()
                if k.startswith(("OPENBLAS_", "ARENALIB_", "MALLOC_", "GLIBC_TUNABLES"))},
        "failed": {},
    }
    print(f"arenalib benchmark, {cfg.mode} mode: {', '.join(only)} -> {out}", file=sys.stderr)
    busy = loadavg()[:1]
    if busy and busy[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {busy[0]} before the run: other processes compete for the CPUs "
              "and will make the figures noisy", file=sys.stderr)
    cpu = CpuShare()
    planned = {name: plan(name, cfg) for name in only}
    progress = Progress(sum(planned.values()))
    t0 = time.perf_counter()
    for name in RUN_ORDER:
        if name in only:
            t = time.perf_counter()
            start = progress.done
            share = CpuShare()
            result, failure = run_in_child(name, cfg, progress, args.experiments_dir)
            progress.sync(start + planned[name])
            if failure is not None:
                res["failed"][name] = failure
                progress.note(f"{name}: {failure}")
                continue
            res[name] = result
            res[name]["wall_seconds"] = round(time.perf_counter() - t, 1)
            res[name]["cpu_share"] = share.result()
    progress.close()
    res["wall_seconds"] = round(time.perf_counter() - t0, 1)
    res["loadavg_after"] = loadavg()
    res["cpu_share"] = cpu.result()
    finish(res, out)
    return 1 if res["failed"] else 0


def plan(name: str, cfg: Config) -> float:
    try:
        return load(name).plan(cfg)
    except Exception:  # the child will fail the same way and say why
        return 1


# -- each experiment in a child process -----------------------------------------------------------
#
# An experiment that dies (a signal: SIGILL from an extension built for another CPU, SIGSEGV) or
# raises takes only its own process down: the parent reports it by name and goes on.  The child
# writes its result as JSON to --result and its progress as JSON lines to its stdout (anything else
# it prints goes to its stderr, which the parent shows as notes).

class ChildProgress:
    """The Progress interface inside a child: every change goes to the parent as a JSON line."""

    def __init__(self, stream):
        self.stream = stream
        self.done = 0.0
        self.label = ""

    def _send(self, **message) -> None:
        self.stream.write(json.dumps(message) + "\n")
        self.stream.flush()

    def step(self, label: str | None = None, units: float = 1) -> None:
        self.done += units
        self.label = self.label if label is None else label
        self._send(done=self.done, label=self.label)

    def sync(self, done: float) -> None:
        self.done = done
        self._send(done=self.done, label=self.label)

    def set_label(self, label: str) -> None:
        self.label = label
        self._send(done=self.done, label=label)

    def note(self, message: str) -> None:
        self._send(note=message)


def child_main(name: str, result: Path, cfg: Config) -> int:
    """Run one experiment; its result (or the exception it raised) goes to ``result`` as JSON."""
    faulthandler.enable()  # a fatal signal prints the Python stack to stderr, then kills the process
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (the experiment's, its subprocesses') go to stderr
    try:
        text, status = json.dumps({"result": load(name).run(cfg, ChildProgress(channel))}), 0
    except BaseException as exc:
        traceback.print_exc()
        text, status = json.dumps({"error": traceback.format_exception_only(type(exc), exc)[-1].strip()}), 1
    partial = result.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(result)  # whole or absent
    return status


def run_in_child(name: str, cfg: Config, progress: Progress,
                 experiments_dir: str | None = None) -> tuple[dict | None, str | None]:
    """Run experiment ``name`` in a child process: ``(result, None)``, or ``(None, why it failed)``."""
    start = progress.done
    progress.set_label(f"{name}: starting")
    with tempfile.TemporaryDirectory(prefix="arenalib-bench-") as tmp:
        result_file = Path(tmp) / f"{name}.json"
        cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), str(Path(__file__).resolve()),
               "--child", name, "--result", str(result_file), "--config", json.dumps(cfg.asdict()),
               *(["--experiments-dir", experiments_dir] if experiments_dir else [])]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stderr_tail: collections.deque[str] = collections.deque(maxlen=20)

        def on_message(line: str) -> None:
            try:
                message = json.loads(line)
            except ValueError:
                message = {"note": line}
            if "note" in message:
                progress.note(message["note"])
            else:
                progress.label = message["label"]
                progress.sync(start + message["done"])

        def on_stderr(line: str) -> None:
            stderr_tail.append(line)
            progress.note(line)

        _pump(proc, on_message, on_stderr)
        returncode = proc.wait()
        payload = json.loads(result_file.read_text()) if result_file.exists() else {}
    if "result" in payload and returncode == 0:
        return payload["result"], None
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return None, f"died with {sig.name} ({signal.strsignal(sig)})"
    if "error" in payload:
        return None, f"raised {payload['error']}"
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    return None, f"exited with status {returncode}" + (f": {last.strip()}" if last else "")


def _pump(proc: subprocess.Popen, on_stdout, on_stderr) -> None:
    """Feed the lines of the child's stdout and stderr to the two callbacks as they come, until both
    are closed."""
    handlers = {proc.stdout: on_stdout, proc.stderr: on_stderr}
    pending = {proc.stdout: b"", proc.stderr: b""}
    with selectors.DefaultSelector() as selector:
        for stream in handlers:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    chunk = b"\n" if pending[key.fileobj] else b""
                *lines, pending[key.fileobj] = (pending[key.fileobj] + chunk).split(b"\n")
                for line in lines:
                    handlers[key.fileobj](line.decode(errors="replace"))


if __name__ == "__main__":
    sys.exit(main())
