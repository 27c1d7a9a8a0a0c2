"""The agent's monitoring loop wakes when a worker exits (a pidfd per worker), once per exit."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from resiliency.launcher._cycle import Cycle
from resiliency.launcher._worker_exit import sleep_until_an_exit

LONG_S = 60.0  # the interval: a wake-up long before it can only come from the exit


def cycle_of(*pids: int) -> Cycle:
    return Cycle(diagnosis=None, pids=dict(enumerate(pids)))  # type: ignore[arg-type]


def test_a_worker_that_dies_wakes_the_loop_at_once_and_only_once() -> None:
    worker = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        cycle = cycle_of(worker.pid, other.pid)
        killer = threading.Timer(0.2, os.kill, (worker.pid, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        sleep_until_an_exit(cycle, LONG_S)
        woke_after = time.monotonic() - started
        killer.join()
        assert woke_after < LONG_S / 2, f"woke after {woke_after:.1f} s, not at the exit"
        assert cycle.exits_seen == {worker.pid}
        # The dead worker (not reaped yet: a zombie) does not wake the loop again.
        started = time.monotonic()
        sleep_until_an_exit(cycle, 0.5)
        assert time.monotonic() - started >= 0.4
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait(timeout=LONG_S)


def test_a_worker_already_reaped_makes_the_loop_look_at_once() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=LONG_S)
    cycle = cycle_of(gone.pid)
    started = time.monotonic()
    sleep_until_an_exit(cycle, LONG_S)
    assert time.monotonic() - started < LONG_S / 2
    assert cycle.exits_seen == {gone.pid}
    started = time.monotonic()
    sleep_until_an_exit(cycle, 0.5)  # seen: now the plain interval
    assert time.monotonic() - started >= 0.4


def test_without_workers_the_loop_sleeps_the_interval() -> None:
    started = time.monotonic()
    sleep_until_an_exit(cycle_of(), 0.3)
    assert time.monotonic() - started >= 0.25


class _Reports:
    """A fork server's exit reports, arriving when the test says."""

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}

    def exit_code(self, pid: int) -> int | None:
        return self.codes.get(pid)


def test_a_worker_reaped_elsewhere_wakes_the_loop_once_its_exit_report_arrived() -> None:
    # The worker is a shell's child, as a forked worker is the fork server's: the shell reaps
    # it, and its exit code reaches the agent later, as the server's report does.
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 600 & echo $!; wait"], stdout=subprocess.PIPE, text=True
    )
    assert shell.stdout is not None
    worker = int(shell.stdout.readline())
    reports = _Reports()
    reported = threading.Event()

    def die_then_report() -> None:
        os.kill(worker, signal.SIGKILL)
        shell.wait(timeout=LONG_S)  # the shell has reaped its child and exited
        time.sleep(0.3)  # the report is still on its way over the server's socket
        reports.codes[worker] = -9
        reported.set()

    cycle = cycle_of(worker)
    threading.Timer(0.1, die_then_report).start()
    try:
        sleep_until_an_exit(cycle, LONG_S, reports)
        # Returning earlier would let the agent see the worker still running and then sleep a
        # whole interval; the report is what it reads the exit code from.
        assert reported.is_set()
        assert cycle.exits_seen == {worker}
    finally:
        reported.wait(LONG_S)
        if shell.poll() is None:
            shell.kill()
        shell.communicate(timeout=LONG_S)
