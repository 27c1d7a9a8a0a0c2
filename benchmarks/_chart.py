"""Draw the combined benchmark figures as one PNG of small multiples.

One panel per kind of figure, each on the scale that suits it: the hot-path costs (log scale,
microseconds), hang detection and recovery (log scale, seconds), ft-launcher next to torchrun
(seconds), and scoring time against the number of simulated ranks (log-log). Bars are medians,
whiskers the spread, red ticks the targets, grey bars the comparison measured in the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import matplotlib.pyplot as plt
from _summary import Figure, Stats, num
from matplotlib.axes import Axes


class Row(NamedTuple):
    """One horizontal bar: its label, its figures, its colour, and its target if any."""

    label: str
    stats: Stats | None
    color: str
    target: float | None = None
    target_label: str | None = None


OURS = "#2b6cb0"
OTHER = "#a0a0a0"
TARGET = "#d62728"


def _whiskers(stats: Stats) -> list[list[float]]:
    assert stats.median is not None
    low = stats.low if stats.low is not None else stats.median
    high = stats.high if stats.high is not None else stats.median
    return [[max(stats.median - low, 0.0)], [max(high - stats.median, 0.0)]]


def _bar(
    ax: Axes,
    y: float,
    stats: Stats | None,
    color: str,
    unit: str,
    log: bool,
    target: float | None,
) -> None:
    if stats is None or stats.median is None:
        return
    left = 0.0 if not log else ax.get_xlim()[0]
    ax.barh(y, stats.median - left, left=left, color=color, height=0.6, zorder=2)
    ax.errorbar(
        stats.median, y, xerr=_whiskers(stats), fmt="none", ecolor="black", capsize=3, zorder=3
    )
    edge = stats.high if stats.high is not None else stats.median
    edge = max(edge, target) if target is not None else edge  # keep the label off the target
    ax.annotate(
        f" {num(stats.median)} {unit}",
        (edge, y),
        va="center",
        fontsize=8,
        xytext=(4, 0),
        textcoords="offset points",
        zorder=4,
    )


def _target(ax: Axes, y: float, row: Row, unit: str) -> None:
    value = row.target
    if value is None:
        return
    ax.plot([value, value], [y - 0.4, y + 0.4], color=TARGET, linewidth=2.5, zorder=5)
    ax.annotate(
        row.target_label or f"target {value:g} {unit}",
        (value, y + 0.4),
        ha="center",
        va="bottom",
        fontsize=7,
        color=TARGET,
        zorder=5,
    )


def _bars_panel(
    ax: Axes,
    rows: list[Row],
    unit: str,
    title: str,
    xlim: tuple[float, float],
    log: bool,
) -> None:
    """Horizontal bars, top to bottom."""
    if log:
        ax.set_xscale("log")
    ax.set_xlim(*xlim)
    ys = list(range(len(rows)))[::-1]
    for y, row in zip(ys, rows, strict=True):
        _bar(ax, y, row.stats, row.color, unit, log, row.target)
        _target(ax, y, row, unit)
    ax.set_yticks(ys, [row.label for row in rows], fontsize=9)
    ax.set_ylim(-0.7, len(rows) - 0.2)
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(unit + (" (log scale)" if log else ""))
    ax.grid(axis="x", which="both", alpha=0.25, zorder=0)


def _extremes(rows: list[Row]) -> list[float | None]:
    """Every bar's low and high end (for the axis limits)."""
    return [v for row in rows if row.stats for v in (row.stats.low, row.stats.high)]


def _by_key(figures: list[Figure]) -> dict[str, Figure]:
    return {f.key: f for f in figures}


def _span(values: list[float | None], pad_low: float, pad_high: float) -> tuple[float, float]:
    present = [v for v in values if v is not None and v > 0]
    return (min(present) / pad_low, max(present) * pad_high) if present else (1e-3, 1.0)


