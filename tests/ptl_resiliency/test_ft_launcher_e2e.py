"""End to end under ft-launcher: 2 DDP ranks over gloo, a hang, a restart, resume, finished flag."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from lightning_flavour import MODULE
from ptl_harness import EXAMPLES, Jobs, job_result

LOOP = EXAMPLES / "ptl_autoresume.py"
TRAIN = EXAMPLES / "ptl_train.py"


def _ft_launcher() -> str:
    path = shutil.which("ft-launcher") or str(Path(sys.executable).with_name("ft-launcher"))
    if not Path(path).exists():
        pytest.fail("the ft-launcher console script is not installed (resiliency-ft-launcher)")
    return path


@pytest.mark.slow
def test_hang_restart_resume_finish_and_loop_stops(jobs: Jobs, tmp_path: Path) -> None:
    work, flag = tmp_path / "run", tmp_path / "finished.flag"
    code, out = jobs.run(
        [
            str(LOOP), "--flag-file", str(flag), "--max-jobs", "3", "--",
            _ft_launcher(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
            "--ft-param-initial_rank_heartbeat_timeout", "90",
            # Workers forked from the launcher's pre-imported server, as the README runs it.
            "--ft-preimport", f"torch,{MODULE}",
            "--ft-param-rank_heartbeat_timeout", "4",
            "--ft-param-workload_check_interval", "0.5",
            "--ft-param-termination_grace_period", "2",
            # Generous: timeouts calculated in the resumed attempt must not fire under CI load.
            "--ft-param-safety_factor", "50",
            "--term-timeout", "3", "--workers-stop-timeout", "3",
            str(TRAIN), "--work-dir", str(work), "--autoresume", "--calculate-timeouts",
            "--fault", "rank_hung", "--fault-delay", "2", "--fault-rank", "1",
            "--max-steps", "60", "--step-time", "0.05",
        ],
        timeout=240,
    )  # fmt: skip
    summary = "\n".join(
        line for line in out.splitlines() if line.startswith(("[autoresume]", "[ft-launcher]"))
    )
    assert code == 0, out[-8000:]
    # Attempt 0: rank 1 hangs; its monitor sees the heartbeat stop and ends it.
    assert "rank 1: simulated fault: this rank hangs at its next step" in out
    assert "rank 1 (pid" in out and "[timer: heartbeat]" in out, out[-8000:]
    # Attempt 1 (in the same ft-launcher job) resumes from the last checkpoint and finishes.
    result = job_result(out)
    assert result["restart"] == 1, summary
    assert result["resumed_from"] == str(work / "checkpoints" / "last.ckpt")
    assert result["global_step"] == 60
    assert result["world_size"] == 2
    assert flag.read_text().startswith("training complete at global step 60")
    # The loop stops on the flag after the first job.
    assert "[autoresume] finished flag found after job 1; stopping" in out
    assert "[autoresume] job 2/" not in out
    # The resumed attempt loaded and saved a checkpoint, so it calculated and saved timeouts.
    state = json.loads((work / "ft_state" / "_ft_state.json").read_text())
    assert state["current_timeouts"]["heartbeat"]["were_calculated"] is True


def test_autoresume_loop_follows_the_flag_not_the_exit_code(jobs: Jobs, tmp_path: Path) -> None:
    flag, count = tmp_path / "flag", tmp_path / "count"
    # A job that fails twice, then writes the flag and still exits non-zero.
    job = (
        "import os, pathlib, sys; c = pathlib.Path(sys.argv[1]); "
        "n = int(c.read_text()) + 1 if c.exists() else 1; c.write_text(str(n)); "
        "n == 3 and pathlib.Path(os.environ['FAULT_TOL_FINISHED_FLAG_FILE']).write_text('done'); "
        "sys.exit(7)"
    )
    argv = [str(LOOP), "--flag-file", str(flag), "--max-jobs", "5", "--"]
    code, out = jobs.run([*argv, sys.executable, "-c", job, str(count)], timeout=60)
    assert code == 0, out
    assert count.read_text() == "3"
    assert "finished flag found after job 3; stopping" in out
    # With the flag already there, nothing runs; without it, the loop gives up after --max-jobs.
    code, out = jobs.run([*argv, sys.executable, "-c", job, str(count)], timeout=60)
    assert code == 0 and "nothing to do" in out and count.read_text() == "3"
    flag.unlink()
    count.write_text("10")
    code, out = jobs.run(
        [str(LOOP), "--flag-file", str(flag), "--max-jobs", "2", "--", sys.executable, "-c",
         job, str(count)],
        timeout=60,
    )  # fmt: skip
    assert code == 1
    assert "no finished flag after 2 jobs; giving up" in out
    assert count.read_text() == "12"
