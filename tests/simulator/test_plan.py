"""FaultPlan: a seeded schedule is reproducible, bounded and validated."""

from __future__ import annotations

import itertools
import statistics

import pytest

from resiliency.simulator import FAULT_KINDS, FaultPlan, PlanError


def test_same_seed_same_schedule() -> None:
    a = FaultPlan.from_seed(42, faults=["kill", "hang", "slow"], mtbf=30, duration=600)
    b = FaultPlan.from_seed(42, faults=["kill", "hang", "slow"], mtbf=30, duration=600)
    assert a == b
    assert len(a) > 3


def test_different_seed_different_schedule() -> None:
    a = FaultPlan.from_seed(1, faults=list(FAULT_KINDS), mtbf=30, duration=600)
    b = FaultPlan.from_seed(2, faults=list(FAULT_KINDS), mtbf=30, duration=600)
    assert [f.at_s for f in a.faults] != [f.at_s for f in b.faults]


def test_inter_arrival_times_are_exponential_with_the_mtbf() -> None:
    plan = FaultPlan.from_seed(7, faults=["kill"], mtbf=10, count=4000)
    times = [f.at_s for f in plan.faults]
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    # Mean of 4,000 exponential draws: within 5 % of the MTBF; exponential => median ~ ln2 * mean.
    assert statistics.mean(gaps) == pytest.approx(10, rel=0.05)
    assert statistics.median(gaps) == pytest.approx(10 * 0.693, rel=0.08)


def test_keep_alive_is_the_minimum_gap() -> None:
    plan = FaultPlan.from_seed(3, faults=["kill"], mtbf=2, keep_alive=5, count=50)
    times = [f.at_s for f in plan.faults]
    assert times[0] >= 5
    assert all(b - a >= 5 - 1e-6 for a, b in itertools.pairwise(times))


def test_duration_bounds_the_plan_and_every_kind_is_drawn() -> None:
    plan = FaultPlan.from_seed(11, faults=list(FAULT_KINDS), mtbf=1, duration=500)
    assert all(f.at_s < 500 for f in plan.faults)
    assert {f.kind for f in plan.faults} == set(FAULT_KINDS)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"faults": ["kil"], "count": 1}, "unknown fault kind"),
        ({"faults": [], "count": 1}, "unknown fault kind"),
        ({"faults": ["kill"], "mtbf": 0, "count": 1}, "mtbf must be > 0"),
        ({"faults": ["kill"], "keep_alive": -1, "count": 1}, "keep_alive"),
        ({"faults": ["kill"]}, "duration or a count"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        FaultPlan.from_seed(0, **kwargs)
