"""EmergencyCheckpoint: on SIGTERM (or another configured signal) every rank saves the same step.

Use it in any training loop::

    ec = EmergencyCheckpoint(manager, signals=(signal.SIGTERM, signal.SIGUSR1), lead=2)
    for step in range(start + 1, total + 1):
        train_one_step()
        if ec.should_stop(step):
            ec.save_and_exit(step, state)  # never returns

What happens:

* The signal handler only records the signal (no I/O, no collective, nothing that can deadlock).
* The rank that notices first proposes ``stop_at = step + lead`` through the job's c10d store;
  the other ranks learn it by a staggered store check every ``check_every`` steps (see
  :mod:`resiliency.checkpoint._emergency.agreement` for why ``lead >= check_every + max_drift``
  makes it impossible for a rank to have passed the stop step).
* At ``stop_at`` every rank saves through the manager and waits until the step is committed,
  writes ``$RESILIENCY_EXIT_INFO_DIR/rank_<RANK>.json`` and exits with
  ``$RESILIENCY_PREEMPTED_EXIT_CODE`` (0 without a launcher), which ft-launcher reads as a
  graceful preemption: no restart, exit code 5. An earlier save still in flight is waited for
  until the deadline at most, a writer still starting not at all (see ``_emergency_exit``).
* The save is budgeted against the time left before SIGKILL (``--term-timeout`` of ft-launcher,
  exported as ``RESILIENCY_TERM_TIMEOUT_S``, or ``term_timeout_s=``): when the expected save time
  (the longest of the recent saves recorded with :meth:`EmergencyCheckpoint.record_save`) does
  not fit, it saves what fits (a local tier when given, else the ``essential`` state) and logs
  the decision. All ranks adopt the same decision (first writer wins).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any, NoReturn

import torch.distributed as dist

from resiliency.checkpoint import _events
from resiliency.checkpoint._emergency.agreement import (
    StopAgreement,
    StopRecord,
    check_lead,
    default_store,
    key_prefix,
)
from resiliency.checkpoint._emergency.exit import close_manager
from resiliency.checkpoint._emergency.launcher_contract import (
    EXIT_INFO_DIR_ENV,
    PREEMPTED_EXIT_CODE_ENV,
    TERM_TIMEOUT_ENV,
    map_stop_mark,
    preempted_exit_code,
    write_exit_info,
)
from resiliency.checkpoint._emergency.launcher_contract import (
    term_timeout_s as launcher_term_timeout_s,
)
from resiliency.checkpoint._emergency.monitor_contract import map_termination_mark
from resiliency.checkpoint.errors import CheckpointError

__all__ = [
    "EXIT_INFO_DIR_ENV",
    "PREEMPTED_EXIT_CODE_ENV",
    "TERM_TIMEOUT_ENV",
    "EmergencyCheckpoint",
    "EmergencyCheckpointError",
]

logger = logging.getLogger(__name__)

SaveFn = Callable[[int, Any], Any]

_SAVE_TIME_SAFETY = 1.25  # the expected save time is scaled by this before it is compared
_FINISH_WAIT_S = 30.0  # longest rank 0 waits for the other ranks to report done


class EmergencyCheckpointError(CheckpointError):
    """The emergency stop cannot work as configured (e.g. a rank passed the agreed step)."""


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class EmergencyCheckpoint:
    """Agreed, budgeted checkpoint-and-exit on a preemption signal.

    Args:
        manager: a ``CheckpointManager`` (its ``save(step, state)`` handle is waited for), or any
            callable ``save(step, state)`` returning None or an object with ``wait(timeout)``.
        signals: the signals that start an emergency stop (SIGTERM plus e.g. SIGUSR1, which
            Slurm can send ahead of the kill).
        lead: steps between the step at which the first rank notices and the saved step.
        check_every: each rank checks the store once every this many steps (default:
            ``lead - max_drift``, the most the rule allows).
        max_drift: how many steps a rank's loop can run ahead of another's (1 with a blocking
            collective or host sync every step).
        store: the c10d store all ranks share (default: a client of
            ``MASTER_ADDR:MASTER_PORT``, made on first use; none with a single rank).
        term_timeout_s: seconds between the signal and SIGKILL (default:
            ``$RESILIENCY_TERM_TIMEOUT_S``, which ft-launcher sets from ``--term-timeout``;
            unknown otherwise, and then every save is attempted in full).
        expected_save_s: expected duration of a full save until this rank records one.
        local_save: optional faster tier ``save(step, state)`` used when a full save does not fit.
        margin_s: seconds kept free before SIGKILL for writing the exit info and exiting.
        chain_previous: also call a previously installed Python handler after ours.
        warn_on_replace: log a warning when a previously installed handler is replaced.
        exit_fn: called with the exit code at the end of :meth:`save_and_exit` (``sys.exit``).

    Raises:
        ValueError: ``lead``, ``check_every`` or ``max_drift`` break the rule
            ``lead >= check_every + max_drift``, or no signal is given.
    """

    def __init__(
        self,
        manager: Any = None,
        *,
        signals: Iterable[int] = (signal.SIGTERM,),
        lead: int = 2,
        check_every: int | None = None,
        max_drift: int = 1,
        store: Any = None,
        term_timeout_s: float | None = None,
        expected_save_s: float | None = None,
        local_save: SaveFn | None = None,
        margin_s: float = 2.0,
        chain_previous: bool = False,
        warn_on_replace: bool = True,
        exit_fn: Callable[[int], Any] = sys.exit,
    ) -> None:
        check_every = self.check_lead(lead, check_every, max_drift)
        self._signals = tuple(signal.Signals(s) for s in signals)
        if not self._signals:
            raise ValueError("EmergencyCheckpoint needs at least one signal")
        self._save = self._save_fn(manager)
        self._manager = manager
        self.lead = lead
        self.check_every = check_every
        self.max_drift = max_drift
        self.rank, self.world_size = _rank_and_world()
        self._phase = self.rank % check_every
        self._store = store
        self._agreement: StopAgreement | None = None
        if term_timeout_s is None:
            term_timeout_s = launcher_term_timeout_s()
        self.term_timeout_s = term_timeout_s
        self._save_times: deque[float] = deque(maxlen=5)
        self._expected_save_s = expected_save_s
        if local_save is None and getattr(manager, "tiered", False):
            local_save = functools.partial(manager.save, tier="local")
        self._local_save = local_save
        self._margin_s = margin_s
        self._chain = chain_previous
        self._exit_fn = exit_fn
        self._signum: int | None = None
        self._signal_wall: float | None = None
        self._noticed_step: int | None = None
        self._stop: StopRecord | None = None
        self._store_error_logged = False
        self._previous: dict[signal.Signals, Any] = {}
        self._stop_mark = map_stop_mark()
        self._monitor_mark = map_termination_mark()
        self._install(warn_on_replace)

    check_lead = staticmethod(check_lead)

    # --- signals ---------------------------------------------------------------------------------
    @staticmethod
    def _save_fn(manager: Any) -> SaveFn:
        save = getattr(manager, "save", None)
        if callable(save):
            # A tiered manager saves a step only on the tiers it is due on: an emergency step
            # must go to every tier whatever the cadence.
            return (
                functools.partial(save, tier="all") if getattr(manager, "tiered", False) else save
            )
        if callable(manager):
            return manager
        raise TypeError(
            f"EmergencyCheckpoint needs a CheckpointManager or a save(step, state) callable, "
            f"got {manager!r}"
        )

    def _install(self, warn_on_replace: bool) -> None:
        for sig in self._signals:
            previous = signal.getsignal(sig)
            try:
                signal.signal(sig, self._on_signal)
            except ValueError as exc:  # not the main thread
                self.close()
                raise EmergencyCheckpointError(
                    f"cannot install the {sig.name} handler: {exc} (create EmergencyCheckpoint "
                    "in the main thread)"
                ) from exc
            self._previous[sig] = previous
            replaced = callable(previous) and previous is not signal.default_int_handler
            if replaced and warn_on_replace:
                logger.warning(
                    "EmergencyCheckpoint replaces the %s handler %r%s",
                    sig.name,
                    previous,
                    " (and calls it after its own)" if self._chain else "",
                )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only record: no I/O, no lock, no collective in a signal handler. The one exception
        # reads two bytes of memory: ft-launcher sets one while it stops the workers itself (a
        # restart after a failure), this rank's monitor the other before it terminates this
        # rank for a hang. Then this SIGTERM is no preemption: die as without us, instead of
        # holding the restart up with a save (or a stop proposed to every rank) that the peers
        # cannot join.
        if any(mark is not None and mark[0] == 1 for mark in (self._stop_mark, self._monitor_mark)):
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        if self._signum is None:
            self._signum = signum
            self._signal_wall = time.time()
        if self._chain:
            previous = self._previous.get(signal.Signals(signum))
            if callable(previous):
                previous(signum, frame)

    def close(self) -> None:
        """Restore the signal handlers that were installed before this object (idempotent)."""
        for mark in (self._stop_mark, self._monitor_mark):
            if mark is not None:
                mark.close()
        self._stop_mark = self._monitor_mark = None
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> EmergencyCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state -----------------------------------------------------------------------------------
    @property
    def signal_received(self) -> bool:
        """True once one of the signals reached this rank."""
        return self._signum is not None

    @property
    def stop_step(self) -> int | None:
        """The agreed stop step, once this rank knows it."""
        return self._stop.step if self._stop is not None else None

    def record_save(self, seconds: float) -> None:
        """Tell the budget how long a full save took (from start until durable).

        Args:
            seconds: duration of a complete save; the longest of the last five is expected.
        """
        if seconds >= 0:
            self._save_times.append(float(seconds))

    @property
    def expected_save_s(self) -> float | None:
        """Expected duration of a full save: the longest recent one, else the configured value."""
        if self._save_times:
            return max(self._save_times)
        return self._expected_save_s

    # --- the per-step check ----------------------------------------------------------------------
    def should_stop(self, step: int) -> bool:
        """Return True at the agreed stop step; call once per step with increasing step numbers.

        Costs an attribute check per step, and one store round trip every ``check_every``
        steps (or when this rank got a signal).

        Args:
            step: the step the training loop just finished (the one a save would hold).

        Returns:
            True exactly at the stop step; then call :meth:`save_and_exit`.

        Raises:
            EmergencyCheckpointError: this rank is already past the agreed step (the loop breaks
                the ``max_drift`` assumption).
        """
        stop = self._stop
        if stop is None:
            if self._signum is not None:
                stop = self._propose(step)
            elif (step - self._phase) % self.check_every == 0:
                stop = self._poll()
            if stop is None:
                return False
        if step < stop.step:
            return False
        if step == stop.step:
            return True
        raise EmergencyCheckpointError(
            f"rank {self.rank} is at step {step}, past the agreed emergency stop step "
            f"{stop.step}: its loop ran more than max_drift={self.max_drift} step(s) ahead; "
            f"raise max_drift/lead (now lead={self.lead}, check_every={self.check_every})"
        )

    def _agreement_or_none(self) -> StopAgreement | None:
        if self._agreement is None:
            store = self._store
            if store is None and self.world_size > 1:
                store = default_store()
            self._agreement = StopAgreement(store, self.rank, self.world_size, key_prefix())
        return self._agreement

    def _propose(self, step: int) -> StopRecord | None:
        assert self._signum is not None
        if self._noticed_step is None:
            self._noticed_step = step
        deadline = None
        if self.term_timeout_s is not None and self._signal_wall is not None:
            deadline = self._signal_wall + self.term_timeout_s
        lead = self.lead if self.world_size > 1 else 0
        mine = StopRecord(step + lead, self.rank, signal.Signals(self._signum).name, deadline)
        try:
            agreement = self._agreement_or_none()
            assert agreement is not None
            self._stop = agreement.propose(mine)
        except Exception as exc:
            if not self._store_error_logged:
                self._store_error_logged = True
                logger.error(
                    "rank %d got %s but cannot reach the store to agree on a stop step (retrying "
                    "every step): %s",
                    self.rank,
                    mine.signal,
                    exc,
                )
            return None
        won = self._stop.rank == self.rank and self._stop == mine
        logger.warning(
            "rank %d got %s at step %d; %s emergency stop at step %d",
            self.rank,
            mine.signal,
            step,
            "proposed the" if won else f"rank {self._stop.rank} had already proposed the",
            self._stop.step,
        )
        return self._stop

    def _poll(self) -> StopRecord | None:
        try:
            agreement = self._agreement_or_none()
        except Exception as exc:
            if not self._store_error_logged:
                self._store_error_logged = True
                logger.error("emergency stop: cannot connect to the store: %s", exc)
            return None
        assert agreement is not None
        record = agreement.poll()
        if record is not None:
            self._stop = record
            logger.warning(
                "rank %d learned of the emergency stop at step %d (rank %d got %s)",
                self.rank,
                record.step,
                record.rank,
                record.signal,
            )
        return record

    # --- the stop --------------------------------------------------------------------------------
    def _choose_plan(self, essential: bool) -> tuple[str, str]:
        assert self._stop is not None
        deadline = self._stop.deadline
        expected = self.expected_save_s
        if deadline is None:
            return "full", "no SIGKILL deadline known (no term timeout)"
        left = deadline - time.time() - self._margin_s
        if expected is None:
            return "full", f"{left:.1f} s left before SIGKILL; no earlier save measured"
        need = expected * _SAVE_TIME_SAFETY
        budget = f"expected {expected:.2f} s (x{_SAVE_TIME_SAFETY}), {left:.1f} s left"
        if need <= left:
            return "full", budget
        if self._local_save is not None:
            return "local", f"{budget}: the full save does not fit, saving the local tier"
        if essential:
            return "essential", f"{budget}: the full save does not fit, saving the essential state"
        return "full", (
            f"{budget}: the full save may not finish before SIGKILL and nothing smaller was "
            "given; trying anyway (a killed save leaves the previous checkpoint intact)"
        )

    def save_and_exit(
        self, step: int, state: Any, *, essential: Mapping[str, Any] | None = None
    ) -> NoReturn:
        """Save ``step`` on every rank, wait until it is committed, write the exit info, exit.

        Args:
            step: the agreed stop step (:meth:`should_stop` returned True for it).
            state: the full state (what the manager's ``save`` takes).
            essential: a smaller state saved instead when the full save does not fit the time
                left before SIGKILL (e.g. the model alone).

        Raises:
            EmergencyCheckpointError: ``step`` is not the agreed stop step.
        """
        if self._stop is None or step != self._stop.step:
            raise EmergencyCheckpointError(
                f"save_and_exit({step}) but the agreed stop step is {self.stop_step}"
            )
        started = time.monotonic()
        _events.emit("preempted", step=step)
        agreement = self._agreement_or_none()
        mine, why = self._choose_plan(essential is not None)
        plan = agreement.agree_plan(mine) if agreement is not None else mine
        if plan != mine:
            why = f"adopted rank agreement (this rank chose {mine}: {why})"
        seen = (
            f"this rank got {self._stop.signal} at step {self._noticed_step}"
            if self._noticed_step is not None
            else f"rank {self._stop.rank} got {self._stop.signal}"
        )
        logger.warning(
            "emergency checkpoint of step %d on rank %d (%s): %s save; %s",
            step,
            self.rank,
            seen,
            plan,
            why,
        )
        save: SaveFn = self._save
        payload: Any = state
        if plan == "local" and self._local_save is not None:
            save = self._local_save
        elif plan == "essential" and essential is not None:
            payload = essential
        error: str | None = None
        try:
            handle = save(step, payload)
            wait = getattr(handle, "wait", None)
            if callable(wait):
                wait(self._wait_timeout())
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            error = f"{type(exc).__name__}: {exc}"
            logger.error(
                "emergency checkpoint of step %d failed on rank %d: %s", step, self.rank, error
            )
        took = time.monotonic() - started
        code = self._finish(step, plan, took, error)
        self._exit_fn(code)
        raise SystemExit(code)  # exit_fn returned (a test double): still never return

    def _wait_timeout(self) -> float | None:
        left = self._time_left(0.0)
        return None if left is None else max(1.0, left)

    def _time_left(self, keep_s: float) -> float | None:
        """Seconds until SIGKILL less ``keep_s`` (at least 0); None: no deadline known (then
        the manager's own writer timeout bounds its waits)."""
        if self._stop is None or self._stop.deadline is None:
            return None
        return max(0.0, self._stop.deadline - time.time() - keep_s)

    def _finish(self, step: int, plan: str, took: float, error: str | None) -> int:
        preempted_code = preempted_exit_code()
        code = preempted_code if error is None else 1
        info: dict[str, Any] = {"reason": "preempted", "step": step, "plan": plan}
        if error is not None:
            info = {"reason": "preempt_save_failed", "step": step, "error": error}
        write_exit_info(self.rank, info)
        if error is None:
            logger.warning(
                "emergency checkpoint of step %d saved on rank %d in %.2f s (%s); exiting %d",
                step,
                self.rank,
                took,
                plan,
                code,
            )
        agreement = self._agreement_or_none()
        if agreement is not None:
            left = _FINISH_WAIT_S
            if self._stop is not None and self._stop.deadline is not None:
                left = min(left, max(0.5, self._stop.deadline - time.time() - 0.5))
            agreement.finish(left)
        close_manager(self._manager, self.rank, step, self._time_left(self._margin_s))
        _events.flush()
        for handler in logging.getLogger().handlers:
            handler.flush()
        return code
