"""Render a report history as a PNG heatmap: ranks x time, one panel per section and the GPU.

Each cell is one rank's score in one report, from red (0) through yellow (the threshold, 0.75 by
default) to green (1); grey means the rank had no samples in that report. A slow node shows as a
horizontal red band. Needs the ``plot`` extra (matplotlib). Command line:
``resiliency-straggler-heatmap history.jsonl -o heatmap.png``.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from resiliency.straggler.errors import MissingDependencyError, StragglerError
from resiliency.straggler.history import load_reports
from resiliency.straggler.report import Report

__all__ = ["GPU_PANEL", "heatmap_panels", "main", "render_heatmap"]

log = logging.getLogger(__name__)

GPU_PANEL = "GPU"
_MAX_RANK_LABELS = 32


def _scores_of(report: Report, panel: str, kind: str) -> dict[int, float]:
    if panel == GPU_PANEL:
        gpu = (
            report.gpu_relative_perf_scores
            if kind == "relative"
            else report.gpu_individual_perf_scores
        )
        return gpu
    sections = (
        report.section_relative_perf_scores
        if kind == "relative"
        else report.section_individual_perf_scores
    )
    return sections.get(panel, {})


def heatmap_panels(
    reports: Sequence[Report], kind: str = "relative", sections: Sequence[str] | None = None
) -> list[str]:
    """The panels :func:`render_heatmap` draws: ``"GPU"`` (if any GPU score), then sections.

    Args:
        reports: The history.
        kind: ``"relative"`` or ``"individual"``.
        sections: Restrict to these sections (in this order); None for all, sorted.

    Returns:
        Panel names.
    """
    found: set[str] = set()
    has_gpu = False
    for report in reports:
        per_section = (
            report.section_relative_perf_scores
            if kind == "relative"
            else report.section_individual_perf_scores
        )
        found.update(name for name, per_rank in per_section.items() if per_rank)
        has_gpu = has_gpu or bool(_scores_of(report, GPU_PANEL, kind))
    names = [s for s in sections if s in found] if sections is not None else sorted(found)
    return ([GPU_PANEL] if has_gpu and sections is None else []) + names


def render_heatmap(
    reports: Sequence[Report],
    output: str | Path,
    *,
    kind: Literal["relative", "individual"] = "relative",
    sections: Sequence[str] | None = None,
    dpi: int = 100,
    width_in: float = 10.0,
    panel_height_in: float = 2.5,
    threshold: float = 0.75,
) -> tuple[int, int]:
    """Draw the history as a PNG with one heatmap panel per section (and one for the GPU).

    Args:
        reports: Reports in time order (e.g. from :func:`~resiliency.straggler.load_reports`).
        output: PNG path to write.
        kind: Which scores to draw.
        sections: Restrict to these sections; None draws the GPU and every section.
        dpi: Pixels per inch.
        width_in: Figure width in inches.
        panel_height_in: Height per panel in inches.
        threshold: The score drawn yellow; lower scores shade to red, higher to green.

    Returns:
        ``(width, height)`` of the picture in pixels.

    Raises:
        MissingDependencyError: matplotlib is not installed.
        StragglerError: No report holds a score of the requested kind.
    """
    if kind not in ("relative", "individual"):
        raise StragglerError(f"kind must be 'relative' or 'individual', got {kind!r}")
    if not 0.0 < threshold < 1.0:
        raise StragglerError(f"threshold must be strictly between 0 and 1, got {threshold}")
    try:
        from matplotlib.colors import TwoSlopeNorm  # noqa: PLC0415 -- optional dependency
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(
            "rendering a heatmap needs matplotlib (the 'plot' extra of resiliency-straggler): "
            "pip install matplotlib"
        ) from exc
    panels = heatmap_panels(reports, kind, sections)
    if not panels:
        raise StragglerError(
            f"none of the {len(reports)} reports holds {kind} scores"
            + (f" for sections {list(sections)}" if sections is not None else "")
            + "; reports from ranks other than 0 with gather_on_rank0=True carry no scores"
        )
    start = reports[0].created_at
    span = reports[-1].created_at - start
    unit, scale = ("minutes", 60.0) if span >= 120.0 else ("seconds", 1.0)
    offsets = [(r.created_at - start) / scale for r in reports]
    nodes: dict[int, str] = {}
    ranks_seen: set[int] = set()
    for report in reports:
        nodes.update(report.rank_to_node)
        for panel in panels:
            ranks_seen.update(_scores_of(report, panel, kind))
    # Every panel shows every rank, so a rank without samples in a section shows as grey.
    ranks = sorted(ranks_seen | set(nodes))
    norm = TwoSlopeNorm(vcenter=threshold, vmin=0.0, vmax=1.0)

    width_px, height_px = round(width_in * dpi), round(panel_height_in * len(panels) * dpi)
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi, layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    image: Any = None
    for ax, panel in zip(axes, panels, strict=True):
        columns = [_scores_of(report, panel, kind) for report in reports]
        grid = [[column.get(rank, math.nan) for column in columns] for rank in ranks]
        image = ax.imshow(
            grid,
            aspect="auto",
            interpolation="nearest",
            cmap=_colormap(),
            norm=norm,
            origin="lower",
        )
        ax.set_title(f"{panel}: {kind} score", fontsize=9, loc="left")
        ax.set_ylabel("rank", fontsize=8)
        if len(ranks) <= _MAX_RANK_LABELS:
            ax.set_yticks(range(len(ranks)))
            ax.set_yticklabels([f"{r} ({nodes.get(r, '?')})" for r in ranks], fontsize=7)
        else:
            ticks = _spread(len(ranks), 8)
            ax.set_yticks(ticks)
            ax.set_yticklabels([str(ranks[i]) for i in ticks], fontsize=7)
        ticks = _spread(len(reports), 10)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{offsets[i]:.1f}" for i in ticks], fontsize=7)
    axes[-1].set_xlabel(f"{unit} since the first report", fontsize=8)
    bar = fig.colorbar(image, ax=list(axes))
    bar.set_label("score (0.5 = 2x slower; grey: no samples)", fontsize=8)
    bar.set_ticks([0.0, 0.25, 0.5, threshold, 1.0])
    fig.savefig(output, format="png", dpi=dpi)
    log.info("heatmap of %d reports x %d panels written to %s", len(reports), len(panels), output)
    return width_px, height_px


def _spread(count: int, most: int) -> list[int]:
    step = max(1, math.ceil(count / most))
    return list(range(0, count, step))


def _colormap() -> Any:
    from matplotlib import colormaps  # noqa: PLC0415 -- optional dependency

    return colormaps["RdYlGn"].with_extremes(bad="#d0d0d0")  # grey: no samples


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: render a report history file to a PNG.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(
        prog="resiliency-straggler-heatmap",
        description="Render a straggler report history (JSON lines written by "
        "resiliency.straggler.append_report) as a PNG heatmap of ranks x time.",
    )
    parser.add_argument("history", type=Path, help="report history file (.jsonl)")
    parser.add_argument("-o", "--output", type=Path, default=Path("straggler_heatmap.png"))
    parser.add_argument("--kind", choices=("relative", "individual"), default="relative")
    parser.add_argument(
        "--section", action="append", dest="sections", help="draw only this section (repeatable)"
    )
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        reports = load_reports(args.history)
        width, height = render_heatmap(
            reports, args.output, kind=args.kind, sections=args.sections, dpi=args.dpi
        )
    except StragglerError as exc:
        parser.exit(1, f"resiliency-straggler-heatmap: error: {exc}\n")
    log.info("%s: %dx%d pixels", args.output, width, height)
    return 0
