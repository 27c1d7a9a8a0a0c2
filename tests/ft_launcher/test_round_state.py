"""The nodes' shared round state on a real TCPStore: blocking waits, no polling, bounded waits."""

from __future__ import annotations

import threading
import time

import pytest
from round_store import RoundStores

from resiliency.launcher._coordination import exit_barrier
from resiliency.launcher._round_watch import RoundWatcher
from resiliency.launcher._shared_state import SharedRoundState, StoreWaitTimeoutError


def _node(stores: RoundStores, world: int, rank: int) -> SharedRoundState:
    # Each node has its own connection to the store, as separate launchers do.
    assert stores.round is not None
    return SharedRoundState(stores.round.clone(), world=world, rank=rank)


def test_a_watcher_sees_a_failure_elsewhere_without_polling(round_stores: RoundStores) -> None:
    watcher = RoundWatcher(_node(round_stores, 2, 0)).start()
    try:
        first = watcher.snapshot()
        assert (first.failed, first.standby, first.left, first.shutdown) == (0, 0, 0, None)
        _node(round_stores, 2, 1).publish_failed()
        state = watcher.wait_for_change(first.version, timeout=20)
        assert state.failed == 1
        assert state.version > first.version
        # Nothing happened since: the wait runs to its deadline and returns the same state.
        started = time.monotonic()
        same = watcher.wait_for_change(state.version, timeout=0.3)
        assert same == state and time.monotonic() - started >= 0.25
    finally:
        watcher.stop()


def test_a_shutdown_request_reaches_every_watcher(round_stores: RoundStores) -> None:
    watchers = [RoundWatcher(_node(round_stores, 3, rank)).start() for rank in range(3)]
    try:
        _node(round_stores, 3, 2).publish_shutdown(5, "bad data")
        for watcher in watchers:
            state = watcher.wait_for_change(0, timeout=20)
            assert state.shutdown == {"rank": 5, "desc": "bad data"}
    finally:
        for watcher in watchers:
            watcher.stop()


def test_stopping_a_watcher_ends_its_thread_and_wakes_no_other(round_stores: RoundStores) -> None:
    mine = RoundWatcher(_node(round_stores, 2, 0)).start()
    other_node = _node(round_stores, 2, 1)
    other = RoundWatcher(other_node).start()
    before = other.snapshot().version
    started = time.monotonic()
    mine.stop()
    assert time.monotonic() - started < 10
    assert not any(t.name == "ft-round-watch-0" for t in threading.enumerate())
    # Only node 0's queue got the stop: node 1's watcher read nothing new.
    assert other.wait_for_change(before, timeout=0.3).version == before
    other.stop()


def test_exit_barrier_releases_when_the_last_node_arrives(round_stores: RoundStores) -> None:
    released: list[float] = []

    def finish(rank: int, delay: float) -> None:
        time.sleep(delay)
        exit_barrier(_node(round_stores, 3, rank), timeout=30)
        released.append(time.monotonic())

    threads = [threading.Thread(target=finish, args=(r, 0.5 * r)) for r in range(3)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    assert len(released) == 3
    # Nobody left before the last node (1 s late) arrived.
    assert min(released) - started >= 0.9


def test_a_node_standing_by_completes_the_exit_barrier(round_stores: RoundStores) -> None:
    finisher = _node(round_stores, 2, 0)
    done = threading.Event()

    def finish() -> None:
        exit_barrier(finisher, timeout=30)
        done.set()

    standby = _node(round_stores, 2, 1)
    thread = threading.Thread(target=finish)
    thread.start()
    assert round_stores.round is not None
    deadline = time.monotonic() + 30
    while round_stores.round.add("ft/exit_count", 0) < 1:  # the finisher's arrival at the barrier
        assert time.monotonic() < deadline, "the finisher never arrived at the exit barrier"
        time.sleep(0.01)
    # One of two nodes arrived: a barrier that let it go would do so at once.
    assert not done.wait(0.3), "the exit barrier released before the second node came"
    standby.publish_standby()  # completes the count after the finisher already waits
    watcher = RoundWatcher(standby).start()
    try:
        deadline = time.monotonic() + 30
        state = watcher.snapshot()
        while not state.done and time.monotonic() < deadline:
            state = watcher.wait_for_change(state.version, timeout=5)
        assert state.done, "the finisher never said the job finished"
        standby.ack_done()  # the finisher waits for this acknowledgement
    finally:
        watcher.stop()
    thread.join(30)
    assert done.is_set()


def test_a_missing_node_times_the_barrier_out_with_a_message(
    round_stores: RoundStores, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    exit_barrier(_node(round_stores, 2, 0), timeout=0.5)
    assert time.monotonic() - started < 10
    assert "waited 0 s for the other nodes to finish (exit barrier)" in caplog.text


def test_acknowledgement_waits_have_deadlines(round_stores: RoundStores) -> None:
    node = _node(round_stores, 3, 0)
    with pytest.raises(StoreWaitTimeoutError, match="2 node\\(s\\) to acknowledge the shutdown"):
        node.wait_shutdown_acks(2, 0.3)
    _node(round_stores, 3, 1).ack_shutdown()
    _node(round_stores, 3, 2).ack_shutdown()
    node.wait_shutdown_acks(2, 10)
