"""Workload control across nodes: ShutdownWorkload and ExcludeThisNode.

Each function acts through a :class:`~resiliency.launcher._node_handle.NodeHandle` (stop the
workers, publish to the round) and returns the :class:`Outcome` the agent records.
"""

from __future__ import annotations

import logging
from typing import Any

from resiliency.ft import MonitorEvent
from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._node_handle import NodeHandle
from resiliency.launcher._shared_state import ACK_WAIT_SECONDS, StoreWaitTimeoutError
from resiliency.launcher.exit_codes import ExitCode

__all__ = ["exclude_this_node", "follow_shutdown", "shutdown_workload", "stop_the_job"]

logger = logging.getLogger(__name__)


def shutdown_workload(node: NodeHandle, event: MonitorEvent) -> Outcome:
    """A rank asked for ShutdownWorkload: stop every node, close the rendezvous, no restarts."""
    reason = event.desc or "(no reason given)"
    detail = f"rank {event.rank} requested ShutdownWorkload: {reason}"
    logger.error("%s; stopping the job on every node, no restarts", detail)
    stop_the_job(node, event.rank, event.desc or "")
    return Outcome(ExitCode.SHUTDOWN_WORKLOAD, "shutdown_workload", detail)


def stop_the_job(node: NodeHandle, rank: int | None, desc: str) -> None:
    """Stop the workers on every node for good: the other nodes follow, the rendezvous closes.

    Args:
        node: this node.
        rank: the rank that asked (or failed), for the other nodes' logs.
        desc: why, for the other nodes' logs.
    """
    if node.shared is not None:
        node.shared.publish_shutdown(rank, desc)
    node.stop()
    try:
        node.group.spec.rdzv_handler.set_closed()
    except RuntimeError as exc:
        logger.warning("could not close the rendezvous: %s", exc)
    if node.shared is not None and node.other_nodes > 0:
        try:
            node.shared.wait_shutdown_acks(node.other_nodes, ACK_WAIT_SECONDS)
        except StoreWaitTimeoutError as exc:
            logger.warning("not every node acknowledged the shutdown: %s", exc)


def follow_shutdown(node: NodeHandle, request: dict[str, Any]) -> Outcome:
    """Another node's rank asked for ShutdownWorkload: stop this node's workers, acknowledge."""
    detail = (
        f"rank {request.get('rank')} on another node requested ShutdownWorkload: "
        f"{request.get('desc') or '(no reason given)'}"
    )
    logger.error("%s; stopping this node's workers, no restarts", detail)
    node.stop()
    if node.shared is not None:
        node.shared.ack_shutdown()
    return Outcome(ExitCode.SHUTDOWN_WORKLOAD, "shutdown_workload", detail)


def exclude_this_node(node: NodeHandle, event: MonitorEvent) -> Outcome:
    """A rank asked for ExcludeThisNode: this node leaves, the others go on without it."""
    detail = f"rank {event.rank} requested ExcludeThisNode: {event.desc or '(no reason given)'}"
    logger.error("%s; this node leaves the job, the others go on without it", detail)
    if node.shared is not None:
        node.shared.publish_left()
    node.stop()
    return Outcome(ExitCode.NODE_EXCLUDED, "node_excluded", detail)
