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


class Progress:
    """Last time the main thread ran Python code, and last time it pinged.

    As in NVRx there are two clocks: the automatic one (the pending call ran) and, once the
    function called ``ping()`` in this period, the manual one. The rank is stalled when either
    is stale: a function that pinged once must keep pinging, even while its Python code runs.
    """

    def __init__(self) -> None:
        global _current
        self._last = time.monotonic()
        self._pinged: float | None = None
        self._outstanding = threading.Event()
        _current = self

    def ran(self) -> None:
        """The pending call ran in the main thread."""
        self._last = time.monotonic()
        self._outstanding.clear()

    def ping(self) -> None:
        """Record a manual sign of progress now (``CallWrapper.ping()``)."""
        self._pinged = time.monotonic()

    def reset(self) -> None:
        """Start a new period (a new iteration, a barrier left): no ping in it yet."""
        self._outstanding.clear()
        self._last = time.monotonic()
        self._pinged = None

    def poke(self) -> None:
        """Ask the main thread to record progress at its next bytecode (monitor thread)."""
        if self._outstanding.is_set():
            return
        self._outstanding.set()
        if _add_pending_call(_CALLBACK, None) != 0:
            # The interpreter's queue is full; try again at the next poke.
            self._outstanding.clear()

    def stalled_for(self) -> float:
        """Seconds since the main thread last made progress, by the staler of the two clocks."""
        now = time.monotonic()
        manual = 0.0 if self._pinged is None else now - self._pinged
        return max(now - self._last, manual)


_current: Progress | None = None


def _pending(_arg: int | None) -> int:
    progress = _current
    if progress is not None:
        progress.ran()
    return 0


# Module-level on purpose: the interpreter keeps only a raw pointer to the callback, which may
# still be queued after the Progress that asked for it is gone.
_CALLBACK = _PENDING_CALL(_pending)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [_PENDING_CALL, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int
