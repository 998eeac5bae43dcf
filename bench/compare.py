"""Compare two full benchmark runs (results.json of `python3 dev.py bench --full`): before and after a
change, arenalib's figures side by side.

    python3 bench/compare.py BEFORE.json AFTER.json [BEFORE2.json ...]

Later BEFORE files fill in the experiments that failed in the first.  Every figure compared is a
same-round ratio (to the peer measured in the same round), so the machine's speed of the day cancels
out; the native figures that include a fill are also given against the fill alone.  A figure is
flagged WORSE when its median moved the wrong way by more than max(5%, its relative IQR in either
run); the native figures are pooled medians with no IQR, so 5% alone applies there.  A rebuild moves
the native kernels' own layout, and with it their baselines: read a native verdict next to the fill
floor's and, for a figure that matters, next to callgrind's instruction count.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ARENALIB = ("ConfinedArena", "Arena", "SlicingArena", "scope", "pool_", "BufferPool")


def _ours(name: str) -> bool:
    return any(key in name for key in ARENALIB)


def figures(results: dict) -> dict[str, tuple[float, float, bool]]:
    """name -> (median, relative IQR, lower is better) for every arenalib figure in ``results``."""
    out: dict[str, tuple[float, float, bool]] = {}
    roundtrip = results.get("roundtrip") or {}
    for candidate, cells in (roundtrip.get("cells") or {}).items():
        if not _ours(candidate):
            continue
        for size, cell in cells.items():
            ratio = cell["ratio_to_baseline"]
            out[f"roundtrip {candidate} {size} B / bytearray"] = (ratio["median"], ratio["rel_iqr"], True)
    for candidate, sizes in ((results.get("threads") or {}).get("cells") or {}).items():
        if not _ours(candidate):
            continue
        for size, cell in sizes.items():
            scaling = cell["scaling"]
            out[f"threads {candidate} {size} B scaling"] = (scaling["median"], scaling["rel_iqr"], False)
    for candidate, cell in ((results.get("memory") or {}).get("candidates") or {}).items():
        if _ours(candidate) and "retained_of_peak" in cell:  # a failed candidate has none
            out[f"memory {candidate} retained of peak"] = (cell["retained_of_peak"]["freed_most"], 0.0, True)
    pool = results.get("pool") or {}
    for size, cells in (pool.get("acquire_release") or {}).items():
        for name, cell in cells.items():
            if _ours(name):
                ratio = cell["ratio_to_bytearray"]
                out[f"pool {name} {size} B / bytearray"] = (ratio["median"], ratio["rel_iqr"], True)
    for name, cell in (pool.get("read_throughput") or {}).items():
        if "ratio_to_bytearray" in cell:
            ratio = cell["ratio_to_bytearray"]
            out[f"pool {name} throughput / bytearray"] = (ratio["median"], ratio["rel_iqr"], False)
    native = results.get("native") or {}
    for size, cells in (native.get("roundtrip") or {}).items():
        floor = cells.get("fill only (floor)", {}).get("ns_per_op")
        for name, cell in cells.items():
            if _ours(name):
                out[f"native {name} {size} B / malloc"] = (cell["ratio_to_malloc"], 0.0, True)
                if floor and "no fill" not in name:
                    # The memset alone, measured in the same round: it moves with the kernel
                    # module's layout, which a rebuild changes, and is most of the cost from 1 KiB.
                    out[f"native {name} {size} B / fill floor"] = (cell["ns_per_op"] / floor, 0.0, True)
    for name, cell in (native.get("threads") or {}).items():
        if _ours(name):
            out[f"native threads {name} scaling"] = (cell["scaling"], 0.0, False)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("more_before", type=Path, nargs="*", help="fill in experiments missing from BEFORE")
    args = parser.parse_args()
    before: dict = {}
    for path in [*args.more_before[::-1], args.before]:
        before.update(figures(json.loads(path.read_text())))
    after = figures(json.loads(args.after.read_text()))
    worse = 0
    print(f"{'figure':58} {'before':>9} {'after':>9} {'change':>8}  verdict")
    for name in sorted(before.keys() & after.keys()):
        (old, old_iqr, lower_better), (new, new_iqr, _) = before[name], after[name]
        change = (new - old) / old if old else 0.0
        tolerance = max(0.05, old_iqr, new_iqr)
        bad = change > tolerance if lower_better else -change > tolerance
        better = -change > tolerance if lower_better else change > tolerance
        verdict = "WORSE" if bad else "better" if better else "within noise"
        worse += bad
        print(f"{name:58} {old:9.3f} {new:9.3f} {change:+8.1%}  {verdict} (tolerance {tolerance:.0%})")
    print(f"\n{worse} figure(s) worse than noise; {len(before.keys() & after.keys())} compared")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
