"""The waits of the restart loop: start, restart and completion barriers, and leaving.

Each wait polls the store, has a deadline, and names what it waited for when it passes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from resiliency.inprocess._decision_watch import DecisionWatch
from resiliency.inprocess._liveness import Liveness
from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess.exception import RankShouldRestart, TimeoutError

log = logging.getLogger(__name__)

POLL = 0.02  # seconds between store polls: ~15 us per round trip on loopback


def wait_until(
    done: Callable[[], bool],
    deadline_s: float,
    what: Callable[[], str],
    pause: Callable[[float], None] = time.sleep,
) -> None:
    """Poll ``done`` until it is true, with ``pause(POLL)`` between looks.

    Raises:
        TimeoutError: ``deadline_s`` passed; the message says ``what()`` was awaited.
    """
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what()} (waited {deadline_s:g} s)")
        pause(POLL)


def start_barrier(store: RestartStore, rank: int, world_size: int, timeout: float) -> None:
    """Every rank reaches the wrapper before the first call (the store works for all)."""
    store.store.add("start", 1)
    wait_until(
        lambda: int(store.store.add("start", 0)) >= world_size,
        timeout,
        lambda: (
            f"rank {rank}: start barrier: {int(store.store.add('start', 0))} of {world_size} "
            "ranks reached resiliency.inprocess.Wrapper (barrier_timeout); are all ranks "
            "running the wrapped function?"
        ),
    )


def restart_barrier(
    store: RestartStore,
    *,
    iteration: int,
    me: int,
    members: list[int],
    liveness: Liveness,
    timeout: float,
    while_waiting: Callable[[], None] | None = None,
) -> list[int]:
    """Meet the other ranks of ``iteration``; return the agreed survivors (initial ranks).

    A member counts once it arrived or was reported gone (terminated, or its heartbeat
    stopped). The survivors are then fixed by the first rank to propose them, so every rank
    continues with the same set. ``while_waiting`` is called at each look that finds a member
    still missing (work that may be done meanwhile).

    A rank that has to wait is woken by a ``DecisionWatch`` when the survivors are decided.

    Raises:
        TimeoutError: a member neither arrived nor was reported gone within ``timeout``.
    """
    store.arrive(iteration, me)
    watch: DecisionWatch | None = None

    def pause(seconds: float) -> None:
        nonlocal watch
        if watch is None:  # only a rank that waits: the last to arrive never does
            watch = DecisionWatch(store.store, store.decided_key(iteration), timeout)
        watch.pause(seconds)

    def everyone_accounted() -> bool:
        gone = store.terminated()
        missing = set(members) - gone - store.arrived(iteration)
        for rank, silent in liveness.stale(sorted(missing)).items():
            store.mark_terminated(rank, f"no heartbeat for {silent:.1f} s at the restart barrier")
        if missing and while_waiting is not None:
            while_waiting()
        return not missing

    def missing() -> str:
        absent = sorted(set(members) - store.terminated() - store.arrived(iteration))
        return (
            f"rank {me}: restart barrier of iteration {iteration}: initial rank(s) {absent} "
            "neither arrived nor were reported gone (barrier_timeout); look at their logs"
        )

    wait_until(everyone_accounted, timeout, missing, pause)
    survivors = sorted(store.arrived(iteration) - store.terminated())
    return store.decide(iteration, survivors)


def completion_barrier(
    store: RestartStore, *, iteration: int, me: int, active: int, timeout: float
) -> None:
    """Wait until every active rank's function returned in ``iteration``.

    Raises:
        RankShouldRestart: a fault was reported meanwhile: this rank restarts with the others.
        TimeoutError: not every active rank returned within ``timeout``.
    """

    def done() -> bool:
        if store.fault_count(iteration):
            raise RankShouldRestart(
                f"a fault was reported in iteration {iteration} while rank {me} waited for "
                "the others to finish"
            )
        return store.completed(iteration) >= active

    wait_until(
        done,
        timeout,
        lambda: (
            f"rank {me}: completion barrier of iteration {iteration}: "
            f"{store.completed(iteration)} of {active} active ranks returned "
            "(completion_timeout)"
        ),
    )


def leave(store: RestartStore, *, me: int, hosting: bool, world: int, timeout: float) -> None:
    """Leave the wrapper; the rank hosting the store waits for every other rank to leave first.

    A rank reported terminated is not waited for: it may be dead.
    """
    store.store.append("left", f"{me},")
    if not hosting:
        return

    def everyone_left() -> bool:
        left = {int(r) for r in store.store.get("left").decode().split(",") if r}
        return set(range(world)) - store.terminated() <= left

    try:
        wait_until(
            everyone_left,
            timeout,
            lambda: f"rank {me} hosts the in-process restart store and waited for the others",
        )
    except TimeoutError as exc:
        log.warning("%s; closing the store anyway", exc)
