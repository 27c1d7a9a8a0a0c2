"""``inprocess.store``: NVRx 0.4's store classes, for ``Wrapper(store_factory=...)``.

An NVRx user's ``Wrapper(store_factory=inprocess.store.TCPStore, store_kwargs={...})`` (NVRx's
default, often written out) works unchanged: :class:`TCPStore` is a
``torch.distributed.TCPStore`` that takes NVRx's arguments, reads what it is not given from
torch's environment (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``) and is hosted by
rank ``tcp_store_host_rank`` (0). The wrapper's own default store (rank 0's, at
``MASTER_PORT + 1``) is one too, so ``isinstance`` checks on it hold. :class:`FileStore` is
torch's ``FileStore`` under NVRx's name.

NVRx's ``StoreMixin`` is the base class of the stores its wrapper accepts, so a custom store
written for NVRx subclasses it (``class MyStore(inprocess.store.StoreMixin, dist.FileStore)``).
Here :class:`StoreMixin` is that base class without NVRx's methods (its barriers, states and keys
sent with pickle: the internal protocol of its wrapper): the wrapper here uses any store through
torch's ``Store`` API, keeps its own keys and never pickles anything that crosses processes. So
such a subclass imports, is accepted and works; the classes here derive from it too.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch.distributed as dist

from resiliency.inprocess.exception import ConfigError

__all__ = ["FileStore", "StoreMixin", "TCPStore"]

log = logging.getLogger(__name__)


def _from_env(name: str, argument: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigError(
            f"inprocess.store.TCPStore: {name} is not set and no {argument}= was given; start the "
            f"job with torchrun or ft-launcher, or pass {argument}"
        )
    return value


class StoreMixin:
    """The base class of NVRx's stores, kept so that a custom store written for NVRx imports.

    It adds nothing: the wrapper talks to a store through torch's ``Store`` API only (a class
    that defines NVRx's ``send_key``/``get_keys``/``send_state``/``get_states`` has them used by
    ``rank_assignment.Tree``, as in NVRx).
    """


class TCPStore(StoreMixin, dist.TCPStore):
    """A TCPStore hosted by one rank and reached by the others, with NVRx's arguments.

    Args:
        host_name: the hosting rank's address (default ``MASTER_ADDR``).
        port: its port (default ``MASTER_PORT``; the wrapper's default store uses
            ``MASTER_PORT + 1``, so pass that to share the wrapper's port).
        world_size: processes that connect (default ``WORLD_SIZE``).
        timeout: how long to wait to host, to connect, and for each store operation.
        wait_for_workers: whether the host waits in the constructor until every rank connected.
        multi_tenant: several stores of this process share one server on the same port.
        use_libuv: torch's libuv server backend.
        tcp_store_host_rank: the rank that hosts it (default 0, ``TCP_STORE_HOST_RANK``); the
            others connect. A host that cannot bind the port (another process hosts it already)
            connects to that one instead, as NVRx's does.

    Raises:
        ConfigError: a value needed is neither given nor in the environment.
    """

    TCP_STORE_HOST_RANK = 0

    def __init__(  # noqa: PLR0917 - NVRx's signature, positional arguments included
        self,
        host_name: str | None = None,
        port: int | None = None,
        world_size: int | None = None,
        timeout: timedelta = timedelta(seconds=300),
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        use_libuv: bool = True,
        tcp_store_host_rank: int | None = None,
    ) -> None:
        host = host_name if host_name is not None else _from_env("MASTER_ADDR", "host_name")
        port = int(port) if port is not None else int(_from_env("MASTER_PORT", "port"))
        size = (
            int(world_size)
            if world_size is not None
            else int(_from_env("WORLD_SIZE", "world_size"))
        )
        rank = int(_from_env("RANK", "tcp_store_host_rank"))
        self.tcp_store_host_rank = (
            self.TCP_STORE_HOST_RANK if tcp_store_host_rank is None else tcp_store_host_rank
        )
        self.hosting = rank == self.tcp_store_host_rank
        if self.hosting:
            try:
                super().__init__(
                    host,
                    port,
                    size,
                    True,
                    timeout=timeout,
                    wait_for_workers=wait_for_workers,
                    multi_tenant=multi_tenant,
                    use_libuv=use_libuv,
                )
                log.debug("rank %d: hosting the in-process restart store on port %d", rank, port)
                return
            except (RuntimeError, OSError) as exc:
                log.info(
                    "rank %d: port %d is hosted already (%s); connecting to that store instead",
                    rank,
                    port,
                    exc,
                )
                self.hosting = False
        super().__init__(
            host,
            port,
            size,
            False,
            timeout=timeout,
            wait_for_workers=wait_for_workers,
            multi_tenant=multi_tenant,
            use_libuv=use_libuv,
        )

    @classmethod
    def _open(
        cls, host: str, port: int, *, is_master: bool, world_size: int, timeout: timedelta
    ) -> TCPStore:
        """The wrapper's default store: hosted or reached as the wrapper decided, no waiting
        for the other ranks in the constructor (the start barrier waits for them)."""
        store = cls.__new__(cls)
        dist.TCPStore.__init__(
            store,
            host,
            port,
            world_size if is_master else None,
            is_master,
            timeout=timeout,
            wait_for_workers=False,
            use_libuv=True,
        )
        store.tcp_store_host_rank = cls.TCP_STORE_HOST_RANK
        store.hosting = is_master
        return store

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        """The ranks whose loss takes the store down: its host (none for ``-1``)."""
        return () if self.tcp_store_host_rank == -1 else (self.tcp_store_host_rank,)


class FileStore(StoreMixin, dist.FileStore):
    """torch's ``FileStore`` (a file on a shared file system), under NVRx's name."""
