"""The topology tree behind ``rank_assignment.Tree``: its leaves, layers and the reassignment.

Pure data and arithmetic: no store, no processes. Every rank builds the same tree from the same
keys and applies the same terminations, so every rank computes the same assignment without
talking to the others after the first call. ``to_json``/``from_json`` carry the whole tree
through the store for a process that joins later (a rank respawned alone).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from resiliency.inprocess.state import Mode


class LayerFlag(enum.Flag):
    """How a layer's branches take part in replacing a terminated active rank.

    Attributes:
        RESERVE: a spare (inactive) rank anywhere under a branch of this layer may replace an
            active rank terminated under the same branch.
        BACKFILL: under a branch of this layer, the active rank with the highest active rank
            moves into the gap a terminated active rank left.
    """

    RESERVE = enum.auto()
    BACKFILL = enum.auto()


@dataclasses.dataclass
class Layer:
    """One level of the topology tree: how its ranks are grouped and bounded.

    Args:
        min_ranks: a branch with fewer healthy ranks than this is terminated whole.
        max_ranks: at most this many active ranks under a branch; None for no limit.
        key_or_fn: the branch a rank belongs to: a key (a str, int, float, bool, None or a
            tuple of those), or a function of the rank's ``State`` that returns one (e.g.
            ``lambda _: socket.gethostname()``).
        flag: ``LayerFlag.RESERVE`` and/or ``LayerFlag.BACKFILL``, or None.
    """

    min_ranks: int = 1
    max_ranks: int | None = None
    key_or_fn: Hashable | Callable[[Any], Hashable] = ""
    flag: LayerFlag | None = None

    def has(self, flag: LayerFlag) -> bool:
        """Whether this layer carries ``flag``."""
        return self.flag is not None and bool(self.flag & flag)


@dataclasses.dataclass
class Leaf:
    """One rank in the tree, keyed by its initial rank.

    ``spare_since`` orders the spares: a replacement takes the one made spare last (0: not a
    spare).
    """

    initial_rank: int
    rank: int | None
    active_rank: int | None
    mode: Mode
    spare_since: int = 0


@dataclasses.dataclass
class Branch:
    """A node of the tree: a group of ranks sharing a key at one layer."""

    depth: int
    key: str
    parent: Branch | None
    children: dict[str, Branch] = dataclasses.field(default_factory=dict)
    leaves: list[Leaf] = dataclasses.field(default_factory=list)

    def iter_leaves(self) -> Iterator[Leaf]:
        """The ranks under this branch, depth first, in the order they were added."""
        yield from self.leaves
        for child in self.children.values():
            yield from child.iter_leaves()


class RankTree:
    """The tree of every rank, grouped by each layer's key, and its current assignment.

    Args:
        layers: the tree's layers, the root first.
        keys: per initial rank, its key at every layer (the root's key first).
        ranks: per initial rank, its rank when the tree was built (the leaves' order is the
            depth-first order of the keys; ties keep this order).
    """

    def __init__(self, layers: list[Layer], keys: dict[int, list[str]], ranks: dict[int, int]):
        self.layers = layers
        roots = {k[0] for k in keys.values()}
        if len(roots) != 1:
            raise ValueError(
                f"every rank must share one key at the tree's root layer, got {sorted(roots)}"
            )
        self.root = Branch(depth=0, key=roots.pop(), parent=None)
        self.by_initial: dict[int, Leaf] = {}
        self.branch_of: dict[int, Branch] = {}
        for initial in sorted(keys, key=lambda r: ranks[r]):
            branch = self.root
            for depth, key in enumerate(keys[initial][1:], start=1):
                branch = branch.children.setdefault(key, Branch(depth, key, branch))
            leaf = Leaf(initial, ranks[initial], None, Mode.INACTIVE)
            branch.leaves.append(leaf)
            self.by_initial[initial] = leaf
            self.branch_of[initial] = branch
        self.world_size = len(keys)
        self.active_world_size = 0
        self._spare_clock = 0

    def leaves(self) -> list[Leaf]:
        """Every rank, in the tree's depth-first order."""
        return list(self.root.iter_leaves())

    def _ancestors(self, initial: int) -> list[Branch]:
        """The branches above a rank, nearest first (the root last)."""
        chain = []
        branch: Branch | None = self.branch_of[initial]
        while branch is not None:
            chain.append(branch)
            branch = branch.parent
        return chain

    def _make_spare(self, leaf: Leaf) -> None:
        self._spare_clock += 1
        leaf.mode, leaf.active_rank, leaf.spare_since = Mode.INACTIVE, None, self._spare_clock

    def activate_first(self) -> list[int]:
        """Activate ranks depth first while every branch above allows one more.

        Returns:
            The ranks whose depth-first position differs from their rank (a warning's worth).
        """
        active_under: dict[int, int] = {}
        misplaced = []
        for position, leaf in enumerate(self.leaves()):
            if leaf.rank != position:
                misplaced.append(leaf.initial_rank)
            chain = self._ancestors(leaf.initial_rank)
            limits = [self.layers[b.depth].max_ranks for b in chain]
            if all(
                m is None or active_under.get(id(b), 0) < m
                for b, m in zip(chain, limits, strict=True)
            ):
                leaf.mode, leaf.active_rank = Mode.ACTIVE, self.active_world_size
                self.active_world_size += 1
                for branch in chain:
                    active_under[id(branch)] = active_under.get(id(branch), 0) + 1
            else:
                self._make_spare(leaf)
        return misplaced

    def _spread_terminations(self, dead: set[int]) -> set[int]:
        """Add every healthy rank of a branch left with fewer than its ``min_ranks``."""

        def visit(branch: Branch) -> None:
            for child in branch.children.values():
                visit(child)
            healthy = [
                leaf.initial_rank
                for leaf in branch.iter_leaves()
                if leaf.mode is not Mode.TERMINATED and leaf.initial_rank not in dead
            ]
            if len(healthy) < self.layers[branch.depth].min_ranks:
                dead.update(healthy)

        visit(self.root)
        return dead

    def _replace_from_spares(self, leaf: Leaf, spares: dict[int, list[Leaf]]) -> bool:
        """Give a terminated active rank's place to the newest spare of a RESERVE branch.

        ``spares`` caches, per branch, its spares oldest first; a spare taken through another
        branch is skipped when met (it is no longer INACTIVE), so each apply scans a branch's
        leaves once, not once per terminated rank (16k ranks: seconds, not minutes).
        """
        for branch in self._ancestors(leaf.initial_rank):
            if not self.layers[branch.depth].has(LayerFlag.RESERVE):
                return False
            if id(branch) not in spares:
                found = [s for s in branch.iter_leaves() if s.mode is Mode.INACTIVE]
                spares[id(branch)] = sorted(found, key=lambda s: s.spare_since)
            pool = spares[id(branch)]
            while pool and pool[-1].mode is not Mode.INACTIVE:
                pool.pop()
            if pool:
                spare = pool.pop()
                spare.mode, spare.active_rank, spare.spare_since = Mode.ACTIVE, leaf.active_rank, 0
                return True
        return False

    def _backfill_domain(self, initial: int) -> Branch | None:
        """The widest branch reached from a rank through BACKFILL layers only."""
        domain = None
        for branch in self._ancestors(initial):
            if not self.layers[branch.depth].has(LayerFlag.BACKFILL):
                break
            domain = branch
        return domain

    def _backfill(self, unreplaced: list[Leaf]) -> list[int]:
        """Fill gaps inside BACKFILL branches; return the active ranks left vacant."""
        vacant = []
        by_domain: dict[int, tuple[Branch, list[Leaf]]] = {}
        for leaf in unreplaced:
            domain = self._backfill_domain(leaf.initial_rank)
            if domain is None:
                vacant.append(leaf.active_rank)
            else:
                by_domain.setdefault(id(domain), (domain, []))[1].append(leaf)
        for domain, gaps in by_domain.values():
            active = sorted(
                (s for s in domain.iter_leaves() if s.mode is Mode.ACTIVE),
                key=lambda s: s.active_rank or 0,
            )
            movers = active[-len(gaps) :] if len(gaps) <= len(active) else active
            for index, gap in enumerate(gaps):
                if index < len(movers):
                    vacant.append(movers[index].active_rank)
                    movers[index].active_rank = gap.active_rank
                else:
                    vacant.append(gap.active_rank)
        return [r for r in vacant if r is not None]

    def apply(
        self, terminated_ranks: set[int], world_size_filter: Callable[[int], int] | None
    ) -> None:
        """Reassign after ``terminated_ranks`` (numbered by current rank) left the job."""
        by_rank = {leaf.rank: leaf for leaf in self.by_initial.values() if leaf.rank is not None}
        unknown = sorted(terminated_ranks - set(by_rank))
        if unknown:
            raise ValueError(f"terminated ranks {unknown} are not ranks of the tree")
        dead = self._spread_terminations({by_rank[r].initial_rank for r in terminated_ranks})
        ordered = sorted((self.by_initial[i] for i in dead), key=lambda leaf: leaf.rank or 0)
        was_active = [leaf for leaf in ordered if leaf.mode is Mode.ACTIVE]
        for leaf in ordered:
            leaf.mode, leaf.spare_since = Mode.TERMINATED, 0
        spares: dict[int, list[Leaf]] = {}
        unreplaced = [leaf for leaf in was_active if not self._replace_from_spares(leaf, spares)]
        if unreplaced:
            vacant = sorted(self._backfill(unreplaced))
            self.active_world_size -= len(unreplaced)
            for leaf in self.by_initial.values():
                if leaf.mode is Mode.ACTIVE and leaf.active_rank is not None:
                    leaf.active_rank -= bisect.bisect_left(vacant, leaf.active_rank)
        for leaf in ordered:
            leaf.active_rank = None
        if world_size_filter is not None:
            wanted = int(world_size_filter(self.active_world_size))
            if not 0 <= wanted <= self.active_world_size:
                raise ValueError(
                    f"world_size_filter({self.active_world_size}) returned {wanted}: it must be "
                    f"between 0 and its input"
                )
            self.active_world_size = wanted
            for leaf in self.leaves():
                if leaf.mode is Mode.ACTIVE and (leaf.active_rank or 0) >= wanted:
                    self._make_spare(leaf)
        self.world_size -= sum(1 for leaf in ordered if leaf.rank is not None)
        alive = [leaf for leaf in self.leaves() if leaf.mode is not Mode.TERMINATED]
        for leaf in ordered:
            leaf.rank = None
        for rank, leaf in enumerate(alive):
            leaf.rank = rank

    def to_json(self) -> dict[str, Any]:
        """Every leaf's assignment, for a process that joins later (see ``load``)."""
        return {
            "world_size": self.world_size,
            "active_world_size": self.active_world_size,
            "spare_clock": self._spare_clock,
            "leaves": {
                str(leaf.initial_rank): [
                    leaf.rank,
                    leaf.active_rank,
                    leaf.mode.name,
                    leaf.spare_since,
                ]
                for leaf in self.by_initial.values()
            },
        }

    def load(self, table: dict[str, Any]) -> None:
        """Take the assignment ``to_json`` wrote (the tree's shape comes from the keys)."""
        self.world_size = int(table["world_size"])
        self.active_world_size = int(table["active_world_size"])
        self._spare_clock = int(table["spare_clock"])
        for initial, (rank, active, mode, since) in table["leaves"].items():
            leaf = self.by_initial[int(initial)]
            leaf.rank, leaf.active_rank, leaf.mode, leaf.spare_since = (
                rank,
                active,
                Mode[mode],
                since,
            )
