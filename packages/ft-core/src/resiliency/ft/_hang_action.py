"""What the monitor does to a hung worker: dump its stacks, terminate it, kill it.

The same machine, with ``terminate=False``, only collects a stack dump (the launcher asks for the
stacks of a hung rank's peers, to tell which rank the others wait for).

A small state machine that never blocks: the server's loop calls :meth:`HangAction.poll` whenever
it wakes, so frames keep being drained while the worker dumps its stacks and shuts down.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from resiliency.ft._proc import pid_alive
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.termination_mark import TerminationMark

logger = logging.getLogger(__name__)

#: The dump is complete once the file has stopped growing for this long.
_DUMP_SETTLE_S = 0.1
#: How often a pending phase re-checks the file or the process.
POLL_INTERVAL_S = 0.05
#: How long to wait for the kernel to reap a worker after SIGKILL before reporting anyway.
_SIGKILL_WAIT_S = 5.0
#: The most of a dump file that is read and logged.
_MAX_DUMP_BYTES = 256 * 1024


class HangAction:
    """Escalation for one hung worker.

    Args:
        pid: The worker's pid.
        start_time: Its /proc start time when it was registered (pid-reuse guard), or None.
        who: How the logs name it, e.g. ``"rank 3 (pid 1234)"``.
        dump_path: The file its client registered for stack dumps, or None for no dump.
        dump_signal: The signal that triggers the dump.
        dump_timeout: How long to wait for the dump.
        termination_signal: The signal sent after the dump.
        grace_period: Time between the termination signal and SIGKILL.
        on_dump: Called once with the dump text (None when there is none) before the worker is
            signalled to terminate.
        on_done: Called once with the name of the signal that ended the worker (None when it
            was already gone, or when ``terminate`` is False).
        terminate: False to stop after the dump and leave the worker running.
        termination_mark: Set just before the termination signal and cleared once the worker
            is gone, so that the worker can tell this termination from a preemption.
    """

    def __init__(
        self,
        *,
        pid: int,
        start_time: int | None,
        who: str,
        dump_path: Path | None,
        dump_signal: signal.Signals,
        dump_timeout: float,
        termination_signal: signal.Signals,
        grace_period: float,
        on_dump: Callable[[str | None], None],
        on_done: Callable[[str | None], None],
        terminate: bool = True,
        termination_mark: TerminationMark | None = None,
    ) -> None:
        self.pid = pid
        self._start_time = start_time
        self._who = who
        self._dump_path = dump_path
        self._dump_signal = dump_signal
        self._dump_timeout = dump_timeout
        self._term_signal = termination_signal
        self._grace = grace_period
        self._on_dump = on_dump
        self._on_done = on_done
        self._terminate = terminate
        self._mark = termination_mark
        self.phase = "new"
        self._deadline = 0.0
        self._dump_size = -1
        self._dump_changed_at = 0.0
        self._last_signal: str | None = None

    @classmethod
    def from_config(
        cls,
        cfg: FaultToleranceConfig,
        *,
        pid: int,
        start_time: int | None,
        who: str,
        dump_path: Path | None,
        on_dump: Callable[[str | None], None],
        on_done: Callable[[str | None], None],
        terminate: bool = True,
        termination_mark: TerminationMark | None = None,
    ) -> HangAction:
        """Build the escalation with the signals and delays of ``cfg``; arguments as above."""
        return cls(
            pid=pid,
            start_time=start_time,
            who=who,
            dump_path=dump_path,
            dump_signal=cfg.stack_dump_signal,
            dump_timeout=cfg.stack_dump_timeout,
            termination_signal=cfg.rank_termination_signal,
            grace_period=cfg.termination_grace_period,
            on_dump=on_dump,
            on_done=on_done,
            terminate=terminate,
            termination_mark=termination_mark,
        )

    @property
    def done(self) -> bool:
        """True once the worker is gone and reported."""
        return self.phase == "done"

    def next_wakeup(self, now: float) -> float | None:
        """Return when :meth:`poll` next needs to run (None once done)."""
        if self.phase == "done":
            return None
        return min(self._deadline, now + POLL_INTERVAL_S)

    def _alive(self) -> bool:
        return pid_alive(self.pid, self._start_time)

    def _signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` if the worker still runs; return False when it is already gone."""
        if not self._alive():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        self._last_signal = sig.name
        return True

    def start(self, now: float) -> None:
        """Begin: request the stack dump, or go straight to termination."""
        if self._dump_path is not None:
            try:
                os.truncate(self._dump_path, 0)
            except OSError as exc:
                logger.warning("cannot truncate the stack dump file %s: %s", self._dump_path, exc)
            if self._signal(self._dump_signal):
                logger.info(
                    "asked %s to dump its Python stacks (%s)", self._who, self._dump_signal.name
                )
                # The dump signal is not the termination, whatever the kernel reports.
                self._last_signal = None
                self.phase = "dump"
                self._deadline = now + self._dump_timeout
                self._dump_changed_at = now
                return
        self._finish_dump(now, None)

    def poll(self, now: float) -> None:
        """Advance the escalation; call whenever the server wakes."""
        if self.phase == "dump":
            self._poll_dump(now)
        elif self.phase in ("terminate", "kill"):
            self._poll_exit(now)

    def _poll_dump(self, now: float) -> None:
        assert self._dump_path is not None
        try:
            size = self._dump_path.stat().st_size
        except OSError:
            size = 0
        if size != self._dump_size:
            self._dump_size = size
            self._dump_changed_at = now
        settled = size > 0 and now - self._dump_changed_at >= _DUMP_SETTLE_S
        if settled or now >= self._deadline or not self._alive():
            if size == 0:
                logger.warning(
                    "%s wrote no stack dump within %.1f s", self._who, now - self._dump_changed_at
                )
            self._finish_dump(now, self._read_dump() if size > 0 else None)

    def _read_dump(self) -> str | None:
        assert self._dump_path is not None
        try:
            with open(self._dump_path, "rb") as f:
                raw = f.read(_MAX_DUMP_BYTES + 1)
        except OSError as exc:
            logger.warning("cannot read the stack dump file %s: %s", self._dump_path, exc)
            return None
        text = raw[:_MAX_DUMP_BYTES].decode("utf-8", "replace")
        if len(raw) > _MAX_DUMP_BYTES:
            text += f"\n[... stack dump truncated at {_MAX_DUMP_BYTES} bytes]"
        return text

    def _finish_dump(self, now: float, dump: str | None) -> None:
        self._on_dump(dump)
        if not self._terminate:
            self._report_done()
            return
        if self._mark is not None:
            self._mark.set(True)
        if self._signal(self._term_signal):
            logger.error("sent %s to %s", self._term_signal.name, self._who)
            self.phase = "terminate"
            self._deadline = now + self._grace
        else:
            logger.warning("%s exited before it could be terminated", self._who)
            self._report_done()

    def _poll_exit(self, now: float) -> None:
        if not self._alive():
            logger.error("%s is gone (ended by %s)", self._who, self._last_signal or "itself")
            self._report_done()
        elif now >= self._deadline and self.phase == "terminate":
            logger.error(
                "%s still runs %.1f s after %s; sending SIGKILL",
                self._who,
                self._grace,
                self._term_signal.name,
            )
            if self._signal(signal.SIGKILL):
                self.phase = "kill"
                self._deadline = now + _SIGKILL_WAIT_S
            else:
                self._report_done()
        elif now >= self._deadline:
            logger.error(
                "%s survives SIGKILL for %.1f s (uninterruptible sleep?); reporting it killed",
                self._who,
                _SIGKILL_WAIT_S,
            )
            self._report_done()

    def _report_done(self) -> None:
        self.phase = "done"
        self._clear_mark()
        self._on_done(self._last_signal)

    def cancel(self) -> None:
        """Stop escalating (the launcher took over the worker)."""
        self.phase = "done"
        self._clear_mark()

    def _clear_mark(self) -> None:
        if self._mark is not None:
            self._mark.set(False)
