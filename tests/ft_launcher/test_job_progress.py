"""The job's progress for the stop rules: the highest step of the ledger the ranks write."""

from __future__ import annotations

from pathlib import Path

from resiliency.goodput import Recorder
from resiliency.launcher._job_progress import highest_step


def test_no_ledger_is_no_progress_known(tmp_path: Path) -> None:
    assert highest_step(None) is None
    assert highest_step(str(tmp_path)) is None  # a ledger directory nobody wrote yet


def test_the_highest_step_or_committed_checkpoint(tmp_path: Path) -> None:
    rank0 = Recorder(tmp_path, job="j", rank=0, step_interval_s=0.0)
    for step in range(1, 8):
        rank0.step(step)
    rank0.emit("checkpoint_saved", step=5, tier="persistent", bytes=1, blocked_s=0.1, total_s=1.0)
    rank0.close()
    assert highest_step(str(tmp_path)) == 7
    # A second attempt resumed from step 5 and got to 12 in a checkpoint only.
    again = Recorder(tmp_path, job="j", rank=0, attempt=1, step_interval_s=0.0)
    again.emit("checkpoint_loaded", step=5, tier="persistent", total_s=0.5)
    again.emit("checkpoint_saved", step=12, tier="persistent", bytes=1, blocked_s=0.1, total_s=1.0)
    again.close()
    assert highest_step(str(tmp_path)) == 12


def test_an_unreadable_ledger_is_logged_not_raised(tmp_path: Path, caplog) -> None:
    missing = tmp_path / "gone"
    assert highest_step(str(missing)) is None
    assert "cannot read the job's progress" in caplog.text and str(missing) in caplog.text
