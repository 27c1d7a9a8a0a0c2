"""What the nodes of one rendezvous round tell each other, through that round's store.

All keys live in the per-round namespace the rendezvous wrapper creates, so nothing leaks from one
round into the next. Whoever changes a counter then pushes a wake-up into every node's queue
(``ft/wake/<group rank>``), so a node learns about changes by *blocking* on its own queue
(:class:`~resiliency.launcher._round_watch.RoundWatcher`) instead of polling the store: changes are
rare (a failure, a shutdown request), so their cost, one push per node, is paid only then.
Acknowledgements and the exit barrier are numbered keys too: whoever waits for them blocks in
``store.wait`` with a deadline, and the store answers when the last one arrives.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from torch.distributed import Store

from resiliency.launcher.errors import LauncherError

__all__ = [
    "ACK_WAIT_SECONDS",
    "ExchangeStore",
    "RoundState",
    "SharedRoundState",
    "StoreWaitTimeoutError",
    "wait_keys",
]

logger = logging.getLogger(__name__)

_WAKE = "ft/wake/"  # + group rank: a queue; one entry per change that node should read
_FAILED = "ft/failed"  # nodes whose workers failed this round (any policy)
_STANDBY = "ft/standby"  # failed nodes waiting outside the group (min-healthy)
_LEFT = "ft/left"  # nodes that left the job (ExcludeThisNode, failed health check)
_SHUTDOWN = "ft/shutdown"  # JSON: a rank asked for ShutdownWorkload
_SHUTDOWN_ACK = "ft/shutdown_ack/"  # + i: the i-th node that stopped after a shutdown request
#: How long a node waits for the others to acknowledge a shutdown or a release.
ACK_WAIT_SECONDS = 5.0

_EXIT_COUNT = "ft/exit_count"  # nodes done with this round: succeeded, on standby or left
_EXIT_OPEN = "ft/exit_open"  # set by the node that completes the exit count
_DONE = "ft/done"  # the job finished on the healthy nodes
_DONE_ACK = "ft/done_ack/"  # + i: the i-th node on standby that saw the job finish


class StoreWaitTimeoutError(LauncherError, TimeoutError):
    """A blocking wait on the round's store reached its deadline."""


@dataclass(frozen=True)
class RoundState:
    """A snapshot of the shared counters of one round.

    Attributes:
        version: counts the changes this node has read; a later snapshot has a larger one.
    """

    failed: int = 0
    standby: int = 0
    left: int = 0
    shutdown: dict[str, Any] | None = None
    done: bool = False
    version: int = field(default=0, compare=False)


class ExchangeStore(Protocol):
    """The store operations the job-wide exchanges use: a c10d ``Store`` (the round's) or a
    ``BackendStore`` (the supervisor's backend). Failures raise ``RuntimeError``."""

    def set(self, key: str, value: str, /) -> None: ...

    def get(self, key: str, /) -> bytes: ...

    def add(self, key: str, value: int, /) -> int: ...

    def check(self, keys: list[str], /) -> bool: ...

    def multi_get(self, keys: list[str], /) -> list[bytes]: ...

    def wait(self, keys: list[str], timeout: timedelta, /) -> None: ...


def _is_timeout(exc: RuntimeError) -> bool:
    # torch raises DistStoreError (a RuntimeError) on a wait deadline; other RuntimeErrors
    # (connection reset: the store's host is gone) are real failures.
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()


def wait_keys(store: ExchangeStore | Store, keys: list[str], timeout: float, what: str) -> None:
    """Block until every key exists, or raise :class:`StoreWaitTimeoutError` naming ``what``."""
    if not keys:
        return
    try:
        store.wait(keys, timedelta(seconds=max(timeout, 0.001)))
    except RuntimeError as exc:
        if _is_timeout(exc):
            raise StoreWaitTimeoutError(f"waited {timeout:.0f} s for {what}") from None
        raise


