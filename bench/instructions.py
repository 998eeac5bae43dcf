"""Instructions per op of experiment 8's statements (bench/frames.py), split by where they run.

    .venv/py3.11/bin/python bench/instructions.py [--size 512] [--ops 20000]

What: for each statement of experiment 8 (arenalib's frames, bytearray, the floor over no-op C
objects), plus the empty loop and an empty frame, the instructions one op executes, counted by
callgrind (valgrind, Debian's package; the machine's load does not change them), in all and split
between the interpreter (libpython), arenalib's extension, the floor's module and libc.  Timing
varies with the machine's load; instruction counts do not, and they say which part of a statement
is arenalib's and which is CPython's own.

How: each statement runs in experiment 1's loop (every name a local, the garbage collector off)
in a child process under callgrind, once with a warm-up only and once with ``--ops`` more ops; the
difference of the two, per shared object, over ``--ops`` is the count per op (start-up, imports and
the warm-up cancel out).  Not part of bench/run.py: it needs valgrind, and takes a minute or two.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP = 2000
# Where an instruction ran, by the shared object callgrind names: the first pattern that matches.
PARTS = (("interpreter", r"libpython|/bin/python"), ("arenalib", r"arenalib/_\w+\.cpython"),
         ("floor", r"arenalib_bench_floor"), ("libc", r"libc\.so|libm\.so"))
EXTRA = {  # statements beside experiment 8's candidates
    "loop": ("the loop alone", "pass", lambda arena, floor, n: {}),
    "empty frame": ("with a.frame(): pass", "with fa(): pass",
                    lambda arena, floor, n: {"fa": arena.frame}),
    "empty floor": ("no-op C frame: pass", "with fa(): pass",
                    lambda arena, floor, n: {"fa": floor.NullArena().frame}),
}


def statements(arena, floor) -> dict:
    """key -> (label, statement, setup(n) -> the names it uses)."""
    sys.path.insert(0, str(HERE))
    import frames

    out = {c.key: (c.label, c.op, c.setup) for c in frames.candidates(arena, floor)}
    for key, (label, op, setup) in EXTRA.items():
        if floor is not None or "floor" not in key:
            out[key] = (label, op, lambda n, setup=setup: setup(arena, floor, n))
    return out


def child(key: str, size: int, ops: int) -> None:
    """Run statement ``key`` WARMUP + ``ops`` times (under callgrind, started by measure())."""
    import gc

    import frames

    import arenalib

    arena = arenalib.SlicingArena()
    _, op, setup = statements(arena, frames.floor_module())[key]
    env = setup(size)
    names = sorted(env)
    src = (f"def run(k{''.join(f', {name}={name}' for name in names)}):\n"
           f"    for _ in range(k):\n        {op}\n")
    namespace = dict(env)
    exec(compile(src, f"<instructions {key}>", "exec"), namespace)
    gc.disable()
    namespace["run"](WARMUP)
    namespace["run"](ops)


def _per_object(out_file: Path) -> dict[str, int]:
    """Instructions per shared object (self cost) in a callgrind output file, read from the file
    itself: "ob=" names the object the cost lines that follow ran in, and the line after "calls="
    is a callee's inclusive cost, already counted where it ran."""
    names: dict[str, str] = {}
    totals: dict[str, int] = defaultdict(int)
    current, callee_cost = "?", False
    for line in out_file.read_text().splitlines():
        if line.startswith(("ob=", "cob=")):  # (one table of compressed names for both)
            m = re.match(r"c?ob=(?:\((\d+)\))? ?(.*)", line)
            if m.group(1) and m.group(2):
                names[m.group(1)] = m.group(2)
            if line.startswith("ob="):
                current = names.get(m.group(1), m.group(2)) if m.group(1) else m.group(2)
        elif line.startswith("calls="):
            callee_cost = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            fields = line.split()  # the position, then the count (missing: 0)
            if callee_cost:
                callee_cost = False
            elif len(fields) > 1:
                totals[current] += int(fields[1])
    return totals


def measure(key: str, size: int, ops: int) -> dict[str, float]:
    """Instructions per op of statement ``key``, by part."""
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (0, ops):
            out_file = Path(tmp) / f"callgrind.{n}"
            command = [sys.executable, str(Path(__file__).resolve()), "--child", key, "--size", str(size),
                       "--ops", str(n)]
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *command],
                           check=True, capture_output=True)
            counts.append(_per_object(out_file))
    parts: dict[str, float] = defaultdict(float)
    for obj in set(counts[0]) | set(counts[1]):
        part = next((name for name, pattern in PARTS if re.search(pattern, obj)), "other")
        parts[part] += (counts[1].get(obj, 0) - counts[0].get(obj, 0)) / ops
    parts["total"] = sum(parts.values())
    return dict(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.size, args.ops)
        return 0
    if shutil.which("valgrind") is None:
        print("bench/instructions.py needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 1
    sys.path.insert(0, str(HERE))
    import frames

    import arenalib

    arena = arenalib.SlicingArena()
    keys = statements(arena, frames.floor_module())
    arena.close()
    rows = []
    for key, (label, op, _) in keys.items():
        parts = measure(key, args.size, args.ops)
        rows.append((label, op, parts))
        print(f"  {label}: {parts['total']:.0f}", file=sys.stderr, flush=True)
    columns = ["total", *[name for name, _ in PARTS], "other"]
    print(f"Instructions per op at n = {args.size} (callgrind; {args.ops} ops after {WARMUP} of warm-up)")
    print(f"{'statement':30s}" + "".join(f"{c:>12s}" for c in columns))
    for label, _, parts in rows:
        # (a part's difference of two runs can come out a few instructions under 0: shown as 0)
        print(f"{label:30s}" + "".join(f"{max(parts.get(c, 0.0), 0.0):12.0f}" for c in columns))
    print("\nStatements:")
    for label, op, _ in rows:
        print(f"  {label}: {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
