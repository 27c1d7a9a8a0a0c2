"""Follow the round's shared state without polling the store.

A background thread, on its own connection to the store (``Store.clone()``), blocks popping this
node's wake-up queue; when a change is announced it reads the counters once and blocks again. In
steady state a node therefore costs the store one outstanding request, whatever the monitor
interval, and learns about a failure or a shutdown request elsewhere as soon as it is published.
Readers on other threads get the last state without any store operation.

A store that cannot be cloned (one written in Python, such as the etcd store) is read on the
caller's thread instead, at most once per :data:`FALLBACK_READ_INTERVAL` seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from datetime import timedelta
from typing import Any, cast

from torch.distributed import QueueEmptyError, Store

from resiliency.launcher._shared_state import RoundState, SharedRoundState

__all__ = ["FALLBACK_READ_INTERVAL", "WAIT_SLICE", "RoundWatcher"]

logger = logging.getLogger(__name__)

#: Seconds one blocking pop lasts before the watcher pops again (each expiry costs one
#: operation and a warning line from torch's socket layer, so it is long).
WAIT_SLICE = 300.0
#: Seconds between two reads of a store that cannot be watched from a thread.
FALLBACK_READ_INTERVAL = 1.0
#: Seconds :meth:`RoundWatcher.stop` waits for the thread after waking it.
_STOP_WAIT = 5.0


def _is_timeout(exc: RuntimeError) -> bool:
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


class RoundWatcher:
    """The latest :class:`RoundState` of one round, kept current by a background thread.

    Args:
        shared: the round's state (its store is cloned for the thread).
    """

    def __init__(self, shared: SharedRoundState) -> None:
        self._shared = shared
        self._cond = threading.Condition()
        self._state = RoundState()
        self._stopping = False
        self._error: str | None = None
        self._last_read = 0.0
        self._thread: threading.Thread | None = None
        watch_store: Store | None
        try:
            # Store.clone() is public API (torch >= 2.5) missing from torch's type stubs.
            watch_store = cast(Store, cast(Any, shared.store).clone())
            watch_store.set_timeout(timedelta(seconds=WAIT_SLICE))
        except (RuntimeError, NotImplementedError, AttributeError) as exc:
            logger.info(
                "the round's store cannot be cloned (%s); reading it at most once per %.0f s",
                exc,
                FALLBACK_READ_INTERVAL,
            )
            watch_store = None
        self._watch_store = watch_store

    def start(self) -> RoundWatcher:
        """Read the state once and start following it; return ``self``."""
        self._publish(self._shared.read())
        if self._watch_store is not None:
            self._thread = threading.Thread(
                target=self._run, name=f"ft-round-watch-{self._shared.rank}", daemon=True
            )
            self._thread.start()
        return self

    def _publish(self, state: RoundState) -> None:
        with self._cond:
            if state != self._state:
                self._state = dataclasses.replace(state, version=self._state.version + 1)
            self._last_read = time.monotonic()
            self._cond.notify_all()

    def _fail(self, exc: Exception) -> None:
        if not self._stopping:  # the store's host is gone: the round is over for everyone
            logger.warning("stopped following the round's shared state: %s", exc)
        with self._cond:
            self._error = str(exc)
            self._cond.notify_all()

    def _run(self) -> None:
        store = self._watch_store
        assert store is not None
        reader = SharedRoundState(store, self._shared.world, self._shared.rank)
        queue = self._shared.wake_queue
        while not self._stopping:
            try:
                store.queue_pop(queue)
                self._drain(store, queue)
            except RuntimeError as exc:
                if _is_timeout(exc):
                    continue
                self._fail(exc)
                return
            if self._stopping:
                return
            try:
                self._publish(reader.read())
            except RuntimeError as exc:
                self._fail(exc)
                return

    @staticmethod
    def _drain(store: Store, queue: str) -> None:
        """Drop the wake-ups queued behind the one popped: one read covers them all."""
        while True:
            try:
                store.queue_pop(queue, block=False)
            except QueueEmptyError:
                return

    def _read_if_due(self) -> None:
        if self._watch_store is None and (
            time.monotonic() - self._last_read >= FALLBACK_READ_INTERVAL
        ):
            self._publish(self._shared.read())

    def snapshot(self) -> RoundState:
        """Return the latest state (no store operation, except in the fallback mode)."""
        self._read_if_due()
        with self._cond:
            return self._state

    def wait_for_change(self, version: int, timeout: float) -> RoundState:
        """Block until the state is newer than ``version``, or ``timeout`` seconds passed.

        Returns:
            The latest state, changed or not.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._read_if_due()
            with self._cond:
                left = deadline - time.monotonic()
                if self._state.version > version or self._error is not None or left <= 0:
                    return self._state
                if self._watch_store is None:
                    left = min(left, FALLBACK_READ_INTERVAL)
                self._cond.wait(left)

    def stop(self) -> None:
        """Stop following the round: wake this node's thread (and no other node's)."""
        self._stopping = True
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        try:
            self._shared.wake_self()
        except RuntimeError as exc:  # the store is gone, and with it the thread's wait
            logger.debug("could not wake the round watcher: %s", exc)
        thread.join(_STOP_WAIT)
        if thread.is_alive():
            logger.warning(
                "the round watcher did not stop within %.0f s; leaving it (daemon)", _STOP_WAIT
            )
