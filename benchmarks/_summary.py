"""Turn the benchmarks' JSON results into one list of figures, a table and summary.json.

Every figure is the median of repeated runs with its spread (min-max, or the interquartile range
where the benchmark reports one), the number of runs, and either a target (from the issue that
asked for it) or a comparison measured in the same run (plain torchrun, a blocking round trip,
the smallest rank count). ``ok`` is True/False against the target, None where there is none.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Every figure the issue asks for; run.py fails when one of them has no number.
REQUIRED = (
    "ft_client.send_heartbeat",
    "ft_client.section_pair",
    "hang_monitor.detected",
    "hang_monitor.hang_event",
    "launcher.hang_restart",
    "launcher.crash_respawn",
    "launcher.start",
    "straggler.detection_section",
    "straggler.scoring_64",
    "straggler.scoring_512",
    "straggler.scoring_4096",
    "goodput.report",
    "goodput.step",
)

SECTION_CASE = 'detection_section("step", profile_cuda=False)'


@dataclass
class Stats:
    """Median, spread and count of one series of repeated measurements."""

    median: float | None
    low: float | None
    high: float | None
    n: int
    failed: int = 0
    spread: str = "min-max"

    @classmethod
    def of(cls, runs: list[float | None], scale: float = 1.0) -> Stats:
        done = [r * scale for r in runs if r is not None]
        if not done:
            return cls(None, None, None, 0, len(runs))
        return cls(statistics.median(done), min(done), max(done), len(done), len(runs) - len(done))


@dataclass
class Figure:
    """One row of the combined table."""

    key: str
    group: str
    title: str
    unit: str
    stats: Stats
    target: float | None = None
    target_text: str = ""
    comparison_label: str | None = None
    comparison: Stats | None = None
    comparison_text: str = ""
    ok: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        stats = out.pop("stats")
        out.update(
            median=stats["median"],
            low=stats["low"],
            high=stats["high"],
            spread=stats["spread"],
            n=stats["n"],
            failed=stats["failed"],
        )
        return out


def num(value: float) -> str:
    """A number at a precision that suits its size (three significant digits or so)."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def fmt(value: float | None, unit: str) -> str:
    """A value with its unit ("-" when there is none)."""
    return "-" if value is None else f"{num(value)} {unit}"


def _load(results: Path, name: str, ran: set[str]) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if name not in ran or not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _ft_client(data: dict[str, Any]) -> list[Figure]:
    target = float(data["target_us"])
    blocking = Stats.of(data["blocking_round_trip_runs_us"])
    figures = []
    for key, title in (
        ("send_heartbeat", "send_heartbeat() client cost"),
        ("section_pair", "start_section + end_section client cost"),
    ):
        stats = Stats.of(data[f"{key}_runs_us"])
        ratio = (
            f" ({blocking.median / stats.median:.0f}x less)"
            if stats.median and blocking.median
            else ""
        )
        figures.append(
            Figure(
                key=f"ft_client.{key}",
                group="hot path",
                title=title,
                unit="us",
                stats=stats,
                target=target,
                target_text=f"<= {target:g} us",
                comparison_label="blocking round trip",
                comparison=blocking,
                comparison_text=f"blocking round trip {fmt(blocking.median, 'us')}{ratio}",
                ok=None if stats.median is None else stats.median <= target,
            )
        )
    return figures


def _hang_monitor(data: dict[str, Any]) -> list[Figure]:
    runs, interval = data["runs"], float(data["check_interval_s"])
    timeout = float(data["timeout_s"])
    detected = Stats.of(runs["monitor_overdue"])
    event = Stats.of(runs["hang_event"])
    killed = Stats.of(runs["killed_event"])
    return [
        Figure(
            key="hang_monitor.detected",
            group="hang detection",
            title=f"hang -> monitor detects it, beyond the {timeout:g} s timeout",
            unit="s",
            stats=detected,
            target=interval,
            target_text=f"<= {interval:g} s (one check interval)",
            ok=None if detected.median is None else detected.median <= interval,
        ),
        Figure(
            key="hang_monitor.hang_event",
            group="hang detection",
            title=f"hang -> hang event with stacks, beyond the {timeout:g} s timeout",
            unit="s",
            stats=event,
            comparison_text=f"torchrun: no hang detection; rank gone at +{fmt(killed.median, 's')}",
            extra={"killed_event": asdict(killed)},
        ),
    ]


