"""The end of an emergency stop: settle the saves still in flight by the deadline, close.

Once the agreed save of the stop step is committed (or has failed), a save can still be in
flight on the manager: an earlier periodic save of the persistent tier, when only the local tier
fitted the budget, or the stop step's own save, when waiting for it ran out of time. A
persistent save that commits is worth having (the local tier dies with the node), so it is
waited for, but only until the stop's deadline less the margin kept for exiting: a save still
in flight then is abandoned. Its writer dies with this process (by its parent-death signal),
its temporary directory is removed at the next start, and its tier keeps its previous step.

Closing the manager then waits for nothing more than its writers' exit: milliseconds, since
``WriterProcess.close`` kills a writer still starting instead of waiting for its imports (every
file of a committed save was fsynced by its writer before the commit).
"""

from __future__ import annotations

import logging
from typing import Any

from resiliency.checkpoint.manager import CheckpointManager

logger = logging.getLogger(__name__)


def close_manager(manager: Any, rank: int, step: int, timeout: float | None) -> None:
    """Wait up to ``timeout`` for the saves in flight on ``manager``, then close it.

    Never raises: what fails is logged (naming the rank and the stop step), since the rank
    exits whatever happens here.

    Args:
        manager: what the emergency stop saved through: a ``CheckpointManager``, or another
            object, which is only closed (when it has ``close``).
        rank: this rank, for the logs.
        step: the stop step, for the logs.
        timeout: seconds left for the saves in flight (None: the manager's own bound, when no
            SIGKILL deadline is known).
    """
    if isinstance(manager, CheckpointManager):
        try:
            manager.wait(timeout)
        except TimeoutError as exc:
            logger.warning(
                "rank %d, emergency stop at step %d: %s at the deadline (%.1f s); abandoned: its "
                "writer ends with this process and its tier keeps its previous step",
                rank,
                step,
                exc,
                timeout,
            )
            return  # close() would wait for it again, without the deadline
        except Exception as exc:  # a failed save (logged by the manager) or a peer gone
            logger.warning(
                "rank %d, emergency stop at step %d: an earlier save in flight failed: %s",
                rank,
                step,
                exc,
            )
    close = getattr(manager, "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:
            logger.warning(
                "rank %d, emergency stop at step %d: closing the checkpoint manager failed: %s",
                rank,
                step,
                exc,
            )
