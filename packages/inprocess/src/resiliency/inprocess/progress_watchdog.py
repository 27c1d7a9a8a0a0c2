"""NVRx's ``inprocess.progress_watchdog``: a thread that reports the main thread's progress.

The watchdog asks the interpreter, every ``interval``, to run a tiny callback in the main
thread (``Py_AddPendingCall``; the main thread runs it at its next bytecode) and sends the
time it last ran, with the time of the last ``ping()``, as a :class:`Timestamp` to whatever it
was given as ``monitor_process`` (anything with ``send_timestamp(timestamp)``). A main thread
stuck in C code stops the automatic time; a function that stopped pinging stops the manual one.

This package's ``Wrapper`` reads the same clock from its monitor thread (``_progress``), so it
runs no watchdog of its own; the module is here for code and tests written against NVRx's.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from datetime import timedelta
from typing import Protocol

from resiliency.inprocess._progress import CLOCK
from resiliency.inprocess.exception import InternalError

__all__ = ["ProgressWatchdog", "Timestamp", "TimestampSink"]


@dataclasses.dataclass
class Timestamp:
    """One progress report (``time.monotonic()`` seconds).

    Attributes:
        auto: when the main thread last ran Python code.
        manual: when the function last pinged; None before its first ping.
    """

    auto: float | None = None
    manual: float | None = None

    def is_timed_out(self, timeout: timedelta) -> bool:
        """Whether either clock is older than ``timeout``."""
        limit = time.monotonic() - timeout.total_seconds()
        return any(stamp is not None and stamp < limit for stamp in (self.auto, self.manual))


class TimestampSink(Protocol):
    """Where a watchdog sends its timestamps (NVRx's monitor process)."""

    def send_timestamp(self, timestamp: Timestamp) -> None:
        """Receive one timestamp (called from the watchdog's thread and from ``ping()``)."""


class ProgressWatchdog(threading.Thread):
    """Send the main thread's progress to ``monitor_process`` every ``interval``.

    Args:
        rank: the rank, for the thread's name.
        monitor_process: the receiver of the timestamps.
        interval: time between two automatic timestamps.
    """

    def __init__(self, rank: int, monitor_process: TimestampSink, interval: timedelta) -> None:
        super().__init__(name=f"ProgressWatchdog-{rank}", daemon=True)
        self.rank = rank
        self.monitor_process = monitor_process
        self.interval = interval
        self.timestamp = Timestamp(auto=time.monotonic())
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self._stop_requested = threading.Event()
        # How long the main thread waits between two looks at the thread: short, and back in
        # Python code each time, so that a queued pending call can run meanwhile.
        self._spin = sys.getswitchinterval()

    def reset(self) -> None:
        """Start both clocks again now (no ping yet) and send that."""
        self.timestamp = Timestamp(auto=time.monotonic())
        self.send()

    def ping(self) -> None:
        """Record a manual sign of progress now and send it."""
        self.timestamp = Timestamp(auto=self.timestamp.auto, manual=time.monotonic())
        self.send()

    def send(self) -> None:
        """Send the current timestamp (a copy: the receiver may keep it)."""
        with self._send_lock:
            self.monitor_process.send_timestamp(dataclasses.replace(self.timestamp))

    def run(self) -> None:
        """Request a pending call, send the time the last one ran, every ``interval``."""
        while not self._stop_requested.is_set():
            self._wake.wait(self.interval.total_seconds())
            self._wake.clear()
            if self._pause_requested.is_set():
                # Drained first: a call still queued would move the clock after the pause.
                while not CLOCK.synchronized() and not self._stop_requested.is_set():
                    time.sleep(self._spin)
                self._paused.set()
                while self._pause_requested.is_set() and not self._stop_requested.is_set():
                    time.sleep(self._spin)
                self._paused.clear()
            if self._stop_requested.is_set():
                break
            CLOCK.request()
            auto = max(self.timestamp.auto or 0.0, CLOCK.ran_at)
            self.timestamp = Timestamp(auto=auto, manual=self.timestamp.manual)
            self.send()

    def pause_and_synchronize(self) -> None:
        """Pause the thread once no pending call of it is queued, then reset the clocks.

        Called from the main thread, which stays in Python code while it waits, so that the
        queued call can run.
        """
        self._pause_requested.set()
        self._wake.set()
        while not self._paused.wait(self._spin):
            pass
        self.reset()

    def resume(self) -> None:
        """Let a paused thread go on (a thread that is not paused just goes on).

        Raises:
            RuntimeError: the thread is not running (never started, or shut down).
        """
        if not self.is_alive():
            raise RuntimeError(f"{self.name}: resume() of a watchdog that is not running")
        self._pause_requested.clear()
        self._wake.set()
        while self._paused.is_set():
            time.sleep(self._spin)

    def shutdown(self, timeout: float | None = None) -> None:
        """Pause (one last, reset timestamp is sent), stop and join the thread; a no-op if it
        is not running.

        Raises:
            InternalError: the thread did not end within ``timeout`` seconds.
        """
        if not self.is_alive():
            return
        self.pause_and_synchronize()
        self._stop_requested.set()
        self._wake.set()
        self.join(timeout)
        if self.is_alive():
            raise InternalError(f"{self.name} did not stop within {timeout} s")