def _launcher(data: dict[str, Any]) -> list[Figure]:
    results = data["results"]
    hang_target, crash_margin = 2.0, 0.1
    hang_ft = Stats.of(results["hang"]["ft-launcher"])
    hang_tr = Stats.of(results["hang"]["torchrun"])
    wait = data.get("torchrun_hang_wait_s")
    hang_tr_text = (
        f"torchrun: never restarted (watched {wait:g} s)"
        if hang_tr.median is None
        else f"torchrun {fmt(hang_tr.median, 's')}"
    )
    figures = [
        Figure(
            key="launcher.hang_restart",
            group="launcher",
            title="hang -> all workers running again (ft-launcher)",
            unit="s",
            stats=hang_ft,
            target=hang_target,
            target_text=f"<= {hang_target:g} s",
            comparison_label="torchrun",
            comparison=hang_tr,
            comparison_text=hang_tr_text,
            ok=None if hang_ft.median is None else hang_ft.median <= hang_target,
        )
    ]
    for mode, title in (
        ("crash", "crash -> all workers respawned (ft-launcher)"),
        ("start", "launcher start -> first worker running (ft-launcher)"),
    ):
        ft = Stats.of(results[mode]["ft-launcher"])
        tr = Stats.of(results[mode]["torchrun"])
        delta, diff = None, ""
        if ft.median is not None and tr.median:
            delta = ft.median - tr.median
            diff = f": {delta * 1000:+.0f} ms, {ft.median / tr.median:.2f}x"
        figure = Figure(
            key="launcher.crash_respawn" if mode == "crash" else "launcher.start",
            group="launcher",
            title=title,
            unit="s",
            stats=ft,
            comparison_label="torchrun",
            comparison=tr,
            comparison_text=f"torchrun {fmt(tr.median, 's')}{diff}",
            extra={"difference_s": delta},
        )
        if mode == "crash":
            figure.target_text = f"<= torchrun + {crash_margin:g} s"
            figure.ok = None if delta is None else delta <= crash_margin
        figures.append(figure)
    return figures


def _straggler(data: dict[str, Any]) -> list[Figure]:
    case = next(row for row in data["sections"] if row["case"] == SECTION_CASE)
    section = Stats.of(case["ns_runs"], scale=1e-3)
    figures = [
        Figure(
            key="straggler.detection_section",
            group="hot path",
            title="empty detection_section (CPU time)",
            unit="us",
            stats=section,
            target=1.5,
            target_text="<= 1.5 us",
            ok=None if section.median is None else section.median <= 1.5,
        )
    ]
    scoring = {row["ranks"]: row for row in data["scoring"] if row["kernels_per_rank"] == 0}
    base = Stats.of(scoring[64]["rank0_ms_runs"])
    for ranks in (64, 512, 4096):
        row = scoring[ranks]
        stats = Stats.of(row["rank0_ms_runs"])
        figure = Figure(
            key=f"straggler.scoring_{ranks}",
            group="scoring",
            title=f"scoring {ranks:,} ranks x {row['sections']} sections on rank 0 (CPU)",
            unit="ms",
            stats=stats,
            extra={"ranks": ranks},
        )
        if ranks == 64:
            figure.comparison_text = "baseline of the growth below"
        elif stats.median is not None and base.median:
            figure.comparison_label = "64 ranks"
            figure.comparison = base
            figure.comparison_text = (
                f"x{stats.median / base.median:.1f} for x{ranks // 64} ranks vs 64"
            )
        if ranks == 4096:
            figure.target = 100.0
            figure.target_text = "<= 100 ms"
            figure.ok = None if stats.median is None else stats.median <= 100.0
        figures.append(figure)
    return figures


def _cupti(data: dict[str, Any]) -> list[Figure]:
    figures = []
    for row in data["results"]:
        stats = Stats(
            row["overhead_pct"],
            row["overhead_pct_q1"],
            row["overhead_pct_q3"],
            int(row["rounds"]),
            spread="IQR",
        )
        figures.append(
            Figure(
                key=f"cupti_overhead.{row['model']}",
                group="GPU",
                title=f"CUPTI profiling overhead, {row['model']} step ({data['device']})",
                unit="%",
                stats=stats,
                target=0.5,
                target_text="<= 0.5 %",
                comparison_text=f"step {row['step_ms_off']:.2f} ms without profiling",
                ok=row["overhead_pct"] <= 0.5,
            )
        )
    return figures


