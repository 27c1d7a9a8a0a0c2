"""FaultToleranceCallback: heartbeats from the Lightning training loop to the rank monitor."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resiliency.ft import RankMonitorClient
from resiliency.ptl._ft_base import _FaultToleranceBase
from resiliency.ptl.simulated_fault import SimulatedFaultParams

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["FaultToleranceCallback"]


class FaultToleranceCallback(_FaultToleranceBase):
    """Hang detection by heartbeats for ``Trainer.fit``, under ``ft-launcher``.

    Connects to this rank's monitor in ``setup``; sends a heartbeat when training starts, at every
    training batch start and end, around validation and at every checkpoint save; disconnects in
    ``teardown``. A rank whose heartbeats stop for longer than the heartbeat timeout is killed by
    its monitor and the launcher restarts the group.

    Args:
        autoresume: Create the file named by ``FAULT_TOL_FINISHED_FLAG_FILE`` (on rank 0) when
            training is complete, so an auto-resume job loop stops. The variable must be set.
        calculate_timeouts: Calculate the heartbeat timeouts from what was observed, once this job
            has both loaded and saved a checkpoint (so they cover checkpoint I/O) and again when
            training ends; persist them to ``exp_dir/_ft_state.json`` and load them in the next
            job.
        simulated_fault_params: A :class:`SimulatedFaultParams` or a mapping with its keys, to
            rehearse a ``rank_killed`` / ``rank_hung`` fault; None for none.
        exp_dir: Directory of the FT state file; default ``trainer.log_dir/ft_state``. It must be
            the same for every job of a run (a logger that makes a new version directory per job
            gives each job a new one: pass ``exp_dir`` then).
        logger_name: Name of the :mod:`logging` logger the callback reports to.

    Raises:
        ValueError: Invalid ``simulated_fault_params``.
    """

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: SimulatedFaultParams | Mapping[str, Any] | None = None,
        exp_dir: str | Path | None = None,
        logger_name: str = "nemo_logger.FaultToleranceCallback",
    ) -> None:
        super().__init__(
            autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name
        )

    def _heartbeat(self) -> None:
        if self._client is not None:
            self._client.send_heartbeat()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Heartbeat; finish the bookkeeping of a save; maybe calculate timeouts."""
        self._heartbeat()
        self._at_step_boundary()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Heartbeat."""
        self._heartbeat()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat (a save may have ended the previous epoch)."""
        self._heartbeat()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat (a save may have happened since the last batch)."""
        self._heartbeat()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat."""
        self._heartbeat()

    def on_validation_batch_end(  # noqa: PLR0917 (Lightning's hook signature)
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Heartbeat."""
        self._heartbeat()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Heartbeat."""
        self._heartbeat()

    def _progress_train_start(self) -> None:
        self._heartbeat()

    def _progress_checkpoint_start(self) -> None:
        self._heartbeat()

    def _progress_checkpoint_end(self) -> None:
        self._heartbeat()

    def _progress_train_end(self) -> None:
        self._heartbeat()

    def _calculate_timeouts(self, client: RankMonitorClient) -> bool:
        return client.calculate_and_set_hb_timeouts()

    def _describe_timeouts(self) -> str:
        if self._client is None:
            return "not connected"
        return f"heartbeat timeouts {self._client.hb_timeouts}"
