"""A scope repeated with the same shape stays warm, whatever its block size (issue 25).

The per-batch pattern: a fresh arena per scope, k blocks of n bytes kept until the close.  Once the
scope has run a few times (warm-up: jemalloc's first pages, and the first STALE_LIMIT of garbage of
a small scope, which is reset in bulk only then), the scope must take almost no page faults: at
most 2% of its pages plus 8 per scope, for every kind and every block size from 8 B to 1 MiB.

What broke it (see the comments at the fixes): jemalloc refused to split a reset arena's dirty
extent for blocks whose extent is under 1/64 of it (5000-byte blocks, 16-50 KB blocks: every page
faulted again at every close), and the retain limit summed the churn of scopes that reuse the same
pages (a 4 MiB scope was wiped at every 9th close).

Each case runs in a fresh interpreter (page faults are per process, the slot pool starts empty);
bounds are on minor-fault counts (ru_minflt), never on time."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import SANITIZED, assert_ok, run_python

pytestmark = [
    pytest.mark.skipif(SANITIZED, reason="page-fault bounds do not apply under ASan"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads ru_minflt"),
]

SCOPE_BYTES = 16 << 20  # a scope holds at most this much (bench/scopes.py's pattern) ...
MAX_BLOCKS = 1024       # ... in at most this many blocks

# The child: argv[1] is a JSON list of shapes, each a list of block sizes that the scope cycles
# through.  For every shape and kind it reports the faults of `scopes` scopes after `warmup` ones.
CHILD = """
import gc, json, math, resource, sys
import arenalib

SCOPE_BYTES, MAX_BLOCKS = @SCOPE_BYTES@, @MAX_BLOCKS@

def blocks(sizes):
    shape, total = [], 0
    while len(shape) < MAX_BLOCKS and total + sizes[len(shape) % len(sizes)] <= SCOPE_BYTES:
        shape.append(sizes[len(shape) % len(sizes)])
        total += shape[-1]
    return shape or sizes[:1]

def per_scope(kind, shape, scopes):  # the faults of each scope
    out = []
    for _ in range(scopes):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with kind() as a:
            segs = [a.allocate(n, zero=False).fill(1) for n in shape]
            del segs
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out

def faults(kind, shape, scopes):
    return sum(per_scope(kind, shape, scopes))

