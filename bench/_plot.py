"""The plots' shared look: a distinct colour, marker and line style per series, legends outside the axes.

Every experiment's plots() draws through lines() or bars() here with the matplotlib.pyplot it is given
(bench/_report.py imports matplotlib only when it is installed), so that 16 series get 16 colours that
can be told apart and the same legend layout.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
DPI = 90


def colours(plt: Any, count: int) -> list:
    """``count`` distinct colours: tab10 up to 10, tab20's (dark and light of each hue) up to 20, then
    evenly spaced samples of a perceptually ordered map."""
    if count <= 10:
        return list(plt.get_cmap("tab10").colors[:count])
    if count <= 20:
        tab20 = plt.get_cmap("tab20").colors
        return list(tab20[0::2] + tab20[1::2])[:count]
    cmap = plt.get_cmap("turbo")
    return [cmap(i / (count - 1)) for i in range(count)]


def styles(plt: Any, families: list[str]) -> list[dict]:
    """A plot() style per series: its own colour and marker; the line style says its family
    ("arenalib" solid, "peer" dashed, "reference" dotted)."""
    dash = {"arenalib": "-", "peer": "--", "reference": ":"}
    return [{"color": c, "marker": MARKERS[i % len(MARKERS)], "linestyle": dash.get(f, "-.")}
            for i, (c, f) in enumerate(zip(colours(plt, len(families)), families, strict=True))]


def legend(fig: Any, ax: Any, count: int) -> None:
    """The legend to the right of the axes, in one or two columns, so it never hides a line."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=1 if count <= 14 else 2,
              frameon=False, borderaxespad=0.0)
    fig.tight_layout()


def lines(plt: Any, out: Path, fname: str, xs: list, series: dict[str, tuple[str, list]], *, xlabels=None,
          ylabel: str, title: str, logx: bool = False, logy: bool = False,
          hline: float | None = None) -> list[str]:
    """One line per series (label -> (family, ys); a None y is a gap); written to ``out / fname``."""
    width = 11 if len(series) <= 14 else 13
    fig, ax = plt.subplots(figsize=(width, 5.6))
    for (label, (_, ys)), style in zip(series.items(), styles(plt, [f for f, _ in series.values()]),
                                       strict=True):
        ax.plot(xs, [float("nan") if y is None else y for y in ys], label=label, linewidth=1.4, markersize=5,
                **style)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if xlabels is None and logx:  # many sizes: a tick every 4x, named as sizes
        low, high = math.ceil(math.log2(min(xs))), math.floor(math.log2(max(xs)))
        ticks = [1 << k for k in range(low, high + 1, 2)]
        ax.set_xticks(ticks, [_size(t) for t in ticks])
        ax.minorticks_off()
        ax.tick_params(axis="x", labelsize=8)
    elif xlabels is not None:
        ax.set_xticks(xs, xlabels)
        ax.tick_params(axis="x", labelrotation=45 if len(xs) > 8 else 0, labelsize=8)
    if hline is not None:
        ax.axhline(hline, color="black", linewidth=0.8, alpha=0.6)
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 90), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    legend(fig, ax, len(series))
    fig.savefig(out / fname, dpi=DPI)
    plt.close(fig)
    return [fname]


def bars(plt: Any, out: Path, fname: str, groups: list[str], values: dict[str, list], *, ylabel: str,
         title: str, line: float | None = None, logy: bool = False) -> list[str]:
    """Grouped bars: one group per entry of ``groups``, one bar per series (label -> a value per group,
    None when not measured); a horizontal reference at ``line``."""
    if not values or not groups:
        return []
    count = len(values)
    fig, ax = plt.subplots(figsize=(min(16, max(10, 4 + 0.3 * count * len(groups))), 5.6))
    width = 0.8 / count
    hatches = ("", "//", "..", "xx", "\\\\", "oo")
    for i, ((label, ys), colour) in enumerate(zip(values.items(), colours(plt, count), strict=True)):
        xs = [g + (i - (count - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [0 if y is None else y for y in ys], width, label=label, color=colour,
               hatch=hatches[i // 10 % len(hatches)], edgecolor="white", linewidth=0.5)
    ax.set_xticks(range(len(groups)), [g.replace(", ", "\n") for g in groups], fontsize=9)
    if line is not None:
        ax.axhline(line, color="black", linewidth=0.8, alpha=0.6)
    if logy:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(textwrap.fill(title, 90), fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    legend(fig, ax, count)
    fig.savefig(out / fname, dpi=DPI)
    plt.close(fig)
    return [fname]


# -- the plots of experiments whose modules hand their plots() over to here ------------------------

def native_plots(result: dict, out: Path, plt: Any) -> list[str]:
    """bench/native.py: each C-level candidate's time per op over malloc's, against the size."""
    rt = {int(size): row for size, row in result["roundtrip"].items()}
    sizes = sorted(rt)
    names = list(rt[sizes[0]]) if sizes else []
    series = {name: ("peer" if "malloc" in name or "fill only" in name else "arenalib",
                     [rt[n].get(name, {}).get("ratio_to_malloc") for n in sizes]) for name in names}
    return lines(plt, out, "native_ratio.png", sizes, series, xlabels=[_size(n) for n in sizes], logx=True,
                 ylabel="time per op / malloc's (same round)", hline=1.0,
                 title="The C level through cimport arenalib: time per op against malloc (lower is faster)")


def frames_plots(results: dict, out: Path, plt: Any) -> list[str]:
    """bench/frames.py: each way of taking a frame per op, its time over bytearray(n)+fill's by size."""
    sizes = sorted(int(n) for n in results["sizes"])
    keys = {key for n in sizes for key in results["sizes"][str(n)]["ratios"]}
    series = {c["label"]: (c.get("family", "arenalib"),
                           [results["sizes"][str(n)]["ratios"].get(key, {}).get("median") for n in sizes])
              for key, c in results["candidates"].items() if key in keys}
    return lines(plt, out, "frames_ratio.png", sizes, series, xlabels=[_size(n) for n in sizes], logx=True,
                 ylabel="time per op / bytearray(n)+fill's (same round)", hline=1.0,
                 title="A frame per operation against bytearray(n)+fill (lower is faster)")


def _size(n: int) -> str:
    from _common import fmt_size

    return fmt_size(n)
