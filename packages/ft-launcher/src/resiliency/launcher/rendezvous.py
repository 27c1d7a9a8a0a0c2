"""A store namespace per restart round, so a restarted group always comes up.

With torch's defaults the workers share the agent's TCP store, which keeps the previous attempt's
keys; a group restarted after ``init_process_group`` (gloo) can then hang or fail (upstream
pytorch/pytorch#135712). :class:`FreshStoreRendezvousHandler` wraps any rendezvous handler and,
for every round:

* namespaces the store handed to the agent by an attempt id every node agrees on
  (``ft_launcher/a<N>/``): with the dynamic (c10d, etcd) backends the store is already unique per
  round and N is 1; with the static backend N counts this node's rendezvous calls, which move in
  lock step on every node because static membership restarts all nodes together;
* tells the workers NOT to use the agent's store (``use_agent_store`` is False): node 0 picks a
  fresh free port per round, its rank-0 worker hosts a new store there, and nothing stale
  survives a restart.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from torch.distributed import PrefixStore, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

__all__ = ["FreshStoreRendezvousHandler"]

logger = logging.getLogger(__name__)


class FreshStoreRendezvousHandler(RendezvousHandler):
    """Delegate to ``inner`` but give every round its own store namespace and worker store.

    Args:
        inner: the rendezvous handler torch built from the ``--rdzv-*`` flags.
        local_addr: the address other nodes reach this node at (``--local-addr``); the fully
            qualified host name when None.
    """

    def __init__(self, inner: RendezvousHandler, local_addr: str | None = None) -> None:
        self._inner = inner
        self._local_addr = local_addr
        self.attempt = 0
        self.round_store: Store | None = None
        #: Asked when torch's launcher closes the rendezvous at the end: a node that left on
        #: its own (excluded, unhealthy, on standby) must not end the job for the others.
        self.keep_open: Callable[[], bool] = lambda: False

    def get_backend(self) -> str:
        """See :class:`RendezvousHandler`."""
        return self._inner.get_backend()

    @property
    def use_agent_store(self) -> bool:
        """Always False: workers get a fresh store per round (see the module docstring)."""
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round and return its info with a per-round store namespace."""
        info = self._inner.next_rendezvous()
        base = info.store
        self.attempt = int(base.add(f"ft_launcher/attempt_of/{info.rank}", 1))
        store = PrefixStore(f"ft_launcher/a{self.attempt}/", base)
        self.round_store = store
        addr = self._local_addr or socket.getfqdn()
        # Node 0 picks a free port and publishes it in this round's namespace; the others read it.
        bootstrap = RendezvousStoreInfo.build(info.rank, store, local_addr=addr)
        logger.info(
            "rendezvous done: node rank %d of %d, fresh worker store at %s:%d",
            info.rank,
            info.world_size,
            bootstrap.master_addr,
            bootstrap.master_port,
        )
        return RendezvousInfo(store, info.rank, info.world_size, bootstrap)

    def is_closed(self) -> bool:
        """See :class:`RendezvousHandler`."""
        return self._inner.is_closed()

    def set_closed(self) -> None:
        """See :class:`RendezvousHandler`."""
        self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        """See :class:`RendezvousHandler`."""
        return self._inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        """See :class:`RendezvousHandler`."""
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        """Close the rendezvous for every node, unless this node left it on its own."""
        if self.keep_open():
            logger.info("this node left on its own: the rendezvous stays open for the others")
            return False
        try:
            return self._inner.shutdown()
        except Exception:  # the store's host may be gone already; nothing left to close
            logger.warning("closing the rendezvous failed", exc_info=True)
            return False
