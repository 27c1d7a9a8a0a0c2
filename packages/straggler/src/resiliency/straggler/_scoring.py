"""Performance-score formulas: pure functions over plain numbers.

A score is ``reference / current`` for a duration (lower is better), so it lies in (0, 1]: 1.0 is as
fast as the reference, 0.5 twice as slow. Durations are medians over one report window, floored at
:data:`DURATION_FLOOR_US` so a zero-length measurement never divides by zero. The formulas are
written out in ``docs/straggler.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "DURATION_FLOOR_US",
    "BestHistory",
    "by_section",
    "gpu_relative_scores",
    "gpu_score_against",
    "relative_scores_of_columns",
    "section_relative_scores",
]

DURATION_FLOOR_US = 1e-3
"""Durations below one nanosecond are treated as one nanosecond (the clock's resolution)."""

KernelMedians = Mapping[str, tuple[float, int]]
"""Kernel name -> (median duration in us, launch count) for one rank and one window."""


def by_section(
    per_rank: Iterable[tuple[int, Mapping[str, float]]],
) -> dict[str, tuple[list[int], list[float]]]:
    """Transpose ``(rank, {section: value})`` pairs into ``section -> (ranks, values)``.

    Ranks that share the same section list (the usual case) are transposed together with one
    C-level ``zip``, which keeps this fast for thousands of ranks.

    Args:
        per_rank: One ``(rank, {section: value})`` pair per rank.

    Returns:
        Section -> (ranks having it, their values in the same order).
    """
    groups: dict[tuple[str, ...], tuple[list[int], list[tuple[float, ...]]]] = {}
    for rank, sections in per_rank:
        key = tuple(sections)
        group = groups.get(key)
        if group is None:
            groups[key] = group = ([], [])
        group[0].append(rank)
        group[1].append(tuple(sections.values()))
    out: dict[str, tuple[list[int], list[float]]] = {}
    for names, (ranks, rows) in groups.items():
        for name, column in zip(names, zip(*rows, strict=True), strict=True):
            known = out.get(name)
            if known is None:
                out[name] = (list(ranks), list(column))
            else:
                known[0].extend(ranks)
                known[1].extend(column)
    return out


def section_relative_scores(
    medians: Iterable[tuple[int, Mapping[str, float]]],
) -> dict[str, dict[int, float]]:
    """Score every rank's sections against the fastest rank in each section.

    ``score[s][r] = max(min_q m[q][s], floor) / max(m[r][s], floor)`` where ``m[r][s]`` is rank
    ``r``'s median duration of section ``s`` and the minimum runs over ranks that have samples in
    ``s``. A rank without samples in a section gets no score for it.

    Args:
        medians: ``(rank, {section: median_us})`` pairs, one per rank.

    Returns:
        Section name -> rank -> relative score in (0, 1].
    """
    return relative_scores_of_columns(by_section(medians))


def relative_scores_of_columns(
    columns: Mapping[str, tuple[list[int], list[float]]],
) -> dict[str, dict[int, float]]:
    """:func:`section_relative_scores` over already transposed ``section -> (ranks, medians)``.

    Args:
        columns: Section -> (ranks, median durations in us).

    Returns:
        Section name -> rank -> relative score in (0, 1].
    """
    floor = DURATION_FLOOR_US
    scores: dict[str, dict[int, float]] = {}
    for name, (ranks, values) in columns.items():
        reference = max(min(values), floor)
        scores[name] = dict(
            zip(ranks, [reference / (v if v > floor else floor) for v in values], strict=True)
        )
    return scores


def gpu_score_against(kernels: KernelMedians, reference: Mapping[str, float]) -> float | None:
    """Score one rank's kernels against reference medians, weighted by its own launch counts.

    ``score = sum_k c[k] * ref[k] / sum_k c[k] * m[k]`` over the kernels ``k`` the rank ran that
    have a reference: the time the reference would need for this rank's kernel mix, divided by
    the time this rank needed. Medians and references are floored like section durations.

    Args:
        kernels: Kernel name -> (median_us, count) for this rank.
        reference: Kernel name -> reference median_us (never larger than the rank's own median).

    Returns:
        The score in (0, 1], or ``None`` when no kernel with a reference and a launch was seen.
    """
    reference_time = 0.0
    own_time = 0.0
    for name, (median, count) in kernels.items():
        ref = reference.get(name)
        if ref is None or count <= 0:
            continue
        reference_time += count * max(ref, DURATION_FLOOR_US)
        own_time += count * max(median, DURATION_FLOOR_US)
    if own_time <= 0.0:
        return None
    return min(1.0, reference_time / own_time)


def gpu_relative_scores(per_rank: Iterable[tuple[int, KernelMedians]]) -> dict[int, float]:
    """Score every rank's GPU against the fastest median of each kernel over all ranks.

    Args:
        per_rank: ``(rank, {kernel: (median_us, count)})`` pairs, one per rank.

    Returns:
        Rank -> GPU relative score in (0, 1]; ranks without kernel samples are absent.
    """
    ranks = list(per_rank)
    reference: dict[str, float] = {}
    for _, kernels in ranks:
        for name, (median, count) in kernels.items():
            if count > 0 and (name not in reference or median < reference[name]):
                reference[name] = median
    scores: dict[int, float] = {}
    for rank, kernels in ranks:
        score = gpu_score_against(kernels, reference)
        if score is not None:
            scores[rank] = score
    return scores


class BestHistory:
    """One rank's best (lowest) window median per section and per kernel, for individual scores.

    Memory is one number per section and kernel name, independent of the run length.
    """

    def __init__(self) -> None:
        self._sections: dict[str, float] = {}
        self._kernels: dict[str, float] = {}

    def section_scores(self, medians: Mapping[str, float]) -> dict[str, float]:
        """Fold this window's section medians into the history and score them.

        ``score[s] = max(best[s], floor) / max(m[s], floor)`` where ``best[s]`` is the lowest
        window median seen so far, this window included (so the first window scores 1.0).

        Args:
            medians: Section name -> this window's median_us.

        Returns:
            Section name -> individual score in (0, 1].
        """
        scores: dict[str, float] = {}
        for name, median in medians.items():
            current = max(median, DURATION_FLOOR_US)
            best = min(self._sections.get(name, current), current)
            self._sections[name] = best
            scores[name] = best / current
        return scores

    def gpu_score(self, kernels: KernelMedians) -> float | None:
        """Fold this window's kernel medians into the history and score the GPU.

        Uses :func:`gpu_score_against` with the best past median of each kernel as reference.

        Args:
            kernels: Kernel name -> (median_us, count) for this window.

        Returns:
            The GPU individual score in (0, 1], or ``None`` without kernel samples.
        """
        for name, (median, count) in kernels.items():
            if count > 0:
                self._kernels[name] = min(self._kernels.get(name, median), median)
        return gpu_score_against(kernels, self._kernels)
