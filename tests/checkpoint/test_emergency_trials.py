"""Trials: SIGTERM to one rank of a 2-rank gloo job at a seeded random time.

One trial per combination of the victim (rank 0 or 1), the agreement's lead and check interval
((2, 1) or (4, 3)) and asynchronous periodic saves in flight or not: 8 trials, each with its
own seeded delay. (It was 14 trials drawn from seeds, which covered 7 of the 8 combinations.) The
job saves through ``CheckpointManager``; one test uses a slow blocking save callable instead.

Every trial checks: both ranks save the same step (``noticed + lead``), exit as preempted (75)
with their exit info and nothing hangs; the trials with periodic saves (and the slow-save test)
also check that the next job resumes from exactly that step.
"""

from __future__ import annotations

import itertools
import random
import signal
import time
from pathlib import Path

import pytest
from emergency_harness import (
    PREEMPTED,
    Job,
    committed_steps,
    exit_infos,
    noticed_steps,
    resumed_step,
    wait_for_files,
)

from resiliency.checkpoint._emergency.checkpoint import EXIT_INFO_DIR_ENV, PREEMPTED_EXIT_CODE_ENV

pytestmark = pytest.mark.slow

# (victim, lead, check_every, periodic saves): every combination once.
TRIALS = list(itertools.product((0, 1), ((2, 1), (4, 3)), (False, True)))


def _env(exit_dir: Path) -> dict[str, str]:
    exit_dir.mkdir(exist_ok=True)
    return {EXIT_INFO_DIR_ENV: str(exit_dir), PREEMPTED_EXIT_CODE_ENV: str(PREEMPTED)}


def _run_until_preempted(job: Job, timeout: float = 240) -> tuple[list[int], str]:
    try:
        codes = job.wait(timeout)
    finally:
        job.kill()
    return codes, job.log()


def _assert_one_step_saved(tmp_path: Path, exit_dir: Path, codes: list[int], log: str) -> int:
    assert codes == [PREEMPTED, PREEMPTED], log[-8000:]
    infos = exit_infos(exit_dir)
    assert sorted(infos) == ["rank_0.json", "rank_1.json"], log[-8000:]
    assert {i["reason"] for i in infos.values()} == {"preempted"}, infos
    steps = {i["step"] for i in infos.values()}
    assert len(steps) == 1, infos
    step = int(steps.pop())
    assert committed_steps(tmp_path)[-1] == step, log[-8000:]
    return step


def _assert_resumes_from(tmp_path: Path, step: int, *args: str) -> None:
    job = Job(tmp_path, ["--steps", str(step + 3), "--step-time", "0", *args], name="resume")
    codes, log = _run_until_preempted(job)
    assert codes == [0, 0], log[-8000:]
    assert resumed_step(log) == step, log[-4000:]


@pytest.mark.parametrize(
    ("seed", "victim", "agreement", "with_periodic"),
    [(seed, *trial) for seed, trial in enumerate(TRIALS)],
    ids=[f"rank{v}-lead{a[0]}-every{a[1]}-{'periodic' if p else 'idle'}" for v, a, p in TRIALS],
)
def test_sigterm_to_one_rank(
    tmp_path: Path, seed: int, victim: int, agreement: tuple[int, int], with_periodic: bool
) -> None:
    delay = random.Random(seed).uniform(0.0, 1.5)
    lead, check_every = agreement
    exit_dir = tmp_path / "exit"
    periodic = ["--periodic-every", "5"] if with_periodic else []  # async saves in flight
    job = Job(
        tmp_path,
        ["--lead", str(lead), "--check-every", str(check_every), *periodic],
        env=_env(exit_dir),
    )
    try:
        wait_for_files(tmp_path / "markers", "ready-*", 2, 240, job)
        time.sleep(delay)  # a seeded random moment of training: no outcome may depend on it
        job.signal(victim, signal.SIGTERM)
    except BaseException:
        job.kill()
        raise
    codes, log = _run_until_preempted(job)
    step = _assert_one_step_saved(tmp_path, exit_dir, codes, log)
    noticed = noticed_steps(log)
    assert len(noticed) == 1, log[-8000:]  # only the victim saw the signal
    assert step == noticed[0] + lead, (noticed, step)
    if with_periodic:
        # The next job must take the emergency step among the periodic ones. Without periodic
        # saves that step is the only one on disk, so resuming there re-tests a strict subset
        # of this: the idle trials skip that second 2-rank job (~5 s each).
        _assert_resumes_from(tmp_path, step)


def test_signal_during_a_periodic_save_and_again_during_the_emergency_save(
    tmp_path: Path,
) -> None:
    """SIGUSR1 while a (slow) periodic save runs, SIGTERM while the emergency save runs."""
    exit_dir = tmp_path / "exit"
    job = Job(
        tmp_path,
        ["--saver", "simple", "--periodic-every", "20", "--save-sleep", "1.0", "--sigusr1"],
        env=_env(exit_dir),
    )
    markers = tmp_path / "markers"
    try:
        wait_for_files(markers, "saving-1-*", 1, 240, job)
        periodic = int(next(markers.glob("saving-1-*")).name.rsplit("-", 1)[1])
        job.signal(1, signal.SIGUSR1)  # during the periodic save of `periodic`
        wait_for_files(markers, f"saving-0-{periodic + 2}", 1, 120, job)
        job.signal(0, signal.SIGTERM)  # during the emergency save: must change nothing
    except BaseException:
        job.kill()
        raise
    codes, log = _run_until_preempted(job)
    step = _assert_one_step_saved(tmp_path, exit_dir, codes, log)
    assert step == periodic + 2, log[-8000:]  # noticed right after the periodic save
    assert "got SIGUSR1 at step" in log
    _assert_resumes_from(tmp_path, step, "--saver", "simple")
