"""FaultToleranceSectionsCallback against real rank monitors, the training job in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ptl_harness import JOB, Jobs, Monitors, wait_for_event

BASE_CFG: dict[str, Any] = {
    "workload_check_interval": 0.2,
    "initial_rank_heartbeat_timeout": 90.0,
    "rank_heartbeat_timeout": None,
    "termination_grace_period": 2.0,
    "stack_dump_timeout": 1.0,
    "safety_factor": 20.0,
    # These tests check the calculation itself; the floor has its own tests (tests/ft_core).
    "calculated_timeout_floor": 0.0,
}


def _start(
    jobs: Jobs, monitors: Monitors, work: Path, flag: Path, cfg: dict[str, Any], *extra: str
) -> tuple[Any, Any]:
    mon = monitors.start(0, **{**BASE_CFG, **cfg})
    env = {
        "FT_RANK_MONITOR_IPC_SOCKET": str(mon.socket_path),
        "FAULT_TOL_FINISHED_FLAG_FILE": str(flag),
    }
    argv = [str(JOB), "--work-dir", str(work), "--ft", "sections", "--autoresume", *extra]
    proc = jobs.start(argv, env)
    mon.worker_started(proc.pid, rank=0)
    return mon, proc


@pytest.mark.slow
def test_hangs_in_step_and_in_checkpointing_are_caught_by_their_section(
    jobs: Jobs, monitors: Monitors, tmp_path: Path
) -> None:
    # Two independent jobs run side by side; each section's timeout is tight only in its own job.
    loose = {"setup": 120.0, "step": 60.0, "checkpointing": 60.0}
    step_mon, step_proc = _start(
        jobs, monitors, tmp_path / "a", tmp_path / "a.flag",
        {"rank_section_timeouts": {**loose, "step": 2.0}},
        "--hang-in", "step", "--fault-step", "3", "--max-steps", "1000",
    )  # fmt: skip
    ckpt_mon, ckpt_proc = _start(
        jobs, monitors, tmp_path / "b", tmp_path / "b.flag",
        {"rank_section_timeouts": {**loose, "checkpointing": 2.0}},
        "--hang-in", "checkpointing", "--fault-step", "1", "--ckpt-every", "2",
        "--max-steps", "1000",
    )  # fmt: skip
    cases = [(step_mon, step_proc, "step"), (ckpt_mon, ckpt_proc, "checkpointing")]
    for mon, proc, section in cases:
        event = wait_for_event(mon, "hang", timeout=90)
        assert event.timer == f"section:{section}", event
        assert event.limit == 2.0
        assert 2.0 <= event.elapsed < 30.0
        assert event.pid == proc.pid
        code, out = jobs.finish(proc, timeout=30)
        assert code != 0
        assert f"TEST_HANG {section}" in out
    assert not (tmp_path / "a.flag").exists() and not (tmp_path / "b.flag").exists()


@pytest.mark.slow
def test_section_timeouts_calculated_persisted_and_used(
    jobs: Jobs, monitors: Monitors, tmp_path: Path
) -> None:
    work, flag = tmp_path / "run", tmp_path / "finished.flag"
    state_file = work / "ft_state" / "_ft_state_.json"  # NVIDIA's name for the sections variant
    cfg = {
        "rank_section_timeouts": {"setup": 600.0, "step": 600.0, "checkpointing": 600.0},
        # Generous: calculated timeouts must not fire on a busy 2-core CI machine.
        "safety_factor": 100.0,
    }
    calc = "--calculate-timeouts"
    _, proc = _start(jobs, monitors, work, flag, cfg, calc, "--max-steps", "10")
    code, out = jobs.finish(proc, timeout=90)
    assert code == 0, out[-6000:]
    assert not state_file.exists()
    flag.unlink()

    _, proc = _start(jobs, monitors, work, flag, cfg, calc, "--max-steps", "20")
    code, out = jobs.finish(proc, timeout=90)
    assert code == 0, out[-6000:]
    sections = json.loads(state_file.read_text())["current_timeouts"]["section"]
    assert set(sections["calculated_sections"]) >= {"setup", "step", "checkpointing"}
    step_limit = sections["section"]["step"]
    assert 0 < step_limit < 600.0
    assert 0 < sections["section"]["checkpointing"] < 600.0
    flag.unlink()

    # A new job (new monitor) loads them: its step section now times out at the calculated limit.
    # It hangs at step 22, before its own first save (step 25), so nothing was recalculated.
    mon, proc = _start(
        jobs, monitors, work, flag, cfg, calc,
        "--max-steps", "100000", "--hang-in", "step", "--fault-step", "22",
        "--fault-when", "always",
    )  # fmt: skip
    event = wait_for_event(mon, "hang", timeout=60 + step_limit)
    assert event.timer == "section:step"
    assert event.limit == pytest.approx(step_limit)
    code, out = jobs.finish(proc, timeout=30)
    assert code != 0
    assert "loaded calculated timeouts from" in out


@pytest.mark.slow
def test_exception_policy_shutdown_ends_the_job_and_writes_the_flag(
    jobs: Jobs, monitors: Monitors, tmp_path: Path
) -> None:
    flag = tmp_path / "finished.flag"
    mon, proc = _start(
        jobs, monitors, tmp_path / "run", flag,
        {"rank_section_timeouts": {"setup": 120.0, "step": 60.0, "checkpointing": 60.0}},
        "--raise-at-step", "3", "--shutdown-on-runtime-error", "--max-steps", "100",
    )  # fmt: skip
    event = wait_for_event(mon, "wlc", timeout=90)
    assert event.action == "ShutdownWorkload"
    assert "unrecoverable data error at step 3" in (event.desc or "")
    code, out = jobs.finish(proc, timeout=30)
    assert code != 0
    assert "RuntimeError: unrecoverable data error" in out
    assert flag.read_text().startswith("workload shut down by rank 0")
    assert "PTL_TRAIN_RESULT" not in out