def _hot_path(ax: Axes, fig: dict[str, Figure]) -> None:
    rows: list[Row] = []
    for key, label in (
        ("ft_client.send_heartbeat", "send_heartbeat()"),
        ("ft_client.section_pair", "start_section + end_section"),
        ("straggler.detection_section", "empty detection_section"),
    ):
        if key in fig:
            rows.append(Row(label, fig[key].stats, OURS, fig[key].target))
    blocking = fig.get("ft_client.send_heartbeat")
    if blocking is not None and blocking.comparison is not None:
        rows.append(Row("blocking round trip\n(the design avoided)", blocking.comparison, OTHER))
    values = _extremes(rows)
    _bars_panel(ax, rows, "us", "Hot-path cost per call", _span(values, 2, 8), log=True)


def _hang(ax: Axes, fig: dict[str, Figure]) -> None:
    rows: list[Row] = []
    for key, label in (
        ("hang_monitor.detected", "monitor detects the hang\n(beyond the 1 s timeout)"),
        ("hang_monitor.hang_event", "hang event with stacks\n(beyond the 1 s timeout)"),
        ("launcher.hang_restart", "all workers running again\n(ft-launcher, from the hang)"),
    ):
        if key in fig:
            rows.append(Row(label, fig[key].stats, OURS, fig[key].target))
    restart = fig.get("launcher.hang_restart")
    values = _extremes(rows)
    wait = None
    if restart is not None and restart.comparison is not None:
        if restart.comparison.median is None:
            wait = _torchrun_wait(restart)
            rows.append(Row("torchrun\n(no hang detection)", None, OTHER))
            values.append(wait)
        else:
            rows.append(Row("torchrun", restart.comparison, OTHER))
    _bars_panel(ax, rows, "s", "Hang: detection and recovery", _span(values, 3, 14), log=True)
    if wait is not None:
        left = ax.get_xlim()[0]
        ax.barh(0, wait - left, left=left, color="white", edgecolor=OTHER, hatch="//", height=0.6)
        ax.annotate(
            f" not restarted after {wait:g} s",
            (wait, 0),
            va="center",
            fontsize=8,
            xytext=(4, 0),
            textcoords="offset points",
        )


def _torchrun_wait(figure: Figure) -> float:
    text = figure.comparison_text
    digits = text.split("watched ", 1)[1].split(" s", 1)[0] if "watched " in text else "6"
    return float(digits)


def _launcher(ax: Axes, fig: dict[str, Figure]) -> None:
    rows: list[Row] = []
    for key, label in (
        ("launcher.start", "start -> first worker"),
        ("launcher.crash_respawn", "crash -> all respawned"),
    ):
        if key not in fig:
            continue
        figure = fig[key]
        target = None
        if figure.target_text and figure.comparison and figure.comparison.median is not None:
            target = figure.comparison.median + 0.1  # the crash target: torchrun + 0.1 s
        rows.append(Row(f"{label}\nft-launcher", figure.stats, OURS, target, "torchrun + 0.1 s"))
        rows.append(Row(f"{label}\ntorchrun", figure.comparison, OTHER))
    high = max((v for v in _extremes(rows) if v is not None), default=1.0)
    _bars_panel(ax, rows, "s", "ft-launcher next to torchrun (same run)", (0, high * 1.3), False)


def _scoring(ax: Axes, fig: dict[str, Figure]) -> None:
    points = [
        (f.extra["ranks"], f.stats) for f in fig.values() if f.key.startswith("straggler.scoring_")
    ]
    points = [(r, s) for r, s in sorted(points, key=lambda p: p[0]) if s.median is not None]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("Straggler scoring on rank 0 vs simulated ranks", fontsize=11, loc="left")
    ax.set_xlabel("simulated ranks (20 sections each; log scale)")
    ax.set_ylabel("ms of CPU time (log scale)")
    ax.grid(which="both", alpha=0.25)
    if not points:
        return
    ranks = [r for r, _ in points]
    medians = [s.median for _, s in points]
    ax.errorbar(
        ranks,
        medians,
        yerr=[
            [w[0][0] for w in map(_whiskers, (s for _, s in points))],
            [w[1][0] for w in map(_whiskers, (s for _, s in points))],
        ],
        color=OURS,
        marker="o",
        capsize=3,
        label="measured (median, min..max)",
    )
    first_r, first_m = ranks[0], medians[0]
    assert first_m is not None
    ax.plot(
        ranks,
        [first_m * r / first_r for r in ranks],
        linestyle="--",
        color=OTHER,
        label=f"linear growth from {first_r} ranks",
    )
    for r, m in zip(ranks, medians, strict=True):
        ax.annotate(f"{num(m)} ms", (r, m), xytext=(6, -12), textcoords="offset points", fontsize=8)
    target = fig.get("straggler.scoring_4096")
    if target is not None and target.target is not None:
        ax.plot([4096], [target.target], marker="_", markersize=22, mew=2.5, color=TARGET)
        ax.annotate(
            f"target {num(target.target)} ms",
            (4096, target.target),
            xytext=(-70, 6),
            textcoords="offset points",
            fontsize=8,
            color=TARGET,
        )
    ax.set_xlim(ranks[0] / 2, ranks[-1] * 2)
    tops = [s.high for _, s in points if s.high is not None] + [target.target if target else None]
    top = max(v for v in tops if v is not None)
    bottom = min(s.low for _, s in points if s.low is not None)
    ax.set_ylim(bottom / 3, top * 3)
    ax.legend(fontsize=8, loc="upper left")


