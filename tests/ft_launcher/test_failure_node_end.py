"""The verdicts of the ways a job ends outside a plain crash or hang (issue 28), on real processes.

Real ft-launcher, 2 real ranks, a goodput ledger: a worker's exit 78, the scheduler's SIGTERM
(a preemption), a failed node health check and a killed rank monitor each leave one
``diagnosis`` event with their class, culprit and decision.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, WORKER, wait_for_markers

from resiliency.goodput import read_ledger

pytestmark = pytest.mark.slow

CONFIG_WORKER = Path(__file__).parent / "workers" / "config_exit_worker.py"


def _diagnoses(ledger: Path) -> list[dict]:
    return [e.data for e in read_ledger([ledger]).events if e.event == "diagnosis"]


def _args(ledger: Path, mode: str, marker_dir: Path, *extra: str) -> list[str]:
    return [
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--goodput-dir",
        str(ledger),
        *FAST_FT_FLAGS,
        *extra,
        str(WORKER),
        "--mode",
        mode,
        "--marker-dir",
        str(marker_dir),
    ]


def test_a_workers_exit_78_is_a_configuration_error_that_stops_the_job(
    launch, marker_dir, tmp_path
):
    ledger = tmp_path / "ledger"
    args = ["--nproc-per-node", "2", "--max-restarts", "5", "--goodput-dir", str(ledger)]
    launcher = launch([*args, *FAST_FT_FLAGS, str(CONFIG_WORKER), str(marker_dir)])
    assert launcher.wait(120) == 2, launcher.log()
    log = launcher.log()
    assert "exits 2 (worker_config_error)" in log, log
    assert "diagnosis: config (ranks 1, nodes 0): exit code 78" in log, log
    (verdict,) = _diagnoses(ledger)
    assert verdict["cls"] == "config" and verdict["culprit_ranks"] == [1], verdict
    assert (verdict["decision"], verdict["rule"]) == ("stop", "config_exit_78"), verdict


def test_sigterm_to_the_launcher_is_a_preemption_of_its_node(launch, marker_dir, tmp_path):
    ledger = tmp_path / "ledger"
    launcher = launch(_args(ledger, "exit_on_sigterm", marker_dir))
    launcher.wait_for_log("workers started", 120)
    wait_for_markers(marker_dir, "armed", 2, 120)
    launcher.signal(signal.SIGTERM)
    assert launcher.wait(30) == 0, launcher.log()
    (verdict,) = _diagnoses(ledger)
    assert verdict["cls"] == "preemption", verdict
    assert verdict["culprit_nodes"] == ["0"] and verdict["culprit_ranks"] == [], verdict
    assert (verdict["decision"], verdict["rule"]) == ("stop", "preempted"), verdict
    assert "got SIGTERM" in verdict["evidence"]["cause"], verdict


def test_a_failed_health_check_names_the_node_that_leaves(launch, marker_dir, tmp_path):
    ledger, flag = tmp_path / "ledger", tmp_path / "scratch-read-only"
    check = (
        f'{sys.executable} -c "import os, sys; '
        f"sys.exit('/scratch is read-only' if os.path.exists('{flag}') else 0)\""
    )
    extra = ("--node-health-check-cmd", check, "--ft-node-health-check-interval", "0.2")
    launcher = launch([*_args(ledger, "ok", marker_dir, *extra), "--steps", "400"])
    wait_for_markers(marker_dir, "start", 2, 120)
    flag.touch()
    assert launcher.wait(30) == 4, launcher.log()
    (verdict,) = _diagnoses(ledger)
    assert verdict["cls"] == "node_health", verdict
    assert verdict["culprit_nodes"] == ["0"], verdict
    assert verdict["decision"] == "restart_without_node", verdict
    assert "/scratch is read-only" in verdict["evidence"]["cause"], verdict


def test_a_killed_rank_monitor_is_named_with_its_rank(launch, marker_dir, tmp_path):
    ledger = tmp_path / "ledger"
    launcher = launch([*_args(ledger, "ok", marker_dir), "--steps", "60"])
    launcher.wait_for_log("workers started", 120)
    found = re.search(r"rank monitor for local rank 1 started \(pid (\d+)\)", launcher.log())
    assert found, launcher.log()
    os.kill(int(found.group(1)), signal.SIGKILL)
    assert launcher.wait(60) == 0, launcher.log()
    (verdict,) = _diagnoses(ledger)
    assert verdict["cls"] == "monitor", verdict
    assert verdict["culprit_ranks"] == [1] and verdict["decision"] == "restart", verdict
