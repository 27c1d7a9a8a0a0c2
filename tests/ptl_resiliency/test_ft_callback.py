"""FaultToleranceCallback against a real rank monitor, the training job in a subprocess.

The test plays the launcher: it starts one monitor per job (``MonitorProcess``), starts the
training process with ``FT_RANK_MONITOR_IPC_SOCKET`` pointing at it, and reports the worker pid.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from ptl_harness import JOB, Jobs, Monitors, job_result, wait_for_event

FT_SOCKET = "FT_RANK_MONITOR_IPC_SOCKET"

MONITOR_CFG = {
    "workload_check_interval": 0.2,
    "initial_rank_heartbeat_timeout": 90.0,
    "rank_heartbeat_timeout": 600.0,
    # Generous: calculated timeouts must not fire on a busy 2-core CI machine before the fault.
    "safety_factor": 50.0,
    # These tests check the calculation itself; the floor has its own tests (tests/ft_core).
    "calculated_timeout_floor": 0.0,
    "termination_grace_period": 2.0,
    "stack_dump_timeout": 1.0,
}


def _start_job(
    jobs: Jobs, monitors: Monitors, work: Path, flag: Path, *extra: str
) -> tuple[object, object]:
    mon = monitors.start(0, **MONITOR_CFG)
    env = {
        "FT_RANK_MONITOR_IPC_SOCKET": str(mon.socket_path),
        "FAULT_TOL_FINISHED_FLAG_FILE": str(flag),
    }
    argv = [str(JOB), "--work-dir", str(work), "--ft", "heartbeats", "--autoresume", *extra]
    proc = jobs.start([*argv, "--calculate-timeouts"], env)
    mon.worker_started(proc.pid, rank=0)
    return mon, proc


@pytest.mark.slow
def test_timeouts_calculated_persisted_and_used_by_the_next_job(
    jobs: Jobs, monitors: Monitors, tmp_path: Path
) -> None:
    work, flag = tmp_path / "run", tmp_path / "finished.flag"
    state_file = work / "ft_state" / "_ft_state.json"

    # Job 1 starts from scratch: it saves checkpoints but loads none, so nothing is calculated.
    mon, proc = _start_job(jobs, monitors, work, flag, "--max-steps", "10")
    code, out = jobs.finish(proc, timeout=90)
    assert code == 0, out[-6000:]
    assert job_result(out)["global_step"] == 10
    assert not state_file.exists()
    assert flag.read_text().startswith("training complete at global step 10"), "flag missing"
    flag.unlink()
    mon.stop()

    # Job 2 resumes (a load) and saves: timeouts are calculated and written.
    mon, proc = _start_job(jobs, monitors, work, flag, "--max-steps", "20")
    code, out = jobs.finish(proc, timeout=90)
    assert code == 0, out[-6000:]
    assert job_result(out)["resumed_from"].endswith("last.ckpt")
    assert "calculated timeouts saved to" in out
    hb = json.loads(state_file.read_text())["current_timeouts"]["heartbeat"]
    assert hb["were_calculated"] is True
    assert 0 < hb["subsequent"] < MONITOR_CFG["rank_heartbeat_timeout"]
    assert flag.exists()
    flag.unlink()
    mon.stop()

    # Job 3 (fresh monitor) loads them; a simulated hang is caught by the calculated timeout.
    # It saves no checkpoint, so it never recalculates: the limit is exactly the loaded one.
    mon, proc = _start_job(
        jobs, monitors, work, flag,
        "--max-steps", "100000", "--ckpt-every", "100000",
        "--fault", "rank_hung", "--fault-delay", "1", "--fault-when", "always",
    )  # fmt: skip
    event = wait_for_event(mon, "hang", timeout=60 + hb["subsequent"])
    assert event.timer == "heartbeat"
    assert event.limit == pytest.approx(hb["subsequent"])
    assert event.pid == proc.pid
    assert "maybe_hang" in (event.stack_dump or ""), "the stack dump shows where the rank hung"
    code, out = jobs.finish(proc, timeout=30)
    assert code != 0
    assert "loaded calculated timeouts from" in out
    assert "simulated fault: this rank hangs" in out
    assert not flag.exists(), "an interrupted job must not write the finished flag"


@pytest.mark.slow
def test_simulated_rank_killed(jobs: Jobs, monitors: Monitors, tmp_path: Path) -> None:
    mon, proc = _start_job(
        jobs, monitors, tmp_path / "run", tmp_path / "flag",
        "--max-steps", "100000", "--fault", "rank_killed", "--fault-delay", "0.5",
    )  # fmt: skip
    code, out = jobs.finish(proc, timeout=60)
    assert code == -signal.SIGKILL, out[-4000:]
    assert "simulated fault: killing this rank" in out
    wait_for_event(mon, "rank_disconnected", timeout=10)
    assert not os.path.exists(tmp_path / "flag")


@pytest.mark.slow
def test_timeouts_are_calculated_from_the_dcp_checkpoint_callbacks_saves_and_loads(
    jobs: Jobs, monitors: Monitors, tmp_path: Path
) -> None:
    # DistributedCheckpointCallback saves and loads outside Lightning's checkpoint hooks; the
    # FT callback must still see both, or calculated timeouts silently never happen.
    work = tmp_path / "run"
    state_file = work / "ft" / "_ft_state.json"
    job = str(Path(__file__).parent / "dcp_ft_job.py")
    results = []
    for max_steps in (6, 10):
        mon = monitors.start(0, **MONITOR_CFG)
        proc = jobs.start([job, str(work), str(max_steps)], {FT_SOCKET: str(mon.socket_path)})
        mon.worker_started(proc.pid, rank=0)
        code, out = jobs.finish(proc, timeout=120)
        assert code == 0, out[-6000:]
        line = next(x for x in out.splitlines() if x.startswith("DCP_FT_RESULT "))
        results.append(json.loads(line.split(" ", 1)[1]))
        if max_steps == 6:  # a fresh job: saves, but no load, so nothing is calculated yet
            assert not state_file.exists(), out[-4000:]
        mon.stop()
    assert results == [
        {"resumed_step": None, "global_step": 6},
        {"resumed_step": 6, "global_step": 10},
    ]
    hb = json.loads(state_file.read_text())["current_timeouts"]["heartbeat"]
    assert hb["were_calculated"] is True
    assert 0 < hb["subsequent"] < MONITOR_CFG["rank_heartbeat_timeout"]
