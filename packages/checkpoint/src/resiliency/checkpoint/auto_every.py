"""``every="auto"``: every rank saves at the interval rank 0 reads from the job's goodput ledger.

Ranks must save at the same steps (a save is collective), and the ledger grows while they read
it; so rank 0 alone reads it (`resiliency.goodput.AutoInterval`) and the others take its answer
through one small collective on the manager's control group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from resiliency.checkpoint._collectives import agree as _agree
from resiliency.checkpoint.manager import CheckpointManager
from resiliency.goodput import AutoInterval

_NOT_RANK_0 = 1 << 62  # larger than any interval: the minimum over ranks is rank 0's


def advised_every(
    manager: CheckpointManager,
    interval: AutoInterval,
    paths: Sequence[str | os.PathLike[str]] | None = None,
) -> int:
    """The save interval in steps, the same on every rank of ``manager`` (collective).

    Args:
        manager: its control group carries rank 0's answer to the others.
        interval: the bounds and the default.
        paths: the ledger (default: this job's files in ``RESILIENCY_GOODPUT_DIR``).
    """
    value = interval.steps(paths)[0] if manager.rank == 0 else _NOT_RANK_0
    # The manager's own control group (gloo): the one its saves agree on.
    lowest, _ = _agree.min_max([value], manager._group)
    return lowest[0]
