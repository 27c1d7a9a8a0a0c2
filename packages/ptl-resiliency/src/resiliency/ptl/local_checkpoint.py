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

Either interval may be ``"auto"`` (or an `resiliency.goodput.AutoInterval` with the user's
bounds): at every start the interval that ``resiliency-goodput advise`` gives that tier from the
job's own ledger (Daly's formula over the measured MTBF, the tier's blocking save cost and the
restart and restore costs), the same on every rank.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from resiliency.checkpoint import CheckpointManager, LocalTier, PersistentTier, advised_every
from resiliency.goodput import AutoInterval, get_recorder
from resiliency.ptl.checkpointing import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
)

__all__ = ["LocalCheckpointCallback"]

logger = logging.getLogger(__name__)

# What "auto" means per tier: local saves are cheap and restarts restore from them first, so
# they may come as often as every step; persistent saves keep the base callback's bounds.
_AUTO_DEFAULTS = {
    "local": AutoInterval(min_steps=1, max_steps=10_000, default_steps=10, tier="local"),
    "persistent": AutoInterval(tier="persistent"),
}


def _interval(tier: str, value: int | str | AutoInterval) -> tuple[int, AutoInterval | None]:
    """The starting interval of ``tier`` and its bounds when it is advised from the ledger."""
    if value == "auto":
        value = _AUTO_DEFAULTS[tier]
    if isinstance(value, AutoInterval):
        # The parameter names the tier whose advice counts, whatever the bounds object says.
        bounds = dataclasses.replace(value, tier=tier)
        return bounds.default_steps, bounds
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointCallbackConfigError(
            f"{tier}_ckpt_interval must be an int >= 1, 'auto' or an AutoInterval, got {value!r}"
        )
    return value, None


class LocalCheckpointCallback(DistributedCheckpointCallback):
    """``DistributedCheckpointCallback`` over a local tier and an optional persistent tier.

    Args:
        local_ckpt_dir: node-local directory (same path on every node: RAM disk, NVMe).
        local_ckpt_interval: save on the local tier every N optimizer steps; or ``"auto"``
            (opt-in): the local tier's advised interval from the job's ledger
            (``RESILIENCY_GOODPUT_DIR``), re-evaluated at every start, 1 to 10,000 steps and
            10 until the ledger can advise; or an `AutoInterval` with other bounds.
        persistent_ckpt_dir: shared directory (or ``file://`` URL); None: local tier only.
        persistent_ckpt_interval: save on the persistent tier every N optimizer steps; or
            ``"auto"`` (10 to 10,000 steps, 100 until the ledger can advise) or an
            `AutoInterval`, as for the local tier.
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
        local_ckpt_interval: int | str | AutoInterval = 10,
        persistent_ckpt_dir: str | Path | None = None,
        persistent_ckpt_interval: int | str | AutoInterval = 100,
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
        local_every, local_auto = _interval("local", local_ckpt_interval)
        persistent_every, persistent_auto = _interval("persistent", persistent_ckpt_interval)
        super().__init__(
            persistent_ckpt_dir if persistent_ckpt_dir is not None else local_ckpt_dir,
            every_n_train_steps=local_every,
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
                every=local_every,
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
                    every=persistent_every,
                    keep_last=keep_last,
                    keep_every=keep_every,
                )
            )

        # The interval each tier saves at now: the callback names the tier of every save, so
        # an advised interval takes effect without rebuilding the tiers or the manager.
        self.intervals: dict[str, int] = {tier.name: tier.every for tier in self.tiers}
        self._last_tiers: set[str] = set()  # the tiers that hold step self._last_saved
        self._autos = {
            name: bounds
            for name, bounds in (("local", local_auto), ("persistent", persistent_auto))
            if bounds is not None and name in self.intervals
        }

    def _due(self, step: int) -> str | None:
        """The tier argument of the save due at ``step`` ("local", "persistent", "all"), if any."""
        due = [name for name, every in self.intervals.items() if step % every == 0]
        if not due:
            return None
        return due[0] if len(due) == 1 else "all"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Create the tiered manager on every rank (the process group exists by now)."""
        if stage == "fit" and self._manager is None:
            self._manager = CheckpointManager(
                None,
                tiers=self.tiers,
                async_save=self._manager_kwargs["async_save"],
                writer_timeout_s=self._manager_kwargs["writer_timeout_s"],
            )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Take the advised intervals (collective, rank 0 reads the ledger), then resume."""
        for name, bounds in self._autos.items():  # the same order on every rank
            self.intervals[name] = advised_every(self.manager, bounds)
            logger.info("%s tier: saving every %d steps ('auto')", name, self.intervals[name])
        super().on_fit_start(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the step; save when a tier is due on it."""
        step = int(trainer.global_step)
        get_recorder().step(step)
        self._note_finished()
        tier = self._due(step)
        if step > 0 and step != self._last_saved and tier is not None:
            self._save(trainer, step, tier)
            self._last_tiers = set(self.intervals) if tier == "all" else {tier}

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Save the last step on every tier (if asked and new), then wait (collective)."""
        step = int(trainer.global_step)
        # The last step goes on every tier: one that saved it on its cadence is not asked again
        # (a step is never overwritten), the others still get it (the persistent copy matters).
        done = self._last_tiers if step == self._last_saved else set()
        missing = [tier.name for tier in self.tiers if tier.name not in done]
        if self.save_on_train_end and step > 0 and missing:
            self._begin_save(trainer, step)
            for name in missing:
                self.manager.save(step, self.state, tier=name)
        self.manager.wait()
        self._note_finished()
