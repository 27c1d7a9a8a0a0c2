"""Run tests/inprocess/jobs/train.py (or another job) under plain torchrun or ft-launcher and
read what each rank recorded."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from zygote_client import LAUNCHERS, ForkedJob, start_python

JOB = Path(__file__).parent / "jobs" / "train.py"
REPO = Path(__file__).resolve().parents[2]
NPROC = 4
FAULT_STEP = 5  # the jobs' faults are injected at the start of this step
# ft-launcher's flags for these jobs: fast polling, no rank monitor timeouts of its own (the
# Wrapper's are tested), a short stop, no GPU check on this CPU machine
FT_LAUNCHER_FLAGS = (
    "--monitor-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "240",
    "--ft-rank-heartbeat-timeout",
    "null",
    "--workers-stop-timeout",
    "2",
    "--no-gpu-health-check",
)
# Every rank forked from ft-launcher's pre-imported server, with what the job imports (its
# optimizer imports torch._dynamo on its first step): for tests whose subject is not the
# launcher, the cheapest way to start 4 ranks (9 s of CPU per job here, torchrun's four fresh
# interpreters 20 s).
PREIMPORTED_FLAGS = (
    *FT_LAUNCHER_FLAGS,
    "--ft-preimport",
    "torch,torch._dynamo,resiliency.inprocess",
)


def free_port_run() -> int:
    """A port P with P+1 and P+2 also free: torchrun's store on P, the wrapper's on P+1 (or, in
    scripts shaped like NVRx's examples, the application's on P+1 and the wrapper's on P+2).

    P is a multiple of 4, so two tests' ports never overlap, and is drawn below Linux's
    ephemeral range (32768-60999), so that no client socket of another test takes P+1 or P+2
    between this check and the moment a rank binds it.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000, 4)
        try:
            with contextlib.ExitStack() as stack:
                for offset in range(3):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no three free ports in a row on 127.0.0.1 in 20000-32000")


@dataclass
class Run:
    """A finished torchrun: its exit code, its output and every rank's records."""

    returncode: int
    output: str
    records: list[dict]

    def of(self, rank: int, event: str) -> list[dict]:
        return [r for r in self.records if r["rank"] == rank and r["event"] == event]

    def starts(self, iteration: int) -> list[dict]:
        return [r for r in self.records if r["event"] == "start" and r["iteration"] == iteration]


def read_records(out: Path) -> list[dict]:
    """Every rank's records in ``out`` (``rank<initial>.jsonl``, appended by each process)."""
    records = []
    for path in sorted(out.glob("rank*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return records


class Torchrun:
    """One ``python -m torch.distributed.run`` in its own session, killed by pid at teardown."""

    module = "torch.distributed.run"

    def __init__(
        self, tmp: Path, nproc: int = NPROC, job: Path = JOB, flags: tuple[str, ...] = ()
    ) -> None:
        self.tmp = tmp
        self.nproc = nproc
        self.job = job
        self.flags = flags  # the launcher's own, before the job
        self.procs: list[subprocess.Popen[Any] | ForkedJob] = []

    def run(
        self,
        *job_args: str,
        timeout: float = 400,
        name: str = "run",
        env: dict[str, str] | None = None,
    ) -> Run:
        out = self.tmp / name
        out.mkdir()
        log = self.tmp / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "--nproc-per-node",
            str(self.nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port_run()),
            *self.flags,
            str(self.job),
            "--out",
            str(out),
            *job_args,
        ]
        with log.open("wb") as sink:
            # Forked from a zygote that imported torch's elastic agent once (tests/zygote.py).
            proc = start_python(LAUNCHERS, cmd[1:], env, sink, cwd=REPO)
            self.procs.append(proc)
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                text = log.read_text(errors="replace")
                raise AssertionError(
                    f"{self.module} did not end in {timeout} s:\n{text[-8000:]}"
                ) from None
        return Run(code, log.read_text(errors="replace"), read_records(out))

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


class FtLauncher(Torchrun):
    """One ``python -m resiliency.launcher`` (ft-launcher), started and killed the same way;
    ``flags`` are its own (``FT_LAUNCHER_FLAGS`` and the mode's)."""

    module = "resiliency.launcher"


def assert_resumed_like_unbroken(
    run: Run, unbroken: Run, iteration: int, nproc: int = NPROC
) -> None:
    """Every rank restarted in its own process at FAULT_STEP with the unbroken run's params."""
    assert run.returncode == 0, run.output[-8000:]
    starts = run.starts(iteration)
    assert sorted(s["rank"] for s in starts) == list(range(nproc)), run.output[-6000:]
    first_pids = {s["rank"]: s["pid"] for s in run.starts(0)}
    for start in starts:
        assert start["pid"] == first_pids[start["rank"]], "the rank was respawned, not restarted"
        assert start["step"] == FAULT_STEP
    unbroken_at_fault = unbroken_params_at(unbroken, FAULT_STEP)
    for start in starts:
        assert start["params"] == unbroken_at_fault, f"rank {start['rank']} differs"
    finals = [r["params"] for r in run.records if r["event"] == "done"]
    unbroken_finals = [r["params"] for r in unbroken.records if r["event"] == "done"]
    assert len(finals) == nproc
    assert all(f == finals[0] for f in finals), "the ranks ended with different parameters"
    # Equal within float32 rounding: the first step after a restart runs on a new DDP, whose
    # first all-reduce uses its initial bucket layout, not the rebuilt one of the unbroken run's
    # step; a different summation order (3.7e-9 here with torch 2.13, in a plain 4-rank DDP
    # script too, no Wrapper involved).
    assert finals[0] == pytest.approx(unbroken_finals[0], rel=1e-5, abs=1e-6)


def unbroken_params_at(unbroken: Run, step: int) -> list[float]:
    """The unbroken run's parameters after ``step`` steps (its ``params`` records)."""
    at = [r for r in unbroken.records if r["event"] == "params" and r["step"] == step]
    assert at, "the unbroken run records its parameters at every step"
    assert all(r["params"] == at[0]["params"] for r in at)
    return at[0]["params"]
