"""The loop's signal that this node leaves the job (a failed health check, the supervisor)."""

from __future__ import annotations

from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.health import HealthResult

__all__ = ["LEFT_ON_ITS_OWN", "NodeLeaves", "unhealthy"]

#: The outcomes of a node that left on its own: the rendezvous stays open for the others.
LEFT_ON_ITS_OWN = ("node_excluded", "node_unhealthy", "finished_on_healthy_nodes")


class NodeLeaves(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside the agent's loop when this node must leave the job.

    Attributes:
        outcome: how the job ends on this node.
        health: the failed health checks (``name: detail``) when they are the reason.
        lost: when the rendezvous store's host is gone, the node(s) lost with it (empty when
            this node cannot tell which); None otherwise.
    """

    def __init__(
        self,
        outcome: Outcome,
        health: tuple[str, ...] = (),
        *,
        lost: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome
        self.health = health
        self.lost = lost


def unhealthy(failed: list[HealthResult]) -> NodeLeaves:
    """This node leaves because these health checks failed (exit 4, ``node_unhealthy``)."""
    checks = tuple(f"{r.name}: {r.detail}" for r in failed)
    detail = f"node health check failed: {'; '.join(checks)}"
    return NodeLeaves(Outcome(ExitCode.NODE_EXCLUDED, "node_unhealthy", detail), checks)
