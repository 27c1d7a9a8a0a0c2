"""NVRx 0.5's ``completion`` and ``terminate`` callbacks, and the deprecated ``rank_filter``, in
the real wrapper (one rank, its store in memory; the 4-rank runs are in
test_nvrx_style_scripts.py and test_tree_spares.py)."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch.distributed as dist

from resiliency import inprocess
from resiliency.inprocess.exception import RepeatedFaultError
from resiliency.inprocess.state import FrozenState, Mode, State


class _Recording:
    """A callback that records every state it is called with, and may then fail."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.seen: list[FrozenState] = []
        self.failure = failure

    def __call__(self, state: FrozenState) -> FrozenState:
        self.seen.append(state)
        if self.failure is not None:
            raise self.failure
        return state


class Completed(_Recording, inprocess.completion.Completion):
    pass


class Terminated(_Recording, inprocess.terminate.Terminate):
    pass


def test_completion_runs_once_after_the_restarted_call_returned(one_rank: dist.HashStore) -> None:
    completed, terminated = Completed(), Terminated()
    calls: list[int] = []

    @inprocess.Wrapper(store_factory=lambda: one_rank, completion=completed, terminate=terminated)
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> str:
        assert call_wrapper is not None
        calls.append(call_wrapper.iteration)
        if call_wrapper.iteration == 0:
            raise ValueError("a fault of the first call")
        return "trained"

    assert train() == "trained"
    assert calls == [0, 1]
    assert [s.iteration for s in completed.seen] == [1]
    assert terminated.seen == []


def test_a_failing_completion_is_logged_and_the_value_still_returned(
    one_rank: dist.HashStore, caplog: pytest.LogCaptureFixture
) -> None:
    completed = Completed(OSError("the completion marker's disk is full"))
    wrapped = inprocess.Wrapper(store_factory=lambda: one_rank, completion=completed)(lambda: 7)
    with caplog.at_level(logging.ERROR, logger="resiliency.inprocess"):
        assert wrapped() == 7
    assert len(completed.seen) == 1
    assert "rank 0: iteration 0: the completion callback failed" in caplog.text
    assert "the completion marker's disk is full" in caplog.text


def test_terminate_runs_once_when_the_stop_rule_ends_the_call(one_rank: dist.HashStore) -> None:
    completed, terminated = Completed(), Terminated()

    @inprocess.Wrapper(store_factory=lambda: one_rank, completion=completed, terminate=terminated)
    def train() -> None:
        raise ValueError("the same fault, every call")

    with pytest.raises(RepeatedFaultError, match="the same fault ended 3 attempts"):
        train()
    assert [s.iteration for s in terminated.seen] == [2]
    assert completed.seen == []


def test_a_failing_terminate_is_raised_chained_to_what_ended_the_call(
    one_rank: dist.HashStore,
) -> None:
    terminated = Terminated(ConnectionError("the job scheduler could not be told"))

    @inprocess.Wrapper(store_factory=lambda: one_rank, terminate=terminated)
    def train() -> None:
        raise inprocess.exception.RestartAbort("the user stops the job")

    with pytest.raises(ConnectionError, match="could not be told") as caught:
        train()
    assert isinstance(caught.value.__cause__, inprocess.exception.RestartAbort)
    assert len(terminated.seen) == 1


def test_a_deprecated_rank_filter_makes_a_spare_that_never_calls_the_function(
    one_rank: dist.HashStore,
) -> None:
    # one rank, WorldSizeDivisibleBy(2): no rank is active, so the call returns None at once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        wrapper = inprocess.Wrapper(
            store_factory=lambda: one_rank,
            rank_filter=inprocess.rank_filter.WorldSizeDivisibleBy(2),
        )
    calls: list[int] = []
    assert wrapper(lambda: calls.append(1))() is None
    assert calls == []


@pytest.mark.parametrize(
    ("rank", "limit", "divisor", "mode", "active"),
    [
        (0, 3, 1, Mode.ACTIVE, 3),
        (2, 3, 1, Mode.ACTIVE, 3),
        (3, 3, 1, Mode.INACTIVE, 3),
        (2, None, 4, Mode.ACTIVE, 4),
        (2, 3, 2, Mode.INACTIVE, 2),  # 3 rounded down to 2: rank 2 waits
    ],
)
def test_rank_filters_set_the_active_world_size_and_the_mode_as_nvrxs(
    rank: int, limit: int | None, divisor: int, mode: Mode, active: int
) -> None:
    state = State(rank=rank, world_size=4)
    composed = inprocess.Compose(
        inprocess.rank_filter.WorldSizeDivisibleBy(divisor),
        inprocess.rank_filter.MaxActiveWorldSize(limit),
    )
    state = composed(state)
    assert (state.mode, state.active_world_size) == (mode, active)
    assert state.active_rank == (rank if mode is Mode.ACTIVE else None)
