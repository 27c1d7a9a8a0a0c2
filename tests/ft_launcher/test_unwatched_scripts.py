"""A script that never calls init_workload_monitoring() runs as under torchrun (issue 30, item 1).

The startup timer (rank_startup_timeout) is for a rank of a *connecting* script that hangs before
it connects; it must never kill a plain torchrun script, however long it runs. The launcher says
once that such ranks are not hang-watched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_harness import FAST_FT_FLAGS, markers

pytestmark = pytest.mark.slow

PLAIN_WORKER = Path(__file__).parent / "workers" / "plain_worker.py"


def test_plain_script_outlives_the_startup_timeout(launch, marker_dir: Path, tmp_path: Path):
    status = tmp_path / "status.json"
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            *FAST_FT_FLAGS,
            "--ft-rank-startup-timeout",
            "1",
            "--exit-status-file",
            str(status),
            str(PLAIN_WORKER),
            "--marker-dir",
            str(marker_dir),
            "--seconds",
            "5",  # five times the startup timeout
        ]
    )
    assert launcher.wait(60) == 0, launcher.log()
    assert set(markers(marker_dir, "done")) == {"done-0-0", "done-1-0"}
    log = launcher.log()
    assert "hung" not in log and "restarting" not in log, log
    notices = [line for line in log.splitlines() if "are not hang-watched" in line]
    assert len(notices) == 1, log
    assert "ranks 0,1 have not called init_workload_monitoring()" in notices[0]
    assert "limits: connect not required" in log
    verdict = json.loads(status.read_text())
    assert verdict["exit_code"] == 0 and verdict["hangs_detected"] == 0


def test_after_a_connecting_attempt_a_rank_stuck_before_connecting_is_a_hang(
    launch, marker_dir: Path, tmp_path: Path
):
    # Attempt 0 connects (the job uses hang detection) and crashes; attempt 1 hangs in "import".
    script = tmp_path / "connects_then_stalls.py"
    script.write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from resiliency.ft import RankMonitorClient\n"
        "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        f"Path({str(marker_dir)!r}, f'start-0-{{attempt}}-{{os.getpid()}}').write_text('')\n"
        "if attempt == 0:\n"
        "    client = RankMonitorClient()\n"
        "    client.init_workload_monitoring()\n"
        "    client.send_heartbeat()\n"
        "    os._exit(3)\n"
        "time.sleep(3600)\n"
    )
    launcher = launch(
        [
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "1",
            *FAST_FT_FLAGS,
            "--ft-rank-startup-timeout",
            "2",
            str(script),
        ]
    )
    assert launcher.wait(60) == 1, launcher.log()
    log = launcher.log()
    assert "limits: connect within 2 s of spawn" in log, log
    assert "hung: startup timer expired" in log, log
    assert "not hang-watched" not in log
