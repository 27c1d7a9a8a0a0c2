"""FaultToleranceSectionsCallback: named sections around setup, steps and checkpointing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resiliency.ft import (
    FaultToleranceError,
    RankMonitorClient,
    WorkloadAction,
    WorkloadControlRequest,
)
from resiliency.ptl._ft_base import _FaultToleranceBase
from resiliency.ptl.autoresume import write_finished_flag
from resiliency.ptl.ft_state import FT_SECTIONS_STATE_FILE_NAME, FT_STATE_FILE_NAME
from resiliency.ptl.simulated_fault import SimulatedFaultParams

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "SECTION_CHECKPOINTING",
    "SECTION_SETUP",
    "SECTION_STEP",
    "ExceptionHandlingPolicy",
    "FaultToleranceSectionsCallback",
    "shutdown_on",
]

SECTION_SETUP = "setup"
SECTION_STEP = "step"
SECTION_CHECKPOINTING = "checkpointing"

ExceptionHandlingPolicy = Callable[[BaseException], WorkloadControlRequest | None]
"""Maps an exception raised in ``fit`` to a request for the launcher, or None for no request."""


def shutdown_on(*exception_types: type[BaseException]) -> ExceptionHandlingPolicy:
    """Build a policy that asks the launcher to shut the job down on the given exception types.

    Args:
        *exception_types: Exceptions that a restart cannot fix (bad config, bad data, ...).

    Returns:
        A policy for ``FaultToleranceSectionsCallback(exc_handling_policy=...)``.

    Raises:
        ValueError: No exception type was given.
    """
    if not exception_types:
        raise ValueError("shutdown_on() needs at least one exception type")

    def policy(exc: BaseException) -> WorkloadControlRequest | None:
        if isinstance(exc, exception_types):
            return WorkloadControlRequest(
                WorkloadAction.ShutdownWorkload, f"{type(exc).__name__}: {exc}"
            )
        return None

    return policy


class FaultToleranceSectionsCallback(_FaultToleranceBase):
    """Hang detection by sections for ``Trainer.fit``, under ``ft-launcher``.

    Sections (each with its own timeout in ``rank_section_timeouts``):

    * ``setup``: from the ``setup`` hook to training start (checkpoint loading, sanity check);
    * ``step``: every training and validation batch (forward, backward, optimizer step);
    * ``checkpointing``: from the moment a checkpoint is built to the next hook after it was
      written (includes the write and the barrier after it).

    Everything else is out of section (``rank_out_of_section_timeout``).

    Args:
        autoresume: Create the ``FAULT_TOL_FINISHED_FLAG_FILE`` flag when training is complete
            (and when the exception policy asks to shut the workload down).
        calculate_timeouts: Calculate the section and out-of-section timeouts from what was
            observed (once a checkpoint load and save were both observed, and at the end) and
            persist them to ``exp_dir/_ft_state.json`` for the next job.
        simulated_fault_params: See :class:`SimulatedFaultParams`; a ``rank_hung`` fault hangs
            inside the ``step`` section.
        exp_dir: Directory of the FT state file; default ``trainer.log_dir/ft_state``.
        logger_name: Name of the :mod:`logging` logger the callback reports to.
        exc_handling_policy: Maps an exception raised in ``fit`` to a
            ``WorkloadControlRequest`` sent to the launcher (e.g. ``ShutdownWorkload`` for an
            error a restart cannot fix), or None. See :func:`shutdown_on`. NVIDIA's resiliency
            extension's name and position.
        exception_handling_policy: The same, by the name earlier releases of this toolkit used
            (keyword only; not both).

    The state file is ``exp_dir/_ft_state_.json`` (NVIDIA's name for this callback); a
    ``_ft_state.json`` left there by an earlier release is read when it is absent.

    Raises:
        ValueError: Invalid ``simulated_fault_params``, or a policy that is not callable.
        TypeError: Both policy arguments are given.
    """

    TIMEOUTS_FILENAME = FT_SECTIONS_STATE_FILE_NAME
    _FALLBACK_TIMEOUTS_FILENAMES = (FT_STATE_FILE_NAME,)

    def __init__(  # noqa: PLR0917 (the signature users already write)
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: SimulatedFaultParams | Mapping[str, Any] | None = None,
        exp_dir: str | Path | None = None,
        logger_name: str = "nemo_logger.FaultToleranceSectionsCallback",
        exc_handling_policy: ExceptionHandlingPolicy | None = None,
        *,
        exception_handling_policy: ExceptionHandlingPolicy | None = None,
    ) -> None:
        super().__init__(
            autoresume, calculate_timeouts, simulated_fault_params, exp_dir, logger_name
        )
        if exc_handling_policy is not None and exception_handling_policy is not None:
            raise TypeError(
                "give exc_handling_policy or exception_handling_policy (the same thing), not both"
            )
        policy = (
            exc_handling_policy if exc_handling_policy is not None else exception_handling_policy
        )
        if policy is not None and not callable(policy):
            raise ValueError("exc_handling_policy must be callable or None")
        self.exc_handling_policy = policy
        self._open: set[str] = set()

    @property
    def exception_handling_policy(self) -> ExceptionHandlingPolicy | None:
        """The same as :attr:`exc_handling_policy` (the name of earlier releases)."""
        return self.exc_handling_policy

    def _start(self, name: str) -> None:
        if self._client is not None and name not in self._open:
            self._open.add(name)
            self._client.start_section(name)

    def _end(self, name: str) -> None:
        if self._client is not None and name in self._open:
            self._open.discard(name)
            self._client.end_section(name)

    def _on_connected(self) -> None:
        self._open.clear()
        self._start(SECTION_SETUP)

    def _progress_train_start(self) -> None:
        self._end(SECTION_SETUP)

    def _progress_checkpoint_start(self) -> None:
        self._start(SECTION_CHECKPOINTING)

    def _progress_checkpoint_end(self) -> None:
        self._end(SECTION_CHECKPOINTING)

    def _progress_train_end(self) -> None:
        self._end(SECTION_STEP)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Close a finished save, maybe calculate timeouts, open ``step``."""
        self._after_checkpoint()
        self._maybe_calculate_timeouts(final=False)
        self._start(SECTION_STEP)
        self._injector.maybe_hang()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close ``step``."""
        self._end(SECTION_STEP)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a save that ran at the end of the previous epoch."""
        self._after_checkpoint()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a save that ran since the last batch."""
        self._after_checkpoint()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Close a save that ran since the last batch."""
        self._after_checkpoint()

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Open ``step`` (not during the sanity check, which runs inside ``setup``)."""
        if not trainer.sanity_checking:
            self._start(SECTION_STEP)

    def on_validation_batch_end(  # noqa: PLR0917 (Lightning's hook signature)
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Close ``step``."""
        self._end(SECTION_STEP)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Close every section and disconnect."""
        if stage == "fit" and self._client is not None:
            self._open.clear()
            self._client.end_all_sections()
        super().teardown(trainer, pl_module, stage)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Apply the exception policy: send its request to the launcher, maybe write the flag."""
        super().on_exception(trainer, pl_module, exception)
        policy = self.exc_handling_policy
        if policy is None or self._client is None:
            return
        request = policy(exception)
        if request is None:
            return
        self._log.error(
            "rank %d: %s: %s; asking the launcher for %s",
            self._rank,
            type(exception).__name__,
            exception,
            request.action.value,
        )
        try:
            self._client.send_workload_control_request(request)
        except FaultToleranceError as exc:
            self._log.error(
                "rank %d: could not send %s to the launcher: %s",
                self._rank,
                request.action.value,
                exc,
            )
        if request.action == WorkloadAction.ShutdownWorkload and self._flag_path is not None:
            # Any rank may hit the exception; the flag stops an auto-resume loop from relaunching.
            write_finished_flag(
                self._flag_path,
                f"workload shut down by rank {self._rank}: {request.description}",
            )

    def _calculate_timeouts(self, client: RankMonitorClient) -> bool:
        return client.calculate_and_set_section_timeouts()

    def _describe_timeouts(self) -> str:
        if self._client is None:
            return "not connected"
        return f"section timeouts {self._client.section_timeouts}"
