"""A daemon thread that bumps this rank's heartbeat counter for the life of the wrapper."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from resiliency.inprocess._restart_store import RestartStore

log = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Bump ``hb/<initial>`` every ``interval`` seconds on its own store client.

    Args:
        open_store: returns a store client for this thread alone.
        initial_rank: this process's initial rank.
        interval: seconds between beats.
    """

    def __init__(
        self, open_store: Callable[[], RestartStore], initial_rank: int, interval: float
    ) -> None:
        super().__init__(name=f"inprocess-heartbeat-{initial_rank}", daemon=True)
        self._open_store = open_store
        self._rank = initial_rank
        self._interval = interval
        self._halt = threading.Event()

    def run(self) -> None:
        """Beat until stopped; a store error is logged once and ends the thread."""
        try:
            store = self._open_store()
            while not self._halt.is_set():
                store.heartbeat(self._rank)
                self._halt.wait(self._interval)
        except Exception as exc:
            # Peers will see this rank's heartbeat stop and treat it as gone: say why here.
            log.error("rank %d: heartbeat thread stopped: %s", self._rank, exc)

    def stop(self, timeout: float) -> None:
        """Stop beating and wait up to ``timeout`` seconds for the thread."""
        self._halt.set()
        self.join(timeout)
