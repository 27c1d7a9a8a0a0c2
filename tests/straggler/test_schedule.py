"""The report schedule: a root decision broadcast at shrinking spacings."""

from __future__ import annotations

from resiliency.straggler._schedule import ReportSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RootOnly:
    """The exchange of a group of one: the root's value comes back unchanged."""

    rank = 0
    size = 1
    is_root = True

    def __init__(self) -> None:
        self.broadcasts = 0

    def broadcast_int(self, value: int) -> int:
        self.broadcasts += 1
        return value

    def gather(self, payload: bytes, *, to_all: bool) -> list[bytes]:
        return [payload]


def test_report_lands_on_the_first_call_after_the_deadline_with_few_checks() -> None:
    clock, exchange = Clock(), RootOnly()
    schedule = ReportSchedule(10.0, clock=clock)
    calls = 0
    while not schedule.elapsed(exchange):
        clock.now += 0.01  # one iteration
        calls += 1
    assert 1000 <= calls <= 1001
    assert clock.now >= 10.0
    assert exchange.broadcasts < 30  # about log2(1000) checks instead of 1000


def test_after_a_report_the_spacing_restarts_and_a_missed_report_is_retried() -> None:
    clock, exchange = Clock(), RootOnly()
    schedule = ReportSchedule(1.0, clock=clock)
    clock.now = 2.0
    assert schedule.elapsed(exchange)
    assert schedule.elapsed(exchange)  # not reported yet: still due on the next call
    schedule.mark_reported()
    assert not schedule.elapsed(exchange)


def test_without_exchange_the_local_clock_decides_every_call() -> None:
    clock = Clock()
    schedule = ReportSchedule(5.0, clock=clock)
    assert not schedule.elapsed(None)
    clock.now = 5.0
    assert schedule.elapsed(None)
    schedule.interval_s = 6.0
    assert not schedule.elapsed(None)
