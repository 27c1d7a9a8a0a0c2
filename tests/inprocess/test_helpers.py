"""The helpers' behaviour on their own: state, rank assignment, composition, counters."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from resiliency import inprocess
from resiliency.inprocess.exception import RestartAbort
from resiliency.inprocess.finalize import ThreadedFinalize
from resiliency.inprocess.health_check import FaultCounter, FaultCounterExceeded
from resiliency.inprocess.initialize import RetryController
from resiliency.inprocess.rank_assignment import (
    ActivateAllRanks,
    FillGaps,
    MaxActiveWorldSize,
    RankAssignmentCtx,
    RankDiscarded,
    ShiftRanks,
)
from resiliency.inprocess.state import Mode, State


def make_state(rank: int, world: int) -> State:
    return State(
        rank=rank,
        world_size=world,
        active_rank=rank,
        active_world_size=world,
        initial_rank=rank,
        initial_world_size=world,
    )


def assign(assignment: inprocess.rank_assignment.RankAssignment, rank: int, dead: set[int]):
    return assignment(RankAssignmentCtx(make_state(rank, 6), None, set(dead))).state


def test_shift_ranks_closes_the_gaps_in_order() -> None:
    new = {r: assign(ShiftRanks(), r, {1, 4}).rank for r in (0, 2, 3, 5)}
    assert new == {0: 0, 2: 1, 3: 2, 5: 3}


def test_fill_gaps_moves_only_the_highest_ranks() -> None:
    new = {r: assign(FillGaps(), r, {1, 4}).rank for r in (0, 2, 3, 5)}
    assert new == {0: 0, 2: 2, 3: 3, 5: 1}


def test_a_terminated_rank_is_discarded() -> None:
    with pytest.raises(RankDiscarded, match="rank 1"):
        assign(ShiftRanks(), 1, {1})


def test_default_composition_activates_the_shifted_ranks() -> None:
    default = inprocess.Compose(ActivateAllRanks(), ShiftRanks())
    state = assign(default, 5, {0})
    assert (state.rank, state.world_size) == (4, 5)
    assert (state.active_rank, state.active_world_size) == (4, 5)
    assert state.mode is Mode.ACTIVE


def test_max_active_world_size_leaves_spares() -> None:
    chain = inprocess.Compose(MaxActiveWorldSize(4), ActivateAllRanks())
    spare = assign(chain, 5, set())
    assert spare.mode is Mode.INACTIVE and spare.active_rank is None
    assert spare.active_world_size == 4


def test_frozen_state_is_read_only() -> None:
    frozen = make_state(1, 2).freeze()
    with pytest.raises(AttributeError):
        frozen.rank = 3  # type: ignore[misc]


def test_fault_counter_counts_only_this_ranks_faults() -> None:
    counter = FaultCounter(max_rank_faults=1)
    state = make_state(0, 2)
    counter(state.freeze())  # no exception of its own: not counted
    state.fn_exception = RuntimeError("x")
    counter(state.freeze())
    with pytest.raises(FaultCounterExceeded, match="2 faults"):
        counter(state.freeze())


def test_retry_controller_stops_past_the_limits() -> None:
    state = make_state(0, 4)
    state.iteration = 2  # the third call: max_iterations=3 lets it start, 2 does not (NVRx)
    assert RetryController(max_iterations=3)(state.freeze()).iteration == 2
    with pytest.raises(RestartAbort, match=r"iteration=2 reached .*max_iterations=2"):
        RetryController(max_iterations=2)(state.freeze())
    state.iteration = 3
    with pytest.raises(RestartAbort, match="min_world_size=5"):
        RetryController(min_world_size=5)(state.freeze())


def test_threaded_finalize_has_a_deadline() -> None:
    release = threading.Event()
    slow = ThreadedFinalize(timedelta(seconds=0.2), release.wait, args=(30,))
    try:
        with pytest.raises(inprocess.exception.TimeoutError, match=r"did not return within 0\.2 s"):
            slow(make_state(0, 1).freeze())
    finally:
        release.set()


def test_compose_calls_the_last_callable_first() -> None:
    calls = []

    def first(x: int) -> int:
        calls.append("first")
        return x + 1

    def second(x: int) -> int:
        calls.append("second")
        return x * 10

    assert inprocess.Compose(second, first)(1) == 20
    assert calls == ["first", "second"]


def test_compose_chains_any_number_of_arguments_as_nvrx_does() -> None:
    counted = []

    def tick() -> None:  # no parameter: gets nothing, passes nothing on
        counted.append(1)

    assert inprocess.Compose(tick, tick, tick)() is None
    assert len(counted) == 3

    def shift(a: int, b: int) -> tuple[int, int]:  # a tuple is spread into the next call
        return a + 1, b + 10

    assert inprocess.Compose(shift, shift)(0, 0) == (2, 20)
    assert inprocess.Compose(lambda x: x)(None) is None  # a lone None passes without a warning


def test_compose_warns_when_a_link_drops_its_arguments() -> None:
    seen = []

    def keep(x: object) -> object:
        seen.append(x)
        return x

    def drop(x: object) -> None:
        seen.append(x)

    with pytest.warns(UserWarning, match="returned None for \\(5,\\)"):
        result = inprocess.Compose(keep, drop)(5)
    assert result is None and seen == [5, None]


def test_compose_is_an_instance_of_the_closest_common_base() -> None:
    class Base:
        def __call__(self, x: object) -> object:
            return x

    class Child(Base):
        pass

    class Grandchild(Child):
        pass

    mixed = inprocess.Compose(Child(), Grandchild())
    assert isinstance(mixed, Child) and isinstance(mixed, Base)
    assert not isinstance(mixed, Grandchild)
    siblings = inprocess.Compose(Child(), Base())
    assert isinstance(siblings, Base) and not isinstance(siblings, Child)


def test_compose_never_calls_the_common_base_init_with_the_chained_callables() -> None:
    counter = inprocess.health_check.FaultCounter
    one = inprocess.Compose(counter(max_rank_faults=1))
    assert not hasattr(one, "max_rank_faults")  # not a FaultCounter built with one argument
    two = inprocess.Compose(counter(), counter(max_rank_faults=2))  # was a TypeError
    assert isinstance(two, counter) and len(two.instances) == 2


def test_a_state_needs_only_its_rank_and_world_size_as_in_nvrx() -> None:
    state = inprocess.State(rank=2, world_size=4)
    assert (state.initial_rank, state.initial_world_size) == (2, 4)
    assert state.active_rank is None and state.mode is inprocess.Mode.INITIALIZED
    state.fn_exception = RuntimeError("x")
    state.advance()
    assert state.iteration == 1 and state.fn_exception is None
    frozen = state.freeze()
    assert isinstance(frozen, inprocess.FrozenState) and frozen.initial_rank == 2
    other = inprocess.State(rank=0, world_size=1)
    other.copy_from(frozen, fields=["iteration", "rank"])
    assert (other.iteration, other.rank, other.world_size) == (1, 2, 1)
