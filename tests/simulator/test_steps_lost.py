"""Steps lost to a kill, from a ledger whose step events are sampled as the recorder does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resiliency.goodput import read_ledger
from resiliency.simulator import Fault, Injection, outcomes, timeline_of

JOB = Path(__file__).with_name("_sampled_steps_job.py")
T0 = 1_000.0


def _kill_at(t: float) -> Injection:
    return Injection(Fault(at_s=t - T0, kind="kill", victim=0, seed=0), 0.0, t, "rank 0", "SIGKILL")


def test_the_unsampled_tail_before_a_kill_counts_as_lost() -> None:
    # What the recorder writes at 4 steps/s: one sample a second (steps 4, 8, ..., 20), and the
    # kill 0.9 s after the last one takes steps 21-23 with it; the job resumes from step 10.
    timeline = [(T0 + s / 4, {"event": "step", "step": s, "attempt": 0}) for s in range(4, 21, 4)]
    timeline += [
        (T0 + 8.0, {"event": "checkpoint_load_started", "tier": "persistent"}),
        (T0 + 9.0, {"event": "checkpoint_loaded", "step": 10}),
        (T0 + 10.0, {"event": "step", "step": 14, "attempt": 1}),
    ]
    (row,) = outcomes([_kill_at(T0 + 5.9)], timeline, T0)
    assert row.steps_lost == 23 - 10  # the newest sample alone says 20 - 10


def test_a_checkpoint_save_newer_than_the_samples_names_the_step() -> None:
    timeline = [
        (T0 + 1.0, {"event": "step", "step": 30, "attempt": 0}),
        (T0 + 1.5, {"event": "checkpoint_save_started", "step": 33}),
        (T0 + 20.0, {"event": "checkpoint_loaded", "step": 20}),
        (T0 + 21.0, {"event": "step", "step": 21, "attempt": 1}),
    ]
    (row,) = outcomes([_kill_at(T0 + 1.6)], timeline, T0)
    assert row.steps_lost == 33 - 20


def test_a_long_pause_before_the_fault_is_not_taken_for_steps() -> None:
    # Samples a second apart at 4 steps/s, then 30 s without steps (a slow save): the recorder
    # flushed meanwhile and wrote no newer step, so the newest sample is the step reached.
    timeline = [(T0 + s / 4, {"event": "step", "step": s, "attempt": 0}) for s in range(4, 21, 4)]
    timeline += [
        (T0 + 40.0, {"event": "checkpoint_loaded", "step": 10}),
        (T0 + 41.0, {"event": "step", "step": 11, "attempt": 1}),
    ]
    (row,) = outcomes([_kill_at(T0 + 35.0)], timeline, T0)
    assert row.steps_lost == 20 - 10


def test_an_earlier_attempts_save_is_not_this_attempts_progress() -> None:
    timeline = [
        (T0 + 1.0, {"event": "checkpoint_saved", "step": 50}),
        (T0 + 2.0, {"event": "checkpoint_loaded", "step": 40}),
        (T0 + 3.0, {"event": "step", "step": 42, "attempt": 1}),
        (T0 + 9.0, {"event": "checkpoint_loaded", "step": 40}),
        (T0 + 10.0, {"event": "step", "step": 41, "attempt": 2}),
    ]
    (row,) = outcomes([_kill_at(T0 + 3.1)], timeline, T0)
    assert row.steps_lost == 2


def _newest_sample(ledger_dir: Path) -> int:
    steps = [s for _, s, _ in read_ledger([ledger_dir]).steps]
    return max(steps, default=0)


def _wait_for(what: str, check: object, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not callable(check) or not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.01)


def _killed_run(tmp_path: Path) -> tuple[Path, int, float]:
    """Run attempt 0 and SIGKILL it while its ledger is 5+ steps behind; return what it did."""
    ledger, truth = tmp_path / "ledger", tmp_path / "truth"
    cmd = [sys.executable, str(JOB), str(ledger), str(truth), "0"]
    proc = subprocess.Popen(cmd)
    try:
        _wait_for("step 30", lambda: truth.exists() and int(truth.read_text()) >= 30, 60.0)
        _wait_for(
            "5 unrecorded steps",
            lambda: int(truth.read_text()) - _newest_sample(ledger) >= 5,
            30.0,
        )
        os.kill(proc.pid, signal.SIGKILL)
        killed_wall = time.time()
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return ledger, int(truth.read_text()), killed_wall


def test_a_killed_job_with_the_real_recorder(tmp_path: Path) -> None:
    for attempt in range(3):  # the recorder may flush between the check and the kill
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        ledger, reached, killed_wall = _killed_run(run_dir)
        if reached - _newest_sample(ledger) >= 3:
            break
    else:
        pytest.fail("the recorder flushed right before each of 3 kills")
    resume_from = reached - 15
    resume = [str(run_dir / "truth1"), "1", str(resume_from), str(reached + 3)]
    subprocess.run(
        [sys.executable, str(JOB), str(ledger), *resume],
        check=True,
        timeout=60,
    )
    timeline = timeline_of(read_ledger([ledger]))
    fault = Injection(Fault(at_s=0.0, kind="kill", victim=0, seed=0), 0.0, killed_wall, "rank 0")
    (row,) = outcomes([fault], timeline, timeline[0][0])
    assert row.steps_lost is not None
    # The truth file trails the recorder by at most the step being written at the kill.
    assert abs(row.steps_lost - (reached - resume_from)) <= 1, (row, reached, resume_from)
