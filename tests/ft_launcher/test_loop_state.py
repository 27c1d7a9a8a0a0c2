"""The agent loop's state after one look: a hang is a state of its own (issue 26)."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import MonitorEvent
from resiliency.launcher._loop_state import (
    LoopState,
    group_state,
    loop_state,
    policy_state,
    result_for_torch,
)
from resiliency.launcher.policy import LocalState

HEALTHY = RunResult(state=WorkerState.HEALTHY)
SUCCEEDED = RunResult(state=WorkerState.SUCCEEDED, return_values={0: None})


def _failed(rank: int, local_rank: int, exitcode: int) -> RunResult:
    failure = ProcessFailure(local_rank=local_rank, pid=4242, exitcode=exitcode, error_file="")
    return RunResult(state=WorkerState.FAILED, failures={rank: failure})


def _hang(local_rank: int, rank: int | None, pid: int) -> MonitorEvent:
    return MonitorEvent(kind="hang", local_rank=local_rank, rank=rank, pid=pid, timer="heartbeat")


@pytest.mark.parametrize(
    ("result", "hung", "died", "expected"),
    [
        (HEALTHY, False, False, LoopState.RUNNING),
        (HEALTHY, True, False, LoopState.HUNG),
        (SUCCEEDED, False, False, LoopState.SUCCEEDED),
        # torch saw a worker fail: its failure stands, hang or not (the hung rank may be gone).
        (_failed(1, 1, 3), True, False, LoopState.FAILED),
        # A dead monitor fails the group whatever torch saw, a hang included.
        (HEALTHY, True, True, LoopState.FAILED),
        (SUCCEEDED, False, True, LoopState.FAILED),
    ],
)
def test_the_loop_state_of_one_look(
    result: RunResult, hung: bool, died: bool, expected: LoopState
) -> None:
    assert loop_state(result, hung=hung, monitor_died=died) is expected


def test_a_hang_is_a_failed_node_to_the_policy_and_to_torchs_group() -> None:
    assert LoopState.HUNG.failed and LoopState.FAILED.failed
    assert not LoopState.RUNNING.failed and not LoopState.SUCCEEDED.failed
    assert policy_state(LoopState.HUNG) is LocalState.FAILED
    assert policy_state(LoopState.RUNNING) is LocalState.HEALTHY
    assert policy_state(LoopState.SUCCEEDED) is LocalState.SUCCEEDED
    assert group_state(LoopState.HUNG) == WorkerState.FAILED
    assert group_state(LoopState.RUNNING) == WorkerState.HEALTHY


def test_torch_hears_of_a_hang_only_when_the_loop_ends_in_it() -> None:
    hangs = {1: _hang(1, rank=5, pid=101), 2: _hang(2, rank=None, pid=102)}
    ended = result_for_torch(HEALTHY, LoopState.HUNG, hangs, int(signal.SIGTERM))
    assert ended.state == WorkerState.FAILED
    # By global rank, the local rank where the monitor did not say; the monitor's signal.
    assert sorted(ended.failures) == [2, 5]
    assert ended.failures[5].local_rank == 1 and ended.failures[5].pid == 101
    assert {f.exitcode for f in ended.failures.values()} == {-signal.SIGTERM}


def test_other_endings_reach_torch_as_they_are() -> None:
    assert result_for_torch(SUCCEEDED, LoopState.SUCCEEDED, {}, 15) is SUCCEEDED
    failed = _failed(0, 0, 1)
    assert result_for_torch(failed, LoopState.FAILED, {}, 15) is failed
    # A dead monitor while torch saw the workers run: a failure for torch too.
    dead = result_for_torch(HEALTHY, LoopState.FAILED, {}, 15)
    assert dead.state == WorkerState.FAILED and not dead.failures
