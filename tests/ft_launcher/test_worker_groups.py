"""Leftovers of stopped workers: SIGTERM first, SIGKILL after the grace, never a reused group;
and torch's shutdown hooks called with the arguments any supported torch version passes."""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from launcher_harness import alive

from resiliency.launcher._worker_groups import WorkerProcessGroups
from resiliency.launcher.agent import FtElasticAgent

# A "worker" that leads its own session, starts a child in its group, writes the child's pid
# and exits: the child is the leftover. ``ignore`` makes the child ignore SIGTERM. Markers are
# written aside and renamed, so one that exists is complete.
_WORKER = """
import os, signal, subprocess, sys
code = "import os, signal, sys, time\\n"
if sys.argv[2] == "ignore":
    code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
code += "open(sys.argv[1] + '.tmp', 'w').write('up')\\n"
code += "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\\n"
code += "time.sleep(120)\\n"
child = subprocess.Popen([sys.executable, "-c", code, sys.argv[1] + ".ready"])
open(sys.argv[1] + ".tmp", "w").write(str(child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} was not written within {timeout} s")
        time.sleep(0.02)
    return path.read_text()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``timeout`` (a signal is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[[str], tuple[int, int]]]:
    """Start a worker in its own session; return (worker pid, leftover child pid)."""
    children: list[int] = []

    def start(mode: str) -> tuple[int, int]:
        marker = tmp_path / f"child-{len(children)}"
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(marker), mode], start_new_session=True
        )
        child = int(_wait_for(marker))
        children.append(child)
        _wait_for(Path(f"{marker}.ready"))
        proc.wait(30)
        return proc.pid, child

    yield start
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_leftover_child_gets_sigterm_and_no_sigkill(worker, caplog) -> None:
    groups = WorkerProcessGroups()
    leader, child = worker("default")
    groups.add(leader)
    assert alive(child)
    groups.end_leftovers(grace_s=30.0)
    assert _gone(child)
    assert "killed leftover" not in caplog.text  # SIGTERM was enough


def test_a_child_ignoring_sigterm_is_killed_after_the_grace(worker, caplog) -> None:
    groups = WorkerProcessGroups()
    leader, child = worker("ignore")
    groups.add(leader)
    t0 = time.monotonic()
    groups.end_leftovers(grace_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert _gone(child)
    assert f"worker process group {leader}" in caplog.text


def test_a_group_whose_leader_pid_was_reused_is_left_alone() -> None:
    # A live group leader holds the recorded pid, but it started at another time than the
    # worker that was recorded: it is another group, and nothing may be sent to it.
    own = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        groups = WorkerProcessGroups()
        groups.add(own.pid)
        groups._groups = {pid: ticks - 1 for pid, ticks in groups._groups.items() if ticks}
        assert groups._groups, "the start time of a live process was not read"
        groups.end_leftovers(grace_s=0.2)
        assert own.poll() is None
        control = WorkerProcessGroups()  # the same group, recorded right: it is ended
        control.add(own.pid)
        control.end_leftovers(grace_s=5.0)
        assert own.wait(10) == -signal.SIGTERM
    finally:
        if own.poll() is None:
            own.kill()
            own.wait(10)


@pytest.mark.parametrize("method", ["_stop_workers", "_shutdown"])
def test_the_shutdown_hooks_accept_is_restart(method: str) -> None:
    # torch 2.5-2.7 call _stop_workers(group, is_restart=True) and _shutdown(sig, is_restart=..)
    # from their restart path: an override without the keyword fails the first restart.
    params = inspect.signature(getattr(FtElasticAgent, method)).parameters
    assert "is_restart" in params
    assert params["is_restart"].default is False
