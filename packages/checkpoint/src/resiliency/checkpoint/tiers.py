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
from typing import Any
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
    """Storage every rank reaches: a shared file system, or an object store through fsspec.

    A local path or ``file://`` URL is a shared file system: each step is committed by an
    atomic directory rename. Any other fsspec URL (``s3://bucket/ckpt``, ``gs://...``,
    ``az://...``) is an object store: each rank writes its files into a node-local spool
    directory, uploads them under names that carry the save's nonce, and rank 0 uploads the
    step's ``manifest.json`` last, as its commit point. Either way a committed step is a
    standard DCP checkpoint (``dcp.load(checkpoint_id=url)`` reads it). Object stores need
    fsspec (the ``remote`` extra) and the store's fsspec driver (``s3fs``, ``gcsfs``,
    ``adlfs``).

    Args:
        path: the shared directory, or a URL.
        every: save on this tier every N steps.
        keep_last: committed steps kept (None: all).
        keep_every: also keep forever every step divisible by this number.
        storage_options: keyword arguments for the fsspec file system of a URL (credentials,
            ``endpoint_url``...); default: the driver's own (environment, config files).
        spool_dir: node-local directory a rank writes its files into before uploading them,
            and downloads them into when restoring (object stores only); default: the
            system's temporary directory. It needs room for one step's share of the rank.
    """

    path: str | Path
    every: int = 1
    keep_last: int | None = 3
    keep_every: int | None = None
    storage_options: dict[str, Any] | None = None
    spool_dir: str | Path | None = None

    name = "persistent"

    def __post_init__(self) -> None:
        _check_every(self.every)
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be >= 1 or None, got {self.keep_every}")
        if self.storage_options is not None and not self.is_remote():
            raise ValueError(
                f"persistent tier {str(self.path)!r}: storage_options apply to URLs only"
            )

    def is_remote(self) -> bool:
        """Whether ``path`` is an object-store URL (anything but a path or ``file://``)."""
        return _is_url(self.path) and urlparse(str(self.path)).scheme not in ("file", "")

    def local_path(self) -> Path:
        """The directory behind a path or ``file://`` URL; raise ``ValueError`` for others."""
        text = str(self.path)
        if not _is_url(text):
            return Path(text)
        url = urlparse(text)
        if url.scheme == "file":
            return Path(url.path)
        raise ValueError(f"persistent tier {text!r} is an object store, not a directory")


def _is_url(path: str | Path) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a file-system path."""
    return isinstance(path, str) and "://" in path


Tier = LocalTier | PersistentTier
