"""Checkpoint tiers: where a ``CheckpointManager`` saves, and how often.

.. code-block:: python

    mgr = CheckpointManager(
        None,
        tiers=[
            LocalTier("/dev/shm/ckpt", every=10, replicas=1),  # node-local, + a peer copy
            PersistentTier("/shared/ckpt", every=500),  # shared file system
        ],
    )

A step is saved on every tier whose ``every`` divides it. ``load`` restores the newest step that
every rank can assemble: its own local copy first, then a copy a peer node holds (sent to it over
``torch.distributed``), then the persistent tier. See docs/checkpoint.md, "Tiers".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["LocalTier", "PersistentTier", "Tier"]


def _check_every(every: int) -> None:
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1, got {every!r}")


@dataclass(frozen=True)
class LocalTier:
    """A node-local directory (``/dev/shm/...``, local NVMe), replicated to peer nodes.

    Args:
        path: the node-local directory; every node uses the same path on its own disk.
        every: save on this tier every N steps.
        replicas: copies of each rank's shard kept on OTHER nodes (0: no replication). The peer
            of a rank is the rank with the same local index on the next node (node order from
            ``GROUP_RANK``).
        keep_last: committed steps kept on the tier (the step being written comes on top).
        node: this rank's failure domain (node); default: ``GROUP_RANK`` from the launcher,
            else the host name. Never derived from the number of GPUs.
        timeout_s: bound on every wait of a replication transfer; a silent peer fails the save
            on every rank with an error that names it.
    """

    path: str | Path
    every: int = 1
    replicas: int = 1
    keep_last: int = 2
    node: str | int | None = None
    timeout_s: float = 300.0

    name = "local"

    def __post_init__(self) -> None:
        _check_every(self.every)
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def node_label(self) -> str:
        """This rank's node (failure domain) label."""
        if self.node is not None:
            return str(self.node)
        group_rank = os.environ.get("GROUP_RANK")
        if group_rank not in (None, ""):
            return str(group_rank)
        return os.uname().nodename


@dataclass(frozen=True)
class PersistentTier:
    """A shared file system every rank sees (a path or a ``file://`` URL).

    Args:
        path: the shared directory, or a ``file://`` URL.
        every: save on this tier every N steps.
        keep_last: committed steps kept (None: all).
        keep_every: also keep forever every step divisible by this number.
    """

    path: str | Path
    every: int = 1
    keep_last: int | None = 3
    keep_every: int | None = None

    name = "persistent"

    def __post_init__(self) -> None:
        _check_every(self.every)

    def local_path(self) -> Path:
        """The directory behind ``path``; raise ``ValueError`` for an unsupported URL."""
        text = str(self.path)
        if "://" not in text:
            return Path(text)
        url = urlparse(text)
        if url.scheme == "file":
            return Path(url.path)
        raise ValueError(
            f"persistent tier {text!r}: only local paths and file:// URLs are supported "
            "(mount object storage with a FUSE file system, or see docs/checkpoint.md)"
        )


Tier = LocalTier | PersistentTier
