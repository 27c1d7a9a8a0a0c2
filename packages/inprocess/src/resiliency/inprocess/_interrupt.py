"""Interrupt the main thread with ``RankShouldRestart`` from the monitor thread.

A real-time signal is sent to the main thread; its handler raises ``RankShouldRestart`` while
the wrapped function runs ("armed"). A signal, unlike an asynchronous exception, also ends a
blocking system call (``sleep``, ``read``, ``poll``) that a GIL-released hang sits in.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from resiliency.inprocess.exception import ConfigError, RankShouldRestart

log = logging.getLogger(__name__)

# The first real-time signals are often taken by threading libraries; stay clear of them.
RESTART_SIGNAL = signal.SIGRTMIN + 4


class Interrupter:
    """Owns the restart signal's handler while a ``CallWrapper`` lives."""

    def __init__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "resiliency.inprocess: call the wrapped function from the main thread (the "
                "restart signal can only be handled there)"
            )
        self._armed = False
        self._reason = ""
        self._main_ident = threading.main_thread().ident
        self._previous = signal.signal(RESTART_SIGNAL, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if self._armed:
            self._armed = False
            raise RankShouldRestart(self._reason)

    def arm(self) -> None:
        """The wrapped function starts: a request will raise in it."""
        self._reason = ""
        self._armed = True

    def disarm(self) -> None:
        """The wrapped function left: a late request is ignored."""
        self._armed = False

    @property
    def armed(self) -> bool:
        """Whether the wrapped function is still running."""
        return self._armed

    def request(self, reason: str) -> None:
        """Ask the main thread to raise ``RankShouldRestart(reason)`` (monitor thread)."""
        self._reason = reason
        if self._armed and self._main_ident is not None:
            signal.pthread_kill(self._main_ident, RESTART_SIGNAL)

    def close(self) -> None:
        """Give the signal back to its previous handler."""
        self._armed = False
        # None: the previous handler was not installed from Python; the default is the closest.
        previous = signal.SIG_DFL if self._previous is None else self._previous
        signal.signal(RESTART_SIGNAL, previous)
