"""Sharded state rolls back in-process to the newest local-tier step every rank holds.

2 gloo ranks of tests/inprocess/jobs/fsdp_rollback.py (FSDP2 ``fully_shard`` on CPU, SGD with
momentum, a ``CheckpointManager`` with a ``LocalTier`` saving every 3 steps) under plain
torchrun and ``inprocess.Wrapper``. Rank 1 raises at the start of step 7, after the local
saves of steps 3 and 6: both ranks resume in the same processes at step 6 with their shards
equal to an unbroken run's at step 6, and train to the end like it. When rank 0 lost its
step 6 (a save that never landed), both take step 3: the ranks never mix steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("resiliency.checkpoint")
pytest.importorskip("resiliency.inprocess")
pytest.importorskip("torch.distributed.fsdp")

sys.path.insert(0, str(Path(__file__).parents[1] / "inprocess"))
from inprocess_harness import REPO, free_port_pair

JOB = REPO / "tests" / "inprocess" / "jobs" / "fsdp_rollback.py"
NPROC = 2


def run_job(tmp: Path, *job_args: str) -> tuple[int, str, list[dict]]:
    """One torchrun of the job; its session is killed by pid if it outlives 300 s."""
    out = tmp / "out"
    out.mkdir()
    log = tmp / "torchrun.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(NPROC),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port_pair()),
        "--max-restarts",
        "0",
        str(JOB),
        "--out",
        str(out),
        *job_args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
        try:
            code = proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            raise AssertionError(f"torchrun did not end:\n{log.read_text()[-8000:]}") from None
    records = [
        json.loads(line)
        for path in sorted(out.glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
        if line
    ]
    return code, log.read_text(errors="replace"), records


def shard_at(records: list[dict], rank: int, step: int) -> list[float]:
    """Rank ``rank``'s shard after ``step`` (the last record of it: the resumed run's)."""
    found = [r for r in records if r["event"] == "params" and r["rank"] == rank]
    return [r for r in found if r["step"] == step][-1]["params"]


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict]]:
    code, output, records = run_job(tmp_path_factory.mktemp("fsdp-unbroken"))
    assert code == 0, output[-6000:]
    yield records


def assert_rolled_back(output: str, records: list[dict], unbroken: list[dict], step: int) -> None:
    first = {r["rank"]: r for r in records if r["event"] == "start" and r["iteration"] == 0}
    again = {r["rank"]: r for r in records if r["event"] == "start" and r["iteration"] == 1}
    assert sorted(again) == list(range(NPROC)), output[-6000:]
    for rank in range(NPROC):
        assert again[rank]["pid"] == first[rank]["pid"], f"rank {rank} is a new process"
        assert again[rank]["step"] == step, f"rank {rank} resumed at {again[rank]['step']}"
        assert again[rank]["params"] == shard_at(unbroken, rank, step), f"rank {rank}'s shard"
        # trained to the end like the unbroken run (float32 rounding after the resumed steps)
        end = shard_at(records, rank, 12)
        assert end == pytest.approx(shard_at(unbroken, rank, 12), rel=1e-5, abs=1e-6)
    # every iteration closed its manager, the failed one too
    closed = sorted((r["rank"], r["iteration"]) for r in records if r["event"] == "closed")
    assert closed == [(rank, it) for rank in range(NPROC) for it in (0, 1)], output[-6000:]


@pytest.mark.slow
def test_every_rank_rolls_back_in_process_to_the_newest_local_step(
    tmp_path: Path, unbroken: list[dict]
) -> None:
    code, output, records = run_job(tmp_path, "--raise", "1@7")
    assert code == 0, output[-6000:]
    assert "rank 1: iteration 0: the wrapped function raised RuntimeError" in output
    assert_rolled_back(output, records, unbroken, step=6)


@pytest.mark.slow
def test_a_rank_with_an_older_newest_step_makes_everyone_take_the_common_step(
    tmp_path: Path, unbroken: list[dict]
) -> None:
    code, output, records = run_job(tmp_path, "--raise", "1@7", "--stale", "0")
    assert code == 0, output[-6000:]
    assert_rolled_back(output, records, unbroken, step=3)
