"""A real round store (a TCPStore on a free port behind the launchers' ``round/`` prefix)."""

from __future__ import annotations

import gc
from datetime import timedelta

from torch.distributed import PrefixStore, TCPStore


class RoundStores:
    """The round's store; every connection to it is closed by :meth:`close`."""

    def __init__(self) -> None:
        self.server: TCPStore | None = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False
        )
        self.server.set_timeout(timedelta(seconds=30))
        self.round: PrefixStore | None = PrefixStore("round/", self.server)

    def close(self) -> None:
        # torch closes a store's socket (and the server) when its last reference goes.
        self.round = None
        self.server = None
        gc.collect()
