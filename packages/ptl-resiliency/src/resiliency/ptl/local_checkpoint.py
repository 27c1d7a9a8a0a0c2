"""LocalCheckpointCallback: multi-tier checkpoints (node-local + replica, persistent) in Lightning.

The names follow Google's resiliency tool (``--local-ckpt-dir``, ``--local-ckpt-interval``,
``--persistent-ckpt-dir``, ``--persistent-ckpt-interval``)::

    trainer = Trainer(
        callbacks=[
            LocalCheckpointCallback(
                local_ckpt_dir="/dev/shm/ckpt",
                local_ckpt_interval=10,
                persistent_ckpt_dir="/shared/ckpt",
                persistent_ckpt_interval=200,
            )
        ]
    )

Every rank saves through one tiered :class:`resiliency.checkpoint.CheckpointManager`: every
``local_ckpt_interval`` steps to the node-local directory with a copy on another node, every
``persistent_ckpt_interval`` steps to the shared directory. At fit start the job resumes from
the newest step every rank can assemble (own local copy, a peer's replica, the persistent tier).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from resiliency.checkpoint import CheckpointManager, LocalTier, PersistentTier
from resiliency.goodput import get_recorder
from resiliency.ptl.checkpointing import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
)

__all__ = ["LocalCheckpointCallback"]

logger = logging.getLogger(__name__)


class LocalCheckpointCallback(DistributedCheckpointCallback):
    """``DistributedCheckpointCallback`` over a local tier and an optional persistent tier.

    Args:
        local_ckpt_dir: node-local directory (same path on every node: RAM disk, NVMe).
        local_ckpt_interval: save on the local tier every N optimizer steps.
        persistent_ckpt_dir: shared directory (or ``file://`` URL); None: local tier only.
        persistent_ckpt_interval: save on the persistent tier every N optimizer steps.
        replicas: copies of each rank's local shard kept on other nodes.
        local_keep_last: committed steps kept on the local tier.
        keep_last, keep_every: retention on the persistent tier.
        node: this rank's failure domain (default: ``GROUP_RANK``, else the host name).
        replication_timeout_s: bound on each replication wait.
        async_save, resume, save_on_train_end, writer_timeout_s: as in the base callback.
    """

    def __init__(
        self,
        local_ckpt_dir: str | Path,
        *,
        local_ckpt_interval: int = 10,
        persistent_ckpt_dir: str | Path | None = None,
        persistent_ckpt_interval: int = 100,
        replicas: int = 1,
        local_keep_last: int = 2,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        node: str | int | None = None,
        replication_timeout_s: float = 300.0,
        async_save: bool = True,
        resume: bool = True,
        save_on_train_end: bool = True,
        writer_timeout_s: float = 600.0,
    ) -> None:
        if local_ckpt_interval < 1 or persistent_ckpt_interval < 1:
            raise CheckpointCallbackConfigError(
                f"intervals must be >= 1, got local {local_ckpt_interval}, "
                f"persistent {persistent_ckpt_interval}"
            )
        super().__init__(
            persistent_ckpt_dir if persistent_ckpt_dir is not None else local_ckpt_dir,
            every_n_train_steps=local_ckpt_interval,
            keep_last=keep_last,
            keep_every=keep_every,
            async_save=async_save,
            resume=resume,
            save_on_train_end=save_on_train_end,
            writer_timeout_s=writer_timeout_s,
        )
        self.tiers: list[Any] = [
            LocalTier(
                local_ckpt_dir,
                every=local_ckpt_interval,
                replicas=replicas,
                keep_last=local_keep_last,
                node=node,
                timeout_s=replication_timeout_s,
            )
        ]
        if persistent_ckpt_dir is not None:
            self.tiers.append(
                PersistentTier(
                    persistent_ckpt_dir,
                    every=persistent_ckpt_interval,
                    keep_last=keep_last,
                    keep_every=keep_every,
                )
            )

    def _due(self, step: int) -> bool:
        return any(step % tier.every == 0 for tier in self.tiers)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Create the tiered manager on every rank (the process group exists by now)."""
        if stage == "fit" and self._manager is None:
            self._manager = CheckpointManager(
                None,
                tiers=self.tiers,
                async_save=self._manager_kwargs["async_save"],
                writer_timeout_s=self._manager_kwargs["writer_timeout_s"],
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the step; save when a tier is due on it."""
        step = int(trainer.global_step)
        get_recorder().step(step)
        self._note_finished()
        if step > 0 and step != self._last_saved and self._due(step):
            self._save(trainer, step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Save the last step on every tier (if asked and new), then wait (collective)."""
        step = int(trainer.global_step)
        if self.save_on_train_end and step > 0 and step != self._last_saved:
            self._begin_save(trainer, step)
            for tier in self.tiers:
                self.manager.save(step, self.state, tier=tier.name)
        self.manager.wait()
        self._note_finished()
