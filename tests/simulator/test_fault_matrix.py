"""The fault matrix: each fault kind once, injected from outside into a short real job.

The job is ``examples/train_resilient.py`` (2 ranks, DDP over gloo, heartbeats, asynchronous
verified checkpoints, emergency checkpoint, goodput steps) under a real ``ft-launcher``. For each
kind the test asserts that the fault was detected (or refused with a clear message), that the job
recovered and finished, that no checkpoint was lost, and that no process of the job is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from resiliency.goodput import read_ledger
from resiliency.simulator import (
    Fault,
    FaultPlan,
    JobRunner,
    RunnerOptions,
    outcomes,
    timeline_of,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_resilient.py"
STEPS = 50
# 50 steps of 0.1 s: a fault 2 s after the first step (seen up to a second late, the ledger's
# flush) lands with a checkpoint behind it and steps still ahead.
FAULT_AFTER_FIRST_STEP_S = 2.0
LAUNCHER_FLAGS = [
    "--nproc-per-node",
    "2",
    "--max-restarts",
    "3",
    "--monitor-interval",
    "0.1",
    "--ft-workload-check-interval",
    "0.1",
    "--ft-rank-heartbeat-timeout",
    "5",
    "--ft-initial-rank-heartbeat-timeout",
    "60",
    "--ft-stack-dump-timeout",
    "0.5",
    "--ft-termination-grace-period",
    "1",
    "--workers-stop-timeout",
    "3",
    "--term-timeout",
    "30",
    "--no-gpu-health-check",
    # Workers of every restart fork from a server that imported these once (as the benchmark).
    "--ft-preimport",
    "torch,resiliency.checkpoint,resiliency.ft,resiliency.goodput",
]


@dataclass
class Run:
    """What one simulated job left behind."""

    code: int | None
    injections: list
    rows: list
    ledger_dir: Path
    ckpt_dir: Path
    log: str
    job_id: str


def _job_processes(job_id: str) -> list[int]:
    """Pids whose environment names this job (found by environment, never by name)."""
    mine = f"RESILIENCY_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait_until_gone(job_id: str, timeout_s: float = 60.0) -> None:
    """Wait until no process of the job is left, or fail naming the ones that are.

    A killed rank's checkpoint writer that is still importing torch (its package's imports run
    before it can ask to die with its rank) notices the rank is gone only once they finish, up
    to ~20 s later on a busy machine, and then exits by itself: the check waits for that.
    """
    deadline = time.monotonic() + timeout_s
    while (left := _job_processes(job_id)) and time.monotonic() < deadline:
        time.sleep(0.2)
    described = []
    for pid in left:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            cmdline = "(gone)"
        described.append(f"{pid}: {cmdline.strip()}")
    assert not left, f"processes of the job still running after {timeout_s:.0f} s: {described}"


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    job_ids: list[str] = []

    def run(
        faults: list[Fault],
        *,
        ckpt_dir: Path | None = None,
        steps: int = STEPS,
        ckpt_every: int = 5,
        restart_nodes_after_s: float | None = None,
        timeout_s: float = 300.0,
        tag: str = "",
        from_first_step: bool = False,
    ) -> Run:
        job_id = f"matrix-{uuid.uuid4().hex[:8]}"
        job_ids.append(job_id)
        ckpt = ckpt_dir or tmp_path / "ckpt"
        ledger = tmp_path / f"ledger{tag}"
        log_path = tmp_path / f"job{tag}.log"
        command = [
            sys.executable,
            "-m",
            "resiliency.launcher",
            *LAUNCHER_FLAGS,
            "--goodput-dir",
            str(ledger),
            str(TRAIN),
            "--ckpt-dir",
            str(ckpt),
            "--steps",
            str(steps),
            "--ckpt-every",
            str(ckpt_every),
            "--step-time",
            "0.1",
        ]
        with log_path.open("w") as log:
            runner = JobRunner(
                RunnerOptions(
                    command=command,
                    grace_s=30.0,
                    slow_duration_s=3.0,
                    ckpt_dir=ckpt,
                    disk_full_hold_s=3.0,
                    restart_nodes_after_s=restart_nodes_after_s,
                    goodput_dir=ledger,
                    env={"RESILIENCY_JOB_ID": job_id, "PYTHONUNBUFFERED": "1"},
                    stdout=log,
                    faults_from_first_step=from_first_step,
                )
            )
            plan = FaultPlan(seed=0, mtbf=1.0, keep_alive=0.0, faults=tuple(faults))
            injections = runner.run(plan, timeout_s)
        timeline = timeline_of(read_ledger([ledger]))
        rows = outcomes(injections, timeline, runner.t0_wall)
        codes = sorted(set(runner.exit_codes.values()))
        return Run(
            code=codes[-1] if codes else None,
            injections=injections,
            rows=rows,
            ledger_dir=ledger,
            ckpt_dir=ckpt,
            log=log_path.read_text(errors="replace"),
            job_id=job_id,
        )

    yield run
    leftovers = [pid for job in job_ids for pid in _job_processes(job)]
    for pid in leftovers:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            continue
    assert not leftovers, f"the simulator left processes of the job behind: {leftovers}"


def _fault(kind: str, at_s: float, victim: int = 1, seed: int = 0) -> Fault:
    return Fault(at_s=at_s, kind=kind, victim=victim, seed=seed)


def _committed(ckpt: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in ckpt.glob("step_*") if p.is_dir())


def _finished(run: Run, steps: int = STEPS) -> None:
    assert run.code == 0, f"job exit code {run.code}; log tail:\n{run.log[-4000:]}"
    assert f"finished {steps} steps" in run.log, run.log[-4000:]
    assert steps in _committed(run.ckpt_dir), _committed(run.ckpt_dir)
    _wait_until_gone(run.job_id)


@pytest.mark.parametrize("kind", ["kill", "crash", "hang", "hang_nogil", "stop"])
def test_rank_fault_is_detected_and_the_job_recovers(simulate, kind: str) -> None:
    # Timed from the first step: the same point of training on a fast or a slow machine.
    run = simulate([_fault(kind, at_s=FAULT_AFTER_FIRST_STEP_S)], from_first_step=True)
    (row,) = run.rows
    assert row.injected_s is not None, row.note
    assert row.detected_s is not None and row.detected_s >= row.injected_s, row
    assert row.recovered_s is not None and row.recovered_s > row.detected_s, row
    _finished(run)
    events = {e.event for e in read_ledger([run.ledger_dir]).events}
    assert "cycle_ended" in events
    if kind.startswith("hang") or kind == "stop":
        assert "hang_detected" in events


def test_slow_rank_slows_the_job_without_killing_it(simulate) -> None:
    run = simulate([_fault("slow", at_s=FAULT_AFTER_FIRST_STEP_S)], from_first_step=True)
    (row,) = run.rows
    assert row.injected_s is not None, row.note
    _finished(run)
    events = [e.event for e in read_ledger([run.ledger_dir]).events]
    assert "hang_detected" not in events, "a 50 % duty cycle must not look like a hang"


def test_torn_checkpoint_is_skipped_on_restore(simulate) -> None:
    # The node is lost (its launcher, ranks and writer processes SIGKILLed), then at once the
    # newest committed step is torn, and a new launcher starts a second later: it must skip
    # the torn step (naming the file) and resume from the one before. Killing only a rank
    # raced: its writer process outlived it and could commit the step in flight after the
    # tear. (With no complete step left, load raises CheckpointCorruptError rather than
    # silently starting from step 0.) Timed from the first step, not from the launch: 10 s of
    # 0.1 s steps commit steps 20 and 40 at least. A step takes at least 0.1 s and the first one
    # is seen at most ~1 s late, so at the fault at most ~111 of the 150 steps are done.
    # This is also the node-loss test: the new launcher resumes from the newest intact commit,
    # not from step 0 (a separate node loss without the tear re-ran the same path, ~30 s).
    run = simulate(
        [_fault("node_loss", at_s=10.0, victim=0), _fault("torn_checkpoint", at_s=10.0)],
        restart_nodes_after_s=1.0,
        steps=150,
        ckpt_every=20,
        from_first_step=True,
    )
    assert all(r.injected_s is not None for r in run.rows), [r.note for r in run.rows]
    torn = run.injections[1].action
    assert any(word in torn for word in ("truncated", "flipped")), torn
    torn_file = Path(torn.split(" of ")[-1] if "flipped" in torn else torn.split()[1])
    assert torn_file.name in run.log, f"the skipped file is not named; log:\n{run.log[-4000:]}"
    resumed = [line for line in run.log.splitlines() if "starts at step" in line]
    assert any(not line.endswith("step 0") for line in resumed), resumed
    _finished(run, 150)


@pytest.mark.skipif(os.geteuid() != 0, reason="disk_full mounts a small tmpfs (needs root)")
def test_disk_full_fails_the_save_loudly_and_training_goes_on(simulate, tmp_path: Path) -> None:
    ckpt = tmp_path / "small"
    ckpt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(ckpt)], check=True)
    try:
        # 120 steps: the job must run on well past the 3 s the disk stays full, whatever its
        # speed, for a save after it to show that nothing was lost (a step takes at least 0.1 s:
        # at most ~71 steps are done when the disk is freed, 4 s after the first step at most).
        run = simulate(
            [_fault("disk_full", at_s=3.0)], ckpt_dir=ckpt, steps=120, from_first_step=True
        )
        (row,) = run.rows
        assert row.injected_s is not None, row.note
        assert "No space left" in run.log or "ENOSPC" in run.log, run.log[-4000:]
        _finished(run, 120)
    finally:
        subprocess.run(["umount", str(ckpt)], check=False)


def test_preemption_saves_an_agreed_step_and_the_next_job_resumes(simulate) -> None:
    # From the first step: at 14 s from the launch, a busy machine had not started training.
    run = simulate(
        [_fault("preempt", at_s=4.0, victim=0)], steps=200, tag="-1", from_first_step=True
    )
    assert run.code == 5, f"preempted launcher exit {run.code}; log:\n{run.log[-4000:]}"
    preempted = [e for e in read_ledger([run.ledger_dir]).events if e.event == "preempted"]
    assert preempted, "no preempted event in the ledger"
    saved = {int(e.data["step"]) for e in preempted}
    assert len(saved) == 1, f"ranks saved different steps: {saved}"
    assert saved <= set(_committed(run.ckpt_dir))
    # The next job resumes at the saved step and trains 10 more, whatever step that was.
    step = saved.pop()
    again = simulate([], steps=step + 10, tag="-2")
    assert f"starts at step {step}" in again.log
    _finished(again, step + 10)
