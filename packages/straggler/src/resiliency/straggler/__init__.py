"""resiliency.straggler: straggler detection for distributed training.

Pure Python with no required dependency: torch is used only when the program has initialized
``torch.distributed``, matplotlib only to render heatmaps. See ``docs/straggler.md``.
"""

from resiliency.straggler.collective_wait import CollectiveWait
from resiliency.straggler.detector import Detector
from resiliency.straggler.errors import (
    DetectorStateError,
    ExchangeError,
    MissingDependencyError,
    ReportHistoryError,
    StragglerConfigError,
    StragglerError,
)
from resiliency.straggler.heatmap import render_heatmap
from resiliency.straggler.history import append_report, load_reports
from resiliency.straggler.profiler import (
    API_VERSION,
    ENTRY_POINT_GROUP,
    KernelProfiler,
    KernelStats,
)
from resiliency.straggler.report import Report, StragglerId, Stragglers, Thresholds
from resiliency.straggler.sections import SectionSummary
from resiliency.straggler.statistic import Statistic
from resiliency.straggler.wrapping import CallableId

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "CallableId",
    "CollectiveWait",
    "Detector",
    "DetectorStateError",
    "ExchangeError",
    "KernelProfiler",
    "KernelStats",
    "MissingDependencyError",
    "Report",
    "ReportHistoryError",
    "SectionSummary",
    "Statistic",
    "StragglerConfigError",
    "StragglerError",
    "StragglerId",
    "Stragglers",
    "Thresholds",
    "append_report",
    "load_reports",
    "render_heatmap",
]
