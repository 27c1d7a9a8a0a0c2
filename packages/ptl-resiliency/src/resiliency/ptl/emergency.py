"""EmergencyCheckpointCallback: on SIGTERM every rank saves the same step, then the job exits.

Lightning installs its own SIGTERM handler at the start of ``fit``; that handler runs a
``broadcast`` inside the signal handler, and with SIGTERM on one DDP rank only the job hangs.
This callback installs :class:`resiliency.checkpoint.EmergencyCheckpoint` in ``on_train_start``,
which Lightning calls after registering its handlers, and replaces Lightning's SIGTERM handler:
the handler then only sets a flag, Lightning's ``received_sigterm`` stays False on every rank
(so its own per-step stop broadcast never fires), and all ranks stop at the step agreed through
the job's store. Lightning restores the handlers it found at the end of ``fit``.

Use it with :class:`~resiliency.ptl.DistributedCheckpointCallback`, whose manager and state it
saves::

    Trainer(callbacks=[DistributedCheckpointCallback("ckpt", every_n_train_steps=50),
                       EmergencyCheckpointCallback()])
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterable
from typing import Any

from resiliency.checkpoint import EmergencyCheckpoint
from resiliency.ptl._compat import CallbackBase
from resiliency.ptl.checkpointing import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
)

__all__ = ["EmergencyCheckpointCallback"]

logger = logging.getLogger(__name__)


class EmergencyCheckpointCallback(CallbackBase):
    """Agreed emergency checkpoint and exit on a preemption signal, for Lightning.

    Args:
        signals: the signals that start an emergency stop (SIGTERM, plus e.g. SIGUSR1).
        lead: steps between the first rank noticing and the saved step.
        check_every: store check period in steps (default: the most ``lead`` allows).
        max_drift: steps one rank's loop can run ahead of another's (1 under DDP).
        term_timeout_s: seconds from the signal to SIGKILL (default: ft-launcher's
            ``--term-timeout``, exported as ``RESILIENCY_TERM_TIMEOUT_S``).
        expected_save_s: expected full-save time until a periodic save was measured.
        checkpoint: the checkpoint callback to save through (default: the
            ``DistributedCheckpointCallback`` among the trainer's callbacks).
    """

    def __init__(
        self,
        *,
        signals: Iterable[int] = (signal.SIGTERM,),
        lead: int = 2,
        check_every: int | None = None,
        max_drift: int = 1,
        term_timeout_s: float | None = None,
        expected_save_s: float | None = None,
        checkpoint: DistributedCheckpointCallback | None = None,
    ) -> None:
        self._signals = tuple(signals)
        self._options: dict[str, Any] = {
            "lead": lead,
            "check_every": check_every,
            "max_drift": max_drift,
            "term_timeout_s": term_timeout_s,
            "expected_save_s": expected_save_s,
        }
        # Fail at construction, not mid-fit, when lead is too small.
        EmergencyCheckpoint.check_lead(lead, check_every, max_drift)
        self._checkpoint = checkpoint
        self._ec: EmergencyCheckpoint | None = None

    @property
    def emergency(self) -> EmergencyCheckpoint | None:
        """The active ``EmergencyCheckpoint`` (between train start and end)."""
        return self._ec

    def _find_checkpoint(self, trainer: Any) -> DistributedCheckpointCallback:
        if self._checkpoint is not None:
            return self._checkpoint
        for callback in trainer.callbacks:
            if isinstance(callback, DistributedCheckpointCallback):
                return callback
        raise CheckpointCallbackConfigError(
            "EmergencyCheckpointCallback saves through a DistributedCheckpointCallback: add one "
            "to Trainer(callbacks=[...]) (or pass checkpoint=...)"
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Install the handlers, after Lightning's (see the module docstring)."""
        checkpoint = self._find_checkpoint(trainer)
        replaced = [
            signal.Signals(s).name
            for s in self._signals
            if callable(signal.getsignal(s))
            and signal.getsignal(s) is not signal.default_int_handler
        ]
        self._ec = EmergencyCheckpoint(
            checkpoint.manager, signals=self._signals, warn_on_replace=False, **self._options
        )
        if replaced:
            logger.info(
                "EmergencyCheckpointCallback handles %s instead of the handlers Lightning "
                "installed (Lightning's broadcasts inside the handler and deadlocks DDP when one "
                "rank is signalled); Lightning restores them at the end of fit",
                ", ".join(replaced),
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """At the agreed step: save on every rank, write the exit info and exit."""
        ec = self._ec
        if ec is None:
            return
        checkpoint = self._find_checkpoint(trainer)
        for seconds in checkpoint.pop_save_durations():
            ec.record_save(seconds)
        step = int(trainer.global_step)
        if ec.should_stop(step):
            ec.save_and_exit(step, checkpoint.state)

    def _close(self) -> None:
        if self._ec is not None:
            self._ec.close()
            self._ec = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Give the signals back."""
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Give the signals back, unless this is the emergency exit (a late SIGTERM must not
        kill a rank that is exiting after its save)."""
        if self._ec is not None and self._ec.stop_step is None:
            self._close()
