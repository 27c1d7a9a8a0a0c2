"""The DDP examples under ft-launcher: a hang in a section is survived; auto-resume finishes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import REPO, Launcher

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples"
FLAGS = [
    "--nproc-per-node",
    "2",
    "--monitor-interval",
    "0.1",
    "--ft-workload-check-interval",
    "0.2",
    "--ft-initial-rank-heartbeat-timeout",
    "60",
    "--ft-stack-dump-timeout",
    "0.5",
    "--workers-stop-timeout",
    "3",
    "--no-gpu-health-check",
]


def test_sections_example_survives_a_hang_in_a_section(tmp_path: Path):
    flag = tmp_path / "finished"
    launcher = Launcher(
        [
            *FLAGS,
            # Both attempts' ranks fork from a server that imported torch once (as a user's job
            # can): 1 import of torch instead of 4. auto_resume below keeps the plain start.
            "--ft-preimport",
            "torch",
            "--max-restarts",
            "1",
            "--ft-rank-heartbeat-timeout",
            "null",
            "--ft-rank-section-timeouts",
            "step:2,checkpoint:30,setup:60",
            "--finished-flag-file",
            str(flag),
            str(EXAMPLES / "train_ddp_sections.py"),
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--steps",
            "12",
            "--hang-rank",
            "1",
            "--hang-step",
            "7",
        ],
        tmp_path / "launcher.log",
    )
    try:
        assert launcher.wait(120) == 0, launcher.log()
    finally:
        launcher.kill()
    log = launcher.log()
    assert "hung: section:step" in log
    assert "attempt 1 resumes at step 5" in log
    assert flag.exists()


def test_auto_resume_loops_until_the_flag_exists(tmp_path: Path):
    flag = tmp_path / "finished"
    env = dict(os.environ)
    env.update(
        FAULT_TOL_FINISHED_FLAG_FILE=str(flag),
        FT_MAX_FAILURES="2",
        FT_LAUNCHER=f"{sys.executable} -m resiliency.launcher",
    )
    proc = subprocess.Popen(
        [
            "bash",
            str(EXAMPLES / "auto_resume.sh"),
            *FLAGS,
            "--max-restarts",
            "0",  # the crash ends the first launcher run; auto-resume starts a second one
            "--ft-rank-heartbeat-timeout",
            "10",
            str(EXAMPLES / "train_ddp_heartbeats.py"),
            "--ckpt-dir",
            str(tmp_path / "ckpt"),
            "--steps",
            "12",
            "--crash-rank",
            "1",
            "--crash-step",
            "7",
            "--fault-once-file",
            str(tmp_path / "crashed-once"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    assert proc.returncode == 0, out
    assert "auto_resume: run 2" in out and "auto_resume: run 3" not in out
    assert "ft-launcher exits 1 (restarts_exhausted)" in out
    assert "resumes at step 5" in out
    assert "training finished after 2 run(s)" in out
    assert flag.exists()
