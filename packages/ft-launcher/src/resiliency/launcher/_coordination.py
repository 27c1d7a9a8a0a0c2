"""Multi-node coordination through the round's store: the exit barrier and min-healthy standby.

Every wait here blocks on the store (or on the round watcher) with a deadline; nothing polls.
"""

from __future__ import annotations

import logging
import time

from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._node_handle import NodeHandle
from resiliency.launcher._round_watch import RoundWatcher
from resiliency.launcher._shared_state import (
    ACK_WAIT_SECONDS,
    RoundState,
    SharedRoundState,
    StoreWaitTimeoutError,
)
from resiliency.launcher._workload_control import follow_shutdown
from resiliency.launcher.exit_codes import ExitCode

__all__ = ["STANDBY_WAKE_SECONDS", "exit_barrier", "failed_elsewhere", "stand_by"]

logger = logging.getLogger(__name__)

#: The longest a node on standby blocks before it checks on itself (signals, its deadline).
STANDBY_WAKE_SECONDS = 30.0


def failed_elsewhere(state: RoundState | None, self_published: bool) -> int:
    """How many other nodes failed or left this round, from the round's shared state."""
    if state is None:
        return 0
    failed = state.failed + state.left
    return max(0, failed - (1 if self_published else 0))


def exit_barrier(shared: SharedRoundState, timeout: float) -> None:
    """Wait until every node of the round finished or stepped aside, then release standbys.

    Args:
        shared: the round's shared state.
        timeout: seconds to wait for the other nodes before giving up (logged).
    """
    start = time.monotonic()
    shared.arrive_at_exit()
    try:
        shared.wait_exit(timeout)
    except StoreWaitTimeoutError as exc:
        logger.error("exit barrier: %s; giving up waiting", exc)
        return
    logger.info(
        "exit barrier: all %d node(s) done after %.2f s", shared.world, time.monotonic() - start
    )
    # Read, not the watcher's copy: a node may have stood by an instant ago.
    standby = shared.standby_count()
    if standby:
        shared.publish_done()
        try:
            shared.wait_done_acks(standby, ACK_WAIT_SECONDS)
        except StoreWaitTimeoutError as exc:
            logger.warning("exit barrier: %s", exc)


def stand_by(
    node: NodeHandle,
    watcher: RoundWatcher,
    *,
    min_nodes: int,
    remaining_restarts: int,
    causes: list[str],
) -> Outcome | None:
    """Min-healthy: step aside after a failure and wait while the healthy nodes go on.

    Args:
        node: this node (its workers are stopped first).
        watcher: follows the round's shared state.
        min_nodes: MIN of ``--nnodes MIN:MAX``.
        remaining_restarts: restarts this node may still spend.
        causes: the root cause of every failed attempt so far, oldest first.

    Returns:
        How the job ended while this node stood by (its workers stopped; a ``FAILURE`` exit
        when it had to rejoin with no restarts left), or None when it must rejoin the group:
        the caller charges one restart and starts its workers again.
    """
    node.stop()
    shared = node.shared
    if shared is None:
        raise RuntimeError("standby without a rendezvous round")
    shared.publish_standby()
    logger.warning(
        "min-healthy: this node's workers failed (%s); standing by while the other nodes "
        "keep at least %d healthy",
        causes[-1] if causes else "unknown",
        min_nodes,
    )
    state = watcher.snapshot()
    while True:
        if state.shutdown is not None:
            return follow_shutdown(node, state.shutdown)
        if state.done:
            shared.ack_done()
            outcome = Outcome(
                ExitCode.SUCCESS,
                "finished_on_healthy_nodes",
                "this node's workers failed; the job finished on the healthy nodes",
            )
            logger.warning("%s", outcome.detail)
            return outcome
        healthy = node.other_nodes + 1 - state.standby - state.left
        if healthy < min_nodes:
            if remaining_restarts <= 0:
                root = causes[0] if causes else "unknown"
                return Outcome(
                    ExitCode.FAILURE, "restarts_exhausted", f"root cause: {root}; no restarts left"
                )
            logger.warning(
                "min-healthy: only %d healthy node(s) left (< %d); rejoining the group",
                healthy,
                min_nodes,
            )
            return None
        state = watcher.wait_for_change(state.version, STANDBY_WAKE_SECONDS)
