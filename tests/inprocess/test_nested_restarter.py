"""NVRx 0.4's nested-restarter callbacks: an NVRx script's ``initialize=`` and ``abort=`` work
unchanged, and the restarter's lines are logged on the special rank only."""

from __future__ import annotations

import logging

import pytest

from resiliency import inprocess
from resiliency.inprocess.abort import Abort, AbortTorchDistributed
from resiliency.inprocess.initialize import Initialize
from resiliency.inprocess.nested_restarter import (
    NestedRestarterCallback,
    NestedRestarterHandlingCompleted,
    NestedRestarterHandlingStarting,
    NestedRestarterLogger,
)
from resiliency.inprocess.state import Mode, State

LOGGER = "resiliency.inprocess.nested_restarter"


def frozen(initial_rank: int, iteration: int = 0):
    return State(
        rank=initial_rank,
        world_size=4,
        active_rank=initial_rank,
        active_world_size=4,
        initial_rank=initial_rank,
        initial_world_size=4,
        iteration=iteration,
        mode=Mode.ACTIVE,
    ).freeze()


def test_handling_completed_logs_initialize_then_completed_on_rank_0_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    on_rank = {rank: NestedRestarterHandlingCompleted() for rank in (0, 1)}
    caplog.set_level(logging.INFO, logger=LOGGER)
    for iteration in (0, 1, 2):
        for rank, callback in on_rank.items():
            state = frozen(rank, iteration)
            assert callback(state) is state
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert lines == [
        "active_rank=0 [NestedRestarter] name=[InProcess] state=initialize",
        "active_rank=0 [NestedRestarter] name=[InProcess] state=handling stage=completed",
        "active_rank=0 [NestedRestarter] name=[InProcess] state=handling stage=completed",
    ]


def test_handling_starting_composes_with_the_default_abort(
    caplog: pytest.LogCaptureFixture,
) -> None:
    abort = inprocess.Compose(AbortTorchDistributed(), NestedRestarterHandlingStarting())
    assert isinstance(abort, Abort)
    assert isinstance(NestedRestarterHandlingCompleted(special_rank=2), Initialize)
    caplog.set_level(logging.INFO, logger=LOGGER)
    abort(frozen(0))
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "active_rank=0 [NestedRestarter] name=[InProcess] state=handling stage=starting"
    ]
    # the Wrapper takes them where NVRx's takes them
    inprocess.Wrapper(initialize=NestedRestarterHandlingCompleted(), abort=abort)


def test_a_callback_writes_through_the_logger_it_is_given() -> None:
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    mine = NestedRestarterLogger(name="test.nested_restarter.own")
    mine.restarter_logger.addHandler(Collect())
    mine.restarter_logger.setLevel(logging.DEBUG)
    callback = NestedRestarterCallback("handling", "starting", mine, special_rank=1)
    callback(frozen(0))  # not the special rank: nothing
    callback(frozen(1))
    assert lines == [
        "active_rank=1 [NestedRestarter] name=[InProcess] state=handling stage=starting"
    ]
    assert mine.connected_rank == 1
    completed = NestedRestarterHandlingCompleted(special_rank=1)
    completed.logger = mine  # NVRx's tests set it this way
    completed(frozen(1))
    assert lines[-1].endswith("state=initialize")