def _goodput(data: dict[str, Any]) -> list[Figure]:
    # The target is on CPU (the report and any process it starts); older results: wall.
    report = Stats.of(data.get("report_cpu_runs_s") or data["report_runs_s"])
    step = Stats.of(data["step_runs_us"])
    report_target, step_target = float(data["report_target_s"]), float(data["step_target_us"])
    return [
        Figure(
            key="goodput.report",
            group="goodput",
            title=f"resiliency-goodput report on {data['events']:,} events (CPU)",
            unit="s",
            stats=report,
            target=report_target,
            target_text=f"<= {report_target:g} s of CPU (for 1,000,000 events)",
            # The target is for a million events; a quick run with fewer is not judged.
            ok=None
            if report.median is None or data["events"] < 1_000_000
            else report.median <= report_target,
            extra={"events": data["events"], "ledger_bytes": data["ledger_bytes"]},
        ),
        Figure(
            key="goodput.step",
            group="goodput",
            title="goodput Recorder.step() on the training thread",
            unit="us",
            stats=step,
            target=step_target,
            target_text=f"<= {step_target:g} us",
            ok=None if step.median is None else step.median <= step_target,
        ),
    ]


COLLECTORS = {
    "ft_client": _ft_client,
    "hang_monitor": _hang_monitor,
    "launcher": _launcher,
    "straggler": _straggler,
    "cupti_overhead": _cupti,
    "goodput": _goodput,
}


def collect(results: Path, ran: set[str]) -> list[Figure]:
    """Read the JSON of every benchmark that ran and return its figures, in table order."""
    figures: list[Figure] = []
    for name, collector in COLLECTORS.items():
        data = _load(results, name, ran)
        if data is not None:
            figures.extend(collector(data))
    order = {
        "hot path": 0,
        "hang detection": 1,
        "launcher": 2,
        "scoring": 3,
        "goodput": 4,
        "GPU": 5,
    }
    return sorted(figures, key=lambda f: order[f.group])


def missing(figures: list[Figure], benchmarks: Collection[str] | None = None) -> list[str]:
    """The required figures that are absent or have no number.

    Args:
        figures: The figures collected.
        benchmarks: Only the figures of these benchmarks are required (all when None): a run
            of some benchmarks still fails when one of them produced no number.
    """
    have = {f.key for f in figures if f.stats.median is not None}
    return [
        key
        for key in REQUIRED
        if key not in have and (benchmarks is None or key.split(".", 1)[0] in benchmarks)
    ]


def table(figures: list[Figure]) -> str:
    """The combined table, as printed at the end of the run."""
    header = ("figure", "median", "spread (min..max)", "n", "target / comparison", "ok")
    rows = []
    for f in figures:
        s = f.stats
        spread = "-" if s.low is None or s.high is None else f"{num(s.low)}..{num(s.high)}"
        if s.spread != "min-max" and s.low is not None:
            spread += f" ({s.spread})"
        n = f"{s.n}" if not s.failed else f"{s.n} ({s.failed} failed)"
        against = "; ".join(t for t in (f.target_text, f.comparison_text) if t) or "-"
        ok = "-" if f.ok is None else ("ok" if f.ok else "NOT MET")
        median = fmt(s.median, f.unit) if s.median is not None else "NO RESULT"
        rows.append((f.title, median, spread, n, against, ok))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    aligns = ["<", ">", ">", ">", "<", "<"]
    lines = []
    for i, row in enumerate([header, *rows]):
        lines.append(
            "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, aligns, widths, strict=True))
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def write_json(
    path: Path,
    figures: list[Figure],
    meta: dict[str, Any],
    benchmarks: Collection[str] | None = None,
) -> None:
    """Write summary.json: the run's metadata, every figure, and the required ones missing."""
    payload = {
        **meta,
        "figures": [f.to_json() for f in figures],
        "missing": missing(figures, benchmarks),
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
