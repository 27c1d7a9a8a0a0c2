"""Restart policies: small, pure objects that map an observed group state to a decision.

The agent observes its local worker group and what the other nodes published in the rendezvous
store, packs that into a :class:`GroupObservation`, and asks the policy what to do. Keeping the
decision pure makes every branch unit-testable without processes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "AnyFailedPolicy",
    "Decision",
    "GroupObservation",
    "LocalState",
    "MinHealthyPolicy",
    "RestartPolicy",
    "policy_from_name",
]


class LocalState(str, enum.Enum):
    """The state of this node's worker group, as the agent last saw it."""

    HEALTHY = "healthy"
    FAILED = "failed"  # a worker exited non-zero, was killed as hung, or lost its monitor
    SUCCEEDED = "succeeded"


class Decision(str, enum.Enum):
    """What the agent does next."""

    CONTINUE = "continue"  # keep the workers running
    RESTART = "restart"  # stop, re-rendezvous, start again; counts against --max-restarts
    REFORM = "reform"  # membership changed: re-rendezvous without counting a restart
    STANDBY = "standby"  # stop local workers and wait outside the group (min-healthy)
    GIVE_UP = "give_up"  # stop everything and fail the job on this node
    FINISH = "finish"  # local workers succeeded: wait for the others at the exit barrier


@dataclass(frozen=True)
class GroupObservation:
    """One snapshot of the group, taken once per monitoring interval.

    Attributes:
        local: this node's worker-group state.
        nodes_in_group: nodes that joined the current rendezvous round (including this one).
        failed_nodes: OTHER nodes of the current round that reported a failure or left.
        nodes_waiting: nodes waiting in the rendezvous to join a new round.
        min_nodes: the MIN of ``--nnodes MIN:MAX``.
        remaining_restarts: restarts this node may still spend.
    """

    local: LocalState
    nodes_in_group: int
    failed_nodes: int
    nodes_waiting: int
    min_nodes: int
    remaining_restarts: int

    @property
    def healthy_nodes(self) -> int:
        """Nodes of the current round still healthy, counting this node's own state."""
        own_failure = 1 if self.local is LocalState.FAILED else 0
        return max(0, self.nodes_in_group - self.failed_nodes - own_failure)


class RestartPolicy(Protocol):
    """Decides the agent's next step from a :class:`GroupObservation`."""

    name: str

    def decide(self, obs: GroupObservation) -> Decision:
        """Return the next step for ``obs``."""
        ...


def _restart_or_give_up(obs: GroupObservation) -> Decision:
    return Decision.RESTART if obs.remaining_restarts > 0 else Decision.GIVE_UP


class AnyFailedPolicy:
    """Any failed or hung worker restarts the whole group (on every node); torchrun's behaviour.

    New nodes waiting in the rendezvous make the group re-form without counting a restart.
    """

    name = "any-failed"

    def decide(self, obs: GroupObservation) -> Decision:
        """See :class:`RestartPolicy`."""
        if obs.local is LocalState.SUCCEEDED:
            return Decision.FINISH
        if obs.local is LocalState.FAILED:
            return _restart_or_give_up(obs)
        if obs.failed_nodes > 0 or obs.nodes_waiting > 0:
            # Another node failed or a new node arrived: everyone re-forms together.
            return Decision.REFORM
        return Decision.CONTINUE


class MinHealthyPolicy:
    """Keep going while at least ``min_nodes`` nodes of the round are healthy.

    A node whose workers fail leaves the running group (STANDBY) as long as enough healthy nodes
    remain; once fewer than ``min_nodes`` are healthy every node restarts and the group re-forms.
    Nodes waiting in the rendezvous do not interrupt a healthy group.
    """

    name = "min-healthy"

    def decide(self, obs: GroupObservation) -> Decision:
        """See :class:`RestartPolicy`."""
        if obs.local is LocalState.SUCCEEDED:
            return Decision.FINISH
        healthy_after = obs.healthy_nodes
        if obs.local is LocalState.FAILED:
            if healthy_after >= obs.min_nodes:
                return Decision.STANDBY
            return _restart_or_give_up(obs)
        if healthy_after < obs.min_nodes:
            # This node is healthy; the group as a whole is not: re-form without charging it.
            return Decision.REFORM
        return Decision.CONTINUE


_POLICIES: dict[str, type[AnyFailedPolicy] | type[MinHealthyPolicy]] = {
    AnyFailedPolicy.name: AnyFailedPolicy,
    MinHealthyPolicy.name: MinHealthyPolicy,
}


def policy_from_name(name: str) -> RestartPolicy:
    """Return a new policy object for its command-line name.

    Args:
        name: ``"any-failed"`` or ``"min-healthy"`` (underscores are accepted too).

    Returns:
        The policy.

    Raises:
        ValueError: ``name`` is not a known policy.
    """
    key = name.strip().lower().replace("_", "-")
    if key not in _POLICIES:
        raise ValueError(f"unknown restart policy {name!r}; choose one of {sorted(_POLICIES)}")
    return _POLICIES[key]()
