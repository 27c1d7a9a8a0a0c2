"""PNG timeline of a goodput report (the ``plot`` extra: matplotlib, imported lazily).

Three panels sharing the time axis: one lane per node with its cycles (shaded, alternating),
checkpoint loads (green) and blocking saves (blue), hangs (red span from the hang's start to
its detection) and failures (black x); the step rate from the step events; and the time spent
per category, as a stacked bar with the goodput.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from resiliency.goodput._render import LABELS
from resiliency.goodput.calculator import CATEGORIES, Report
from resiliency.goodput.errors import MissingDependencyError
from resiliency.goodput.ledger import Ledger

COLORS = {
    "productive": "#2ca02c",
    "startup": "#9467bd",
    "loading": "#17becf",
    "saving": "#1f77b4",
    "lost_progress": "#d62728",
    "restart": "#ff7f0e",
    "slowdown": "#bcbd22",
    "idle": "#c7c7c7",
}


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 -- optional dependency

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise MissingDependencyError(
            "plots need matplotlib (the 'plot' extra of resiliency-goodput): pip install matplotlib"
        ) from None
    return plt


def _scale(span: float) -> tuple[float, str]:
    if span >= 6 * 3600:
        return 3600.0, "hours"
    if span >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _time_use(report: Report) -> list[tuple[float, float, str]]:
    """What each stretch of time was spent on (base intervals, then overlays), merged."""
    timeline = report.timeline
    if timeline is None:
        return []
    ideal = report.ideal_step_time_s
    names = {"startup": "startup", "restart": "restart", "lost": "lost_progress"}
    spans: list[tuple[float, float, str]] = [
        (base.start, base.end, names.get(base.category, "idle")) for base in timeline.bases
    ]
    work = timeline.work
    for start, end, eff, n, lost in zip(
        work.start, work.end, work.eff, work.n, work.lost, strict=True
    ):
        if lost * 2 > n:
            name = "lost_progress"
        elif ideal is not None and eff > 1.05 * ideal * n:
            name = "slowdown"
        else:
            name = "productive"
        spans.append((start, end, name))
    spans.sort()
    merged: list[tuple[float, float, str]] = []
    for start, end, name in spans:
        if merged and merged[-1][2] == name and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end, name)
        else:
            merged.append((start, end, name))
    overlay = {"loading": "loading", "saving": "saving", "hang": "restart"}
    return merged + [(a, b, overlay[c]) for a, b, c in timeline.overlays]


def lane_names(sources: list[str]) -> list[str]:
    """Labels of the node lanes, one per ledger file ``<job>.<host>.jsonl``: ``node <host>``,
    and ``<job> @ <host>`` for every file when the ledger holds several jobs or two files name
    the same host (two jobs on one machine)."""
    stems = [Path(source).stem for source in sources]
    parts = [stem.split(".", 1) if "." in stem else ["", stem] for stem in stems]
    hosts = [host for _, host in parts]
    jobs = {job for job, _ in parts}
    if len(set(hosts)) == len(hosts) and len(jobs) <= 1:
        return [f"node {host}" for host in hosts]
    return [f"{job} @ {host}" if job else host for job, host in parts]


def plot_report(report: Report, ledger: Ledger, path: str | Path) -> Path:
    """Draw the timeline of ``report`` (read from ``ledger``) into the PNG ``path``."""
    plt = _pyplot()
    fig = draw_report(report, ledger)
    out = Path(path)
    try:
        fig.savefig(out, dpi=110, bbox_inches="tight")  # the legends beside the axes included
    finally:
        plt.close(fig)
    return out


def draw_report(report: Report, ledger: Ledger) -> Any:
    """The matplotlib figure of ``report``: lanes, step rate and breakdown panels."""
    plt = _pyplot()
    whole = report.whole
    t0 = whole.start
    unit, unit_name = _scale(max(whole.total, 1e-9))

    def x(t: float) -> float:
        return (t - t0) / unit

    # One lane per node: per ledger file (the launcher and the ranks of a node share one).
    nodes = sorted({ev.source for ev in ledger.events} or {""})
    lane = {node: i + 1 for i, node in enumerate(nodes)}
    names = lane_names(nodes)
    fig, (ax_lanes, ax_rate, ax_bar) = plt.subplots(
        3,
        1,
        figsize=(12, 3.0 + 0.5 * len(nodes) + 3.5),
        gridspec_kw={"height_ratios": [1.0 + 0.4 * len(nodes), 1.4, 0.6]},
    )
    timeline = report.timeline
    cycles = timeline.cycles if timeline is not None else []
    # Up to 20 labels fit across the lanes: with more cycles, a number on every k-th one.
    label_every = max(math.ceil(len(cycles) / 20), 1)
    for i, cycle in enumerate(cycles):
        ax_lanes.axvspan(
            x(cycle.start),
            x(cycle.end),
            color="#4c72b0" if i % 2 == 0 else "#dd8452",
            alpha=0.10,
            lw=0,
        )
        if i % label_every == 0:
            text = f" cycle {cycle.number}" if len(cycles) <= 8 else f" {cycle.number}"
            ax_lanes.text(x(cycle.start), len(nodes) + 0.55, text, fontsize=8)
    for start, end, category in _time_use(report):
        ax_lanes.barh(
            0, max(x(end) - x(start), 0.0), left=x(start), height=0.6, color=COLORS[category], lw=0
        )
    seen: set[str] = set()

    def label(name: str) -> str | None:
        if name in seen:
            return None
        seen.add(name)
        return name

    for ev in ledger.events:
        y = lane.get(ev.source, 1)
        if ev.event == "checkpoint_loaded" and not ev.data.get("synthetic"):
            start = ev.time - float(ev.data["duration_s"])
            ax_lanes.barh(
                y,
                max(x(ev.time) - x(start), 0.002),
                left=x(start),
                height=0.5,
                color=COLORS["loading"],
                label=label("checkpoint load"),
            )
        elif ev.event == "checkpoint_saved":
            blocked = float(ev.data["blocked_s"])
            start = ev.time - float(ev.data["total_s"] or blocked)
            ax_lanes.barh(
                y,
                max(blocked / unit, 0.002),
                left=x(start),
                height=0.5,
                color=COLORS["saving"],
                label=label("checkpoint save (blocking)"),
            )
            ax_lanes.plot(
                [x(start), x(ev.time)], [y - 0.3, y - 0.3], color=COLORS["saving"], lw=1, alpha=0.6
            )
        elif ev.event == "hang_detected":
            begin = ev.time - float(ev.data["latency_s"]) - float(ev.data.get("timeout_s") or 0)
            ax_lanes.barh(
                y,
                max(x(ev.time) - x(begin), 0.002),
                left=x(begin),
                height=0.7,
                color=COLORS["lost_progress"],
                alpha=0.6,
                label=label(f"hang ({ev.data['timer']}) until detection"),
            )
        elif ev.event == "cycle_ended" and ev.data["cause"] != "success":
            ax_lanes.plot(
                x(ev.time), y, "kx", ms=9, mew=2, label=label(f"cycle ended: {ev.data['cause']}")
            )
        elif ev.event == "straggler_detected":
            ax_lanes.plot(x(ev.time), y + 0.3, "v", color="#8c564b", label=label("straggler"))
    ax_lanes.set_yticks(range(len(nodes) + 1), ["time use", *names])
    ax_lanes.set_ylim(-0.7, len(nodes) + 0.8)
    ax_lanes.set_title(
        f"Goodput {100 * whole.goodput:.1f} % over {whole.total / unit:.4g} {unit_name}"
    )
    if seen:  # beside the lanes, never over one
        ax_lanes.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)

    # Step rate between consecutive step events of one attempt.
    xs: list[float] = []
    rates: list[float] = []
    prev: tuple[float, int, int] | None = None
    steps = timeline.steps if timeline is not None else ledger.steps
    for when, step, attempt in steps:
        if prev is not None and prev[2] == attempt and when > prev[0] and step > prev[1]:
            xs.append(x((when + prev[0]) / 2))
            rates.append((step - prev[1]) / (when - prev[0]))
        elif prev is not None and prev[2] != attempt:
            xs.append(float("nan"))  # no line across a restart
            rates.append(float("nan"))
        prev = (when, step, attempt)
    if xs:
        ax_rate.plot(xs, rates, ".-", ms=3, lw=0.8, color="#333333")
    if report.ideal_step_time_s:
        ax_rate.axhline(
            1.0 / report.ideal_step_time_s,
            color=COLORS["productive"],
            ls="--",
            lw=1,
            label=f"ideal ({report.ideal_step_time_s:.3g} s/step)",
        )
        ax_rate.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)
    ax_rate.set_ylabel("steps / s")
    ax_rate.set_xlim(ax_lanes.get_xlim())
    ax_rate.set_xlabel(f"{unit_name} since the first event")

    left = 0.0
    for name in CATEGORIES:
        share = whole.seconds[name] / whole.total if whole.total > 0 else 0.0
        if share <= 0:
            continue
        ax_bar.barh(
            0,
            share * 100,
            left=left,
            color=COLORS[name],
            label=f"{LABELS[name]} {100 * share:.1f} %",
        )
        left += share * 100
    ax_bar.set_xlim(0, 100)
    ax_bar.set_yticks([])
    ax_bar.set_xlabel("% of wall time")
    ax_bar.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9), ncol=4, fontsize=8)
    fig.tight_layout()
    return fig
