"""The monitor process (``_monitor_process_main.py``) against a stand-in rank.

The stand-in is a standard-library Python process, the monitor process's parent as a rank would
be: it starts the entry by its path with a pipe, writes beats, then stops beating while the pipe
stays open and sleeps in libc with the GIL held (``ctypes.PyDLL``). The real Wrapper's side
(the beat thread, faulthandler's dump, ft-launcher's respawn) runs in
tests/integration/test_inprocess_respawn.py.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from resiliency.inprocess import _monitor_process
from resiliency.inprocess._monitor_process import MonitorProcess

ENTRY = _monitor_process.ENTRY
DEADLINE_S = 60.0

RANK = textwrap.dedent(
    """
    import ctypes, os, subprocess, sys, time
    entry, mode, respawn, logfile = sys.argv[1:5]
    r, w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, entry, str(r), str(os.getpid()), "3", "0.1", "1", "1", respawn, logfile],
        pass_fds=[r],
    )
    os.close(r)
    print(proc.pid, flush=True)
    for _ in range(5):
        os.write(w, b".")
        time.sleep(0.1)
    if mode == "close":
        os.close(w)
        sys.exit(0 if proc.wait(timeout=30) == 0 else 1)
    if mode == "suspend":  # disable_hang_protection(): a GIL-held stretch past the limit is fine
        os.write(w, b"s")
        ctypes.PyDLL(None).sleep(3)
        os.write(w, b"r")
        print("resumed", flush=True)
    print("hanging", flush=True)
    ctypes.PyDLL(None).sleep(600)  # the GIL held; only the monitor process can end this
    """
)


def start_rank(tmp_path: Path, mode: str, respawn: str, logfile: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RANK, str(ENTRY), mode, respawn, logfile],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


@pytest.fixture
def ranks():
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=DEADLINE_S)


def test_a_rank_holding_the_gil_is_ended_and_its_respawn_requested(tmp_path: Path, ranks) -> None:
    request = tmp_path / "unabortable-request"
    rank = start_rank(tmp_path, "hang", str(request), "-")
    ranks.append(rank)
    rank.wait(timeout=DEADLINE_S)
    out, err = rank.communicate()
    assert rank.returncode == -signal.SIGTERM, (out, err)  # SIGTERM: no handler can run
    assert "hanging" in out
    reason = request.read_text()
    assert "rank 3 could not be aborted in-process" in reason
    assert "its main thread holds the GIL" in reason and "(hard_timeout 1 s)" in reason
    assert f"[inprocess monitor_process] rank 3 (target_pid={rank.pid}): {reason}" in err
    assert not list(tmp_path.glob(".*.tmp")), "the request is written whole (renamed)"


def test_a_silence_between_suspend_and_resume_ends_no_rank_one_after_does(
    tmp_path: Path, ranks
) -> None:
    request = tmp_path / "unabortable-request"
    rank = start_rank(tmp_path, "suspend", str(request), "-")
    ranks.append(rank)
    rank.wait(timeout=DEADLINE_S)
    out, err = rank.communicate()
    assert "resumed" in out and "hanging" in out, (out, err)  # 3 s silent, 1 s limit: spared
    assert rank.returncode == -signal.SIGTERM, (out, err)  # the hang after the resume is not
    assert "could not be aborted in-process" in request.read_text()


def test_the_monitor_process_ends_with_the_pipe_and_logs_to_its_logfile(
    tmp_path: Path, ranks
) -> None:
    logfile = tmp_path / "monitor.log"
    rank = start_rank(tmp_path, "close", "-", str(logfile))
    ranks.append(rank)
    assert rank.wait(timeout=DEADLINE_S) == 0, rank.communicate()
    assert "watching: ends the rank after 1 s without a beat" in logfile.read_text()


def test_a_monitor_process_started_by_another_parent_never_ends_that_rank(tmp_path: Path) -> None:
    # The "rank" is a process of ours that is not the monitor process's parent (as when the rank
    # died between the fork and the parent-death request): it must exit, not end a stranger.
    stranger = subprocess.Popen(["sleep", "60"])
    read_end, write_end = os.pipe()
    try:
        args = [str(read_end), str(stranger.pid), "0", "0.1", "1", "1", "-", "-"]
        proc = subprocess.run(
            [sys.executable, str(ENTRY), *args],
            pass_fds=[read_end],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        time.sleep(1.5)  # past the 1 s limit: a watcher that stayed would have ended it by now
        assert stranger.poll() is None, "the monitor process ended a process that is not its rank"
    finally:
        os.close(read_end)
        os.close(write_end)
        stranger.kill()
        stranger.wait(timeout=DEADLINE_S)


def test_bad_arguments_print_the_usage() -> None:
    proc = subprocess.run(
        [sys.executable, str(ENTRY), "1"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_the_control_bytes_are_the_same_on_both_sides() -> None:
    entry = runpy.run_path(str(ENTRY), run_name="not_main")  # defines, runs nothing
    assert entry["_STOP"] == _monitor_process.STOP
    assert (entry["_SUSPEND"], entry["_RESUME"]) == (
        _monitor_process.SUSPEND,
        _monitor_process.RESUME,
    )
    assert len({_monitor_process.STOP, _monitor_process.SUSPEND, _monitor_process.RESUME}) == 3
    # The rank's stand-in above writes them literally, as it imports nothing of the package.
    assert 'b"s"' in RANK and 'b"r"' in RANK and _monitor_process.SUSPEND == b"s"


def test_close_ends_the_monitor_process_even_when_a_forked_child_holds_the_pipe() -> None:
    timeouts = {"monitor_process_interval": 0.1, "hard_timeout": 60.0, "termination_grace_time": 1}
    monitor = MonitorProcess(rank=0, timeouts=timeouts, respawn_request=None, logfile=None)
    # a child that inherited the write end, as a DataLoader worker forked by the rank would
    holder = subprocess.Popen(["sleep", "600"], pass_fds=[monitor._write_end])
    try:
        monitor.close()
        assert monitor._proc.returncode == 0  # it ended on its own: close() killed nothing
    finally:
        holder.kill()
        holder.wait(timeout=DEADLINE_S)
