"""What a helper of the supervision loop may act on: this node's worker group, the round's
shared state and a way to stop the workers.

The agent builds one per decision and hands it to the helpers (workload control, min-healthy
standby, the failure diagnosis); they act through it and return an outcome for the agent to
apply. None of them sees the agent itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState

from resiliency.launcher._shared_state import SharedRoundState

__all__ = ["NodeHandle", "stopped_result"]


@dataclass(frozen=True)
class NodeHandle:
    """This node, as the helpers of the supervision loop see it.

    Attributes:
        group: the agent's worker group (its ranks, spec and rendezvous handler).
        shared: the current round's shared state (None before the first rendezvous).
        stop: stops this node's workers as the launcher's own stop (no emergency save), and
            returns once they are gone: the agent's ``request_shutdown``.
    """

    group: WorkerGroup
    shared: SharedRoundState | None
    stop: Callable[[], None]

    @property
    def other_nodes(self) -> int:
        """How many other nodes the round has."""
        return (self.group.group_world_size or 1) - 1


def stopped_result(group: WorkerGroup) -> RunResult:
    """The result for workers the agent stopped on purpose: not a failure for torch's
    ``launch_agent`` (which raises ``ChildFailedError`` for failed workers only), and torch
    records each worker as STOPPED; the agent's ``outcome`` says how the job ended."""
    return RunResult(
        state=WorkerState.STOPPED, return_values={w.global_rank: None for w in group.workers}
    )
