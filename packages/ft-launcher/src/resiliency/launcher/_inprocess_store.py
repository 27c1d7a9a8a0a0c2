"""The Wrapper's store, hosted by node 0's launcher under ``--ft-inprocess-respawn``.

``resiliency.inprocess.Wrapper``'s default store is a TCPStore hosted by rank 0 (NVRx's choice),
which dies with rank 0: rank 0 then cannot be respawned alone, its death ends the store the
others wait in. Under ``--ft-inprocess-respawn`` the launcher of node 0 hosts that store instead,
for the whole rendezvous round, on a free port it publishes in the round's store; every node's
launcher hands the port to its workers (``INPROCESS_STORE_PORT_ENV``) and every rank connects to
it as a client at ``MASTER_ADDR`` (node 0's address).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from torch.distributed import Store, TCPStore

from resiliency.launcher._contracts import INPROCESS_STORE_PORT_ENV

__all__ = ["InprocessStoreHost"]

logger = logging.getLogger(__name__)

_PORT_KEY = "inprocess_store_port"


class InprocessStoreHost:
    """Host (on node 0) or look up (elsewhere) the Wrapper's store of each round."""

    def __init__(self, timeout: timedelta) -> None:
        self._timeout = timeout
        self._server: TCPStore | None = None
        self.port: int | None = None

    def next_round(self, round_store: Store, group_rank: int, master_addr: str) -> None:
        """Start this round's store on node 0 (closing the last round's) or read its port.

        Raises:
            RuntimeError: node 0's port could not be read within the timeout (from torch).
        """
        self.close()
        if group_rank == 0:
            # Port 0: the server binds a free port itself (no window for another socket to take
            # one probed first); its number goes to the other nodes through the round's store.
            self._server = TCPStore(
                master_addr,
                0,
                None,
                True,
                timeout=self._timeout,
                wait_for_workers=False,
                use_libuv=True,
            )
            port = self._server.port
            round_store.set(_PORT_KEY, str(port))
            logger.info(
                "hosting the in-process restart store at %s:%d for this round "
                "(--ft-inprocess-respawn: it outlives every rank, rank 0 included)",
                master_addr,
                port,
            )
        else:
            port = int(round_store.get(_PORT_KEY))
        self.port = port

    def worker_env(self) -> dict[str, str]:
        """The port for every worker's Wrapper (empty before the first round)."""
        return {} if self.port is None else {INPROCESS_STORE_PORT_ENV: str(self.port)}

    def close(self) -> None:
        """Stop hosting (the round is over)."""
        self._server = None  # torch's TCPStore server stops when its last reference goes
        self.port = None
