"""The state of the agent's loop after one look at the workers, and what it means elsewhere.

torch's ``RunResult`` knows healthy, succeeded and failed workers; the loop adds a state of its
own, HUNG: a monitor reported its rank hung and is ending it while torch still sees every worker
run. The restart policy counts a hang as a failed node; torch hears of it only when the loop
ends in it, as the failure of the hung ranks.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from resiliency.ft import MonitorEvent
from resiliency.launcher.policy import LocalState

__all__ = ["LoopState", "group_state", "loop_state", "policy_state", "result_for_torch"]


class LoopState(enum.Enum):
    """Where the agent's loop stands with the current workers."""

    RUNNING = "running"  # every worker runs, no monitor reported a hang
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a worker exited non-zero or was killed, or a rank monitor died
    HUNG = "hung"  # a monitor reported its rank hung and is ending it; torch sees it run

    @property
    def failed(self) -> bool:
        """True for the states the restart policy counts as a failed node."""
        return self in (LoopState.FAILED, LoopState.HUNG)


_FROM_TORCH = {WorkerState.HEALTHY: LoopState.RUNNING, WorkerState.SUCCEEDED: LoopState.SUCCEEDED}
_TO_POLICY = {LoopState.RUNNING: LocalState.HEALTHY, LoopState.SUCCEEDED: LocalState.SUCCEEDED}
_TO_GROUP = {LoopState.RUNNING: WorkerState.HEALTHY, LoopState.SUCCEEDED: WorkerState.SUCCEEDED}


def loop_state(result: RunResult, *, hung: bool, monitor_died: bool) -> LoopState:
    """The loop's state from torch's look at the workers and the monitors' reports.

    Args:
        result: torch's result of its look at the workers.
        hung: a monitor reported a hang in this attempt.
        monitor_died: a rank monitor died (its worker is no longer watched).
    """
    state = _FROM_TORCH.get(result.state, LoopState.FAILED)
    if monitor_died:
        return LoopState.FAILED
    if hung and state is LoopState.RUNNING:
        return LoopState.HUNG
    return state


def policy_state(state: LoopState) -> LocalState:
    """What the restart policy is told: a hang is a failed node to it."""
    return _TO_POLICY.get(state, LocalState.FAILED)


def group_state(state: LoopState) -> WorkerState:
    """What torch's worker group records (torch has no hung state: failed)."""
    return _TO_GROUP.get(state, WorkerState.FAILED)


def result_for_torch(
    result: RunResult,
    state: LoopState,
    hangs: Mapping[int, MonitorEvent],
    termination_signal: int,
) -> RunResult:
    """The result torch's ``launch_agent`` gets when the loop ends in ``state``.

    torch raises ``ChildFailedError`` for a FAILED result and prints its failures, so a loop that
    ends in HUNG reports each hung rank as ended by its monitor's termination signal, and one
    that failed on a dead monitor reports a failure even though torch saw the workers run.

    Args:
        result: torch's last result.
        state: the loop's state when it ended.
        hangs: the attempt's hang reports, by local rank.
        termination_signal: the monitors' ``rank_termination_signal``.
    """
    if state is LoopState.HUNG:
        failures = {
            ev.rank if ev.rank is not None else lr: ProcessFailure(
                local_rank=lr, pid=ev.pid or 0, exitcode=-termination_signal, error_file=""
            )
            for lr, ev in hangs.items()
        }
        return RunResult(state=WorkerState.FAILED, failures=failures)
    if state is LoopState.FAILED and result.state != WorkerState.FAILED:
        return RunResult(state=WorkerState.FAILED, failures=result.failures)
    return result
