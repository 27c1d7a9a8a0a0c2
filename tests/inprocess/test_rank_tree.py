"""``rank_assignment.Tree``, ``Layer``, ``LayerFlag`` and ``FilterCountGroupedByKey`` (NVRx 0.4).

Every rank is a thread with its own assignment object, and they meet in one real
``torch.distributed.HashStore``, as the wrapper's ranks meet in its TCPStore. Each round is one
call of the assignment: the first call (before the function ran), then one after each restart
barrier with the ranks that left, numbered as in the iteration that ended (the wrapper's
``_meet``). The expected layouts follow NVRx's documented algorithm: depth-first activation
bounded by ``max_ranks``, whole groups terminated below ``min_ranks``, replacement from the
newest spare of a RESERVE group, BACKFILL by the highest active rank, then a shift.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

torch_distributed = pytest.importorskip("torch.distributed")

from resiliency import inprocess  # noqa: E402
from resiliency.inprocess.exception import ConfigError  # noqa: E402
from resiliency.inprocess.rank_assignment import (  # noqa: E402
    ActivateAllRanks,
    FilterCountGroupedByKey,
    Layer,
    LayerFlag,
    RankAssignmentCtx,
    RankDiscarded,
    RankFilter,
    ShiftRanks,
    Tree,
)
from resiliency.inprocess.state import Mode, State  # noqa: E402

DEADLINE_S = 60.0
A, S = Mode.ACTIVE, Mode.INACTIVE  # active, spare


def host_of(per_host: int) -> Callable[[State], str]:
    return lambda state: f"host{state.initial_rank // per_host}"


def rank_rounds(
    make: Callable[[], Any],
    world: int,
    rounds: list[set[int]],
    respawn: dict[int, int] | None = None,
) -> dict[int, list[Any]]:
    """Run every rank's rounds in threads; per initial rank, what each round gave it.

    ``rounds[k]`` are the ranks that left before round k+1 (numbered as after round k).
    ``respawn[initial] = k``: that rank's thread stops after round k-1 and a new thread with a
    new assignment object (a process the launcher respawned) plays it from round k on.
    """
    store = torch_distributed.HashStore()
    results: dict[int, list[Any]] = {r: [] for r in range(world)}
    errors: list[BaseException] = []
    respawn = respawn or {}

    def play(initial: int, state: State, first: int, last: int) -> State | None:
        assignment = make()
        for k in range(first, last):
            dead = set() if k == 0 else set(rounds[k - 1])
            try:
                ctx = assignment(RankAssignmentCtx(state, store, dead))
            except RankDiscarded:
                results[initial].append("discarded")
                return None
            state = ctx.state
            results[initial].append((state.rank, state.active_rank, state.mode))
            if k > 0:
                state.iteration += 1  # the wrapper's state.advance() after each restart
        return state

    def rank_main(initial: int) -> None:
        try:
            state = State(
                rank=initial,
                world_size=world,
                active_rank=initial,
                active_world_size=world,
                initial_rank=initial,
                initial_world_size=world,
            )
            split = respawn.get(initial, len(rounds) + 1)
            state_after = play(initial, state, 0, split)
            if state_after is not None and split <= len(rounds):
                # The respawned process knows only what take_place gives it.
                fresh = State(
                    rank=state_after.rank,
                    world_size=state_after.world_size,
                    active_rank=state_after.active_rank,
                    active_world_size=state_after.world_size,
                    initial_rank=initial,
                    initial_world_size=world,
                    iteration=state_after.iteration,
                    mode=Mode.ACTIVE,
                )
                play(initial, fresh, split, len(rounds) + 1)
        except BaseException as exc:  # reported by the test, with the rank
            exc.add_note(f"initial rank {initial}")
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
        assert not thread.is_alive(), f"a rank's thread still runs after {DEADLINE_S} s"
    if errors:
        raise errors[0]
    return results


TWO_HOSTS_OF_FOUR = [
    Layer(min_ranks=1, key_or_fn="job", flag=LayerFlag.RESERVE),
    Layer(min_ranks=1, max_ranks=3, key_or_fn=host_of(4), flag=LayerFlag.RESERVE),
]


def test_spares_replace_active_ranks_in_their_host_first_then_across_the_job() -> None:
    # 2 hosts of 4 ranks, at most 3 active per host: ranks 3 and 7 wait as spares.
    # Round 1: rank 1 leaves; host 0's spare (initial 3) takes its active rank 1.
    # Round 2: rank 0 (initial 0) leaves; host 0 has no spare left, the job layer is RESERVE
    # too, so host 1's spare (initial 7) takes active rank 0.
    got = rank_rounds(lambda: Tree(TWO_HOSTS_OF_FOUR), 8, [{1}, {0}])
    assert got[0] == [(0, 0, A), (0, 0, A), "discarded"]
    assert got[1] == [(1, 1, A), "discarded"]
    assert got[2] == [(2, 2, A), (1, 2, A), (0, 2, A)]
    assert got[3] == [(3, None, S), (2, 1, A), (1, 1, A)]
    assert got[4] == [(4, 3, A), (3, 3, A), (2, 3, A)]
    assert got[5] == [(5, 4, A), (4, 4, A), (3, 4, A)]
    assert got[6] == [(6, 5, A), (5, 5, A), (4, 5, A)]
    assert got[7] == [(7, None, S), (6, None, S), (5, 0, A)]


def test_a_respawned_process_reads_the_assignment_the_others_computed() -> None:
    # Initial 5 plays rounds 0-1 in one thread and round 2 in a new one with a new Tree, as a
    # process the launcher respawned alone: it must land where the others put it.
    got = rank_rounds(lambda: Tree(TWO_HOSTS_OF_FOUR), 8, [{1}, {0}], respawn={5: 2})
    assert got[5] == [(5, 4, A), (4, 4, A), (3, 4, A)]
    assert got[7] == [(7, None, S), (6, None, S), (5, 0, A)]


def test_backfill_moves_the_highest_active_rank_and_the_filter_makes_spares() -> None:
    # 2 hosts of 3, both layers BACKFILL, the active world size kept even.
    # Round 1: rank 1 leaves; the highest active rank (initial 5, active 5) moves into active
    # rank 1. 5 active -> the filter keeps 4: initial 4 (active 4) becomes a spare.
    # Round 2: rank 2 (initial 3, active 3) leaves; initial 2 (active 2, the highest) moves to
    # 3, active 2 is left vacant, everything above it shifts down: 3 active -> 2 kept.
    layers = [
        Layer(key_or_fn="job", flag=LayerFlag.BACKFILL),
        Layer(min_ranks=2, key_or_fn=host_of(3), flag=LayerFlag.BACKFILL),
    ]
    even = lambda n: n - n % 2  # noqa: E731
    got = rank_rounds(lambda: Tree(layers, world_size_filter=even), 6, [{1}, {2}])
    assert got[0] == [(0, 0, A), (0, 0, A), (0, 0, A)]
    assert got[1] == [(1, 1, A), "discarded"]
    assert got[2] == [(2, 2, A), (1, 2, A), (1, None, S)]
    assert got[3] == [(3, 3, A), (2, 3, A), "discarded"]
    assert got[4] == [(4, 4, A), (3, None, S), (2, None, S)]
    assert got[5] == [(5, 5, A), (4, 1, A), (3, 1, A)]


def test_a_host_left_below_its_min_ranks_is_terminated_whole() -> None:
    # 2 hosts of 2, each needing both ranks: rank 0 leaves, so its host's other rank goes too,
    # and host 1's ranks shift down to 0 and 1.
    layers = [Layer(key_or_fn="job"), Layer(min_ranks=2, key_or_fn=host_of(2))]
    got = rank_rounds(lambda: Tree(layers), 4, [{0}])
    assert got[0] == [(0, 0, A), "discarded"]
    assert got[1] == [(1, 1, A), "discarded"]
    assert got[2] == [(2, 2, A), (0, 0, A)]
    assert got[3] == [(3, 3, A), (1, 1, A)]


def test_filter_count_grouped_by_key_drops_every_host_that_lost_a_rank() -> None:
    # NVRx's example: keep a host only while all its ranks are alive (here 2 per host); the
    # ShiftRanks after it discards the filtered ranks and closes the gaps.
    only_full_hosts = FilterCountGroupedByKey(host_of(2), lambda count: count == 2)
    chain = inprocess.Compose(ActivateAllRanks(), ShiftRanks(), only_full_hosts)
    got = rank_rounds(lambda: chain, 6, [{3}])
    assert got[2] == [(2, 2, A), "discarded"]
    assert got[3] == [(3, 3, A), "discarded"]
    assert [got[r][1] for r in (0, 1, 4, 5)] == [(0, 0, A), (1, 1, A), (2, 2, A), (3, 3, A)]


def test_layer_flags_combine_and_filters_are_rank_filters() -> None:
    both = LayerFlag.RESERVE | LayerFlag.BACKFILL
    assert Layer(flag=both).has(LayerFlag.RESERVE) and Layer(flag=both).has(LayerFlag.BACKFILL)
    assert not Layer().has(LayerFlag.RESERVE)
    assert isinstance(ActivateAllRanks(), RankFilter)
    assert isinstance(Tree([Layer()]), inprocess.rank_assignment.RankAssignment)


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([], "non-empty list of Layer"),
        ([{"min_ranks": 1}], "not a rank_assignment.Layer"),
        ([Layer(min_ranks=-1)], "min_ranks must be an int >= 0"),
        ([Layer(max_ranks=0)], "max_ranks must be None or an int >= 1"),
        ([Layer(key_or_fn=[3])], "key_or_fn must be a function of the State or a key"),  # type: ignore[arg-type]
        ([Layer(flag="RESERVE")], "flag must be None or a LayerFlag"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_layer_is_a_config_error_naming_it(layers: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Tree(layers)


def test_ranks_that_disagree_on_the_root_key_get_a_clear_error() -> None:
    layers = [Layer(key_or_fn=lambda state: f"job{state.initial_rank}")]
    with pytest.raises(ConfigError, match="share one key at the tree's root layer"):
        rank_rounds(lambda: Tree(layers), 2, [])


def test_a_rank_that_never_comes_is_named_when_the_wait_ends() -> None:
    store = torch_distributed.HashStore()
    state = State(
        rank=0, world_size=2, active_rank=0, active_world_size=2, initial_rank=0,
        initial_world_size=2,
    )  # fmt: skip
    tree = Tree([Layer()], timeout=timedelta(seconds=0.5))
    with pytest.raises(
        inprocess.exception.TimeoutError,
        match=r"topology keys \(by initial rank\); still missing: 1;",
    ):
        tree(RankAssignmentCtx(state, store, set()))


def test_a_tree_in_a_compose_is_refused_by_the_wrapper() -> None:
    composed = inprocess.Compose(ActivateAllRanks(), Tree([Layer()]))
    with pytest.raises(ConfigError, match="a Tree assigns and activates every rank itself"):
        inprocess.Wrapper(rank_assignment=composed)


@pytest.mark.parametrize(
    "key_of",
    [
        lambda state: state.initial_rank // 4,  # an int, as NVRx's own tests use
        lambda state: ("rack0", state.initial_rank // 4),  # a tuple
    ],
    ids=["int", "tuple"],
)
def test_keys_other_than_str_group_the_ranks_the_same_way(key_of: Callable[[State], Any]) -> None:
    layers = [
        TWO_HOSTS_OF_FOUR[0],
        Layer(min_ranks=1, max_ranks=3, key_or_fn=key_of, flag=LayerFlag.RESERVE),
    ]
    same = rank_rounds(lambda: Tree(TWO_HOSTS_OF_FOUR), 8, [{1}, {0}])
    assert rank_rounds(lambda: Tree(layers), 8, [{1}, {0}]) == same


def test_a_key_that_cannot_cross_processes_is_named() -> None:
    layers = [Layer(min_ranks=1, key_or_fn=lambda state: object())]
    with pytest.raises(ConfigError, match=r"returned <object object .*> for rank \d: a key must"):
        rank_rounds(lambda: Tree(layers), 2, [])