def _gpu(ax: Axes, fig: dict[str, Figure]) -> None:
    rows = [
        Row(f.key.split(".", 1)[1], f.stats, OURS, f.target)
        for f in fig.values()
        if f.group == "GPU"
    ]
    values = [v for v in _extremes(rows) if v is not None] + [0.5]
    _bars_panel(ax, rows, "%", "CUPTI profiling overhead (GPU)", (0, max(values) * 1.4), False)


def _goodput(ax: Axes, fig: dict[str, Figure]) -> None:
    """The goodput figures have different units: each is drawn as a share of its target."""
    rows = []
    for key, name in (("goodput.report", "report on the ledger"), ("goodput.step", "step()")):
        f = fig.get(key)
        if f is None or f.target is None or f.stats.median is None:
            continue
        scale = 100.0 / f.target
        s = f.stats
        stats = Stats(
            s.median * scale,
            None if s.low is None else s.low * scale,
            None if s.high is None else s.high * scale,
            s.n,
        )
        target_text = f"{f.target:g} {f.unit} = 100 %"
        label = name
        if "events" in f.extra:  # the report's target is for a million events
            label += f", {f.extra['events']:,} events"
            target_text += "" if f.extra["events"] >= 1_000_000 else " for 1M events"
        rows.append(Row(f"{label} ({num(s.median)} {f.unit})", stats, OURS, 100.0, target_text))
    values = [v for v in _extremes(rows) if v is not None] + [100.0]
    _bars_panel(ax, rows, "% of target", "resiliency-goodput", (0, max(values) * 1.3), False)


PANELS: list[tuple[str, Callable[[Axes, dict[str, Figure]], None]]] = [
    ("hot path", _hot_path),
    ("hang detection", _hang),
    ("launcher", _launcher),
    ("scoring", _scoring),
    ("goodput", _goodput),
    ("GPU", _gpu),
]


def draw(figures: list[Figure], path: Path, subtitle: str) -> None:
    """Write the chart of ``figures`` to ``path`` (PNG)."""
    groups = {f.group for f in figures}
    if "hang detection" not in groups and "launcher.hang_restart" in _by_key(figures):
        groups.add("hang detection")
    panels = [(name, fn) for name, fn in PANELS if name in groups]
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    canvas, axes = plt.subplots(rows, cols, figsize=(15, 4.6 * rows), squeeze=False)
    by_key = _by_key(figures)
    for ax, (_name, fn) in zip(axes.flat, panels, strict=False):
        fn(ax, by_key)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=OURS),
        plt.Rectangle((0, 0), 1, 1, color=OTHER),
        plt.Line2D([0], [0], color=TARGET, linewidth=2.5),
        plt.Line2D([0], [0], color="black", marker="|", linestyle="none", markersize=8),
    ]
    labels = ["this toolkit (median)", "comparison, same run", "target", "spread (min..max)"]
    canvas.suptitle(f"resiliency benchmarks  -  {subtitle}", x=0.01, y=0.995, ha="left")
    canvas.legend(
        handles, labels, loc="upper left", bbox_to_anchor=(0.01, 0.97), ncol=4, frameon=False
    )
    canvas.tight_layout(rect=(0, 0, 1, 0.945))
    canvas.savefig(path, dpi=110)
    plt.close(canvas)
