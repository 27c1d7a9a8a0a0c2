"""SIGTERM to the launcher, and a killed rank monitor: no orphans, no hang, clear exit codes."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, WORKER, alive, child_pids, markers, wait_for_markers
from launcher_harness import worker_pids as recorded_worker_pids

pytestmark = pytest.mark.slow


def _args(mode: str, marker_dir: Path, *extra: str) -> list[str]:
    return [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *FAST_FT_FLAGS,
        *extra,
        str(WORKER),
        "--mode",
        mode,
        "--marker-dir",
        str(marker_dir),
    ]


def test_sigterm_with_clean_workers_exits_0(launch, marker_dir: Path):
    launcher = launch(_args("exit_on_sigterm", marker_dir))
    launcher.wait_for_log("workers started", 120)
    wait_for_markers(marker_dir, "armed", 2, 120)  # both SIGTERM handlers are in place
    launcher.signal(signal.SIGTERM)
    assert launcher.wait(90) == 0, launcher.log()
    assert markers(marker_dir, "sigterm") == ["sigterm-0-0", "sigterm-1-0"]
    assert not any(alive(pid) for pid in recorded_worker_pids(marker_dir))
    assert "exits 0 (signal_clean)" in launcher.log()


def test_sigterm_with_workers_ignoring_it_kills_them_after_term_timeout(launch, marker_dir: Path):
    launcher = launch(_args("ignore_sigterm", marker_dir, "--term-timeout", "1.5"))
    launcher.wait_for_log("workers started", 120)
    wait_for_markers(marker_dir, "armed", 2, 120)  # both SIGTERM handlers are in place
    start = time.monotonic()
    launcher.signal(signal.SIGTERM)
    code = launcher.wait(90)
    took = time.monotonic() - start
    # NVIDIA's ft_launcher and torchrun exit 1 here (issue 10), not 128 + SIGTERM.
    assert code == 1, launcher.log()
    assert "exits 1 (signal)" in launcher.log()
    assert took >= 1.4, (took, launcher.log())
    assert markers(marker_dir, "sigterm") == ["sigterm-0-0", "sigterm-1-0"]
    assert not any(alive(pid) for pid in recorded_worker_pids(marker_dir))


def test_sigterm_leaves_no_orphan_children(launch, marker_dir: Path):
    launcher = launch(_args("child_ignores_sigterm", marker_dir, "--term-timeout", "1"))
    wait_for_markers(marker_dir, "child", 2, 120)
    launcher.signal(signal.SIGTERM)
    launcher.wait(90)
    children = child_pids(marker_dir)
    assert len(children) == 2
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)], "data-loader-like children survived"


def test_killed_monitor_fails_the_group_and_is_replaced(launch, marker_dir: Path):
    launcher = launch([*_args("ok", marker_dir), "--steps", "60"])
    launcher.wait_for_log("workers started", 120)
    found = re.search(r"rank monitor for local rank 0 started \(pid (\d+)\)", launcher.log())
    assert found, launcher.log()
    os.kill(int(found.group(1)), signal.SIGKILL)
    assert launcher.wait(40) == 0, launcher.log()
    log = launcher.log()
    assert "rank monitor of local rank 0 (rank 0) died" in log
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
    assert log.count("rank monitor for local rank 0 started") == 2


def test_node_turning_unhealthy_while_running_leaves_the_job(launch, marker_dir: Path, tmp_path):
    flag = tmp_path / "gpu-fell-off-the-bus"
    check = (
        f'{sys.executable} -c "import os, sys; '
        f"sys.exit('GPU 3 lost' if os.path.exists('{flag}') else 0)\""
    )
    interval = ("--ft-node-health-check-interval", "0.2")
    args = _args("ok", marker_dir, "--node-health-check-cmd", check, *interval)
    launcher = launch([*args, "--steps", "400"])
    launcher.wait_for_log("workers started", 120)
    wait_for_markers(marker_dir, "start", 2, 120)
    flag.touch()
    assert launcher.wait(90) == 4, launcher.log()
    log = launcher.log()
    assert "node health check failed" in log and "GPU 3 lost" in log
    assert not any(alive(pid) for pid in recorded_worker_pids(marker_dir))


def test_a_slow_health_check_does_not_delay_hang_detection(launch, marker_dir: Path, tmp_path):
    # The check passes at once before the rendezvous; its first run while the workers run takes
    # 30 s (in its own thread: the supervision loop still acts on the hang at once); later runs,
    # such as the one before the group rejoins, pass at once again.
    once, twice = tmp_path / "checked-once", tmp_path / "checked-twice"
    check = (
        f'{sys.executable} -c "import os, time; '
        f"a, b = '{once}', '{twice}'; "
        f"slow = os.path.exists(a) and not os.path.exists(b); "
        f"open(b if os.path.exists(a) else a, 'w').close(); slow and time.sleep(30)\""
    )
    interval = ("--ft-node-health-check-interval", "0.2")
    args = _args("hang_hb", marker_dir, "--node-health-check-cmd", check, *interval)
    launcher = launch(args)
    wait_for_markers(marker_dir, "hang", 1, 120)
    hung_at = time.monotonic()
    launcher.wait_for_log("hung: heartbeat", 120)
    took = time.monotonic() - hung_at
    print(f"the hang was acted on {took:.2f} s after it began")  # shown with pytest -s
    # Expected about the 1.5 s heartbeat timeout plus a 0.1 s check interval; a loop blocked by
    # the check would wait out its 30 s, so the bound sits at 10x the first, short of the second.
    assert took < 20.0, f"the hang was acted on {took:.1f} s after it began\n{launcher.log()}"
    assert launcher.wait(60) == 0, launcher.log()
    assert {"done-0-1", "done-1-1"} <= set(markers(marker_dir, "done"))
