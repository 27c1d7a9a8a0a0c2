"""The end of ``close(abort=True)`` once a save in flight is abandoned, shared by the engines.

The writer is killed (it may be mid-write; nothing it writes is committed any more) and the
save's completion thread gets a bounded wait: it notices the abandonment or its writer's death
at its next poll, but one inside a collective with a dead peer stays there until gloo's timeout.
It is a daemon thread and commits nothing once abandoned, so it is not waited for longer.
"""

from __future__ import annotations

import logging
import threading

from resiliency.checkpoint._writer.client import WriterProcess

logger = logging.getLogger(__name__)

#: How long ``close(abort=True)`` waits for the abandoned save's commit lock and its thread.
ABORT_JOIN_S = 5.0


def stop_abandoned(
    writer: WriterProcess | None, thread: threading.Thread | None, *, rank: int, step: int
) -> None:
    """Kill ``writer`` (by pid, reaped within its deadline), then wait ``ABORT_JOIN_S`` for
    ``thread``, the completion of the abandoned ``step``; log when it is still running."""
    if writer is not None:
        writer.kill()
    if thread is None:
        return
    thread.join(ABORT_JOIN_S)
    if thread.is_alive():
        logger.warning(
            "rank %d: the completion of the abandoned step %d is still running after %.0f s "
            "(it commits nothing now; its memory is freed once it lets go)",
            rank,
            step,
            ABORT_JOIN_S,
        )
