"""The small protocol every engine behind ``CheckpointManager`` implements.

Three engines implement it: the single-root file-system engine (``_engine.file_system``), the
object-store engine (``_remote.engine``) and the tiered composition (``_tiers.engine``), whose
persistent tier is one of the other two. The facade (``manager``) checks its arguments, builds
one engine and forwards every call to it; no engine knows the facade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

if TYPE_CHECKING:
    from resiliency.checkpoint._engine.pipeline import SaveHandle


class Engine(Protocol):
    """Saves and restores; ``save``, ``wait``, ``load`` and ``close`` are collective."""

    root: Any  # the directory (or object-store URL) users see as the checkpoint's root
    rank: int
    world_size: int

    def save(self, step: int, state: dict[str, Any], tier: str | None) -> SaveHandle:
        """Stage ``state`` as ``step`` and hand it to the writer; the commit follows."""

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the saves in flight; raise the agreed failure."""

    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step that verifies on every rank (or ``step``) into ``state``."""

    def steps(self) -> list[int]:
        """Committed steps, ascending (a listing; ``load`` verifies)."""

    @property
    def writer_pid(self) -> int | None:
        """The pid of this rank's (persistent) writer process, if any."""

    def close(self, abort: bool = False) -> None:
        """Wait for the saves in flight, then stop the writers; idempotent.

        ``abort=True``: no collective; the saves in flight are abandoned and the writers killed.
        """


def control_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The gloo group the engines' small CPU collectives run on (None: one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    pg = group or dist.group.WORLD
    assert pg is not None
    if "gloo" in str(dist.get_backend(pg)):
        return pg
    return dist.new_group(dist.get_process_group_ranks(pg), backend="gloo")
