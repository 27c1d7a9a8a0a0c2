"""Text rendering of a goodput `Report` (the CLI's output)."""

from __future__ import annotations

from datetime import datetime, timezone

from resiliency.goodput._time import format_duration
from resiliency.goodput.advice import CONFIDENCE, MIN_FAILURES, Advice
from resiliency.goodput.calculator import CATEGORIES, Breakdown, Report

LABELS = {
    "productive": "productive",
    "startup": "startup / init",
    "loading": "checkpoint loading",
    "saving": "checkpoint saving (blocking)",
    "lost_progress": "lost progress",
    "restart": "restart & recovery",
    "slowdown": "slowdown",
    "idle": "idle / unknown",
}
SHORT = {
    "productive": "prod",
    "startup": "start",
    "loading": "load",
    "saving": "save",
    "lost_progress": "lost",
    "restart": "restart",
    "slowdown": "slow",
    "idle": "idle",
}


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pct(part: float, total: float) -> str:
    return f"{100.0 * part / total:5.1f} %" if total > 0 else "    - "


def breakdown_table(whole: Breakdown) -> list[str]:
    """The category table of one breakdown."""
    total = whole.total
    width = max(len(v) for v in LABELS.values())
    lines = [f"  {'category':<{width}}  {'time':>12}  {'share':>7}"]
    for name in CATEGORIES:
        seconds = whole.seconds[name]
        lines.append(
            f"  {LABELS[name]:<{width}}  {format_duration(seconds):>12}  {_pct(seconds, total)}"
        )
        if name == "restart" and whole.hang_detection > 0:
            label = "  of which hang detection"
            hang = whole.hang_detection
            lines.append(f"  {label:<{width}}  {format_duration(hang):>12}  {_pct(hang, total)}")
    lines.append(f"  {'total':<{width}}  {format_duration(total):>12}  {_pct(total, total)}")
    return lines


def _row_table(title: str, rows: list[tuple[str, Breakdown]]) -> list[str]:
    head = f"  {title:<22}{'total':>12}{'goodput':>9}" + "".join(
        f"{SHORT[c]:>10}" for c in CATEGORIES if c != "productive"
    )
    lines = [head]
    for label, part in rows:
        cells = "".join(
            f"{format_duration(part.seconds[c]):>10}" for c in CATEGORIES if c != "productive"
        )
        lines.append(
            f"  {label:<22}{format_duration(part.total):>12}{100 * part.goodput:>8.1f}%{cells}"
        )
    return lines


def _google_lines(report: Report, figure: float, reference: float) -> list[str]:
    """Google's own figure, and what it leaves out that the breakdown above shows."""
    loaded, saved = report.google_steps or (None, None)
    lines = [
        f"Google Cloud Resiliency's figure: {100.0 * figure:.1f} % "
        f"((max saved step {saved if saved is not None else '-'} - min loaded step "
        f"{loaded if loaded is not None else '-'}) x reference step time {reference:.6g} s / "
        f"(last - first event time))"
    ]
    if loaded is None:
        lines.append("  Google's calculator gives 0 % to a log with no checkpoint_loaded.")
    left_out = []
    first = report.initial_step if report.initial_step is not None else 0
    if loaded is not None and first < loaded:
        left_out.append(f"the {loaded - first} steps before the lowest loaded step")
    if saved is not None and report.final_step is not None and report.final_step > saved:
        left_out.append(f"the {report.final_step - saved} steps after the last save")
    left_out.append(
        "where the rest went: it counts no lost progress, restarts, loading, saving or "
        "slowdown (the breakdown above does)"
    )
    lines.append("  Google's figure leaves out " + "; ".join(left_out) + ".")
    return lines