class SharedRoundState:
    """Read and publish this round's cross-node state.

    Args:
        store: the round's store (``WorkerGroup.store`` after the rendezvous).
        world: the number of nodes in the round.
        rank: this node's group rank in the round.
        exchange: where the job-wide failure and hang verdicts are exchanged: the supervisor's
            backend when one is configured (``exchange_store_for``), else the round's store.
    """

    def __init__(
        self,
        store: Store,
        world: int = 1,
        rank: int = 0,
        exchange: ExchangeStore | None = None,
    ) -> None:
        self.store = store
        self.world = world
        self.rank = rank
        self.exchange: ExchangeStore = exchange if exchange is not None else store

    @property
    def wake_queue(self) -> str:
        """This node's wake-up queue."""
        return f"{_WAKE}{self.rank}"

    # --- changes every node watches -----------------------------------------------------------
    def _announce(self) -> None:
        for rank in range(self.world):
            self.store.queue_push(f"{_WAKE}{rank}", "change")

    def _bump(self, key: str) -> None:
        self.store.add(key, 1)
        self._announce()

    def publish_failed(self) -> None:
        """This node's workers failed this round."""
        self._bump(_FAILED)

    def publish_standby(self) -> None:
        """This node steps aside (min-healthy) and waits outside the group."""
        # Counted as standing by before it counts as done: a node the exit barrier releases
        # must see it, to release it in turn.
        self._bump(_STANDBY)
        self._count_done()  # it will not reach the exit barrier: count it now

    def publish_left(self) -> None:
        """This node leaves the job for good."""
        self._bump(_LEFT)
        self._count_done()

    def publish_shutdown(self, rank: int | None, desc: str) -> None:
        """A rank of this node asked for ShutdownWorkload: every node must stop."""
        self.store.set(_SHUTDOWN, json.dumps({"rank": rank, "desc": desc}))
        self._announce()

    def publish_done(self) -> None:
        """The job finished on the healthy nodes; nodes on standby may exit."""
        self.store.set(_DONE, "1")
        self._announce()

    def wake_self(self) -> None:
        """Wake this node's own watcher only (to stop it)."""
        self.store.queue_push(self.wake_queue, "stop")

    def read(self) -> RoundState:
        """Read the current state from the store (a handful of operations)."""
        shutdown = None
        if self.store.check([_SHUTDOWN]):
            shutdown = json.loads(self.store.get(_SHUTDOWN))
        return RoundState(
            failed=int(self.store.add(_FAILED, 0)),
            standby=int(self.store.add(_STANDBY, 0)),
            left=int(self.store.add(_LEFT, 0)),
            shutdown=shutdown,
            done=bool(self.store.check([_DONE])),
        )

    def standby_count(self) -> int:
        """Read how many nodes stand by (one operation)."""
        return int(self.store.add(_STANDBY, 0))

    # --- acknowledgements -----------------------------------------------------------------------
    def _ack(self, prefix: str) -> None:
        # The i-th acknowledgement sets key prefix + i, so a waiter blocks on keys 1..n.
        self.store.set(f"{prefix}{int(self.store.add(prefix, 1))}", "1")

    def _wait_acks(self, prefix: str, nodes: int, timeout: float, what: str) -> None:
        keys = [f"{prefix}{i}" for i in range(1, nodes + 1)]
        wait_keys(self.store, keys, timeout, f"{nodes} node(s) {what}")

    def ack_shutdown(self) -> None:
        """This node saw the shutdown request and stopped its workers."""
        self._ack(_SHUTDOWN_ACK)

    def wait_shutdown_acks(self, nodes: int, timeout: float) -> None:
        """Block until ``nodes`` nodes acknowledged the shutdown request.

        Raises:
            StoreWaitTimeoutError: fewer acknowledged within ``timeout`` seconds.
        """
        self._wait_acks(_SHUTDOWN_ACK, nodes, timeout, "to acknowledge the shutdown")

    def ack_done(self) -> None:
        """A node on standby saw that the job finished."""
        self._ack(_DONE_ACK)

    def wait_done_acks(self, nodes: int, timeout: float) -> None:
        """Block until ``nodes`` nodes on standby saw that the job finished.

        Raises:
            StoreWaitTimeoutError: fewer acknowledged within ``timeout`` seconds.
        """
        self._wait_acks(_DONE_ACK, nodes, timeout, "on standby to see the job finish")

    # --- exit barrier ---------------------------------------------------------------------------
    def _count_done(self) -> None:
        # Whichever node completes the count (one that finished, stood by or left) opens the
        # barrier; the others block on that one key.
        if int(self.store.add(_EXIT_COUNT, 1)) >= self.world:
            self.store.set(_EXIT_OPEN, "1")

    def arrive_at_exit(self) -> None:
        """This node's workers succeeded; open the barrier if this completes the round."""
        self._count_done()

    def wait_exit(self, timeout: float) -> None:
        """Block until every node of the round finished, stood by or left.

        Raises:
            StoreWaitTimeoutError: the other nodes were not done within ``timeout`` seconds.
        """
        wait_keys(self.store, [_EXIT_OPEN], timeout, "the other nodes to finish (exit barrier)")
