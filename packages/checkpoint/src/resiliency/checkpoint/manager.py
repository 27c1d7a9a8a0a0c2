"""``CheckpointManager``: asynchronous, atomic, verified DCP checkpoints, the public facade.

``save``, ``wait``, ``load`` and ``close`` are collective: every rank of the group calls them in
the same order (as with ``dcp.save``). ``latest``, ``steps`` and ``SaveHandle.done`` are local.

The manager checks its arguments and builds one engine (see ``_engine.protocol``): the
single-root file-system engine for a directory, the tiered engine for ``tiers=`` and for an
object-store URL (whose persistent tier is the object-store engine). Every call goes to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint._engine.file_system import FileSystemEngine
from resiliency.checkpoint._engine.pipeline import SaveHandle
from resiliency.checkpoint._engine.protocol import Engine, control_group
from resiliency.checkpoint._tiers.engine import TieredEngine
from resiliency.checkpoint.tiers import PersistentTier, _is_url

__all__ = ["CheckpointManager", "SaveHandle"]

_TIER_CHOICES = ("local", "persistent", "all")


class CheckpointManager:
    """Save and restore training state as standard DCP checkpoints under ``root``.

    Args:
        root: directory holding ``step_<N:09d>/`` checkpoints (shared by all ranks), or an
            object-store URL such as ``s3://bucket/ckpt`` (fsspec; see docs/checkpoint_tiers.md,
            "Object stores").
        keep_last: keep the newest N committed steps (None: keep all).
        keep_every: also keep forever every step divisible by this number.
        async_save: when False, ``save`` returns only once the step is committed.
        process_group: the ranks that save together (default: the whole job).
        writer_timeout_s: bound on one save's writing; a writer silent for longer is killed
            and the save fails on every rank with ``WriterFailedError``.
        eager_writer: start the writer process now, so its imports overlap the job's start-up
            (default); False starts it at the first save. With ``tiers``, the persistent
            tier's writer starts at its first save when a local tier saves first.
        tier: the goodput tier name of this manager's saves.
        tiers: save on several tiers, each on its own cadence, e.g.
            ``[LocalTier("/dev/shm/ckpt", every=10), PersistentTier("/shared/ckpt", every=500)]``
            (``root`` is then None; see :mod:`resiliency.checkpoint.tiers`). ``load`` restores
            the newest step every rank can assemble, nearest tier first.
    """

    def __init__(
        self,
        root: str | Path | None,
        *,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        process_group: dist.ProcessGroup | None = None,
        writer_timeout_s: float = 600.0,
        tier: str = "persistent",
        tiers: Sequence[Any] | None = None,
        eager_writer: bool = True,
    ) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every must be >= 1 or None, got {keep_every}")
        if writer_timeout_s <= 0:
            raise ValueError(f"writer_timeout_s must be > 0, got {writer_timeout_s}")
        if tiers is None and root is None:
            raise ValueError("root is required unless tiers are given")
        self._group = control_group(process_group)
        engine: Engine
        if (
            tiers is None
            and root is not None
            and _is_url(root)
            and PersistentTier(root).is_remote()
        ):
            # An object store is the tiered engine's persistent tier, with no local tier.
            tiers, root = [PersistentTier(root, keep_last=keep_last, keep_every=keep_every)], None
        if tiers is not None:
            engine = TieredEngine(
                root,
                tiers,
                async_save=async_save,
                writer_timeout_s=writer_timeout_s,
                control_group=self._group,
            )
        else:
            assert root is not None
            engine = FileSystemEngine(
                root,
                keep_last=keep_last,
                keep_every=keep_every,
                async_save=async_save,
                control_group=self._group,
                writer_timeout_s=writer_timeout_s,
                tier=tier,
                eager_writer=eager_writer,
            )
        self._engine = engine
        self._tiered = engine if isinstance(engine, TieredEngine) else None
        self.root = engine.root
        self.rank, self.world_size = engine.rank, engine.world_size
        self.async_save, self.writer_timeout_s = async_save, float(writer_timeout_s)

    def __getattr__(self, name: str) -> Any:
        # Only for what the facade does not hold itself: the engine's settings (keep_last,
        # tier...) and internals (its writer, arena, plan cache) that tests and tools inspect.
        if name == "_engine":  # not set yet: __init__ failed
            raise AttributeError(name)
        return getattr(self._engine, name)

    # ------------------------------------------------------------------ queries (local)
    def steps(self) -> list[int]:
        """Committed steps (on any tier), ascending (a listing; ``load`` verifies)."""
        return list(self._engine.steps())

    def latest(self) -> int | None:
        """The newest committed step, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    @property
    def writer_pid(self) -> int | None:
        """The pid of this rank's (persistent tier's) writer process (None after ``close``)."""
        return self._engine.writer_pid

    @property
    def tiered(self) -> bool:
        """Whether this manager saves on tiers (then ``save(..., tier=...)`` is available)."""
        return self._tiered is not None

    # ------------------------------------------------------------------ collective calls
    def save(self, step: int, state: dict[str, Any], *, tier: str | None = None) -> SaveHandle:
        """Save ``state`` as ``step``; returns once the state is staged (collective).

        Blocks training only for DCP's planning and the copy into the staging arena. A previous
        save still in flight is waited for first; its failure is logged on every rank (and
        raised by its own handle's ``wait``), never raised here. Saving a step that is already
        committed is a no-op (logged): a step is never overwritten. With tiers, ``step`` goes
        to every tier it is due on, or to ``tier`` ("local", "persistent" or "all") whatever
        the cadence (an emergency save at any step: ``tier="all"``).
        """
        if tier is not None and self._tiered is None:
            raise ValueError("tier= needs a CheckpointManager built with tiers")
        if tier is not None and tier not in _TIER_CHOICES:
            raise ValueError(f"tier must be 'local', 'persistent', 'all' or None, got {tier!r}")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self._engine.save(step, state, tier)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the saves in flight, if any (collective); raises like ``SaveHandle.wait``."""
        self._engine.wait(timeout)

    def load(self, state: dict[str, Any], step: int | None = None) -> int | None:
        """Load the newest step that verifies on every rank (or ``step``) into ``state``.

        A step with a missing manifest, a wrong size or a wrong checksum is skipped with a
        warning that names the rank and the file; all ranks load the same step (collective).

        Returns:
            The step loaded, or None when the root holds no checkpoint.

        Raises:
            NoCheckpointError: ``step`` was given and is not committed.
            CheckpointCorruptError: ``step`` (or, with ``step=None``, every committed step)
                failed verification.
        """
        return self._engine.load(state, step)

    def close(self, abort: bool = False) -> None:
        """Wait for the saves in flight (collective), then stop the writers; idempotent.

        Args:
            abort: for a job being torn down after a fault (an in-process restart, a peer
                dead, the process groups aborted): no collective at all. The saves in flight
                are abandoned (never committed; the previous committed step stays the newest;
                their temporary files go at the next manager's start), the writers are killed
                by pid and the staging memory is released. Returns within seconds whatever
                the other ranks do; a later ``close()`` is a no-op.
        """
        self._engine.close(abort)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
