"""Who is where and who holds what: node topology, replica peers, local-tier holdings.

Local-tier layout (one directory per node, shared by the node's ranks)::

    <local>/step_<N:09d>/shard_<r>/     rank r's shard of step N: a standard one-rank DCP
                                        checkpoint + manifest.json (files, CRC-32s, nonce, shard)
    <local>/.tmp-step_<N>-shard_<r>-<nonce>/   being written or received

A shard directory is named by the GLOBAL rank that wrote it, never by the node it lies on, so a
node whose ranks were permuted by a re-rendezvous still finds the right files, wherever they are.
Small JSON exchanges go through byte tensors (``_json_collectives``: no pickle crosses a process
boundary).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resiliency.checkpoint import _layout
from resiliency.checkpoint._collectives.json_exchange import all_gather_json

logger = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d{9,})$")
_SHARD_RE = re.compile(r"^shard_(\d+)$")


def shard_dir(root: Path, step: int, shard: int) -> Path:
    """The committed directory of ``shard`` of ``step`` on a local tier."""
    return _layout.step_dir(root, step) / f"shard_{shard}"


def tmp_shard_dir(root: Path, step: int, shard: int, nonce: str) -> Path:
    """A temporary directory a shard is written or received into."""
    return root / f".tmp-step_{step}-shard_{shard}-{nonce}"


def _node_key(label: str) -> tuple[int, int, str]:
    return (0, int(label), "") if label.isdigit() else (1, 0, label)


@dataclass
class Topology:
    """Every rank's node and index on its node; the replica peers derived from them."""

    rank: int
    labels: list[str]  # per rank: its node label

    @classmethod
    def build(cls, label: str, group: dist.ProcessGroup | None) -> Topology:
        rank = dist.get_rank(group) if group is not None else 0
        return cls(rank, [str(x) for x in all_gather_json(label, group)])

    @property
    def nodes(self) -> list[str]:
        return sorted(set(self.labels), key=_node_key)

    def ranks_on(self, node: str) -> list[int]:
        return [r for r, label in enumerate(self.labels) if label == node]

    def peers_of(self, rank: int, replicas: int) -> list[int]:
        """The ranks that keep copies of ``rank``'s shard, each on a different other node."""
        nodes = self.nodes
        n = nodes.index(self.labels[rank])
        index = self.ranks_on(nodes[n]).index(rank)
        peers = []
        for k in range(1, min(replicas, len(nodes) - 1) + 1):
            ranks = self.ranks_on(nodes[(n + k) % len(nodes)])
            peers.append(ranks[index % len(ranks)])
        return peers

    def sources_of(self, rank: int, replicas: int) -> list[int]:
        """The ranks whose shards ``rank`` keeps a copy of."""
        return [r for r in range(len(self.labels)) if rank in self.peers_of(r, replicas)]

    def node_of(self, rank: int) -> str:
        return self.labels[rank]


def committed_steps(root: Path) -> list[int]:
    """Step directories on a local tier, ascending (a listing)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_STEP_RE.match, names) if m)


def quick_check(directory: Path) -> dict[str, Any] | None:
    """The manifest of a shard directory when it exists and every file has its size, else None."""
    try:
        manifest = _layout.read_manifest(directory)
    except ValueError as exc:
        logger.debug("%s", exc)
        return None
    for name, entry in manifest["files"].items():
        try:
            if (directory / name).stat().st_size != entry["size"]:
                logger.warning("%s: size differs from its manifest (torn)", directory / name)
                return None
        except OSError:
            logger.warning("%s: missing", directory / name)
            return None
    return manifest


def scan(root: Path, world: int) -> list[list[Any]]:
    """What a node's local tier holds: ``[step, shard, nonce, bytes]`` per plausible shard copy."""
    held: list[list[Any]] = []
    for step in committed_steps(root):
        try:
            names = os.listdir(_layout.step_dir(root, step))
        except OSError:
            continue
        for name in names:
            match = _SHARD_RE.match(name)
            if not match:
                continue
            shard = int(match.group(1))
            manifest = quick_check(shard_dir(root, step, shard))
            if (
                manifest is None
                or manifest.get("world_size") != world
                or manifest.get("shard") != shard
                or manifest.get("step") != step
            ):
                continue
            held.append([step, shard, str(manifest["nonce"]), int(manifest.get("bytes", 0))])
    return held
