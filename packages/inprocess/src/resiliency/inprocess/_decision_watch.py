"""Wake the restart barrier's waiters the moment its survivors are decided.

The barrier polls the store (arrivals, terminations, heartbeats) every ``POLL``; a rank that
waits for the last member would see it up to one poll late. So while it waits, a thread
blocks in the store's own ``wait`` for ``<iteration>/decided``, which the first rank to find
every member accounted for writes, on a connection of its own (a blocking wait holds its
client). The barrier's pause ends when the key appears: every rank leaves the barrier within
a store round trip of the last arrival, not a poll later. A store wait that times out logs
C++ warnings, so the thread's one wait lasts the barrier's whole deadline; it ends with the
key, or with the deadline after a barrier that failed.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)


class DecisionWatch:
    """Wait for ``key`` of ``store`` in a thread, on a clone of ``store``.

    Args:
        store: the store the key is written to (any ``torch.distributed.Store``).
        key: the key whose existence ends the wait.
        timeout: how long the thread waits at most (the barrier's deadline).
    """

    def __init__(self, store: Any, key: str, timeout: float) -> None:
        self._found = threading.Event()
        self._failed = False
        self._woke = False
        self._key = key
        self._thread = threading.Thread(
            target=self._wait,
            args=(store, timeout),
            name=f"resiliency-inprocess-watch-{key}",
            daemon=True,  # a failed barrier's watch ends with its deadline, never holds exit
        )
        self._thread.start()

    def _wait(self, store: Any, timeout: float) -> None:
        try:
            clone = store.clone()
            clone.wait([self._key], timedelta(seconds=timeout))
        except Exception as exc:  # the barrier goes on polling: it only loses its early wake
            self._failed = True
            log.debug("waiting for %s in the store ended without it: %s", self._key, exc)
        self._found.set()

    def join(self, timeout: float) -> None:
        """Wait until the thread ended (its wait, and its store connection)."""
        self._thread.join(timeout)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: until the key exists (once; later pauses sleep in
        full, so a barrier that still waits after it cannot spin)."""
        if self._woke:
            time.sleep(seconds)
            return
        start = time.monotonic()
        if self._found.wait(seconds):
            self._woke = True
            if self._failed:  # the wait ended without the key: sleep the rest
                time.sleep(max(0.0, seconds - (time.monotonic() - start)))
