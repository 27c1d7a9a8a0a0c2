"""RankWatch's timers after the rank closed its connection without 'bye' (issue 28)."""

from __future__ import annotations

from resiliency.ft._rank_watch import EXIT_FLOOR_S, Observations, RankWatch
from resiliency.ft.timeouts import HeartbeatTimeouts, SectionTimeouts


def _connected(now: float = 0.0) -> RankWatch:
    watch = RankWatch(1234, 0, now, Observations())
    watch.on_connect(now)
    watch.dump_ready = True
    return watch


def test_exit_timer_replaces_the_progress_timers_and_disarms_the_dump():
    hb, sections = HeartbeatTimeouts(initial=1.0, subsequent=2.0), SectionTimeouts()
    watch = _connected()
    assert watch.on_disconnect(0.5, hb, sections) == EXIT_FLOOR_S
    assert not watch.dump_ready
    # The initial timer (1 s) no longer runs: only the exit timer does.
    assert watch.expired(5.0, hb, sections) is None
    assert watch.next_deadline(hb, sections) == 0.5 + EXIT_FLOOR_S
    expired = watch.expired(0.5 + EXIT_FLOOR_S + 1.0, hb, sections)
    assert expired is not None and expired.timer == "exit"
    assert expired.limit == EXIT_FLOOR_S
    assert "closed its monitor connection without 'bye'" in expired.describe()


def test_exit_timer_is_never_shorter_than_the_longest_running_progress_timer():
    hb = HeartbeatTimeouts(initial=1.0, subsequent=2.0)
    sections = SectionTimeouts(section={"checkpoint": 600.0})
    watch = _connected()
    watch.on_heartbeat(1.0)
    watch.on_section_start("checkpoint", 1.5)
    assert watch.on_disconnect(2.0, hb, sections) == 600.0


def test_reconnecting_restores_the_progress_timers():
    hb, sections = HeartbeatTimeouts(initial=1.0, subsequent=2.0), SectionTimeouts()
    watch = _connected()
    watch.on_disconnect(0.5, hb, sections)
    watch.on_connect(3.0)
    assert watch.exiting is None
    expired = watch.expired(5.0, hb, sections)
    assert expired is not None and expired.timer == "initial"
