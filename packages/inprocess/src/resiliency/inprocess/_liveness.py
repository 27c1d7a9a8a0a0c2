"""Which peers stopped sending heartbeats (dead process, lost node)."""

from __future__ import annotations

import time

from resiliency.inprocess._restart_store import RestartStore


class Liveness:
    """Track the heartbeat counters of peers; report those that stopped moving.

    Args:
        store: the wrapper's keys on a client owned by the calling thread.
        timeout: seconds without a counter change after which a peer is declared dead.
    """

    def __init__(self, store: RestartStore, timeout: float) -> None:
        self.store = store
        self.timeout = timeout
        self._seen: dict[int, tuple[int, float]] = {}

    def stale(self, peers: list[int]) -> dict[int, float]:
        """Return {initial rank: seconds since its heartbeat last moved} for dead peers."""
        now = time.monotonic()
        dead = {}
        for rank, count in self.store.heartbeats(peers).items():
            previous = self._seen.get(rank)
            if previous is None or previous[0] != count:
                self._seen[rank] = (count, now)
                continue
            silent = now - previous[1]
            if silent > self.timeout:
                dead[rank] = silent
        return dead
