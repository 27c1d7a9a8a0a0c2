"""Interrupt the main thread with ``RankShouldRestart`` from the monitor thread.

A real-time signal is sent to the main thread; its handler raises ``RankShouldRestart`` while
the wrapped function runs ("armed"). A signal, unlike an asynchronous exception, also ends a
blocking system call (``sleep``, ``read``, ``poll``) that a GIL-released hang sits in.

Inside :meth:`Interrupter.deferred` (``CallWrapper.atomic()``) the request is held and raised
when the block ends. That covers the wait to enter the block too: the monitor holds the atomic
lock while it aborts and sends the signal, so a main thread whose collective the abort just
failed, now in a ``finally`` waiting for that lock to close its checkpoint manager, would
otherwise get ``RankShouldRestart`` inside the lock's acquire and skip the clean-up.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
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
        self._delivered = False  # the request was raised in the main thread (this call)
        self._reason = ""
        self._depth = 0  # nested deferred() blocks the main thread is in (or waits to enter)
        self._pending = False  # a request arrived inside them
        self._main_ident = threading.main_thread().ident
        self._previous = signal.signal(RESTART_SIGNAL, self._handle)

    def _handle(self, _signum: int, _frame: FrameType | None) -> None:
        if self._armed:
            if self._depth:
                # raised when the outermost deferred() block ends; a block that never ends
                # is terminated at hard_timeout like any main thread that does not come back
                self._pending = True
                return
            self._armed = False
            self._delivered = True
            raise RankShouldRestart(self._reason)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a request never interrupts: it is raised when the block ends (main thread).

        A block that ends with its own exception propagates that one (the function is leaving
        anyway); the held request is dropped and the interrupter stays armed. A main thread that
        then stays stuck is terminated at ``hard_timeout`` all the same: the monitor escalates
        until the main thread is back in the wrapper, whatever the interrupter's state.
        """
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            deliver = self._pending and self._depth == 0
            if deliver:
                self._pending = False
        if deliver and self._armed:
            self._armed = False
            self._delivered = True
            raise RankShouldRestart(self._reason)

    def arm(self) -> None:
        """The wrapped function starts: a request will raise in it."""
        self._reason = ""
        self._pending = False
        self._delivered = False
        self._armed = True

    def disarm(self) -> None:
        """The wrapped function left: a late request is ignored."""
        self._armed = False

    @property
    def armed(self) -> bool:
        """Whether a request would still raise in the wrapped function."""
        return self._armed

    @property
    def delivered(self) -> bool:
        """Whether the request was raised in the main thread since the function started."""
        return self._delivered

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
