"""Durations in logs are written for people (issue 30, item 11a): no 'None s', no 16 digits."""

from __future__ import annotations

import math

import pytest

from resiliency.ft._durations import format_limit, format_seconds, format_timeouts


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25203124999999997, "0.252 s"),
        (0.9160000000000001, "0.916 s"),
        (3.0, "3 s"),
        (5.5, "5.5 s"),
        (90.55, "90.5 s"),
        (2700.0, "2700 s"),
        (3600.0, "1 h"),
        (5400.0, "1 h 30 min"),
        (math.inf, "inf s"),
    ],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_none_is_no_limit_and_timeouts_fit_one_line() -> None:
    assert format_limit(None) == "no limit"
    line = format_timeouts(0.9160000000000001, None, {"step": 0.05, "ckpt": None}, 12.0)
    assert line == (
        "initial 0.916 s, heartbeat no limit, sections {step 0.05 s, ckpt no limit}, "
        "out of section 12 s"
    )


def test_monitor_limits_line_is_human(start_monitor, spawn_rank) -> None:
    monitor = start_monitor(initial_rank_heartbeat_timeout=None, rank_startup_timeout=1234.5678)
    rank = spawn_rank("client.send_heartbeat()\nclient.shutdown_workload_monitoring()\n", monitor)
    assert rank.wait(30) == 0, rank.output()
    log = monitor.log()
    assert "limits: connect within 1234.6 s of spawn, first heartbeat no limit" in log, log
    assert "None s" not in log
