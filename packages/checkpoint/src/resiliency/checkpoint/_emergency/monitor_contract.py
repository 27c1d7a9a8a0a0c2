"""What a rank and its rank monitor (resiliency.ft) agree on, through the environment and a file.

Neither side imports the other. ft-launcher gives each worker its monitor's socket in
``FT_RANK_MONITOR_IPC_SOCKET``; next to that socket the monitor keeps a one-byte termination mark
per local rank, ``rank-<LOCAL_RANK>-terminating``: 1 from just before it sends the rank the
termination signal for a hang until the rank is gone. A SIGTERM that finds the mark at 1 is the
monitor's, not a preemption. tests/integration/test_contracts.py holds both copies.
"""

from __future__ import annotations

import mmap
import os

from resiliency.checkpoint._emergency.mapped_byte import map_byte

MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
TERMINATION_MARK_NAME = "rank-{local_rank}-terminating"


def map_termination_mark() -> mmap.mmap | None:
    """Map this rank's monitor termination mark read-only, if it runs under a rank monitor."""
    socket_path = os.environ.get(MONITOR_SOCKET_ENV)
    local_rank = os.environ.get("LOCAL_RANK")
    if not socket_path or local_rank is None:
        return None
    name = TERMINATION_MARK_NAME.format(local_rank=local_rank)
    path = os.path.join(os.path.dirname(socket_path), name)
    return map_byte(path, "rank monitor termination mark")
