"""``Rollback``: report the step a job with sharded state reloaded after an in-process restart.

Under FSDP no peer holds a copy of another rank's shard, so nothing is healed from memory:
every rank reloads one step (``CheckpointManager.load`` of ``resiliency.checkpoint``, or any
other source) inside the wrapped function. The package does not see that load, so the job
tells it, in two lines: ``rollback.trained(step)`` after each step, and
``rollback.resumed(step, call_wrapper=...)`` once the state is loaded. ``resumed`` checks that
every rank reloaded the same step and, on rank 0 after a restart, records the step and the
steps lost as an ``inprocess_rollback`` event in the goodput ledger. See docs/inprocess.md,
"Sharded state (FSDP)".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch.distributed as dist

from resiliency.goodput import DIR_ENV, get_recorder
from resiliency.inprocess import _heal_transfer
from resiliency.inprocess.exception import ConfigError, RollbackError
from resiliency.inprocess.wrap import CallWrapper

log = logging.getLogger(__name__)

#: A rank's trained step when it trained none in this process.
_NONE = -1


@dataclass(frozen=True)
class RollbackResult:
    """What one ``Rollback.resumed`` found, the same on every rank.

    Attributes:
        step: the step every rank reloaded and resumes from.
        trained_steps: per group rank, the newest step it had trained in this process before
            (None: it trained none).
        lost_steps: steps trained before the fault that are done again: the newest of
            ``trained_steps`` less ``step`` (0 when no rank was ahead of it).
        iteration: the wrapper's iteration (None without a ``CallWrapper``).
    """

    step: int
    trained_steps: tuple[int | None, ...]
    lost_steps: int
    iteration: int | None


class Rollback:
    """Keeps the newest step this process trained, and reports the step the job reloaded.

    Create it **outside** the wrapped function (it must outlive a restart, as the number of
    the last step trained before the fault lives in it). Call :meth:`trained` after every
    training step (an attribute store: no I/O, no collective) and :meth:`resumed` once per
    call of the wrapped function, after the state is loaded, on every rank.
    """

    def __init__(self) -> None:
        self._trained: int | None = None

    @property
    def trained_step(self) -> int | None:
        """The newest step this process trained (None: none yet)."""
        return self._trained

    def trained(self, step: int) -> None:
        """Mark ``step`` as trained by this process (call it after each training step)."""
        self._trained = step

    def resumed(
        self,
        step: int,
        group: dist.ProcessGroup | None = None,
        call_wrapper: CallWrapper | None = None,
    ) -> RollbackResult:
        """Check that every rank of ``group`` reloaded ``step``, and record it. A collective.

        Args:
            step: the step this rank's state was reloaded at (0 for a fresh start).
            group: the process group (default: the default group); every rank calls this.
            call_wrapper: the current call's wrapper: after a restart (iteration 1 on), rank 0
                records an ``inprocess_rollback`` event with its iteration, when the goodput
                ledger directory is set. Without it nothing is recorded.

        Returns:
            The step, every rank's newest trained step and the steps lost.

        Raises:
            ConfigError: ``step`` is not an integer >= 0.
            RollbackError: the ranks reloaded different steps (resuming would mix steps).
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"Rollback.resumed(step={step!r}): expected an integer >= 0")
        me = dist.get_rank(group)
        device = _heal_transfer.transfer_device(group)
        mine = [step, _NONE if self._trained is None else self._trained]
        rows = _heal_transfer.gather_ints(mine, group, device)
        steps = [row[0] for row in rows]
        if len(set(steps)) > 1:
            raise RollbackError(
                f"rank {me}: the ranks reloaded different steps ("
                + ", ".join(f"rank {r}: step {s}" for r, s in enumerate(steps))
                + "): resuming would mix steps; load with one call that every rank agrees on "
                "(CheckpointManager.load restores the newest step that verifies on every rank)"
            )
        trained = tuple(None if row[1] == _NONE else row[1] for row in rows)
        lost = max([0, *(t - step for t in trained if t is not None)])
        iteration = None if call_wrapper is None else call_wrapper.iteration
        result = RollbackResult(step, trained, lost, iteration)
        self._trained = step  # what this process holds now
        if me == 0:
            _report(result)
        return result


def _report(result: RollbackResult) -> None:
    """On rank 0: log the rollback and, after a restart, record it in the ledger."""
    after_fault = bool(result.iteration)
    log.log(
        logging.WARNING if after_fault else logging.INFO,
        "rank 0: rollback: every rank resumes at step %d (%d steps lost; newest steps trained "
        "before, per rank: %s)",
        result.step,
        result.lost_steps,
        ["none" if t is None else t for t in result.trained_steps],
    )
    if not after_fault or not os.environ.get(DIR_ENV):
        return
    try:
        get_recorder().emit(
            "inprocess_rollback",
            step=result.step,
            lost_steps=result.lost_steps,
            trained_steps=[_NONE if t is None else t for t in result.trained_steps],
            iteration=result.iteration,
        )
    except Exception as exc:  # the ledger is a record: never stop training for it
        log.warning(
            "rank 0: could not record the rollback to step %d in the goodput ledger (%s: %s); "
            "training goes on",
            result.step,
            type(exc).__name__,
            exc,
        )
