"""Seeded trials: SIGTERM to one node's ft-launcher (two launchers on loopback as two nodes).

One trial per victim: node A (which hosts the rendezvous store) and node B, each at its own seeded
moment of training. (It was 6 trials, 3 per victim at other seeded delays: the same two paths
again, 22 s each. The delay's variety is covered at the rank level by the 8 trials of
test_emergency_trials.py, where the agreement that decides the step runs the same code.)
The signalled launcher forwards SIGTERM to its worker only; the other node's worker learns the
stop step through the job's store. Every trial checks: both workers save the same step
(``noticed + lead``), both launchers exit 5 (PREEMPTED) without restarting, their
``--exit-status-file`` says "preempted, saved step N", and the next job resumes from N.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from emergency_harness import (
    JOB,
    Job,
    committed_steps,
    free_port,
    kill_pid_group,
    noticed_steps,
    resumed_step,
    wait_for_files,
)

pytest.importorskip("resiliency.launcher", reason="the launcher trials need resiliency-ft-launcher")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ft_launcher"))

from launcher_harness import Launcher

from resiliency.launcher._preemption import Preemption

LEAD = 2
PREEMPTED_LAUNCHER_EXIT = 5


def _worker_pids(markers: Path) -> list[int]:
    return [int(p.name.rsplit("-", 1)[1]) for p in markers.glob("ready-*")]


@pytest.fixture
def launchers(tmp_path: Path) -> Iterator[list[Launcher]]:
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.kill()
    for pid in _worker_pids(tmp_path / "markers"):
        kill_pid_group(pid)


def _start_two_nodes(tmp_path: Path, started: list[Launcher]) -> tuple[Launcher, Launcher]:
    port = free_port()
    nodes = []
    for name in ("a", "b"):
        args = [
            "--nnodes", "2",
            "--nproc-per-node", "1",
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", f"job-{port}",
            "--rdzv-conf",
            "join_timeout=240,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=2",
            "--local-addr", "127.0.0.1",
            "--max-restarts", "2",
            "--monitor-interval", "0.1",
            "--no-gpu-health-check",
            "--term-timeout", "30",
            "--exit-status-file", str(tmp_path / f"status-{name}.json"),
            str(JOB), "--root", str(tmp_path), "--lead", str(LEAD),
        ]  # fmt: skip
        node = Launcher(args, tmp_path / f"node-{name}.log")
        started.append(node)
        nodes.append(node)
        if name == "a":  # A hosts the rendezvous store: it must be up before B joins
            node.wait_for_log("worker(s) on this node", 120)
    return nodes[0], nodes[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seed", "victim"), [(0, 0), (1, 1)], ids=["store-host-node", "other-node"]
)
def test_sigterm_to_one_nodes_launcher(
    tmp_path: Path, launchers: list[Launcher], seed: int, victim: int
) -> None:
    delay = random.Random(1000 + seed).uniform(0.0, 1.5)
    a, b = _start_two_nodes(tmp_path, launchers)

    class _Logs:
        def log(self) -> str:
            return a.log() + b.log()

    wait_for_files(tmp_path / "markers", "ready-*", 2, 240, _Logs())
    time.sleep(delay)  # a seeded random moment of training: no outcome may depend on it
    (a, b)[victim].signal(signal.SIGTERM)
    codes = [a.wait(240), b.wait(240)]
    logs = a.log() + b.log()
    assert codes == [PREEMPTED_LAUNCHER_EXIT] * 2, logs[-10000:]
    assert "restarting" not in logs and "re-forming" not in logs, logs[-10000:]
    statuses = [json.loads((tmp_path / f"status-{n}.json").read_text()) for n in "ab"]
    steps = {s["preempted_step"] for s in statuses}
    assert len(steps) == 1, statuses
    step = steps.pop()
    for status in statuses:
        assert status["exit_code"] == PREEMPTED_LAUNCHER_EXIT
        assert status["reason"] == "preempted"
        assert f"preempted, saved step {step}" in status["detail"]
    assert committed_steps(tmp_path) == [step], logs[-10000:]
    noticed = noticed_steps(logs)
    assert len(noticed) == 1, logs[-10000:]  # only the signalled node's worker got SIGTERM
    assert step == noticed[0] + LEAD, (noticed, step)
    # Nothing is left running.
    for pid in _worker_pids(tmp_path / "markers"):
        with contextlib.suppress(FileNotFoundError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state == "Z", f"worker {pid} still running"
    # The next job resumes from the saved step.
    job = Job(tmp_path, ["--steps", str(step + 3), "--step-time", "0"], name="resume")
    try:
        resume_codes = job.wait(240)
    finally:
        job.kill()
    assert resume_codes == [0, 0], job.log()[-8000:]
    assert resumed_step(job.log()) == step


@pytest.mark.slow
def test_sigterm_to_one_worker_of_a_single_node_launcher(
    tmp_path: Path, launchers: list[Launcher]
) -> None:
    """Two workers under one launcher; SIGTERM reaches one worker only (not the launcher)."""
    status = tmp_path / "status.json"
    args = [
        "--standalone",
        "--nproc-per-node", "2",
        # Both workers forked from one process that imported torch (one import, not two):
        # the test is about the signal, not the spawn path.
        "--ft-preimport", "torch",
        "--max-restarts", "2",
        "--monitor-interval", "0.1",
        "--no-gpu-health-check",
        "--exit-status-file", str(status),
        str(JOB), "--root", str(tmp_path), "--lead", str(LEAD),
    ]  # fmt: skip
    launcher = Launcher(args, tmp_path / "node.log")
    launchers.append(launcher)
    wait_for_files(tmp_path / "markers", "ready-*", 2, 240, launcher)
    victim = max(_worker_pids(tmp_path / "markers"))
    os.kill(victim, signal.SIGTERM)
    assert launcher.wait(240) == PREEMPTED_LAUNCHER_EXIT, launcher.log()[-10000:]
    log = launcher.log()
    assert "restarting" not in log, log[-10000:]
    data = json.loads(status.read_text())
    step = data["preempted_step"]
    assert data["reason"] == "preempted" and "on 2 of 2 local worker(s)" in data["detail"], data
    noticed = noticed_steps(log)
    assert len(noticed) == 1 and step == noticed[0] + LEAD, (noticed, step)
    assert committed_steps(tmp_path) == [step]


@pytest.mark.parametrize(
    ("codes", "infos", "preempted"),
    [
        ({0: 75, 1: 75}, [0, 1], True),
        ({0: 75, 1: -15}, [0, 1], True),  # stopped by the launcher while exiting
        ({0: -15}, [0], True),  # stopped while exiting, after writing its exit info
        ({0: -15}, [], False),  # a plain SIGTERM, no emergency save
        ({0: 75, 1: 1}, [0], False),  # a real failure next to the save
        ({0: 75, 1: None}, [0], False),  # still running
        ({0: 0, 1: 0}, [], False),  # success
    ],
)
def test_launcher_verdict(
    tmp_path: Path, codes: dict[int, int | None], infos: list[int], preempted: bool
) -> None:
    p = Preemption(30.0)
    try:
        env = p.worker_env()
        assert env["RESILIENCY_PREEMPTED_EXIT_CODE"] == "75"
        assert env["RESILIENCY_TERM_TIMEOUT_S"] == "30"
        for rank in infos:
            (p.directory / f"rank_{rank}.json").write_text('{"reason": "preempted", "step": 7}')
        detail = p.verdict(codes)
        assert (detail is not None) == preempted, detail
        if preempted:
            assert detail is not None and detail.startswith("preempted, saved step 7")
            assert p.status_fields() == {"preempted_step": 7}
    finally:
        p.close()
    assert not p.directory.exists()


def test_exit_infos_of_a_restarted_attempt_do_not_make_a_finished_job_preempted(
    tmp_path: Path,
) -> None:
    # Attempt 0: a hang restart, during which both ranks saved and left their exit infos.
    p = Preemption(30.0)
    try:
        for rank in (0, 1):
            (p.directory / f"rank_{rank}.json").write_text('{"reason": "preempted", "step": 32}')
        assert p.verdict({0: 0, 1: 0}) is not None  # what the stale files alone would say
        p.new_attempt()  # attempt 1 starts, then finishes cleanly
        assert p.verdict({0: 0, 1: 0}) is None
        (p.directory / "rank_0.json").write_text('{"reason": "preempted", "step": 40}')
        detail = p.verdict({0: 75, 1: -15})  # a real preemption of attempt 1
        assert detail is not None and detail.startswith("preempted, saved step 40"), detail
    finally:
        p.close()
