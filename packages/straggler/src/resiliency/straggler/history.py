"""Report history on disk: one JSON object per line, appended after each report.

The heatmap reads these files. Loading validates every field and names the offending line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from resiliency.straggler.errors import ReportHistoryError
from resiliency.straggler.profiler import KernelStats
from resiliency.straggler.report import Report, Thresholds
from resiliency.straggler.sections import SectionSummary

__all__ = ["append_report", "load_reports", "report_from_dict", "report_to_dict"]

FORMAT_VERSION = 1
_STAT_FIELDS = ("count", "min_us", "max_us", "median_us", "mean_us")


def report_to_dict(report: Report) -> dict[str, Any]:
    """A JSON-ready dict of ``report`` (rank keys become strings, as JSON requires)."""
    return {
        "format": FORMAT_VERSION,
        "rank": report.rank,
        "created_at": report.created_at,
        "gather_on_rank0": report.gather_on_rank0,
        "generate_report_elapsed_time": report.generate_report_elapsed_time,
        "rank_to_node": {str(r): n for r, n in report.rank_to_node.items()},
        "gpu_relative_perf_scores": {str(r): v for r, v in report.gpu_relative_perf_scores.items()},
        "gpu_individual_perf_scores": {
            str(r): v for r, v in report.gpu_individual_perf_scores.items()
        },
        "section_relative_perf_scores": {
            s: {str(r): v for r, v in per.items()}
            for s, per in report.section_relative_perf_scores.items()
        },
        "section_individual_perf_scores": {
            s: {str(r): v for r, v in per.items()}
            for s, per in report.section_individual_perf_scores.items()
        },
        "local_section_summaries": {
            s: [getattr(v, f) for f in _STAT_FIELDS]
            for s, v in report.local_section_summaries.items()
        },
        "local_kernel_summaries": {
            k: [getattr(v, f) for f in _STAT_FIELDS]
            for k, v in report.local_kernel_summaries.items()
        },
        "thresholds": [
            report.thresholds.gpu_rel_threshold,
            report.thresholds.section_rel_threshold,
            report.thresholds.gpu_indiv_threshold,
            report.thresholds.section_indiv_threshold,
        ],
    }


def _score(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReportHistoryError(f"{what} is not a finite number: {value!r}")
    return float(value)


def _rank_map(value: Any, what: str) -> dict[int, float]:
    if not isinstance(value, dict):
        raise ReportHistoryError(f"{what} is not an object")
    try:
        return {int(r): _score(v, f"{what}[{r}]") for r, v in value.items()}
    except ValueError as exc:
        raise ReportHistoryError(f"{what} has a rank that is not an integer: {exc}") from exc


def _stats(value: Any, what: str) -> list[float]:
    if not (isinstance(value, list) and len(value) == len(_STAT_FIELDS)):
        raise ReportHistoryError(f"{what} is not a list of {len(_STAT_FIELDS)} numbers")
    return [_score(v, what) for v in value]


def _thresholds(value: Any) -> Thresholds:
    if not (isinstance(value, list) and len(value) == 4):
        raise ReportHistoryError("thresholds is not a list of 4 numbers")
    return Thresholds(*(_score(v, "threshold") for v in value))


def report_from_dict(doc: Any) -> Report:
    """Rebuild a :class:`Report` from :func:`report_to_dict` output.

    Raises:
        ReportHistoryError: The document does not follow the format.
    """
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
        raise ReportHistoryError(f"not a straggler report of format {FORMAT_VERSION}")
    try:
        nodes = doc["rank_to_node"]
        if not isinstance(nodes, dict) or not all(isinstance(n, str) for n in nodes.values()):
            raise ReportHistoryError("rank_to_node is not an object of strings")
        sections = {}
        for s, stats in doc["local_section_summaries"].items():
            count, *rest = _stats(stats, f"section summary {s!r}")
            sections[s] = SectionSummary(int(count), *rest)
        kernels = {}
        for k, stats in doc["local_kernel_summaries"].items():
            count, *rest = _stats(stats, f"kernel summary {k!r}")
            kernels[k] = KernelStats(int(count), *rest)
        return Report(
            gpu_relative_perf_scores=_rank_map(doc["gpu_relative_perf_scores"], "GPU relative"),
            gpu_individual_perf_scores=_rank_map(
                doc["gpu_individual_perf_scores"], "GPU individual"
            ),
            section_relative_perf_scores={
                s: _rank_map(v, f"section {s!r} relative")
                for s, v in doc["section_relative_perf_scores"].items()
            },
            section_individual_perf_scores={
                s: _rank_map(v, f"section {s!r} individual")
                for s, v in doc["section_individual_perf_scores"].items()
            },
            rank_to_node={int(r): n for r, n in nodes.items()},
            local_section_summaries=sections,
            local_kernel_summaries=kernels,
            generate_report_elapsed_time=_score(doc["generate_report_elapsed_time"], "elapsed"),
            gather_on_rank0=bool(doc["gather_on_rank0"]),
            rank=int(doc["rank"]),
            created_at=_score(doc["created_at"], "created_at"),
            thresholds=_thresholds(doc["thresholds"]),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, ReportHistoryError):
            raise
        raise ReportHistoryError(f"malformed report: {type(exc).__name__}: {exc}") from exc


def append_report(path: str | Path, report: Report) -> None:
    """Append ``report`` as one JSON line to ``path`` (created if missing).

    Args:
        path: The history file.
        report: The report to store (usually rank 0's, which holds every rank).
    """
    line = json.dumps(report_to_dict(report), separators=(",", ":"), allow_nan=False)
    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def load_reports(path: str | Path) -> list[Report]:
    """Read every report of a history file, in file order.

    Args:
        path: A file written by :func:`append_report`.

    Returns:
        The reports.

    Raises:
        ReportHistoryError: The file is missing, holds no report, or a line is malformed (the
            message names the line).
    """
    file = Path(path)
    try:
        lines: Iterable[str] = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReportHistoryError(f"cannot read report history {file}: {exc}") from exc
    reports = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            reports.append(report_from_dict(json.loads(line)))
        except (json.JSONDecodeError, ReportHistoryError) as exc:
            raise ReportHistoryError(f"{file}:{number}: {exc}") from exc
    if not reports:
        raise ReportHistoryError(f"{file} holds no report")
    return reports
