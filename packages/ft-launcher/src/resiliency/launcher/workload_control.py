"""Workload control across nodes: ShutdownWorkload and ExcludeThisNode, acted on by the agent."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState

from resiliency.launcher.agent_settings import Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.shared_state import ACK_WAIT_SECONDS, StoreWaitTimeoutError

if TYPE_CHECKING:
    from resiliency.launcher.agent import FtElasticAgent

__all__ = [
    "exclude_this_node",
    "follow_shutdown",
    "shutdown_workload",
    "stop_the_job",
    "stopped_result",
]

logger = logging.getLogger(__name__)


def stopped_result(group: WorkerGroup) -> RunResult:
    """The result for workers the agent stopped on purpose: not a failure for torch's
    ``launch_agent`` (which raises ``ChildFailedError`` for failed workers only), and torch
    records each worker as STOPPED; the agent's
    :attr:`~resiliency.launcher.agent.FtElasticAgent.outcome` says how the job ended."""
    return RunResult(
        state=WorkerState.STOPPED, return_values={w.global_rank: None for w in group.workers}
    )


def shutdown_workload(agent: FtElasticAgent) -> RunResult:
    """A rank asked for ShutdownWorkload: stop every node, close the rendezvous, no restarts."""
    event = agent._cycle.shutdown
    assert event is not None
    reason = event.desc or "(no reason given)"
    detail = f"rank {event.rank} requested ShutdownWorkload: {reason}"
    logger.error("%s; stopping the job on every node, no restarts", detail)
    stop_the_job(agent, event.rank, event.desc or "")
    agent.outcome = Outcome(ExitCode.SHUTDOWN_WORKLOAD, "shutdown_workload", detail)
    return stopped_result(agent.worker_group)


def stop_the_job(agent: FtElasticAgent, rank: int | None, desc: str) -> None:
    """Stop the workers on every node for good: the other nodes follow, the rendezvous closes.

    Args:
        agent: this node's agent.
        rank: the rank that asked (or failed), for the other nodes' logs.
        desc: why, for the other nodes' logs.
    """
    group = agent.worker_group
    if agent._shared is not None:
        agent._shared.publish_shutdown(rank, desc)
    agent._stop_workers(group)
    spec = group.spec
    try:
        spec.rdzv_handler.set_closed()
    except RuntimeError as exc:
        logger.warning("could not close the rendezvous: %s", exc)
    others = (group.group_world_size or 1) - 1
    if agent._shared is not None and others > 0:
        try:
            agent._shared.wait_shutdown_acks(others, ACK_WAIT_SECONDS)
        except StoreWaitTimeoutError as exc:
            logger.warning("not every node acknowledged the shutdown: %s", exc)


def follow_shutdown(agent: FtElasticAgent, request: dict[str, Any]) -> RunResult:
    """Another node's rank asked for ShutdownWorkload: stop this node's workers, acknowledge."""
    detail = (
        f"rank {request.get('rank')} on another node requested ShutdownWorkload: "
        f"{request.get('desc') or '(no reason given)'}"
    )
    logger.error("%s; stopping this node's workers, no restarts", detail)
    agent._stop_workers(agent.worker_group)
    if agent._shared is not None:
        agent._shared.ack_shutdown()
    agent.outcome = Outcome(ExitCode.SHUTDOWN_WORKLOAD, "shutdown_workload", detail)
    return stopped_result(agent.worker_group)


def exclude_this_node(agent: FtElasticAgent) -> RunResult:
    """A rank asked for ExcludeThisNode: this node leaves, the others go on without it."""
    event = agent._cycle.exclude
    assert event is not None
    detail = f"rank {event.rank} requested ExcludeThisNode: {event.desc or '(no reason given)'}"
    logger.error("%s; this node leaves the job, the others go on without it", detail)
    if agent._shared is not None:
        agent._shared.publish_left()
    agent._stop_workers(agent.worker_group)
    agent.outcome = Outcome(ExitCode.NODE_EXCLUDED, "node_excluded", detail)
    return stopped_result(agent.worker_group)
