"""inprocess.progress_watchdog: NVRx's progress watchdog thread, over the package's clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from resiliency import inprocess
from resiliency.inprocess.progress_watchdog import ProgressWatchdog, Timestamp


class _Sink:
    """Keeps every timestamp with the time it arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[float, Timestamp]] = []
        self.lock = threading.Lock()

    def send_timestamp(self, timestamp: Timestamp) -> None:
        with self.lock:
            self.received.append((time.monotonic(), timestamp))

    def count(self) -> int:
        with self.lock:
            return len(self.received)

    def wait_for(self, count: int, what: str) -> None:
        deadline = time.monotonic() + 30
        while self.count() < count:
            assert time.monotonic() < deadline, f"no {what} within 30 s ({self.count()} sent)"
            time.sleep(0.001)  # Python code between waits: the pending calls run


@pytest.fixture
def watched() -> Iterator[tuple[ProgressWatchdog, _Sink]]:
    sink = _Sink()
    watchdog = ProgressWatchdog(0, sink, timedelta(milliseconds=5))
    watchdog.start()
    yield watchdog, sink
    watchdog.shutdown(timeout=30)
    assert not watchdog.is_alive()


def test_the_module_is_public_under_nvrx_names() -> None:
    assert inprocess.progress_watchdog.ProgressWatchdog is ProgressWatchdog
    assert "progress_watchdog" in inprocess.__all__


def test_a_main_thread_running_python_moves_the_automatic_clock(watched) -> None:
    _, sink = watched
    start = time.monotonic()
    sink.wait_for(20, "20 timestamps")
    stamps = [ts for _, ts in sink.received]
    autos = [ts.auto for ts in stamps]
    assert autos == sorted(autos)
    assert autos[-1] > start
    assert all(ts.manual is None for ts in stamps)


def test_a_main_thread_blocked_in_c_stops_the_automatic_clock(watched) -> None:
    _, sink = watched
    sink.wait_for(3, "the first timestamps")
    blocked = time.monotonic()
    time.sleep(0.6)  # in C, GIL released: the watchdog thread runs, the pending call cannot
    late = [ts for arrived, ts in sink.received if arrived > blocked + 0.3]
    assert late, "the watchdog sent nothing while the main thread slept"
    assert all(ts.auto <= blocked for ts in late)
    assert late[-1].is_timed_out(timedelta(seconds=0.2))
    # Back in Python code: the clock moves again.
    sink.wait_for(len(sink.received) + 5, "timestamps after the sleep")
    assert sink.received[-1][1].auto > blocked + 0.6


def test_ping_starts_the_manual_clock(watched) -> None:
    watchdog, sink = watched
    before = time.monotonic()
    watchdog.ping()
    pinged = sink.received[-1][1]
    assert pinged.manual is not None and pinged.manual >= before
    assert not pinged.is_timed_out(timedelta(seconds=10))
    assert Timestamp(auto=time.monotonic(), manual=before - 60).is_timed_out(timedelta(seconds=10))


def test_pause_sends_nothing_until_resume(watched) -> None:
    watchdog, sink = watched
    sink.wait_for(3, "the first timestamps")
    watchdog.pause_and_synchronize()
    paused = sink.count()
    assert sink.received[-1][1].manual is None  # the reset sent at the pause
    time.sleep(0.1)
    assert sink.count() == paused
    watchdog.resume()
    sink.wait_for(paused + 3, "timestamps after resume()")


def test_shutdown_sends_one_last_reset_then_nothing_and_twice_is_harmless() -> None:
    sink = _Sink()
    watchdog = ProgressWatchdog(3, sink, timedelta(milliseconds=5))
    assert watchdog.name == "ProgressWatchdog-3"
    watchdog.start()
    sink.wait_for(3, "the first timestamps")
    watchdog.shutdown(timeout=30)
    after = sink.count()
    time.sleep(0.05)
    watchdog.shutdown()
    assert sink.count() == after
    with pytest.raises(RuntimeError, match="not running"):
        watchdog.resume()
