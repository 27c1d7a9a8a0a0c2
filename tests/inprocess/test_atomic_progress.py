"""``CallWrapper.atomic(progress=False)``: shielded from the abort, not counted as progress; a
restart request is raised when the block ends, also one that came while it waited to start."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import FrameType

import pytest
import torch.distributed as dist

from resiliency import inprocess
from resiliency.inprocess._interrupt import RESTART_SIGNAL
from resiliency.inprocess._progress import CLOCK, Progress
from resiliency.inprocess.exception import RankShouldRestart


@pytest.fixture
def call_wrapper(one_rank: dist.HashStore) -> Iterator[inprocess.CallWrapper]:
    """A one-rank CallWrapper on an in-memory store (no process group needed)."""
    store = one_rank
    with inprocess.CallWrapper(inprocess.Wrapper(store_factory=lambda: store)) as wrapper:
        yield wrapper


def test_a_shielded_block_holds_the_abort_lock_and_is_not_progress(
    call_wrapper: inprocess.CallWrapper,
) -> None:
    with call_wrapper.atomic(progress=False):
        assert call_wrapper.atomic_lock._is_owned()  # type: ignore[attr-defined]
    assert call_wrapper._marks == 0
    with call_wrapper.atomic():
        pass
    assert call_wrapper._marks == 1


def test_a_restart_request_inside_a_shielded_block_is_raised_when_it_ends(
    call_wrapper: inprocess.CallWrapper,
) -> None:
    call_wrapper.interrupter.arm()
    went_on = []
    with pytest.raises(RankShouldRestart, match="peer fault"), call_wrapper.atomic(progress=False):
        call_wrapper.interrupter.request("peer fault")  # the signal, to this thread
        went_on.append(True)  # the handler ran at the line above: the block goes on
    assert went_on == [True]
    assert not call_wrapper.interrupter.armed  # delivered once


def test_a_block_ending_with_its_own_error_keeps_it_and_drops_the_request(
    call_wrapper: inprocess.CallWrapper,
) -> None:
    call_wrapper.interrupter.arm()
    with pytest.raises(ValueError, match="its own"), call_wrapper.atomic():
        call_wrapper.interrupter.request("peer fault")
        raise ValueError("its own")
    # still armed: a main thread stuck after it is terminated at hard_timeout
    assert call_wrapper.interrupter.armed
    with call_wrapper.atomic():  # nothing held over for the next block
        pass


def test_a_restart_request_while_waiting_for_the_monitor_s_lock_lets_the_block_run_first(
    call_wrapper: inprocess.CallWrapper,
) -> None:
    """The monitor holds the atomic lock while it aborts and signals. A main thread that waits
    for that lock (a ``finally`` that closes a checkpoint manager after the abort failed its
    collective) gets the request after its block, not inside the lock's acquire (seen: the
    manager was never closed and its writer process outlived the job)."""
    interrupter = call_wrapper.interrupter
    interrupter.arm()
    errors: list[str] = []

    def monitor() -> None:
        with call_wrapper.atomic_lock:
            if not waiting_for_the_lock():
                errors.append("the main thread did not wait for the lock in atomic() within 30 s")
                return
            interrupter.request("peer fault")
            if not handled.wait(30):
                errors.append("the main thread did not handle the signal within 30 s")

    def waiting_for_the_lock() -> bool:
        """The main thread sits in atomic() (in the lock's C acquire) for 5 polls in a row."""
        main, deadline, seen = threading.main_thread().ident, time.monotonic() + 30, 0
        while time.monotonic() < deadline and seen < 5:
            frame = sys._current_frames().get(main)  # where the main thread sits
            seen = seen + 1 if frame is not None and frame.f_code.co_name == "atomic" else 0
            time.sleep(0.02)
        return seen >= 5

    handled = threading.Event()
    original = interrupter._handle

    def handle(signum: int, frame: FrameType | None) -> None:
        try:
            original(signum, frame)
        finally:
            handled.set()

    signal.signal(RESTART_SIGNAL, handle)
    thread = threading.Thread(target=monitor)
    thread.start()
    ran = []
    try:
        with pytest.raises(RankShouldRestart, match="peer fault"), call_wrapper.atomic():
            ran.append(True)
    finally:
        thread.join(60)
        interrupter.disarm()
    assert not errors, errors
    assert ran == [True], "the request was raised before the block could run"


def _let_the_pending_call_run(progress: Progress) -> None:
    """Poke, then stay in Python code until the main thread ran the pending call."""
    progress.poke()
    deadline = time.monotonic() + 30
    while not CLOCK.synchronized():
        assert time.monotonic() < deadline, "the pending call did not run within 30 s"
        time.sleep(0.001)


def test_once_pinged_the_rank_must_ping_again_running_python_is_not_enough() -> None:
    progress = Progress()
    progress.reset()
    time.sleep(0.05)
    _let_the_pending_call_run(progress)  # Python ran: the automatic clock is fresh
    assert progress.stalled_for() < 0.05
    progress.ping()
    time.sleep(0.1)
    _let_the_pending_call_run(progress)
    assert progress.stalled_for() >= 0.1  # the manual clock, started by the ping, is stale
    progress.reset()  # a new iteration: no ping in it yet
    assert progress.stalled_for() < 0.05


def _watching(store: dist.Store, soft_timeout_s: float) -> inprocess.Wrapper:
    """A Wrapper on ``store`` that looks every 50 ms and restarts after ``soft_timeout_s``
    without progress (the hard timeout far away, no stop rule)."""
    fast = timedelta(seconds=0.05)
    return inprocess.Wrapper(
        store_factory=lambda: store,
        monitor_thread_interval=fast,
        monitor_process_interval=fast,
        heartbeat_interval=fast,
        progress_watchdog_interval=fast,
        soft_timeout=timedelta(seconds=soft_timeout_s),
        hard_timeout=timedelta(seconds=30),
        max_repeated_faults=None,
    )


def test_a_function_that_pinged_and_then_stopped_pinging_is_restarted_by_the_soft_timeout(
    one_rank: dist.HashStore,
) -> None:
    store = one_rank
    iterations: list[int] = []

    @_watching(store, soft_timeout_s=1)
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> int:
        assert call_wrapper is not None
        iterations.append(call_wrapper.iteration)
        if call_wrapper.iteration > 0:
            return call_wrapper.iteration
        call_wrapper.ping()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # Python keeps running, but no ping comes
            time.sleep(0.01)
        iterations.append(-1)  # not interrupted: this raise restarts it, not the soft timeout
        raise AssertionError("the soft timeout never fired in 30 s")

    assert train() == 1
    assert iterations == [0, 1]  # no -1: the soft timeout interrupted the loop


def test_no_progress_inside_disable_hang_protection_is_no_hang_and_the_clock_restarts_after(
    one_rank: dist.HashStore,
) -> None:
    store = one_rank
    marks: list[str] = []

    @_watching(store, soft_timeout_s=0.5)
    def train(call_wrapper: inprocess.CallWrapper | None = None) -> int:
        assert call_wrapper is not None
        if call_wrapper.iteration > 0:
            return call_wrapper.iteration
        call_wrapper.ping()  # the manual clock too: it must not be stale after the block
        with call_wrapper.disable_hang_protection(), call_wrapper.disable_hang_protection():
            time.sleep(1.5)  # three soft timeouts with no progress (GIL released)
        marks.append("out of the block")
        time.sleep(30)  # outside: the soft timeout applies again and interrupts this
        marks.append("not interrupted")
        raise AssertionError("the soft timeout never fired after the block")

    assert train() == 1
    assert marks == ["out of the block"]
