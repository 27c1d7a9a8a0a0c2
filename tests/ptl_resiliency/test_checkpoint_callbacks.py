"""A real 2-rank Lightning DDP Trainer (CPU, gloo) with the checkpoint callbacks.

Periodic asynchronous saves on every rank; SIGTERM to ONE rank (Lightning's own handler would
broadcast inside the handler and hang); both ranks save the same agreed step and the job exits
as preempted; a new fit resumes from exactly that step.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ptl_harness import Jobs

from resiliency.checkpoint import EXIT_INFO_DIR_ENV, PREEMPTED_EXIT_CODE_ENV
from resiliency.ptl import (
    CheckpointCallbackConfigError,
    DistributedCheckpointCallback,
    EmergencyCheckpointCallback,
)

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parent / "ptl_ckpt_job.py"
LEAD = 2


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class _Run:
    """One job (Lightning starts rank 1 as a child of rank 0); output in a file."""

    def __init__(
        self, jobs: Jobs, work: Path, name: str, args: list[str], env: dict[str, str]
    ) -> None:
        self.work = work
        self.log_path = work / f"{name}.log"
        self.proc = jobs.start([str(JOB), "--work-dir", str(work), *args], env, self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready_pids(self) -> dict[int, int]:
        return {
            int(p.name.split("-")[1]): int(p.name.split("-")[2])
            for p in (self.work / "markers").glob("ready-*")
        }

    def wait_ready(self, timeout: float) -> dict[int, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.ready_pids()
            if len(pids) == 2:
                return pids
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the two ranks did not start training:\n{self.log()[-8000:]}")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job hung (> {timeout} s):\n{self.log()[-8000:]}") from None

    def kill(self) -> None:
        pids = [self.proc.pid, *self.ready_pids().values()]
        for pid in pids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def _result(log: str) -> dict[str, object]:
    lines = [line for line in log.splitlines() if line.startswith("PTL_CKPT_RESULT ")]
    assert len(lines) == 1, log[-6000:]
    return json.loads(lines[0].split(" ", 1)[1])  # type: ignore[no-any-return]


def _committed(work: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in (work / "ckpt").glob("step_*/manifest.json"))


@pytest.mark.parametrize("victim", [1, 0])
def test_sigterm_to_one_ddp_rank_saves_an_agreed_step_and_resumes(
    jobs: Jobs, tmp_path: Path, victim: int
) -> None:
    exit_dir = tmp_path / "exit"
    exit_dir.mkdir()
    env = {EXIT_INFO_DIR_ENV: str(exit_dir), PREEMPTED_EXIT_CODE_ENV: "75"}
    run = _Run(jobs, tmp_path, "fit", ["--every", "5", "--step-time", "0.05"], env)
    try:
        pids = run.wait_ready(180)
        deadline = time.monotonic() + 120
        while not _committed(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)  # wait until a periodic async save has landed
        assert _committed(tmp_path), run.log()[-8000:]
        os.kill(pids[victim], signal.SIGTERM)
        code = run.wait(180)
        deadline = time.monotonic() + 30
        while _alive(pids[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pids[1]), "rank 1 outlived the job"
    finally:
        run.kill()
    log = run.log()
    assert code == 75, log[-8000:]
    infos = {p.name: json.loads(p.read_text()) for p in exit_dir.glob("rank_*.json")}
    assert sorted(infos) == ["rank_0.json", "rank_1.json"], log[-8000:]
    steps = {info["step"] for info in infos.values()}
    assert len(steps) == 1 and {i["reason"] for i in infos.values()} == {"preempted"}, infos
    step = steps.pop()
    noticed = [int(s) for s in re.findall(r"got SIGTERM at step (\d+);", log)]
    assert noticed and step == noticed[0] + LEAD, (noticed, step, log[-6000:])
    assert _committed(tmp_path)[-1] == step
    assert "Received SIGTERM" not in log  # Lightning's own handler never ran

    resume = _Run(jobs, tmp_path, "resume", ["--max-steps", str(step + 3), "--step-time", "0"], {})
    try:
        assert resume.wait(180) == 0, resume.log()[-8000:]
    finally:
        resume.kill()
    result = _result(resume.log())
    assert result["resumed_from"] == step
    assert result["global_step"] == step + 3
    assert f"resumed from step {step}" in resume.log()


def test_emergency_callback_rejects_a_lead_too_small() -> None:
    with pytest.raises(ValueError, match="lead >= check_every"):
        EmergencyCheckpointCallback(lead=1)


def test_checkpoint_callback_rejects_a_bad_period(tmp_path: Path) -> None:
    with pytest.raises(CheckpointCallbackConfigError, match="every_n_train_steps"):
        DistributedCheckpointCallback(tmp_path, every_n_train_steps=0)
