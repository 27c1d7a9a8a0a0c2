"""Multi-node coordination through the round's store: the exit barrier and min-healthy standby.

Every wait here blocks on the store (or on the round watcher) with a deadline; nothing polls.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from torch.distributed.elastic.agent.server.api import RunResult

from resiliency.launcher.agent_settings import Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.shared_state import (
    ACK_WAIT_SECONDS,
    RoundState,
    SharedRoundState,
    StoreWaitTimeoutError,
)
from resiliency.launcher.workload_control import follow_shutdown, stopped_result

if TYPE_CHECKING:
    from resiliency.launcher.agent import FtElasticAgent

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


def stand_by(agent: FtElasticAgent, result: RunResult) -> RunResult | None:
    """Min-healthy: step aside after a failure and wait while the healthy nodes go on.

    Returns:
        The final result when the job ended while this node stood by, or None after this node
        rejoined the group (its workers were started again).
    """
    group = agent.worker_group
    settings = agent._settings
    agent._stop_workers(group)
    shared, watcher = agent._shared, agent._watcher
    if shared is None or watcher is None:
        raise RuntimeError("standby without a rendezvous round")
    shared.publish_standby()
    logger.warning(
        "min-healthy: this node's workers failed (%s); standing by while the other nodes "
        "keep at least %d healthy",
        agent.attempt_causes[-1] if agent.attempt_causes else "unknown",
        settings.min_nodes,
    )
    state = watcher.snapshot()
    while True:
        if state.shutdown is not None:
            return follow_shutdown(agent, state.shutdown)
        if state.done:
            shared.ack_done()
            agent.outcome = Outcome(
                ExitCode.SUCCESS,
                "finished_on_healthy_nodes",
                "this node's workers failed; the job finished on the healthy nodes",
            )
            logger.warning("%s", agent.outcome.detail)
            return stopped_result(group)
        healthy = (group.group_world_size or 1) - state.standby - state.left
        if healthy < settings.min_nodes:
            if agent.remaining_restarts <= 0:
                agent.outcome = Outcome(
                    ExitCode.FAILURE,
                    "restarts_exhausted",
                    f"root cause: {agent.attempt_causes[0]}; no restarts left",
                )
                return result
            agent.remaining_restarts -= 1
            agent.restarts_done += 1
            logger.warning(
                "min-healthy: only %d healthy node(s) left (< %d); rejoining the group",
                healthy,
                settings.min_nodes,
            )
            agent.initialize_workers()
            return None
        state = watcher.wait_for_change(state.version, STANDBY_WAKE_SECONDS)
