"""Progress of the main thread, seen from the monitor thread.

The monitor asks the interpreter to run a tiny callback in the main thread
(``Py_AddPendingCall``); the main thread runs it at its next bytecode. If the main thread is
stuck in C (a collective, a GIL-released sleep), the callback does not run and the last
progress time stops moving. ``CallWrapper.ping()`` starts a second, manual clock.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time

log = logging.getLogger(__name__)

_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class MainThreadClock:
    """When the main thread last ran a pending call; one per process (``CLOCK``).

    ``request()`` queues the callback unless one is still queued, so any number of watchers
    (the Wrapper's monitor, a ``ProgressWatchdog``) share one outstanding call.
    """

    def __init__(self) -> None:
        self.ran_at = time.monotonic()
        self.scheduled = 0
        self.completed = 0
        self._lock = threading.Lock()

    def request(self) -> None:
        """Ask the main thread to record the time at its next bytecode."""
        with self._lock:
            if self.scheduled != self.completed:
                return
            # Counted before queueing: the main thread may run the call before this returns.
            self.scheduled += 1
            if _add_pending_call(_CALLBACK, None) != 0:
                # The interpreter's queue is full; the next request tries again.
                self.scheduled -= 1

    def synchronized(self) -> bool:
        """Whether no requested call is still waiting for the main thread."""
        return self.scheduled == self.completed

    def _ran(self) -> None:
        self.ran_at = time.monotonic()
        self.completed += 1


CLOCK = MainThreadClock()


class Progress:
    """Last time the main thread ran Python code, and last time it pinged.

    As in NVRx there are two clocks: the automatic one (the pending call ran) and, once the
    function called ``ping()`` in this period, the manual one. The rank is stalled when either
    is stale: a function that pinged once must keep pinging, even while its Python code runs.
    """

    def __init__(self) -> None:
        self._since = time.monotonic()
        self._pinged: float | None = None
        self._suspended = 0  # nesting depth of disable_hang_protection()

    def suspend(self) -> None:
        """Report no stall until ``resume()`` (calls nest)."""
        self._suspended += 1

    def resume(self) -> None:
        """Count progress again from now: the time spent suspended is not a stall."""
        self._suspended -= 1
        if not self._suspended:
            self._since = time.monotonic()
            if self._pinged is not None:
                self._pinged = self._since

    def ping(self) -> None:
        """Record a manual sign of progress now (``CallWrapper.ping()``)."""
        self._pinged = time.monotonic()

    def reset(self) -> None:
        """Start a new period (a new iteration, a barrier left): no ping in it yet."""
        self._since = time.monotonic()
        self._pinged = None

    def poke(self) -> None:
        """Ask the main thread to record progress at its next bytecode (monitor thread)."""
        CLOCK.request()

    def stalled_for(self) -> float:
        """Seconds since the main thread last made progress, by the staler of the two clocks."""
        if self._suspended:
            return 0.0
        now = time.monotonic()
        manual = 0.0 if self._pinged is None else now - self._pinged
        return max(now - max(self._since, CLOCK.ran_at), manual)


def _pending(_arg: int | None) -> int:
    CLOCK._ran()
    return 0


# Module-level on purpose: the interpreter keeps only a raw pointer to the callback, which may
# still be queued when its requester is gone.
_CALLBACK = _PENDING_CALL(_pending)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING_CALL, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int
