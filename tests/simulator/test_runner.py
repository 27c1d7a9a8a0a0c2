"""JobRunner's timing of storage faults, on a stand-in job that writes one checkpoint file late."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from resiliency.simulator import (
    Fault,
    FaultPlan,
    Injection,
    JobRunner,
    RunnerOptions,
    SimulatorError,
)

# Saves its one "checkpoint" after a delay, as a job that is slow to start does, then ends as
# soon as the file is torn (at most 60 s later): the run ends with the fault, not at a duration.
LATE_SAVER = """
import pathlib, sys, time
time.sleep(float(sys.argv[2]))
step = pathlib.Path(sys.argv[1]) / "step_5"
step.mkdir()
shard, written = step / "shard.bin", bytes(range(256)) * 64
shard.write_bytes(written)
deadline = time.monotonic() + 60
while shard.read_bytes() == written and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def _one_fault(kind: str, at_s: float) -> FaultPlan:
    """A plan of one fault, due ``at_s`` seconds in, on node or rank 0."""
    return FaultPlan(
        seed=0, mtbf=1.0, keep_alive=0.0, faults=(Fault(at_s=at_s, kind=kind, victim=0, seed=0),)
    )


def _run(
    ckpt: Path, save_after_s: float, wait_s: float, duration_s: float
) -> tuple[list[Injection], float]:
    runner = JobRunner(
        RunnerOptions(
            command=[sys.executable, "-c", LATE_SAVER, str(ckpt), str(save_after_s)],
            ckpt_dir=ckpt,
            wait_for_workers_s=wait_s,
        )
    )
    plan = _one_fault("torn_checkpoint", at_s=0.0)
    return runner.run(plan, duration_s=duration_s), runner.t0


def test_a_storage_fault_due_before_the_first_save_waits_for_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (injection,), t0 = _run(ckpt, save_after_s=2.0, wait_s=60.0, duration_s=120.0)
    assert not injection.error, injection.error
    assert "shard.bin" in injection.action
    # Injected once the file existed, not at its planned 0 s, when there was nothing to tear.
    assert injection.injected_mono - t0 >= 2.0
    assert (ckpt / "step_5" / "shard.bin").read_bytes() != bytes(range(256)) * 64


def test_a_storage_fault_with_no_checkpoint_in_time_is_recorded_not_raised(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (injection,), _ = _run(ckpt, save_after_s=30.0, wait_s=1.0, duration_s=3.0)
    assert injection.error is not None
    assert "no committed checkpoint" in injection.error and "torn_checkpoint" in injection.error


# A "launcher" that takes 2 s to stop after SIGTERM, as one saving an emergency checkpoint does.
SLOW_TO_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(2.0), sys.exit(0)))
time.sleep(60)
"""


def test_a_preemption_is_timed_at_its_sigterm_not_when_the_node_is_gone() -> None:
    runner = JobRunner(RunnerOptions(command=[sys.executable, "-c", SLOW_TO_STOP], grace_s=30.0))
    plan = _one_fault("preempt", at_s=1.0)
    (injection,) = runner.run(plan, duration_s=5.0)
    assert not injection.error, injection.error
    assert "all exited within" in injection.action
    # Due at 1 s; the node took 2 s more to go: the fault happened when the SIGTERM was sent.
    assert injection.injected_mono - runner.t0 < 2.5


# A job that records its first training step in the goodput ledger after a slow start.
SLOW_START = """
import sys, time
from resiliency.goodput import get_recorder
time.sleep(float(sys.argv[1]))
recorder = get_recorder()
recorder.step(1)
recorder.flush()
time.sleep(60)
"""


def test_faults_can_be_timed_from_the_first_training_step(tmp_path: Path) -> None:
    runner = JobRunner(
        RunnerOptions(
            command=[sys.executable, "-c", SLOW_START, "2.0"],
            goodput_dir=tmp_path / "ledger",
            grace_s=5.0,
            faults_from_first_step=True,
        )
    )
    plan = _one_fault("preempt", at_s=0.5)
    (injection,) = runner.run(plan, duration_s=15.0)
    assert not injection.error, injection.error
    # Due 0.5 s after the first step, which came 2 s after the start (not at 0.5 s).
    assert injection.injected_mono - runner.t0 >= 2.5


def test_faults_from_the_first_step_need_the_ledger() -> None:
    with pytest.raises(SimulatorError, match="goodput_dir"):
        RunnerOptions(command=["true"], faults_from_first_step=True)
