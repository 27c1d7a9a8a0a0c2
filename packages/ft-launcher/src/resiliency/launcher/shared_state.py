"""What the nodes of one rendezvous round tell each other, through that round's store.

All keys live in the per-round namespace the rendezvous wrapper creates, so nothing leaks from one
round into the next. A single counter (``ft/events``) changes whenever anything below changes, so
a healthy node pays one store round trip per monitoring interval.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from torch.distributed import Store

__all__ = ["RoundState", "SharedRoundState"]

logger = logging.getLogger(__name__)

_EVENTS = "ft/events"
_FAILED = "ft/failed"  # nodes whose workers failed this round (any policy)
_STANDBY = "ft/standby"  # failed nodes waiting outside the group (min-healthy)
_LEFT = "ft/left"  # nodes that left the job (ExcludeThisNode, failed health check)
_SHUTDOWN = "ft/shutdown"  # JSON: a rank asked for ShutdownWorkload
_SHUTDOWN_ACK = "ft/shutdown_ack"
_ARRIVED = "ft/exit_arrived"  # nodes whose workers succeeded (exit barrier)
_DONE = "ft/done"  # the job finished on the healthy nodes
_DONE_ACK = "ft/done_ack"


@dataclass(frozen=True)
class RoundState:
    """A snapshot of the shared counters of one round."""

    failed: int = 0
    standby: int = 0
    left: int = 0
    shutdown: dict[str, Any] | None = None
    done: bool = False


class SharedRoundState:
    """Read and publish this round's cross-node state.

    Args:
        store: the round's store (``WorkerGroup.store`` after the rendezvous).
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._seen_events = -1
        self._cached = RoundState()

    def _counter(self, key: str) -> int:
        return int(self._store.add(key, 0))

    def _bump(self, key: str) -> None:
        self._store.add(key, 1)
        self._store.add(_EVENTS, 1)

    def publish_failed(self) -> None:
        """This node's workers failed this round."""
        self._bump(_FAILED)

    def publish_standby(self) -> None:
        """This node steps aside (min-healthy) and waits outside the group."""
        self._bump(_STANDBY)

    def publish_left(self) -> None:
        """This node leaves the job for good."""
        self._bump(_LEFT)

    def publish_shutdown(self, rank: int | None, desc: str) -> None:
        """A rank of this node asked for ShutdownWorkload: every node must stop."""
        self._store.set(_SHUTDOWN, json.dumps({"rank": rank, "desc": desc}))
        self._store.add(_EVENTS, 1)

    def ack_shutdown(self) -> None:
        """This node saw the shutdown request and stopped its workers."""
        self._store.add(_SHUTDOWN_ACK, 1)

    def shutdown_acks(self) -> int:
        """Return how many nodes acknowledged the shutdown request."""
        return self._counter(_SHUTDOWN_ACK)

    def arrive_at_exit(self) -> None:
        """This node's workers succeeded."""
        self._store.add(_ARRIVED, 1)

    def arrived(self) -> int:
        """Return how many nodes' workers succeeded."""
        return self._counter(_ARRIVED)

    def publish_done(self) -> None:
        """The job finished on the healthy nodes; nodes on standby may exit."""
        self._store.set(_DONE, "1")
        self._store.add(_EVENTS, 1)

    def ack_done(self) -> None:
        """A node on standby saw that the job finished."""
        self._store.add(_DONE_ACK, 1)

    def done_acks(self) -> int:
        """Return how many nodes on standby saw that the job finished."""
        return self._counter(_DONE_ACK)

    def snapshot(self) -> RoundState:
        """Return the current state; one store round trip when nothing changed."""
        events = self._counter(_EVENTS)
        if events == self._seen_events:
            return self._cached
        shutdown = None
        if self._store.check([_SHUTDOWN]):
            shutdown = json.loads(self._store.get(_SHUTDOWN))
        self._cached = RoundState(
            failed=self._counter(_FAILED),
            standby=self._counter(_STANDBY),
            left=self._counter(_LEFT),
            shutdown=shutdown,
            done=bool(self._store.check([_DONE])),
        )
        self._seen_events = events
        return self._cached
