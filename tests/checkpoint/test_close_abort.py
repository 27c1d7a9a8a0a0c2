"""``close(abort=True)`` with a save in flight and a dead peer: real 2-rank gloo jobs.

The case of an in-process restart (docs/inprocess.md): a fault kills a rank while an
asynchronous save is in flight, and the survivors' ``finally: mgr.close()`` must not wait for
that save's agreement, a collective with the dead rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from close_abort_worker import state

from resiliency.checkpoint import CheckpointManager, LocalTier, PersistentTier, SaveFailedError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = Path(__file__).resolve().with_name("close_abort_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")
RANKS_DEADLINE_S = 200
#: close(abort=True) takes ~1 s here (the writer's reaping, the completion thread's join); the
#: bound allows for a loaded machine, and stays far below plain close()'s wait (writer_timeout_s
#: = 120 s before the agreement with the dead rank is even tried).
ABORT_BOUND_S = 30.0


@pytest.fixture
def pids_to_clean() -> Iterator[list[int]]:
    """Writer pids the jobs report: SIGKILLed by pid after the test if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run_job(tmp: Path, mode: str, codes: str, pids: list[int]) -> tuple[dict[str, Any], str]:
    root, out = tmp / "ckpt", tmp / "out"
    root.mkdir()
    out.mkdir()
    argv = [sys.executable, str(RANK_GROUP), "2", str(out), str(RANKS_DEADLINE_S), codes]
    argv += [str(WORKER), str(root), mode, str(out)]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        head, _ = proc.communicate(timeout=RANKS_DEADLINE_S + 30)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for rank in range(2):  # the ranks, by the pids rank_group recorded
            pid_file = out / f"rank{rank}.pid"
            if pid_file.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
        if (out / "rank1.inflight").exists():
            pids.append(int((out / "rank1.inflight").read_text()))
    logs = head.decode(errors="replace") + "".join(
        f"\n--- rank {r}\n" + (out / f"rank{r}.log").read_text(errors="replace")
        for r in range(2)
        if (out / f"rank{r}.log").exists()
    )
    assert proc.returncode == 0, f"job {mode} failed ({proc.returncode}):\n{logs[-6000:]}"
    result = json.loads((out / "rank0.json").read_text())
    pids.append(result["writer_pid"])
    return result, logs


def _wait_dead(pid: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_close_abort_with_a_dead_peer_abandons_the_save_in_flight(
    tmp_path: Path, pids_to_clean: list[int]
):
    result, logs = _run_job(tmp_path, "abort", "0,-9", pids_to_clean)
    assert not result["done_before_close"], result  # step 2 really was in flight
    assert result["close_s"] < ABORT_BOUND_S, result
    assert result["writer_gone"], result  # killed and reaped by close, checked by its pid
    assert result["steps"] == [1], result  # step 2 abandoned, step 1 intact
    assert result["wait_error"] and "abandoned by close(abort=True)" in result["wait_error"]
    assert result["second_close_s"] < 1.0, result
    assert "close(abort=True): abandoning the save of step 2 in flight" in logs
    # Rank 1's writer ends with its SIGKILLed rank (its parent-death signal).
    assert _wait_dead(int((tmp_path / "out" / "rank1.inflight").read_text()), 60)
    root = tmp_path / "ckpt"
    # Nothing commits the abandoned attempt later: its completion gave it up (marked aborted).
    attempts = [p for p in root.iterdir() if p.name.startswith(".tmp-step_2-")]
    assert len(attempts) == 1 and (attempts[0] / ".abort").exists(), list(root.iterdir())
    # A new manager on the root (the restarted job, here one process) removes the attempt and
    # loads step 1.
    mgr = CheckpointManager(root, eager_writer=False)
    try:
        assert not attempts[0].exists()
        loaded = {"model": {"w": torch.zeros(4096), "b": torch.zeros(16)}}
        assert mgr.load(loaded) == 1
        assert torch.equal(loaded["model"]["w"], state(1)["model"]["w"])
        assert torch.equal(loaded["model"]["b"], state(1)["model"]["b"])
    finally:
        mgr.close()


def test_plain_close_still_waits_for_the_agreement_and_commits(
    tmp_path: Path, pids_to_clean: list[int]
):
    result, logs = _run_job(tmp_path, "plain", "0", pids_to_clean)
    assert not result["done_before_close"], result
    assert result["steps"] == [1, 2], result  # close() waited: step 2 committed on both ranks
    assert result["wait_error"] is None, result
    assert result["writer_gone"], result
    assert "abandon" not in logs
    mgr = CheckpointManager(tmp_path / "ckpt", eager_writer=False)
    try:
        assert mgr.steps() == [1, 2]
    finally:
        mgr.close()


def test_close_abort_abandons_both_tiers_saves_in_flight(tmp_path: Path, pids_to_clean: list[int]):
    """One process, a local and a persistent tier, both writers stopped mid-save (SIGSTOP)."""
    local, shared = tmp_path / "local", tmp_path / "shared"
    tiers = [LocalTier(local, replicas=0), PersistentTier(shared)]
    mgr = CheckpointManager(None, tiers=tiers)
    mgr.save(1, state(1), tier="all").wait()
    writers = [mgr.local._writer, mgr.persistent._writer]
    for writer in writers:
        writer.wait_ready(writer.deadline(120))  # a writer still starting is bypassed
        pids_to_clean.append(writer.pid)
        os.kill(writer.pid, signal.SIGSTOP)
    handle = mgr.save(2, state(2), tier="all")
    assert not handle.done()
    t0 = time.monotonic()
    mgr.close(abort=True)
    assert time.monotonic() - t0 < ABORT_BOUND_S
    assert all(_wait_dead(w.pid, 1) for w in writers), [w.pid for w in writers]
    with pytest.raises(SaveFailedError, match="abandoned"):
        handle.wait()
    mgr.close()  # a no-op
    again = CheckpointManager(None, tiers=tiers, eager_writer=False)
    try:
        assert again.steps() == [1]
        loaded = {"model": {"w": torch.zeros(4096), "b": torch.zeros(16)}}
        assert again.load(loaded) == 1
        assert torch.equal(loaded["model"]["w"], state(1)["model"]["w"])
    finally:
        again.close()
