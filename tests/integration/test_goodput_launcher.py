"""A real 2-rank ft-launcher job with a hang and a restart writes its goodput ledger by itself.

The job is examples/train_ddp_heartbeats.py (gloo, CPU): checkpoints every 10 steps, rank 1
hangs at step 25 on the first attempt, the launcher detects it (heartbeat timeout 1.5 s),
restarts the workers, and they resume from the checkpoint of step 20. The worker adds only
``recorder.step(n)`` and its checkpoint events; the launcher writes job, cycle and hang events.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("resiliency.launcher")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import REPO, Launcher

from resiliency.goodput import compute, read_ledger

pytestmark = pytest.mark.slow

RESTORED_STEP = 20
FLAGS = [
    "--nproc-per-node",
    "2",
    "--max-restarts",
    "2",
    "--monitor-interval",
    "0.1",
    "--ft-workload-check-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "90",
    "--ft-rank-heartbeat-timeout",
    "1.5",
    "--ft-stack-dump-timeout",
    "0.5",
    "--ft-termination-grace-period",
    "1",
    "--workers-stop-timeout",
    "3",
    "--no-gpu-health-check",
    # Both attempts' ranks fork from a server that imported torch once (1 import instead of 4).
    "--ft-preimport",
    "torch",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Run the job once; return its ledger directory and the launcher's log."""
    tmp = tmp_path_factory.mktemp("goodput-job")
    ledger = tmp / "ledger"
    launcher = Launcher(
        [
            *FLAGS,
            "--goodput-dir",
            str(ledger),
            str(REPO / "examples" / "train_ddp_heartbeats.py"),
            "--ckpt-dir",
            str(tmp / "ckpt"),
            "--steps",
            "40",
            "--ckpt-every",
            "10",
            "--step-time",
            "0.1",
            "--hang-rank",
            "1",
            "--hang-step",
            "25",
        ],
        tmp / "launcher.log",
    )
    try:
        code = launcher.wait(240)
        log = launcher.log()
    finally:
        launcher.kill()
    assert code == 0, log[-6000:]
    assert "attempt 1 resumes at step 20" in log, log[-6000:]
    return ledger, log


def test_the_ledger_is_written_by_the_launcher_and_the_worker(job: tuple[Path, str]) -> None:
    ledger_dir, _ = job
    files = list(ledger_dir.glob("*.jsonl"))
    assert len(files) == 1, files  # one node, one file: launcher and ranks share it
    ledger = read_ledger([ledger_dir])
    assert not ledger.warnings, ledger.warnings
    kinds = [e.event for e in ledger.events]
    for kind in ("job_started", "cycle_started", "hang_detected", "cycle_ended", "job_ended"):
        assert kind in kinds, kinds
    assert kinds.count("cycle_started") == 2
    ended = [e.data for e in ledger.events if e.event == "cycle_ended"]
    assert ended[0]["cause"] == "hang" and ended[0]["timer"] == "heartbeat"
    assert 1 in ended[0]["ranks"]
    assert ended[1]["cause"] == "success"
    job_ended = next(e.data for e in ledger.events if e.event == "job_ended")
    assert job_ended["exit_code"] == 0 and job_ended["reason"] == "succeeded"
    hang = next(e.data for e in ledger.events if e.event == "hang_detected")
    assert hang["timeout_s"] == pytest.approx(1.5) and hang["latency_s"] >= 0
    assert ledger.steps and max(s[1] for s in ledger.steps) == 40
    assert {s[2] for s in ledger.steps} == {0, 1}  # attempts
    loaded = [e.data for e in ledger.events if e.event == "checkpoint_loaded"]
    assert [d["step"] for d in loaded] == [RESTORED_STEP]


def test_report_of_the_hang_and_restart(job: tuple[Path, str]) -> None:
    ledger_dir, _ = job
    ledger = read_ledger([ledger_dir])
    report = compute(ledger, "auto")
    whole = report.whole
    ideal = report.ideal_step_time_s
    # --step-time 0.1 plus the step itself: expected just over 0.1 s; the bound is 10x that.
    assert ideal is not None and 0.1 <= ideal < 1.5

    # The categories sum to the total (within 1 %).
    assert sum(whole.seconds.values()) == pytest.approx(whole.total, rel=0.01)

    first, second = report.attempts
    assert (first.cause, first.timer) == ("hang", "heartbeat")
    assert second.cause == "success" and second.restore_step == RESTORED_STEP
    assert (report.initial_step, report.final_step) == (0, 40)

    # Restart covers the hang detection (from the hang's start to its detection) plus the
    # respawn (to the first progress of the next cycle, its checkpoint load excluded).
    events = ledger.events
    hang = next(e for e in events if e.event == "hang_detected")
    hang_start = hang.time - hang.data["latency_s"] - hang.data["timeout_s"]
    load = next(e for e in events if e.event == "checkpoint_loaded")
    respawned = next(e for e in events if e.event == "cycle_started" and e.data["cycle"] == 1)
    assert hang_start < hang.time < respawned.time < load.time
    assert whole.hang_detection == pytest.approx(hang.time - hang_start, abs=0.01)
    assert whole.hang_detection >= 1.5
    expected_restart = load.time - hang_start - load.data["duration_s"]
    assert whole.seconds["restart"] == pytest.approx(expected_restart, abs=0.05)
    assert whole.seconds["restart"] > whole.hang_detection + (respawned.time - hang.time)

    # Lost progress = the steps redone after the restart x the step time.
    last_before = max(s for t, s, _ in ledger.steps if t <= hang_start)
    redone = last_before - RESTORED_STEP
    assert redone >= 5
    lost = whole.seconds["lost_progress"]
    assert abs(lost - redone * ideal) <= 2 * ideal + 0.15, (lost, redone, ideal)

    # Productive time = kept new steps (40 from scratch) x the ideal step time.
    assert whole.seconds["productive"] == pytest.approx(40 * ideal, rel=0.05)


def test_cli_report_and_plot_of_the_job(job: tuple[Path, str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import subprocess  # noqa: PLC0415

    ledger_dir, _ = job
    png = tmp_path / "job.png"
    result = subprocess.run(
        [sys.executable, "-m", "resiliency.goodput", "report", str(ledger_dir), "--plot", str(png)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "of which hang detection" in result.stdout and "#0 hang (heartbeat)" in result.stdout
    assert png.read_bytes().startswith(b"\x89PNG")
