"""What bench/run.py asks of an experiment module, and the target helpers several of them share.

An experiment is a module (roundtrip.py, memory.py, ...) with the members of ``Experiment``; run.py
imports it by name and knows nothing else of it.  Each measures in run(), then everything run.py
writes (tables, target verdicts, plots) is computed from run()'s JSON-able result alone, so that
``run.py --from-json`` redoes the whole report of an earlier run without measuring.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from _common import Config, Progress, fmt_size


@runtime_checkable
class Experiment(Protocol):
    """The members of an experiment module, all module-level."""

    TITLE: str
    """Its section heading in results.md, numbered as its docstring numbers it."""

    def plan(self, cfg: Config) -> float:
        """Estimated milliseconds of work, the progress bar's budget for it (run() steps by the same
        estimates; run.py corrects the drift after each experiment)."""

    def run(self, cfg: Config, progress: Progress) -> dict:
        """Measure; every figure in a JSON-able dict (it goes to results.json as it is)."""

    def targets(self, results: dict) -> list[dict]:
        """The project's targets checked on ``results``: one dict per check, with at least "target"
        (the checklist's heading, shared by consecutive checks), "status" ("MET", "MISSED" or
        "n/a"), "label" and "ratio" (None when not measured)."""

    def target_line(self, check: dict) -> str:
        """One check of targets() as the checklist prints it, starting with its status."""

    def tables(self, results: dict, markdown: bool = False) -> str:
        """The experiment's tables, plain text or the body of its results.md section."""

    def plots(self, results: dict, out: Path, plt: Any) -> list[str]:
        """PNG files written into ``out`` with matplotlib.pyplot ``plt``; their names."""

    # Optional: findings(results) -> list[dict], the verdict's sentences in plain words, each made with
    # finding() from the figures of ``results``.  An experiment without it is summed up from its
    # targets' checks (_report.py).


def load(name: str) -> Experiment:
    """The experiment module ``name``; TypeError naming what it lacks when it is not one."""
    module = importlib.import_module(name)
    if not isinstance(module, Experiment):
        missing = [m for m in ("TITLE", "plan", "run", "targets", "target_line", "tables", "plots")
                   if not hasattr(module, m)]
        raise TypeError(f"{module.__file__} is not an experiment: it lacks {', '.join(missing)} "
                        "(see bench/_experiment.py)")
    return module  # type: ignore[return-value]


# -- the verdict's findings -------------------------------------------------------------------------

KINDS = ("win", "loss", "even", "skip")  # where arenalib wins, does not, is on par; what was left out


def finding(kind: str, text: str, why: str | None = None) -> dict:
    """One sentence of the verdict: ``kind`` one of KINDS, ``text`` computed from the figures, ``why``
    (the reason for a loss or a skip) when it is known."""
    if kind not in KINDS:
        raise ValueError(f"finding kind {kind!r}: one of {', '.join(KINDS)}")
    return {"kind": kind, "text": text, "why": why}


EVEN = 0.05  # a ratio within 5% of 1 is "on par": quick mode's noise is about that


def times(ratio: float, lower_is_faster: bool = True) -> str:
    """A ratio of times (or, ``lower_is_faster=False``, of throughputs) in words: "2.1x faster",
    "1.3x slower" or "on par"."""
    speedup = 1 / ratio if lower_is_faster else ratio
    if abs(speedup - 1) <= EVEN:
        return "on par"
    return f"{speedup:.1f}x faster" if speedup > 1 else f"{1 / speedup:.1f}x slower"


def side(ratio: float, lower_is_faster: bool = True) -> str:
    """The finding kind of a ratio: "win", "loss" or "even" (as times() words it)."""
    speedup = 1 / ratio if lower_is_faster else ratio
    return "even" if abs(speedup - 1) <= EVEN else ("win" if speedup > 1 else "loss")


def no_plots(results: dict, out: Path, plt: Any) -> list[str]:
    """plots() of an experiment that draws none."""
    return []


def no_targets(results: dict) -> list[dict]:
    """targets() of an experiment whose targets are not in the checklist."""
    return []


def ratio_item(title: str, key: str, label: str, n: int, other: str, versus_label: str, limit: float,
               r: dict | None) -> dict:
    """One ratio target: MET when the median of the same-round ratios ``r`` is at most ``limit``
    (borderline when the limit lies between its quartiles); n/a when it was not measured."""
    item = {"target": title, "candidate": key, "label": label, "size": n, "versus": other,
            "versus_label": versus_label, "limit": limit}
    if r is None:
        item.update(status="n/a", ratio=None)
    else:
        item.update(ratio=r["median"], ratio_q1=r["q1"], ratio_q3=r["q3"],
                    status="MET" if r["median"] <= limit else "MISSED",
                    borderline=r["q1"] <= limit <= r["q3"])
    return item


def ratio_line(c: dict) -> str:
    """A check of ratio_item() (a ratio to a peer) or of a share of a whole (no "versus": memory's)."""
    size = f" at {fmt_size(c['size'])}" if c.get("size") else ""
    if c["ratio"] is None:
        return f"{c['status']:6s} {c['label']}{size}: not measured"
    if "versus" in c:
        line = (f"{c['status']:6s} {c['label']}{size}: {c['ratio']:.2f}x "
                f"(limit {c['limit']:.1f}x{', within noise' if c.get('borderline') else ''})")
        if "ratio_vs_cheapest_bytearray" in c:
            strict = "within" if c["status_vs_cheapest_bytearray"] == "MET" else "over"
            line += ("; against bytearray*n, the cheapest bytearray: "
                     f"{c['ratio_vs_cheapest_bytearray']:.2f}x, "
                     f"{strict} the limit")
        return line
    return f"{c['status']:6s} {c['label']}: {c['ratio']:.1%} (limit {c['limit']:.0%})"