def render_text(report: Report) -> str:
    """The human-readable report."""
    whole = report.whole
    lines = [
        f"Goodput report: {len(report.files)} file(s), {report.events:,} events "
        f"({report.step_events:,} step events)",
    ]
    if whole.total <= 0:
        lines.append("No time span in the ledger (fewer than two events).")
        return "\n".join(lines) + "\n"
    lines.append(f"Span: {_when(whole.start)} .. {_when(whole.end)}")
    if report.ideal_step_time_s is None:
        lines.append("Ideal step time: unknown (no two step marks in one cycle)")
    else:
        how = (
            "auto: median of step durations <= median + 3 MAD"
            if report.ideal_source == "auto"
            else "given"
        )
        lines.append(f"Ideal step time: {report.ideal_step_time_s:.6g} s ({how})")
    if report.final_step is not None:
        start = report.initial_step if report.initial_step is not None else 0
        lines.append(
            f"Steps: from {start} to {report.final_step} "
            f"({report.final_step - start} new steps kept)"
        )
    lines.append(f"Goodput: {100.0 * whole.goodput:.1f} %")
    lines.extend(f"Hint: {hint}" for hint in report.hints)
    if report.attempts:
        restarts = f"{report.restarts} restart" + ("" if report.restarts == 1 else "s")
        lines.append(f"Cycles: {len(report.attempts)} ({restarts})")
    lines.append("")
    lines.extend(breakdown_table(whole))
    if report.google_figure is not None and report.ideal_step_time_s is not None:
        lines.append("")
        lines.extend(_google_lines(report, report.google_figure, report.ideal_step_time_s))
    if report.attempts:
        lines.append("")
        lines.append("Per attempt:")
        rows = []
        for a in report.attempts:
            cause = a.cause or "-"
            if a.timer:
                cause += f" ({a.timer})"
            rows.append((f"#{a.cycle} {cause}"[:22], a.breakdown))
        lines.extend(_row_table("attempt (end)", rows))
    if report.by_class:
        lines.append("")
        lines.append("Failures by class (restart: detection to progress again):")
        width = max(18, *(len(row.cls) for row in report.by_class))  # inprocess_peer_fault
        lines.append(f"{'class':<{width}} {'failures':>8} {'restart':>10} {'lost progress':>14}")
        for row in report.by_class:
            lines.append(
                f"{row.cls:<{width}} {row.failures:>8} {row.restart_s:>9.1f}s "
                f"{row.lost_progress_s:>13.1f}s"
            )
    if report.windows:
        lines.append("")
        lines.append("Per window:")
        rows = [(_when(w.start)[11:19], w) for w in report.windows]
        lines.extend(_row_table("window start (UTC)", rows))
    return "\n".join(lines) + "\n"


def render_live(report: Report) -> str:
    """One line of live figures (``watch``)."""
    whole = report.whole
    parts = [
        f"{datetime.now(timezone.utc).strftime('%H:%M:%S')}",
        f"goodput {100.0 * whole.goodput:.1f} %",
        f"total {format_duration(whole.total)}",
    ]
    for name in CATEGORIES[1:]:
        if whole.seconds[name] > 0:
            parts.append(f"{SHORT[name]} {format_duration(whole.seconds[name])}")
    if report.final_step is not None:
        parts.append(f"step {report.final_step}")
    if report.attempts:
        parts.append(f"attempt {report.attempts[-1].cycle}")
    return " | ".join(parts)


def _maybe(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(seconds)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f} %"


def render_advice(advice: Advice) -> str:
    """The human-readable checkpoint advice."""
    hours = advice.running_s / 3600.0
    lines = [f"Checkpoint advice: {advice.failures} failure(s) in {hours:.1f} h of ledger"]
    if advice.mtbf_s is not None:
        high = "?" if advice.mtbf_high_s is None else format_duration(advice.mtbf_high_s)
        lines.append(
            f"MTBF: {format_duration(advice.mtbf_s)} ({100 * CONFIDENCE:.0f} % confidence "
            f"{_maybe(advice.mtbf_low_s)} .. {high}), from {advice.failures} failure(s)"
        )
    if advice.restart_s is not None:
        lines.append(
            f"Restart: {format_duration(advice.restart_s)} a restart (failure to the first "
            f"progress, loading excluded; mean of {advice.restarts})"
        )
    lines.append(
        f"Step efficiency: {100 * advice.step_efficiency:.1f} % (ideal / actual step time)"
    )
    if not advice.enough:
        more = advice.more_hours_needed or 0.0
        lines.append(
            f"Too few failures to advise: {advice.failures} seen, {MIN_FAILURES} needed. "
            f"About {more:.1f} more hour(s) of ledger at the failure rate seen so far."
        )
    if not advice.tiers:
        lines.append("No checkpoint was saved: nothing to advise on.")
        return "\n".join(lines) + "\n"
    lines.append("")
    head = ["tier", "save blocks", "restore", "now", "advised", "Young", "goodput now", "advised"]
    rows = [head]
    for tier in advice.tiers:
        steps = tier.steps(tier.advised_interval_s)
        advised = _maybe(tier.advised_interval_s) + (f" ({steps} st)" if steps else "")
        now_steps = tier.steps(tier.interval_s)
        now = _maybe(tier.interval_s) + (f" ({now_steps} st)" if now_steps else "")
        rows.append(
            [
                tier.tier + (" *" if tier.tier == advice.primary else ""),
                format_duration(tier.save_blocked_s),
                _maybe(tier.restore_s),
                now,
                advised,
                _maybe(tier.young_interval_s),
                _share(tier.goodput_now),
                _share(tier.goodput_advised),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        cells = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        lines.append(("  " + cells).rstrip())
    for tier in advice.tiers:
        if advice.enough and tier.save_blocked_s <= 0 and tier.save_total_s <= 0:
            lines.append(
                f"  {tier.tier}: its saves carry no duration (e.g. imported from Google's log): "
                "no cost to weigh, no interval advised"
            )
    lines.append("")
    lines.append(
        "Intervals are the work between two saves (st: steps at the ideal step time); advised: "
        "Daly's optimum, never shorter than a save; goodput predicted by Daly's model with the "
        "restart and the tier's restore. * the tier saved most often (restarts restore from it)."
    )
    return "\n".join(lines) + "\n"
