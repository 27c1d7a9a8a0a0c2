"""The one private torch detail the wrapper relies on, checked before use.

torch names each new process group after a process-wide counter (``_world.group_count``; the
default group is "0"). ``destroy_process_group()`` resets it, but an ``init_process_group``
interrupted by a fault has already counted its group without registering it, and no destroy
follows. The ranks of the next iteration would then name their groups differently (rank 0 "1",
a rank that never reached ``init_process_group`` "0"), wait for each other under different
store keys and hang. Checked with torch 2.13.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def reset_group_names() -> None:
    """Restart torch's group naming at "0", when no process group exists."""
    if dist.is_initialized():
        return
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is None or not hasattr(type(world), "group_count"):
        log.warning(
            "torch %s has no distributed_c10d._world.group_count: cannot reset process-group "
            "names; an init_process_group interrupted by a fault may make the next one hang",
            torch.__version__,
        )
        return
    world.group_count = 0
