"""DistributedCheckpointCallback: asynchronous DCP checkpoints on every rank, and auto-resume.

Lightning's ``CheckpointIO`` runs on global rank 0 only, so a DCP save inside it (collectives on
every rank) hangs under DDP. This callback saves from a hook every rank runs
(``on_train_batch_end``) through :class:`resiliency.checkpoint.CheckpointManager`: the step is
staged in shared memory and written by a persistent writer process while training goes on.
At fit start it loads the newest step that verifies on every rank (model, optimizer, LR
schedulers, loop progress, per-rank RNG states), so ``Trainer(callbacks=[...])`` is all a user
adds. Every training step is also a goodput ``step`` event (the manager records the saves and
loads).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from resiliency.checkpoint import AppState, CheckpointManager, advised_every
from resiliency.goodput import AutoInterval, get_recorder
from resiliency.ptl._compat import CallbackBase
from resiliency.ptl._ft_base import _FaultToleranceBase
from resiliency.ptl.errors import PtlResiliencyError

__all__ = ["CheckpointCallbackConfigError", "DistributedCheckpointCallback"]

logger = logging.getLogger(__name__)


class CheckpointCallbackConfigError(PtlResiliencyError, ValueError):
    """The checkpoint callbacks are configured in a way that cannot work."""


def _fault_tolerance_callbacks(trainer: Any) -> list[_FaultToleranceBase]:
    """The trainer's hang-detection callbacks, told of the saves and loads made here.

    Lightning's ``on_save_checkpoint`` / ``on_load_checkpoint`` never run for these checkpoints,
    and calculated timeouts wait for one save and one load to be observed.
    """
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, _FaultToleranceBase)]


def _encode(value: Any) -> Any:
    """JSON text when the value is plain data (safe to read back), else the value itself."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return value


