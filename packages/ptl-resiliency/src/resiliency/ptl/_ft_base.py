"""What both fault-tolerance callbacks share: connection, timeouts, auto-resume, faults."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resiliency.ft import IPC_SOCKET_ENV, FaultToleranceError, RankMonitorClient
from resiliency.ptl._compat import CallbackBase
from resiliency.ptl.autoresume import finished_flag_path, training_is_complete, write_finished_flag
from resiliency.ptl.errors import LauncherRequiredError
from resiliency.ptl.ft_state import FT_STATE_FILE_NAME, read_ft_state, write_ft_state
from resiliency.ptl.simulated_fault import SimulatedFaultParams, _FaultInjector

if TYPE_CHECKING:
    import lightning.pytorch as pl

_FT_DIR_NAME = "ft_state"


class _FaultToleranceBase(CallbackBase):
    """Connects in ``setup`` (fit only), persists calculated timeouts, writes the finished flag.

    Subclasses decide what progress means (heartbeats or sections) by overriding the ``_progress_*``
    methods and :meth:`_calculate_timeouts`.
    """

    #: The state file's name in ``exp_dir`` (NVIDIA's resiliency extension's attribute names).
    TIMEOUTS_FILENAME = FT_STATE_FILE_NAME
    #: Other names read when ``TIMEOUTS_FILENAME`` is absent (written by other versions).
    _FALLBACK_TIMEOUTS_FILENAMES: tuple[str, ...] = ()
    #: The state directory under ``trainer.log_dir`` when ``exp_dir`` is not given.
    FT_DIR_NAME = _FT_DIR_NAME

    def __init__(
        self,
        autoresume: bool,
        calculate_timeouts: bool,
        simulated_fault_params: SimulatedFaultParams | Mapping[str, Any] | None = None,
        exp_dir: str | Path | None = None,
        logger_name: str = "",
    ) -> None:
        super().__init__()
        self.autoresume = bool(autoresume)
        self.calculate_timeouts = bool(calculate_timeouts)
        self.simulated_fault_params = SimulatedFaultParams.coerce(simulated_fault_params)
        self.exp_dir = Path(exp_dir) if exp_dir is not None else None
        self._log = logging.getLogger(logger_name or __name__)
        self._client: RankMonitorClient | None = None
        self._injector = _FaultInjector(self._log)
        self._rank = 0
        self._flag_path: Path | None = None
        self._state_path: Path | None = None
        self._loaded_checkpoint = False
        self._save_started = False
        self._saved_checkpoint = False
        self._calculated_once = False

    @property
    def client(self) -> RankMonitorClient | None:
        """The connected rank-monitor client during ``fit``, else None."""
        return self._client

    @property
    def ft_state_path(self) -> Path | None:
        """Where calculated timeouts are read from and written to (known after ``setup``)."""
        return self._state_path

    # ---- Lightning hooks shared by both callbacks -------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Connect to this rank's monitor and load earlier calculated timeouts (``fit`` only)."""
        if stage != "fit" or self._client is not None:
            return
        self._rank = trainer.global_rank
        if self.autoresume:
            self._flag_path = finished_flag_path()
        state_dir = self.exp_dir
        if state_dir is None:
            # trainer.log_dir broadcasts from rank 0: every rank calls it here, in setup.
            state_dir = Path(trainer.log_dir or ".") / self.FT_DIR_NAME
        self._state_path = state_dir / self.TIMEOUTS_FILENAME
        self._loaded_checkpoint = False
        self._save_started = self._saved_checkpoint = self._calculated_once = False
        if not os.environ.get(IPC_SOCKET_ENV):
            raise LauncherRequiredError(
                f"{type(self).__name__} on rank {self._rank} has no rank monitor: "
                f"{IPC_SOCKET_ENV} is not set, so the job was not started by ft-launcher. Start it "
                "with `ft-launcher` (a torchrun drop-in that starts one monitor per rank), e.g. "
                "`ft-launcher --nproc-per-node 2 train.py`, or remove the callback."
            )
        client = RankMonitorClient()
        # A set but unreachable socket, or a refusal, raises ft-core's own error: its message
        # names the socket and the reason.
        client.init_workload_monitoring()
        self._client = client
        self._log.info(
            "rank %d: connected to the rank monitor (%s)", self._rank, self._describe_timeouts()
        )
        if self.calculate_timeouts:
            self._load_timeouts()
        self._on_connected()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Note whether this job resumed from a checkpoint; arm a simulated fault."""
        if trainer.ckpt_path is not None:
            self._loaded_checkpoint = True
        self._progress_train_start()
        params = self.simulated_fault_params
        if params is not None:
            plan = None
            if trainer.is_global_zero:
                plan = self._injector.plan(params, trainer.world_size)
            # Every rank must agree on which rank fails, when, and how.
            agreed = trainer.strategy.broadcast(plan, src=0)
            if agreed is not None:  # rank 0 always drew a plan
                self._injector.arm(agreed, self._rank)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Remember that a checkpoint load was observed (calculated timeouts must cover it)."""
        self._note_checkpoint_loaded()

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Mark the start of a checkpoint save (every rank builds the checkpoint dict)."""
        self._note_checkpoint_save()

    # resiliency's own checkpoint callbacks save and load through their CheckpointManager, not
    # through Lightning's checkpoint hooks: they call these two instead.
    def _note_checkpoint_loaded(self) -> None:
        self._loaded_checkpoint = True

    def _note_checkpoint_save(self) -> None:
        if self._client is None:
            return
        self._save_started = True
        self._progress_checkpoint_start()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Final timeout calculation; the finished flag when training is complete."""
        if self._client is None:
            return
        self._injector.disarm()
        self._after_checkpoint()
        self._progress_train_end()
        self._maybe_calculate_timeouts(final=True)
        if self._flag_path is not None and trainer.is_global_zero and training_is_complete(trainer):
            write_finished_flag(
                self._flag_path,
                f"training complete at global step {trainer.global_step}, "
                f"epoch {trainer.current_epoch}",
            )

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Disconnect cleanly: the monitor disarms this rank's timers."""
        if stage != "fit":
            return
        self._injector.disarm()
        self._disconnect()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Stop a pending simulated fault. The connection stays up so a hang on exit is caught."""
        self._injector.disarm()

    # ---- helpers for subclasses -------------------------------------------------------------

    def _at_step_boundary(self) -> None:
        """Between training batches (same place on every rank): finish a save, calculate, hang."""
        self._after_checkpoint()
        self._maybe_calculate_timeouts(final=False)
        self._injector.maybe_hang()

    def _after_checkpoint(self) -> None:
        if self._save_started:
            self._save_started = False
            self._saved_checkpoint = True
            self._progress_checkpoint_end()

    def _maybe_calculate_timeouts(self, final: bool) -> None:
        """Calculate once both a checkpoint load and a save were observed, then at the end.

        Called at the same point on every rank: the calculation all-reduces across ranks.
        """
        client = self._client
        if client is None or not self.calculate_timeouts:
            return
        if not (self._loaded_checkpoint and self._saved_checkpoint):
            return
        if self._calculated_once and not final:
            return
        self._calculated_once = True
        started = time.monotonic()
        try:
            updated = self._calculate_timeouts(client)
        except FaultToleranceError as exc:
            self._log.error("rank %d: timeout calculation failed: %s", self._rank, exc)
            return
        self._log.info(
            "rank %d: calculated timeouts %s in %.3f s (%s)",
            self._rank,
            "updated" if updated else "unchanged",
            time.monotonic() - started,
            self._describe_timeouts(),
        )
        if self._rank == 0 and self._state_path is not None:
            try:
                write_ft_state(self._state_path, client.state_dict())
            except OSError as exc:
                self._log.error(
                    "rank 0: cannot write calculated timeouts to %s (%s); the next job will use "
                    "the configured ones",
                    self._state_path,
                    exc,
                )
            else:
                self._log.info("rank 0: calculated timeouts saved to %s", self._state_path)

    def _load_timeouts(self) -> None:
        assert self._client is not None and self._state_path is not None
        state = read_ft_state(self._state_path)
        for name in self._FALLBACK_TIMEOUTS_FILENAMES:
            if state is not None:
                break
            state = read_ft_state(self._state_path.with_name(name))
            if state is not None:
                self._log.info("rank %d: read calculated timeouts from %s", self._rank, name)
        if state is None:
            self._log.info(
                "rank %d: no calculated timeouts at %s yet; using the configured ones",
                self._rank,
                self._state_path,
            )
            return
        try:
            self._client.load_state_dict(state)
        except (FaultToleranceError, ValueError) as exc:
            self._log.warning(
                "rank %d: ignoring calculated timeouts in %s (%s); using the configured ones",
                self._rank,
                self._state_path,
                exc,
            )
            return
        self._log.info(
            "rank %d: loaded calculated timeouts from %s (%s)",
            self._rank,
            self._state_path,
            self._describe_timeouts(),
        )

    def _disconnect(self) -> None:
        if self._client is not None:
            self._client.shutdown_workload_monitoring()
            self._client = None
            self._log.info("rank %d: disconnected from the rank monitor", self._rank)

    # ---- what subclasses define -------------------------------------------------------------

    def _on_connected(self) -> None:
        """Called right after connecting in ``setup``."""

    def _progress_train_start(self) -> None:
        """Training starts (after checkpoint loading and the sanity check)."""

    def _progress_checkpoint_start(self) -> None:
        """A checkpoint save starts on this rank."""

    def _progress_checkpoint_end(self) -> None:
        """The checkpoint save finished (observed at the next hook)."""

    def _progress_train_end(self) -> None:
        """Training finished normally."""

    def _calculate_timeouts(self, client: RankMonitorClient) -> bool:
        raise NotImplementedError

    def _describe_timeouts(self) -> str:
        raise NotImplementedError