gc.disable()  # no collection in the middle of a measurement
stale_limit = arenalib.pool_stats()["stale_limit"]
out = []
for sizes in json.loads(sys.argv[1]):
    shape = blocks(sizes)
    nbytes = sum(shape)
    # Small scopes leave their garbage until STALE_LIMIT of it is reset in bulk: the warm-up covers
    # the first reset; the measurement spans more than the 32 MiB retain limit of churn (where
    # summed churn wiped the slot) and at least 24 scopes.
    warmup = min(300, 3 + math.ceil(stale_limit / nbytes) + 1)
    scopes = max(24, min(300, math.ceil((40 << 20) / nbytes)))
    for name in ("Arena", "ConfinedArena", "SlicingArena"):
        kind = getattr(arenalib, name)
        faults(kind, shape, warmup)
        stats = arenalib.pool_stats()
        out.append({"kind": name, "sizes": sizes, "blocks": len(shape), "pages": -(-nbytes // 4096),
                    "scopes": scopes, "per_scope": per_scope(kind, shape, scopes),
                    "purges": arenalib.pool_stats()["purges"] - stats["purges"]})
if len(sys.argv) > 2:  # the control: with nothing retained, the same scopes fault every page
    arenalib.set_retention(0)
    shape = blocks(json.loads(sys.argv[2]))
    out.append({"cold": faults(arenalib.ConfinedArena, shape, 3) / 3, "pages": -(-sum(shape) // 4096)})
print(json.dumps(out))
""".replace("@SCOPE_BYTES@", str(SCOPE_BYTES)).replace("@MAX_BLOCKS@", str(MAX_BLOCKS))


def measure(shapes: list[list[int]], control: list[int] | None = None) -> list[dict]:
    argv = [json.dumps(shapes)] + ([json.dumps(control)] if control else [])
    return json.loads(assert_ok(run_python(CHILD, *argv)).splitlines()[-1])


def warm_faults(per_scope: list[int]) -> float:
    """Faults a scope, leaving out the worst 2% of the scopes (at least one): jemalloc's background
    decay purges pages reused between two of its samples now and then (a burst of 500-1,000 faults
    in 2-4 of 300 scopes, no arenalib rule firing); a policy that re-faults a warm scope does so
    at every close, or every few (the summed churn wiped a 4 MiB scope at every 9th)."""
    kept = sorted(per_scope)[:len(per_scope) - max(1, len(per_scope) // 50)]
    return sum(kept) / len(kept)


def check_warm(figures: list[dict]) -> None:
    cold = [f for f in figures if "per_scope" in f and warm_faults(f["per_scope"]) > 0.02 * f["pages"] + 8]
    title = "scopes that fault again once warm (faults a scope, the worst 2% left out):\n"
    assert not cold, title + "\n".join(
        f"  {f['kind']} {f['sizes']} x{f['blocks']} ({f['pages']} pages): {warm_faults(f['per_scope']):.1f} "
        f"(all: {sum(f['per_scope']) / f['scopes']:.1f}), {f['purges']} purges" for f in cold)


# The sizes of the issue's cliffs and their neighbours: 3584-byte (28 KiB slabs) and 5120-byte
# (20 KiB slabs) classes, large classes of 16-50 KB, the 4 MiB scope at PURGE_LIMIT, and mixes.
CLIFFS = [[3000], [3500], [4096], [5000], [16384], [40000], [100, 5000, 20000],
          [8, 1000, 40000, 300000]]


def test_the_issue_25_cliffs_stay_warm():
    figures = measure(CLIFFS, control=[16384])
    control = figures.pop()
    assert control["cold"] >= 0.8 * control["pages"], control  # the measurement sees faults
    check_warm(figures)


# Block sizes log-uniform over 8 B .. 1 MiB, mostly not powers of two.
block_sizes = st.integers(3 * 256, 20 * 256).map(lambda e: round(2 ** (e / 256)))


@settings(max_examples=6, deadline=None)
@given(sizes=st.lists(block_sizes, min_size=1, max_size=3))
def test_a_repeated_scope_stays_warm_at_any_block_size(sizes):
    check_warm(measure([sizes]))


SWEEP = [8, 24, 100, 500, 1000, 1500, 3000, 3500, 4096, 5000, 6144, 8000, 12000, 16384, 20000,
         24000, 32768, 40000, 50000, 65536, 100000, 200000, 500000, 1 << 20]


@pytest.mark.slow
def test_the_whole_sweep_stays_warm():
    check_warm(measure([[n] for n in SWEEP]
                       + [[100, 5000, 20000], [8, 1000, 40000, 300000], [1500, 3584, 7000],
                          [16, 16384], [600000, 1 << 20]]))


WIPE_REASONS = r"""
import json
import arenalib

def wipes():
    return arenalib.pool_stats()["wipes"]

seen = {}
before = wipes()
with arenalib.Arena() as a:   # a one-off 64 MiB scope: past the allowance, wiped at close
    a.allocate(64 << 20, zero=False).fill(1)
seen["big scope"] = {k: v - before[k] for k, v in wipes().items()}
arenalib.set_retention(1 << 20)
before = wipes()
with arenalib.ConfinedArena() as a:   # 2 MiB kept warm would pass the retain limit of 1 MiB
    [a.allocate(1 << 20, zero=False).fill(1) for _ in range(2)]
seen["retain limit"] = {k: v - before[k] for k, v in wipes().items()}
before = wipes()
arenalib.trim()
seen["trim"] = {k: v - before[k] for k, v in wipes().items()}
print(json.dumps(seen))
"""


def test_pool_stats_says_which_rule_dropped_warm_pages():
    """pool_stats()["wipes"] counts each rule that handed an idle slot's warm pages back, so that a
    user who sees faults can tell which one did it (none counted: jemalloc's decay)."""
    seen = json.loads(assert_ok(run_python(WIPE_REASONS)).splitlines()[-1])
    assert seen["big scope"]["over_allowance"] == 1, seen
    assert seen["retain limit"]["over_retain_limit"] >= 1, seen
    assert seen["trim"]["trim"] >= 1 and seen["trim"]["over_allowance"] == 0, seen
    assert set(seen["trim"]) == {"over_allowance", "over_retain_limit", "out_of_warm_slots", "trim",
                                 "no_memory"}
