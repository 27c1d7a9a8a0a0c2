"""The loop's signal that this node leaves the job (a failed health check, the supervisor)."""

from __future__ import annotations

from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.health import HealthResult

__all__ = ["NodeLeaves", "unhealthy"]


class NodeLeaves(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside the agent's loop when this node must leave the job.

    Attributes:
        outcome: how the job ends on this node.
        health: the failed health checks (``name: detail``) when they are the reason.
    """

    def __init__(self, outcome: Outcome, health: tuple[str, ...] = ()) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome
        self.health = health


def unhealthy(failed: list[HealthResult]) -> NodeLeaves:
    """This node leaves because these health checks failed (exit 4, ``node_unhealthy``)."""
    checks = tuple(f"{r.name}: {r.detail}" for r in failed)
    detail = f"node health check failed: {'; '.join(checks)}"
    return NodeLeaves(Outcome(ExitCode.NODE_EXCLUDED, "node_unhealthy", detail), checks)
