"""The straggler report and the rule that names stragglers from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict

from resiliency.straggler.errors import StragglerConfigError
from resiliency.straggler.profiler import KernelStats
from resiliency.straggler.sections import SectionSummary

__all__ = ["Report", "StragglerId", "Stragglers", "Thresholds"]

DEFAULT_THRESHOLD = 0.75


@dataclass(frozen=True, order=True)
class StragglerId:
    """A flagged rank and the node it runs on.

    Attributes:
        rank: Global rank.
        node: Node name the rank reported.
    """

    rank: int
    node: str


class Stragglers(TypedDict):
    """What :meth:`Report.identify_stragglers` returns (a plain dict with these keys)."""

    straggler_gpus_relative: set[StragglerId]
    straggler_gpus_individual: set[StragglerId]
    straggler_sections_relative: dict[str, set[StragglerId]]
    straggler_sections_individual: dict[str, set[StragglerId]]


def _check_threshold(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise StragglerConfigError(f"{name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise StragglerConfigError(
            f"{name} must be in [0, 1] (a score below it flags a straggler), got {value}"
        )
    return float(value)


@dataclass(frozen=True)
class Thresholds:
    """Scores strictly below a threshold flag a straggler; all default to 0.75.

    Attributes:
        gpu_rel_threshold: For GPU relative scores.
        section_rel_threshold: For section relative scores.
        gpu_indiv_threshold: For GPU individual scores.
        section_indiv_threshold: For section individual scores.

    Raises:
        StragglerConfigError: A threshold is not a number in [0, 1].
    """

    gpu_rel_threshold: float = DEFAULT_THRESHOLD
    section_rel_threshold: float = DEFAULT_THRESHOLD
    gpu_indiv_threshold: float = DEFAULT_THRESHOLD
    section_indiv_threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        for name in (
            "gpu_rel_threshold",
            "section_rel_threshold",
            "gpu_indiv_threshold",
            "section_indiv_threshold",
        ):
            object.__setattr__(self, name, _check_threshold(name, getattr(self, name)))


@dataclass
class Report:
    """Performance scores of one report window.

    Scores lie in (0, 1]: the reference duration divided by the rank's duration, so 0.5 means twice
    as slow as the reference. Relative scores take the fastest rank as the reference, individual
    scores the rank's own best past window. A rank with no samples in a section (or no kernel
    samples) in the window has no entry for it: absent means "not measured", never "slow".

    With ``gather_on_rank0=True`` the score fields hold every rank on rank 0, and the other ranks
    get no report at all (``None``); with ``gather_on_rank0=False`` each rank's report holds
    only its own scores. This is the layout of NVIDIA's resiliency extension, except that a
    score that cannot be computed is absent here where that tool stores NaN.

    Attributes:
        gpu_relative_perf_scores: Rank -> GPU relative score.
        section_relative_perf_scores: Section -> rank -> relative score.
        gpu_individual_perf_scores: Rank -> GPU individual score.
        section_individual_perf_scores: Section -> rank -> individual score.
        rank_to_node: Rank -> node name, for every rank present in the scores.
        local_section_summaries: This rank's CPU timing statistics per section: each value is a
            mapping ``{Statistic: milliseconds}`` (``Statistic.NUM``: the count) that also has
            ``*_us`` attributes.
        local_kernel_summaries: This rank's GPU timing statistics per kernel (per section when
            timed with CUDA events), the same kind of mapping.
        generate_report_elapsed_time: Milliseconds this rank spent generating the report.
        gather_on_rank0: Whether scores were gathered on rank 0.
        rank: Global rank that produced this report.
        created_at: Unix time at which the report was generated.
        thresholds: Thresholds :meth:`identify_stragglers` uses by default (the Detector's at the
            time of the report).
    """

    gpu_relative_perf_scores: dict[int, float] = field(default_factory=dict)
    section_relative_perf_scores: dict[str, dict[int, float]] = field(default_factory=dict)
    gpu_individual_perf_scores: dict[int, float] = field(default_factory=dict)
    section_individual_perf_scores: dict[str, dict[int, float]] = field(default_factory=dict)
    rank_to_node: dict[int, str] = field(default_factory=dict)
    local_section_summaries: dict[str, SectionSummary] = field(default_factory=dict)
    local_kernel_summaries: dict[str, KernelStats] = field(default_factory=dict)
    generate_report_elapsed_time: float = 0.0
    gather_on_rank0: bool = True
    rank: int = 0
    created_at: float = 0.0
    thresholds: Thresholds = field(default_factory=Thresholds)

    def identify_stragglers(
        self,
        gpu_rel_threshold: float | None = None,
        section_rel_threshold: float | None = None,
        gpu_indiv_threshold: float | None = None,
        section_indiv_threshold: float | None = None,
    ) -> Stragglers:
        """Name the ranks whose scores fall strictly below the thresholds.

        Args:
            gpu_rel_threshold: Threshold for GPU relative scores (default: ``self.thresholds``,
                0.75 unless changed with ``Detector.set_thresholds``).
            section_rel_threshold: Threshold for section relative scores.
            gpu_indiv_threshold: Threshold for GPU individual scores.
            section_indiv_threshold: Threshold for section individual scores.

        Returns:
            A dict with ``straggler_gpus_relative`` and ``straggler_gpus_individual`` (sets of
            :class:`StragglerId`) and ``straggler_sections_relative`` and
            ``straggler_sections_individual`` (section -> set, only sections with a straggler).

        Raises:
            StragglerConfigError: A threshold is not a number in [0, 1].
        """
        t = self.thresholds
        gpu_rel = t.gpu_rel_threshold if gpu_rel_threshold is None else gpu_rel_threshold
        sec_rel = (
            t.section_rel_threshold if section_rel_threshold is None else section_rel_threshold
        )
        gpu_ind = t.gpu_indiv_threshold if gpu_indiv_threshold is None else gpu_indiv_threshold
        sec_ind = (
            t.section_indiv_threshold
            if section_indiv_threshold is None
            else section_indiv_threshold
        )
        chosen = Thresholds(gpu_rel, sec_rel, gpu_ind, sec_ind)
        return {
            "straggler_gpus_relative": self._below(
                self.gpu_relative_perf_scores, chosen.gpu_rel_threshold
            ),
            "straggler_gpus_individual": self._below(
                self.gpu_individual_perf_scores, chosen.gpu_indiv_threshold
            ),
            "straggler_sections_relative": self._sections_below(
                self.section_relative_perf_scores, chosen.section_rel_threshold
            ),
            "straggler_sections_individual": self._sections_below(
                self.section_individual_perf_scores, chosen.section_indiv_threshold
            ),
        }

    def _below(self, scores: dict[int, float], threshold: float) -> set[StragglerId]:
        return {
            StragglerId(rank, self.rank_to_node.get(rank, ""))
            for rank, score in scores.items()
            if score < threshold
        }

    def _sections_below(
        self, scores: dict[str, dict[int, float]], threshold: float
    ) -> dict[str, set[StragglerId]]:
        flagged: dict[str, set[StragglerId]] = {}
        for section, per_rank in scores.items():
            ids = self._below(per_rank, threshold)
            if ids:
                flagged[section] = ids
        return flagged
