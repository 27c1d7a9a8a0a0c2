"""Rank assignment: who is who after a restart, and which ranks call the function.

A ``RankAssignment`` takes a ``RankAssignmentCtx`` (the rank's state, the store, and the ranks
of the previous iteration that left the job) and returns it updated. Chain several with
``Compose``: ``Compose(ActivateAllRanks(), ShiftRanks())`` (the default) first closes the gaps
(``ShiftRanks``), then makes every remaining rank active. ``RankFilter`` subclasses only choose
which ranks are active; put them after (left of, in ``Compose``) the ones that renumber.
``Tree`` does both from a topology of layers (e.g. the job, then each host) and is used alone;
``FilterCountGroupedByKey`` terminates whole groups that lost ranks.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import itertools
import json
import logging
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from resiliency.inprocess import _rank_keys, exception
from resiliency.inprocess._rank_tree import Layer, LayerFlag, RankTree
from resiliency.inprocess.exception import ConfigError, RestartError
from resiliency.inprocess.state import Mode, State

__all__ = [
    "ActivateAllRanks",
    "ActiveWorldSizeDivisibleBy",
    "FillGaps",
    "FilterCountGroupedByKey",
    "Layer",
    "LayerFlag",
    "MaxActiveWorldSize",
    "RankAssignment",
    "RankAssignmentCtx",
    "RankDiscarded",
    "RankFilter",
    "ShiftRanks",
    "Tree",
]

log = logging.getLogger(__name__)
#: How long the ranks wait for each other's keys (``Tree``'s first call) or counts
#: (``FilterCountGroupedByKey``) unless told otherwise: NVRx's default.
DEFAULT_TIMEOUT = timedelta(seconds=60)


class RankDiscarded(RestartError):  # noqa: N818 - NVRx's name
    """This rank is not part of the next iteration (it was reported terminated)."""


@dataclasses.dataclass
class RankAssignmentCtx:
    """What a ``RankAssignment`` works on.

    Attributes:
        state: this rank's state, updated in place.
        store: the wrapper's store (a ``torch.distributed.Store``) for assignments that agree.
        terminated_ranks: ranks (of ``state.rank``'s numbering) that left the job.
    """

    state: State
    store: Any
    terminated_ranks: set[int]


class RankAssignment(abc.ABC):
    """Base class of the ``rank_assignment`` argument of ``Wrapper``."""

    @abc.abstractmethod
    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Reassign ranks.

        Args:
            ctx: the state, store and terminated ranks.

        Returns:
            The updated context.
        """


def _check_alive(ctx: RankAssignmentCtx) -> None:
    if ctx.state.rank in ctx.terminated_ranks:
        raise RankDiscarded(
            f"rank {ctx.state.rank} (initial rank {ctx.state.initial_rank}) was reported "
            f"terminated (terminated ranks: {sorted(ctx.terminated_ranks)})"
        )


class ShiftRanks(RankAssignment):
    """Close the gaps left by terminated ranks, keeping the others' order.

    Ranks ``0 X 2 3 X 5`` become ``0 1 2 3`` (old 2 -> 1, 3 -> 2, 5 -> 3).
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Shift every surviving rank down by the number of terminated ranks below it."""
        _check_alive(ctx)
        state = ctx.state
        state.rank -= sum(1 for dead in ctx.terminated_ranks if dead < state.rank)
        state.world_size -= len(ctx.terminated_ranks)
        ctx.terminated_ranks = set()
        return ctx


class FillGaps(RankAssignment):
    """Keep surviving ranks where they are; move the highest ranks into the gaps.

    Ranks ``0 X 2 3 X 5`` become ``0 5 2 3`` (only old 5 moves, to 1).
    """

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Move each rank at or past the new world size into the lowest free gap."""
        _check_alive(ctx)
        state = ctx.state
        new_size = state.world_size - len(ctx.terminated_ranks)
        if state.rank >= new_size:
            gaps = sorted(dead for dead in ctx.terminated_ranks if dead < new_size)
            movers = sorted(
                r for r in range(new_size, state.world_size) if r not in ctx.terminated_ranks
            )
            state.rank = gaps[movers.index(state.rank)]
        state.world_size = new_size
        ctx.terminated_ranks = set()
        return ctx


class RankFilter(RankAssignment):
    """Base class of the assignments that only choose which ranks are active (spares wait)."""


class ActivateAllRanks(RankFilter):
    """Make every rank active: active rank = rank, active world size = world size."""

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Activate this rank."""
        state = ctx.state
        state.active_rank = state.rank
        state.active_world_size = state.world_size
        state.mode = Mode.ACTIVE
        return ctx


class MaxActiveWorldSize(RankFilter):
    """Keep at most ``max_active_world_size`` ranks active; the rest wait as spares.

    Args:
        max_active_world_size: most active ranks; None for all of them.
    """

    def __init__(self, max_active_world_size: int | None = None) -> None:
        if max_active_world_size is not None and max_active_world_size < 1:
            raise ConfigError(
                f"MaxActiveWorldSize(max_active_world_size={max_active_world_size}): must be >= 1"
            )
        self.max_active_world_size = max_active_world_size

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Deactivate ranks past the limit."""
        _limit_active(ctx.state, self.max_active_world_size or ctx.state.world_size)
        return ctx


class ActiveWorldSizeDivisibleBy(RankFilter):
    """Round the active world size down to a multiple of ``divisor``; the rest are spares.

    Args:
        divisor: the active world size must be a multiple of it.
    """

    def __init__(self, divisor: int = 1) -> None:
        if divisor < 1:
            raise ConfigError(f"ActiveWorldSizeDivisibleBy(divisor={divisor}): must be >= 1")
        self.divisor = divisor

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Deactivate the ranks past the largest multiple of ``divisor``."""
        size = ctx.state.active_world_size or ctx.state.world_size
        _limit_active(ctx.state, size - size % self.divisor)
        return ctx


def _limit_active(state: State, limit: int) -> None:
    size = min(state.active_world_size or state.world_size, limit)
    state.active_world_size = size
    if state.active_rank is not None and state.active_rank >= size:
        state.active_rank = None
        state.mode = Mode.INACTIVE


@dataclasses.dataclass
class _RankView:
    """One rank of ``Tree.init_rank_map``: its assignment, as NVRx's tree nodes hold it."""

    state: State


def _check_layers(layers: Any) -> list[Layer]:
    if not isinstance(layers, (list, tuple)) or not layers:
        raise ConfigError(f"Tree(layers={layers!r}): a non-empty list of Layer is needed")
    for index, layer in enumerate(layers):
        where = f"Tree(layers[{index}]={layer!r})"
        if not isinstance(layer, Layer):
            raise ConfigError(f"{where}: not a rank_assignment.Layer")
        if not isinstance(layer.min_ranks, int) or layer.min_ranks < 0:
            raise ConfigError(f"{where}: min_ranks must be an int >= 0")
        if layer.max_ranks is not None and (
            not isinstance(layer.max_ranks, int) or layer.max_ranks < 1
        ):
            raise ConfigError(f"{where}: max_ranks must be None or an int >= 1")
        if not _rank_keys.is_key_or_fn(layer.key_or_fn):
            raise ConfigError(f"{where}: key_or_fn must be a function of the State or a key")
        if layer.flag is not None and not isinstance(layer.flag, LayerFlag):
            raise ConfigError(f"{where}: flag must be None or a LayerFlag")
    return list(layers)


class Tree(RankAssignment):
    """Assign and activate ranks from a topology of layers (NVRx 0.4's ``Tree``).

    Each ``Layer`` groups the ranks by a key (the first layer, the root, has one key for all:
    the job; a second could be the host name), bounds the active ranks of each group
    (``max_ranks``), and terminates a group left with fewer healthy ranks than ``min_ranks``.
    At the first call the ranks are activated depth first while every group above still allows
    one more; the rest wait as spares. After a fault, each terminated active rank is replaced
    by the spare made spare last under the nearest groups whose layers are
    ``LayerFlag.RESERVE``; a gap no spare fills is filled, inside groups whose layers are
    ``LayerFlag.BACKFILL``, by the active rank with the highest active rank; the gaps left
    after that are closed by shifting the active ranks down (as ``ShiftRanks``).
    ``world_size_filter(n)`` may then lower the active world size (the ranks past it become
    spares).

    Every rank computes the same assignment from the keys exchanged through the store at the
    first call (one ``set`` per rank and one wait, bounded by ``timeout``). A rank the launcher
    respawned alone reads the assignment the others last computed from the store.
    ``Tree`` is used alone, not in a ``Compose`` with other assignments.

    Args:
        layers: the layers, the root first.
        world_size_filter: a function of the active world size returning the one wanted (no
            larger); None keeps it.
        timeout: how long the first call waits for every rank's keys (not in NVRx; its
            store's timeout).
    """

    def __init__(
        self,
        layers: list[Layer],
        world_size_filter: Callable[[int], int] | None = None,
        timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        self.layers = _check_layers(layers)
        if world_size_filter is not None and not callable(world_size_filter):
            raise ConfigError(f"Tree(world_size_filter={world_size_filter!r}): not callable")
        self.world_size_filter = world_size_filter
        self.timeout = timeout
        # One Tree per wrapper (it is not composed), so one fixed prefix in the wrapper's store.
        self.name = "rank_assignment/tree"
        self._tree: RankTree | None = None

    def _build(self, ctx: RankAssignmentCtx) -> RankTree:
        state, store = ctx.state, ctx.store
        if _rank_keys.speaks_nvrx(store):
            tree = self._shape_from_nvrx_store(store, state)
        else:
            mine = {
                "rank": state.rank,
                "keys": [_rank_keys.key_of(layer, state) for layer in self.layers],
            }
            store.set(f"{self.name}/keys/{state.initial_rank}", json.dumps(mine))
            names = [f"{self.name}/keys/{r}" for r in range(state.initial_world_size)]
            _rank_keys.wait_keys(store, names, self.timeout, "the topology keys (by initial rank)")
            tree = self._shape(store, names, state)
        misplaced = tree.activate_first()
        if misplaced and state.rank == 0:
            warnings.warn(
                "rank assignment: the ranks' order does not follow the topology (initial ranks "
                f"{misplaced} are not at their depth-first place); ranks are renumbered by the "
                "topology only after a fault",
                UserWarning,
                stacklevel=3,
            )
        return tree

    def _shape_from_nvrx_store(self, store: Any, state: State) -> RankTree:
        """The tree from a store of NVRx's protocol (``send_key``/``get_keys``,
        ``send_state``/``get_states``: its ``StoreMixin``, or a stand-in of it), which carries
        the keys and states as objects."""
        store.send_state(state, state.rank)
        states = store.get_states(range(state.world_size))
        raw = [
            layer.key_or_fn(state) if callable(layer.key_or_fn) else layer.key_or_fn
            for layer in self.layers
        ]
        store.send_key(raw, state.rank)
        keys = store.get_keys(range(state.world_size))
        return self._tree_of(
            {
                s.initial_rank: [_rank_keys.canonical(k, s.rank) for k in key]
                for s, key in zip(states, keys, strict=True)
            },
            {s.initial_rank: s.rank for s in states},
            state,
        )

    def _tree_of(self, keys: dict[int, list[str]], ranks: dict[int, int], state: State) -> RankTree:
        try:
            return RankTree(self.layers, keys=keys, ranks=ranks)
        except ValueError as exc:
            raise exception.TopologyError(
                f"rank assignment Tree, rank {state.rank}: {exc}"
            ) from exc

    @property
    def init_rank_map(self) -> dict[int, _RankView]:
        """Per initial rank, its current assignment as a ``State`` (``.state``), as NVRx's
        ``Tree.init_rank_map`` shows it; empty before the first call."""
        tree = self._tree
        if tree is None:
            return {}
        return {
            initial: _RankView(
                State(
                    rank=leaf.rank,  # type: ignore[arg-type]  # None once terminated, as in NVRx
                    world_size=tree.world_size,
                    active_rank=leaf.active_rank,
                    active_world_size=tree.active_world_size,
                    initial_rank=initial,
                    initial_world_size=len(tree.by_initial),
                    mode=leaf.mode,
                )
            )
            for initial, leaf in tree.by_initial.items()
        }

    def _shape(self, store: Any, names: list[str], state: State) -> RankTree:
        """The tree of every rank's keys (their ``set`` is already waited for)."""
        entries = [json.loads(raw) for raw in store.multi_get(names)]
        return self._tree_of(
            {r: e["keys"] for r, e in enumerate(entries)},
            {r: e["rank"] for r, e in enumerate(entries)},
            state,
        )

    def _load(self, ctx: RankAssignmentCtx) -> RankTree:
        """A respawned process: the shape from the keys, the assignment the others computed."""
        state, store = ctx.state, ctx.store
        names = [f"{self.name}/keys/{r}" for r in range(state.initial_world_size)]
        before = "start" if state.iteration == 0 else f"after{state.iteration - 1}"
        table_key = f"{self.name}/table/{before}"
        what = "the topology keys (by initial rank) and the others' last assignment"
        _rank_keys.wait_keys(store, [*names, table_key], self.timeout, what)
        tree = self._shape(store, names, state)
        tree.load(json.loads(store.get(table_key)))
        return tree

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Reassign: build the tree at the first call, then apply the terminations."""
        state = ctx.state
        this_round = _rank_keys.round_of(state)
        if self._tree is None:
            self._tree = self._build(ctx) if this_round == "start" else self._load(ctx)
        tree = self._tree
        try:
            tree.apply(set(ctx.terminated_ranks), self.world_size_filter)
        except ValueError as exc:
            raise exception.TopologyError(
                f"rank assignment Tree, rank {state.rank}: {exc}"
            ) from exc
        leaf = tree.by_initial[state.initial_rank]
        if leaf.mode is Mode.TERMINATED or leaf.rank is None:
            raise RankDiscarded(
                f"initial rank {state.initial_rank} is discarded by the topology (terminated "
                f"ranks {sorted(ctx.terminated_ranks)}, or its group fell below its min_ranks)"
            )
        if leaf.rank == 0 and not _rank_keys.speaks_nvrx(ctx.store):  # read by a respawned rank
            ctx.store.set(f"{self.name}/table/{this_round}", json.dumps(tree.to_json()))
        state.rank, state.world_size = leaf.rank, tree.world_size
        state.active_rank, state.mode = leaf.active_rank, leaf.mode
        state.active_world_size = tree.active_world_size
        ctx.terminated_ranks = set()
        return ctx


class FilterCountGroupedByKey(RankAssignment):
    """Terminate every rank of a group whose count of healthy ranks fails ``condition``.

    Each healthy rank adds one to its group's count (groups by ``key_or_fn``); once all have,
    the ranks of a group whose count fails ``condition(count)`` are added to the terminated
    ranks, for the next assignment of the ``Compose`` (e.g. ``ShiftRanks``) to discard. As in
    NVRx: ``Compose(ShiftRanks(), FilterCountGroupedByKey(lambda _: socket.gethostname(),
    lambda count: count == 8))`` drops every host that lost a rank.

    Args:
        key_or_fn: the group: a string, or a function of the rank's ``State``.
        condition: a function of the group's count; False terminates the group's ranks.
        timeout: how long the ranks wait for each other's counts.
    """

    _instances = itertools.count()

    def __init__(
        self,
        key_or_fn: str | Callable[[State], Any],
        condition: Callable[[int], bool],
        timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        if not _rank_keys.is_key_or_fn(key_or_fn):
            raise ConfigError(
                f"FilterCountGroupedByKey(key_or_fn={key_or_fn!r}): a function of the State or a "
                "key (str, int, float, bool, None or a tuple of those)"
            )
        if not callable(condition):
            raise ConfigError(f"FilterCountGroupedByKey(condition={condition!r}): not callable")
        self.key_or_fn = key_or_fn
        self.condition = condition
        self.timeout = timeout
        # Two in one Compose (a host and a rack filter) need their own keys: numbered in
        # construction order, the same on every rank.
        self.name = f"rank_assignment/count{next(FilterCountGroupedByKey._instances)}"

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        """Count this rank in its group, wait for the others, add the failing groups' ranks."""
        state, store = ctx.state, ctx.store
        if state.rank in ctx.terminated_ranks:
            return ctx  # not counted; the next assignment discards it
        where = f"{self.name}/{_rank_keys.round_of(state)}"
        store.set(f"{where}/group/{state.rank}", _rank_keys.key_of(self, state))
        alive = [r for r in range(state.world_size) if r not in ctx.terminated_ranks]
        names = [f"{where}/group/{r}" for r in alive]
        _rank_keys.wait_keys(store, names, self.timeout, "the group keys (by rank)")
        # Every rank reads every key: each computes the same counts, with no second barrier.
        groups = {r: raw.decode() for r, raw in zip(alive, store.multi_get(names), strict=True)}
        sizes = collections.Counter(groups.values())
        failing = {r for r, g in groups.items() if not self.condition(sizes[g])}
        if failing and state.rank == min(alive):
            log.warning(
                "rank assignment: ranks %s terminated: their groups' counts %s fail the condition",
                sorted(failing),
                {g: n for g, n in sizes.items() if any(groups[r] == g for r in failing)},
            )
        ctx.terminated_ranks = set(ctx.terminated_ranks) | failing
        return ctx
