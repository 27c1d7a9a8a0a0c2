"""SIGUSR2 as the termination signal moves the stack dump to SIGUSR1: it dumps, never kills.

The scenario is NVIDIA's launcher config-dump test (issue 28): four ranks connect with a 1 s
initial heartbeat timeout and exit 0 without a heartbeat. Their interpreters' teardown outlasts
the timeout after they closed their connections, and the teardown unregisters faulthandler, so a
dump signal sent then would end them with SIGUSR1 (exit -10).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from launcher_harness import FAST_FT_FLAGS, WORKER, wait_for_markers

pytestmark = pytest.mark.slow

CONFIG_DUMP_WORKER = Path(__file__).parent / "workers" / "config_dump_worker.py"


def test_config_dump_scenario_with_sigusr2_termination_exits_0(launch, marker_dir, tmp_path):
    launcher = launch(
        [
            "--ft-workload-check-interval=321.0",
            "--ft-initial-rank-heartbeat-timeout=1.0",
            "--ft-rank-heartbeat-timeout=2.0",
            "--ft-rank-termination-signal=SIGUSR2",
            "--ft-log-level=INFO",
            "--no-gpu-health-check",
            "--nproc-per-node=4",
            str(CONFIG_DUMP_WORKER),
            str(marker_dir),
            str(tmp_path),
        ]
    )
    code = launcher.wait(180)
    log = launcher.log()
    assert code == 0, log
    assert "ALL RANKS STARTED" in log
    assert " hung: " not in log, log
    dumped = yaml.safe_load((tmp_path / "cfg_dump.yaml").read_text())
    section = dumped.get("fault_tolerance", dumped)
    assert section["rank_termination_signal"] == "SIGUSR2"
    assert section["stack_dump_signal"] == "SIGUSR1"
    assert section["initial_rank_heartbeat_timeout"] == 1.0
    assert "watching its exit" in log


def test_real_hang_with_sigusr2_termination_dumps_the_stacks_before_the_kill(launch, marker_dir):
    launcher = launch(
        [
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "0",
            *FAST_FT_FLAGS,
            "--ft-rank-termination-signal",
            "SIGUSR2",
            str(WORKER),
            "--mode",
            "hang_hb",
            "--marker-dir",
            str(marker_dir),
        ]
    )
    wait_for_markers(marker_dir, "hang", 1, 60)
    assert launcher.wait(90) == 1, launcher.log()
    log = launcher.log()
    asked = log.index("asked rank 1 (pid")
    assert "to dump its Python stacks (SIGUSR1)" in log[asked : asked + 200]
    dump = log.index("stack dump of rank 1 (pid")
    killed = log.index("sent SIGUSR2 to rank 1")
    assert asked < dump < killed, log
    # The dump is the hung rank's own stack: the sleep in the worker's step loop.
    assert "ft_worker.py" in log[dump:killed], log[dump:killed]
    assert "ended by SIGUSR2" in log