def _decode(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class _LightningProgress:
    """A DCP ``Stateful`` over the trainer's loop progress and LR schedulers."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        configs = self._trainer.lr_scheduler_configs
        return {
            "fit_loop": json.dumps(self._trainer.fit_loop.state_dict()),
            "schedulers": [_encode(c.scheduler.state_dict()) for c in configs],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._trainer.fit_loop.load_state_dict(json.loads(state_dict["fit_loop"]))
        configs = self._trainer.lr_scheduler_configs
        for config, saved in zip(configs, state_dict.get("schedulers", []), strict=False):
            config.scheduler.load_state_dict(_decode(saved))


class DistributedCheckpointCallback(CallbackBase):
    """Save every N optimizer steps on all ranks, asynchronously; resume from the latest step.

    Args:
        dirpath: checkpoint root, shared by all ranks (``step_<N:09d>/`` directories): a
            directory, or an object-store URL such as ``s3://bucket/ckpt`` (needs fsspec and
            the store's driver; see docs/checkpoint.md, "Object stores").
        every_n_train_steps: save when ``trainer.global_step`` is a multiple of this; or
            ``"auto"`` (opt-in): the interval ``resiliency-goodput advise`` gives from the job's
            own ledger (``RESILIENCY_GOODPUT_DIR``), re-evaluated at every start, within the
            bounds of an `AutoInterval` (``"auto"``: 10 to 10,000 steps, 100 until the ledger
            can advise).
        keep_last: keep the newest N steps (None: all).
        keep_every: also keep every step divisible by this number forever.
        async_save: save in the background (training blocks only while the state is staged).
        resume: at fit start, load the newest complete step under ``dirpath``, if any.
        save_on_train_end: also save the last step when training ends normally.
        writer_timeout_s: bound on one save's writing (see ``CheckpointManager``).

    Raises:
        CheckpointCallbackConfigError: ``every_n_train_steps`` < 1.
    """

    def __init__(
        self,
        dirpath: str | Path,
        *,
        every_n_train_steps: int | str | AutoInterval = 100,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        resume: bool = True,
        save_on_train_end: bool = True,
        writer_timeout_s: float = 600.0,
    ) -> None:
        # "auto" (or AutoInterval bounds): the interval advised from the job's own ledger,
        # read again at every start (so at every restart), within the bounds.
        self._auto: AutoInterval | None = None
        if every_n_train_steps == "auto":
            every_n_train_steps = AutoInterval()
        if isinstance(every_n_train_steps, AutoInterval):
            self._auto = every_n_train_steps
            every_n_train_steps = every_n_train_steps.default_steps
        if not isinstance(every_n_train_steps, int) or every_n_train_steps < 1:
            raise CheckpointCallbackConfigError(
                "every_n_train_steps must be an int >= 1, 'auto' or an AutoInterval, got "
                f"{every_n_train_steps!r}"
            )
        # A URL (s3://...) stays a string: Path would fold its "//".
        self.dirpath: str | Path = (
            dirpath if isinstance(dirpath, str) and "://" in dirpath else Path(dirpath)
        )
        self.every_n_train_steps = every_n_train_steps
        self._manager_kwargs: dict[str, Any] = {
            "keep_last": keep_last,
            "keep_every": keep_every,
            "async_save": async_save,
            "writer_timeout_s": writer_timeout_s,
        }
        self.resume = resume
        self.save_on_train_end = save_on_train_end
        self._manager: CheckpointManager | None = None
        self._state: dict[str, Any] | None = None
        self._pending: tuple[Any, float] | None = None
        self._durations: list[float] = []
        self._last_saved: int | None = None
        self.resumed_step: int | None = None

    # --- what the emergency callback uses ------------------------------------------------------
    @property
    def manager(self) -> CheckpointManager:
        """The manager (made in ``setup``)."""
        if self._manager is None:
            raise CheckpointCallbackConfigError(
                "DistributedCheckpointCallback is not set up yet (its manager is made in setup)"
            )
        return self._manager

    @property
    def state(self) -> dict[str, Any]:
        """The state saved and loaded (made at fit start, once the optimizers exist)."""
        if self._state is None:
            raise CheckpointCallbackConfigError(
                "DistributedCheckpointCallback has no state before on_fit_start"
            )
        return self._state

    def pop_save_durations(self) -> list[float]:
        """Durations (seconds until durable) of the saves completed since the last call."""
        out, self._durations = self._durations, []
        return out

    # --- Lightning hooks --------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Create the manager on every rank (the process group exists by now)."""
        if stage == "fit" and self._manager is None:
            self._manager = CheckpointManager(self.dirpath, **self._manager_kwargs)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Build the state and load the newest complete step, if any (collective)."""
        optimizers = list(trainer.optimizers)
        if len(optimizers) > 1:
            raise CheckpointCallbackConfigError(
                f"DistributedCheckpointCallback saves one optimizer; this module has "
                f"{len(optimizers)}"
            )
        app = AppState(
            pl_module,
            optimizers[0] if optimizers else None,
            lightning=_LightningProgress(trainer),
        )
        self._state = {"app": app}
        if self._auto is not None:  # collective: rank 0 reads the ledger
            self.every_n_train_steps = advised_every(self.manager, self._auto)
            logger.info(
                "saving every %d steps (every_n_train_steps='auto')", self.every_n_train_steps
            )
        if not self.resume:
            return
        step = self.manager.load(self._state)
        self.resumed_step = step
        self._last_saved = step
        if step is not None:
            for callback in _fault_tolerance_callbacks(trainer):
                callback._note_checkpoint_loaded()
            logger.info(
                "resumed from step %d under %s (global_step %d)",
                step,
                self.dirpath,
                trainer.global_step,
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Record the step; note finished saves; start a save every N steps."""
        step = int(trainer.global_step)
        get_recorder().step(step)
        self._note_finished()
        if step > 0 and step % self.every_n_train_steps == 0 and step != self._last_saved:
            self._save(trainer, step)

    def _note_finished(self) -> None:
        pending = self._pending
        if pending is not None and (pending[0] is None or pending[0].done()):
            self._durations.append(time.monotonic() - pending[1])
            self._pending = None

    def _begin_save(self, trainer: Any, step: int) -> None:
        """Mark ``step`` saved and tell the hang-detection callbacks that a save starts."""
        for callback in _fault_tolerance_callbacks(trainer):
            callback._note_checkpoint_save()
        self._last_saved = step

    def _save(self, trainer: Any, step: int, tier: str | None = None) -> None:
        self._begin_save(trainer, step)
        started = time.monotonic()
        self._pending = (self.manager.save(step, self.state, tier=tier), started)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Save the last step (if asked and new) and wait until it is durable (collective)."""
        step = int(trainer.global_step)
        if self.save_on_train_end and step > 0 and step != self._last_saved:
            self._save(trainer, step)
        self.manager.wait()
        self._note_finished()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Stop the writer after a normal end of fit (an exception leaves it to process exit)."""
        if stage == "fit" and self._manager is not None:
            self._manager.close()
            self._manager = None
