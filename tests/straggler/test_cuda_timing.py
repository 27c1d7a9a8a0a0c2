"""The CUDA-event fallback's bookkeeping.

No GPU exists on this machine, so the events here are a host-clock stand-in with the same four
methods as ``torch.cuda.Event``; on a GPU machine ``CudaEventTimer.create()`` uses the real ones.
"""

from __future__ import annotations

import sys
import time

import pytest

from resiliency.straggler._cuda_timing import CudaEventTimer


class HostEvent:
    """Records the host clock; ``done`` says whether the "GPU" has reached it."""

    def __init__(self) -> None:
        self.at = 0.0
        self.done = True

    def record(self) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, like CUDA events


def test_sections_are_timed_per_name_and_reset_on_read() -> None:
    timer = CudaEventTimer(HostEvent)
    for _ in range(3):
        timer.enter("fwd")
        timer.enter("inner")  # nested sections pair their own events
        time.sleep(0.002)
        timer.exit("inner")
        time.sleep(0.002)
        timer.exit("fwd")
    stats = timer.read()
    assert set(stats) == {"fwd", "inner"}
    assert stats["fwd"].count == 3 and stats["fwd"].median_us >= 4000
    assert 2000 <= stats["inner"].median_us < stats["fwd"].median_us
    assert timer.read() == {}


def test_pending_queue_is_bounded_and_drops_are_counted() -> None:
    created: list[HostEvent] = []

    def never_done() -> HostEvent:
        event = HostEvent()
        event.done = False
        created.append(event)
        return event

    timer = CudaEventTimer(never_done, max_pending=4, samples_per_section=2)
    for _ in range(10):
        timer.enter("s")
        timer.exit("s")
    assert timer.dropped() == 7
    stats = timer.read()  # blocks on the 3 still queued
    assert stats["s"].count == 3
    timer.shutdown()


def test_no_timer_without_a_gpu() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert CudaEventTimer.create() is None
