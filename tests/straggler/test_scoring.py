"""The score formulas over plain numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resiliency.straggler._scoring import (
    DURATION_FLOOR_US,
    BestHistory,
    gpu_relative_scores,
    section_relative_scores,
)


def test_relative_section_score_is_reference_over_own_median() -> None:
    scores = section_relative_scores(
        [(0, {"fwd": 10.0, "data": 4.0}), (1, {"fwd": 20.0}), (2, {"fwd": 12.5, "data": 5.0})]
    )
    assert scores == {"fwd": {0: 1.0, 1: 0.5, 2: 0.8}, "data": {0: 1.0, 2: 0.8}}


def test_rank_without_samples_gets_no_score_and_does_not_set_the_reference() -> None:
    scores = section_relative_scores([(0, {}), (1, {"fwd": 30.0}), (2, {"fwd": 60.0})])
    assert scores == {"fwd": {1: 1.0, 2: 0.5}}


def test_zero_durations_are_floored_not_divided_by() -> None:
    scores = section_relative_scores([(0, {"x": 0.0}), (1, {"x": DURATION_FLOOR_US * 2})])
    assert scores == {"x": {0: 1.0, 1: 0.5}}


def test_gpu_relative_score_weights_kernels_by_the_ranks_own_launch_counts() -> None:
    scores = gpu_relative_scores(
        [
            (0, {"gemm": (100.0, 10), "relu": (10.0, 10)}),
            (1, {"gemm": (200.0, 10), "relu": (10.0, 10)}),
            (2, {"relu": (20.0, 5)}),
            (3, {}),
        ]
    )
    assert scores[0] == 1.0
    assert scores[1] == pytest.approx((10 * 100 + 10 * 10) / (10 * 200 + 10 * 10))
    assert scores[2] == pytest.approx(0.5)
    assert 3 not in scores


def test_individual_scores_compare_with_the_best_past_window() -> None:
    history = BestHistory()
    assert history.section_scores({"fwd": 10.0}) == {"fwd": 1.0}
    assert history.section_scores({"fwd": 20.0}) == {"fwd": 0.5}
    assert history.section_scores({"fwd": 8.0}) == {"fwd": 1.0}
    assert history.section_scores({"fwd": 16.0, "new": 3.0}) == {"fwd": 0.5, "new": 1.0}
    assert history.gpu_score({}) is None
    assert history.gpu_score({"k": (50.0, 4)}) == 1.0
    assert history.gpu_score({"k": (100.0, 4)}) == 0.5


durations = st.floats(min_value=0.0, max_value=1e9, allow_nan=False)


@given(st.lists(st.dictionaries(st.sampled_from("abcd"), durations), min_size=1, max_size=20))
def test_relative_scores_lie_in_zero_one_and_the_fastest_scores_one(
    per_rank: list[dict[str, float]],
) -> None:
    scores = section_relative_scores(enumerate(per_rank))
    for per_section in scores.values():
        assert all(0.0 < s <= 1.0 for s in per_section.values())
        assert max(per_section.values()) == 1.0


@given(
    st.lists(
        st.dictionaries(st.sampled_from("xyz"), st.tuples(durations, st.integers(0, 1000))),
        min_size=1,
        max_size=10,
    )
)
def test_gpu_scores_lie_in_zero_one(per_rank: list[dict[str, tuple[float, int]]]) -> None:
    for score in gpu_relative_scores(enumerate(per_rank)).values():
        assert 0.0 < score <= 1.0
