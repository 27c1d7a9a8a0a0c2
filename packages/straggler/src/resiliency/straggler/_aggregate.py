"""Turning the gathered per-rank frames into the score fields of a report."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from resiliency.straggler._payload import GatheredSummaries
from resiliency.straggler._scoring import gpu_relative_scores, relative_scores_of_columns
from resiliency.straggler.errors import ExchangeError
from resiliency.straggler.report import Report

__all__ = ["decode_all", "fill_scores"]

log = logging.getLogger(__name__)


def decode_all(payloads: Sequence[bytes], *, receiver_rank: int) -> GatheredSummaries:
    """Validate every peer's frame; a malformed one is logged and left out, never fatal.

    Args:
        payloads: The gathered bytes, in group order.
        receiver_rank: This rank, for the log message.

    Returns:
        The valid frames, in columns.
    """
    gathered = GatheredSummaries()
    for index, data in enumerate(payloads):
        try:
            gathered.add(data)
        except ExchangeError as exc:
            log.error(
                "rank %d: summary from group member %d is dropped from this report: %s",
                receiver_rank,
                index,
                exc,
            )
    return gathered


def _only(columns: dict[str, dict[int, float]], rank: int) -> dict[str, dict[int, float]]:
    return {name: {rank: per[rank]} for name, per in columns.items() if rank in per}


def fill_scores(
    report: Report,
    gathered: GatheredSummaries,
    *,
    relative: bool,
    individual: bool,
    only_rank: int | None = None,
) -> None:
    """Compute relative scores across the gathered ranks and copy individual scores.

    Args:
        report: The report to fill.
        gathered: Every rank's frame.
        relative: Compute relative scores.
        individual: Copy the individual scores the ranks computed.
        only_rank: Keep only this rank's entries (``gather_on_rank0=False``).
    """
    if relative:
        section_rel = relative_scores_of_columns(gathered.section_medians())
        gpu_rel = gpu_relative_scores(gathered.kernel_medians())
        if only_rank is not None:
            section_rel = _only(section_rel, only_rank)
            gpu_rel = {r: v for r, v in gpu_rel.items() if r == only_rank}
        report.section_relative_perf_scores = section_rel
        report.gpu_relative_perf_scores = gpu_rel
    if individual:
        section_ind = {
            name: dict(zip(ranks, scores, strict=True))
            for name, (ranks, scores) in gathered.section_individual().items()
        }
        gpu_ind = gathered.gpu_individual()
        if only_rank is not None:
            section_ind = _only(section_ind, only_rank)
            gpu_ind = {r: v for r, v in gpu_ind.items() if r == only_rank}
        report.section_individual_perf_scores = section_ind
        report.gpu_individual_perf_scores = gpu_ind
    nodes = gathered.rank_to_node
    report.rank_to_node = nodes if only_rank is None else {only_rank: nodes[only_rank]}
