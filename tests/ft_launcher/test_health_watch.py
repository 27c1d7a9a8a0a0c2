"""Health checks in the background: deadlines, failures, logging only on a change."""

from __future__ import annotations

import logging
import shlex
import sys
import threading
import time
from collections.abc import Callable

from launcher_harness import alive

from resiliency.launcher._health_watch import HealthWatch
from resiliency.launcher.health import CommandHealthCheck, HealthResult


class _Check:
    def __init__(self, name: str, run: Callable[[], HealthResult], timeout: float = 5.0) -> None:
        self.name = name
        self.timeout = timeout
        self.calls = 0
        self._run = run

    def __call__(self) -> HealthResult:
        self.calls += 1
        return self._run()


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def test_failures_are_read_without_waiting_and_logged_once(caplog) -> None:
    state = {"ok": True}
    check = _Check("flaky", lambda: HealthResult("flaky", state["ok"], "detail"))
    watch = HealthWatch([check], interval_s=0.02)
    with caplog.at_level(logging.INFO, logger="resiliency.launcher._health_watch"):
        watch.start()
        try:
            _until(lambda: check.calls >= 3, 10, "three runs")
            assert watch.failures() == []
            state["ok"] = False
            _until(lambda: bool(watch.failures()), 10, "the failure")
            calls = check.calls
            _until(lambda: check.calls >= calls + 5, 10, "five more runs")
            state["ok"] = True
            _until(lambda: not watch.failures(), 10, "the recovery")
        finally:
            watch.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("FAILED" in x for x in lines) == 1, lines
    assert sum("passes again" in x for x in lines) == 1, lines


def test_a_check_that_overruns_fails_and_is_not_started_twice() -> None:
    release = threading.Event()

    def stuck() -> HealthResult:
        release.wait(30)
        return HealthResult("stuck", True, "late")

    check = _Check("stuck", stuck, timeout=0.0)  # deadline: 0 + the 5 s margin
    watch = HealthWatch([check], interval_s=0.01)
    watch.start()
    try:
        _until(lambda: bool(watch.failures()), 15, "the overrun")
        (failure,) = watch.failures()
        assert "did not finish within its 5 s deadline" in failure.detail
        # Waiting for something not to happen: at a 0.01 s interval, 0.3 s is 30 chances for
        # the watch to start the stuck check a second time.
        time.sleep(0.3)
        assert check.calls == 1
    finally:
        release.set()
        watch.stop()


def test_a_check_that_raises_is_a_failure() -> None:
    def broken() -> HealthResult:
        raise OSError("no such device")

    watch = HealthWatch([_Check("broken", broken)], interval_s=0.01)
    watch.start()
    try:
        _until(lambda: bool(watch.failures()), 10, "the failure")
        assert "OSError('no such device')" in watch.failures()[0].detail
    finally:
        watch.stop()


def test_stop_ends_the_threads() -> None:
    watch = HealthWatch([_Check("ok", lambda: HealthResult("ok", True, ""))], 0.05)
    before = threading.active_count()
    watch.start()
    watch.stop()
    assert threading.active_count() <= before


def test_stop_kills_a_command_still_running(tmp_path) -> None:
    pid_file = tmp_path / "pid"
    # Written aside and renamed, so the test never reads a half-written pid.
    code = (
        f"import os, time; open({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid())); "
        f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r}); time.sleep(60)"
    )
    check = CommandHealthCheck(f"{sys.executable} -c {shlex.quote(code)}", timeout=120.0)
    watch = HealthWatch([check], interval_s=0.01)
    watch.start()
    try:
        _until(pid_file.exists, 30, "the command to start and write its pid")
        pid = int(pid_file.read_text())
    finally:
        watch.stop()
    _until(lambda: not alive(pid), 10, "the command to be killed")
