"""Multi-node coordination through the round's store: the exit barrier and bounded waits."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ACK_WAIT_SECONDS", "exit_barrier", "failed_elsewhere", "wait_until"]

logger = logging.getLogger(__name__)

#: How long a node waits for the others to acknowledge a shutdown or a release.
ACK_WAIT_SECONDS = 5.0


def wait_until(condition: Callable[[], Any], timeout: float) -> bool:
    """Poll ``condition`` every 50 ms for up to ``timeout`` seconds; return whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def failed_elsewhere(shared: Any, self_published: bool) -> int:
    """How many other nodes failed or left this round, from the round's shared state."""
    if shared is None:
        return 0
    failed = int(shared.failed) + int(shared.left)
    return max(0, failed - (1 if self_published else 0))


def exit_barrier(shared: Any, world: int, timeout: float) -> None:
    """Wait until every node of the round finished or stepped aside, then release standbys.

    Args:
        shared: the round's ``SharedRoundState``.
        world: nodes in the round.
        timeout: seconds to wait for the other nodes before giving up (logged).
    """
    shared.arrive_at_exit()
    start = time.monotonic()
    deadline = start + timeout
    while True:
        state = shared.snapshot()
        if shared.arrived() + state.standby + state.left >= world:
            break
        if time.monotonic() > deadline:
            logger.error(
                "exit barrier: waited %.0f s for the other nodes to finish; giving up waiting",
                timeout,
            )
            return
        time.sleep(0.05)
    logger.info("exit barrier: all %d node(s) done after %.2f s", world, time.monotonic() - start)
    state = shared.snapshot()
    if state.standby:
        shared.publish_done()
        wait_until(lambda: shared.done_acks() >= state.standby, ACK_WAIT_SECONDS)
